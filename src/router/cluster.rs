//! Reservations shared by the router replicas of one cluster (docs/ROUTER.md, "Replicas that
//! do not herd"): each engine's [`Table`] is one entry of the cluster's compare-and-set bucket
//! `kvplane-<cluster>-router`, so a replica scores with every replica's reservations and takes
//! an engine's slot only by a write that fails if anyone wrote that engine's entry since it
//! was read. Every entry is watched into a local view; a conflict reads the entry again.
//!
//! Owns: the view, the write of a reservation, the release queue and its worker. Must not:
//! score (that is `model/score.rs`), or hold a reservation past its deadline in the view's counts.

use super::model::slots::{Held, NoSlot, Table};
use crate::cluster::{CasBucket, CasEntry, CasError, Cluster, ClusterConfig};
use parking_lot::Mutex;
use prometheus::IntCounterVec;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Releases waiting to be written; beyond, a release is dropped (counted) and its
/// reservation expires at its deadline.
pub(super) const RELEASE_QUEUE: usize = 65_536;

/// Writes tried per batch of releases of one engine before giving up (counted).
const RELEASE_ATTEMPTS: usize = 16;

/// Longest wait for NATS to answer one read or write of an entry.
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// After NATS did not answer, reservations are local only for this long (counted as
/// `unreachable`) instead of each request waiting its turn for [`CALL_TIMEOUT`].
pub(super) const BACKOFF_MS: u64 = 1000;

/// The counters the shared reservations bump (`kvplane_router_*`, registered in the router's
/// metrics).
#[derive(Clone)]
pub struct SharedCounters {
    /// Reservation writes, by outcome.
    pub reservations: IntCounterVec,
    /// Reservations dropped from an entry past their deadline (by the write that dropped
    /// them: each once).
    pub expired: IntCounterVec,
    /// Releases, by outcome (`released`, `queue_full`, `gave_up`, `unreachable`).
    pub releases: IntCounterVec,
}

#[derive(Clone, Debug, Default)]
struct View {
    table: Table,
    /// `None`: never written.
    revision: Option<u64>,
}

/// Why one reservation write did not take the slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Miss {
    /// Another replica wrote the entry since it was read (the view is read again).
    Conflict,
    /// The engine's slots are all held, or its entry is at its bound.
    Full(NoSlot),
    /// NATS did not answer.
    Unreachable(String),
}

/// The shared reservations of one replica.
pub struct SharedSlots {
    bucket: CasBucket,
    /// This replica's id in the entries.
    pub replica: u64,
    ttl: Duration,
    /// Every engine entry seen, by key (engines come and go with discovery).
    view: Mutex<HashMap<String, View>>,
    releases: mpsc::Sender<(String, u64)>,
    counters: SharedCounters,
    /// Until when (wall clock, ms) NATS is not asked for reservations: it did not answer.
    down_until: AtomicU64,
    /// Held while a replica decides and writes, so its own requests do not conflict with
    /// each other (they see each other's writes in the view at once).
    pub route_lock: tokio::sync::Mutex<()>,
}

/// An engine's key: `engine.` and its instance name in hex (keys take few characters).
pub(super) fn key(instance: &str) -> String {
    let hex: String = instance.bytes().map(|b| format!("{b:02x}")).collect();
    format!("engine.{hex}")
}

impl SharedSlots {
    /// Joins `cluster`'s bucket, reads the entries of `instances` (the engines known at
    /// start), and starts the watch (every entry, those of engines discovered later too) and
    /// the release worker.
    ///
    /// # Errors
    /// NATS unreachable, JetStream off.
    pub async fn start(
        cluster: ClusterConfig,
        instances: &[String],
        ttl: Duration,
        counters: SharedCounters,
        shutdown: &CancellationToken,
        tasks: &TaskTracker,
    ) -> Result<Arc<Self>, String> {
        let cluster = Cluster::connect(cluster).await.map_err(|e| e.to_string())?;
        let bucket = cluster
            .cas_bucket("router")
            .await
            .map_err(|e| e.to_string())?
            .with_timeout(CALL_TIMEOUT);
        let (tx, rx) = mpsc::channel(RELEASE_QUEUE);
        let shared = Arc::new(Self {
            bucket,
            replica: rand::random(),
            ttl,
            view: Mutex::new(HashMap::new()),
            releases: tx,
            counters,
            down_until: AtomicU64::new(0),
            route_lock: tokio::sync::Mutex::new(()),
        });
        for instance in instances {
            shared
                .refresh(&key(instance))
                .await
                .map_err(|e| e.to_string())?;
        }
        let (watch_tx, mut watch_rx) = mpsc::channel::<CasEntry>(1024);
        shared.bucket.watch(watch_tx, shutdown.clone(), tasks);
        let s = Arc::clone(&shared);
        tasks.spawn(async move {
            while let Some(entry) = watch_rx.recv().await {
                s.seen(&entry);
            }
        });
        let s = Arc::clone(&shared);
        let stop = shutdown.clone();
        tasks.spawn(async move { s.release_worker(rx, stop).await });
        Ok(shared)
    }

    /// Takes `entry` into the view when it is newer than what the view holds.
    fn seen(&self, entry: &CasEntry) {
        if !entry.key.starts_with("engine.") {
            return;
        }
        let table = match Table::decode(&entry.value) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(key = %entry.key, "unreadable reservation entry: {e}");
                Table::default()
            }
        };
        let mut view = self.view.lock();
        let v = view.entry(entry.key.clone()).or_default();
        if v.revision.is_none_or(|r| r < entry.revision) {
            *v = View {
                table,
                revision: Some(entry.revision),
            };
        }
    }

    /// Reads the entry `key` now into the view.
    async fn refresh(&self, key: &str) -> Result<(), CasError> {
        if let Some(entry) = self.bucket.get(key).await? {
            self.seen(&entry);
        }
        Ok(())
    }

    /// Reservations held on `instance` by other replicas that count at `now_ms`.
    pub fn others(&self, instance: &str, now_ms: u64) -> u64 {
        self.view
            .lock()
            .get(&key(instance))
            .map_or(0, |v| v.table.others(self.replica, now_ms))
    }

    /// Every replica's reservations on `instance` that count at `now_ms`.
    pub fn live(&self, instance: &str, now_ms: u64) -> u64 {
        self.view
            .lock()
            .get(&key(instance))
            .map_or(0, |v| v.table.live(now_ms))
    }

    /// `key`'s table and revision as the view holds them (never written: empty, `None`).
    fn read(&self, key: &str) -> (Table, Option<u64>) {
        self.view
            .lock()
            .get(key)
            .map(|v| (v.table.clone(), v.revision))
            .unwrap_or_default()
    }

    /// The most blocks of a prompt (`hashes`, chained) that a reservation on `instance`
    /// counting at `now_ms` (any replica's, this one's too) will add to it.
    pub fn pending(&self, instance: &str, now_ms: u64, hashes: &[u64]) -> u32 {
        self.view
            .lock()
            .get(&key(instance))
            .map_or(0, |v| v.table.pending(now_ms, hashes))
    }

    /// Takes one of `instance`'s `slots` (unlimited: `None`) for this replica, with the
    /// `blocks` its request will add, written only if nobody wrote the entry since the view
    /// read it; the reservation's id.
    ///
    /// # Errors
    /// [`Miss`]: a conflict (the view is read again: decide again), full, or NATS down.
    pub async fn reserve(
        &self,
        instance: &str,
        slots: Option<u64>,
        blocks: Vec<(u32, u64)>,
    ) -> Result<u64, Miss> {
        let now = crate::cluster::now_ms();
        if now < self.down_until.load(Ordering::Relaxed) {
            self.counters
                .reservations
                .with_label_values(&["unreachable"])
                .inc();
            return Err(Miss::Unreachable("NATS did not answer a moment ago".into()));
        }
        let key = key(instance);
        let (mut table, revision) = self.read(&key);
        let expired = table.prune(now);
        let id = rand::random();
        let held = Held {
            id,
            replica: self.replica,
            until_ms: now.saturating_add(u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)),
            blocks,
        };
        let outcome = |o: &str| self.counters.reservations.with_label_values(&[o]).inc();
        if let Err(refused) = table.reserve(held, slots, now) {
            outcome(match refused {
                NoSlot::Full => "full",
                NoSlot::TooMany => "too_many",
            });
            return Err(Miss::Full(refused));
        }
        match self.bucket.put_if(&key, table.encode(), revision).await {
            Ok(rev) => {
                outcome("reserved");
                self.expired(expired);
                self.seen(&CasEntry {
                    key,
                    value: table.encode(),
                    revision: rev,
                });
                Ok(id)
            }
            Err(CasError::Conflict) => {
                outcome("conflict");
                // Read it again; a failure here shows as the next write's.
                let _ = self.refresh(&key).await;
                Err(Miss::Conflict)
            }
            Err(CasError::Unreachable(e)) => {
                outcome("unreachable");
                self.down_until
                    .store(crate::cluster::now_ms() + BACKOFF_MS, Ordering::Relaxed);
                Err(Miss::Unreachable(e))
            }
        }
    }

    fn expired(&self, n: usize) {
        if n > 0 {
            self.counters
                .expired
                .with_label_values::<&str>(&[])
                .inc_by(n as u64);
        }
    }

    /// Queues the release of reservation `id` on `instance` (the answer ended).
    pub fn release(&self, instance: &str, id: u64) {
        if self.releases.try_send((key(instance), id)).is_err() {
            self.counters
                .releases
                .with_label_values(&["queue_full"])
                .inc();
        }
    }

    /// Writes the queued releases, batched per engine, until `shutdown`; then writes what is
    /// queued once more (a stopping replica frees its slots at once rather than at their
    /// deadlines).
    async fn release_worker(
        self: Arc<Self>,
        mut rx: mpsc::Receiver<(String, u64)>,
        shutdown: CancellationToken,
    ) {
        loop {
            let first = tokio::select! {
                () = shutdown.cancelled() => None,
                r = rx.recv() => r,
            };
            let Some(first) = first else { break };
            let mut batch = vec![first];
            while let Ok(r) = rx.try_recv() {
                batch.push(r);
            }
            self.write_releases(batch).await;
        }
        rx.close();
        let mut rest = Vec::new();
        while let Ok(r) = rx.try_recv() {
            rest.push(r);
        }
        if !rest.is_empty() {
            self.write_releases(rest).await;
        }
    }

    async fn write_releases(&self, batch: Vec<(String, u64)>) {
        let mut per_engine: HashMap<String, Vec<u64>> = HashMap::new();
        for (key, id) in batch {
            per_engine.entry(key).or_default().push(id);
        }
        for (key, ids) in per_engine {
            let label = self.release_one(&key, &ids).await;
            self.counters
                .releases
                .with_label_values(&[label])
                .inc_by(ids.len() as u64);
        }
    }

    async fn release_one(&self, key: &str, ids: &[u64]) -> &'static str {
        for _ in 0..RELEASE_ATTEMPTS {
            let now = crate::cluster::now_ms();
            let (mut table, revision) = self.read(key);
            let expired = table.prune(now);
            if table.release(ids) == 0 && expired == 0 {
                // Already gone (expired and pruned by another write).
                return "released";
            }
            let value = table.encode();
            match self.bucket.put_if(key, value.clone(), revision).await {
                Ok(rev) => {
                    self.expired(expired);
                    self.seen(&CasEntry {
                        key: key.to_owned(),
                        value,
                        revision: rev,
                    });
                    return "released";
                }
                Err(CasError::Conflict) => {
                    if self.refresh(key).await.is_err() {
                        return "unreachable";
                    }
                }
                Err(CasError::Unreachable(e)) => {
                    tracing::warn!("releasing reservations: {e}; they expire at their deadline");
                    return "unreachable";
                }
            }
        }
        "gave_up"
    }
}
