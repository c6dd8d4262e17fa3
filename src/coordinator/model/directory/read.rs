//! The key directory's read side: what `/directory/lookup`, `/directory/keys`,
//! `/directory/stats` and `/directory/blend-lookup` see, and the memory it holds.

use super::blend::{self, BlendIndex, BlendStats, Namespace};
use super::{Binding, DirKey, Directory, Hash32, KeyRecord, Placement};
use crate::coordinator::model::events::Tier;
use crate::coordinator::model::keys::EncodedKey;
use indexmap::IndexMap;
use serde::Serialize;

/// One placement as the routes show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlacementView {
    /// The reporting server (for a shared pool, the latest reporter).
    pub instance_id: String,
    /// Its incarnation when it reported.
    pub incarnation: u64,
    /// `l1` or `l2`.
    pub tier: Tier,
    /// The medium or adapter (`dram`, `fs`, …).
    pub backend: String,
    /// Bytes stored.
    pub size_bytes: u64,
    /// A fleet-shared pool.
    pub shared: bool,
}

/// What the directory knows of one key (`POST /directory/lookup`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyView {
    /// Placements by (instance, tier, backend).
    pub placements: Vec<PlacementView>,
    /// The chunk's token ids (empty: unknown).
    pub token_ids: Vec<u32>,
    /// Access events applied since the key appeared.
    pub access_count: u64,
}

/// `GET /directory/stats` (0.5.6's field order).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DirectoryStats {
    /// Keys with at least one placement.
    pub num_keys: usize,
    /// Placements over all keys.
    pub num_placements: usize,
    /// Keys each instance holds in L1, for every instance that reported since its last fence.
    pub l1_keys_by_instance: IndexMap<String, usize>,
    /// The blend index.
    pub blend: BlendStats,
    /// L1 placements.
    pub l1_count: usize,
    /// Their bytes.
    pub l1_size_bytes: u64,
    /// L2 placements.
    pub l2_count: usize,
    /// Their bytes.
    pub l2_size_bytes: u64,
}

/// `GET /directory/keys`'s filter.
#[derive(Clone, Debug, Default)]
pub struct KeyFilter {
    /// `None`: every tier.
    pub tier: Option<Tier>,
    /// Empty: every instance.
    pub instance_id: String,
    /// Empty: every backend.
    pub backend: String,
}

/// One listed key (`GET /directory/keys`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ListedKey {
    /// The key.
    pub key: EncodedKey,
    /// Its placements that match the filter.
    pub placements: Vec<PlacementView>,
    /// Token ids known for its chunk.
    pub num_tokens: usize,
    /// Access events applied.
    pub access_count: u64,
}

/// A paged scan in progress (run over several owner jobs).
#[derive(Debug, Default)]
pub struct Scan {
    /// Next slot to look at.
    pub next_slot: usize,
    /// Matching keys seen so far.
    pub total: usize,
    /// The page being filled.
    pub page: Vec<ListedKey>,
}

impl Directory {
    /// What the directory knows of each key, in order (unknown keys: empty).
    pub fn lookup(&self, keys: &[EncodedKey]) -> Vec<KeyView> {
        keys.iter()
            .map(|k| {
                let Some(slot) = self.lookup_key(k).and_then(|d| self.find(&d)) else {
                    // An unknown key still shows its chunk's tokens, as in 0.5.6.
                    let token_ids = Hash32::parse(&k.chunk_hash_hex)
                        .and_then(|h| self.binding(&h))
                        .map(|b| b.tokens.to_vec())
                        .unwrap_or_default();
                    return KeyView {
                        token_ids,
                        ..KeyView::default()
                    };
                };
                let r = self.rec(slot);
                KeyView {
                    placements: self.sorted_views(&r.placements, |_| true),
                    token_ids: self
                        .binding(&r.key.hash)
                        .map(|b| b.tokens.to_vec())
                        .unwrap_or_default(),
                    access_count: u64::from(r.access),
                }
            })
            .collect()
    }

    /// Each key followed by the kept keys that differ from it only in object group, by
    /// ascending group (0.5.6's token-addressed expansion); at most `max` keys in all.
    pub fn across_groups(&self, keys: Vec<EncodedKey>, max: usize) -> Vec<EncodedKey> {
        let mut out = Vec::with_capacity(keys.len());
        let mut room = max.saturating_sub(keys.len());
        for key in keys {
            let mut all = vec![key];
            if let Some(d) = self.lookup_key(&all[0]) {
                if let Some(b) = self.binding(&d.hash) {
                    for &s in &b.keys {
                        let o = self.rec(s).key;
                        if room > 0
                            && o.group != d.group
                            && (DirKey {
                                group: d.group,
                                ..o
                            }) == d
                        {
                            all.push(self.encode(&o));
                            room -= 1;
                        }
                    }
                }
            }
            all.sort_by_key(|k| k.object_group_id);
            out.extend(all);
        }
        out
    }

    /// Scans up to `budget` slots of a `GET /directory/keys` listing; returns true when the
    /// scan is complete. Order: slot order (insertion order until keys are deleted).
    pub fn scan(
        &self,
        f: &KeyFilter,
        offset: usize,
        limit: usize,
        budget: usize,
        st: &mut Scan,
    ) -> bool {
        let inst = if f.instance_id.is_empty() {
            None
        } else {
            match self.instances.get(&f.instance_id) {
                Some(i) => Some(i),
                None => return true,
            }
        };
        let backend = if f.backend.is_empty() {
            None
        } else {
            match self
                .backends
                .get(&f.backend)
                .and_then(|b| u16::try_from(b).ok())
            {
                Some(b) => Some(b),
                None => return true,
            }
        };
        let keep = |p: &Placement| {
            f.tier.is_none_or(|t| p.tier == t)
                && inst.is_none_or(|i| p.instance == i)
                && backend.is_none_or(|b| p.backend == b)
        };
        let end = self.segments.iter().map(Vec::len).sum::<usize>();
        let stop = (st.next_slot + budget).min(end);
        for slot in st.next_slot..stop {
            let r = self.rec(slot as u32);
            if !r.placements.iter().any(keep) {
                continue;
            }
            if st.total >= offset && st.page.len() < limit {
                st.page.push(ListedKey {
                    key: self.encode(&r.key),
                    placements: self.sorted_views(&r.placements, keep),
                    num_tokens: self.binding(&r.key.hash).map_or(0, |b| b.tokens.len()),
                    access_count: u64::from(r.access),
                });
            }
            st.total += 1;
        }
        st.next_slot = stop;
        stop >= end
    }

    /// `GET /directory/stats`.
    pub fn stats(&self) -> DirectoryStats {
        let [(l1c, l1b), (l2c, l2b)] = self.totals;
        DirectoryStats {
            num_keys: self.live,
            num_placements: l1c + l2c,
            l1_keys_by_instance: self
                .l1
                .iter()
                .map(|(&i, s)| (self.instances.name(i).to_owned(), s.len()))
                .collect(),
            blend: self
                .blend
                .as_ref()
                .map_or_else(blend::disabled_stats, BlendIndex::stats),
            l1_count: l1c,
            l1_size_bytes: l1b,
            l2_count: l2c,
            l2_size_bytes: l2b,
        }
    }

    /// Blend matches of a query in namespace (model, salt, world size): `(chunk hash hex,
    /// stored position, query position)`, ascending by query position, one per chunk.
    /// `probes` come from [`BlendIndex::probes`]. Empty without `--enable-blend-lookup`.
    pub fn blend_match(
        &self,
        query: &[u32],
        probes: &[(usize, u64)],
        ns: (&str, &str, u8),
    ) -> Vec<(String, i64, usize)> {
        let Some(x) = &self.blend else {
            return Vec::new();
        };
        let (Some(model), Some(salt)) = (
            self.models
                .get_index_of(ns.0)
                .and_then(|m| u16::try_from(m).ok()),
            self.salts.get(ns.1),
        ) else {
            return Vec::new();
        };
        let want: Namespace = (model, salt, ns.2);
        let w = x.chunk_size();
        let mut seen = hashbrown::HashSet::new();
        let mut out = Vec::new();
        for &(pos, fp) in probes {
            for h in x.holders(fp) {
                let Some(b) = self.binding(h) else { continue };
                if seen.contains(h) || !self.ns_held(b, want, u32::MAX) {
                    continue;
                }
                if query.get(pos..pos + w) != Some(&b.tokens[..]) {
                    break; // a fingerprint collision: the content differs
                }
                seen.insert(*h);
                out.push((h.hex(), b.offset, pos));
                break;
            }
        }
        out
    }

    /// Turns on the blend index (`--enable-blend-lookup`) and indexes the chunks already held
    /// (after a restore).
    pub fn enable_blend(&mut self, chunk_size: usize, probe_stride: usize) {
        let mut x = BlendIndex::new(chunk_size);
        for shard in &self.bindings {
            for (h, b) in shard {
                if x.indexable(&b.tokens, b.offset) {
                    x.add(&b.tokens, *h);
                    for ns in self.namespaces_of(b) {
                        x.claim(ns, true);
                    }
                }
            }
        }
        self.config.blend = Some((chunk_size, probe_stride));
        self.blend = Some(x);
    }

    /// Bytes allocated (slab, tables, bindings, tokens, names), from capacities.
    pub fn memory_bytes(&self) -> usize {
        let rec = std::mem::size_of::<KeyRecord>();
        let place = std::mem::size_of::<Placement>();
        let slab: usize = self
            .segments
            .iter()
            .flat_map(|s| s.iter())
            .map(|r| r.placements.capacity() * place)
            .sum::<usize>()
            + self
                .segments
                .iter()
                .map(|s| s.capacity() * rec)
                .sum::<usize>();
        let tables: usize = self.tables.iter().map(|t| t.capacity() * 5).sum();
        let bind = std::mem::size_of::<(Hash32, Binding)>() + 1;
        let bindings: usize = self
            .bindings
            .iter()
            .map(|m| {
                m.capacity() * bind
                    + m.values()
                        .map(|b| b.keys.capacity() * 4 + b.tokens.len() * 4)
                        .sum::<usize>()
            })
            .sum();
        slab + tables
            + bindings
            + self.free.capacity() * 4
            + self.blend.as_ref().map_or(0, BlendIndex::memory_bytes)
    }
}
