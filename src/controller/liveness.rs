//! The liveness sweep: expire stalled full syncs, probe silent workers, remove dead ones.
//!
//! LMCache removes every worker silent for `--lmcache-worker-timeout`, and its workers do not
//! heartbeat by default, so enabling its health check reaps live workers. kvplane first sends
//! a `HealthWorkerMsg` on the worker's downlink: any answer proves it alive; only a worker
//! that stays silent and does not answer within the downlink timeout is removed.

use super::state::{unix_now, Shared};
use crate::protocol::{HealthWorkerMsg, Msg};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Runs sweeps every `interval` until shutdown.
pub async fn liveness_loop(shared: Arc<Shared>, interval: Duration, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = sweep(&shared) => {}
        }
    }
}

/// One sweep; returns when every probe it started has finished (each is bounded by the
/// downlink timeout).
pub async fn sweep(shared: &Arc<Shared>) {
    let now = unix_now();
    let timeout = shared.config.worker_timeout.as_secs_f64();
    let failed = shared
        .index
        .write()
        .expire_syncs(now, shared.config.full_sync_timeout.as_secs_f64());
    for (instance, worker) in failed {
        tracing::warn!(%instance, worker, "full sync stalled: marked failed, the worker will be asked to retry");
    }
    let stale = shared.index.read().stale_workers(now, timeout);
    let mut probes = JoinSet::new();
    for worker in stale {
        let shared = Arc::clone(shared);
        probes.spawn(async move { probe(&shared, worker.instance_id, worker.worker_id).await });
    }
    while probes.join_next().await.is_some() {}
}

async fn probe(shared: &Shared, instance_id: String, worker_id: i64) {
    let Some(entry) = shared.downlink(&instance_id, worker_id) else {
        return;
    };
    let event = format!("kvplane-probe-{}", entry.generation);
    let answer = entry
        .downlink
        .request(Msg::HealthWorkerMsg(HealthWorkerMsg {
            worker_event_id: event,
        }))
        .await;
    match answer {
        Ok(_) => {
            shared
                .index
                .write()
                .touch(&instance_id, worker_id, unix_now());
            tracing::debug!(%instance_id, worker_id, "silent worker answered its probe");
        }
        Err(e) => {
            // Remove only the registration that was probed, and only if it is still silent.
            let current = shared
                .downlink(&instance_id, worker_id)
                .map(|d| d.generation);
            let timeout = shared.config.worker_timeout.as_secs_f64();
            let mut index = shared.index.write();
            let still_stale = index
                .stale_workers(unix_now(), timeout)
                .iter()
                .any(|w| w.instance_id == instance_id && w.worker_id == worker_id);
            if current == Some(entry.generation) && still_stale {
                index.deregister(&instance_id, worker_id);
                drop(index);
                shared.close_downlink(&instance_id, worker_id);
                shared
                    .metrics
                    .workers_removed
                    .with_label_values(&["probe_failed"])
                    .inc();
                shared.refresh_gauges();
                tracing::warn!(
                    %instance_id, worker_id, endpoint = entry.downlink.endpoint(),
                    "worker silent for {:?} and its probe failed ({e}): removed",
                    Duration::from_secs_f64(timeout)
                );
            }
        }
    }
}
