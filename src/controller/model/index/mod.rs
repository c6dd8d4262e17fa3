//! The KV index: worker registry, chunk reverse index and full-sync tracker.
//!
//! Pure and synchronous: no I/O, no clock reads (callers pass `now` as Unix seconds, `f64`, like
//! LMCache's `WorkerInfo`), no tokio, no locks. The controller wraps one [`ChunkIndex`] in whatever
//! lock it likes and maps wire messages onto its methods (protocol spec §3.1–§3.6, §3.8).
//!
//! Submodules, one job each:
//! * `registry` — instances → workers → locations, in registration order;
//! * `chunks` — the hot reverse map chunk hash → holders, tombstones and compaction;
//! * `sync` — the full-sync state machine and its [`ChunkIndex`] methods;
//! * `lookup` — P2P lookup and prefix queries over the reverse map;
//! * `views` — read-only summaries for the HTTP API, metrics and liveness.
//!
//! A *holder* is one (worker, location) pair. Counts such as [`ChunkIndex::key_count`] are
//! memberships: a chunk held by two TP workers counts twice, as LMCache's key count does.
//!
//! Deliberate differences from LMCache 0.5.6: re-registration also resets the sync state
//! (§7.3); a sync end with missing batches does not complete (§7.4); no `controller_restart`
//! sync is requested from workers that registered here (§7.5); P2P lookup prefers the
//! requester's TP rank on ties (#2405) and returns the longest prefix among all holders.

mod chunks;
mod lookup;
mod received;
mod registry;
mod snapshot;
mod sync;
mod sync_state;
mod views;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use chunks::MemoryStats;
pub use lookup::{P2PHit, PrefixHolder};
pub use received::{DEFAULT_MAX_SYNC_RANGES, DEFAULT_MAX_SYNC_RANGES_PER_WORKER};
pub use snapshot::ChunkIndexDump;
pub use sync::{
    SyncBatchOutcome, SyncEndOutcome, SyncError, SyncStatus, SyncView, FAILURE_TIMEOUT,
    MAX_REPORTED_MISSING, MAX_SYNC_BATCH_COUNT,
};
pub use views::{InstanceSummary, LocationView, WorkerAddr, WorkerView};

use crate::protocol::{KVOpEvent, OpType, Wire};
use chunks::Chunks;
use registry::{Location, WorkerEntry, WorkerRegistry};
use thiserror::Error;

/// Heartbeat command reason for a worker that was unknown and has just been registered.
pub const REASON_WORKER_RE_REGISTERED: &str = "worker_re_registered";
/// Heartbeat command reason for a worker whose last full sync failed.
pub const REASON_SYNC_FAILED_RETRY: &str = "sync_failed_retry";
/// Full-sync reason after a `--cluster` takeover whose followed state had a gap.
pub const REASON_TAKEOVER_INCOMPLETE: &str = "controller_takeover_incomplete";

/// Errors of index operations that can run out of room.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum IndexError {
    /// [`ChunkIndexConfig::max_workers`] workers are already registered.
    #[error("too many workers registered (limit {limit})")]
    TooManyWorkers {
        /// The configured limit.
        limit: usize,
    },
    /// The registry's slot space (2^32 − 1 instances or workers) is exhausted.
    #[error("index capacity exceeded")]
    CapacityExceeded,
}

/// Tunables of a [`ChunkIndex`].
#[derive(Clone, Debug, PartialEq)]
pub struct ChunkIndexConfig {
    /// Global progress a completed worker needs before `can_exit_freeze` (LMCache's
    /// `full_sync_completion_threshold`, default 0.8).
    pub sync_completion_threshold: f64,
    /// Most workers that may be registered at once; registrations beyond are refused so that
    /// random instance ids cannot grow the registry without bound. Default 65,536.
    pub max_workers: usize,
    /// Most locations one worker may create; ops for further locations are rejected
    /// (LMCache workers use two: `LocalCPUBackend`, `LocalDiskBackend`). Default 64.
    pub max_locations_per_worker: usize,
    /// Automatic compaction runs when tombstoned memberships reach this many *and* a quarter
    /// of all memberships. Default 65,536.
    pub compact_min_dead: u64,
    /// Most keys one worker may hold, over all its locations. An admit of a key the worker does
    /// not hold yet is refused while it holds this many (counted in
    /// [`BatchOutcome::Applied::refused`] and [`ChunkIndex::keys_refused`]); evicts always apply.
    /// Full-sync keys obey the same limit. Default 16,777,216 (~0.5 GB of index at ~30 B per
    /// membership).
    pub max_keys_per_worker: u64,
    /// Most operations in one admit/evict batch, and most keys in one full-sync batch. A
    /// larger batch is refused whole ([`BatchOutcome::TooLarge`],
    /// [`SyncBatchOutcome::TooLarge`]), so that no single message holds the index lock for
    /// long. Default 65,536 (LMCache sends at most 50 ops, and full-sync batches of 2,000).
    pub max_batch_ops: usize,
    /// Most extra ranges of received full-sync batch ids all syncing workers hold together.
    /// A sync's received ids are kept as ranges; batches sent in order (as LMCache does) need
    /// one range, which is always free; each batch that arrives out of order past a gap needs
    /// one more (~40 bytes). A batch that would need a range over this (or over
    /// `max_sync_ranges_per_worker`) is refused ([`SyncBatchOutcome::OverBudget`]) and stays
    /// missing. Default 1,048,576 (~40 MiB at most).
    pub max_sync_ranges: usize,
    /// Most extra ranges one sync may hold. Default 65,536 (~2.5 MiB).
    pub max_sync_ranges_per_worker: usize,
}

impl Default for ChunkIndexConfig {
    fn default() -> Self {
        ChunkIndexConfig {
            sync_completion_threshold: 0.8,
            max_workers: 1 << 16,
            max_locations_per_worker: 64,
            compact_min_dead: 1 << 16,
            max_keys_per_worker: 1 << 24,
            max_batch_ops: 1 << 16,
            max_sync_ranges: received::DEFAULT_MAX_SYNC_RANGES,
            max_sync_ranges_per_worker: received::DEFAULT_MAX_SYNC_RANGES_PER_WORKER,
        }
    }
}

/// Result of [`ChunkIndex::register`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegisterOutcome {
    /// A new worker.
    New,
    /// A known worker registered again: all its keys, sequence trackers and sync state were
    /// cleared and its endpoint updated; rebuild the downlink if `endpoint_changed`.
    ReRegistered {
        /// ip or port differ from the previous registration.
        endpoint_changed: bool,
    },
}

/// Result of [`ChunkIndex::heartbeat`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeartbeatOutcome {
    /// The worker was unknown and has been registered from the heartbeat: reply with a
    /// `full_sync` command, reason [`REASON_WORKER_RE_REGISTERED`], and open a downlink.
    ReRegistered,
    /// A known worker.
    Known {
        /// Reason of a `full_sync` command to send, if any ([`REASON_SYNC_FAILED_RETRY`] when
        /// its last sync failed).
        full_sync: Option<&'static str>,
        /// ip or port changed: rebuild the downlink.
        endpoint_changed: bool,
    },
}

impl HeartbeatOutcome {
    /// The `full_sync` command reason the reply must carry, if any.
    pub fn full_sync_reason(&self) -> Option<&'static str> {
        match self {
            HeartbeatOutcome::ReRegistered => Some(REASON_WORKER_RE_REGISTERED),
            HeartbeatOutcome::Known { full_sync, .. } => *full_sync,
        }
    }
}

/// Result of [`ChunkIndex::apply_batch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchOutcome {
    /// Every op was applied in order.
    Applied {
        /// Admit ops in the batch.
        admits: usize,
        /// Evict ops in the batch.
        evicts: usize,
        /// Admits that added a key (admitting a held key is a no-op).
        keys_added: usize,
        /// Evicts that removed a key (evicting an absent key is a no-op).
        keys_removed: usize,
        /// Ops whose `seq_num` was not the previous one + 1 (applied anyway).
        gaps: usize,
        /// Admits of new keys refused because the worker already held
        /// [`ChunkIndexConfig::max_keys_per_worker`] keys (counted in `admits`, not in
        /// `keys_added`; their sequence numbers still count as received).
        refused: usize,
    },
    /// The worker is not registered; the batch was dropped.
    UnknownWorker,
    /// The worker is full-syncing; the whole batch was discarded (as LMCache does).
    DiscardedSyncing,
    /// The location is new and the worker already has
    /// [`ChunkIndexConfig::max_locations_per_worker`] locations; the batch was dropped.
    TooManyLocations,
    /// The batch has more than [`ChunkIndexConfig::max_batch_ops`] operations; it was dropped
    /// whole, before anything else was looked at.
    TooLarge,
}

/// The KV index. See the module docs.
#[derive(Debug, Default)]
pub struct ChunkIndex {
    reg: WorkerRegistry,
    chunks: Chunks,
    config: ChunkIndexConfig,
    seq_discontinuities: u64,
    seq_gap_ops: u64,
    keys_refused: u64,
    /// Budget of the received-batch ranges of every sync (see `received.rs`).
    sync_ranges: received::RangeBudget,
}

/// Keys `w` holds over all its locations.
fn worker_keys(w: &WorkerEntry, chunks: &Chunks) -> u64 {
    w.locations.iter().map(|l| chunks.key_count(l.holder)).sum()
}

/// Index of location `name` on worker `w` (slot `ws`), creating it with a fresh holder if
/// needed; `None` if the location limit or the holder id space is exhausted.
fn ensure_location(
    w: &mut WorkerEntry,
    ws: u32,
    name: &str,
    chunks: &mut Chunks,
    max_locations: usize,
) -> Option<usize> {
    if let Some(i) = w.location(name) {
        return Some(i);
    }
    if w.locations.len() >= max_locations {
        return None;
    }
    let holder = chunks.alloc_holder(ws)?;
    w.locations.push(Location {
        name: name.into(),
        holder,
        last_seq: None,
    });
    Some(w.locations.len() - 1)
}

impl ChunkIndex {
    /// An empty index with the default [`ChunkIndexConfig`].
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty index with `config`.
    pub fn with_config(config: ChunkIndexConfig) -> Self {
        ChunkIndex {
            sync_ranges: received::RangeBudget::new(
                config.max_sync_ranges,
                config.max_sync_ranges_per_worker,
            ),
            config,
            ..Self::default()
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ChunkIndexConfig {
        &self.config
    }

    /// Handles `RegisterMsg`. A new worker gets `registration_time = last_heartbeat_time = now`.
    /// A known worker keeps its registration time and order but loses all its keys (every
    /// location), sequence trackers and sync state, and takes the new endpoint.
    ///
    /// # Errors
    /// [`IndexError::TooManyWorkers`] or [`IndexError::CapacityExceeded`] if the worker is new
    /// and the registry is full; nothing changes then.
    pub fn register(
        &mut self,
        instance_id: &str,
        worker_id: i64,
        ip: &str,
        port: u16,
        peer_init_url: Option<&str>,
        now: f64,
    ) -> Result<RegisterOutcome, IndexError> {
        let Some(ws) = self.reg.find(instance_id, worker_id) else {
            self.insert_worker(instance_id, worker_id, ip, port, peer_init_url, now)?;
            return Ok(RegisterOutcome::New);
        };
        let Some(w) = self.reg.worker_mut(ws) else {
            return Err(IndexError::CapacityExceeded);
        };
        for loc in w.locations.drain(..) {
            self.chunks.kill_holder(loc.holder);
        }
        w.sync = sync_state::SyncState::Idle;
        let endpoint_changed = w.set_endpoint(ip, port, peer_init_url);
        w.touch(now);
        self.maybe_compact();
        Ok(RegisterOutcome::ReRegistered { endpoint_changed })
    }

    /// Records the controller-wire generation `wire` of a registered worker (the controller
    /// tells it from how the worker registered); a worker of [`Wire::Pushed`] has its ops'
    /// sequence numbers ignored, since that wire has none. Returns whether the worker is known.
    pub fn set_wire(&mut self, instance_id: &str, worker_id: i64, wire: Wire) -> bool {
        let w = self
            .reg
            .find(instance_id, worker_id)
            .and_then(|ws| self.reg.worker_mut(ws));
        match w {
            Some(w) => {
                if w.wire != wire {
                    w.wire = wire;
                    for loc in &mut w.locations {
                        loc.last_seq = None;
                    }
                }
                true
            }
            None => false,
        }
    }

    /// Handles `DeRegisterMsg` (or a liveness reap): removes the worker with its keys and sync
    /// state and drops its instance when empty. Returns whether the worker was known.
    pub fn deregister(&mut self, instance_id: &str, worker_id: i64) -> bool {
        let Some(w) = self
            .reg
            .find(instance_id, worker_id)
            .and_then(|ws| self.reg.remove(ws))
        else {
            return false;
        };
        for loc in &w.locations {
            self.chunks.kill_holder(loc.holder);
        }
        self.maybe_compact();
        true
    }

    /// Handles `HeartbeatMsg`. An unknown worker is registered from the heartbeat fields
    /// ([`HeartbeatOutcome::ReRegistered`]). A known one gets `last_heartbeat_time = now`, its
    /// endpoint updated, and a `sync_failed_retry` request if its last sync failed. No
    /// `controller_restart` sync is ever requested (LMCache bug §7.5).
    ///
    /// # Errors
    /// [`IndexError::TooManyWorkers`] or [`IndexError::CapacityExceeded`] if the worker is
    /// unknown and the registry is full; nothing changes then.
    pub fn heartbeat(
        &mut self,
        instance_id: &str,
        worker_id: i64,
        ip: &str,
        port: u16,
        peer_init_url: Option<&str>,
        now: f64,
    ) -> Result<HeartbeatOutcome, IndexError> {
        let Some(w) = self
            .reg
            .find(instance_id, worker_id)
            .and_then(|ws| self.reg.worker_mut(ws))
        else {
            self.insert_worker(instance_id, worker_id, ip, port, peer_init_url, now)?;
            return Ok(HeartbeatOutcome::ReRegistered);
        };
        w.last_heartbeat_time = now;
        w.touch(now);
        let endpoint_changed = w.set_endpoint(ip, port, peer_init_url);
        let full_sync = if w.sync.is_failed() {
            w.resync = None;
            Some(REASON_SYNC_FAILED_RETRY)
        } else {
            w.resync.take()
        };
        Ok(HeartbeatOutcome::Known {
            full_sync,
            endpoint_changed,
        })
    }

    /// Raises the worker's `last_seen` to `now` (after any message or a successful probe).
    /// Returns whether the worker is known.
    pub fn touch(&mut self, instance_id: &str, worker_id: i64, now: f64) -> bool {
        match self.reg.find(instance_id, worker_id) {
            Some(ws) => {
                if let Some(w) = self.reg.worker_mut(ws) {
                    w.touch(now);
                }
                true
            }
            None => false,
        }
    }

    /// Asks every worker for a full sync at its next heartbeat, with `reason` (a controller
    /// that took over without the whole change log: its index may miss admits or evicts).
    pub fn request_resync_all(&mut self, reason: &'static str) {
        let slots: Vec<u32> = self.reg.workers().map(|(ws, _, _)| ws).collect();
        for ws in slots {
            if let Some(w) = self.reg.worker_mut(ws) {
                w.resync = Some(reason);
            }
        }
    }

    /// Marks every worker seen at `now` (a controller taking over: the failover's silence
    /// is not the workers').
    pub fn touch_all(&mut self, now: f64) {
        let slots: Vec<u32> = self.reg.workers().map(|(ws, _, _)| ws).collect();
        for ws in slots {
            if let Some(w) = self.reg.worker_mut(ws) {
                w.touch(now);
            }
        }
    }

    /// Handles `BatchedKVOperationMsg` — the hot path; allocation-free once the location
    /// exists. Each op is applied in order (admit = set insert, evict of an absent key is a
    /// no-op), then checked against the location's sequence tracker: if a previous `seq_num`
    /// exists and the op's is not its successor, it counts as a gap; either way the tracker
    /// takes the op's `seq_num`. A batch with any gap increments
    /// [`ChunkIndex::seq_discontinuities`] once (LMCache's metric). The ops of a worker whose wire
    /// numbers none ([`Wire::Pushed`]) are not checked. Batches of a syncing worker are
    /// discarded whole.
    pub fn apply_batch(
        &mut self,
        instance_id: &str,
        worker_id: i64,
        location: &str,
        ops: &[KVOpEvent],
        now: f64,
    ) -> BatchOutcome {
        if ops.len() > self.config.max_batch_ops {
            return BatchOutcome::TooLarge;
        }
        let Some(ws) = self.reg.find(instance_id, worker_id) else {
            return BatchOutcome::UnknownWorker;
        };
        let Some(w) = self.reg.worker_mut(ws) else {
            return BatchOutcome::UnknownWorker;
        };
        w.touch(now);
        if w.sync.is_syncing() {
            return BatchOutcome::DiscardedSyncing;
        }
        let max = self.config.max_locations_per_worker;
        let Some(li) = ensure_location(w, ws, location, &mut self.chunks, max) else {
            return BatchOutcome::TooManyLocations;
        };
        let max_keys = self.config.max_keys_per_worker;
        let mut held = worker_keys(w, &self.chunks);
        let numbered = w.wire.numbers_ops();
        let loc = &mut w.locations[li];
        let (mut admits, mut keys_added, mut keys_removed, mut gaps, mut refused) = (0, 0, 0, 0, 0);
        for op in ops {
            match op.op_type {
                OpType::Admit => {
                    admits += 1;
                    if held >= max_keys && !chunks::has(self.chunks.members(op.key), loc.holder) {
                        refused += 1;
                    } else if self.chunks.admit(loc.holder, op.key) {
                        keys_added += 1;
                        held += 1;
                    }
                }
                OpType::Evict => {
                    if self.chunks.evict(loc.holder, op.key) {
                        keys_removed += 1;
                        held = held.saturating_sub(1);
                    }
                }
            }
            if !numbered {
                continue; // LMCache ≤ 0.3.9 numbers no op: nothing to check
            }
            if let Some(last) = loc.last_seq {
                if last.checked_add(1) != Some(op.seq_num) {
                    gaps += 1;
                }
            }
            loc.last_seq = Some(op.seq_num);
        }
        if gaps > 0 {
            self.seq_discontinuities += 1;
            self.seq_gap_ops += gaps as u64;
        }
        self.keys_refused += refused as u64;
        BatchOutcome::Applied {
            admits,
            evicts: ops.len() - admits,
            keys_added,
            keys_removed,
            gaps,
            refused,
        }
    }

    /// Admits refused so far (batches and full syncs) because a worker held
    /// [`ChunkIndexConfig::max_keys_per_worker`] keys.
    pub fn keys_refused(&self) -> u64 {
        self.keys_refused
    }

    /// Batches that contained at least one sequence gap (LMCache's
    /// `kv_op_seq_discontinuity_count`).
    pub fn seq_discontinuities(&self) -> u64 {
        self.seq_discontinuities
    }

    /// Individual ops that were out of sequence.
    pub fn seq_gap_ops(&self) -> u64 {
        self.seq_gap_ops
    }

    /// Reclaims all tombstoned memberships now (one pass over the reverse map) and returns how
    /// many were reclaimed. Runs automatically when they reach
    /// [`ChunkIndexConfig::compact_min_dead`] and a quarter of all memberships.
    pub fn compact(&mut self) -> u64 {
        self.chunks.compact()
    }

    /// Tombstoned memberships awaiting compaction.
    pub fn dead_memberships(&self) -> u64 {
        self.chunks.dead_members()
    }

    /// Compactions run so far.
    pub fn compactions(&self) -> u64 {
        self.chunks.compactions()
    }

    /// Memory accounting of the reverse index; see [`MemoryStats`] for the size math.
    pub fn memory_stats(&self) -> MemoryStats {
        self.chunks.memory_stats()
    }

    fn insert_worker(
        &mut self,
        instance_id: &str,
        worker_id: i64,
        ip: &str,
        port: u16,
        peer_init_url: Option<&str>,
        now: f64,
    ) -> Result<(), IndexError> {
        let limit = self.config.max_workers;
        if self.reg.worker_count() >= limit {
            return Err(IndexError::TooManyWorkers { limit });
        }
        self.reg
            .insert(instance_id, worker_id, ip, port, peer_init_url, now)
            .map(drop)
    }

    fn maybe_compact(&mut self) {
        if self.chunks.needs_compaction(self.config.compact_min_dead) {
            self.chunks.compact();
        }
    }

    fn worker_ref(&self, instance_id: &str, worker_id: i64) -> Option<&WorkerEntry> {
        self.reg.worker(self.reg.find(instance_id, worker_id)?)
    }
}
