//! The full-sync state of one worker (protocol spec §3.5): `Idle → Syncing → Completed |
//! Failed`, its batches received, its status and errors. Pure; the [`super::ChunkIndex`] methods
//! that drive it are in `sync.rs`, the worker record that holds it in `registry.rs`.

use super::received::{Insert, RangeBudget, Received};
use thiserror::Error;

/// Largest `batch_count` a `FullSyncStartMsg` may announce. It costs no memory by itself (the
/// received set grows with the batches that arrive, see `received.rs`); LMCache workers send
/// `ceil(keys / 2000)`, so this allows 2·10^10 keys.
pub const MAX_SYNC_BATCH_COUNT: i64 = 10_000_000;

/// Most batch ids one `FullSyncStatusRetMsg.missing_batches` lists (the lowest ones). A worker
/// resends those and asks again; without the cap, a start announcing millions of batches
/// would make every status request build and send a reply of tens of megabytes.
pub const MAX_REPORTED_MISSING: usize = 10_000;

/// Failure reason recorded by [`ChunkIndex::expire_syncs`].
pub const FAILURE_TIMEOUT: &str = "timeout";

/// Why a full sync could not start. The first two display LMCache's exact error text, which the
/// controller puts into `FullSyncStartRetMsg.error_msg`.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum SyncError {
    /// The worker is not registered.
    #[error(
        "Failed to start sync: worker already syncing with different sync_id or worker not found"
    )]
    UnknownWorker,
    /// The worker is already syncing under another sync id.
    #[error(
        "Failed to start sync: worker already syncing with different sync_id or worker not found"
    )]
    AlreadySyncing {
        /// The sync id in progress.
        current: String,
    },
    /// `batch_count` is negative or above [`MAX_SYNC_BATCH_COUNT`].
    #[error("Failed to start sync: batch_count {0} outside 0..={max}", max = MAX_SYNC_BATCH_COUNT)]
    BatchCount(i64),
}

/// Result of a `FullSyncBatchMsg`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncBatchOutcome {
    /// Recorded and its keys admitted (a duplicate batch is re-admitted, not re-counted).
    Accepted,
    /// Recorded, and it was the last missing batch after the end had arrived: sync completed.
    Completed,
    /// Dropped: unknown worker, not syncing, other sync id, `batch_id` out of range, or the
    /// location could not be created.
    Rejected,
    /// Dropped: more keys than [`ChunkIndexConfig::max_batch_ops`](super::ChunkIndexConfig); the
    /// batch is not recorded, so it stays missing and the sync cannot complete with it.
    TooLarge,
    /// Dropped: the batch arrived out of order and recording it needs a new range of received
    /// ids over [`ChunkIndexConfig::max_sync_ranges_per_worker`](super::ChunkIndexConfig) or the
    /// shared [`ChunkIndexConfig::max_sync_ranges`](super::ChunkIndexConfig). Not recorded (its
    /// keys are not admitted), so it stays missing and is reported until the worker resends it.
    OverBudget,
}

/// Result of a `FullSyncEndMsg`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncEndOutcome {
    /// Every batch was received: the sync is complete (also returned for a repeated end of an
    /// already completed sync).
    Completed,
    /// The end is recorded but batches are missing; the sync completes when they arrive.
    Incomplete {
        /// Number of batches still missing.
        missing: u64,
    },
    /// Dropped: unknown worker or not syncing under this sync id.
    Rejected,
}

/// Reply data for a `FullSyncStatusMsg`.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncStatus {
    /// The worker's sync with this id is completed.
    pub is_complete: bool,
    /// Fraction of workers that are idle or completed (1.0 with no workers).
    pub global_progress: f64,
    /// `is_complete` and `global_progress` ≥ the configured threshold.
    pub can_exit_freeze: bool,
    /// Sorted batch ids not yet received, while syncing under this sync id (the first
    /// [`MAX_REPORTED_MISSING`]).
    pub missing_batches: Vec<i64>,
}

/// A read-only summary of a worker's sync state.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncView {
    /// `"idle"`, `"syncing"`, `"completed"` or `"failed"` (LMCache's state names).
    pub state: &'static str,
    /// Current or last sync id.
    pub sync_id: Option<String>,
    /// Location named by the start message.
    pub location: Option<String>,
    /// Announced key total.
    pub expected_keys: i64,
    /// Announced batch count.
    pub expected_batches: u64,
    /// Distinct batches received.
    pub received_batches: u64,
    /// Keys received in distinct batches.
    pub received_keys: u64,
    /// Batches still missing (0 unless syncing).
    pub missing_batches: u64,
    /// `actual_total_keys` of the end message, once it arrived (possibly with batches missing).
    pub end_total_keys: Option<i64>,
    /// `received_batches / expected_batches` (1.0 when nothing is expected or completed).
    pub progress: f64,
    /// Start time of the current or last sync (Unix seconds).
    pub start_time: Option<f64>,
    /// Why the sync failed, if it did.
    pub failure: Option<&'static str>,
}

/// Bookkeeping of one full sync.
#[derive(Debug)]
pub(crate) struct Sync {
    pub(super) sync_id: Box<str>,
    pub(super) location: Box<str>,
    pub(super) expected_total_keys: i64,
    pub(super) batch_count: u64,
    /// Received batch ids (emptied once the sync is over).
    pub(super) received: Received,
    pub(super) received_batches: u64,
    pub(super) received_keys: u64,
    pub(super) end_total_keys: Option<i64>,
    pub(super) start_time: f64,
    pub(super) last_activity: f64,
}

impl Sync {
    pub(super) fn missing_count(&self) -> u64 {
        self.batch_count.saturating_sub(self.received_batches)
    }

    /// The first [`MAX_REPORTED_MISSING`] missing batch ids, in order.
    pub(super) fn missing(&self) -> Vec<i64> {
        self.received
            .missing(self.batch_count, MAX_REPORTED_MISSING)
    }
}

/// Per-worker full-sync state.
#[derive(Debug, Default)]
pub(crate) enum SyncState {
    /// No sync ever started, or reset by re-registration.
    #[default]
    Idle,
    /// Receiving batches (possibly after the end message, while batches are missing).
    Syncing(Box<Sync>),
    /// All batches and the end received.
    Completed(Box<Sync>),
    /// Abandoned (timed out), with the reason.
    Failed(Box<Sync>, &'static str),
}

impl SyncState {
    pub(crate) fn is_syncing(&self) -> bool {
        matches!(self, SyncState::Syncing(_))
    }

    pub(crate) fn is_failed(&self) -> bool {
        matches!(self, SyncState::Failed(..))
    }

    /// Idle or completed: counts towards global progress.
    pub(crate) fn is_settled(&self) -> bool {
        matches!(self, SyncState::Idle | SyncState::Completed(_))
    }

    pub(super) fn start(
        &mut self,
        sync_id: &str,
        location: &str,
        total_keys: i64,
        batch_count: i64,
        now: f64,
        budget: &RangeBudget,
    ) -> Result<(), SyncError> {
        if let SyncState::Syncing(s) = self {
            if &*s.sync_id != sync_id {
                return Err(SyncError::AlreadySyncing {
                    current: s.sync_id.to_string(),
                });
            }
        }
        let count = u64::try_from(batch_count)
            .ok()
            .filter(|&c| c <= MAX_SYNC_BATCH_COUNT as u64)
            .ok_or(SyncError::BatchCount(batch_count))?;
        *self = SyncState::Syncing(Box::new(Sync {
            sync_id: sync_id.into(),
            location: location.into(),
            expected_total_keys: total_keys,
            batch_count: count,
            received: Received::new(budget.clone()),
            received_batches: 0,
            received_keys: 0,
            end_total_keys: None,
            start_time: now,
            last_activity: now,
        }));
        Ok(())
    }

    /// The batch index if a batch with these ids would be accepted.
    pub(super) fn accepts_batch(&self, sync_id: &str, batch_id: i64) -> Option<u64> {
        match self {
            SyncState::Syncing(s) if &*s.sync_id == sync_id => {
                u64::try_from(batch_id).ok().filter(|&b| b < s.batch_count)
            }
            _ => None,
        }
    }

    /// Whether accepted batch `b` can be recorded: it is recorded already, or recording it
    /// stays within the range budget.
    pub(super) fn can_record(&self, b: u64) -> bool {
        match self {
            SyncState::Syncing(s) => s.received.contains(b) || s.received.would_fit(b),
            _ => false,
        }
    }

    /// Records accepted batch `b`; returns whether the sync completed.
    pub(super) fn record_batch(&mut self, b: u64, keys: usize, now: f64) -> bool {
        let SyncState::Syncing(s) = self else {
            return false;
        };
        s.last_activity = now;
        if s.received.insert(b) == Insert::New {
            s.received_batches += 1;
            s.received_keys += keys as u64;
        }
        if s.end_total_keys.is_some() && s.missing_count() == 0 {
            self.complete();
            return true;
        }
        false
    }

    pub(super) fn end(
        &mut self,
        sync_id: &str,
        actual_total_keys: i64,
        now: f64,
    ) -> SyncEndOutcome {
        match self {
            SyncState::Syncing(s) if &*s.sync_id == sync_id => {
                s.end_total_keys = Some(actual_total_keys);
                s.last_activity = now;
                match s.missing_count() {
                    0 => {
                        self.complete();
                        SyncEndOutcome::Completed
                    }
                    missing => SyncEndOutcome::Incomplete { missing },
                }
            }
            SyncState::Completed(s) if &*s.sync_id == sync_id => SyncEndOutcome::Completed,
            _ => SyncEndOutcome::Rejected,
        }
    }

    /// Syncing with no activity for more than `timeout_s` seconds.
    pub(super) fn is_stale(&self, now: f64, timeout_s: f64) -> bool {
        matches!(self, SyncState::Syncing(s) if now - s.last_activity > timeout_s)
    }

    /// Syncing → Completed (no-op in other states).
    pub(super) fn complete(&mut self) {
        self.finish(SyncState::Completed);
    }

    /// Syncing → Failed with `reason` (no-op in other states).
    pub(super) fn fail(&mut self, reason: &'static str) {
        self.finish(|s| SyncState::Failed(s, reason));
    }

    pub(super) fn finish(&mut self, to: impl FnOnce(Box<Sync>) -> SyncState) {
        if self.is_syncing() {
            if let SyncState::Syncing(mut s) = std::mem::take(self) {
                s.received = Received::new(s.received.budget().clone());
                *self = to(s);
            }
        }
    }

    /// Batches still missing (0 unless syncing).
    pub(crate) fn missing_count(&self) -> u64 {
        match self {
            SyncState::Syncing(s) => s.missing_count(),
            _ => 0,
        }
    }

    pub(crate) fn view(&self) -> SyncView {
        let (state, sync, failure) = match self {
            SyncState::Idle => ("idle", None, None),
            SyncState::Syncing(s) => ("syncing", Some(s), None),
            SyncState::Completed(s) => ("completed", Some(s), None),
            SyncState::Failed(s, why) => ("failed", Some(s), Some(*why)),
        };
        let progress = match sync {
            Some(s) if s.batch_count > 0 && !matches!(self, SyncState::Completed(_)) => {
                s.received_batches as f64 / s.batch_count as f64
            }
            _ => 1.0,
        };
        SyncView {
            state,
            sync_id: sync.map(|s| s.sync_id.to_string()),
            location: sync.map(|s| s.location.to_string()),
            expected_keys: sync.map_or(0, |s| s.expected_total_keys),
            expected_batches: sync.map_or(0, |s| s.batch_count),
            received_batches: sync.map_or(0, |s| s.received_batches),
            received_keys: sync.map_or(0, |s| s.received_keys),
            missing_batches: self.missing_count(),
            end_total_keys: sync.and_then(|s| s.end_total_keys),
            progress,
            start_time: sync.map(|s| s.start_time),
            failure,
        }
    }
}
