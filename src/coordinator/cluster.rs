//! `kvplane coordinator --cluster`: one leader, hot standbys (docs/CLUSTER.md, "Coordinator
//! leader").
//!
//! Every process starts as a standby: it reads the cluster's `coordinator` stream from the
//! start and applies each [`Record`] to its own [`Replica`] through a [`Follower`], binding no
//! port. One process holds the `coordinator` lease: it serves HTTP, runs the health sweep, the
//! eviction loop (the only dispatcher) and, when needed, the startup resync, and logs every
//! change it applies through the [`ChangeLog`] (each write logs in the owner job that applies
//! it: `super::writes`). When the lease lapses, a standby takes it ([`Standby::take_over`]):
//! it publishes a [`Change::Takeover`] stamped with the lease's revision, reads the stream up
//! to that record (so it holds everything the old leader published), stops reading, logs the
//! operator state as a whole, and serves what it followed: the owners start from its replica,
//! and the startup resync runs only if that state is not known to be complete. The leader
//! renews the lease and stops the moment it is lost; evictions are dispatched only while the
//! lease is certainly held by this process's clock ([`LeaseGuard`]).
//!
//! Snapshots: a standby in sync publishes its whole state with its log position
//! ([`Snapshot`]) every `snapshot_records` records it applied (at most every
//! [`cluster::MIN_SNAPSHOT_INTERVAL`]); a standby starting restores the latest one and reads the log
//! from the next stream sequence, so it is in sync even after the stream dropped the log's
//! start.

use super::changes::{Applied, Change, Follower, Position, Record, Replica};
use super::driver::{wall_now, Dispatcher};
use super::snapshot::Snapshot;
use super::CoordinatorConfig;
use crate::cluster::{
    self, now_ms, Cluster, ClusterConfig, ClusterError, Lease, LeaseBucket, PublishStats, ReadBack,
    ReaderStatus, SnapshotSchedule, RECORD_OVERHEAD,
};
use crate::service::StartError;
use bytes::Bytes;
use parking_lot::Mutex;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The service's name in the cluster's stream and subject names.
pub const SERVICE: &str = "coordinator";
/// The key of the coordinator's lease.
pub const LEASE_KEY: &str = "coordinator";
/// Between two logs of the whole operator state by the leader.
pub const METADATA_EVERY: Duration = Duration::from_secs(300);
/// Records queued for publishing at most; beyond, one is dropped (counted) and standbys see
/// the gap.
const RECORD_QUEUE: usize = 65_536;
/// Bytes of records queued for publishing at most (the same rule).
pub const MAX_QUEUED_BYTES: u64 = 64 << 20;
/// Records handed from the log's queue to the publisher at most (it holds its own window of
/// unacknowledged ones).
const PUBLISH_QUEUE: usize = 16;
/// Records read but not yet applied by a standby at most.
const APPLY_QUEUE: usize = 1024;

/// Counters of the leader's log.
#[derive(Debug, Default)]
pub struct LogStats {
    /// Records handed to the publisher.
    pub queued: AtomicU64,
    /// Bytes of the records queued and not yet handed to the publisher.
    pub queued_bytes: AtomicU64,
    /// Records dropped at a full queue.
    pub dropped: AtomicU64,
    /// Changes larger than NATS takes that could not be cut.
    pub oversize: AtomicU64,
}

/// The leader's side of the log: numbers and queues every change it applies.
pub struct ChangeLog {
    epoch: u64,
    /// The last record's number; records are numbered and queued under it, so the queue holds
    /// them in number order whichever owner task logs.
    seq: Mutex<u64>,
    max_record_bytes: usize,
    tx: mpsc::Sender<Bytes>,
    stats: Arc<LogStats>,
}

impl ChangeLog {
    /// A log of `epoch` whose last record so far is `last_seq`; records go to `tx`, each
    /// change's bytes at most `max_record_bytes` (larger ones are cut, [`Change::split`]).
    pub fn new(
        epoch: u64,
        last_seq: u64,
        max_record_bytes: usize,
        tx: mpsc::Sender<Bytes>,
        stats: Arc<LogStats>,
    ) -> Self {
        ChangeLog {
            epoch,
            seq: Mutex::new(last_seq),
            max_record_bytes,
            tx,
            stats,
        }
    }

    /// Logs `change`, applied at `now` (the leader's wall clock). Call it in the owner job
    /// that applies the change, so each owner's records are in its apply order. Never blocks
    /// on NATS: a full queue drops the record (counted; standbys see the gap). The change is
    /// encoded before the lock is taken.
    pub fn record(&self, now: f64, change: &Change) {
        let body = change.encode();
        if body.len() > self.max_record_bytes {
            if let Some((a, b)) = change.split() {
                self.record(now, &a);
                self.record(now, &b);
                return;
            }
        }
        let mut seq = self.seq.lock();
        // A change that is not sent still takes its number: standbys must see the gap.
        *seq += 1;
        if body.len() > self.max_record_bytes {
            self.stats.oversize.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                bytes = body.len(),
                "a change is larger than NATS takes: not replicated (standbys see a gap)"
            );
            return;
        }
        let bytes = Record::frame(self.epoch, *seq, now_ms(), now, &body);
        let len = bytes.len() as u64;
        let held = self.stats.queued_bytes.load(Ordering::Relaxed);
        if held + len > MAX_QUEUED_BYTES || self.tx.try_send(Bytes::from(bytes)).is_err() {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            self.stats.queued_bytes.fetch_add(len, Ordering::Relaxed);
            self.stats.queued.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Moves the log's records (from `rx`) to the publisher's short queue, keeping the count of
/// queued bytes. Ends when the log is dropped, or a moment after `stop` (the owners have
/// stopped: nothing more is logged) once what is queued is handed over; the publisher then
/// sends the rest and ends, and the lease can be released.
fn spawn_handoff(
    mut rx: mpsc::Receiver<Bytes>,
    stats: Arc<LogStats>,
    stop: CancellationToken,
    tasks: &TaskTracker,
) -> mpsc::Receiver<Bytes> {
    let (tx, out) = mpsc::channel(PUBLISH_QUEUE);
    tasks.spawn(async move {
        let forward = |b: Bytes| {
            stats
                .queued_bytes
                .fetch_sub(b.len() as u64, Ordering::Relaxed);
            tx.send(b)
        };
        loop {
            let b = tokio::select! {
                b = rx.recv() => b,
                () = stop.cancelled() => {
                    tokio::time::sleep(STOP_GRACE).await;
                    while let Ok(b) = rx.try_recv() {
                        if forward(b).await.is_err() {
                            return;
                        }
                    }
                    return;
                }
            };
            let Some(b) = b else { return };
            if forward(b).await.is_err() {
                return;
            }
        }
    });
    out
}

/// After the owners are told to stop, how long the log's last records may still come.
const STOP_GRACE: Duration = Duration::from_millis(50);

/// Whether this process certainly still holds its lease, by its own clock: until a TTL after
/// the last renewal that succeeded was sent (NATS expires the key no earlier).
#[derive(Debug)]
pub struct LeaseGuard {
    origin: Instant,
    ttl: Duration,
    until_us: AtomicU64,
}

impl LeaseGuard {
    /// For `lease`, just taken, of `ttl`.
    pub fn new(lease: &Lease, ttl: Duration) -> Self {
        let g = LeaseGuard {
            origin: lease.renewed,
            ttl,
            until_us: AtomicU64::new(0),
        };
        g.renewed(lease);
        g
    }

    /// `lease` was renewed.
    pub fn renewed(&self, lease: &Lease) {
        let until = lease.renewed.saturating_duration_since(self.origin) + self.ttl;
        let us = u64::try_from(until.as_micros()).unwrap_or(u64::MAX);
        self.until_us.fetch_max(us, Ordering::Relaxed);
    }

    /// The lease is gone.
    pub fn revoke(&self) {
        self.until_us.store(0, Ordering::Relaxed);
    }

    /// Whether the lease is certainly still held.
    pub fn held(&self) -> bool {
        let now = u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX);
        now < self.until_us.load(Ordering::Relaxed)
    }
}

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

/// What a standby follows, beside its position.
struct Followed {
    follower: Follower,
    /// Taken out at takeover (later records are dropped).
    state: Option<Replica>,
}

/// Where this coordinator stands in its cluster, for `/metrics`, `/coordinator/cluster` and
/// the dashboard.
pub struct ClusterStatus {
    /// This process's name in the lease (`host:pid:random`).
    pub me: String,
    /// The cluster's name.
    pub name: String,
    leader: AtomicBool,
    epoch: AtomicU64,
    lease_holder: Mutex<Option<String>>,
    followed: Mutex<Followed>,
    reader: Arc<ReaderStatus>,
    published: Arc<PublishStats>,
    log: Arc<LogStats>,
    applied: AtomicU64,
    /// Records read (applied, ignored or undecodable): the takeover's sign of progress.
    processed: AtomicU64,
    bad_records: AtomicU64,
    /// Snapshots this standby published.
    snapshots: AtomicU64,
    /// The stream sequence of the snapshot restored at start (0: none).
    restored_at: AtomicU64,
    /// Dispatches refused by the [`LeaseGuard`].
    pub(crate) dispatches_fenced: Arc<AtomicU64>,
    /// Whether the takeover ran the startup resync (the followed state was not complete).
    resynced: AtomicBool,
    /// Unix seconds of the last takeover, and how long it took from lease to serving (ms).
    failover: Mutex<Option<(f64, u64)>>,
}

impl ClusterStatus {
    fn new(name: &str, state: Replica, follower: Follower) -> Self {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "host".into());
        ClusterStatus {
            me: format!(
                "{host}:{}:{:08x}",
                std::process::id(),
                rand::random::<u32>()
            ),
            name: name.to_owned(),
            leader: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            lease_holder: Mutex::new(None),
            restored_at: AtomicU64::new(follower.cursor().position().stream_seq),
            followed: Mutex::new(Followed {
                follower,
                state: Some(state),
            }),
            reader: Arc::default(),
            published: Arc::default(),
            log: Arc::default(),
            applied: AtomicU64::new(0),
            processed: AtomicU64::new(0),
            bad_records: AtomicU64::new(0),
            snapshots: AtomicU64::new(0),
            dispatches_fenced: Arc::default(),
            resynced: AtomicBool::new(false),
            failover: Mutex::new(None),
        }
    }

    /// The takeover started the startup resync.
    pub(crate) fn resyncing(&self) {
        self.resynced.store(true, Ordering::Relaxed);
    }

    /// Whether this coordinator holds the lease and serves.
    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::Relaxed)
    }

    /// Applies one record, read at `stream_seq`, to the followed state (dropped once it was
    /// taken over).
    fn apply(&self, r: Record, stream_seq: u64) {
        let mut f = self.followed.lock();
        let Followed { follower, state } = &mut *f;
        follower.note_stream_seq(stream_seq);
        if let Some(state) = state {
            let outcome = follower.apply(state, r, (Instant::now(), wall_now()));
            if !matches!(outcome, Applied::Stale | Applied::Fenced) {
                self.applied.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.processed.fetch_add(1, Ordering::Relaxed);
    }

    /// A log message at `stream_seq` that is not a record was read.
    fn skip(&self, stream_seq: u64) {
        self.followed.lock().follower.note_stream_seq(stream_seq);
        self.bad_records.fetch_add(1, Ordering::Relaxed);
        self.processed.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the followed state holds every change since a fresh start.
    pub fn in_sync(&self) -> bool {
        self.followed.lock().follower.cursor().in_sync()
    }

    /// The followed state and its position, dumped under the lock records are applied under
    /// (so they match); `None` once taken over. A full pass over the state: call it off the
    /// async workers.
    fn snapshot(&self) -> Option<Snapshot> {
        let f = self.followed.lock();
        let state = f.state.as_ref()?;
        Some(Snapshot::of(state, f.follower.cursor().position()))
    }

    /// Records handed to the publisher and not yet acknowledged or failed.
    fn pending(&self) -> u64 {
        let done = self.published.acked.load(Ordering::Relaxed)
            + self.published.failed.load(Ordering::Relaxed);
        self.log.queued.load(Ordering::Relaxed).saturating_sub(done)
    }

    fn lost(&self) -> u64 {
        self.published.failed.load(Ordering::Relaxed)
            + self.log.dropped.load(Ordering::Relaxed)
            + self.log.oversize.load(Ordering::Relaxed)
    }

    /// The JSON of `/coordinator/cluster` (and the dashboard's cluster line).
    pub fn json(&self) -> serde_json::Value {
        let (in_sync, (epoch, seq), gaps, fenced) = {
            let f = self.followed.lock();
            let f = &f.follower;
            (
                f.cursor().in_sync(),
                f.cursor().epoch_seq(),
                f.cursor().gaps(),
                f.cursor().fenced(),
            )
        };
        let n = |v: &AtomicU64| v.load(Ordering::Relaxed);
        let failover = *self.failover.lock();
        serde_json::json!({
            "cluster": self.name,
            "role": if self.is_leader() { "leader" } else { "standby" },
            "me": self.me,
            "lease_holder": *self.lease_holder.lock(),
            "epoch": n(&self.epoch),
            "followed": {
                "epoch": epoch,
                "seq": seq,
                "in_sync": in_sync,
                "gaps": gaps,
                "fenced": fenced,
                "applied": n(&self.applied),
                "bad_records": n(&self.bad_records),
                "snapshots_published": n(&self.snapshots),
                "restored_snapshot_at": n(&self.restored_at),
            },
            "published": {
                "queued": n(&self.log.queued),
                "acked": n(&self.published.acked),
                "failed": n(&self.published.failed),
                "dropped": n(&self.log.dropped),
                "oversize": n(&self.log.oversize),
                "pending": self.pending(),
            },
            "resynced_at_takeover": self.resynced.load(Ordering::Relaxed),
            "dispatches_fenced": n(&self.dispatches_fenced),
            "last_failover": failover.map(|(at, ms)| serde_json::json!({
                "at": at, "takeover_ms": ms,
            })),
        })
    }

    /// Prometheus text of the cluster's series (`kvplane_coordinator_cluster_*`).
    pub fn metrics_text(&self) -> String {
        let (in_sync, gaps, fenced) = {
            let f = self.followed.lock();
            (
                f.follower.cursor().in_sync(),
                f.follower.cursor().gaps(),
                f.follower.cursor().fenced(),
            )
        };
        let failover = *self.failover.lock();
        let n = |v: &AtomicU64| v.load(Ordering::Relaxed) as f64;
        let flag = |b: bool| f64::from(u8::from(b));
        let series: [(&str, &str, &str, f64); 13] = [
            ("leader", "gauge", "1 while this coordinator holds the lease and serves.", flag(self.is_leader())),
            ("epoch", "gauge", "The lease revision this coordinator leads under.", n(&self.epoch)),
            ("in_sync", "gauge", "1 if the state followed before the takeover held every change since a fresh start.", flag(in_sync)),
            ("gaps_total", "counter", "Gaps seen in the change log while following it.", gaps as f64),
            ("fenced_total", "counter", "Records of a deposed leader ignored while following.", fenced as f64),
            ("records_applied_total", "counter", "Change records applied while following.", n(&self.applied)),
            ("snapshots_published_total", "counter", "Snapshots of the followed state this standby published.", n(&self.snapshots)),
            ("records_published_total", "counter", "Change records NATS acknowledged.", n(&self.published.acked)),
            ("records_lost_total", "counter", "Change records not replicated: publish failed, queue full, or too large.", self.lost() as f64),
            ("records_pending", "gauge", "Change records queued or sent but not yet acknowledged by NATS (replication lag).", self.pending() as f64),
            ("dispatches_fenced_total", "counter", "Eviction dispatches refused because the lease may have lapsed.", n(&self.dispatches_fenced)),
            ("last_failover_seconds", "gauge", "Unix time this coordinator took over.", failover.map_or(0.0, |(at, _)| at)),
            ("takeover_seconds", "gauge", "Lease taken to HTTP port bound, at the takeover.", failover.map_or(0.0, |(_, ms)| ms as f64 / 1e3)),
        ];
        let mut t = String::new();
        for (name, kind, help, value) in series {
            let name = format!("kvplane_coordinator_cluster_{name}");
            let _ = writeln!(
                t,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
        t
    }
}

/// The latest snapshot restored into a state of `state`'s configuration, with its position;
/// `state` itself and `None` when there is no usable one (the log is then read from its
/// start).
async fn restore_snapshot(cluster: &Cluster, state: Replica) -> (Replica, Option<Position>) {
    let data = match cluster.load_snapshot(SERVICE).await {
        Ok(Some(d)) => d,
        Ok(None) => return (state, None),
        Err(e) => {
            tracing::warn!("cluster: no snapshot read ({e}); following the log from its start");
            return (state, None);
        }
    };
    let snapshot = match Snapshot::decode(&data) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cluster: the snapshot did not decode ({e}); not used");
            return (state, None);
        }
    };
    let p = snapshot.position;
    match snapshot.restore(state.model.config().clone(), Instant::now()) {
        Ok(restored) => {
            tracing::info!(
                epoch = ?p.epoch,
                seq = p.seq,
                in_sync = p.in_sync,
                instances = restored.fleet.len(),
                keys = restored.model.tracked_keys(),
                bytes = data.len(),
                "cluster: restored a snapshot; following the log from stream sequence {}",
                p.stream_seq + 1
            );
            (restored, Some(p))
        }
        Err(e) => {
            tracing::warn!("cluster: the snapshot does not fit this coordinator's limits ({e})");
            (state, None)
        }
    }
}

/// Applies what the reader delivers, and every `snapshot_records` records (at most every
/// [`cluster::MIN_SNAPSHOT_INTERVAL`], only in sync and before a takeover) publishes a snapshot of the
/// followed state.
async fn apply_loop(
    cluster: Cluster,
    st: Arc<ClusterStatus>,
    mut rx: mpsc::Receiver<(u64, Bytes)>,
    tasks: TaskTracker,
) {
    let mut schedule = SnapshotSchedule::new(cluster.config().snapshot_records);
    while let Some((stream_seq, bytes)) = rx.recv().await {
        match Record::decode(&bytes) {
            Ok(r) => st.apply(r, stream_seq),
            Err(e) => {
                st.skip(stream_seq);
                tracing::warn!("cluster: a coordinator change record did not decode: {e}");
            }
        }
        if !schedule.handled(st.in_sync(), st.is_leader()) {
            continue;
        }
        let s = Arc::clone(&st);
        // The dump holds the followed state's lock (records wait; the loop too).
        let dumped = tokio::task::spawn_blocking(move || s.snapshot().map(|s| s.encode()));
        let Ok(Some(data)) = dumped.await else {
            continue;
        };
        let cluster = cluster.clone();
        let st = Arc::clone(&st);
        tasks.spawn(async move {
            match cluster.publish_snapshot(SERVICE, &data).await {
                Ok(()) => {
                    st.snapshots.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(bytes = data.len(), "cluster: snapshot published");
                }
                Err(e) => tracing::warn!("cluster: snapshot not published: {e}"),
            }
        });
    }
}

/// A coordinator following the cluster's log, ready to take over.
pub struct Standby {
    cluster: Cluster,
    bucket: LeaseBucket,
    status: Arc<ClusterStatus>,
    reading: CancellationToken,
    /// The coordinator's own stop.
    stop: CancellationToken,
}

/// What a standby holds once it took over.
pub struct Leadership {
    /// The lease.
    pub lease: Lease,
    /// The followed state, for the owners.
    pub state: Replica,
    /// Where its own changes go.
    pub log: Arc<ChangeLog>,
    /// Whether the stream was empty at the takeover (nothing followed: a new cluster).
    pub fresh: bool,
    /// Whether the followed state held every change since a fresh start.
    pub in_sync: bool,
    /// When the lease was taken.
    pub taken: Instant,
}

impl Leadership {
    /// Whether the followed state may lack keys the servers hold, so the startup resync must
    /// run: a new cluster, or a follower that missed records.
    pub fn needs_resync(&self) -> bool {
        self.fresh || !self.in_sync
    }
}

impl Standby {
    /// Joins the cluster as a standby of `state`: connects, sets up the stream and the lease
    /// bucket, and starts following the log into `state` on `tasks` (until `stop`).
    ///
    /// # Errors
    /// When NATS cannot be reached or JetStream set up.
    pub async fn join(
        config: ClusterConfig,
        state: Replica,
        tasks: &TaskTracker,
        stop: &CancellationToken,
    ) -> Result<Self, ClusterError> {
        let cluster = Cluster::connect(config).await?;
        cluster.ensure_stream(SERVICE).await?;
        let bucket = cluster.lease_bucket().await?;
        let (state, position) = restore_snapshot(&cluster, state).await;
        let follower = position.map_or_else(Follower::new, Follower::at);
        let from = position.map_or(1, |p| p.stream_seq + 1);
        let status = Arc::new(ClusterStatus::new(&cluster.config().name, state, follower));
        let reading = stop.child_token();
        let (tx, rx) = mpsc::channel::<(u64, Bytes)>(APPLY_QUEUE);
        cluster::spawn_reader(
            cluster.clone(),
            SERVICE,
            from,
            tx,
            Arc::clone(&status.reader),
            reading.clone(),
            tasks,
        );
        tasks.spawn(apply_loop(
            cluster.clone(),
            Arc::clone(&status),
            rx,
            tasks.clone(),
        ));
        tracing::info!(
            cluster = %status.name,
            me = %status.me,
            "coordinator standby: following the cluster's log, waiting for the lease"
        );
        Ok(Standby {
            cluster,
            bucket,
            status,
            reading,
            stop: stop.clone(),
        })
    }

    /// The standby's status.
    pub fn status(&self) -> &Arc<ClusterStatus> {
        &self.status
    }

    /// The lease bucket.
    pub fn bucket(&self) -> &LeaseBucket {
        &self.bucket
    }

    /// Waits for the lease, then takes over (see the module docs): returns once the followed
    /// state holds everything the old leader published, with the log its own changes go to
    /// (published on `tasks` until the log is dropped or the coordinator stops). `None` once
    /// `cancel`.
    ///
    /// # Errors
    /// When the takeover record cannot be published or read back (the lease is released).
    pub async fn take_over(
        &self,
        cancel: &CancellationToken,
        tasks: &TaskTracker,
    ) -> Result<Option<Leadership>, String> {
        let status = &self.status;
        let Some(mut lease) = self
            .bucket
            .acquire(LEASE_KEY, &status.me, cancel, |h| {
                *status.lease_holder.lock() = h.map(|(who, _)| who);
            })
            .await
        else {
            return Ok(None);
        };
        let taken = Instant::now();
        *status.lease_holder.lock() = Some(status.me.clone());
        let fresh = match self.announce(&mut lease).await {
            Ok(fresh) => fresh,
            Err(e) => {
                self.bucket.release(&lease).await;
                return Err(e);
            }
        };
        // Every record up to the takeover is applied: stop following, start publishing.
        self.reading.cancel();
        let (state, in_sync, position) = {
            let mut f = status.followed.lock();
            (
                f.state.take(),
                f.follower.cursor().in_sync(),
                f.follower.cursor().epoch_seq(),
            )
        };
        let Some(state) = state else {
            self.bucket.release(&lease).await;
            return Err("the followed state was taken over already".into());
        };
        // Not cancelled with the coordinator: it ends after sending what the log queued
        // (the handoff ends a moment after the coordinator stops).
        let (tx, rx) = mpsc::channel(RECORD_QUEUE);
        cluster::spawn_publisher(
            self.cluster.clone(),
            SERVICE,
            spawn_handoff(rx, Arc::clone(&status.log), self.stop.clone(), tasks),
            Arc::clone(&status.published),
            CancellationToken::new(),
            tasks,
        );
        let max = self
            .cluster
            .max_message_bytes()
            .saturating_sub(RECORD_OVERHEAD);
        let log = Arc::new(ChangeLog::new(
            lease.epoch,
            1,
            max,
            tx,
            Arc::clone(&status.log),
        ));
        status.epoch.store(lease.epoch, Ordering::Relaxed);
        status.leader.store(true, Ordering::Relaxed);
        tracing::info!(
            epoch = lease.epoch,
            followed = ?position,
            in_sync,
            fresh,
            instances = state.fleet.len(),
            keys = state.model.tracked_keys(),
            "coordinator took the lease"
        );
        let lead = Leadership {
            lease,
            state,
            log,
            fresh,
            in_sync,
            taken,
        };
        Ok(Some(lead))
    }

    /// Publishes the takeover record and reads the log back to it, renewing the lease
    /// meanwhile (see [`Cluster::announce_takeover`]); whether the stream was empty before.
    async fn announce(&self, lease: &mut Lease) -> Result<bool, String> {
        let epoch = lease.epoch;
        let status = &self.status;
        let record = |fresh| {
            Record {
                epoch,
                seq: 1,
                at_ms: now_ms(),
                now: wall_now(),
                change: Change::Takeover {
                    holder: status.me.clone(),
                    fresh,
                },
            }
            .encode()
        };
        let read_back = || ReadBack {
            done: status.followed.lock().follower.cursor().epoch_seq() >= (Some(epoch), 1),
            handled: status.processed.load(Ordering::Relaxed),
        };
        self.cluster
            .announce_takeover(SERVICE, &self.bucket, lease, record, read_back)
            .await
    }
}

/// Runs `kvplane coordinator --cluster`: a standby until it holds the lease, then the leader
/// until `shutdown` (the lease is released once the records are published) or until the lease
/// is lost (an error: the process must stop; restarted, it is a standby). Binding is retried
/// while the lease holds, for a deposed leader on the same host that still holds the port.
///
/// # Errors
/// [`StartError::Cluster`] when NATS cannot be reached, the takeover fails or the
/// lease is lost.
pub async fn run(
    config: CoordinatorConfig,
    cluster: ClusterConfig,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    let fail = StartError::Cluster;
    let tasks = TaskTracker::new();
    let stop = CancellationToken::new();
    let state = Replica::new(super::initial_model(&config));
    let standby = Standby::join(cluster, state, &tasks, &stop)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let status = Arc::clone(standby.status());
    let lead = match standby.take_over(&shutdown, &tasks).await {
        Ok(Some(lead)) => lead,
        other => {
            stop.cancel();
            drain(&tasks).await;
            return other.map(|_| ()).map_err(fail);
        }
    };
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
    let ms = u64::try_from(lead.taken.elapsed().as_millis()).unwrap_or(u64::MAX);
    *status.failover.lock() = Some((wall_now(), ms));
    let leading = super::Leading {
        resync: lead.needs_resync(),
        log: lead.log,
        status: Arc::clone(&status),
        guard: Arc::clone(&guard),
    };
    let coordinator = super::serve(config, bound, lead.state, Some(leading), stop, tasks);
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
