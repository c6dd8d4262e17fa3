//! `kvplane coordinator --cluster`: one leader, hot standbys (docs/CLUSTER.md, "Coordinator
//! leader"), on the replication core (`crate::cluster`) and its one leader loop
//! (`crate::cluster::Candidate`).
//!
//! Every process starts as a standby: the core's follower reads the cluster's `coordinator`
//! log and applies each record to the [`CoordinatorState`] it keeps, binding no port. One
//! process holds the `coordinator` lease: it serves HTTP, runs the health sweep, the eviction
//! loop (the only dispatcher) and, when needed, the startup resync, and logs every change it
//! applies (each in the owner job that applies it: `super::state::logged`). When the lease lapses, a
//! standby takes it over: the core announces the new epoch and reads the log up to it; then
//! the followed state is handed to the owners ([`Serves`]), which log the operator state as a
//! whole first, and the startup resync runs only if that state is not known to be complete.
//! The leader loop renews the lease and stops the moment it is lost; evictions are dispatched
//! only while the lease is certainly held by this process's clock ([`fenced`], the core's
//! `Fence`). Standbys in sync publish snapshots (the core), so one started after the stream
//! dropped the log's start restores the latest and is in sync.

use super::state::changes::CoordinatorState;
use super::state::driver::Dispatcher;
use super::{Coordinator, CoordinatorConfig, Leading};
use crate::cluster::{Candidate, ClusterConfig, Fence, LeaderService, LeaseGuard, Owned};
use crate::service::{Running, StartError};
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
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
    let fence = Fence::new("coordinator", guard, refused);
    Arc::new(move |d| match fence.check() {
        Ok(()) => dispatcher(d),
        Err(e) => Box::pin(async move { Err(e.to_string()) }),
    })
}

/// Runs `kvplane coordinator --cluster`: a standby until it holds the lease (a takeover that
/// fails releases it and waits again), then the leader until `shutdown` (the lease is released
/// once the records are published) or until the lease is lost (an error: the process must
/// stop; restarted, it is a standby), on the cluster's one leader loop
/// ([`crate::cluster::Elected::lead`]).
///
/// # Errors
/// [`StartError::Cluster`] when NATS cannot be reached or the lease is lost.
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
    let candidate = Candidate::join(cluster, Arc::clone(&followed), &stop, &tasks)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let Some(elected) = candidate.elect(&shutdown).await else {
        return Ok(());
    };
    // Every record up to the takeover is applied: the owners take the state over.
    let Some(state) = followed.take() else {
        elected.abandon().await;
        return Err(fail("the followed state was taken over already".into()));
    };
    tracing::info!(
        instances = state.fleet.len(),
        keys = state.model.tracked_keys(),
        "coordinator took the lease"
    );
    let lead = &elected.leadership;
    let leading = Leading {
        resync: lead.needs_resync(),
        log: Arc::clone(&lead.log),
        status: Arc::clone(elected.status()),
        guard: Arc::clone(elected.fence().guard()),
    };
    let serves = Serves {
        config,
        state,
        leading,
        stop: elected.stop_token().clone(),
        tasks: elected.tasks().clone(),
    };
    elected.lead(serves, &shutdown).await.map_err(fail)
}

/// The coordinator's part in the leader loop: bind its HTTP port, then start the owners
/// around the state it followed, with the leader's log, and serve.
struct Serves {
    config: CoordinatorConfig,
    state: CoordinatorState,
    leading: Leading,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl LeaderService for Serves {
    type Bound = (TcpListener, SocketAddr);
    type Server = Coordinator;

    async fn bind(&self) -> Result<Self::Bound, String> {
        super::bind(&self.config).await.map_err(|e| e.to_string())
    }

    fn serve(self, bound: Self::Bound) -> Running<Coordinator> {
        super::serve(
            self.config,
            bound,
            self.state,
            Some(self.leading),
            self.stop,
            self.tasks,
        )
    }
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
