//! Full-sync tracking (protocol spec §3.5): the per-worker state machine and the [`ChunkIndex`]
//! methods that drive it.
//!
//! States: `Idle → Syncing → Completed | Failed`, and back to `Syncing` on a new start.
//! Differences from LMCache 0.5.6, on purpose:
//! * `FullSyncEndMsg` with batches missing does **not** complete the sync (bug §7.4): the worker
//!   stays `Syncing` with the end recorded, status reports the missing ids, and the sync
//!   completes when the last missing batch arrives.
//! * re-registration resets the sync state (bug §7.3; done by the facade).
//! * [`ChunkIndex::expire_syncs`] is meant to be called, turning stale syncs into `Failed` so the
//!   next heartbeat asks for `sync_failed_retry`.
//!
//! This module owns no keys: admitting batch keys and clearing a location on start go through
//! the facade's reverse index.

use super::chunks::has;
use super::registry::WorkerEntry;
pub use super::sync_state::*;
use super::{ensure_location, ChunkIndex};
use crate::protocol::ChunkHash;

impl ChunkIndex {
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
    /// [`ChunkIndexConfig::max_keys_per_worker`](super::ChunkIndexConfig) are refused (counted in
    /// [`ChunkIndex::keys_refused`]); a batch over `max_batch_ops` keys is not recorded at all.
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
    /// progress at or above
    /// [`ChunkIndexConfig::sync_completion_threshold`](super::ChunkIndexConfig).
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
    /// is free), against [`ChunkIndexConfig::max_sync_ranges`](super::ChunkIndexConfig).
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

    fn worker_mut(&mut self, instance_id: &str, worker_id: i64) -> Option<&mut WorkerEntry> {
        let ws = self.reg.find(instance_id, worker_id)?;
        self.reg.worker_mut(ws)
    }
}
