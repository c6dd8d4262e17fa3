//! `kvplane coordinator --cluster`: one leader, hot standbys (docs/CLUSTER.md, "Coordinator
//! leader"), on the replication core (`crate::cluster`).
//!
//! Every process starts as a standby: the core's `Follower` reads the cluster's `coordinator`
//! log and applies each record to the [`CoordinatorState`] it keeps, binding no port. One
//! process holds the `coordinator` lease: it serves HTTP, runs the health sweep, the eviction
//! loop (the only dispatcher) and, when needed, the startup resync, and logs every change it
//! applies (each in the owner job that applies it: `super::state::logged`). When the lease lapses, a
//! standby takes it over: the core announces the new epoch and reads the log up to it; then
//! the followed state is handed to the owners, which log the operator state as a whole first,
//! and the startup resync runs only if that state is not known to be complete. The leader
//! renews the lease and stops the moment it is lost; evictions are dispatched only while the
//! lease is certainly held by this process's clock ([`LeaseGuard`], [`fenced`]). Standbys in
//! sync publish snapshots (the core), so one started after the stream dropped the log's start
//! restores the latest and is in sync.

use super::state::changes::CoordinatorState;
use super::state::driver::{wall_now, Dispatcher};
use super::CoordinatorConfig;
use crate::cluster::{ClusterConfig, Follower, LeaseGuard, Owned};
use crate::service::StartError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Between two logs of the whole operator state by the leader.
pub const METADATA_EVERY: Duration = Duration::from_secs(300);

/// `dispatcher`, refusing (an error, counted in `refused`) whenever `guard` says the lease may
/// have passed to another process: a leader paused past its TTL (GC, SIGSTOP, a partition)
/// sends no eviction once it runs again, before its renewal learns it was deposed.
pub fn fenced(
    dispatcher: Dispatcher,
    guard: Arc<LeaseGuard>,
    refused: Arc<AtomicU64>,
) -> Dispatcher {
    Arc::new(move |d| {
        if guard.held() {
            return dispatcher(d);
        }
        refused.fetch_add(1, Ordering::Relaxed);
        Box::pin(async { Err("the coordinator lease may have lapsed: not dispatching".to_owned()) })
    })
}

/// Runs `kvplane coordinator --cluster`: a standby until it holds the lease (a takeover that
/// fails releases it and waits again), then the leader until `shutdown` (the lease is released
/// once the records are published) or until the lease is lost (an error: the process must
/// stop; restarted, it is a standby). Binding is retried while the lease holds, for a deposed
/// leader on the same host that still holds the port.
///
/// # Errors
/// [`StartError::Cluster`] when NATS cannot be reached or the
/// lease is lost.
pub async fn run(
    config: CoordinatorConfig,
    cluster: ClusterConfig,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    let fail = StartError::Cluster;
    let tasks = TaskTracker::new();
    let stop = CancellationToken::new();
    let followed = Arc::new(Owned::new(CoordinatorState::new(super::initial_model(
        &config,
    ))));
    let standby = Follower::join(cluster, Arc::clone(&followed), false, &stop, &tasks)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let status = Arc::clone(standby.status());
    let Some(lead) = standby.take_over(&shutdown).await else {
        stop.cancel();
        drain(&tasks).await;
        return Ok(());
    };
    // Every record up to the takeover is applied: the owners take the state over.
    let Some(state) = followed.take() else {
        stop.cancel();
        drain(&tasks).await;
        return Err(fail("the followed state was taken over already".into()));
    };
    tracing::info!(
        instances = state.fleet.len(),
        keys = state.model.tracked_keys(),
        "coordinator took the lease"
    );
    let guard = Arc::new(LeaseGuard::new(&lead.lease, standby.bucket().ttl()));
    let release = CancellationToken::new();
    let renewed = Arc::clone(&guard);
    let hold = standby
        .bucket()
        .hold(lead.lease.clone(), &release, move |l| renewed.renewed(l));
    tokio::pin!(hold);
    let bound = tokio::select! {
        bound = bind_retrying(&config) => bound,
        held = &mut hold => {
            guard.revoke();
            drop(lead); // its log: the publisher ends
            stop.cancel();
            drain(&tasks).await;
            return held.map_err(fail);
        }
        () = shutdown.cancelled() => {
            drop(lead);
            release.cancel();
            let held = hold.await;
            stop.cancel();
            drain(&tasks).await;
            return held.map_err(fail);
        }
    };
    status.took_over(wall_now(), lead.elapsed_ms());
    let leading = super::Leading {
        resync: lead.needs_resync(),
        log: lead.log,
        status: Arc::clone(&status),
        guard: Arc::clone(&guard),
    };
    let coordinator = super::serve(config, bound, state, Some(leading), stop, tasks);
    let lost = tokio::select! {
        held = &mut hold => Some(held),
        () = shutdown.cancelled() => None,
    };
    match lost {
        Some(held) => {
            guard.revoke();
            tracing::error!("the coordinator lease was lost: stopping at once");
            coordinator.stop().await;
            held.map_err(fail)
        }
        None => {
            tracing::info!("shutting down");
            // Serving stops and the queued records are published before the lease goes.
            let stopping = async {
                coordinator.stop().await;
                release.cancel();
            };
            let ((), held) = tokio::join!(stopping, hold);
            held.map_err(fail)
        }
    }
}

async fn bind_retrying(
    config: &CoordinatorConfig,
) -> (tokio::net::TcpListener, std::net::SocketAddr) {
    let mut tries = 0u64;
    loop {
        match super::bind(config).await {
            Ok(bound) => return bound,
            Err(e) => {
                if tries.is_multiple_of(50) {
                    tracing::warn!("coordinator leader cannot bind yet ({e}); retrying");
                }
                tries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn drain(tasks: &TaskTracker) {
    tasks.close();
    let _ = tokio::time::timeout(crate::service::DRAIN_DEADLINE, tasks.wait()).await;
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
