//! How the controller counts and logs what its model reports: one [`ModelEvent`] in, metric
//! increments and (throttled) log lines out.
//!
//! Owns the policy only (which metric, which level, which throttle); touches no controller
//! state and is called after the state lock is released.

use super::limits::{Limit, LimitLog, LogThrottle};
use super::metrics::Metrics;
use super::model::ModelEvent;
use crate::config::ServeConfig;
use crate::controller::model::index::{BatchOutcome, IndexError};

/// What reporting reads and counts: the driver's metrics, throttles and limits.
pub(crate) struct ReportSinks<'a> {
    /// Metrics registry.
    pub metrics: &'a Metrics,
    /// The configuration (the limits named in the log lines).
    pub config: &'a ServeConfig,
    /// Log throttle of the resource limits.
    pub limits: &'a LimitLog,
    /// Log throttle of per-message warnings.
    pub drop_log: &'a LogThrottle,
}

/// Counts and logs one event.
pub(crate) fn report(shared: &ReportSinks<'_>, event: ModelEvent) {
    match event {
        ModelEvent::WorkerRefused { key, what, error } => {
            refused_worker(shared, &error, &key.0, key.1, what);
        }
        ModelEvent::WorkerRegistered {
            key,
            endpoint,
            again,
        } => {
            if again {
                tracing::warn!(
                    instance = %key.0, worker = key.1,
                    "worker re-registered: its keys and sync state were cleared"
                );
            }
            tracing::info!(instance = %key.0, worker = key.1, %endpoint, "worker registered");
        }
        ModelEvent::RegisteredByHeartbeat { key } => {
            tracing::info!(
                instance = %key.0, worker = key.1,
                "heartbeat from an unknown worker: re-registered, asking for a full sync"
            );
        }
        ModelEvent::WorkerRemoved { key, reason } => {
            shared
                .metrics
                .workers_removed
                .with_label_values(&[reason.label()])
                .inc();
            tracing::info!(instance = %key.0, worker = key.1, reason = reason.label(), "worker removed");
        }
        ModelEvent::UnknownDeregistration { key } => {
            if let Some(held_back) = shared.drop_log.admit() {
                tracing::warn!(instance = %key.0, worker = key.1, held_back, "deregistration of an unknown worker");
            }
        }
        ModelEvent::P2pLookup { hit } => {
            let label = if hit { "hit" } else { "miss" };
            shared.metrics.p2p_lookups.with_label_values(&[label]).inc();
        }
        ModelEvent::SyncStarted {
            key,
            sync_id,
            error,
        } => match error {
            None => {
                tracing::info!(instance = %key.0, worker = key.1, %sync_id, "full sync started")
            }
            Some(e) => {
                if let Some(held_back) = shared.drop_log.admit() {
                    tracing::warn!(instance = %key.0, worker = key.1, held_back, "full sync refused: {e}");
                }
            }
        },
        ModelEvent::SyncCompleted {
            key,
            sync_id,
            by_batch,
        } => {
            let how = if by_batch { " by a resent batch" } else { "" };
            tracing::info!(instance = %key.0, worker = key.1, %sync_id, "full sync completed{how}");
        }
        ModelEvent::SyncIncomplete {
            key,
            sync_id,
            missing,
        } => {
            tracing::warn!(instance = %key.0, worker = key.1, %sync_id, missing, "full sync ended with batches missing: waiting for them");
        }
        ModelEvent::StaleSyncBatch {
            key,
            sync_id,
            batch,
        } => {
            if let Some(held_back) = shared.drop_log.admit() {
                tracing::warn!(instance = %key.0, worker = key.1, %sync_id, batch, held_back, "full-sync batch for no active sync dropped");
            }
        }
        ModelEvent::SyncBatchTooLarge { key, keys } => {
            refused_batch(shared, Some(keys), &key.0, key.1, "full-sync");
        }
        ModelEvent::SyncRangesRefused { key, batch, limit } => {
            shared
                .limits
                .hit(shared.metrics, Limit::SyncRanges, limit as u64, &|| {
                    format!(
                        "out-of-order full-sync batch {batch} from worker {}/{} dropped (it stays missing)",
                        key.0, key.1
                    )
                });
        }
        ModelEvent::KeysRefused {
            key,
            location,
            count,
        } => refused_keys(shared, count, &key.0, key.1, &location),
        ModelEvent::Batch {
            key,
            location,
            outcome,
        } => record_batch(shared, outcome, &key.0, key.1, &location),
        ModelEvent::SyncExpired { key } => {
            tracing::warn!(instance = %key.0, worker = key.1, "full sync stalled: marked failed, the worker will be asked to retry");
        }
    }
}

/// Counts what applying one admit/evict batch did, and logs sequence gaps.
pub(crate) fn record_batch(
    shared: &ReportSinks<'_>,
    outcome: BatchOutcome,
    instance_id: &str,
    worker_id: i64,
    location: &str,
) {
    let m = &shared.metrics;
    match outcome {
        BatchOutcome::Applied {
            admits,
            evicts,
            gaps,
            refused,
            ..
        } => {
            if refused > 0 {
                refused_keys(shared, refused as u64, instance_id, worker_id, location);
            }
            // Refused admits were received but not applied.
            m.ops_applied
                .with_label_values(&["admit"])
                .inc_by(admits.saturating_sub(refused) as u64);
            m.ops_applied
                .with_label_values(&["evict"])
                .inc_by(evicts as u64);
            if gaps > 0 {
                m.seq_discontinuities.inc();
                if let Some(held_back) = shared.drop_log.admit() {
                    tracing::warn!(instance = %instance_id, worker = worker_id, location, gaps, held_back, "sequence gap in admit/evict batch (ops applied anyway)");
                }
            }
        }
        BatchOutcome::DiscardedSyncing => {
            m.batches_discarded.with_label_values(&["syncing"]).inc();
        }
        BatchOutcome::UnknownWorker => {
            m.batches_discarded
                .with_label_values(&["unknown_worker"])
                .inc();
        }
        BatchOutcome::TooManyLocations => {
            m.batches_discarded
                .with_label_values(&["too_many_locations"])
                .inc();
            if let Some(held_back) = shared.drop_log.admit() {
                tracing::warn!(
                    instance = %instance_id, worker = worker_id, location, held_back,
                    "batch for a new location over the per-worker limit dropped"
                );
            }
        }
        BatchOutcome::TooLarge => {
            m.batches_discarded
                .with_label_values(&["too_many_ops"])
                .inc();
            refused_batch(shared, None, instance_id, worker_id, "admit/evict");
        }
    }
}

fn refused_worker(
    shared: &ReportSinks<'_>,
    e: &IndexError,
    instance_id: &str,
    worker_id: i64,
    what: &str,
) {
    match e {
        IndexError::TooManyWorkers { limit } => {
            shared
                .limits
                .hit(shared.metrics, Limit::Workers, *limit as u64, &|| {
                    format!("{what} of worker {instance_id}/{worker_id} refused")
                });
        }
        IndexError::CapacityExceeded => {
            tracing::warn!(instance = %instance_id, worker = worker_id, "{what} refused: {e}");
        }
    }
}

fn refused_keys(
    shared: &ReportSinks<'_>,
    n: u64,
    instance_id: &str,
    worker_id: i64,
    location: &str,
) {
    shared.metrics.keys_refused.inc_by(n);
    let limit = shared.config.max_keys_per_worker;
    shared
        .limits
        .hit(shared.metrics, Limit::KeysPerWorker, limit, &|| {
            format!("{n} admits of worker {instance_id}/{worker_id} ({location}) refused")
        });
}

fn refused_batch(
    shared: &ReportSinks<'_>,
    keys: Option<usize>,
    instance_id: &str,
    worker_id: i64,
    what: &str,
) {
    let limit = shared.config.max_batch_ops;
    shared
        .limits
        .hit(shared.metrics, Limit::BatchOps, limit as u64, &|| {
            let size = keys.map_or_else(String::new, |n| format!(" of {n} keys"));
            format!("{what} batch{size} from worker {instance_id}/{worker_id} dropped whole")
        });
}
