//! Where one process stands in its service's cluster — the same for every service: its role,
//! the lease, its place in the log it follows, what it published, its last takeover — as one
//! JSON document (`/controller/cluster`, `/coordinator/cluster`, `/indexer/cluster`) and one
//! set of metrics, `kvplane_cluster_*{service="…"}`.
//!
//! Must not: know a service's state; take any lock but its own small ones.

use super::leadership::Fence;
use super::log::LogCursor;
use super::{Cluster, PublishStats, ReaderStatus};
use crate::web::exposition::{
    Exposition, Kind,
    Kind::{Counter, Gauge},
};
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Counters of the leader's log.
#[derive(Debug, Default)]
pub struct LogStats {
    /// Records handed to the publisher.
    pub queued: AtomicU64,
    /// Bytes of the records queued and not yet taken by the publisher.
    pub queued_bytes: AtomicU64,
    /// Records dropped at a full queue.
    pub dropped: AtomicU64,
    /// Changes larger than NATS takes that could not be cut.
    pub oversize: AtomicU64,
}

/// A follower's readiness: whether it answers from the leader's current state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Reading, in sync (or nothing to follow yet) and nothing pending.
    pub ready: bool,
    /// Why (or why not).
    pub reason: &'static str,
    /// Records in the stream or delivered, not yet applied.
    pub pending: u64,
    /// Age of the last applied record while others are pending (0 when caught up).
    pub lag_ms: u64,
}

/// One process's place in its service's cluster. Shared by the follower, the leader's log and
/// the service's routes.
#[derive(Debug)]
pub struct ClusterStatus {
    service: &'static str,
    /// This process's name (`host:pid:random`): the holder written in the lease.
    pub me: String,
    /// The cluster's name.
    pub name: String,
    cluster: Cluster,
    replica: bool,
    leader: AtomicBool,
    epoch: AtomicU64,
    lease_holder: Mutex<Option<String>>,
    /// The follower's place in the log: locked under the service's state lock when a record
    /// is applied, so that a snapshot's position matches its state.
    pub(super) cursor: Mutex<LogCursor>,
    pub(super) reader: Arc<ReaderStatus>,
    pub(super) published: Arc<PublishStats>,
    pub(super) log: Arc<LogStats>,
    pub(super) applied: AtomicU64,
    /// Log messages handled (applied, ignored or undecodable): a takeover's sign of progress.
    pub(super) processed: AtomicU64,
    pub(super) bad_records: AtomicU64,
    pub(super) snapshots: AtomicU64,
    /// Snapshots that could not be published (too large, NATS did not take them).
    pub(super) snapshots_failed: AtomicU64,
    /// The stream sequence of the snapshot restored at start (0: none).
    pub(super) restored_at: AtomicU64,
    dispatches_fenced: Arc<AtomicU64>,
    /// The leader's fence, from its takeover on.
    fence: std::sync::OnceLock<Fence>,
    resynced: AtomicBool,
    /// Unix seconds of the last takeover, and how long it took until serving (ms).
    failover: Mutex<Option<(f64, u64)>>,
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "host".into())
}

impl ClusterStatus {
    /// A process of `service` in `cluster`'s cluster, following (a read `replica` never leads).
    pub fn new(service: &'static str, cluster: &Cluster, replica: bool) -> Self {
        ClusterStatus {
            service,
            me: format!(
                "{}:{}:{:08x}",
                host_name(),
                std::process::id(),
                rand::random::<u32>()
            ),
            name: cluster.config().name.clone(),
            cluster: cluster.clone(),
            replica,
            leader: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            lease_holder: Mutex::new(None),
            cursor: Mutex::new(LogCursor::default()),
            reader: Arc::default(),
            published: Arc::default(),
            log: Arc::default(),
            applied: AtomicU64::new(0),
            processed: AtomicU64::new(0),
            bad_records: AtomicU64::new(0),
            snapshots: AtomicU64::new(0),
            snapshots_failed: AtomicU64::new(0),
            restored_at: AtomicU64::new(0),
            dispatches_fenced: Arc::default(),
            fence: std::sync::OnceLock::new(),
            resynced: AtomicBool::new(false),
            failover: Mutex::new(None),
        }
    }

    /// The service (`controller`, `coordinator`, `indexer`).
    pub fn service(&self) -> &'static str {
        self.service
    }

    /// Whether this process leads (holds the lease and publishes).
    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::Relaxed)
    }

    /// Whether this process is a read replica (follows, never leads).
    pub fn is_replica(&self) -> bool {
        self.replica
    }

    /// Whether the followed state holds every change since a fresh start.
    pub fn in_sync(&self) -> bool {
        self.cursor.lock().in_sync()
    }

    /// The epoch this process leads under (0: not leading).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    /// This process leads from now on, under `epoch`.
    pub(super) fn lead(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::Relaxed);
        self.leader.store(true, Ordering::Relaxed);
    }

    /// Who holds the lease, as last seen.
    pub(super) fn set_lease_holder(&self, holder: Option<String>) {
        *self.lease_holder.lock() = holder;
    }

    /// The counter of actions refused because the lease may have lapsed (the [`Fence`]'s
    /// refusals).
    pub fn dispatches_fenced(&self) -> &Arc<AtomicU64> {
        &self.dispatches_fenced
    }

    /// The fence in front of this leader's outbound actions (`None` until it takes over, and
    /// on a replica): check it before anything another leader must not also send.
    pub fn fence(&self) -> Option<&Fence> {
        self.fence.get()
    }

    /// This process took over behind `fence` (the first one set stays).
    pub(super) fn set_fence(&self, fence: Fence) {
        let _ = self.fence.set(fence);
    }

    /// The takeover asked for the state to be relearned (it was not known to be complete).
    pub fn resynced(&self) {
        self.resynced.store(true, Ordering::Relaxed);
    }

    /// The takeover is done: serving since now (Unix seconds `at`), `ms` after the lease was
    /// taken.
    pub fn took_over(&self, at: f64, ms: u64) {
        *self.failover.lock() = Some((at, ms));
    }

    /// Where the follower stands (see [`Progress`]).
    pub fn progress(&self) -> Progress {
        let (in_sync, started, at_ms) = {
            let c = self.cursor.lock();
            (c.in_sync(), c.epoch_seq().0.is_some(), c.last_at_ms())
        };
        let (pending, lag_ms) = self
            .reader
            .lag(self.processed.load(Ordering::Relaxed), at_ms);
        let reading = self.reader.reading.load(Ordering::Relaxed) && self.cluster.connected();
        let (ready, reason) = if !reading {
            (false, "not reading the change stream (NATS unreachable?)")
        } else if pending > 0 {
            (false, "catching up")
        } else if started && !in_sync {
            (false, "not in sync (a gap, or the stream lost its start)")
        } else {
            (true, "caught up")
        };
        Progress {
            ready,
            reason,
            pending,
            lag_ms,
        }
    }

    fn role(&self) -> &'static str {
        if self.is_leader() {
            "leader"
        } else if self.replica {
            "replica"
        } else {
            "standby"
        }
    }

    /// Records handed to the publisher and not yet acknowledged or failed.
    fn unacknowledged(&self) -> u64 {
        let done = self.published.acked.load(Ordering::Relaxed)
            + self.published.failed.load(Ordering::Relaxed);
        self.log.queued.load(Ordering::Relaxed).saturating_sub(done)
    }

    /// Records not replicated: publish failed, queue full, or too large.
    fn lost(&self) -> u64 {
        self.published.failed.load(Ordering::Relaxed)
            + self.log.dropped.load(Ordering::Relaxed)
            + self.log.oversize.load(Ordering::Relaxed)
    }

    /// The JSON of `/<service>/cluster`.
    pub fn json(&self) -> Value {
        let (in_sync, (epoch, seq), gaps, fenced) = {
            let c = self.cursor.lock();
            (c.in_sync(), c.epoch_seq(), c.gaps(), c.fenced())
        };
        let n = |v: &AtomicU64| v.load(Ordering::Relaxed);
        let following = (!self.is_leader()).then(|| {
            let p = self.progress();
            json!({"ready": p.ready, "reason": p.reason, "pending": p.pending, "lag_ms": p.lag_ms})
        });
        let failover = *self.failover.lock();
        json!({
            "service": self.service,
            "cluster": self.name,
            "role": self.role(),
            "connected": self.cluster.connected(),
            "following": following,
            "me": self.me,
            "lease_holder": *self.lease_holder.lock(),
            "epoch": self.epoch(),
            "followed": {
                "epoch": epoch,
                "seq": seq,
                "in_sync": in_sync,
                "gaps": gaps,
                "fenced": fenced,
                "applied": n(&self.applied),
                "bad_records": n(&self.bad_records),
                "snapshots_published": n(&self.snapshots),
                "snapshots_failed": n(&self.snapshots_failed),
                "restored_snapshot_at": n(&self.restored_at),
            },
            "published": {
                "queued": n(&self.log.queued),
                "acked": n(&self.published.acked),
                "failed": n(&self.published.failed),
                "dropped": n(&self.log.dropped),
                "oversize": n(&self.log.oversize),
                "pending": self.unacknowledged(),
            },
            "resynced_at_takeover": self.resynced.load(Ordering::Relaxed),
            "dispatches_fenced": n(&self.dispatches_fenced),
            "last_failover": failover.map(|(at, ms)| json!({"at": at, "takeover_ms": ms})),
        })
    }

    /// The cluster's series, `kvplane_cluster_*{service="…"}`, written into a `/metrics`
    /// document.
    pub fn write_metrics(&self, out: &mut Exposition) {
        let (in_sync, gaps, fenced) = {
            let c = self.cursor.lock();
            (c.in_sync(), c.gaps(), c.fenced())
        };
        let p = self.progress();
        let failover = *self.failover.lock();
        let n = |v: &AtomicU64| v.load(Ordering::Relaxed) as f64;
        let flag = |b: bool| f64::from(u8::from(b));
        #[rustfmt::skip]
        let series: [(&str, Kind, &str, f64); 20] = [
            ("leader", Gauge, "1 while this process leads (holds the lease and publishes).", flag(self.is_leader())),
            ("replica", Gauge, "1 on a read replica (follows, never leads).", flag(self.replica)),
            ("connected", Gauge, "1 while the connection to NATS is up.", flag(self.cluster.connected())),
            ("epoch", Gauge, "The epoch (lease revision) this process leads under (0: not leading).", self.epoch() as f64),
            ("in_sync", Gauge, "1 if the followed state holds every change since a fresh start.", flag(in_sync)),
            ("pending_records", Gauge, "Records in the stream or delivered, not yet applied (a follower).", p.pending as f64),
            ("lag_ms", Gauge, "Age of the last applied record while others are pending (a follower).", p.lag_ms as f64),
            ("gaps_total", Counter, "Gaps seen in the change log while following it.", gaps as f64),
            ("fenced_total", Counter, "Records of a deposed leader ignored while following.", fenced as f64),
            ("records_applied_total", Counter, "Change records applied while following.", n(&self.applied)),
            ("bad_records_total", Counter, "Log messages that were not records (dropped).", n(&self.bad_records)),
            ("snapshots_published_total", Counter, "Snapshots of the followed state this follower published.", n(&self.snapshots)),
            ("snapshots_failed_total", Counter, "Snapshots not published: larger than the stream keeps, or NATS did not take them.", n(&self.snapshots_failed)),
            ("records_published_total", Counter, "Change records NATS acknowledged.", n(&self.published.acked)),
            ("records_lost_total", Counter, "Change records not replicated: publish failed, queue full, or too large.", self.lost() as f64),
            ("records_unacknowledged", Gauge, "Change records queued or sent but not yet acknowledged by NATS.", self.unacknowledged() as f64),
            ("dispatches_fenced_total", Counter, "Actions refused because the lease may have lapsed.", n(&self.dispatches_fenced)),
            ("resynced_at_takeover", Gauge, "1 if the takeover asked for the state to be relearned.", flag(self.resynced.load(Ordering::Relaxed))),
            ("last_failover_seconds", Gauge, "Unix time this process last took over (0: never).", failover.map_or(0.0, |(at, _)| at)),
            ("takeover_seconds", Gauge, "Lease taken to serving, at the last takeover.", failover.map_or(0.0, |(_, ms)| ms as f64 / 1e3)),
        ];
        for (name, kind, help, value) in series {
            out.family(format_args!("kvplane_cluster_{name}"), kind, help)
                .sample(&[("service", self.service)], value);
        }
    }
}
