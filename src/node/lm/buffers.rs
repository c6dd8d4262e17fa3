//! Object bodies: where a PUT's bytes are read to and live until evicted.
//!
//! A body of [`MAPPED_MIN`] bytes or more gets its own anonymous mapping of exactly its length
//! rounded up to whole pages, faulted in by the kernel in one call (`MAP_POPULATE`) instead of
//! one page fault per 4 KiB during the socket read. `malloc` would map the same bodies too
//! (they are above glibc's mmap threshold) but with a 16-byte header, so a 256 KiB body took
//! 65 pages, and it faulted them in one by one: 1.56% memory overhead and the largest single
//! cost of a PUT (docs/BENCHMARKS.md).
//!
//! With `--l1-preallocate` a new mapping is first carved from the memory faulted in at start
//! (`arena.rs`), so fresh PUTs run at the speed of a bare copy; once that is handed out,
//! bodies get mappings of their own as above.
//!
//! When a body is dropped (evicted, deleted, replaced) its mapping goes back to a pool of
//! spare mappings, by page-rounded length, up to [`POOL_BYTES`] in all, so a node that is full
//! and evicting as it stores reuses memory that is already faulted in. Smaller bodies use the
//! ordinary heap. Where each body's memory came from is counted
//! (`kvplane_node_body_buffers_total{source}`).

use super::arena::{Arena, Region, PAGE};
use bytes::{Bytes, BytesMut};
use memmap2::{MmapMut, MmapOptions};
use parking_lot::Mutex;
use prometheus::{IntCounterVec, IntGauge};
use std::collections::HashMap;
use std::sync::Arc;

/// Bodies of this many bytes or more get their own mapping.
pub(crate) const MAPPED_MIN: usize = 128 << 10;
/// Most bytes of spare mappings kept for reuse.
pub(crate) const POOL_BYTES: usize = 256 << 20;

/// The pages of one body: a mapping of its own, or a range of the preallocation.
enum Pages {
    Own(MmapMut),
    Carved(Region),
}

impl Pages {
    fn len(&self) -> usize {
        match self {
            Pages::Own(m) => m.len(),
            Pages::Carved(r) => r.len(),
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Pages::Own(m) => m,
            Pages::Carved(r) => r.as_slice(),
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Pages::Own(m) => m,
            Pages::Carved(r) => r.as_mut_slice(),
        }
    }
}

/// Spare mappings by length (a multiple of [`PAGE`]).
#[derive(Default)]
struct Spare {
    by_len: HashMap<usize, Vec<Pages>>,
    bytes: usize,
}

/// What the pool reports: spare bytes, preallocated bytes not handed out yet, and where each
/// body's memory came from (`preallocated`, `reused`, `mapped`, `heap`).
#[derive(Clone)]
pub(crate) struct PoolGauges {
    /// `node_body_pool_spare_bytes`.
    pub(crate) spare: IntGauge,
    /// `node_l1_preallocated_unused_bytes`.
    pub(crate) preallocated_unused: IntGauge,
    /// `node_body_buffers_total{source}`.
    pub(crate) sources: IntCounterVec,
}

/// Hands out body buffers and takes mappings back. Cheap to clone.
#[derive(Clone)]
pub(crate) struct BodyPool {
    spare: Arc<Mutex<Spare>>,
    arena: Option<Arc<Arena>>,
    gauges: PoolGauges,
}

/// A body being filled: write into [`BodyBuf::unfilled`], then [`BodyBuf::advance`].
pub(crate) enum BodyBuf {
    /// A small body on the heap.
    Heap(BytesMut, usize),
    /// A large body in its own mapping.
    Mapped(Mapped, usize),
}

/// A mapping holding one body; returns itself to its pool when dropped.
pub(crate) struct Mapped {
    map: Option<Pages>,
    len: usize,
    pool: BodyPool,
}

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        self.map.as_ref().map_or(&[], |m| &m.bytes()[..self.len])
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if let Some(map) = self.map.take() {
            self.pool.give_back(map);
        }
    }
}

impl BodyPool {
    /// An empty pool, carving new mappings from `arena` (the preallocation) while it lasts.
    pub(crate) fn new(gauges: PoolGauges, arena: Option<Arena>) -> Self {
        gauges
            .preallocated_unused
            .set(arena.as_ref().map_or(0, |a| a.unused() as i64));
        BodyPool {
            spare: Arc::default(),
            arena: arena.map(Arc::new),
            gauges,
        }
    }

    fn count(&self, source: &str) {
        self.gauges.sources.with_label_values(&[source]).inc();
    }

    /// A buffer for a body of exactly `len` bytes.
    pub(crate) fn take(&self, len: usize) -> BodyBuf {
        if len < MAPPED_MIN {
            self.count("heap");
            return BodyBuf::Heap(BytesMut::zeroed(len), 0);
        }
        let rounded = len.div_ceil(PAGE) * PAGE;
        let reused = {
            let mut spare = self.spare.lock();
            let map = spare.by_len.get_mut(&rounded).and_then(Vec::pop);
            if map.is_some() {
                spare.bytes -= rounded;
                self.gauges.spare.set(spare.bytes as i64);
            }
            map
        };
        let map = if let Some(m) = reused {
            self.count("reused");
            Some(m)
        } else if let Some(r) = self.arena.as_ref().and_then(|a| a.carve(rounded)) {
            self.count("preallocated");
            if let Some(a) = &self.arena {
                self.gauges.preallocated_unused.set(a.unused() as i64);
            }
            Some(Pages::Carved(r))
        } else {
            let m = MmapOptions::new().len(rounded).populate().map_anon().ok();
            self.count(if m.is_some() { "mapped" } else { "heap" });
            m.map(Pages::Own)
        };
        match map {
            Some(map) => BodyBuf::Mapped(
                Mapped {
                    map: Some(map),
                    len,
                    pool: self.clone(),
                },
                0,
            ),
            // Out of mappings (vm.max_map_count): the heap still works.
            None => BodyBuf::Heap(BytesMut::zeroed(len), 0),
        }
    }

    /// Bytes of spare mappings held for reuse.
    #[cfg(test)]
    fn spare_bytes(&self) -> usize {
        self.spare.lock().bytes
    }

    fn give_back(&self, map: Pages) {
        let mut spare = self.spare.lock();
        if spare.bytes + map.len() <= POOL_BYTES {
            spare.bytes += map.len();
            self.gauges.spare.set(spare.bytes as i64);
            spare.by_len.entry(map.len()).or_default().push(map);
        }
    }
}

impl BodyBuf {
    /// The part not yet written.
    pub(crate) fn unfilled(&mut self) -> &mut [u8] {
        match self {
            BodyBuf::Heap(b, filled) => &mut b[*filled..],
            BodyBuf::Mapped(m, filled) => {
                let len = m.len;
                m.map
                    .as_mut()
                    .map_or(&mut [], |map| &mut map.bytes_mut()[*filled..len])
            }
        }
    }

    /// Marks `n` more bytes written.
    pub(crate) fn advance(&mut self, n: usize) {
        match self {
            BodyBuf::Heap(_, filled) | BodyBuf::Mapped(_, filled) => *filled += n,
        }
    }

    /// Whether every byte has been written.
    pub(crate) fn is_full(&self) -> bool {
        match self {
            BodyBuf::Heap(b, filled) => *filled >= b.len(),
            BodyBuf::Mapped(m, filled) => *filled >= m.len,
        }
    }

    /// The finished body, shared without a copy.
    pub(crate) fn freeze(self) -> Bytes {
        match self {
            BodyBuf::Heap(b, _) => b.freeze(),
            BodyBuf::Mapped(m, _) => Bytes::from_owner(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gauges() -> PoolGauges {
        PoolGauges {
            spare: IntGauge::new("spare", "spare").expect("gauge"),
            preallocated_unused: IntGauge::new("unused", "unused").expect("gauge"),
            sources: IntCounterVec::new(prometheus::Opts::new("src", "src"), &["source"])
                .expect("counter"),
        }
    }

    fn test_pool() -> BodyPool {
        BodyPool::new(gauges(), None)
    }

    fn fill(pool: &BodyPool, len: usize, byte: u8) -> Bytes {
        let mut b = pool.take(len);
        while !b.is_full() {
            let part = b.unfilled();
            let n = part.len().min(10_000);
            part[..n].fill(byte);
            b.advance(n);
        }
        b.freeze()
    }

    #[test]
    fn small_and_large_bodies_hold_exactly_what_was_written() {
        let pool = test_pool();
        for len in [0, 1, MAPPED_MIN - 1, MAPPED_MIN, MAPPED_MIN + 1, 2 << 20] {
            let b = fill(&pool, len, 7);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 7));
        }
    }

    #[test]
    fn a_dropped_mapping_is_reused_and_the_pool_is_bounded() {
        let pool = test_pool();
        let a = fill(&pool, 256 << 10, 1);
        assert_eq!(pool.spare_bytes(), 0);
        let clone = a.clone();
        drop(a);
        assert_eq!(pool.spare_bytes(), 0, "a clone still holds it");
        drop(clone);
        assert_eq!(pool.spare_bytes(), 256 << 10);
        assert_eq!(pool.gauges.spare.get(), 256 << 10);
        // Same page-rounded length: taken from the pool, old bytes overwritten.
        let b = fill(&pool, (256 << 10) - 100, 2);
        assert_eq!(pool.spare_bytes(), 0);
        assert!(b.iter().all(|&x| x == 2));
        drop(b);
        let many: Vec<Bytes> = (0..(POOL_BYTES / (4 << 20)) + 4)
            .map(|_| fill(&pool, 4 << 20, 3))
            .collect();
        drop(many);
        assert!(pool.spare_bytes() <= POOL_BYTES);
    }

    #[test]
    fn a_slice_of_a_mapped_body_keeps_it_alive() {
        let pool = test_pool();
        let b = fill(&pool, 1 << 20, 9);
        let tail = b.slice(1000..);
        drop(b);
        assert_eq!(pool.spare_bytes(), 0);
        assert!(tail.iter().all(|&x| x == 9));
        drop(tail);
        assert_eq!(pool.spare_bytes(), 1 << 20);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn bodies_come_from_the_preallocation_until_it_is_used_up() {
        let arena = Arena::populate(5 << 20).expect("map");
        let pool = BodyPool::new(gauges(), Some(arena));
        assert_eq!(pool.gauges.preallocated_unused.get(), 5 << 20);
        let src = |s: &str| pool.gauges.sources.with_label_values(&[s]).get();
        let a = fill(&pool, 2 << 20, 1);
        let b = fill(&pool, (2 << 20) - 5, 2);
        assert_eq!(src("preallocated"), 2);
        assert_eq!(pool.gauges.preallocated_unused.get(), 1 << 20);
        // 2 MiB no longer fits in the 1 MiB left: a mapping of its own.
        let c = fill(&pool, 2 << 20, 3);
        assert_eq!(src("mapped"), 1);
        assert!(a.iter().all(|&x| x == 1) && b.iter().all(|&x| x == 2));
        assert!(c.iter().all(|&x| x == 3));
        // A freed preallocated range is reused like any spare mapping.
        drop(a);
        assert_eq!(pool.spare_bytes(), 2 << 20);
        let d = fill(&pool, 2 << 20, 4);
        assert_eq!(src("reused"), 1);
        assert!(d.iter().all(|&x| x == 4) && b.iter().all(|&x| x == 2));
        let _small = fill(&pool, 100, 5);
        assert_eq!(src("heap"), 1);
    }
}
