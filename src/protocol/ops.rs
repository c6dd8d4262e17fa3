//! KV operation events: the payload of `BatchedKVOperationMsg`.

use super::ChunkHash;
use serde::{Deserialize, Serialize};

/// Admit or evict, encoded by value as the lower-case strings `"admit"` / `"evict"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OpType {
    /// The worker now holds the chunk.
    #[serde(rename = "admit")]
    Admit,
    /// The worker no longer holds the chunk.
    #[serde(rename = "evict")]
    Evict,
}

/// One operation inside a batch (an untagged map on the wire: `op_type`, `key`, `seq_num`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KVOpEvent {
    /// Admit or evict.
    pub op_type: OpType,
    /// The chunk hash.
    pub key: ChunkHash,
    /// Per-(worker, location) sequence number, +1 per op.
    pub seq_num: i64,
}
