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
//! Never blocks the data path: the tiers call [`ControllerReporter::changed`] under their locks; it
//! takes one short lock and hands the op to the worker's bounded queue (`try_send`). The
//! worker batches ops per location (`batch_size` ops or `flush_interval`, whichever first);
//! an op refused by a full queue is counted and the worker resynchronises with a full sync.

use super::{location, LOCAL_DISK_BACKEND};
use crate::node::metrics::NodeMetrics;
use crate::node::model::keys::{chunk_hash, key_rank};
use crate::node::tiers::{TierId, TierObserver};
use crate::protocol::ChunkHash;
use crate::worker::{KeySource, WorkerError, WorkerHandle, LOCAL_CPU_BACKEND};
use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use tokio::sync::mpsc;

/// Most TP ranks the node registers a worker for; keys of higher ranks are not reported.
pub(crate) const MAX_RANKS: u32 = 256;

/// Holders per (rank, tier, hash); one worker per rank once it is started.
pub(crate) struct ControllerReporter {
    counts: Mutex<HashMap<(u32, TierId, ChunkHash), u32>>,
    workers: RwLock<HashMap<u32, WorkerHandle>>,
    /// Ranks asked for (started or starting).
    requested: Mutex<HashSet<u32>>,
    /// Where a rank seen for the first time is sent, to start its worker.
    new_ranks: OnceLock<mpsc::UnboundedSender<u32>>,
    metrics: Arc<NodeMetrics>,
    l2: bool,
}

impl ControllerReporter {
    /// A reporter with no worker yet (ops before a rank's worker starts only update the
    /// counts, which its first registration's full sync sends).
    pub(crate) fn new(metrics: Arc<NodeMetrics>, l2: bool) -> Self {
        ControllerReporter {
            counts: Mutex::new(HashMap::new()),
            workers: RwLock::new(HashMap::new()),
            requested: Mutex::new(HashSet::new()),
            new_ranks: OnceLock::new(),
            metrics,
            l2,
        }
    }

    /// Routes ranks seen for the first time to `starter` (which starts their workers);
    /// returns the ranks seen so far.
    pub(crate) fn on_new_ranks(&self, starter: mpsc::UnboundedSender<u32>) -> Vec<u32> {
        let _ = self.new_ranks.set(starter);
        let seen: HashSet<u32> = self.counts.lock().keys().map(|(r, _, _)| *r).collect();
        let mut requested = self.requested.lock();
        let mut out: Vec<u32> = seen.into_iter().filter(|r| requested.insert(*r)).collect();
        out.sort_unstable();
        out
    }

    /// Marks `rank` requested (a worker is being started for it); `false` if it already was.
    pub(crate) fn request(&self, rank: u32) -> bool {
        self.requested.lock().insert(rank)
    }

    /// Routes `rank`'s later ops to `worker`.
    pub(crate) fn attach(&self, rank: u32, worker: WorkerHandle) {
        self.workers.write().insert(rank, worker);
    }

    /// Every worker, by rank.
    pub(crate) fn workers(&self) -> Vec<(u32, WorkerHandle)> {
        let mut w: Vec<(u32, WorkerHandle)> = self
            .workers
            .read()
            .iter()
            .map(|(r, h)| (*r, h.clone()))
            .collect();
        w.sort_by_key(|(r, _)| *r);
        w
    }

    /// Rank 0's worker (the node's first).
    pub(crate) fn worker(&self) -> Option<WorkerHandle> {
        self.workers.read().get(&0).cloned()
    }

    fn count(&self, outcome: &str) {
        self.metrics
            .reports
            .with_label_values(&["controller", outcome])
            .inc();
    }
}

impl TierObserver for ControllerReporter {
    fn changed(&self, tier: TierId, key: &str, _bytes: u64, admitted: bool) {
        let (Some(hash), Some(rank)) = (chunk_hash(key), key_rank(key).filter(|r| *r < MAX_RANKS))
        else {
            self.count("unreportable_key");
            return;
        };
        let mut counts = self.counts.lock();
        let first_or_last = if admitted {
            let n = counts.entry((rank, tier, hash)).or_insert(0);
            *n += 1;
            *n == 1
        } else {
            match counts.get_mut(&(rank, tier, hash)) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => {
                    counts.remove(&(rank, tier, hash));
                    true
                }
                None => false,
            }
        };
        if !first_or_last {
            return;
        }
        // Under the counts' lock, so the worker's queue sees ops in the counts' order.
        let workers = self.workers.read();
        let Some(worker) = workers.get(&rank) else {
            // Its worker's first full sync will carry it; start one if none is coming.
            if let Some(starter) = self.new_ranks.get() {
                if self.request(rank) {
                    let _ = starter.send(rank);
                }
            }
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

/// One rank's share of the reporter's counts, for its worker's full syncs.
pub(crate) struct ReportedKeys {
    pub(crate) reporter: Arc<ControllerReporter>,
    pub(crate) rank: u32,
}

impl KeySource for ReportedKeys {
    fn locations(&self) -> Vec<String> {
        let mut l = vec![LOCAL_CPU_BACKEND.to_owned()];
        if self.reporter.l2 {
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
        self.reporter
            .counts
            .lock()
            .keys()
            .filter(|(r, t, _)| *r == self.rank && *t == tier)
            .map(|(_, _, h)| *h)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_holders_per_rank_hash_and_tier() {
        let r = Arc::new(ControllerReporter::new(Arc::new(NodeMetrics::new()), true));
        r.changed(TierId::L1, "m@2@0@aa@bf16", 1, true);
        r.changed(TierId::L1, "m@2@0@aa@fp8", 1, true);
        r.changed(TierId::L1, "m@2@1@aa@bf16", 1, true);
        r.changed(TierId::L2, "m@2@0@aa@bf16", 1, true);
        let rank = |rank| ReportedKeys {
            reporter: Arc::clone(&r),
            rank,
        };
        let aa = vec![ChunkHash::from_u64(0xaa)];
        assert_eq!(rank(0).keys(LOCAL_CPU_BACKEND), aa);
        assert_eq!(rank(1).keys(LOCAL_CPU_BACKEND), aa);
        r.changed(TierId::L1, "m@2@0@aa@bf16", 1, false);
        assert_eq!(
            rank(0).keys(LOCAL_CPU_BACKEND),
            aa,
            "the fp8 key still holds it"
        );
        r.changed(TierId::L1, "m@2@0@aa@fp8", 1, false);
        r.changed(TierId::L1, "m@2@0@aa@fp8", 1, false);
        assert!(rank(0).keys(LOCAL_CPU_BACKEND).is_empty());
        assert_eq!(rank(1).keys(LOCAL_CPU_BACKEND), aa);
        assert_eq!(rank(0).keys(LOCAL_DISK_BACKEND), aa);
        assert!(rank(1).keys(LOCAL_DISK_BACKEND).is_empty());
        assert_eq!(
            rank(0).locations(),
            vec![LOCAL_CPU_BACKEND.to_owned(), LOCAL_DISK_BACKEND.to_owned()]
        );
        // A rank seen before the starter is attached is handed to it then.
        let (tx, _rx) = mpsc::unbounded_channel();
        assert_eq!(r.on_new_ranks(tx), vec![0, 1]);
        assert!(!r.request(1), "already requested");
    }
}
