//! The router-facing KV indexer (`kvplane indexer`, issue 10): which engine instance holds the
//! longest prefix of a prompt, on which tier and which data-parallel rank.
//!
//! The files at this level are the pure model: hashing ([`hash`]), event decoding
//! ([`events`], the Mooncake envelope and `event_id` order in [`mooncake`]), message frames ([`frames`]), the prefix index ([`index`]) and per-stream
//! sequence tracking ([`seq`]), and the change log read replicas follow ([`replica`]). No I/O and no clock there: time is passed in. [`service`] is
//! the async shell (registrations, publisher tasks, HTTP). Sockets live in
//! [`crate::transport`]; nothing here touches the `zeromq` crate.

pub mod events;
pub mod frames;
pub mod hash;
mod idtable;
pub mod index;
pub mod mooncake;
mod msgpack;
pub mod replica;
pub mod seq;
pub mod service;
mod table;
pub mod tiers;
