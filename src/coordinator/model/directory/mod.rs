//! The key directory (LMCache 0.5.6's `KeyDirectory`, `/directory/*`): for every key some
//! server reported, which servers hold it on which tier and backend (its *placements*), how
//! often it was read, and the chunk's token ids; plus the CacheBlend content index
//! ([`super::blend`]). Built from the admitted event stream, L1 and L2 alike (the model's
//! usage view is separate); a restarted server's L1 placements are fenced, L2 ones stay.
//!
//! Compact: a key is a 48-byte [`DirKey`] (hash inline, interned model, salt, kv_rank,
//! group) in a segmented slab with its placements (24 bytes each: interned instance and
//! backend, incarnation, size), reached through 256 hash tables of slot indices (no resize
//! moves more than 1/256 of the keys). Token ids are `u32`, kept **once per chunk hash**
//! (shared by every rank and object group of the chunk) with the slots of the keys sharing
//! them. Bounded: at most `max_keys` keys and `max_token_ids` token ids; names (instances,
//! backends, salts) interned within limits; whatever a limit keeps out is counted
//! ([`DirCounters`]). Pure: no I/O, no clock.

use super::blend::{self, BlendIndex, Namespace};
pub(crate) use super::chunk_hash::Hash32;
use super::events::{Batch, Op, Tier};
use super::keys::EncodedKey;
use super::tokens::UNKNOWN_OFFSET;
use hashbrown::{DefaultHashBuilder, HashMap, HashTable};
use indexmap::{IndexMap, IndexSet};
use serde::{Deserialize, Serialize};
use std::hash::BuildHasher;

mod names;
use names::Names;

const SEGMENT: usize = 4096;
const SHARDS: usize = 256;
/// Most token ids the directory keeps over all chunks (1 GiB as `u32`: 1 Mi chunks of 256
/// tokens); a chunk beyond is kept without its tokens (`tokens_refused`).
pub(crate) const MAX_TOKEN_IDS: usize = 256 << 20;

/// Limits of the directory.
#[derive(Clone, Debug, PartialEq)]
pub struct DirectoryConfig {
    /// Most keys.
    pub max_keys: usize,
    /// Most token ids over all chunks.
    pub max_token_ids: usize,
    /// Most distinct instance ids, backends and salts (each).
    pub max_names: usize,
    /// `--enable-blend-lookup`: `(chunk_size, probe_stride)`.
    pub blend: Option<(usize, usize)>,
}

/// What the directory's limits kept out (monotonic), and its live totals.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirCounters {
    /// New keys not kept at `max_keys`.
    pub keys_refused: u64,
    /// Keys that do not fit the compact form (hash > 32 bytes, rank, group, bad hex).
    pub keys_rejected: u64,
    /// Placements not kept because a name table was full.
    pub names_refused: u64,
    /// Chunks whose token ids were not kept at `max_token_ids`.
    pub tokens_refused: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct DirKey {
    hash: Hash32,
    group: u8,
    model: u16,
    salt: u32,
    kv_rank: u32,
}

impl DirKey {
    fn namespace(&self) -> Namespace {
        (self.model, self.salt, (self.kv_rank >> 24) as u8)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Placement {
    incarnation: u64,
    size: u64,
    instance: u32,
    backend: u16,
    tier: Tier,
    shared: bool,
}

#[derive(Debug)]
struct KeyRecord {
    key: DirKey,
    access: u32,
    placements: Vec<Placement>,
}

#[derive(Debug, Default)]
struct Binding {
    tokens: Box<[u32]>,
    offset: i64,
    /// Slots of the keys of this chunk.
    keys: Vec<u32>,
}

/// The directory.
#[derive(Debug)]
pub struct Directory {
    config: DirectoryConfig,
    segments: Vec<Vec<KeyRecord>>,
    free: Vec<u32>,
    live: usize,
    tables: Vec<HashTable<u32>>,
    bindings: Vec<HashMap<Hash32, Binding>>,
    hasher: DefaultHashBuilder,
    token_ids: usize,
    models: IndexSet<String>,
    salts: Names,
    instances: Names,
    backends: Names,
    /// Instance → L1 key slots, in first-report order.
    l1: IndexMap<u32, hashbrown::HashSet<u32>>,
    totals: [(usize, u64); 2],
    blend: Option<BlendIndex>,
    /// What the limits kept out.
    pub counters: DirCounters,
}

fn tier_index(t: Tier) -> usize {
    match t {
        Tier::L1 => 0,
        Tier::L2 => 1,
    }
}

impl Directory {
    /// An empty directory.
    pub fn new(config: DirectoryConfig) -> Self {
        Directory {
            segments: Vec::new(),
            free: Vec::new(),
            live: 0,
            tables: (0..SHARDS).map(|_| HashTable::new()).collect(),
            bindings: (0..SHARDS).map(|_| HashMap::new()).collect(),
            hasher: DefaultHashBuilder::default(),
            token_ids: 0,
            models: IndexSet::new(),
            salts: Names::new(config.max_names),
            instances: Names::new(config.max_names),
            backends: Names::new(usize::from(u16::MAX).min(config.max_names)),
            l1: IndexMap::new(),
            totals: [(0, 0); 2],
            blend: config.blend.map(|(c, _)| BlendIndex::new(c)),
            counters: DirCounters::default(),
            config,
        }
    }

    /// The limits.
    pub fn config(&self) -> &DirectoryConfig {
        &self.config
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.live
    }

    /// True when no key is held.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Token ids held (over all chunks).
    pub fn token_ids(&self) -> usize {
        self.token_ids
    }

    fn rec(&self, slot: u32) -> &KeyRecord {
        &self.segments[slot as usize / SEGMENT][slot as usize % SEGMENT]
    }

    fn rec_mut(&mut self, slot: u32) -> &mut KeyRecord {
        &mut self.segments[slot as usize / SEGMENT][slot as usize % SEGMENT]
    }

    fn shard(h: u64) -> usize {
        (h >> 56) as usize % SHARDS
    }

    fn find(&self, key: &DirKey) -> Option<u32> {
        let h = self.hasher.hash_one(key);
        self.tables[Self::shard(h)]
            .find(h, |&s| self.rec(s).key == *key)
            .copied()
    }

    fn binding(&self, hash: &Hash32) -> Option<&Binding> {
        let h = self.hasher.hash_one(hash);
        self.bindings[Self::shard(h)].get(hash)
    }

    fn binding_mut(&mut self, hash: &Hash32) -> Option<&mut Binding> {
        let h = self.hasher.hash_one(hash);
        self.bindings[Self::shard(h)].get_mut(hash)
    }

    /// A wire key in compact form without interning (`None`: never stored).
    fn lookup_key(&self, k: &EncodedKey) -> Option<DirKey> {
        Some(DirKey {
            hash: Hash32::parse(&k.chunk_hash_hex)?,
            group: u8::try_from(k.object_group_id).ok()?,
            model: u16::try_from(self.models.get_index_of(k.model_name.as_str())?).ok()?,
            salt: self.salts.get(&k.cache_salt)?,
            kv_rank: u32::try_from(k.kv_rank).ok()?,
        })
    }

    fn encode(&self, k: &DirKey) -> EncodedKey {
        EncodedKey {
            chunk_hash_hex: k.hash.hex(),
            model_name: self
                .models
                .get_index(usize::from(k.model))
                .cloned()
                .unwrap_or_default(),
            kv_rank: i64::from(k.kv_rank),
            object_group_id: i64::from(k.group),
            cache_salt: self.salts.name(k.salt).to_owned(),
        }
    }

    fn view(&self, p: &Placement) -> PlacementView {
        PlacementView {
            instance_id: self.instances.name(p.instance).to_owned(),
            incarnation: p.incarnation,
            tier: p.tier,
            backend: self.backends.name(u32::from(p.backend)).to_owned(),
            size_bytes: p.size,
            shared: p.shared,
        }
    }

    fn sorted_views(
        &self,
        ps: &[Placement],
        keep: impl Fn(&Placement) -> bool,
    ) -> Vec<PlacementView> {
        let mut v: Vec<PlacementView> = ps
            .iter()
            .filter(|p| keep(p))
            .map(|p| self.view(p))
            .collect();
        v.sort_by(|a, b| {
            (a.instance_id.as_str(), a.tier, a.backend.as_str()).cmp(&(
                b.instance_id.as_str(),
                b.tier,
                b.backend.as_str(),
            ))
        });
        v
    }

    /// Applies one admitted batch (or slice): placements of its stores and deletes, access
    /// counts, then its chunks' token ids. Every batch (a `config` one too) lists its sender
    /// among the instances reporting L1 keys, as 0.5.6 does.
    pub fn apply(&mut self, b: &Batch) {
        let Some(inst) = self.instances.intern(&b.instance_id) else {
            self.counters.names_refused += b.ops.len() as u64;
            return;
        };
        if !self.l1.contains_key(&inst) {
            self.instances.hold(inst);
            self.l1.insert(inst, hashbrown::HashSet::new());
        }
        let backend = self.backends.intern(&b.backend);
        // Held while the batch applies: a delete that drops the backend's last placement must
        // not free the name a later store of the batch uses.
        if let Some(x) = backend {
            self.backends.hold(x);
        }
        // The model records a batch of stores tail first (its LRU); the directory keeps the
        // sender's order, as 0.5.6 lists keys in the order they were first stored.
        let all_stores = b.ops.iter().all(|op| matches!(op, Op::Store(..)));
        let ops: Box<dyn Iterator<Item = &Op>> = if all_stores {
            Box::new(b.ops.iter().rev())
        } else {
            Box::new(b.ops.iter())
        };
        for op in ops {
            match op {
                Op::Store(key, size) => {
                    let Some(backend) = backend.and_then(|x| u16::try_from(x).ok()) else {
                        self.counters.names_refused += 1;
                        continue;
                    };
                    let p = Placement {
                        incarnation: b.incarnation,
                        size: *size,
                        instance: inst,
                        backend,
                        tier: b.tier,
                        shared: b.shared,
                    };
                    self.store(key, p);
                }
                Op::Delete(key) => self.delete(key, inst, b),
                Op::Access(key) => {
                    if let Some(slot) = self.lookup_key(key).and_then(|k| self.find(&k)) {
                        let r = self.rec_mut(slot);
                        r.access = r.access.saturating_add(1);
                    }
                }
            }
        }
        self.instances.release_if_unused(inst);
        if let Some(x) = backend {
            self.backends.release(x);
        }
        for t in &b.tokens {
            self.bind_tokens(t);
        }
    }

    fn same(p: &Placement, q: &Placement) -> bool {
        p.shared == q.shared
            && (p.shared || p.instance == q.instance)
            && p.tier == q.tier
            && p.backend == q.backend
    }

    fn store(&mut self, key: &EncodedKey, p: Placement) {
        let slot = match self.intern_key(key) {
            Some(s) => s,
            None => return,
        };
        self.instances.hold(p.instance);
        self.backends.hold(u32::from(p.backend));
        let r = self.rec_mut(slot);
        let old = match r.placements.iter().position(|q| Self::same(q, &p)) {
            Some(i) => Some(std::mem::replace(&mut r.placements[i], p)),
            None => {
                r.placements.push(p);
                None
            }
        };
        let t = &mut self.totals[tier_index(p.tier)];
        t.1 += p.size;
        if let Some(o) = old {
            t.1 -= o.size;
            self.instances.release(o.instance);
            self.backends.release(u32::from(o.backend));
        } else {
            t.0 += 1;
        }
        if p.tier == Tier::L1 {
            if let Some(set) = self.l1.get_mut(&p.instance) {
                set.insert(slot);
            }
        }
    }

    fn delete(&mut self, key: &EncodedKey, inst: u32, b: &Batch) {
        let Some(slot) = self.lookup_key(key).and_then(|k| self.find(&k)) else {
            return;
        };
        let Some(backend) = self
            .backends
            .get(&b.backend)
            .and_then(|x| u16::try_from(x).ok())
        else {
            return;
        };
        let probe = Placement {
            incarnation: 0,
            size: 0,
            instance: inst,
            backend,
            tier: b.tier,
            shared: b.shared,
        };
        let r = self.rec_mut(slot);
        if let Some(i) = r.placements.iter().position(|q| Self::same(q, &probe)) {
            let gone = r.placements.swap_remove(i);
            self.drop_placement(&gone);
        }
        if b.tier == Tier::L1 {
            let still = self
                .rec(slot)
                .placements
                .iter()
                .any(|p| p.tier == Tier::L1 && p.instance == inst);
            if !still {
                if let Some(set) = self.l1.get_mut(&inst) {
                    set.remove(&slot);
                }
            }
        }
        if self.rec(slot).placements.is_empty() {
            self.remove_key(slot);
        }
    }

    fn drop_placement(&mut self, p: &Placement) {
        let t = &mut self.totals[tier_index(p.tier)];
        t.0 -= 1;
        t.1 -= p.size;
        self.instances.release(p.instance);
        self.backends.release(u32::from(p.backend));
    }

    /// The slot of `key`, created (with its chunk's binding) if new; `None` when it cannot
    /// be kept (counted).
    fn intern_key(&mut self, key: &EncodedKey) -> Option<u32> {
        let (Some(hash), Ok(group), Ok(kv_rank)) = (
            Hash32::parse(&key.chunk_hash_hex),
            u8::try_from(key.object_group_id),
            u32::try_from(key.kv_rank),
        ) else {
            self.counters.keys_rejected += 1;
            return None;
        };
        if let Some(k) = self.lookup_key(key) {
            if let Some(slot) = self.find(&k) {
                return Some(slot);
            }
        }
        if self.live >= self.config.max_keys {
            self.counters.keys_refused += 1;
            return None;
        }
        let model = match self.models.get_index_of(key.model_name.as_str()) {
            Some(m) => m,
            None if self.models.len() <= usize::from(u16::MAX) => {
                self.models.insert_full(key.model_name.clone()).0
            }
            None => {
                self.counters.names_refused += 1;
                return None;
            }
        };
        let Some(salt) = self.salts.intern(&key.cache_salt) else {
            self.counters.names_refused += 1;
            return None;
        };
        self.salts.hold(salt);
        let k = DirKey {
            hash,
            group,
            model: u16::try_from(model).ok()?,
            salt,
            kv_rank,
        };
        let rec = KeyRecord {
            key: k,
            access: 0,
            placements: Vec::with_capacity(1),
        };
        let slot = match self.free.pop() {
            Some(s) => {
                *self.rec_mut(s) = rec;
                s
            }
            None => {
                if self.segments.last().is_none_or(|s| s.len() == SEGMENT) {
                    self.segments.push(Vec::with_capacity(SEGMENT));
                }
                let n = (self.segments.len() - 1) * SEGMENT;
                let last = self.segments.last_mut()?;
                last.push(rec);
                u32::try_from(n + last.len() - 1).ok()?
            }
        };
        self.live += 1;
        let h = self.hasher.hash_one(k);
        let segments = &self.segments;
        self.tables[Self::shard(h)].insert_unique(h, slot, |&s| {
            self.hasher
                .hash_one(segments[s as usize / SEGMENT][s as usize % SEGMENT].key)
        });
        self.join_binding(slot, k);
        Some(slot)
    }

    fn remove_key(&mut self, slot: u32) {
        let k = self.rec(slot).key;
        let h = self.hasher.hash_one(k);
        if let Ok(e) = self.tables[Self::shard(h)].find_entry(h, |&s| s == slot) {
            e.remove();
        }
        self.leave_binding(slot, k);
        self.salts.release(k.salt);
        let r = self.rec_mut(slot);
        r.placements = Vec::new();
        self.free.push(slot);
        self.live -= 1;
    }

    fn indexed(&self, b: &Binding) -> bool {
        self.blend
            .as_ref()
            .is_some_and(|x| x.indexable(&b.tokens, b.offset))
    }

    fn ns_held(&self, b: &Binding, ns: Namespace, except: u32) -> bool {
        b.keys
            .iter()
            .any(|&s| s != except && self.rec(s).key.namespace() == ns)
    }

    fn join_binding(&mut self, slot: u32, k: DirKey) {
        let h = self.hasher.hash_one(k.hash);
        let b = self.bindings[Self::shard(h)]
            .entry(k.hash)
            .or_insert_with(|| Binding {
                offset: UNKNOWN_OFFSET,
                ..Binding::default()
            });
        b.keys.push(slot);
        let Some(b) = self.binding(&k.hash) else {
            return;
        };
        let claim = self.indexed(b) && !self.ns_held(b, k.namespace(), slot);
        if claim {
            if let Some(x) = self.blend.as_mut() {
                x.claim(k.namespace(), true);
            }
        }
    }

    fn leave_binding(&mut self, slot: u32, k: DirKey) {
        let Some(b) = self.binding(&k.hash) else {
            return;
        };
        let unclaim = self.indexed(b) && !self.ns_held(b, k.namespace(), slot);
        let last = b.keys.len() <= 1;
        if unclaim {
            if let Some(x) = self.blend.as_mut() {
                x.claim(k.namespace(), false);
            }
        }
        if last {
            let h = self.hasher.hash_one(k.hash);
            if let Some(b) = self.bindings[Self::shard(h)].remove(&k.hash) {
                self.token_ids -= b.tokens.len();
                if let Some(x) = self.blend.as_mut() {
                    if x.indexable(&b.tokens, b.offset) {
                        x.remove(&b.tokens, k.hash);
                    }
                }
            }
        } else if let Some(b) = self.binding_mut(&k.hash) {
            if let Some(i) = b.keys.iter().position(|&s| s == slot) {
                b.keys.swap_remove(i);
            }
        }
    }

    /// Sets a chunk's token ids (a chunk no kept key has is skipped, as in 0.5.6).
    fn bind_tokens(&mut self, t: &super::tokens::ChunkTokens) {
        let Some(hash) = Hash32::parse(&t.chunk_hash_hex) else {
            return;
        };
        let Some(b) = self.binding(&hash) else { return };
        if *b.tokens == t.token_ids[..] && b.offset == t.token_offset {
            return;
        }
        let was_indexed = self.indexed(b);
        let grow = t.token_ids.len().saturating_sub(b.tokens.len());
        if self.token_ids + grow > self.config.max_token_ids {
            self.counters.tokens_refused += 1;
            return;
        }
        let namespaces = self.namespaces_of(b);
        if was_indexed {
            let old = b.tokens.clone();
            if let Some(x) = self.blend.as_mut() {
                x.remove(&old, hash);
                namespaces.iter().for_each(|&ns| x.claim(ns, false));
            }
        }
        let Some(b) = self.binding_mut(&hash) else {
            return;
        };
        let old_len = b.tokens.len();
        b.tokens = t.token_ids.clone().into_boxed_slice();
        b.offset = t.token_offset;
        self.token_ids = self.token_ids - old_len + t.token_ids.len();
        let Some(b) = self.binding(&hash) else { return };
        if self.indexed(b) {
            if let Some(x) = self.blend.as_mut() {
                x.add(&t.token_ids, hash);
                namespaces.iter().for_each(|&ns| x.claim(ns, true));
            }
        }
    }

    fn namespaces_of(&self, b: &Binding) -> Vec<Namespace> {
        let mut v: Vec<Namespace> = b
            .keys
            .iter()
            .map(|&s| self.rec(s).key.namespace())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// A server restarted or left: its L1 placements go (L2 ones stay), and it leaves the
    /// list of instances reporting L1 keys.
    pub fn fence(&mut self, instance_id: &str) {
        let Some(inst) = self.instances.get(instance_id) else {
            return;
        };
        let Some(slots) = self.l1.shift_remove(&inst) else {
            return;
        };
        for slot in slots {
            let r = self.rec_mut(slot);
            let (gone, kept): (Vec<Placement>, Vec<Placement>) = r
                .placements
                .iter()
                .partition(|p| p.tier == Tier::L1 && p.instance == inst);
            r.placements = kept;
            for p in &gone {
                self.drop_placement(p);
            }
            if self.rec(slot).placements.is_empty() {
                self.remove_key(slot);
            }
        }
        self.instances.release(inst);
    }
}

mod read;
pub(crate) use read::{KeyFilter, PlacementView, Scan};

mod dump;
pub(crate) use dump::DirectoryDump;

#[cfg(test)]
mod tests;
