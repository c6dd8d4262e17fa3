//! The node's two tiers put together: L1 (`Bytes` in memory) and L2 (one file per object),
//! the store and prefetch policies, and pins for reads in progress. This file owns the tier
//! types, the observers' calls, L1 and the operations that reach both tiers (PUT, GET, warm
//! prefetch); L2's disk work is `l2`'s (on tokio's blocking pool, never on the async
//! threads), the scans over both tiers' keys `keys`'s, the controller's commands
//! `ops`'s. The eviction rules themselves are `lru`'s; the file format is `disk`'s. No
//! sockets here.

use super::config::{L2Config, NodeConfig, PrefetchPolicy};
use super::metrics::NodeMetrics;
use super::model::codec::ObjectMeta;
use super::model::compress::Codec;
use super::model::lru::{EvictionPolicy, Inserted, TierIndex, Weighted};
use crate::service::StartError;
use bytes::Bytes;
use parking_lot::Mutex;
use std::io;
use std::sync::Arc;
use tokio_util::task::TaskTracker;

mod disk;
mod l2;
use l2::L2;

mod keys;

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
pub(crate) struct Deleted {
    /// Distinct keys.
    pub(crate) keys: usize,
    /// Tokens, summed tier by tier.
    pub(crate) tokens: u64,
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
pub(crate) async fn decode(obj: Object) -> Result<Object, super::model::compress::DecompressError> {
    if obj.codec == Codec::Raw {
        return Ok(obj);
    }
    let Object { meta, data, codec } = obj;
    // The wire's length is an int32: nothing larger was ever PUT.
    let limit = i32::MAX as usize;
    tokio::task::spawn_blocking(move || codec.decode(&data, limit))
        .await
        .unwrap_or_else(|e| Err(super::model::compress::DecompressError::new(e.to_string())))
        .map(|data| Object::raw(meta, data))
}

/// L1 + optional L2.
pub(crate) struct TieredStore {
    l1: Mutex<TierIndex<Object>>,
    l2: Option<L2>,
    metrics: Arc<NodeMetrics>,
    tasks: TaskTracker,
    observers: Observers,
}

/// Holds a pin on an L1 object until dropped (the GET reply is written).
pub(crate) struct Pin {
    tiers: Arc<TieredStore>,
    key: String,
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.tiers.l1.lock().unpin(&self.key);
    }
}

impl TieredStore {
    /// [`TieredStore::open`] for `kvplane node`'s configuration, off the async threads.
    pub(crate) async fn start(
        config: &NodeConfig,
        metrics: Arc<NodeMetrics>,
        tasks: TaskTracker,
        observers: Observers,
    ) -> Result<(Arc<Self>, Recovery), StartError> {
        let (l1, l2) = (config.l1, config.l2.clone());
        let opened = tokio::task::spawn_blocking(move || {
            Self::open(l1, l2.as_ref(), metrics, tasks, observers)
        })
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e)));
        let (tiers, recovery) = opened.map_err(|source| {
            let path = config.l2.as_ref().map(|c| c.path.display().to_string());
            StartError::resource(format!("open L2 at {}", path.unwrap_or_default()), source)
        })?;
        Ok((Arc::new(tiers), recovery))
    }

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
        let (l2, recovery) = match l2 {
            None => (None, Recovery::default()),
            Some(c) => {
                let (l2, recovery) = L2::open(c, l1.budget, &metrics, &observers)?;
                (Some(l2), recovery)
            }
        };
        Ok((
            TieredStore {
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
            Inserted::Stored { evicted, .. } => {
                self.left(TierId::L1, &evicted);
                if !existed {
                    self.tell(TierId::L1, key, bytes, true);
                }
                self.count_evicted("l1", &evicted);
                true
            }
            Inserted::Refused(_) => {
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

    /// As [`TieredStore::get`], the object as stored (still encoded by a `compress` command).
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

    /// Whether `key` is in L1 or complete in L2.
    pub(crate) fn exists(&self, key: &str) -> bool {
        self.l1.lock().contains(key)
            || self.l2.as_ref().is_some_and(|l2| {
                l2.pending.lock().contains_key(key)
                    || l2.index.lock().peek(key).is_some_and(|e| e.ready)
            })
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
