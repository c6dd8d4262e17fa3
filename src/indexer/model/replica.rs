//! The indexer's change log, for read replicas (`--cluster`, docs/CLUSTER.md): every change
//! the ingester applies to its [`Index`] as one [`Change`], in apply order, and the indexer's
//! [`Core`] (the index with its stream routes) as the replication core's [`Replicated`]
//! state: a replica applies the same changes to its own through the core
//! (`crate::cluster`), which numbers, publishes, follows and snapshots them.
//!
//! The index is deterministic (the ingester passes the time into every change), so a replica
//! that applies the same changes in the same order holds the same memberships, records at the
//! same arena positions, and gives the same answers. Every ingester starts empty: its epoch's
//! first record is [`Change::Start`], and a replica that sees a new epoch empties its index
//! first ([`Replicated::new_epoch`]); a missing record means its index may differ from the
//! ingester's, so it says it is not in sync until the next epoch (or a snapshot taken in
//! sync). Pure and synchronous: no clocks, no I/O.

use super::events::{KvEvent, Medium};
use super::index::{Index, IndexConfig, IndexDump, StreamId, StreamSpec};
use crate::cluster::{Replicated, Stamp};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// One change to the index, as the ingester applied it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Change {
    /// An ingester started, with an empty index: the first record of its epoch.
    Start {
        /// Who (host, process).
        holder: String,
    },
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

/// A record of the indexer's log.
pub type Record = crate::cluster::Record<Change>;

/// The index and the streams each publisher feeds, behind the indexer's one lock: what an
/// ingester changes and a replica follows.
#[derive(Debug)]
pub struct Core {
    /// The index.
    pub index: Index,
    /// Publisher id → the streams it feeds (the ingester's).
    pub routes: HashMap<u32, Vec<StreamId>>,
    /// The ingester's stream id → this index's (a replica's).
    ids: HashMap<u32, StreamId>,
}

/// A replica's index and its stream ids, as a snapshot holds them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CoreDump {
    index: IndexDump,
    /// `(ingester's stream id, this index's)`, sorted.
    ids: Vec<(u32, u32)>,
}

impl Core {
    /// An empty index made with `config`.
    pub fn new(config: IndexConfig) -> Self {
        Core {
            index: Index::new(config),
            routes: HashMap::new(),
            ids: HashMap::new(),
        }
    }

    /// The ingester's stream id → this index's, for reading stream stats.
    pub fn stream(&self, ingester_id: u32) -> Option<StreamId> {
        self.ids.get(&ingester_id).copied()
    }
}

impl Replicated for Core {
    const SERVICE: &'static str = "indexer";
    type Change = Change;
    type Dump = CoreDump;

    fn apply(&mut self, change: Change, _: &Stamp) {
        let Core { index, ids, .. } = self;
        match change {
            Change::Start { .. } => {}
            Change::AddStream { stream, spec } => {
                if let Some(old) = ids.remove(&stream) {
                    index.remove_stream(old);
                }
                if let Some(id) = index.add_stream(spec) {
                    ids.insert(stream, id);
                }
            }
            Change::RemoveStream { stream } => {
                if let Some(id) = ids.remove(&stream) {
                    index.remove_stream(id);
                }
            }
            Change::Apply {
                streams,
                events,
                now,
            } => {
                let local: Vec<StreamId> =
                    streams.iter().filter_map(|s| ids.get(s).copied()).collect();
                for ev in &events {
                    for id in &local {
                        index.apply(*id, ev, now);
                    }
                }
            }
            Change::ClearStream { stream, tier } => {
                if let Some(id) = ids.get(&stream) {
                    index.clear_stream(*id, tier);
                }
            }
            Change::Expire { now } => {
                index.expire(now);
            }
            Change::ExpireSlice { from, len, now } => {
                let from = usize::try_from(from).unwrap_or(usize::MAX);
                let len = usize::try_from(len).unwrap_or(usize::MAX);
                index.expire_slice(from, len, now);
            }
        }
    }

    fn dump(&self) -> CoreDump {
        let mut ids: Vec<(u32, u32)> = self.ids.iter().map(|(&k, v)| (k, v.0)).collect();
        ids.sort_unstable();
        CoreDump {
            index: self.index.dump(),
            ids,
        }
    }

    fn restore(&self, dump: CoreDump) -> Result<Self, String> {
        let index = Index::restore(*self.index.config(), dump.index)?;
        let ids = dump
            .ids
            .into_iter()
            .map(|(k, v)| (k, StreamId(v)))
            .collect::<HashMap<_, _>>();
        if ids.values().any(|&id| index.stream_spec(id).is_none()) {
            return Err("a stream id names no stream of the index".into());
        }
        Ok(Core {
            index,
            routes: HashMap::new(),
            ids,
        })
    }

    fn takeover(holder: String, _fresh: bool) -> Change {
        Change::Start { holder }
    }

    /// Every epoch starts from an empty index.
    fn fresh(_: &Change) -> bool {
        true
    }

    /// The events of an `Apply` in two halves.
    fn split(change: &Change) -> Option<(Change, Change)> {
        let Change::Apply {
            streams,
            events,
            now,
        } = change
        else {
            return None;
        };
        if events.len() < 2 {
            return None;
        }
        let (a, b) = events.split_at(events.len() / 2);
        let part = |events: &[KvEvent]| Change::Apply {
            streams: streams.clone(),
            events: events.to_vec(),
            now: *now,
        };
        Some((part(a), part(b)))
    }

    /// A new ingester: start over from an empty index.
    fn new_epoch(&mut self) {
        self.index = Index::new(*self.index.config());
        self.ids.clear();
    }
}

#[cfg(test)]
#[path = "replica_tests.rs"]
mod tests;
