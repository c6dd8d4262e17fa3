//! The indexer's change log, for read replicas (`--cluster`, docs/CLUSTER.md): every change
//! the ingester applies to its [`Index`] as one [`Op`], in apply order, and the pure
//! [`Follower`] that applies the same ops to a replica's own index.
//!
//! The index is deterministic (the ingester passes the time into every change), so a replica
//! that applies the same ops in the same order holds the same memberships and gives the same
//! answers. Ops carry the ingester's epoch (fixed for one ingester process) and a sequence
//! number from 1 within it: a new epoch means the ingester restarted with an empty index, so
//! the follower starts over too; a missing sequence number means the follower's index may
//! differ from the ingester's, so it says it is not in sync until the next epoch. Pure and
//! synchronous: no clocks, no I/O.

use super::events::{KvEvent, Medium};
use super::index::{Index, IndexConfig, StreamId, StreamSpec};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// One change to the index, as the ingester applied it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Change {
    /// A stream was added under the ingester's id.
    AddStream {
        /// The ingester's stream id.
        stream: u32,
        /// Its registration.
        spec: StreamSpec,
    },
    /// A stream and its memberships were removed.
    RemoveStream {
        /// The ingester's stream id.
        stream: u32,
    },
    /// Events were applied to streams at time `now` (seconds since the ingester started).
    Apply {
        /// The streams the events apply to (one publisher feeds them all).
        streams: Vec<u32>,
        /// The events, in order.
        events: Vec<KvEvent>,
        /// The ingester's clock.
        now: u32,
    },
    /// A stream's memberships were dropped: of one tier, or all (`None`).
    ClearStream {
        /// The ingester's stream id.
        stream: u32,
        /// The tier, or all.
        tier: Option<Medium>,
    },
    /// The TTL sweep ran at `now` (over every stream).
    Expire {
        /// The ingester's clock.
        now: u32,
    },
    /// One slice of the TTL sweep ran at `now`: `len` records of the arena from `from`.
    /// (A replica's arena matches the ingester's when it applied every op of the epoch.)
    ExpireSlice {
        /// The first record of the slice.
        from: u64,
        /// How many records.
        len: u64,
        /// The ingester's clock.
        now: u32,
    },
}

/// A [`Change`] with its place in the log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Op {
    /// The ingester's epoch (random per ingester process).
    pub epoch: u64,
    /// 1, 2, … within the epoch.
    pub seq: u64,
    /// The ingester's wall clock when it applied the change, milliseconds since the Unix
    /// epoch (for the replication lag a replica reports).
    pub at_ms: u64,
    /// The change.
    pub change: Change,
}

impl Op {
    /// The bytes published for this op (msgpack).
    ///
    /// # Errors
    /// Never for the types above; kept as a `Result` because the encoder returns one.
    pub fn encode(&self) -> Result<Vec<u8>, rmp_serde::encode::Error> {
        rmp_serde::to_vec(self)
    }

    /// An op from published bytes.
    ///
    /// # Errors
    /// When the bytes are not an op.
    pub fn decode(bytes: &[u8]) -> Result<Self, rmp_serde::decode::Error> {
        rmp_serde::from_slice(bytes)
    }
}

/// What applying one op did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// Applied in order.
    InOrder,
    /// A new epoch: the index was emptied first, then the op applied.
    NewEpoch,
    /// One or more ops were missing before this one: applied, but the index may now differ
    /// from the ingester's until the next epoch.
    AfterGap,
    /// Already applied (a duplicate or an older epoch's op): ignored.
    Stale,
}

/// Where a replica's index is in the log; applies [`Op`]s to it.
#[derive(Debug)]
pub struct Follower {
    config: IndexConfig,
    /// Ingester stream id → this index's id.
    ids: HashMap<u32, StreamId>,
    epoch: Option<u64>,
    last_seq: u64,
    in_sync: bool,
    last_at_ms: u64,
    gaps: u64,
}

impl Follower {
    /// At the start of the log, for an index made with `config`.
    pub fn new(config: IndexConfig) -> Self {
        Self {
            config,
            ids: HashMap::new(),
            epoch: None,
            last_seq: 0,
            in_sync: false,
            last_at_ms: 0,
            gaps: 0,
        }
    }

    /// Whether every op of the current epoch from 1 on was applied (none missing).
    pub fn in_sync(&self) -> bool {
        self.in_sync
    }

    /// The current epoch and the last op applied in it.
    pub fn position(&self) -> (Option<u64>, u64) {
        (self.epoch, self.last_seq)
    }

    /// The ingester's clock of the last op applied (ms since the Unix epoch; 0: none).
    pub fn last_at_ms(&self) -> u64 {
        self.last_at_ms
    }

    /// Gaps seen since start.
    pub fn gaps(&self) -> u64 {
        self.gaps
    }

    /// The ingester's stream id → this index's id, for reading stream stats.
    pub fn stream(&self, ingester_id: u32) -> Option<StreamId> {
        self.ids.get(&ingester_id).copied()
    }

    /// Applies one op to `index` (the replica's, only ever changed through this).
    pub fn apply(&mut self, index: &mut Index, op: &Op) -> Applied {
        let outcome = match self.epoch {
            Some(e) if e == op.epoch && op.seq <= self.last_seq => return Applied::Stale,
            Some(e) if e == op.epoch && op.seq == self.last_seq + 1 => Applied::InOrder,
            Some(e) if e == op.epoch => {
                self.gaps += 1;
                self.in_sync = false;
                Applied::AfterGap
            }
            _ => {
                // A new ingester (or the first op seen): start over from an empty index.
                *index = Index::new(self.config);
                self.ids.clear();
                self.epoch = Some(op.epoch);
                self.in_sync = op.seq == 1;
                if !self.in_sync {
                    self.gaps += 1;
                }
                Applied::NewEpoch
            }
        };
        self.last_seq = op.seq;
        self.last_at_ms = op.at_ms;
        self.change(index, &op.change);
        outcome
    }

    fn change(&mut self, index: &mut Index, change: &Change) {
        match change {
            Change::AddStream { stream, spec } => {
                if let Some(old) = self.ids.remove(stream) {
                    index.remove_stream(old);
                }
                if let Some(id) = index.add_stream(spec.clone()) {
                    self.ids.insert(*stream, id);
                }
            }
            Change::RemoveStream { stream } => {
                if let Some(id) = self.ids.remove(stream) {
                    index.remove_stream(id);
                }
            }
            Change::Apply {
                streams,
                events,
                now,
            } => {
                let ids: Vec<StreamId> = streams
                    .iter()
                    .filter_map(|s| self.ids.get(s).copied())
                    .collect();
                for ev in events {
                    for id in &ids {
                        index.apply(*id, ev, *now);
                    }
                }
            }
            Change::ClearStream { stream, tier } => {
                if let Some(id) = self.ids.get(stream) {
                    index.clear_stream(*id, *tier);
                }
            }
            Change::Expire { now } => {
                index.expire(*now);
            }
            Change::ExpireSlice { from, len, now } => {
                let from = usize::try_from(*from).unwrap_or(usize::MAX);
                let len = usize::try_from(*len).unwrap_or(usize::MAX);
                index.expire_slice(from, len, *now);
            }
        }
    }
}

#[cfg(test)]
#[path = "replica_tests.rs"]
mod tests;
