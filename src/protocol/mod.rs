//! Wire types and codec (pure: no tokio, no sockets, no globals).
mod hash;
mod ops;
pub use hash::ChunkHash;
pub use ops::{KVOpEvent, OpType};
