//! The liveness sweep: expire stalled full syncs, probe silent workers, remove dead ones.
//!
//! LMCache removes every worker silent for `--lmcache-worker-timeout`, and its workers do not
//! heartbeat by default, so enabling its health check reaps live workers. kvplane first sends
//! a `HealthWorkerMsg` on the worker's downlink: any answer proves it alive; only a worker
//! that stays silent and does not answer within the downlink timeout is removed.
//!
//! At most `--max-concurrent-probes` probes are in flight (`kvplane_probes_in_flight`); each
//! result takes the state lock once, for an O(1) check
//! ([`ChunkIndex::is_stale`](super::model::index::ChunkIndex::is_stale)), and the lock is never
//! held across an `.await`. Owns no state of its own.

use super::driver::Driver;
use super::model::ProbeTarget;
use crate::protocol::{HealthWorkerMsg, Msg};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// What one probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeResult {
    /// The worker answered: it is alive.
    Answered,
    /// No answer (timeout, refused, …), with why.
    Failed(String),
    /// Not probed: the registration changed since the sweep began.
    Skipped,
}

/// What one sweep did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepStats {
    /// Silent workers found.
    pub stale: usize,
    /// Probes that got an answer.
    pub answered: usize,
    /// Workers removed.
    pub removed: usize,
}

/// Runs sweeps every `interval` until shutdown.
pub async fn liveness_loop(shared: Arc<Driver>, interval: Duration, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = sweep(&shared) => {}
        }
    }
}

/// One sweep over the workers' downlinks; returns when every probe it started has finished
/// (each is bounded by the downlink timeout).
pub async fn sweep(shared: &Arc<Driver>) -> SweepStats {
    sweep_with(shared, downlink_probe).await
}

/// One sweep with `probe` as the probe (tests pass a fake one): marks stalled syncs failed,
/// probes the silent workers at most `--max-concurrent-probes` at a time, and removes those
/// whose probe failed if they are still silent and still the registration probed.
pub async fn sweep_with<P, F>(shared: &Arc<Driver>, probe: P) -> SweepStats
where
    P: Fn(Arc<Driver>, ProbeTarget) -> F,
    F: Future<Output = ProbeResult> + Send + 'static,
{
    let targets = shared.begin_sweep();
    let mut stats = SweepStats {
        stale: targets.len(),
        ..SweepStats::default()
    };
    let limit = shared.config.max_concurrent_probes.max(1);
    let gauge = &shared.metrics.probes_in_flight;
    let mut targets = targets.into_iter();
    let mut in_flight = JoinSet::new();
    loop {
        while in_flight.len() < limit {
            let Some(target) = targets.next() else { break };
            let running = probe(Arc::clone(shared), target.clone());
            gauge.inc();
            in_flight.spawn(async move { (target, running.await) });
        }
        let Some(joined) = in_flight.join_next().await else {
            break;
        };
        gauge.dec();
        let Ok((target, result)) = joined else {
            continue;
        };
        let outcome = match result {
            ProbeResult::Answered => {
                shared.probe_answered(&target);
                stats.answered += 1;
                tracing::debug!(worker = ?target.key, "silent worker answered its probe");
                "answered"
            }
            ProbeResult::Failed(e) => {
                if shared.probe_failed(&target) {
                    stats.removed += 1;
                    tracing::warn!(
                        instance_id = %target.key.0, worker_id = target.key.1,
                        endpoint = %target.endpoint,
                        "worker silent for {:?} and its probe failed ({e}): removed",
                        shared.config.worker_timeout
                    );
                    "removed"
                } else {
                    "failed"
                }
            }
            ProbeResult::Skipped => continue,
        };
        shared.metrics.probes.with_label_values(&[outcome]).inc();
    }
    stats
}

/// Sends `HealthWorkerMsg` on the worker's downlink, if it is still the generation probed.
async fn downlink_probe(shared: Arc<Driver>, target: ProbeTarget) -> ProbeResult {
    let entry = match shared.downlink(&target.key.0, target.key.1) {
        Some(e) if e.generation == target.generation => e,
        _ => return ProbeResult::Skipped,
    };
    let event = format!("kvplane-probe-{}", target.generation);
    let answer = entry
        .downlink
        .request(Msg::HealthWorkerMsg(HealthWorkerMsg {
            worker_event_id: event,
        }))
        .await;
    match answer {
        Ok(_) => ProbeResult::Answered,
        Err(e) => ProbeResult::Failed(e.to_string()),
    }
}

#[cfg(test)]
#[path = "liveness_tests.rs"]
mod tests;
