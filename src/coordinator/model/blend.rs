//! The CacheBlend content index (`--enable-blend-lookup`, `POST /directory/blend-lookup`):
//! which stored chunks' token content appears *anywhere* in a query, not only as its prefix.
//!
//! Each indexed chunk (its content exactly `--chunk-size` tokens long, its stored position
//! known) is filed under a 64-bit polynomial fingerprint of its tokens; a query is probed at
//! every `--blend-probe-stride`-th position with a rolling fingerprint of the window there,
//! and a candidate is confirmed token by token against the chunk's own content (kept once,
//! in the directory's binding). Claims — which namespaces (model, salt, world size) hold a
//! chunk — are counted here for `GET /directory/stats`; the directory decides them. Pure.

use super::chunk_hash::Hash32;
use hashbrown::HashMap;

/// The polynomial base (odd, so multiplication is a bijection mod 2^64).
const BASE: u64 = 0x9E37_79B9_7F4A_7C15;
/// Smallest occupancy-filter size 0.5.6 reports (`table_size`).
const MIN_TABLE: usize = 1 << 10;
/// Filter slots per content in 0.5.6 (`table_size` grows to 16 × contents).
const TABLE_GROWTH: usize = 16;

/// A namespace a chunk can be retrieved in: model index, salt index, world size.
pub(crate) type Namespace = (u16, u32, u8);

/// `GET /directory/stats`'s `blend` object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct BlendStats {
    /// Distinct contents indexed.
    pub num_contents: usize,
    /// Chunks indexed.
    pub num_chunks: usize,
    /// `(chunk, namespace)` claims over the indexed chunks.
    pub num_claims: usize,
    /// Namespaces holding indexed chunks.
    pub num_namespaces: usize,
    /// The occupancy-filter size 0.5.6 would report for as many contents.
    pub table_size: usize,
}

/// The fingerprint index.
#[derive(Debug)]
pub(crate) struct BlendIndex {
    chunk_size: usize,
    /// Fingerprint → the chunks holding that content, in first-indexed order.
    by_fingerprint: HashMap<u64, Vec<Hash32>>,
    chunks: usize,
    claims: HashMap<Namespace, u32>,
}

/// The fingerprint of `window` (its length is the chunk size).
pub(crate) fn fingerprint(window: &[u32]) -> u64 {
    window.iter().fold(0u64, |h, &t| {
        h.wrapping_mul(BASE).wrapping_add(u64::from(t))
    })
}

impl BlendIndex {
    /// An empty index matching windows of `chunk_size` tokens (the probe stride is the
    /// caller's: [`probes`](Self::probes)).
    pub(crate) fn new(chunk_size: usize) -> Self {
        BlendIndex {
            chunk_size: chunk_size.max(1),
            by_fingerprint: HashMap::new(),
            chunks: 0,
            claims: HashMap::new(),
        }
    }

    /// The match window.
    pub(crate) fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// Whether content of this length at this position can be indexed.
    pub(crate) fn indexable(&self, tokens: &[u32], offset: i64) -> bool {
        tokens.len() == self.chunk_size && offset >= 0
    }

    /// Files `chunk` under its content.
    pub(crate) fn add(&mut self, tokens: &[u32], chunk: Hash32) {
        let holders = self.by_fingerprint.entry(fingerprint(tokens)).or_default();
        if !holders.contains(&chunk) {
            holders.push(chunk);
            self.chunks += 1;
        }
    }

    /// Takes `chunk` out (its content was replaced or its last key went).
    pub(crate) fn remove(&mut self, tokens: &[u32], chunk: Hash32) {
        let fp = fingerprint(tokens);
        let Some(holders) = self.by_fingerprint.get_mut(&fp) else {
            return;
        };
        if let Some(i) = holders.iter().position(|h| *h == chunk) {
            holders.remove(i);
            self.chunks -= 1;
        }
        if holders.is_empty() {
            self.by_fingerprint.remove(&fp);
        }
    }

    /// One more (`up`) or one fewer indexed chunk claimed by `ns`.
    pub(crate) fn claim(&mut self, ns: Namespace, up: bool) {
        if up {
            *self.claims.entry(ns).or_default() += 1;
        } else if let Some(n) = self.claims.get_mut(&ns) {
            *n -= 1;
            if *n == 0 {
                self.claims.remove(&ns);
            }
        }
    }

    /// The probes of `query`: `(position, fingerprint of the window there)` at every
    /// `probe_stride`-th position (rolling, O(query)). Computed off the owner task.
    pub(crate) fn probes(
        chunk_size: usize,
        probe_stride: usize,
        query: &[u32],
    ) -> Vec<(usize, u64)> {
        let w = chunk_size.max(1);
        if query.len() < w {
            return Vec::new();
        }
        let top = (0..w - 1).fold(1u64, |p, _| p.wrapping_mul(BASE)); // BASE^(w-1)
        let mut h = fingerprint(&query[..w]);
        let mut out = Vec::with_capacity((query.len() - w) / probe_stride.max(1) + 1);
        for p in 0..=query.len() - w {
            if p > 0 {
                let gone = u64::from(query[p - 1]).wrapping_mul(top);
                h = h
                    .wrapping_sub(gone)
                    .wrapping_mul(BASE)
                    .wrapping_add(u64::from(query[p + w - 1]));
            }
            if p % probe_stride.max(1) == 0 {
                out.push((p, h));
            }
        }
        out
    }

    /// The chunks filed under `fp`, in first-indexed order.
    pub(crate) fn holders(&self, fp: u64) -> &[Hash32] {
        self.by_fingerprint.get(&fp).map_or(&[], Vec::as_slice)
    }

    /// The `blend` object of `GET /directory/stats`.
    pub(crate) fn stats(&self) -> BlendStats {
        let contents = self.by_fingerprint.len();
        BlendStats {
            num_contents: contents,
            num_chunks: self.chunks,
            num_claims: self.claims.values().map(|&n| n as usize).sum(),
            num_namespaces: self.claims.len(),
            table_size: table_size(contents),
        }
    }

    /// Bytes allocated (approximate: the two maps' buckets and the holder lists).
    pub(crate) fn memory_bytes(&self) -> usize {
        self.by_fingerprint.capacity() * (8 + 24 + 1)
            + self
                .by_fingerprint
                .values()
                .map(|v| v.capacity() * std::mem::size_of::<Hash32>())
                .sum::<usize>()
            + self.claims.capacity() * (16 + 1)
    }
}

/// 0.5.6's filter size for `contents` (the smallest power of two ≥ 16 × contents, ≥ 1024).
pub(crate) fn table_size(contents: usize) -> usize {
    MIN_TABLE.max((TABLE_GROWTH * contents).next_power_of_two())
}

/// The stats of a coordinator without `--enable-blend-lookup`.
pub(crate) fn disabled_stats() -> BlendStats {
    BlendStats {
        table_size: MIN_TABLE,
        ..BlendStats::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rolling_probes_equal_direct_fingerprints() {
        let q: Vec<u32> = (0..40).map(|i| i * 7 + 3).collect();
        for stride in [1, 3] {
            let p = BlendIndex::probes(8, stride, &q);
            assert_eq!(p.len(), (40 - 8) / stride + 1);
            for (pos, fp) in p {
                assert_eq!(pos % stride, 0);
                assert_eq!(fp, fingerprint(&q[pos..pos + 8]));
            }
        }
        assert!(BlendIndex::probes(8, 1, &q[..7]).is_empty());
        assert_eq!(table_size(0), 1024);
        assert_eq!(table_size(100), 2048);
    }
}
