//! The one leader loop of the services with a leader and hot standbys (the controller and the
//! coordinator), from joining as a standby to stopping on the loss of the lease:
//!
//! 1. [`Candidate::join`]: follow the service's log into its state ([`Follower`]), binding
//!    nothing.
//! 2. [`Candidate::elect`]: wait for the lease, announce the new epoch and read the log back
//!    to it, start the leader's log; from then on the [`Fence`] (a [`LeaseGuard`] of the lease)
//!    stands in front of every outbound action: it refuses, and counts, whatever the service
//!    would send once the lease may have passed to another process ([`ClusterStatus::fence`]).
//! 3. [`Elected::lead`]: renew the lease every quarter TTL (each renewal extends the fence),
//!    bind the service's ports — retried every [`BIND_RETRY`] while the lease holds, for a
//!    deposed leader on the same host that still holds them, with one warning per
//!    [`BIND_WARN_EVERY`] tries rather than one per try — serve, and stop: on `shutdown`,
//!    serving stops and the queued records are published before the lease is released (the
//!    next leader need not wait for the TTL); on the loss of the lease, the fence closes at
//!    once, the process's other services are told to stop, and the error says the process
//!    must stop (restarted, it is a standby).
//!
//! What differs between services is given as a [`LeaderService`]: how to bind and how to
//! serve what was bound. What a service does at the takeover itself (the controller opens its
//! downlinks; the coordinator hands the followed state to its owners) it does between
//! [`Candidate::elect`] and [`Elected::lead`].
//!
//! Must not: know any service; hold a lease it cannot renew (the fence closes first).

use super::follower::{Follower, Leadership};
use super::lease::{LeaseBucket, LeaseGuard};
use super::replicated::{Host, Replicated};
use super::status::ClusterStatus;
use super::{now_ms, ClusterConfig, ClusterError};
use crate::service::Running;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Between two tries to bind while the ports are still taken.
pub const BIND_RETRY: Duration = Duration::from_millis(100);

/// One warning per this many failed tries to bind (the first, then every 5 s).
pub const BIND_WARN_EVERY: u64 = 50;

/// Whether the `failed`th failed try to bind (from 0) is one to warn of.
fn warn_of_bind(failed: u64) -> bool {
    failed.is_multiple_of(BIND_WARN_EVERY)
}

/// The guard in front of a leader's outbound actions: open while this process certainly still
/// holds the lease by its own clock ([`LeaseGuard`]), closed once a TTL passed since the last
/// renewal that succeeded, or once the lease is known lost. A leader paused past its TTL (a
/// GC pause, SIGSTOP, a partition) sends nothing once it runs again, before its renewal learns
/// it was deposed. Cheap to clone and to check.
#[derive(Clone, Debug)]
pub struct Fence {
    service: &'static str,
    guard: Arc<LeaseGuard>,
    refused: Arc<AtomicU64>,
}

/// An action refused by a closed [`Fence`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the {0} lease may have lapsed: not dispatching")]
pub struct Fenced(pub &'static str);

impl Fence {
    /// `service`'s fence over `guard`, counting its refusals in `refused`.
    pub fn new(service: &'static str, guard: Arc<LeaseGuard>, refused: Arc<AtomicU64>) -> Self {
        Fence {
            service,
            guard,
            refused,
        }
    }

    /// Whether an action may go out now; a refusal is counted.
    ///
    /// # Errors
    /// [`Fenced`] when the lease may have passed to another process.
    pub fn check(&self) -> Result<(), Fenced> {
        if self.guard.held() {
            return Ok(());
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        Err(Fenced(self.service))
    }

    /// The lease guard it reads.
    pub fn guard(&self) -> &Arc<LeaseGuard> {
        &self.guard
    }
}

/// What a service does as its cluster's leader, besides what every leader does: bind its
/// ports, and serve on what it bound.
pub trait LeaderService: Send {
    /// What binding gives (listeners and their addresses).
    type Bound: Send;
    /// The service's state in its [`Running`] handle.
    type Server: Send + Sync + 'static;

    /// Binds the service's ports, or says why not (tried again while the lease holds).
    fn bind(&self) -> impl Future<Output = Result<Self::Bound, String>> + Send;

    /// Serves on `bound` until the handle is stopped.
    fn serve(self, bound: Self::Bound) -> Running<Self::Server>;
}

/// A standby: follows its service's log, binding nothing, until it is elected.
pub struct Candidate<H: Host> {
    follower: Follower<H>,
    stop: CancellationToken,
    tasks: TaskTracker,
}

/// A standby elected: it holds the lease and the state the old leader published, and logs its
/// own changes; it does not serve yet ([`Elected::lead`]).
pub struct Elected<S> {
    /// The lease, the leader's log, and what the followed state is worth.
    pub leadership: Leadership<S>,
    fence: Fence,
    bucket: LeaseBucket,
    status: Arc<ClusterStatus>,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl<H: Host> Candidate<H> {
    /// Joins the cluster of `config` as a standby of `host`'s state: connects, restores the
    /// latest snapshot and follows the log, on `tasks` until `stop` (cancelled on an error
    /// here, so that nothing started is left running).
    ///
    /// # Errors
    /// When NATS cannot be reached or JetStream set up.
    pub async fn join(
        config: ClusterConfig,
        host: Arc<H>,
        stop: &CancellationToken,
        tasks: &TaskTracker,
    ) -> Result<Self, ClusterError> {
        let stop_on_error = stop.clone().drop_guard();
        let follower = Follower::join(config, host, false, stop, tasks).await?;
        stop_on_error.disarm();
        Ok(Candidate {
            follower,
            stop: stop.clone(),
            tasks: tasks.clone(),
        })
    }

    /// Where this process stands.
    pub fn status(&self) -> &Arc<ClusterStatus> {
        self.follower.status()
    }

    /// Waits for the lease, then takes over (the follower announces the epoch, reads the log
    /// back to it and starts the leader's log) and opens the fence. `None` once `cancel`: the
    /// service's tasks are stopped and drained.
    pub async fn elect(self, cancel: &CancellationToken) -> Option<Elected<H::State>> {
        let Some(leadership) = self.follower.take_over(cancel).await else {
            self.stop.cancel();
            drain(&self.tasks).await;
            return None;
        };
        let bucket = self.follower.bucket().clone();
        let status = Arc::clone(self.follower.status());
        let guard = Arc::new(LeaseGuard::new(&leadership.lease, bucket.ttl()));
        let fence = Fence::new(
            H::State::SERVICE,
            guard,
            Arc::clone(status.dispatches_fenced()),
        );
        status.set_fence(fence.clone());
        Some(Elected {
            leadership,
            fence,
            bucket,
            status,
            stop: self.stop,
            tasks: self.tasks,
        })
    }
}

impl<S: Replicated> Elected<S> {
    /// The fence every outbound action of this leader checks.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Where this process stands.
    pub fn status(&self) -> &Arc<ClusterStatus> {
        &self.status
    }

    /// The token that stops the service's tasks (the follower's, the log's, the server's).
    pub fn stop_token(&self) -> &CancellationToken {
        &self.stop
    }

    /// The tracker the service's tasks run on.
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// Gives up before serving (the service could not take the state over): the lease is
    /// released, the fence closed, the service's tasks stopped and drained.
    pub async fn abandon(self) {
        self.fence.guard.revoke();
        self.bucket.release(&self.leadership.lease).await;
        drop(self.leadership);
        self.stop.cancel();
        drain(&self.tasks).await;
    }

    /// Leads until `shutdown` (serving stops, the queued records are published, then the
    /// lease is released) or until the lease is lost (the fence closes, `shutdown` is
    /// cancelled so the process's other services stop too, and serving stops at once): see
    /// the module docs.
    ///
    /// # Errors
    /// The lease was lost: the process must stop; restarted, it is a standby.
    pub async fn lead<L: LeaderService>(
        self,
        service: L,
        shutdown: &CancellationToken,
    ) -> Result<(), String> {
        let Elected {
            leadership,
            fence,
            bucket,
            status,
            stop,
            tasks,
        } = self;
        let name = S::SERVICE;
        let guard = Arc::clone(&fence.guard);
        let release = CancellationToken::new();
        let renewed = Arc::clone(&guard);
        let hold = bucket.hold(leadership.lease.clone(), &release, move |l| {
            renewed.renewed(l);
        });
        tokio::pin!(hold);
        let bound = tokio::select! {
            bound = bind_retrying(name, &service) => bound,
            held = &mut hold => {
                // Lost while binding.
                guard.revoke();
                drop((service, leadership)); // its log: the publisher ends
                stop.cancel();
                drain(&tasks).await;
                return held;
            }
            () = shutdown.cancelled() => {
                drop((service, leadership));
                release.cancel();
                let held = hold.await;
                stop.cancel();
                drain(&tasks).await;
                return held;
            }
        };
        status.took_over(now_ms() as f64 / 1e3, leadership.elapsed_ms());
        drop(leadership);
        let server = service.serve(bound);
        let lost = tokio::select! {
            held = &mut hold => Some(held),
            () = shutdown.cancelled() => None,
        };
        match lost {
            Some(held) => {
                guard.revoke();
                tracing::error!("the {name} lease was lost: stopping at once");
                shutdown.cancel();
                server.stop().await;
                held
            }
            None => {
                tracing::info!("shutting down");
                // Serving stops and the queued records are published before the lease goes.
                let stopping = async {
                    server.stop().await;
                    release.cancel();
                };
                let ((), held) = tokio::join!(stopping, hold);
                held
            }
        }
    }
}

/// Binds `service`'s ports, trying again every [`BIND_RETRY`]; warns of the first failure
/// and then once every [`BIND_WARN_EVERY`] tries.
async fn bind_retrying<L: LeaderService>(name: &str, service: &L) -> L::Bound {
    let mut failed = 0u64;
    loop {
        match service.bind().await {
            Ok(bound) => {
                if failed > 0 {
                    tracing::info!("{name} leader bound after {failed} failed tries");
                }
                return bound;
            }
            Err(e) => {
                if warn_of_bind(failed) {
                    tracing::warn!(
                        "{name} leader cannot bind yet ({e}); retrying every {BIND_RETRY:?} \
                         ({failed} failed tries so far)"
                    );
                }
                failed += 1;
                tokio::time::sleep(BIND_RETRY).await;
            }
        }
    }
}

async fn drain(tasks: &TaskTracker) {
    tasks.close();
    let _ = tokio::time::timeout(crate::service::DRAIN_DEADLINE, tasks.wait()).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Lease;
    use std::time::Instant;

    #[test]
    fn a_bind_failure_is_warned_of_once_per_burst_of_tries() {
        let warned: Vec<u64> = (0..120).filter(|&n| warn_of_bind(n)).collect();
        assert_eq!(warned, [0, BIND_WARN_EVERY, 2 * BIND_WARN_EVERY]);
    }

    #[test]
    fn a_fence_refuses_and_counts_once_the_lease_may_have_lapsed() {
        let lease = Lease {
            key: "k".into(),
            holder: "me".into(),
            revision: 4,
            epoch: 4,
            renewed: Instant::now(),
        };
        let guard = Arc::new(LeaseGuard::new(&lease, Duration::from_secs(3600)));
        let refused = Arc::new(AtomicU64::new(0));
        let fence = Fence::new("svc", Arc::clone(&guard), Arc::clone(&refused));
        assert_eq!(fence.clone().check(), Ok(()));
        guard.revoke();
        let e = fence.check().unwrap_err();
        assert_eq!(
            e.to_string(),
            "the svc lease may have lapsed: not dispatching"
        );
        assert_eq!(refused.load(Ordering::Relaxed), 1);
        guard.renewed(&Lease {
            renewed: Instant::now(),
            ..lease
        });
        assert_eq!(fence.check(), Ok(()));
        assert_eq!(refused.load(Ordering::Relaxed), 1);
    }
}
