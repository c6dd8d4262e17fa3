//! The node's two tiers put together: L1 (`Bytes` in memory) and L2 (one file per object),
//! the store and prefetch policies, pins for reads in progress, and the blocking disk work
//! (on tokio's blocking pool, at most `max_in_flight` file operations at once). The eviction
//! rules themselves are `lru`'s; the file format is `disk`'s. No sockets here.

use super::codec::ObjectMeta;
use super::compress::Codec;
use super::config::{L2Config, PrefetchPolicy, StorePolicy};
use super::disk;
use super::lru::{EvictionPolicy, Insert, TierIndex, Weighted};
use super::metrics::NodeMetrics;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

#[path = "tier_ops.rs"]
mod ops;
pub(crate) use ops::Resolved;

/// A stored object: the opaque fields and the body, shared (never copied) between L1, L2
/// writes and GET replies.
#[derive(Debug, Clone)]
pub(crate) struct Object {
    /// Fields returned unchanged on GET.
    pub(crate) meta: ObjectMeta,
    /// The body, as `codec` encodes it (as PUT unless a `compress` command re-encoded it).
    pub(crate) data: Bytes,
    /// How `data` is encoded.
    pub(crate) codec: Codec,
}

impl Object {
    /// An object as PUT.
    pub(crate) fn raw(meta: ObjectMeta, data: Bytes) -> Self {
        Object {
            meta,
            data,
            codec: Codec::Raw,
        }
    }
}

impl Weighted for Object {
    fn bytes(&self) -> u64 {
        self.data.len() as u64
    }
}

/// Which tiers an operation reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TierSet {
    pub(crate) l1: bool,
    pub(crate) l2: bool,
}

impl TierSet {
    /// Both tiers.
    pub(crate) const ALL: TierSet = TierSet { l1: true, l2: true };
}

/// What a delete removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Removed {
    /// Distinct keys.
    pub(crate) keys: usize,
    /// Tokens, summed tier by tier.
    pub(crate) tokens: u64,
}

#[derive(Debug, Clone, Copy)]
struct DiskEntry {
    file_bytes: u64,
    /// Tokens the object holds ([`ObjectMeta::num_tokens`]), for a controller's clear.
    tokens: u32,
    /// The file is complete on disk (false while its write is in flight).
    ready: bool,
    /// Observers were told this key is in L2 (at its first complete write, or at recovery);
    /// they are told of its removal only then.
    announced: bool,
    /// Which PUT wrote it: a write finishing after a newer PUT of the same key leaves the
    /// newer entry alone.
    generation: u64,
}

/// Whether observers were told an entry is in its tier (every L1 entry is).
trait Announced {
    fn announced(&self) -> bool;
}

impl Announced for Object {
    fn announced(&self) -> bool {
        true
    }
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

struct L2 {
    root: PathBuf,
    /// Objects whose file write is in flight, readable until the file is in place (L1 may
    /// have evicted them meanwhile): key → (generation, object).
    pending: Mutex<HashMap<String, (u64, Object)>>,
    /// Bytes of pending writes allowed at once (the L1 budget): a PUT beyond waits, which
    /// pushes back on its connection instead of growing memory.
    pending_bytes: Arc<Semaphore>,
    /// Permits `pending_bytes` started with.
    pending_total: u64,
    index: Mutex<TierIndex<DiskEntry>>,
    io: Semaphore,
    fsync: bool,
    store_policy: StorePolicy,
    prefetch_policy: PrefetchPolicy,
    generation: std::sync::atomic::AtomicU64,
}

/// What a warm prefetch of one key did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Warmed {
    /// Already in L1.
    InL1,
    /// Read from L2 into L1.
    Loaded,
    /// In neither tier (or L1 refused it).
    Missing,
}

/// Which tier an object entered or left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum TierId {
    /// Memory.
    L1,
    /// Disk.
    L2,
}

/// Told of every key entering (`admitted`) or leaving a tier: L1 when an object is stored
/// under a new key or removed; L2 when a key's first file is complete (or recovered at
/// start) and when it leaves the index. Called under the tier's lock, so the calls for one
/// key come in order: implementations must be quick and never block or call back into the
/// tiers.
pub(crate) trait TierObserver: Send + Sync {
    /// `key` entered (`admitted`) or left `tier`; `bytes` is its size there (body bytes in
    /// L1, file bytes in L2).
    fn changed(&self, tier: TierId, key: &str, bytes: u64, admitted: bool);

    /// `key` was read from `tier` (a GET hit, or a warm prefetch); by default nothing.
    fn accessed(&self, tier: TierId, key: &str) {
        let _ = (tier, key);
    }
}

/// The observers of one node (none, the controller reporter, the coordinator reporter).
pub(crate) type Observers = Vec<Arc<dyn TierObserver>>;

/// What the tiers hold, for metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierUsage {
    /// Bytes in L1.
    pub l1_bytes: u64,
    /// Objects in L1.
    pub l1_objects: usize,
    /// Bytes in L2 (files, including the in-flight ones).
    pub l2_bytes: u64,
    /// Objects in L2, including those whose file write is in flight.
    pub l2_objects: usize,
}

/// What restart recovery found on L2.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Complete objects now served again.
    pub recovered: usize,
    /// Files discarded (torn temp files, truncated or corrupt objects, over budget).
    pub discarded: usize,
}

/// The object with its body as PUT (decoded off the async threads).
pub(crate) async fn decode(obj: Object) -> Result<Object, super::compress::DecodeError> {
    if obj.codec == Codec::Raw {
        return Ok(obj);
    }
    let Object { meta, data, codec } = obj;
    // The wire's length is an int32: nothing larger was ever PUT.
    let limit = i32::MAX as usize;
    tokio::task::spawn_blocking(move || codec.decode(&data, limit))
        .await
        .unwrap_or_else(|e| Err(super::compress::DecodeError::new(e.to_string())))
        .map(|data| Object::raw(meta, data))
}

/// Permits of the pending-write budget for `bytes` (the semaphore's ceiling applies).
fn pending_permits(bytes: u64) -> usize {
    usize::try_from(bytes)
        .unwrap_or(usize::MAX)
        .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize))
}

/// L1 + optional L2.
pub(crate) struct Tiers {
    l1: Mutex<TierIndex<Object>>,
    l2: Option<L2>,
    metrics: Arc<NodeMetrics>,
    tasks: TaskTracker,
    observers: Observers,
}

/// Holds a pin on an L1 object until dropped (the GET reply is written).
pub(crate) struct Pin {
    tiers: Arc<Tiers>,
    key: String,
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.tiers.l1.lock().unpin(&self.key);
    }
}

impl Tiers {
    /// Builds the tiers; with L2, prepares its directory and recovers every complete object
    /// (blocking: call before serving, off the async threads).
    pub(crate) fn open(
        l1: EvictionPolicy,
        l2: Option<&L2Config>,
        metrics: Arc<NodeMetrics>,
        tasks: TaskTracker,
        observers: Observers,
    ) -> io::Result<(Self, Recovery)> {
        metrics
            .tier_capacity_bytes
            .with_label_values(&["l1"])
            .set(i64::try_from(l1.budget).unwrap_or(i64::MAX));
        let mut recovery = Recovery::default();
        let l2 = match l2 {
            None => None,
            Some(c) => {
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
                        Insert::Stored { evicted, .. } => {
                            over_budget.extend(evicted.into_iter().map(|(k, _)| k));
                        }
                        Insert::Refused(_) => over_budget.push(f.key),
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
                    for o in &observers {
                        o.changed(TierId::L2, key, bytes, true);
                    }
                }
                recovery = Recovery {
                    recovered: index.len(),
                    discarded: report.discarded.len()
                        + usize::try_from(torn).unwrap_or(0)
                        + over_budget.len(),
                };
                Some(L2 {
                    root: c.path.clone(),
                    pending: Mutex::new(HashMap::new()),
                    pending_bytes: Arc::new(Semaphore::new(pending_permits(l1.budget))),
                    pending_total: pending_permits(l1.budget) as u64,
                    index: Mutex::new(index),
                    io: Semaphore::new(c.max_in_flight.max(1)),
                    fsync: c.fsync,
                    store_policy: c.store_policy,
                    prefetch_policy: c.prefetch_policy,
                    generation: std::sync::atomic::AtomicU64::new(1),
                })
            }
        };
        Ok((
            Tiers {
                l1: Mutex::new(TierIndex::new(l1)),
                l2,
                metrics,
                tasks,
                observers,
            },
            recovery,
        ))
    }

    fn count_evicted<V: Weighted>(&self, tier: &str, evicted: &[(String, V)]) {
        if evicted.is_empty() {
            return;
        }
        let bytes: u64 = evicted.iter().map(|(_, v)| v.bytes()).sum();
        self.metrics
            .evictions
            .with_label_values(&[tier])
            .inc_by(evicted.len() as u64);
        self.metrics
            .evicted_bytes
            .with_label_values(&[tier])
            .inc_by(bytes);
    }

    /// Stores into L1 (evicting as the policy says); returns whether it was admitted.
    fn put_l1(&self, key: &str, obj: Object) -> bool {
        let mut l1 = self.l1.lock();
        let existed = l1.contains(key);
        let bytes = obj.data.len() as u64;
        let admitted = match l1.insert(key, obj) {
            Insert::Stored { evicted, .. } => {
                self.left(TierId::L1, &evicted);
                if !existed {
                    self.tell(TierId::L1, key, bytes, true);
                }
                self.count_evicted("l1", &evicted);
                true
            }
            Insert::Refused(_) => {
                self.metrics.stores_refused.with_label_values(&["l1"]).inc();
                false
            }
        };
        let evicted = l1.evict_if_triggered();
        self.left(TierId::L1, &evicted);
        drop(l1);
        self.count_evicted("l1", &evicted);
        admitted
    }

    /// Tells every observer `key` was read from `tier`.
    fn read_from(&self, tier: TierId, key: &str) {
        for o in &self.observers {
            o.accessed(tier, key);
        }
    }

    /// Tells every observer (call under the tier's lock).
    fn tell(&self, tier: TierId, key: &str, bytes: u64, admitted: bool) {
        for o in &self.observers {
            o.changed(tier, key, bytes, admitted);
        }
    }

    /// Tells the observers these entries left `tier` (L2: only the announced ones).
    fn left<V: Weighted + Announced>(&self, tier: TierId, removed: &[(String, V)]) {
        if self.observers.is_empty() {
            return;
        }
        for (k, v) in removed {
            if v.announced() {
                self.tell(tier, k, v.bytes(), false);
            }
        }
    }

    /// Stores an object per the store policy. The L2 write (if any) runs in the background;
    /// this waits only while the pending-write budget is used up (backpressure).
    pub(crate) async fn put(self: &Arc<Self>, key: String, obj: Object) {
        self.put_l1(&key, obj.clone());
        let Some((permit, generation)) = self.begin_l2(&key, &obj).await else {
            return;
        };
        let this = Arc::clone(self);
        self.tasks.spawn(async move {
            this.write_l2(key, obj, generation, true).await;
            drop(permit);
        });
    }

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
    async fn begin_l2(
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
                Insert::Stored { evicted, .. } => {
                    // The writer holds a pin until its file is in place.
                    index.pin(key);
                    self.left(TierId::L2, &evicted);
                    evicted
                }
                Insert::Refused(_) => {
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
    async fn write_l2(self: Arc<Self>, key: String, obj: Object, generation: u64, from_put: bool) {
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

    /// Looks `key` up: L1 first (the object stays pinned until the returned [`Pin`] drops),
    /// then L2 (read and verified off the async threads; promoted to L1 under `retain`).
    pub(crate) async fn get(self: &Arc<Self>, key: &str) -> Option<(Object, Option<Pin>)> {
        let (obj, pin) = self.get_stored(key).await?;
        if obj.codec == Codec::Raw {
            return Some((obj, pin));
        }
        // The decoded copy is the reply's own: the stored object needs no pin.
        drop(pin);
        match decode(obj).await {
            Ok(o) => Some((o, None)),
            Err(e) => {
                tracing::warn!(key, "stored object not served: {e}");
                self.metrics
                    .l2_discarded
                    .with_label_values(&["bad_codec"])
                    .inc();
                None
            }
        }
    }

    /// As [`Tiers::get`], the object as stored (still encoded by a `compress` command).
    pub(crate) async fn get_stored(self: &Arc<Self>, key: &str) -> Option<(Object, Option<Pin>)> {
        {
            let mut l1 = self.l1.lock();
            if l1.pin(key) {
                let obj = l1.peek(key).cloned();
                drop(l1);
                self.read_from(TierId::L1, key);
                let pin = Pin {
                    tiers: Arc::clone(self),
                    key: key.to_owned(),
                };
                return obj.map(|o| (o, Some(pin)));
            }
        }
        let obj = self.read_l2(key).await?;
        self.read_from(TierId::L2, key);
        if self
            .l2
            .as_ref()
            .is_some_and(|l2| l2.prefetch_policy == PrefetchPolicy::Retain)
            && self.put_l1(key, obj.clone())
        {
            self.metrics.l2_promotions.inc();
        }
        Some((obj, None))
    }

    /// Loads `key` into L1 from L2 (a warm prefetch): whatever the prefetch policy, the
    /// object is kept in L1 (subject to L1's eviction like any other).
    pub(crate) async fn warm(self: &Arc<Self>, key: &str) -> Warmed {
        if self.l1.lock().touch(key).is_some() {
            self.read_from(TierId::L1, key);
            return Warmed::InL1;
        }
        let Some(obj) = self.read_l2(key).await else {
            return Warmed::Missing;
        };
        self.read_from(TierId::L2, key);
        if self.put_l1(key, obj) {
            self.metrics.l2_promotions.inc();
            Warmed::Loaded
        } else {
            Warmed::Missing
        }
    }

    /// The keys of either tier for which `matches` holds (an O(objects) scan).
    pub(crate) fn keys_where(&self, matches: impl Fn(&str) -> bool) -> Vec<String> {
        // L1, then L2's index: the order `list` takes them in.
        let l1 = self.l1.lock();
        let mut out: Vec<String> = l1
            .keys()
            .filter(|k| matches(k))
            .map(str::to_owned)
            .collect();
        if let Some(l2) = &self.l2 {
            let index = l2.index.lock();
            out.extend(
                index
                    .keys()
                    .filter(|k| !l1.contains(k) && matches(k))
                    .map(str::to_owned),
            );
        }
        out
    }

    /// Reads `key` from L2: from memory while its write is in flight, else from its file
    /// (verified, off the async threads). A file that fails to read is dropped from L2.
    async fn read_l2(self: &Arc<Self>, key: &str) -> Option<Object> {
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

    /// Whether `key` is in L1 or complete in L2.
    pub(crate) fn exists(&self, key: &str) -> bool {
        self.l1.lock().contains(key)
            || self.l2.as_ref().is_some_and(|l2| {
                l2.pending.lock().contains_key(key)
                    || l2.index.lock().peek(key).is_some_and(|e| e.ready)
            })
    }

    /// Every key (L1's, then L2's not in L1), newline-joined, whole keys only, at most
    /// `max_bytes`.
    pub(crate) fn list(&self, max_bytes: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut push = |k: &str| {
            let extra = k.len() + usize::from(!out.is_empty());
            if out.len() + extra > max_bytes {
                return false;
            }
            if !out.is_empty() {
                out.push(b'\n');
            }
            out.extend_from_slice(k.as_bytes());
            true
        };
        let l1 = self.l1.lock();
        let mut full = false;
        for k in l1.keys() {
            if !push(k) {
                full = true;
                break;
            }
        }
        if let (false, Some(l2)) = (full, &self.l2) {
            let index = l2.index.lock();
            for k in index.keys() {
                // Entries still being written are listed too: GET serves them from memory.
                if l1.contains(k) {
                    continue;
                }
                if !push(k) {
                    break;
                }
            }
        }
        out
    }

    /// Whether an L2 is configured.
    pub(crate) fn has_l2(&self) -> bool {
        self.l2.is_some()
    }

    /// What each tier holds now.
    pub(crate) fn usage(&self) -> TierUsage {
        let (l1_bytes, l1_objects) = {
            let l1 = self.l1.lock();
            (l1.used(), l1.len())
        };
        let (l2_bytes, l2_objects) = self.l2.as_ref().map_or((0, 0), |l2| {
            let index = l2.index.lock();
            (index.used(), index.len())
        });
        TierUsage {
            l1_bytes,
            l1_objects,
            l2_bytes,
            l2_objects,
        }
    }

    /// Runs `work` on the node's background tracker (waited for by `flush` and `stop`).
    pub(crate) fn spawn(&self, work: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(work);
    }

    /// Whether `key` is in L1 (tests and tools).
    pub(crate) fn in_l1(&self, key: &str) -> bool {
        self.l1.lock().contains(key)
    }
}

/// One listed object: its key and its size in the tier (body bytes in L1, file bytes in L2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    /// The node's key.
    pub(crate) key: String,
    /// Bytes in the tier.
    pub(crate) size_bytes: u64,
}

/// The `limit` smallest keys greater than `after` for which `keep` holds, in key order
/// (bounded: at most `limit + 1` kept at once); and whether more follow.
fn page_of<'a, V: Weighted + 'a>(
    entries: impl Iterator<Item = (&'a str, &'a V)>,
    after: Option<&str>,
    limit: usize,
    keep: impl Fn(&V) -> bool,
) -> (Vec<Listed>, bool) {
    let mut best: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for (k, v) in entries {
        if after.is_some_and(|a| k <= a) || !keep(v) {
            continue;
        }
        best.insert(k, v.bytes());
        if best.len() > limit + 1 {
            best.pop_last();
        }
    }
    let more = best.len() > limit;
    let out = best
        .into_iter()
        .take(limit)
        .map(|(k, size_bytes)| Listed {
            key: k.to_owned(),
            size_bytes,
        })
        .collect();
    (out, more)
}

impl Tiers {
    /// A page of `tier`'s keys (`l2`: complete files only) after `after`, in key order.
    pub(crate) fn page(
        &self,
        l2_tier: bool,
        after: Option<&str>,
        limit: usize,
    ) -> (Vec<Listed>, bool) {
        if l2_tier {
            let Some(l2) = &self.l2 else {
                return (Vec::new(), false);
            };
            let index = l2.index.lock();
            page_of(
                index.keys().filter_map(|k| index.peek(k).map(|v| (k, v))),
                after,
                limit,
                |e| e.ready,
            )
        } else {
            let l1 = self.l1.lock();
            page_of(
                l1.keys().filter_map(|k| l1.peek(k).map(|v| (k, v))),
                after,
                limit,
                |_| true,
            )
        }
    }

    /// Deletes every key for which `matches` holds from the tiers `which` names (objects being
    /// read — unless `force` —, L2 files still being written and objects the controller
    /// pinned are left alone); counts the distinct keys
    /// removed (an object in both tiers once) and the tokens removed, tier by tier (an object
    /// removed from both tiers counts in each, as LMCache sums its backends' clears).
    pub(crate) fn delete_in(
        self: &Arc<Self>,
        which: TierSet,
        force: bool,
        matches: impl Fn(&str) -> bool,
    ) -> Removed {
        let mut removed = std::collections::HashSet::new();
        let mut tokens = 0u64;
        if which.l1 {
            let mut l1 = self.l1.lock();
            let victims: Vec<String> = l1
                .keys()
                .filter(|k| {
                    matches(k)
                        && if force {
                            !l1.is_held(k)
                        } else {
                            l1.pins(k) == 0
                        }
                })
                .map(str::to_owned)
                .collect();
            for k in victims {
                if let Some(o) = l1.remove(&k) {
                    tokens += u64::from(o.meta.num_tokens());
                    self.left(TierId::L1, &[(k.clone(), o)]);
                    removed.insert(k);
                }
            }
        }
        let done = |removed: std::collections::HashSet<String>, tokens| Removed {
            keys: removed.len(),
            tokens,
        };
        let Some(l2) = self.l2.as_ref().filter(|_| which.l2) else {
            return done(removed, tokens);
        };
        let files: Vec<String> = {
            let mut index = l2.index.lock();
            let victims: Vec<String> = index
                .keys()
                .filter(|k| {
                    // A file being written holds its writer's pin, and is not `ready`.
                    let free = if force {
                        !index.is_held(k)
                    } else {
                        index.pins(k) == 0
                    };
                    matches(k) && free && index.peek(k).is_some_and(|e| e.ready)
                })
                .map(str::to_owned)
                .collect();
            for k in &victims {
                if let Some(e) = index.remove(k) {
                    tokens += u64::from(e.tokens);
                    self.left(TierId::L2, &[(k.clone(), e)]);
                }
            }
            victims
        };
        removed.extend(files.iter().cloned());
        if !files.is_empty() {
            let root = l2.root.clone();
            self.tasks.spawn_blocking(move || {
                for key in files {
                    if let Err(e) = disk::delete_object(&root, &key) {
                        tracing::warn!(key, "cannot delete an L2 file: {e}");
                    }
                }
            });
        }
        done(removed, tokens)
    }
}
