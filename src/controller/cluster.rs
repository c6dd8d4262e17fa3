//! `--cluster` for the controller: hot standby and read replicas (docs/CLUSTER.md), on the
//! replication core (`crate::cluster`) and its one leader loop (`crate::cluster::Candidate`).
//!
//! Every `kvplane serve --cluster` process starts as a standby: the core's follower reads the
//! cluster's `controller` log and applies each record to the controller's own fleet, under
//! its state lock ([`Driver`] is the fleet's `Host`), binding no port. One of them holds the
//! `controller` lease; it logs every change it applies (under the same lock, so in apply
//! order) through the core's `ChangeLog`. When the lease lapses, a standby takes it over
//! ([`take_over`]): the core announces the new epoch and reads the log up to it; then this
//! file opens the downlinks the fleet records (asking every worker for a full sync if what it
//! followed had a gap), and the leader loop binds the controller's sockets ([`Binds`]),
//! renews the lease and stops the moment it is lost. Every command to a worker passes the
//! lease's fence first (`Downlink::request`): a leader paused past its TTL sends none.

use super::driver::Driver;
use super::model::ControllerState;
use super::serve::{serve_shared, Controller};
use crate::cluster::{Candidate, ClusterConfig, ClusterError, Elected, Follower, LeaderService};
use crate::service::Running;
use std::future::Future;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Joins the cluster as a read replica of `shared`, which must not serve yet: connects,
/// restores the latest snapshot, and follows the log into `shared`; never takes the lease.
///
/// # Errors
/// When NATS cannot be reached or JetStream set up.
pub async fn replica(
    config: ClusterConfig,
    shared: &Arc<Driver>,
) -> Result<Follower<Driver>, ClusterError> {
    let follower = Follower::join(
        config,
        Arc::clone(shared),
        true,
        shared.shutdown_token(),
        shared.tasks(),
    )
    .await?;
    shared.set_cluster(Arc::clone(follower.status()));
    Ok(follower)
}

/// Joins the cluster as a standby of `shared`, which must not serve yet.
///
/// # Errors
/// When NATS cannot be reached or JetStream set up.
pub async fn standby(
    config: ClusterConfig,
    shared: &Arc<Driver>,
) -> Result<Candidate<Driver>, ClusterError> {
    let candidate = Candidate::join(
        config,
        Arc::clone(shared),
        shared.shutdown_token(),
        shared.tasks(),
    )
    .await?;
    shared.set_cluster(Arc::clone(candidate.status()));
    Ok(candidate)
}

/// Waits for the lease, then takes over: returns once `shared` holds everything the old
/// leader published, logs its own changes and has opened its downlinks (behind the fence),
/// ready to bind. `None` once `cancel` (the controller's tasks stopped).
pub async fn take_over(
    candidate: Candidate<Driver>,
    shared: &Arc<Driver>,
    cancel: &CancellationToken,
) -> Option<Elected<ControllerState>> {
    let elected = candidate.elect(cancel).await?;
    let lead = &elected.leadership;
    shared.lead(Arc::clone(&lead.log), lead.in_sync);
    tracing::info!(
        epoch = lead.lease.epoch,
        in_sync = lead.in_sync,
        workers = shared.index().worker_count(),
        keys = shared.index().key_count(),
        "controller took the lease: serving the followed state"
    );
    Some(elected)
}

/// The controller's part in the leader loop: bind every socket and serve the state it
/// followed ([`serve_shared`], which binds before it starts anything).
pub struct Binds(pub Arc<Driver>);

impl LeaderService for Binds {
    type Bound = Running<Controller>;
    type Server = Controller;

    fn bind(&self) -> impl Future<Output = Result<Running<Controller>, String>> + Send {
        let shared = Arc::clone(&self.0);
        async move { serve_shared(shared).await.map_err(|e| e.to_string()) }
    }

    fn serve(self, bound: Running<Controller>) -> Running<Controller> {
        bound
    }
}
