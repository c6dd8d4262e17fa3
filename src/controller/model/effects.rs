//! What the controller's model asks its driver to do: the [`Effect`]s of a message (open or
//! close a downlink of a given generation, report an [`ModelEvent`]), and the reasons a message was
//! dropped or a worker removed, each with its metric label.
//!
//! Plain data: no I/O, no tokio. Produced by `model.rs`, consumed by `driver.rs` and
//! `report.rs`.

use super::index::{BatchOutcome, IndexError};

/// `(instance_id, worker_id)`: how LMCache names a worker.
pub type WorkerKey = (String, i64);

/// Why a PULL message had no effect (the `reason` label of `kvplane_frames_dropped_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameDropReason {
    /// A message that does not belong on the PULL socket.
    WrongSocket,
    /// A full-sync batch or end for no active sync.
    StaleSync,
    /// A full-sync batch over `--max-batch-ops`.
    TooManyOps,
    /// An out-of-order full-sync batch that would need a received-range over the budget.
    SyncRanges,
    /// A pushed registration or heartbeat (LMCache ≤ 0.3.9) the fleet refused.
    Refused,
}

impl FrameDropReason {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            FrameDropReason::WrongSocket => "wrong_socket",
            FrameDropReason::StaleSync => "stale_sync",
            FrameDropReason::TooManyOps => "too_many_ops",
            FrameDropReason::SyncRanges => "sync_ranges",
            FrameDropReason::Refused => "refused",
        }
    }
}

/// Why a worker was removed (the `reason` label of `kvplane_workers_removed_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemovalReason {
    /// It sent `DeRegisterMsg`.
    Deregistered,
    /// It was silent for the worker timeout and did not answer its probe.
    ProbeFailed,
}

impl RemovalReason {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            RemovalReason::Deregistered => "deregistered",
            RemovalReason::ProbeFailed => "probe_failed",
        }
    }
}

/// Something the driver must do after a model change.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Start a downlink task for `key` at `endpoint`, replacing any older one.
    OpenDownlink {
        /// The worker.
        key: WorkerKey,
        /// Its new generation.
        generation: u64,
        /// `host:port` to dial.
        endpoint: String,
    },
    /// Stop `key`'s downlink task if (and only if) it is of `generation`.
    CloseDownlink {
        /// The worker.
        key: WorkerKey,
        /// The generation to close.
        generation: u64,
    },
    /// Count and log something (no state change).
    Report(ModelEvent),
}

/// What the driver counts in metrics and logs. Carries the facts; the policy (which metric,
/// which level, throttling) is the driver's.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelEvent {
    /// A registration or a heartbeat from an unknown worker was refused by a limit.
    WorkerRefused {
        /// The worker.
        key: WorkerKey,
        /// `"registration"` or `"heartbeat"`.
        what: &'static str,
        /// The limit it hit.
        error: IndexError,
    },
    /// A worker registered (`again`: it was known; its keys and sync state were cleared).
    WorkerRegistered {
        /// The worker.
        key: WorkerKey,
        /// Its endpoint.
        endpoint: String,
        /// It was already registered.
        again: bool,
    },
    /// A heartbeat from an unknown worker registered it; it is asked for a full sync.
    RegisteredByHeartbeat {
        /// The worker.
        key: WorkerKey,
    },
    /// A worker was removed with its keys.
    WorkerRemoved {
        /// The worker.
        key: WorkerKey,
        /// Why.
        reason: RemovalReason,
    },
    /// A `DeRegisterMsg` named a worker that is not registered.
    UnknownDeregistration {
        /// The worker.
        key: WorkerKey,
    },
    /// A P2P lookup was answered.
    P2pLookup {
        /// Some worker holds a prefix.
        hit: bool,
    },
    /// A full sync started, or was refused (`error`).
    SyncStarted {
        /// The worker.
        key: WorkerKey,
        /// The sync id.
        sync_id: String,
        /// Why it was refused, if it was.
        error: Option<String>,
    },
    /// A full sync completed (`by_batch`: by a late batch after its end).
    SyncCompleted {
        /// The worker.
        key: WorkerKey,
        /// The sync id.
        sync_id: String,
        /// Completed by a resent batch.
        by_batch: bool,
    },
    /// A full sync ended with batches missing.
    SyncIncomplete {
        /// The worker.
        key: WorkerKey,
        /// The sync id.
        sync_id: String,
        /// Batches still missing.
        missing: u64,
    },
    /// A full-sync batch for no active sync was dropped.
    StaleSyncBatch {
        /// The worker.
        key: WorkerKey,
        /// The sync id.
        sync_id: String,
        /// The batch id.
        batch: i64,
    },
    /// A full-sync batch over `--max-batch-ops` was dropped whole.
    SyncBatchTooLarge {
        /// The worker.
        key: WorkerKey,
        /// Keys in the batch.
        keys: usize,
    },
    /// An out-of-order full-sync batch refused by the received-range budget (it stays
    /// missing and is accepted when resent).
    SyncRangesRefused {
        /// The worker.
        key: WorkerKey,
        /// The refused batch.
        batch: i64,
        /// The shared range budget it ran into.
        limit: usize,
    },
    /// Admits refused by `--max-keys-per-worker` during a full sync.
    KeysRefused {
        /// The worker.
        key: WorkerKey,
        /// Its location.
        location: String,
        /// Keys refused.
        count: u64,
    },
    /// An admit/evict batch that came through the general path (legacy single-op messages).
    Batch {
        /// The worker.
        key: WorkerKey,
        /// Its location.
        location: String,
        /// What applying it did.
        outcome: BatchOutcome,
    },
    /// A stalled full sync was marked failed by the sweep.
    SyncExpired {
        /// The worker.
        key: WorkerKey,
    },
}
