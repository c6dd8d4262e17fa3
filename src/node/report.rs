//! Reporting to a controller: the node joins a kvplane (or LMCache 0.5.6) controller as one
//! LMCache worker through `kvplane::worker`, and tells it which chunk hashes each tier holds,
//! L1 as `LocalCPUBackend` and L2 as `LocalDiskBackend` (LMCache's `str(backend)` of its CPU
//! and local-disk backends), so `/lookup` and P2P lookups see the node's objects.
//!
//! A node key is LMCache's key string `model@world_size@worker_id@chunk_hash_hex@dtype[@…]`;
//! the controller knows chunk hashes only. Several keys share one hash (the TP ranks of one
//! chunk, other dtypes), so the reporter counts holders per (tier, hash) and reports an admit
//! when the first arrives and an evict when the last leaves. Those counts are also the
//! worker's [`KeySource`]: a full sync (after a controller restart, a full queue, or at the
//! first registration after a node restart) sends exactly what the tiers hold.
//!
//! Never blocks the data path: the tiers call [`Reporter::changed`] under their locks; it
//! takes one short lock and hands the op to the worker's bounded queue (`try_send`). The
//! worker batches ops per location (`batch_size` ops or `flush_interval`, whichever first);
//! an op refused by a full queue is counted and the worker resynchronises with a full sync.

use super::metrics::NodeMetrics;
use super::tiers::{TierId, TierObserver};
use crate::protocol::ChunkHash;
use crate::worker::{KeySource, WorkerError, WorkerHandle, LOCAL_CPU_BACKEND};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// LMCache's name of its local-disk backend (`str(LocalDiskBackend)`), the L2 location.
pub(crate) const LOCAL_DISK_BACKEND: &str = "LocalDiskBackend";

/// The controller location of a tier.
pub(crate) fn location(tier: TierId) -> &'static str {
    match tier {
        TierId::L1 => LOCAL_CPU_BACKEND,
        TierId::L2 => LOCAL_DISK_BACKEND,
    }
}

/// The chunk hash of an LMCache key string: its fourth `@` field, hex with an optional `-`
/// (`f"{chunk_hash:x}"` of a Python int, negative for CPython's `hash`). A digest longer than
/// 64 bits (`bytes.hex()`) is folded to its first 8 bytes, big-endian, as LMCache's controller
/// folds digests. `None` for keys of another shape.
pub(crate) fn chunk_hash(key: &str) -> Option<ChunkHash> {
    let mut parts = key.split('@');
    let _model = parts.next()?;
    parts.next()?.parse::<u32>().ok()?;
    parts.next()?.parse::<u32>().ok()?;
    let hex = parts.next()?;
    let (negative, digits) = match hex.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, hex),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    if negative {
        let v = i128::from_str_radix(digits, 16).ok()?;
        return ChunkHash::from_i128(-v);
    }
    // An int's hex has at most 16 digits; a longer string is a digest's `bytes.hex()`.
    let digits = digits.get(..16).unwrap_or(digits);
    u64::from_str_radix(digits, 16)
        .ok()
        .map(ChunkHash::from_u64)
}

/// The TP rank of an LMCache key string: its third `@` field (`worker_id`). `None` for keys
/// of another shape.
pub(crate) fn key_rank(key: &str) -> Option<u32> {
    let mut parts = key.split('@');
    parts.next()?;
    parts.next()?.parse::<u32>().ok()?;
    parts.next()?.parse::<u32>().ok()
}

/// Holders per (tier, hash); the worker once it is started.
pub(crate) struct Reporter {
    counts: Mutex<HashMap<(TierId, ChunkHash), u32>>,
    worker: OnceLock<WorkerHandle>,
    metrics: Arc<NodeMetrics>,
    l2: bool,
}

impl Reporter {
    /// A reporter with no worker yet (ops before [`Reporter::attach`] only update the counts,
    /// which the first registration's full sync sends).
    pub(crate) fn new(metrics: Arc<NodeMetrics>, l2: bool) -> Self {
        Reporter {
            counts: Mutex::new(HashMap::new()),
            worker: OnceLock::new(),
            metrics,
            l2,
        }
    }

    /// Routes later ops to `worker`.
    pub(crate) fn attach(&self, worker: WorkerHandle) {
        let _ = self.worker.set(worker);
    }

    /// The worker, once attached.
    pub(crate) fn worker(&self) -> Option<&WorkerHandle> {
        self.worker.get()
    }

    fn count(&self, outcome: &str) {
        self.metrics
            .reports
            .with_label_values(&["controller", outcome])
            .inc();
    }
}

impl TierObserver for Reporter {
    fn changed(&self, tier: TierId, key: &str, _bytes: u64, admitted: bool) {
        let Some(hash) = chunk_hash(key) else {
            self.count("unreportable_key");
            return;
        };
        let mut counts = self.counts.lock();
        let first_or_last = if admitted {
            let n = counts.entry((tier, hash)).or_insert(0);
            *n += 1;
            *n == 1
        } else {
            match counts.get_mut(&(tier, hash)) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => {
                    counts.remove(&(tier, hash));
                    true
                }
                None => false,
            }
        };
        if !first_or_last {
            return;
        }
        // Under the counts' lock, so the worker's queue sees ops in the counts' order.
        let Some(worker) = self.worker.get() else {
            return;
        };
        let sent = if admitted {
            worker.admit(location(tier), hash)
        } else {
            worker.evict(location(tier), hash)
        };
        match sent {
            Ok(()) => self.count("queued"),
            Err(WorkerError::QueueFull) => self.count("dropped"),
            Err(_) => self.count("closed"),
        }
    }
}

/// The reporter's counts, for full syncs.
pub(crate) struct ReportedKeys(pub(crate) Arc<Reporter>);

impl KeySource for ReportedKeys {
    fn locations(&self) -> Vec<String> {
        let mut l = vec![LOCAL_CPU_BACKEND.to_owned()];
        if self.0.l2 {
            l.push(LOCAL_DISK_BACKEND.to_owned());
        }
        l
    }

    fn keys(&self, loc: &str) -> Vec<ChunkHash> {
        let tier = if loc == LOCAL_DISK_BACKEND {
            TierId::L2
        } else if loc == LOCAL_CPU_BACKEND {
            TierId::L1
        } else {
            return Vec::new();
        };
        self.0
            .counts
            .lock()
            .keys()
            .filter(|(t, _)| *t == tier)
            .map(|(_, h)| *h)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lmcache_chunk_hashes() {
        assert_eq!(
            chunk_hash("m@1@0@ff@bfloat16"),
            Some(ChunkHash::from_u64(255))
        );
        assert_eq!(
            chunk_hash("m/x@2@1@-1a@half@k%v"),
            Some(ChunkHash::from_i64(-26))
        );
        assert_eq!(
            chunk_hash("m@1@0@ffffffffffffffff@bf16"),
            Some(ChunkHash::from_u64(u64::MAX))
        );
        assert_eq!(
            chunk_hash("m@1@0@-8000000000000000@bf16"),
            Some(ChunkHash::from_i64(i64::MIN))
        );
        // A blake3 digest folds to its first 8 bytes.
        let digest = format!("0102030405060708{}", "ab".repeat(24));
        assert_eq!(
            chunk_hash(&format!("m@1@0@{digest}@bf16")),
            Some(ChunkHash::from_u64(0x0102_0304_0506_0708))
        );
        for bad in [
            "plain",
            "m@1@0@xyz@bf16",
            "m@one@0@ff@bf16",
            "m@1@0@-@bf16",
            "m@1@0@-10000000000000000@bf16",
        ] {
            assert_eq!(chunk_hash(bad), None, "{bad}");
        }
    }

    #[test]
    fn counts_holders_per_hash_and_tier() {
        let r = Reporter::new(Arc::new(NodeMetrics::new()), true);
        r.changed(TierId::L1, "m@2@0@aa@bf16", 1, true);
        r.changed(TierId::L1, "m@2@1@aa@bf16", 1, true);
        r.changed(TierId::L2, "m@2@0@aa@bf16", 1, true);
        let keys = ReportedKeys(Arc::new(r));
        assert_eq!(
            keys.keys(LOCAL_CPU_BACKEND),
            vec![ChunkHash::from_u64(0xaa)]
        );
        keys.0.changed(TierId::L1, "m@2@0@aa@bf16", 1, false);
        assert_eq!(
            keys.keys(LOCAL_CPU_BACKEND).len(),
            1,
            "rank 1 still holds it"
        );
        keys.0.changed(TierId::L1, "m@2@1@aa@bf16", 1, false);
        keys.0.changed(TierId::L1, "m@2@1@aa@bf16", 1, false);
        assert!(keys.keys(LOCAL_CPU_BACKEND).is_empty());
        assert_eq!(keys.keys(LOCAL_DISK_BACKEND).len(), 1);
        assert_eq!(
            keys.locations(),
            vec![LOCAL_CPU_BACKEND.to_owned(), LOCAL_DISK_BACKEND.to_owned()]
        );
    }
}
