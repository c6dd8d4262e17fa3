//! `--cluster` for the controller: hot standby and read replicas (docs/CLUSTER.md), on the
//! replication core (`crate::cluster`).
//!
//! Every `kvplane serve --cluster` process starts as a standby: the core's [`Follower`] reads
//! the cluster's `controller` log and applies each record to the controller's own fleet, under
//! its state lock ([`Driver`] is the fleet's `Host`), binding no port. One of them holds the
//! `controller` lease; it logs every change it applies (under the same lock, so in apply
//! order) through the core's `ChangeLog`. When the lease lapses, a standby takes it over
//! ([`Standby::take_over`]): the core announces the new epoch and reads the log up to it; then
//! this file opens the downlinks the fleet records (asking every worker for a full sync if
//! what it followed had a gap), and the caller binds the controller's sockets. The leader
//! renews the lease ([`Standby::hold`]) and stops the moment it is lost.

use super::driver::Driver;
use crate::cluster::{ClusterConfig, ClusterError, Follower, Lease};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// A controller following the cluster's log, ready to take over (unless a read replica).
pub struct Standby {
    follower: Follower<Driver>,
}

impl Standby {
    /// Joins the cluster as a standby (or a read `replica`) of `shared`, which must not serve
    /// yet: connects, restores the latest snapshot, and follows the log into `shared`.
    ///
    /// # Errors
    /// When NATS cannot be reached or JetStream set up.
    pub async fn join(
        config: ClusterConfig,
        shared: &Arc<Driver>,
        replica: bool,
    ) -> Result<Self, ClusterError> {
        let follower = Follower::join(
            config,
            Arc::clone(shared),
            replica,
            shared.shutdown_token(),
            shared.tasks(),
        )
        .await?;
        shared.set_cluster(Arc::clone(follower.status()));
        Ok(Standby { follower })
    }

    /// Waits for the lease, then takes over: returns once `shared` holds everything the old
    /// leader published, logs its own changes and has opened its downlinks, ready to bind.
    /// `None` once `cancel`.
    pub async fn take_over(
        &self,
        shared: &Arc<Driver>,
        cancel: &CancellationToken,
    ) -> Option<Lease> {
        let lead = self.follower.take_over(cancel).await?;
        shared.lead(Arc::clone(&lead.log), lead.in_sync);
        let status = self.follower.status();
        status.took_over(shared.now(), lead.elapsed_ms());
        tracing::info!(
            epoch = lead.lease.epoch,
            in_sync = lead.in_sync,
            workers = shared.index().worker_count(),
            keys = shared.index().key_count(),
            "controller took the lease: serving the followed state"
        );
        Some(lead.lease)
    }

    /// Renews `lease` until `shutdown` (then releases it) or until it is lost.
    ///
    /// # Errors
    /// The lease was lost: the caller must stop serving at once.
    pub async fn hold(&self, lease: Lease, shutdown: &CancellationToken) -> Result<(), String> {
        self.follower.hold(lease, shutdown, |_| {}).await
    }
}
