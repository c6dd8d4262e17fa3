//! Prefix lookups over the reverse index: P2P lookup (`BatchedP2PLookupMsg`, spec §3.6) and
//! the all-holders prefix query behind HTTP `/lookup`.
//!
//! Both start from the live holders of `hashes[0]` and narrow the candidate set one hash at a
//! time with a single map probe per hash, stopping as soon as no candidate remains. Read-only.

use super::chunks::{has, HolderId};
use super::registry::WorkerEntry;
use super::ChunkIndex;
use crate::protocol::ChunkHash;

/// The holder a P2P lookup chose, borrowed from the index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct P2PHit<'a> {
    /// Instance of the holding worker.
    pub instance_id: &'a str,
    /// Worker id (TP rank) of the holding worker.
    pub worker_id: i64,
    /// Location (backend) holding the chunks.
    pub location: &'a str,
    /// Length of the prefix of the requested hashes that this holder has (≥ 1).
    pub num_hit_chunks: usize,
    /// Where the requester connects to fetch the chunks.
    pub peer_init_url: &'a str,
}

/// One holder of a prefix, borrowed from the index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixHolder<'a> {
    /// Instance of the holding worker.
    pub instance_id: &'a str,
    /// Worker id of the holding worker.
    pub worker_id: i64,
    /// Location (backend) holding the chunks.
    pub location: &'a str,
    /// The worker's P2P address, if it has one.
    pub peer_init_url: Option<&'a str>,
    /// Length of the consecutive prefix of the query this holder has (≥ 1).
    pub matched: usize,
}

/// Candidate holder ids: on the stack up to `N`, spilling to the heap beyond.
struct Candidates<const N: usize> {
    stack: [HolderId; N],
    len: usize,
    heap: Vec<HolderId>,
}

impl<const N: usize> Candidates<N> {
    fn new() -> Self {
        Candidates {
            stack: [0; N],
            len: 0,
            heap: Vec::new(),
        }
    }

    fn push(&mut self, h: HolderId) {
        if self.heap.is_empty() && self.len < N {
            self.stack[self.len] = h;
            self.len += 1;
        } else {
            if self.heap.is_empty() {
                self.heap.extend_from_slice(&self.stack[..self.len]);
            }
            self.heap.push(h);
        }
    }

    fn as_mut_slice(&mut self) -> &mut [HolderId] {
        if self.heap.is_empty() {
            &mut self.stack[..self.len]
        } else {
            &mut self.heap
        }
    }
}

/// Moves the elements satisfying `keep` to the front and returns how many there are; the
/// others stay in the slice behind them.
fn partition(items: &mut [HolderId], mut keep: impl FnMut(HolderId) -> bool) -> usize {
    let mut kept = 0;
    for i in 0..items.len() {
        if keep(items[i]) {
            items.swap(kept, i);
            kept += 1;
        }
    }
    kept
}

impl ChunkIndex {
    /// Handles `BatchedP2PLookupMsg`: the holder with the longest consecutive prefix of
    /// `hashes`, among live holders of `hashes[0]` that are outside `requester_instance` and
    /// have a `peer_init_url`. Ties go to a worker with `worker_id == requester_worker_id`
    /// (same TP rank, LMCache issue #2405), then to registration order (instance, worker,
    /// location). `None` for empty `hashes` or no candidate (the wire's `("", "", 0, "")`).
    pub fn p2p_lookup(
        &self,
        hashes: &[ChunkHash],
        requester_instance: &str,
        requester_worker_id: i64,
    ) -> Option<P2PHit<'_>> {
        let (&first, rest) = hashes.split_first()?;
        let excluded = self.reg.instance_slot(requester_instance);
        let mut cands = Candidates::<16>::new();
        for h in self.chunks.live_holders(first) {
            let Some(w) = self.holder_worker(h) else {
                continue;
            };
            if w.peer_init_url.is_some() && Some(w.instance) != excluded {
                cands.push(h);
            }
        }
        let cands = cands.as_mut_slice();
        let mut alive = cands.len();
        if alive == 0 {
            return None;
        }
        let mut matched = 1;
        for &hash in rest {
            let members = self.chunks.members(hash);
            let kept = partition(&mut cands[..alive], |h| has(members, h));
            if kept == 0 {
                break;
            }
            alive = kept;
            matched += 1;
        }
        let (h, w) = cands[..alive]
            .iter()
            .filter_map(|&h| Some((h, self.holder_worker(h)?)))
            .min_by_key(|&(h, w)| {
                (
                    w.worker_id != requester_worker_id,
                    self.reg.order_key(w),
                    w.locations.iter().position(|l| l.holder == h),
                )
            })?;
        Some(P2PHit {
            instance_id: self.reg.instance(w.instance).map_or("", |i| &*i.name),
            worker_id: w.worker_id,
            location: w.location_of(h).map_or("", |l| &*l.name),
            num_hit_chunks: matched,
            peer_init_url: w.peer_init_url.as_deref().unwrap_or(""),
        })
    }

    /// Every live holder of `hashes[0]` (no exclusions) with the length of its consecutive
    /// prefix of `hashes`, in registration order (instance, worker, location). Empty for empty
    /// `hashes` or an unknown first hash.
    pub fn prefix_holders(&self, hashes: &[ChunkHash]) -> Vec<PrefixHolder<'_>> {
        let Some((&first, rest)) = hashes.split_first() else {
            return Vec::new();
        };
        let mut cands: Vec<(HolderId, usize)> =
            self.chunks.live_holders(first).map(|h| (h, 1)).collect();
        let mut alive = cands.len();
        for (i, &hash) in rest.iter().enumerate() {
            if alive == 0 {
                break;
            }
            let members = self.chunks.members(hash);
            let mut kept = 0;
            for j in 0..alive {
                if has(members, cands[j].0) {
                    cands[j].1 = i + 2;
                    cands.swap(kept, j);
                    kept += 1;
                }
            }
            alive = kept;
        }
        let mut out: Vec<((u64, u64, usize), PrefixHolder<'_>)> = cands
            .into_iter()
            .filter_map(|(h, matched)| {
                let w = self.holder_worker(h)?;
                let pos = w.locations.iter().position(|l| l.holder == h)?;
                let holder = PrefixHolder {
                    instance_id: self.reg.instance(w.instance).map_or("", |i| &*i.name),
                    worker_id: w.worker_id,
                    location: &w.locations[pos].name,
                    peer_init_url: w.peer_init_url.as_deref(),
                    matched,
                };
                let (is, ws) = self.reg.order_key(w);
                Some(((is, ws, pos), holder))
            })
            .collect();
        out.sort_by_key(|(key, _)| *key);
        out.into_iter().map(|(_, holder)| holder).collect()
    }

    /// The worker owning live holder `h`.
    fn holder_worker(&self, h: HolderId) -> Option<&WorkerEntry> {
        self.reg.worker(self.chunks.owner(h))
    }
}
