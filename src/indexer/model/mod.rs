//! The indexer's pure model: no I/O and no clock (time is passed in), no tokio.
//!
//! * [`hash`] — standard XXH3 block hashing, the engines' and the router's.
//! * [`events`] — tolerant KV-event decoding for vLLM, SGLang and Mooncake's standard
//!   envelope (over `msgpack`, the reader); [`frames`] — the message frames' layouts.
//! * [`index`] — the prefix index with namespaces, tiers, capacity and TTL, over the record
//!   arena and its id tables (`table`, `idtable`).
//! * [`seq`] — per-stream sequence tracking (the replay state machine); [`mooncake`] — each
//!   Mooncake backend's `event_id` order on it.
//! * [`tiers`] — LMCache MP servers' L1/L2 chunks as CPU/DISK blocks of their instances.
//! * [`replica`] — the `--cluster` change log: the index as the replication core's state.

pub mod events;
pub(crate) mod frames;
pub mod hash;
mod idtable;
pub mod index;
pub(crate) mod mooncake;
mod msgpack;
pub mod replica;
pub(crate) mod seq;
mod table;
pub mod tiers;
