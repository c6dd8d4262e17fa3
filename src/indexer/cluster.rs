//! `--cluster` for the indexer (docs/CLUSTER.md), on the replication core (`crate::cluster`).
//! The ingester logs every change it applies to its index ([`Change`]) through the core's
//! change log, in apply order (under the index's lock); a read replica (`--replica`) follows
//! that log into its own index with the core's follower — restoring the latest snapshot first,
//! publishing snapshots while in sync — and answers `/query` and `/query_by_hash` with the lag
//! it reports on `/readyz`, `/indexer/cluster` and `/metrics`. [`IndexerState`] is the index's
//! `Host`: records are applied and snapshots dumped under its lock.
//!
//! Must not: hold the index's lock across an `.await`.

use super::IndexerState;
use crate::cluster::{
    lead_without_lease, ChangeLog, ClusterConfig, ClusterError, ClusterStatus, Follower, Host,
};
use crate::indexer::model::replica::{Change, Core};
use crate::web::exposition::Exposition;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What this indexer is in its cluster.
pub(crate) enum Role {
    /// No `--cluster`.
    Standalone,
    /// Ingests from publishers and logs its changes.
    Ingester {
        /// The log.
        log: Arc<ChangeLog<Core>>,
        /// Its place in the cluster.
        status: Arc<ClusterStatus>,
    },
    /// Follows an ingester's changes; takes no registrations.
    Replica {
        /// Its place in the cluster, once it follows ([`follow`]).
        status: OnceLock<Arc<ClusterStatus>>,
    },
}

/// The wall clock, Unix seconds: the `now` stamped on the ingester's records.
fn wall() -> f64 {
    crate::cluster::now_ms() as f64 / 1e3
}

impl Role {
    /// An ingester that joined its cluster (publishing on `tasks` until `stop`), a replica
    /// yet to follow, or standalone.
    ///
    /// # Errors
    /// When NATS cannot be reached or its stream set up (an ingester).
    pub(crate) async fn join(
        config: Option<&ClusterConfig>,
        replica: bool,
        stop: &CancellationToken,
        tasks: &TaskTracker,
    ) -> Result<Role, ClusterError> {
        match config {
            None => Ok(Role::Standalone),
            Some(_) if replica => Ok(Role::Replica {
                status: OnceLock::new(),
            }),
            Some(config) => {
                let (log, status) =
                    lead_without_lease::<Core>(config.clone(), wall(), stop, tasks).await?;
                Ok(Role::Ingester { log, status })
            }
        }
    }

    /// Whether this indexer follows another and takes no registrations.
    pub(crate) fn is_replica(&self) -> bool {
        matches!(self, Role::Replica { .. })
    }

    /// Whether changes must be recorded (cloning events costs only then).
    pub(crate) fn records(&self) -> bool {
        matches!(self, Role::Ingester { .. })
    }

    /// Records a change just applied. Call with the index's write lock held, so records are
    /// numbered in apply order. An `Apply` larger than NATS takes is cut into several.
    pub(crate) fn record(&self, change: Change) {
        if let Role::Ingester { log, .. } = self {
            log.record(wall(), &change);
        }
    }

    fn status(&self) -> Option<&Arc<ClusterStatus>> {
        match self {
            Role::Standalone => None,
            Role::Ingester { status, .. } => Some(status),
            Role::Replica { status } => status.get(),
        }
    }
}

/// A replica starts following its cluster's ingester into `state` (restoring the latest
/// snapshot first), on `tasks` until `stop`; nothing for another role.
///
/// # Errors
/// When NATS cannot be reached or JetStream set up.
pub(crate) async fn follow(
    state: &Arc<IndexerState>,
    stop: &CancellationToken,
    tasks: &TaskTracker,
) -> Result<(), ClusterError> {
    let (Role::Replica { status }, Some(config)) = (&state.role, &state.config.cluster) else {
        return Ok(());
    };
    let follower = Follower::join(config.clone(), Arc::clone(state), true, stop, tasks).await?;
    let _ = status.set(Arc::clone(follower.status()));
    Ok(())
}

/// The index, followed or ingested, lives under the indexer's one lock.
impl Host for IndexerState {
    type State = Core;

    fn write<R>(&self, f: impl FnOnce(&mut Core) -> R) -> Option<R> {
        Some(f(&mut self.core.write()))
    }

    fn read<R>(&self, f: impl FnOnce(&Core) -> R) -> Option<R> {
        Some(f(&self.core.read()))
    }

    fn applying(&self, change: &Change) {
        if let Change::Apply { events, .. } = change {
            self.metrics
                .events_applied
                .fetch_add(events.len() as u64, Ordering::Relaxed);
        }
    }
}

/// `GET /readyz`: whether this indexer answers queries from a complete index, and its lag.
pub(crate) fn readyz(state: &IndexerState) -> (bool, Value) {
    match &state.role {
        Role::Standalone => (true, json!({"ready": true, "role": "standalone"})),
        Role::Ingester { log, status } => {
            let j = status.json();
            let p = &j["published"];
            let n = |k: &str| p[k].as_u64().unwrap_or(0);
            (
                true,
                json!({
                    "ready": true,
                    "role": "ingester",
                    "cluster": status.name,
                    "connected": j["connected"],
                    "epoch": log.epoch(),
                    "ops": log.last_seq(),
                    "ops_unpublished": n("failed") + n("dropped") + n("oversize"),
                }),
            )
        }
        Role::Replica { status } => {
            let Some(status) = status.get() else {
                return (false, json!({"ready": false, "role": "replica"}));
            };
            let p = status.progress();
            let j = status.json();
            (
                p.ready,
                json!({
                    "ready": p.ready,
                    "role": "replica",
                    "cluster": status.name,
                    "reason": p.reason,
                    "epoch": j["followed"]["epoch"],
                    "applied_seq": j["followed"]["seq"],
                    "pending": p.pending,
                    "lag_ms": p.lag_ms,
                    "in_sync": j["followed"]["in_sync"],
                    "restored_snapshot_at": j["followed"]["restored_snapshot_at"],
                }),
            )
        }
    }
}

/// `GET /indexer/cluster`: the replication core's status document, as the controller's and
/// the coordinator's (`{"role": "standalone"}` without `--cluster`).
pub(crate) fn status_json(state: &IndexerState) -> Value {
    state
        .role
        .status()
        .map_or_else(|| json!({"role": "standalone"}), |s| s.json())
}

/// The cluster's metrics, `kvplane_cluster_*{service="indexer"}`.
pub(crate) fn render(state: &IndexerState, out: &mut Exposition) {
    if let Some(s) = state.role.status() {
        s.write_metrics(out);
    }
}
