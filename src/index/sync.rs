//! Full-sync tracking (protocol spec §3.5): the per-worker state machine and the [`Index`]
//! methods that drive it.
//!
//! States: `Idle → Syncing → Completed | Failed`, and back to `Syncing` on a new start.
//! Differences from LMCache 0.5.6, on purpose:
//! * `FullSyncEndMsg` with batches missing does **not** complete the sync (bug §7.4): the worker
//!   stays `Syncing` with the end recorded, status reports the missing ids, and the sync
//!   completes when the last missing batch arrives.
//! * re-registration resets the sync state (bug §7.3; done by the facade).
//! * [`Index::expire_syncs`] is meant to be called, turning stale syncs into `Failed` so the
//!   next heartbeat asks for `sync_failed_retry`.
//!
//! This module owns no keys: admitting batch keys and clearing a location on start go through
//! the facade's reverse index.

use super::chunks::has;
use super::received::{Insert, RangeBudget, Received};
use super::registry::Worker;
use super::{ensure_location, Index};
use crate::protocol::ChunkHash;
use thiserror::Error;

/// Largest `batch_count` a `FullSyncStartMsg` may announce. It costs no memory by itself (the
/// received set grows with the batches that arrive, see `received.rs`); LMCache workers send
/// `ceil(keys / 2000)`, so this allows 2·10^10 keys.
pub const MAX_SYNC_BATCH_COUNT: i64 = 10_000_000;

/// Most batch ids one `FullSyncStatusRetMsg.missing_batches` lists (the lowest ones). A worker
/// resends those and asks again; without the cap, a start announcing millions of batches
/// would make every status request build and send a reply of tens of megabytes.
pub const MAX_REPORTED_MISSING: usize = 10_000;

/// Failure reason recorded by [`Index::expire_syncs`].
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
    /// Dropped: more keys than [`IndexConfig::max_batch_ops`](super::IndexConfig); the batch
    /// is not recorded, so it stays missing and the sync cannot complete with it.
    TooLarge,
    /// Dropped: the batch arrived out of order and recording it needs a new range of received
    /// ids over [`IndexConfig::max_sync_ranges_per_worker`](super::IndexConfig) or the shared
    /// [`IndexConfig::max_sync_ranges`](super::IndexConfig). Not recorded (its keys are not
    /// admitted), so it stays missing and is reported until the worker resends it.
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
    sync_id: Box<str>,
    location: Box<str>,
    expected_total_keys: i64,
    batch_count: u64,
    /// Received batch ids (emptied once the sync is over).
    received: Received,
    received_batches: u64,
    received_keys: u64,
    end_total_keys: Option<i64>,
    start_time: f64,
    last_activity: f64,
}

impl Sync {
    fn missing_count(&self) -> u64 {
        self.batch_count.saturating_sub(self.received_batches)
    }

    /// The first [`MAX_REPORTED_MISSING`] missing batch ids, in order.
    fn missing(&self) -> Vec<i64> {
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

    fn start(
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
    fn accepts_batch(&self, sync_id: &str, batch_id: i64) -> Option<u64> {
        match self {
            SyncState::Syncing(s) if &*s.sync_id == sync_id => {
                u64::try_from(batch_id).ok().filter(|&b| b < s.batch_count)
            }
            _ => None,
        }
    }

    /// Whether accepted batch `b` can be recorded: it is recorded already, or recording it
    /// stays within the range budget.
    fn can_record(&self, b: u64) -> bool {
        match self {
            SyncState::Syncing(s) => s.received.contains(b) || s.received.would_fit(b),
            _ => false,
        }
    }

    /// Records accepted batch `b`; returns whether the sync completed.
    fn record_batch(&mut self, b: u64, keys: usize, now: f64) -> bool {
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

    fn end(&mut self, sync_id: &str, actual_total_keys: i64, now: f64) -> SyncEndOutcome {
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
    fn is_stale(&self, now: f64, timeout_s: f64) -> bool {
        matches!(self, SyncState::Syncing(s) if now - s.last_activity > timeout_s)
    }

    /// Syncing → Completed (no-op in other states).
    fn complete(&mut self) {
        self.finish(SyncState::Completed);
    }

    /// Syncing → Failed with `reason` (no-op in other states).
    fn fail(&mut self, reason: &'static str) {
        self.finish(|s| SyncState::Failed(s, reason));
    }

    fn finish(&mut self, to: impl FnOnce(Box<Sync>) -> SyncState) {
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

impl Index {
    /// Handles `FullSyncStartMsg`: the worker enters `Syncing` (a start with the current sync id
    /// restarts it) and the keys and sequence tracker of `location` are cleared. Incremental
    /// batches of the worker are discarded until the sync ends.
    ///
    /// # Errors
    /// [`SyncError::UnknownWorker`] if the worker is not registered,
    /// [`SyncError::AlreadySyncing`] if it is syncing under another sync id,
    /// [`SyncError::BatchCount`] if `batch_count` is negative or above
    /// [`MAX_SYNC_BATCH_COUNT`]. The state is unchanged on error.
    #[allow(clippy::too_many_arguments)]
    pub fn sync_start(
        &mut self,
        instance_id: &str,
        worker_id: i64,
        location: &str,
        sync_id: &str,
        total_keys: i64,
        batch_count: i64,
        now: f64,
    ) -> Result<(), SyncError> {
        let ws = self
            .reg
            .find(instance_id, worker_id)
            .ok_or(SyncError::UnknownWorker)?;
        let Some(w) = self.reg.worker_mut(ws) else {
            return Err(SyncError::UnknownWorker);
        };
        w.touch(now);
        w.resync = None;
        w.sync.start(
            sync_id,
            location,
            total_keys,
            batch_count,
            now,
            &self.sync_ranges,
        )?;
        if let Some(li) = w.location(location) {
            self.chunks.kill_holder(w.locations[li].holder);
            match self.chunks.alloc_holder(ws) {
                Some(h) => {
                    let loc = &mut w.locations[li];
                    loc.holder = h;
                    loc.last_seq = None;
                }
                None => {
                    w.locations.remove(li);
                }
            }
        }
        self.maybe_compact();
        Ok(())
    }

    /// Handles `FullSyncBatchMsg`: if the worker is syncing under `sync_id` and `batch_id` is in
    /// `0..batch_count`, marks the batch received (duplicates are not double counted) and admits
    /// `keys` to `location` without sequence checks. Completes the sync if the end already
    /// arrived and this was the last missing batch. Keys beyond
    /// [`IndexConfig::max_keys_per_worker`](super::IndexConfig) are refused (counted in
    /// [`Index::keys_refused`]); a batch over `max_batch_ops` keys is not recorded at all.
    #[allow(clippy::too_many_arguments)]
    pub fn sync_batch(
        &mut self,
        instance_id: &str,
        worker_id: i64,
        location: &str,
        sync_id: &str,
        batch_id: i64,
        keys: &[ChunkHash],
        now: f64,
    ) -> SyncBatchOutcome {
        if keys.len() > self.config.max_batch_ops {
            return SyncBatchOutcome::TooLarge;
        }
        let Some(ws) = self.reg.find(instance_id, worker_id) else {
            return SyncBatchOutcome::Rejected;
        };
        let max_locations = self.config.max_locations_per_worker;
        let Some(w) = self.reg.worker_mut(ws) else {
            return SyncBatchOutcome::Rejected;
        };
        w.touch(now);
        let Some(b) = w.sync.accepts_batch(sync_id, batch_id) else {
            return SyncBatchOutcome::Rejected;
        };
        if !w.sync.can_record(b) {
            return SyncBatchOutcome::OverBudget;
        }
        let Some(li) = ensure_location(w, ws, location, &mut self.chunks, max_locations) else {
            return SyncBatchOutcome::Rejected;
        };
        let h = w.locations[li].holder;
        let max_keys = self.config.max_keys_per_worker;
        let mut held = super::worker_keys(w, &self.chunks);
        for &key in keys {
            if held < max_keys {
                held += u64::from(self.chunks.admit(h, key));
            } else if !has(self.chunks.members(key), h) {
                self.keys_refused += 1;
            }
        }
        if w.sync.record_batch(b, keys.len(), now) {
            SyncBatchOutcome::Completed
        } else {
            SyncBatchOutcome::Accepted
        }
    }

    /// Handles `FullSyncEndMsg`: completes the sync if every batch arrived; otherwise records
    /// the end and keeps the worker syncing until the missing batches arrive (LMCache would
    /// mark it completed and lose them, bug §7.4). The message's `location` plays no part.
    pub fn sync_end(
        &mut self,
        instance_id: &str,
        worker_id: i64,
        sync_id: &str,
        actual_total_keys: i64,
        now: f64,
    ) -> SyncEndOutcome {
        let Some(w) = self.worker_mut(instance_id, worker_id) else {
            return SyncEndOutcome::Rejected;
        };
        w.touch(now);
        w.sync.end(sync_id, actual_total_keys, now)
    }

    /// Handles `FullSyncStatusMsg`. `missing_batches` is reported only while the worker is
    /// syncing under `sync_id`; `can_exit_freeze` needs the sync complete *and* the global
    /// progress at or above [`IndexConfig::sync_completion_threshold`](super::IndexConfig).
    pub fn sync_status(&self, instance_id: &str, worker_id: i64, sync_id: &str) -> SyncStatus {
        let global_progress = self.global_sync_progress();
        let (is_complete, missing_batches) = match self.worker_ref(instance_id, worker_id) {
            Some(w) => match &w.sync {
                SyncState::Completed(s) if &*s.sync_id == sync_id => (true, Vec::new()),
                SyncState::Syncing(s) if &*s.sync_id == sync_id => (false, s.missing()),
                _ => (false, Vec::new()),
            },
            None => (false, Vec::new()),
        };
        SyncStatus {
            is_complete,
            global_progress,
            can_exit_freeze: is_complete
                && global_progress >= self.config.sync_completion_threshold,
            missing_batches,
        }
    }

    /// Fraction of workers whose sync state is idle or completed; 1.0 with no workers.
    pub fn global_sync_progress(&self) -> f64 {
        let total = self.reg.worker_count();
        if total == 0 {
            return 1.0;
        }
        let settled = self
            .reg
            .workers()
            .filter(|(_, _, w)| w.sync.is_settled())
            .count();
        settled as f64 / total as f64
    }

    /// Fails every sync with no activity for more than `timeout_s` seconds, so the worker's next
    /// heartbeat is answered with `sync_failed_retry`; returns `(instance_id, worker_id)` of
    /// each, in registration order. Keys received so far stay until the retry's start clears
    /// the location.
    pub fn expire_syncs(&mut self, now: f64, timeout_s: f64) -> Vec<(String, i64)> {
        let stale: Vec<(u32, String, i64)> = self
            .reg
            .workers()
            .filter(|(_, _, w)| w.sync.is_stale(now, timeout_s))
            .map(|(ws, inst, w)| (ws, inst.name.to_string(), w.worker_id))
            .collect();
        stale
            .into_iter()
            .filter_map(|(ws, instance, wid)| {
                self.reg.worker_mut(ws)?.sync.fail(FAILURE_TIMEOUT);
                Some((instance, wid))
            })
            .collect()
    }

    /// Extra ranges of received batch ids held by all syncs together (each sync's first range
    /// is free), against [`IndexConfig::max_sync_ranges`](super::IndexConfig).
    pub fn sync_ranges_used(&self) -> usize {
        self.sync_ranges.used()
    }

    /// `(syncing workers, completed workers, missing batches summed over syncing workers)`, for
    /// the `full_sync_*` gauges.
    pub fn sync_counts(&self) -> (usize, usize, u64) {
        let (mut syncing, mut completed, mut missing) = (0, 0, 0);
        for (_, _, w) in self.reg.workers() {
            match &w.sync {
                SyncState::Syncing(s) => {
                    syncing += 1;
                    missing += s.missing_count();
                }
                SyncState::Completed(_) => completed += 1,
                _ => {}
            }
        }
        (syncing, completed, missing)
    }

    fn worker_mut(&mut self, instance_id: &str, worker_id: i64) -> Option<&mut Worker> {
        let ws = self.reg.find(instance_id, worker_id)?;
        self.reg.worker_mut(ws)
    }
}
