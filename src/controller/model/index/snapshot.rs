//! The whole index as a plain value ([`ChunkIndexDump`]), for `--cluster` snapshots: a follower
//! dumps its index; a follower starting later restores it and reads the change log from the
//! snapshot's position instead of from the log's start.
//!
//! What a dump keeps: every instance and worker in registration order (with their order
//! numbers), endpoints, times, per-location keys and last sequence numbers, a pending resync,
//! and the counters. What it drops: full syncs in progress (a restored worker is idle: its
//! sync's next batches are refused as stale and it retries, as after any controller restart)
//! and the dead memberships compaction has not reclaimed yet.

use super::chunks::HolderId;
use super::registry::Location;
use super::{
    ensure_location, ChunkIndex, ChunkIndexConfig, IndexError, REASON_TAKEOVER_INCOMPLETE,
};
use crate::protocol::{ChunkHash, Wire};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// A whole index (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChunkIndexDump {
    next_seq: u64,
    instances: Vec<InstanceDump>,
    seq_discontinuities: u64,
    seq_gap_ops: u64,
    keys_refused: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct InstanceDump {
    name: String,
    seq: u64,
    workers: Vec<WorkerDump>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct WorkerDump {
    worker_id: i64,
    seq: u64,
    ip: String,
    port: u16,
    peer_init_url: Option<String>,
    registration_time: f64,
    last_heartbeat_time: f64,
    last_seen: f64,
    resync: bool,
    locations: Vec<LocationDump>,
    /// Last, with a default: a dump written before generations were kept still loads.
    #[serde(default)]
    wire: Wire,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct LocationDump {
    name: String,
    last_seq: Option<i64>,
    keys: Vec<ChunkHash>,
}

impl ChunkIndexDump {
    /// Memberships in the dump.
    pub fn memberships(&self) -> u64 {
        self.instances
            .iter()
            .flat_map(|i| &i.workers)
            .flat_map(|w| &w.locations)
            .map(|l| l.keys.len() as u64)
            .sum()
    }
}

impl ChunkIndex {
    /// The whole index as a value: one pass over the reverse index.
    pub fn dump(&self) -> ChunkIndexDump {
        let mut keys: HashMap<HolderId, Vec<ChunkHash>> = HashMap::new();
        for (h, key) in self.chunks.memberships() {
            keys.entry(h).or_default().push(key);
        }
        let mut instances: Vec<InstanceDump> = Vec::new();
        for (_, inst, w) in self.reg.workers() {
            if instances.last().is_none_or(|i| i.name != *inst.name) {
                instances.push(InstanceDump {
                    name: inst.name.to_string(),
                    seq: inst.seq,
                    workers: Vec::new(),
                });
            }
            let locations = w
                .locations
                .iter()
                .map(|l: &Location| {
                    let mut k = keys.remove(&l.holder).unwrap_or_default();
                    k.sort_unstable();
                    LocationDump {
                        name: l.name.to_string(),
                        last_seq: l.last_seq,
                        keys: k,
                    }
                })
                .collect();
            if let Some(i) = instances.last_mut() {
                i.workers.push(WorkerDump {
                    worker_id: w.worker_id,
                    seq: w.seq,
                    ip: w.ip.clone(),
                    port: w.port,
                    peer_init_url: w.peer_init_url.clone(),
                    registration_time: w.registration_time,
                    last_heartbeat_time: w.last_heartbeat_time,
                    last_seen: w.last_seen,
                    resync: w.resync.is_some(),
                    locations,
                    wire: w.wire,
                });
            }
        }
        ChunkIndexDump {
            next_seq: self.reg.next_seq(),
            instances,
            seq_discontinuities: self.seq_discontinuities,
            seq_gap_ops: self.seq_gap_ops,
            keys_refused: self.keys_refused,
        }
    }

    /// An index with `config` holding what `dump` holds.
    ///
    /// # Errors
    /// When `config`'s limits (workers, locations per worker) cannot hold the dump.
    pub fn restore(
        config: ChunkIndexConfig,
        dump: &ChunkIndexDump,
    ) -> Result<ChunkIndex, IndexError> {
        let mut ix = ChunkIndex::with_config(config);
        for inst in &dump.instances {
            for w in &inst.workers {
                let limit = ix.config.max_workers;
                if ix.reg.worker_count() >= limit {
                    return Err(IndexError::TooManyWorkers { limit });
                }
                let ws = ix.reg.insert(
                    &inst.name,
                    w.worker_id,
                    &w.ip,
                    w.port,
                    w.peer_init_url.as_deref(),
                    w.registration_time,
                )?;
                ix.reg.set_seqs(ws, inst.seq, w.seq);
                let max_locations = ix.config.max_locations_per_worker;
                let Some(worker) = ix.reg.worker_mut(ws) else {
                    continue;
                };
                worker.last_heartbeat_time = w.last_heartbeat_time;
                worker.last_seen = w.last_seen;
                worker.resync = w.resync.then_some(REASON_TAKEOVER_INCOMPLETE);
                worker.wire = w.wire;
                for l in &w.locations {
                    let Some(li) =
                        ensure_location(worker, ws, &l.name, &mut ix.chunks, max_locations)
                    else {
                        return Err(IndexError::CapacityExceeded);
                    };
                    let loc = &mut worker.locations[li];
                    loc.last_seq = l.last_seq;
                    for &key in &l.keys {
                        ix.chunks.admit(loc.holder, key);
                    }
                }
            }
        }
        ix.reg.set_next_seq(dump.next_seq);
        ix.seq_discontinuities = dump.seq_discontinuities;
        ix.seq_gap_ops = dump.seq_gap_ops;
        ix.keys_refused = dump.keys_refused;
        Ok(ix)
    }
}
