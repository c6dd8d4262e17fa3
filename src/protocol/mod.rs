//! Wire types and codec for the LMCache controller protocol (0.5.6's union; the older
//! generations, [`Wire`], decode into it).
//!
//! Pure: no tokio, no sockets, no globals. [`decode`] turns any frame a peer may send into a
//! [`Msg`] or a [`DecodeError`] (never a panic); [`encode`] writes the bytes msgspec writes.
//! Chunk hashes are [`ChunkHash`], which covers the whole `i64 ∪ u64` range exactly.

mod codec;
mod fast;
mod hash;
mod messages;
mod ops;
pub mod token_hash;
mod wire;

pub use codec::{decode, encode, encode_json, peek_tag, DecodeError};
pub use fast::{decode_batch, decode_lookup, BatchView, LookupView};
pub use hash::ChunkHash;
pub use messages::*;
pub use ops::{KVOpEvent, OpType};
pub use wire::Wire;

#[cfg(test)]
pub(crate) mod tests;
