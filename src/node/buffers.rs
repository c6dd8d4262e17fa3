//! Object bodies: where a PUT's bytes are read to and live until evicted.
//!
//! A body of [`MAPPED_MIN`] bytes or more gets its own anonymous mapping of exactly its length
//! rounded up to whole pages, faulted in by the kernel in one call (`MAP_POPULATE`) instead of
//! one page fault per 4 KiB during the socket read. `malloc` would map the same bodies too
//! (they are above glibc's mmap threshold) but with a 16-byte header, so a 256 KiB body took
//! 65 pages, and it faulted them in one by one: 1.56% memory overhead and the largest single
//! cost of a PUT (docs/BENCHMARKS.md).
//!
//! When a body is dropped (evicted, deleted, replaced) its mapping goes back to a pool of
//! spare mappings, by page-rounded length, up to [`POOL_BYTES`] in all, so a node that is full
//! and evicting as it stores reuses memory that is already faulted in. Smaller bodies use the
//! ordinary heap.

use bytes::{Bytes, BytesMut};
use memmap2::{MmapMut, MmapOptions};
use parking_lot::Mutex;
use prometheus::IntGauge;
use std::collections::HashMap;
use std::sync::Arc;

/// Bodies of this many bytes or more get their own mapping.
pub(crate) const MAPPED_MIN: usize = 128 << 10;
/// Most bytes of spare mappings kept for reuse.
pub(crate) const POOL_BYTES: usize = 256 << 20;
const PAGE: usize = 4096;

/// Spare mappings by length (a multiple of [`PAGE`]).
#[derive(Default)]
struct Spare {
    by_len: HashMap<usize, Vec<MmapMut>>,
    bytes: usize,
}

/// Hands out body buffers and takes mappings back. Cheap to clone.
#[derive(Clone)]
pub(crate) struct BodyPool {
    spare: Arc<Mutex<Spare>>,
    /// Bytes of spare mappings (`node_body_pool_spare_bytes`).
    gauge: IntGauge,
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
    map: Option<MmapMut>,
    len: usize,
    pool: BodyPool,
}

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        self.map.as_ref().map_or(&[], |m| &m[..self.len])
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
    /// An empty pool whose spare bytes are shown by `gauge`.
    pub(crate) fn new(gauge: IntGauge) -> Self {
        BodyPool {
            spare: Arc::default(),
            gauge,
        }
    }

    /// A buffer for a body of exactly `len` bytes.
    pub(crate) fn take(&self, len: usize) -> BodyBuf {
        if len < MAPPED_MIN {
            return BodyBuf::Heap(BytesMut::zeroed(len), 0);
        }
        let rounded = len.div_ceil(PAGE) * PAGE;
        let reused = {
            let mut spare = self.spare.lock();
            let map = spare.by_len.get_mut(&rounded).and_then(Vec::pop);
            if map.is_some() {
                spare.bytes -= rounded;
                self.gauge.set(spare.bytes as i64);
            }
            map
        };
        let map = match reused {
            Some(m) => Some(m),
            None => MmapOptions::new().len(rounded).populate().map_anon().ok(),
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

    fn give_back(&self, map: MmapMut) {
        let mut spare = self.spare.lock();
        if spare.bytes + map.len() <= POOL_BYTES {
            spare.bytes += map.len();
            self.gauge.set(spare.bytes as i64);
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
                m.map.as_mut().map_or(&mut [], |map| &mut map[*filled..len])
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

    fn test_pool() -> BodyPool {
        BodyPool::new(IntGauge::new("spare", "spare").expect("gauge"))
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
        assert_eq!(pool.gauge.get(), 256 << 10);
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
}
