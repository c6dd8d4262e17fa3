//! L2, the node's disk tier (a child of `tiers`, which keeps the locks and the observers):
//! its index entries and in-flight writes, restart recovery, and the file work itself —
//! writing, reading and deleting objects on tokio's blocking pool, at most `max_in_flight`
//! file operations at once, pending writes bounded by the L1 budget. The file format is
//! `disk`'s; the eviction rules `lru`'s. Nothing here touches L1 except `skip_l1`'s drop of a
//! PUT's L1 copy once its file is in place; no sockets.

use super::disk;
use super::{Announced, Object, Observers, Recovery, TierId, TieredStore};
use crate::node::config::{L2Config, PrefetchPolicy, StorePolicy};
use crate::node::metrics::NodeMetrics;
use crate::node::model::lru::{Inserted, TierIndex, Weighted};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::Semaphore;

#[derive(Debug, Clone, Copy)]
pub(super) struct DiskEntry {
    pub(super) file_bytes: u64,
    /// Tokens the object holds ([`ObjectMeta::num_tokens`]), for a controller's clear.
    pub(super) tokens: u32,
    /// The file is complete on disk (false while its write is in flight).
    pub(super) ready: bool,
    /// Observers were told this key is in L2 (at its first complete write, or at recovery);
    /// they are told of its removal only then.
    announced: bool,
    /// Which PUT wrote it: a write finishing after a newer PUT of the same key leaves the
    /// newer entry alone.
    generation: u64,
}

impl Announced for DiskEntry {
    fn announced(&self) -> bool {
        self.announced
    }
}

impl Weighted for DiskEntry {
    fn bytes(&self) -> u64 {
        self.file_bytes
    }
}

/// The disk tier: its index, in-flight writes and I/O limits.
pub(super) struct L2 {
    pub(super) root: PathBuf,
    /// Objects whose file write is in flight, readable until the file is in place (L1 may
    /// have evicted them meanwhile): key → (generation, object).
    pub(super) pending: Mutex<HashMap<String, (u64, Object)>>,
    /// Bytes of pending writes allowed at once (the L1 budget): a PUT beyond waits, which
    /// pushes back on its connection instead of growing memory.
    pending_bytes: Arc<Semaphore>,
    /// Permits `pending_bytes` started with.
    pending_total: u64,
    pub(super) index: Mutex<TierIndex<DiskEntry>>,
    io: Semaphore,
    pub(super) fsync: bool,
    store_policy: StorePolicy,
    pub(super) prefetch_policy: PrefetchPolicy,
    generation: std::sync::atomic::AtomicU64,
}

/// Permits of the pending-write budget for `bytes` (the semaphore's ceiling applies).
fn pending_permits(bytes: u64) -> usize {
    usize::try_from(bytes)
        .unwrap_or(usize::MAX)
        .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize))
}

impl L2 {
    /// Prepares L2's directory and recovers every complete object (blocking: call before
    /// serving, off the async threads), telling `observers` of each; the pending writes may
    /// hold `l1_budget` bytes at once.
    pub(super) fn open(
        c: &L2Config,
        l1_budget: u64,
        metrics: &NodeMetrics,
        observers: &Observers,
    ) -> io::Result<(Self, Recovery)> {
        metrics
            .tier_capacity_bytes
            .with_label_values(&["l2"])
            .set(i64::try_from(c.eviction.budget).unwrap_or(i64::MAX));
        let torn = disk::prepare_root(&c.path)?;
        if torn > 0 {
            metrics
                .l2_discarded
                .with_label_values(&["torn_temp"])
                .inc_by(torn);
        }
        let report = disk::scan(&c.path)?;
        for (_, reason) in &report.discarded {
            metrics.l2_discarded.with_label_values(&[reason]).inc();
        }
        let mut index = TierIndex::new(c.eviction);
        let mut over_budget = Vec::new();
        for f in report.found {
            let entry = DiskEntry {
                file_bytes: f.file_bytes,
                tokens: f.tokens,
                ready: true,
                announced: true,
                generation: 0,
            };
            match index.insert(&f.key, entry) {
                Inserted::Stored { evicted, .. } => {
                    over_budget.extend(evicted.into_iter().map(|(k, _)| k));
                }
                Inserted::Refused(_) => over_budget.push(f.key),
            }
        }
        for key in &over_budget {
            disk::delete_object(&c.path, key)?;
            metrics
                .l2_discarded
                .with_label_values(&["over_budget"])
                .inc();
        }
        // The controller's pins survive a restart (a pinned key that is gone is
        // forgotten; the next pin change rewrites the file).
        for key in disk::read_pins(&c.path)? {
            index.set_held(&key, true);
        }
        for key in index.keys() {
            let bytes = index.peek(key).map_or(0, |e| e.file_bytes);
            for o in observers {
                o.changed(TierId::L2, key, bytes, true);
            }
        }
        let recovery = Recovery {
            recovered: index.len(),
            discarded: report.discarded.len()
                + usize::try_from(torn).unwrap_or(0)
                + over_budget.len(),
        };
        let l2 = L2 {
            root: c.path.clone(),
            pending: Mutex::new(HashMap::new()),
            pending_bytes: Arc::new(Semaphore::new(pending_permits(l1_budget))),
            pending_total: pending_permits(l1_budget) as u64,
            index: Mutex::new(index),
            io: Semaphore::new(c.max_in_flight.max(1)),
            fsync: c.fsync,
            store_policy: c.store_policy,
            prefetch_policy: c.prefetch_policy,
            generation: std::sync::atomic::AtomicU64::new(1),
        };
        Ok((l2, recovery))
    }
}

impl TieredStore {
    /// Writes `obj` to L2 only (a move from L1, or a re-encoded L2 object) and waits for its
    /// file; returns whether it is in place.
    pub(crate) async fn store_l2(self: &Arc<Self>, key: &str, obj: Object) -> bool {
        let Some((permit, generation)) = self.begin_l2(key, &obj).await else {
            return false;
        };
        Arc::clone(self)
            .write_l2(key.to_owned(), obj, generation, false)
            .await;
        drop(permit);
        self.l2.as_ref().is_some_and(|l2| {
            l2.index
                .lock()
                .peek(key)
                .is_some_and(|e| e.ready && e.generation == generation)
        })
    }

    /// Enters `key` in L2's index as being written (pinned by the writer) and makes its
    /// object readable from memory until the file is in place; `None` without L2 or when
    /// L2 refuses it. Waits while the pending-write budget is used up.
    pub(super) async fn begin_l2(
        self: &Arc<Self>,
        key: &str,
        obj: &Object,
    ) -> Option<(tokio::sync::OwnedSemaphorePermit, u64)> {
        let l2 = self.l2.as_ref()?;
        // `pending_total` fits a u32 (see `pending_permits`); a larger object takes it all.
        let permits =
            u32::try_from((obj.data.len() as u64).min(l2.pending_total)).unwrap_or(u32::MAX);
        let permit = Arc::clone(&l2.pending_bytes)
            .acquire_many_owned(permits)
            .await
            .ok()?;
        let file_bytes = (disk::FIXED_HEADER + key.len()) as u64 + obj.data.len() as u64;
        let generation = l2
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut entry = DiskEntry {
            file_bytes,
            tokens: obj.meta.num_tokens(),
            ready: false,
            announced: false,
            generation,
        };
        let evicted = {
            let mut index = l2.index.lock();
            // A replaced key stays announced: it never left L2.
            entry.announced = index.peek(key).is_some_and(|e| e.announced);
            match index.insert(key, entry) {
                Inserted::Stored { evicted, .. } => {
                    // The writer holds a pin until its file is in place.
                    index.pin(key);
                    self.left(TierId::L2, &evicted);
                    evicted
                }
                Inserted::Refused(_) => {
                    self.metrics.stores_refused.with_label_values(&["l2"]).inc();
                    return None;
                }
            }
        };
        self.drop_files(evicted);
        l2.pending
            .lock()
            .insert(key.to_owned(), (generation, obj.clone()));
        Some((permit, generation))
    }

    /// Writes a file `begin_l2` entered; `from_put`: the store policy applies (`skip_l1`
    /// drops the L1 copy once the file is in place).
    pub(super) async fn write_l2(
        self: Arc<Self>,
        key: String,
        obj: Object,
        generation: u64,
        from_put: bool,
    ) {
        let Some(l2) = &self.l2 else { return };
        let written = match l2.io.acquire().await {
            Ok(_permit) => {
                let (root, k, meta, codec, data, fsync) = (
                    l2.root.clone(),
                    key.clone(),
                    obj.meta,
                    obj.codec,
                    obj.data.clone(),
                    l2.fsync,
                );
                tokio::task::spawn_blocking(move || {
                    disk::write_object(&root, &k, &meta, codec, &data, fsync)
                })
                .await
                .unwrap_or_else(|e| Err(io::Error::other(e)))
            }
            Err(e) => Err(io::Error::other(e)),
        };
        {
            let mut pending = l2.pending.lock();
            if pending.get(&key).is_some_and(|(g, _)| *g == generation) {
                pending.remove(&key);
            }
        }
        let evicted = {
            let mut index = l2.index.lock();
            index.unpin(&key);
            let current = index.peek(&key).map(|e| e.generation) == Some(generation);
            match &written {
                Ok(_) if current => {
                    if let Some(e) = index.peek_mut(&key) {
                        e.ready = true;
                        if !e.announced {
                            e.announced = true;
                            let bytes = e.file_bytes;
                            self.tell(TierId::L2, &key, bytes, true);
                        }
                    }
                }
                Err(_) if current => {
                    if let Some(e) = index.remove(&key) {
                        self.left(TierId::L2, &[(key.clone(), e)]);
                    }
                }
                _ => {}
            }
            let evicted = index.evict_if_triggered();
            self.left(TierId::L2, &evicted);
            evicted
        };
        match written {
            Ok(_) => {
                self.metrics.l2_writes.with_label_values(&["ok"]).inc();
                if from_put && l2.store_policy == StorePolicy::SkipL1 {
                    let mut l1 = self.l1.lock();
                    let same = l1
                        .peek(&key)
                        .is_some_and(|o| o.data.as_ptr() == obj.data.as_ptr());
                    if same && l1.pins(&key) == 0 {
                        if let Some(o) = l1.remove(&key) {
                            self.left(TierId::L1, &[(key.clone(), o)]);
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(key, "L2 write failed: {e}");
                self.metrics.l2_writes.with_label_values(&["error"]).inc();
            }
        }
        self.drop_files(evicted);
    }

    /// Deletes evicted L2 files in the background (counted as evictions).
    fn drop_files(self: &Arc<Self>, evicted: Vec<(String, DiskEntry)>) {
        let Some(l2) = &self.l2 else { return };
        if evicted.is_empty() {
            return;
        }
        self.count_evicted("l2", &evicted);
        let root = l2.root.clone();
        self.tasks.spawn(async move {
            let deleted = tokio::task::spawn_blocking(move || {
                for (key, _) in evicted {
                    if let Err(e) = disk::delete_object(&root, &key) {
                        tracing::warn!(key, "cannot delete an evicted L2 file: {e}");
                    }
                }
            })
            .await;
            if let Err(e) = deleted {
                tracing::warn!("L2 delete task failed: {e}");
            }
        });
    }

    /// Reads `key` from L2: from memory while its write is in flight, else from its file
    /// (verified, off the async threads). A file that fails to read is dropped from L2.
    pub(super) async fn read_l2(self: &Arc<Self>, key: &str) -> Option<Object> {
        let l2 = self.l2.as_ref()?;
        if let Some((_, obj)) = l2.pending.lock().get(key) {
            return Some(obj.clone());
        }
        let generation = {
            let mut index = l2.index.lock();
            match index.peek(key) {
                Some(e) if e.ready => {
                    let g = e.generation;
                    index.pin(key);
                    g
                }
                _ => return None,
            }
        };
        let read = match l2.io.acquire().await {
            Ok(_permit) => {
                let (root, k) = (l2.root.clone(), key.to_owned());
                tokio::task::spawn_blocking(move || disk::read_object(&root, &k))
                    .await
                    .unwrap_or_else(|e| Err(disk::DiskError::Io(io::Error::other(e))))
            }
            Err(e) => Err(disk::DiskError::Io(io::Error::other(e))),
        };
        {
            let mut index = l2.index.lock();
            index.unpin(key);
            if read.is_err() && index.peek(key).map(|e| e.generation) == Some(generation) {
                if let Some(e) = index.remove(key) {
                    self.left(TierId::L2, &[(key.to_owned(), e)]);
                }
            }
        }
        match read {
            Ok((meta, codec, data)) => {
                self.metrics.l2_reads.with_label_values(&["ok"]).inc();
                Some(Object { meta, data, codec })
            }
            Err(e) => {
                tracing::warn!(key, "L2 object discarded: {e}");
                self.metrics.l2_reads.with_label_values(&["error"]).inc();
                self.metrics
                    .l2_discarded
                    .with_label_values(&[e.reason()])
                    .inc();
                if matches!(e, disk::DiskError::Corrupt(_)) {
                    let (root, k) = (l2.root.clone(), key.to_owned());
                    self.tasks.spawn_blocking(move || {
                        let _ = disk::delete_object(&root, &k);
                    });
                }
                None
            }
        }
    }
}
