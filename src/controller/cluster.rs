//! `--cluster` for the controller: hot standby (docs/CLUSTER.md).
//!
//! Every `kvplane serve --cluster` process starts as a standby: it reads the cluster's
//! `controller` stream from the start and applies each [`Record`] to its own fleet through a
//! [`Follower`], binding no port. One of them holds the `controller` lease; it publishes every
//! change it applies (recorded under the fleet's write lock, so in apply order) through the
//! [`ChangeLog`]. When the lease lapses, a standby takes it ([`take_over`]): it publishes a
//! [`Change::Takeover`] stamped with the lease's revision, reads the stream up to that record
//! (so it holds everything the old leader published), opens the downlinks its fleet records,
//! and then binds the controller's sockets. The leader renews the lease ([`hold`]) and stops
//! the moment it is lost.

use super::changes::{Applied, Change, Follower, Record, Snapshot};
use super::driver::Shared;
use crate::cluster::{
    self, now_ms, Cluster, ClusterError, Lease, LeaseBucket, PublishStats, ReadBack, ReaderStatus,
    SnapshotSchedule, RECORD_OVERHEAD,
};
use bytes::Bytes;
use parking_lot::Mutex;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The service's name in the cluster's stream and subject names.
pub const SERVICE: &str = "controller";
/// The key of the controller's lease.
pub const LEASE_KEY: &str = "controller";
/// Records queued for publishing at most; beyond, one is dropped (counted) and standbys see
/// the gap.
const RECORD_QUEUE: usize = 65_536;
/// Records read but not yet applied by a standby at most.
const APPLY_QUEUE: usize = 1024;

/// The leader's side of the log: numbers and queues every change it applies.
#[derive(Debug)]
pub struct ChangeLog {
    epoch: u64,
    /// The last record's number; only changed under the fleet's write lock.
    seq: AtomicU64,
    max_record_bytes: usize,
    tx: mpsc::Sender<Bytes>,
    status: Arc<ClusterStatus>,
}

impl ChangeLog {
    /// Logs `change`, applied at `now`. Call it under the fleet's write lock, right after
    /// applying the change, so records are numbered in apply order. Never blocks: a full
    /// queue or a record larger than NATS takes drops it (counted; standbys see the gap).
    pub(crate) fn record(&self, now: f64, change: Change) {
        match change {
            Change::Pull { frames } if total(&frames) > self.max_record_bytes => {
                // Several records, each under the server's limit, in order.
                let mut part = Vec::new();
                let mut bytes = 0;
                for f in frames {
                    if !part.is_empty() && bytes + f.len() > self.max_record_bytes {
                        self.push(
                            now,
                            Change::Pull {
                                frames: std::mem::take(&mut part),
                            },
                        );
                        bytes = 0;
                    }
                    bytes += f.len() + 8;
                    part.push(f);
                }
                self.push(now, Change::Pull { frames: part });
            }
            change => self.push(now, change),
        }
    }

    fn push(&self, now: f64, change: Change) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let record = Record {
            epoch: self.epoch,
            seq,
            at_ms: now_ms(),
            now,
            change,
        };
        let bytes = record.encode();
        if bytes.len() > self.max_record_bytes + RECORD_OVERHEAD {
            self.status.oversize.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                bytes = bytes.len(),
                "a change is larger than NATS takes: not replicated (standbys see a gap)"
            );
            return;
        }
        if self.tx.try_send(Bytes::from(bytes)).is_err() {
            self.status.dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            self.status.queued.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn total(frames: &[serde_bytes::ByteBuf]) -> usize {
    frames.iter().map(|f| f.len() + 8).sum()
}

/// Where this controller stands in its cluster, for `/metrics`, `/controller/cluster` and
/// the dashboard.
#[derive(Debug)]
pub struct ClusterStatus {
    /// This process's name in the lease (`host:pid:random`).
    pub me: String,
    /// The cluster's name.
    pub name: String,
    leader: AtomicBool,
    /// A read replica: follows the log, never takes the lease.
    replica: bool,
    epoch: AtomicU64,
    lease_holder: Mutex<Option<String>>,
    follower: Mutex<Follower>,
    reader: Arc<ReaderStatus>,
    published: Arc<PublishStats>,
    applied: AtomicU64,
    processed: AtomicU64,
    bad_records: AtomicU64,
    /// Snapshots this follower published.
    snapshots: AtomicU64,
    /// Records handed to the publisher.
    queued: AtomicU64,
    dropped: AtomicU64,
    oversize: AtomicU64,
    /// Unix seconds of the last takeover, and how long it took from lease to serving (ms).
    failover: Mutex<Option<(f64, u64)>>,
}

impl ClusterStatus {
    fn new(name: &str, replica: bool) -> Self {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "host".into());
        Self {
            me: format!(
                "{host}:{}:{:08x}",
                std::process::id(),
                rand::random::<u32>()
            ),
            name: name.to_owned(),
            leader: AtomicBool::new(false),
            replica,
            epoch: AtomicU64::new(0),
            lease_holder: Mutex::new(None),
            follower: Mutex::new(Follower::new()),
            reader: Arc::default(),
            published: Arc::default(),
            applied: AtomicU64::new(0),
            processed: AtomicU64::new(0),
            bad_records: AtomicU64::new(0),
            snapshots: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            oversize: AtomicU64::new(0),
            failover: Mutex::new(None),
        }
    }

    /// Whether this controller holds the lease and serves.
    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::Relaxed)
    }

    /// Whether the followed state holds every change since a fresh start.
    pub fn in_sync(&self) -> bool {
        self.follower.lock().cursor().in_sync()
    }

    /// Whether this controller is a read replica.
    pub fn is_replica(&self) -> bool {
        self.replica
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

    /// Where a follower stands: `(ready, reason, pending records, lag in ms)`. Ready when
    /// reading, in sync, and every record in the stream applied.
    pub fn progress(&self) -> (bool, &'static str, u64, u64) {
        let (in_sync, at_ms) = {
            let f = self.follower.lock();
            (f.cursor().in_sync(), f.cursor().last_at_ms())
        };
        let (pending, lag_ms) = self
            .reader
            .lag(self.processed.load(Ordering::Relaxed), at_ms);
        let reading = self.reader.reading.load(Ordering::Relaxed);
        let (ready, reason) = if !reading {
            (false, "not reading the change stream")
        } else if !in_sync {
            (false, "not in sync (a gap, or the stream lost its start)")
        } else if pending > 0 {
            (false, "catching up")
        } else {
            (true, "caught up")
        };
        (ready, reason, pending, lag_ms)
    }

    /// Applies `r`, read at `stream_seq`, to `fleet` (the caller holds the fleet's write lock).
    pub(crate) fn apply(&self, fleet: &mut super::Fleet, r: &Record, stream_seq: u64) -> Applied {
        let mut f = self.follower.lock();
        f.note_stream_seq(stream_seq);
        f.apply(fleet, r)
    }

    /// The follower's position (the caller holds the fleet's lock, so it matches the fleet).
    pub(crate) fn position(&self) -> super::changes::Position {
        self.follower.lock().cursor().position()
    }

    /// The JSON of `/controller/cluster`.
    pub fn json(&self) -> serde_json::Value {
        let (in_sync, (epoch, seq), gaps, fenced) = {
            let f = self.follower.lock();
            let c = f.cursor();
            (c.in_sync(), c.epoch_seq(), c.gaps(), c.fenced())
        };
        let failover = *self.failover.lock();
        let (ready, reason, pending, lag_ms) = self.progress();
        let following = (!self.is_leader()).then(|| {
            serde_json::json!({"ready": ready, "reason": reason, "pending": pending, "lag_ms": lag_ms})
        });
        serde_json::json!({
            "cluster": self.name,
            "role": self.role(),
            "following": following,
            "me": self.me,
            "lease_holder": *self.lease_holder.lock(),
            "epoch": self.epoch.load(Ordering::Relaxed),
            "followed": {
                "epoch": epoch,
                "seq": seq,
                "in_sync": in_sync,
                "gaps": gaps,
                "fenced": fenced,
                "applied": self.applied.load(Ordering::Relaxed),
                "bad_records": self.bad_records.load(Ordering::Relaxed),
                "snapshots_published": self.snapshots.load(Ordering::Relaxed),
            },
            "published": {
                "queued": self.queued.load(Ordering::Relaxed),
                "acked": self.published.acked.load(Ordering::Relaxed),
                "failed": self.published.failed.load(Ordering::Relaxed),
                "dropped": self.dropped.load(Ordering::Relaxed),
                "oversize": self.oversize.load(Ordering::Relaxed),
            },
            "last_failover": failover.map(|(at, ms)| serde_json::json!({
                "at": at, "takeover_ms": ms,
            })),
        })
    }

    /// Prometheus text of the cluster's gauges and counters.
    pub fn metrics_text(&self) -> String {
        let (in_sync, gaps, fenced) = {
            let f = self.follower.lock();
            (f.cursor().in_sync(), f.cursor().gaps(), f.cursor().fenced())
        };
        let mut t = String::new();
        let mut line = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(
                t,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        };
        let n = |v: &AtomicU64| v.load(Ordering::Relaxed).to_string();
        let flag = |b: bool| u8::from(b).to_string();
        line(
            "kvplane_cluster_leader",
            "gauge",
            "1 while this controller holds the lease and serves; 0 as a standby.",
            flag(self.is_leader()),
        );
        line(
            "kvplane_cluster_epoch",
            "gauge",
            "The lease revision this controller leads under (0: not leading).",
            n(&self.epoch),
        );
        let (_, _, pending, lag_ms) = self.progress();
        line(
            "kvplane_cluster_replica",
            "gauge",
            "1 on a read replica (--replica).",
            flag(self.replica),
        );
        line(
            "kvplane_cluster_pending_records",
            "gauge",
            "Records in the stream or delivered, not yet applied (a follower).",
            pending.to_string(),
        );
        line(
            "kvplane_cluster_lag_ms",
            "gauge",
            "Age of the last applied record while others are pending (a follower).",
            lag_ms.to_string(),
        );
        line(
            "kvplane_cluster_in_sync",
            "gauge",
            "1 if the followed state holds every change since a fresh start.",
            flag(in_sync),
        );
        line(
            "kvplane_cluster_gaps_total",
            "counter",
            "Gaps seen in the change log while following it.",
            gaps.to_string(),
        );
        line(
            "kvplane_cluster_fenced_total",
            "counter",
            "Records of a deposed leader ignored.",
            fenced.to_string(),
        );
        line(
            "kvplane_cluster_records_applied_total",
            "counter",
            "Change records applied while following.",
            n(&self.applied),
        );
        line(
            "kvplane_cluster_records_published_total",
            "counter",
            "Change records NATS acknowledged.",
            n(&self.published.acked),
        );
        line(
            "kvplane_cluster_records_lost_total",
            "counter",
            "Change records not replicated: publish failed, queue full, or too large.",
            (self.published.failed.load(Ordering::Relaxed)
                + self.dropped.load(Ordering::Relaxed)
                + self.oversize.load(Ordering::Relaxed))
            .to_string(),
        );
        let failover = *self.failover.lock();
        line(
            "kvplane_cluster_last_failover_seconds",
            "gauge",
            "Unix time this controller last took over (0: never).",
            failover.map_or(0.0, |(at, _)| at).to_string(),
        );
        line(
            "kvplane_cluster_takeover_seconds",
            "gauge",
            "Lease taken to sockets bound, at the last takeover.",
            failover.map_or(0.0, |(_, ms)| ms as f64 / 1e3).to_string(),
        );
        t
    }
}

/// Restores the latest snapshot into `shared` if there is a usable one; returns the stream
/// sequence to read the log from.
async fn restore_snapshot(cluster: &Cluster, shared: &Shared, status: &ClusterStatus) -> u64 {
    let data = match cluster.load_snapshot(SERVICE).await {
        Ok(Some(d)) => d,
        Ok(None) => return 1,
        Err(e) => {
            tracing::warn!("cluster: no snapshot read ({e}); following the log from its start");
            return 1;
        }
    };
    let snapshot = match Snapshot::decode(&data) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cluster: the snapshot did not decode ({e}); not used");
            return 1;
        }
    };
    match shared.restore(&snapshot.fleet) {
        Ok(()) => {
            let p = snapshot.position;
            *status.follower.lock() = Follower::at(p);
            tracing::info!(
                epoch = ?p.epoch,
                seq = p.seq,
                in_sync = p.in_sync,
                memberships = snapshot.fleet.memberships(),
                bytes = data.len(),
                "cluster: restored a snapshot; following the log from stream sequence {}",
                p.stream_seq + 1
            );
            p.stream_seq + 1
        }
        Err(e) => {
            tracing::warn!("cluster: the snapshot does not fit this controller's limits ({e})");
            1
        }
    }
}

/// Applies what the reader delivers, and every `snapshot_records` records (at most every
/// [`cluster::MIN_SNAPSHOT_INTERVAL`]) publishes a snapshot of the followed fleet.
async fn apply_loop(
    cluster: Cluster,
    shared: Arc<Shared>,
    st: Arc<ClusterStatus>,
    mut rx: mpsc::Receiver<(u64, Bytes)>,
) {
    let mut schedule = SnapshotSchedule::new(cluster.config().snapshot_records);
    while let Some((stream_seq, bytes)) = rx.recv().await {
        match Record::decode(&bytes) {
            Ok(r) => {
                if shared.apply_record(&r, stream_seq).is_some() {
                    st.applied.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => {
                st.bad_records.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("cluster: a change record did not decode: {e}");
            }
        }
        st.processed.fetch_add(1, Ordering::Relaxed);
        if schedule.handled(st.in_sync(), st.is_leader()) {
            let s = Arc::clone(&shared);
            // The dump holds the fleet's read lock (this loop waits for it, readers go on).
            let Ok(Some(data)) = tokio::task::spawn_blocking(move || s.snapshot()).await else {
                continue;
            };
            let cluster = cluster.clone();
            let st = Arc::clone(&st);
            shared.tasks().spawn(async move {
                match cluster.publish_snapshot(SERVICE, &data).await {
                    Ok(()) => {
                        st.snapshots.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => tracing::warn!("cluster: snapshot not published: {e}"),
                }
            });
        }
    }
}

/// A controller following the cluster's log, ready to take over.
pub struct Standby {
    cluster: Cluster,
    bucket: LeaseBucket,
    status: Arc<ClusterStatus>,
    reading: CancellationToken,
}

impl Standby {
    /// Joins the cluster as a standby of `shared` (which must not serve yet): connects, sets
    /// up the stream and the lease bucket, and starts following the log into `shared`.
    ///
    /// # Errors
    /// When NATS cannot be reached or JetStream set up.
    pub async fn join(
        config: cluster::ClusterConfig,
        shared: &Arc<Shared>,
        replica: bool,
    ) -> Result<Self, ClusterError> {
        let cluster = Cluster::connect(config).await?;
        cluster.ensure_stream(SERVICE).await?;
        let bucket = cluster.lease_bucket().await?;
        let status = Arc::new(ClusterStatus::new(&cluster.config().name, replica));
        shared.set_cluster(Arc::clone(&status));
        let from = restore_snapshot(&cluster, shared, &status).await;
        let reading = shared.shutdown_token().child_token();
        let (tx, rx) = mpsc::channel::<(u64, Bytes)>(APPLY_QUEUE);
        cluster::spawn_reader(
            cluster.clone(),
            SERVICE,
            from,
            tx,
            Arc::clone(&status.reader),
            reading.clone(),
            shared.tasks(),
        );
        shared.tasks().spawn(apply_loop(
            cluster.clone(),
            Arc::clone(shared),
            Arc::clone(&status),
            rx,
        ));
        tracing::info!(
            cluster = %status.name,
            me = %status.me,
            "controller {}: following the cluster's log{}",
            status.role(),
            if replica { "" } else { ", waiting for the lease" }
        );
        Ok(Self {
            cluster,
            bucket,
            status,
            reading,
        })
    }

    /// Waits for the lease, then takes over (see the module docs): returns once `shared`
    /// holds everything the old leader published and records its own changes, ready to bind.
    /// The lease is renewed while the log is read up to the takeover record; a takeover that
    /// fails (NATS gone, the lease lost meanwhile) releases it and waits again. `None` once
    /// `cancel`.
    pub async fn take_over(
        &self,
        shared: &Arc<Shared>,
        cancel: &CancellationToken,
    ) -> Option<Lease> {
        let status = &self.status;
        let (lease, started) = loop {
            let mut lease = self
                .bucket
                .acquire(LEASE_KEY, &status.me, cancel, |h| {
                    *status.lease_holder.lock() = h.map(|(who, _)| who);
                })
                .await?;
            let started = Instant::now();
            *status.lease_holder.lock() = Some(status.me.clone());
            match self.announce(shared, &mut lease).await {
                Ok(()) => break (lease, started),
                Err(e) => {
                    // Back to following; another standby (or this one, later) takes over.
                    tracing::warn!("takeover abandoned, lease released: {e}");
                    self.bucket.release(&lease).await;
                    *status.lease_holder.lock() = None;
                }
            }
        };
        // Every record up to the takeover is applied: stop following, start publishing.
        self.reading.cancel();
        let (tx, rx) = mpsc::channel(RECORD_QUEUE);
        cluster::spawn_publisher(
            self.cluster.clone(),
            SERVICE,
            rx,
            Arc::clone(&status.published),
            shared.shutdown_token().clone(),
            shared.tasks(),
        );
        shared.lead(ChangeLog {
            epoch: lease.epoch,
            seq: AtomicU64::new(1),
            max_record_bytes: self
                .cluster
                .max_message_bytes()
                .saturating_sub(RECORD_OVERHEAD),
            tx,
            status: Arc::clone(status),
        });
        status.epoch.store(lease.epoch, Ordering::Relaxed);
        status.leader.store(true, Ordering::Relaxed);
        let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        *status.failover.lock() = Some((shared.now(), ms));
        let (epoch, seq) = status.follower.lock().cursor().epoch_seq();
        tracing::info!(
            epoch = lease.epoch,
            followed = ?(epoch, seq),
            in_sync = status.follower.lock().cursor().in_sync(),
            workers = shared.index().worker_count(),
            keys = shared.index().key_count(),
            "controller took the lease: serving the followed state"
        );
        Some(lease)
    }

    /// Publishes the takeover record and reads the log back to it (see
    /// [`Cluster::announce_takeover`]).
    async fn announce(&self, shared: &Arc<Shared>, lease: &mut Lease) -> Result<(), String> {
        let epoch = lease.epoch;
        let status = &self.status;
        let record = |fresh| {
            Record {
                epoch,
                seq: 1,
                at_ms: now_ms(),
                now: shared.now(),
                change: Change::Takeover {
                    holder: status.me.clone(),
                    fresh,
                },
            }
            .encode()
        };
        let read_back = || ReadBack {
            done: status.follower.lock().cursor().epoch_seq() >= (Some(epoch), 1),
            handled: status.processed.load(Ordering::Relaxed),
        };
        self.cluster
            .announce_takeover(SERVICE, &self.bucket, lease, record, read_back)
            .await
            .map(drop)
    }

    /// Renews `lease` until `shutdown` (then releases it) or until it is lost.
    ///
    /// # Errors
    /// The lease was lost: the caller must stop serving at once.
    pub async fn hold(&self, lease: Lease, shutdown: &CancellationToken) -> Result<(), String> {
        self.bucket.hold(lease, shutdown, |_| {}).await
    }
}
