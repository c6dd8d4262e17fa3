//! The prefix index: streams (one per registered `(instance, tenant, dp_rank)`), namespaces,
//! per-stream engine-hash maps, tier memberships, capacity and TTL, and the `/query` walk.
//!
//! Engine hashes are not trusted (spec §3.4): a block is indexed under the standard rolling
//! hash recomputed from its `token_ids`, and each stream keeps `engine hash → (namespace,
//! sequence hash, per-tier references, last store time)` to resolve removals, token-less
//! offload events and children. An event whose parent is unknown is dropped and counted,
//! never guessed. The records live in one arena ([`super::table::Store`]), a prompt's blocks
//! one after another where they can; a query follows them in arena order. The TTL sweep and
//! capacity eviction walk the arena in slices. Pure and synchronous: the caller passes the
//! time (seconds, any epoch) and holds any lock.

use super::events::{KvEvent, Lora, Medium, MediumName, Removed, Stored};
use super::hash;
use super::table::{LaneId, RecId, Store, MAX_AGE};
use std::collections::{BTreeMap, HashMap};

/// A stream's id, stable while it is registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u32);

/// The LoRA part of a namespace: base is `Name("")`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LoraNs {
    /// By adapter name; the empty name is the base model.
    Name(String),
    /// By numeric id (vLLM ≤ 0.11 events, the deprecated `lora_id` query field).
    Id(i64),
}

/// What a stream was registered with.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StreamSpec {
    /// The tenant (`"default"` when none was given).
    pub tenant: String,
    /// The engine instance.
    pub instance: String,
    /// The data-parallel rank.
    pub dp_rank: u32,
    /// The model.
    pub model: String,
    /// The default LoRA namespace (events name their own).
    pub lora: String,
    /// Tokens per block.
    pub block_size: u32,
    /// The deployment salt (`additionalsalt`).
    pub salt: String,
    /// A shared pool (type `Mooncake`): its blocks count for every rank of its instance, and
    /// it is not a query row of its own.
    pub shared: bool,
}

/// The most `(holder, block)` memberships an index holds (record ids are 28 bits).
pub const MAX_MEMBERSHIPS: usize = (1 << 28) - 3;

/// Limits of the index.
#[derive(Clone, Copy, Debug)]
pub struct IndexConfig {
    /// The XXH3 seed of the standard hashes.
    pub seed: u64,
    /// At most this many `(holder, block)` memberships (at most [`MAX_MEMBERSHIPS`]). At the
    /// limit the least recently stored are evicted (`evict_at_capacity`), or new ones are
    /// refused.
    pub max_memberships: usize,
    /// At the limit, evict about 1/16 of the memberships, those not stored again for the
    /// longest time, instead of refusing new ones.
    pub evict_at_capacity: bool,
    /// Blocks not stored again within this many seconds are dropped (`None`: never).
    pub ttl_secs: Option<u32>,
}

impl Default for IndexConfig {
    fn default() -> Self {
        Self {
            seed: hash::DEFAULT_SEED,
            max_memberships: 50_000_000,
            evict_at_capacity: true,
            ttl_secs: None,
        }
    }
}

/// What the index counted, since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counters {
    /// Block stores that made or refreshed a membership.
    pub stored: u64,
    /// Block removals that ended a membership.
    pub removed: u64,
    /// Stores dropped because their parent's engine hash is unknown.
    pub orphans: u64,
    /// Removals or token-less stores of an engine hash the stream never stored.
    pub unknown_hashes: u64,
    /// Stores whose tokens do not fill their blocks, or whose block size is not the stream's.
    pub shape_mismatch: u64,
    /// Stores with multimodal or embedding keys (tokens do not identify them).
    pub opaque: u64,
    /// Events of a KV cache group other than 0.
    pub other_group: u64,
    /// Memberships refused at the capacity limit (or with every `(stream, namespace)` lane
    /// in use).
    pub capacity_refused: u64,
    /// Memberships dropped by the TTL.
    pub expired: u64,
    /// Memberships evicted at the capacity limit (least recently stored first).
    pub evicted: u64,
    /// Clear events and stream resets applied.
    pub clears: u64,
}

/// At most this many streams are registered at once (their ids fit the records' `u16`).
pub const MAX_STREAMS: usize = u16::MAX as usize;

#[derive(Debug)]
struct Stream {
    spec: StreamSpec,
    tier_blocks: [u64; 3],
    records: usize,
    /// For the stream of another medium: that medium and the stream it belongs to.
    medium: Option<(MediumName, u32)>,
    /// This stream's streams of other media ([`index_media`](self::media)).
    media: Vec<(MediumName, u32)>,
}

/// Per-tier block counts of a stream, for `/services`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Blocks per tier (GPU, CPU, disk).
    pub tier_blocks: [u64; 3],
    /// Engine hashes tracked (records: one per engine hash, whatever tiers it holds).
    pub engine_hashes: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct NsKey {
    tenant: String,
    model: String,
    lora: LoraNs,
    block_size: u32,
    salt: String,
}

/// One instance's answer to a query, in tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstanceMatch {
    /// The longest prefix servable by one rank.
    pub longest_matched: u64,
    /// The longest prefix entirely on one rank's GPU.
    pub gpu: u64,
    /// The longest prefix entirely on one rank's CPU tier (or a shared CPU pool).
    pub cpu: u64,
    /// The longest prefix entirely on one rank's disk tier (or a shared disk pool).
    pub disk: u64,
    /// Per rank: the longest prefix servable from that rank's tiers and shared pools.
    pub dp: BTreeMap<u32, u64>,
    /// Per other medium (NPU, 3FS, …), by name: the longest prefix entirely on it in one
    /// stream (a rank's or a shared pool's); zero for a medium the instance used and holds
    /// none of the prompt on.
    pub other: BTreeMap<&'static str, u64>,
}

/// What a query asks for, besides the blocks.
#[derive(Clone, Debug)]
pub struct QueryScope<'a> {
    /// The tenant.
    pub tenant: &'a str,
    /// The model.
    pub model: &'a str,
    /// The LoRA namespace.
    pub lora: LoraNs,
    /// Tokens per block.
    pub block_size: u32,
    /// The effective salt of the blocks asked for (`cache_salt`).
    pub salt: &'a str,
    /// Only this instance, when given.
    pub instance: Option<&'a str>,
}

/// The prefix index.
#[derive(Debug)]
pub struct Index {
    config: IndexConfig,
    store: Store,
    streams: Vec<Option<Stream>>,
    free_streams: Vec<u32>,
    /// Namespace ids, while a lane (records of one stream in one namespace) uses them.
    ns_ids: HashMap<NsKey, u32>,
    ns_keys: Vec<Option<NsKey>>,
    free_ns: Vec<u32>,
    /// Namespace ids handed out during the current change (freed after it if unused).
    fresh_ns: Vec<u32>,
    /// The TTL in ticks of the store's clock.
    ttl_ticks: Option<u32>,
    counters: Counters,
    /// Where capacity eviction's walk over the arena goes on from.
    hand: usize,
}

/// How many records one slice of an arena walk (TTL sweep) covers: about 2 ms of work.
pub const SWEEP_SLICE: usize = 1 << 16;

/// The effective salt of a block (spec §3.2): the deployment salt, the request salt, or
/// both joined by `|` when both are set.
pub fn effective_salt(additional: &str, cache_salt: &str) -> String {
    match (additional.is_empty(), cache_salt.is_empty()) {
        (_, true) => additional.to_owned(),
        (true, false) => cache_salt.to_owned(),
        (false, false) => format!("{additional}|{cache_salt}"),
    }
}

impl Index {
    /// An empty index.
    pub fn new(config: IndexConfig) -> Self {
        // Store times are 16-bit ticks: a second, or as many as keep the TTL within half
        // of the exact ages.
        let tick = config
            .ttl_secs
            .map_or(1, |t| t.div_ceil(MAX_AGE / 2).max(1));
        Self {
            config: IndexConfig {
                max_memberships: config.max_memberships.min(MAX_MEMBERSHIPS),
                ..config
            },
            store: Store::new(tick),
            streams: Vec::new(),
            free_streams: Vec::new(),
            ns_ids: HashMap::new(),
            ns_keys: Vec::new(),
            free_ns: Vec::new(),
            fresh_ns: Vec::new(),
            ttl_ticks: config.ttl_secs.map(|t| t / tick),
            counters: Counters::default(),
            hand: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &IndexConfig {
        &self.config
    }

    /// What was counted so far.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// `(holder, block)` memberships stored.
    pub fn memberships(&self) -> usize {
        self.store.memberships()
    }

    /// `(stream, block)` records stored, whatever tiers each holds.
    pub fn records(&self) -> usize {
        self.store.records()
    }

    /// Records a query finds through the block table (the first of each stored run of a
    /// chain); the others follow their parent in the arena.
    pub fn chain_heads(&self) -> usize {
        self.store.heads()
    }

    /// Namespaces in use.
    pub fn namespaces(&self) -> usize {
        self.ns_ids.len()
    }

    /// Heap bytes of the record arena, its two tables and the lanes (a lower bound on what
    /// the index costs; namespaces and stream specs are not counted).
    pub fn heap_bytes(&self) -> usize {
        self.store.heap_bytes()
    }

    /// Adds a stream and returns its id; `None` when [`MAX_STREAMS`] are registered.
    pub fn add_stream(&mut self, spec: StreamSpec) -> Option<StreamId> {
        let stream = Stream {
            spec,
            tier_blocks: [0; 3],
            records: 0,
            medium: None,
            media: Vec::new(),
        };
        if let Some(id) = self.free_streams.pop() {
            self.streams[id as usize] = Some(stream);
            Some(StreamId(id))
        } else if self.streams.len() < MAX_STREAMS {
            self.streams.push(Some(stream));
            Some(StreamId((self.streams.len() - 1) as u32))
        } else {
            None
        }
    }

    /// The spec of a registered stream.
    pub fn stream_spec(&self, id: StreamId) -> Option<&StreamSpec> {
        self.stream(id).map(|s| &s.spec)
    }

    /// Block counts of a registered stream.
    pub fn stream_stats(&self, id: StreamId) -> Option<StreamStats> {
        self.stream(id).map(|s| StreamStats {
            tier_blocks: s.tier_blocks,
            engine_hashes: s.records,
        })
    }

    fn stream(&self, id: StreamId) -> Option<&Stream> {
        self.streams.get(id.0 as usize).and_then(Option::as_ref)
    }

    fn stream_mut(&mut self, id: u16) -> Option<&mut Stream> {
        self.streams
            .get_mut(usize::from(id))
            .and_then(Option::as_mut)
    }

    /// Removes a stream and every membership it held.
    pub fn remove_stream(&mut self, id: StreamId) {
        for m in self.media_of(id) {
            self.remove_stream(m);
        }
        self.clear_stream(id, None);
        if let Some(slot) = self.streams.get_mut(id.0 as usize) {
            if slot.take().is_some() {
                self.free_streams.push(id.0);
            }
        }
    }

    /// Drops a stream's memberships on one tier (`Some`) or all (`None`); the stream stays.
    /// One pass over the record arena (a clear or an unregister is rare; 10M records take
    /// tens of milliseconds).
    pub fn clear_stream(&mut self, id: StreamId, tier: Option<Medium>) {
        if self.stream(id).is_none() {
            return;
        }
        if tier.is_none() {
            for m in self.media_of(id) {
                self.clear_stream(m, None);
            }
        }
        let st = id.0 as u16;
        let mut freed = Vec::new();
        for i in 0..self.store.arena_len() as RecId {
            let r = self.store.rec(i);
            if r.is_free() || self.store.stream_of(&r) != st {
                continue;
            }
            for t in Medium::ALL {
                if tier.is_none_or(|x| x == t) {
                    self.drop_ref(i, t, true);
                }
            }
            if self.store.rec(i).is_free() {
                freed.push(i);
            }
        }
        self.store.unindex_many(&freed);
        self.counters.clears += 1;
        self.collect();
    }

    /// Drops references of record `id` on `tier` (all, or one), keeping the stream's counts;
    /// true when a membership ended. A record left holding nothing stays in the tables until
    /// the caller passes it to `Store::unindex_many`.
    fn drop_ref(&mut self, id: RecId, tier: Medium, all: bool) -> bool {
        let st = self.store.stream_of(&self.store.rec(id));
        if !self.store.drop_ref_deferred(id, tier, all) {
            return false;
        }
        let freed = self.store.rec(id).is_free();
        if let Some(s) = self.stream_mut(st) {
            s.tier_blocks[tier.index()] = s.tier_blocks[tier.index()].saturating_sub(1);
            if freed {
                s.records = s.records.saturating_sub(1);
            }
        }
        true
    }

    /// Drops every membership of record `id` (which then waits in `freed` for
    /// `Store::unindex_many`); returns how many went.
    fn drop_record(&mut self, id: RecId, freed: &mut Vec<RecId>) -> usize {
        let n = Medium::ALL
            .into_iter()
            .filter(|t| self.drop_ref(id, *t, true))
            .count();
        if n > 0 {
            freed.push(id);
        }
        n
    }

    /// Whether one more membership fits, evicting when configured to; counts a refusal.
    fn room(&mut self, now: u32) -> bool {
        let max = self.config.max_memberships;
        if self.store.memberships() < max
            || (self.config.evict_at_capacity
                && self.evict_oldest(now)
                && self.store.memberships() < max)
        {
            return true;
        }
        self.counters.capacity_refused += 1;
        false
    }

    fn ns_id(&mut self, key: NsKey) -> u32 {
        if let Some(&id) = self.ns_ids.get(&key) {
            return id;
        }
        let id = match self.free_ns.pop() {
            Some(id) => {
                self.ns_keys[id as usize] = Some(key.clone());
                id
            }
            None => {
                self.ns_keys.push(Some(key.clone()));
                (self.ns_keys.len() - 1) as u32
            }
        };
        self.ns_ids.insert(key, id);
        self.fresh_ns.push(id);
        id
    }

    /// After a change: frees the lanes left without records and the namespaces left
    /// without lanes, so that neither outlives the blocks that made them.
    fn collect(&mut self) {
        self.store.collect_lanes();
        let mut gone = self.store.take_released_ns();
        gone.append(&mut self.fresh_ns);
        for ns in gone {
            if self.store.ns_in_use(ns) {
                continue;
            }
            if let Some(key) = self.ns_keys.get_mut(ns as usize).and_then(Option::take) {
                self.ns_ids.remove(&key);
                self.free_ns.push(ns);
            }
        }
    }

    /// Applies one event of stream `id` at time `now` (seconds).
    pub fn apply(&mut self, id: StreamId, event: &KvEvent, now: u32) {
        if self.stream(id).is_none() || self.apply_other_medium(id, event, now) {
            return;
        }
        match event {
            KvEvent::Stored(s) => self.apply_stored(id, s, now),
            KvEvent::Removed(r) => self.apply_removed(id, r),
            KvEvent::Cleared(tier) => self.clear_stream(id, *tier),
        }
        self.collect();
    }

    fn event_ns(&mut self, id: StreamId, s: &Stored) -> Option<u32> {
        let spec = &self.stream(id)?.spec;
        let lora = match &s.lora {
            Lora::Unspecified => LoraNs::Name(spec.lora.clone()),
            Lora::Name(n) => LoraNs::Name(n.clone()),
            Lora::Id(i) => LoraNs::Id(*i),
        };
        let key = NsKey {
            tenant: spec.tenant.clone(),
            model: spec.model.clone(),
            lora,
            block_size: spec.block_size,
            salt: effective_salt(&spec.salt, s.cache_salt.as_deref().unwrap_or("")),
        };
        Some(self.ns_id(key))
    }

    fn apply_stored(&mut self, id: StreamId, s: &Stored, now: u32) {
        if s.group.is_some_and(|g| g != 0) {
            self.counters.other_group += 1;
            return;
        }
        if s.opaque_extra_keys {
            self.counters.opaque += 1;
            return;
        }
        if s.tokens.is_empty() {
            if s.standard_hashes {
                self.store_standard(id, s, now);
            } else {
                self.store_placeholder(id, s, now);
            }
            return;
        }
        let Some(bs) = self.stream(id).map(|st| st.spec.block_size as usize) else {
            return;
        };
        let event_bs = s.block_size as usize;
        if bs == 0 || (event_bs != 0 && event_bs != bs) || s.tokens.len() != s.hashes.len() * bs {
            self.counters.shape_mismatch += 1;
            return;
        }
        let st = id.0 as u16;
        // The namespace, the parent's sequence hash and, when the parent is one of this
        // stream's records, that record with its hash (so the first block can follow it in
        // the arena).
        let (ns, mut parent, mut prev) = match s.parent {
            None => match self.event_ns(id, s) {
                Some(ns) => (ns, None, None),
                None => return,
            },
            Some(p) if s.standard_hashes => match self.event_ns(id, s) {
                Some(ns) => (ns, Some(p), None),
                None => return,
            },
            Some(p) => match self.find_related(st, p) {
                Some((r, own)) => {
                    let rec = self.store.rec(r);
                    (
                        self.store.ns_of(&rec),
                        Some(rec.seq()),
                        own.then_some((r, rec.seq())),
                    )
                }
                None => {
                    self.counters.orphans += 1;
                    return;
                }
            },
        };
        let Some(lane) = self.store.lane(st, ns) else {
            self.counters.capacity_refused += 1;
            return;
        };
        let seed = self.config.seed;
        // Every block's hash first, then the table slots they touch (independent reads whose
        // cache misses overlap), then the stores: at 10M blocks the misses dominate.
        let seqs: Vec<u64> = s
            .tokens
            .chunks_exact(bs)
            .map(|block| {
                let seq = hash::next_seq_hash(parent, block, seed);
                parent = Some(seq);
                seq
            })
            .collect();
        let key = |engine: u64, seq: u64| if s.standard_hashes { seq } else { engine };
        for (engine, seq) in s.hashes.iter().zip(&seqs) {
            self.store.warm(st, key(*engine, *seq));
        }
        for (engine, seq) in s.hashes.iter().zip(&seqs) {
            match self.store_block(lane, key(*engine, *seq), *seq, s.medium, now, prev) {
                Some(r) => prev = Some((r, *seq)),
                None => return,
            }
        }
    }

    /// Mooncake events without tokens: their hashes are standard rolling hashes already.
    fn store_standard(&mut self, id: StreamId, s: &Stored, now: u32) {
        let Some(ns) = self.event_ns(id, s) else {
            return;
        };
        let Some(lane) = self.store.lane(id.0 as u16, ns) else {
            self.counters.capacity_refused += 1;
            return;
        };
        for h in &s.hashes {
            if self
                .store_block(lane, *h, *h, s.medium, now, None)
                .is_none()
            {
                return;
            }
        }
    }

    /// Token-less stores (vLLM offload placeholders): resolved through the engine-hash map.
    fn store_placeholder(&mut self, id: StreamId, s: &Stored, now: u32) {
        let st = id.0 as u16;
        for h in &s.hashes {
            let Some((r, _)) = self.find_related(st, *h) else {
                self.counters.unknown_hashes += 1;
                continue;
            };
            let rec = self.store.rec(r);
            let Some(lane) = self.store.lane(st, self.store.ns_of(&rec)) else {
                self.counters.capacity_refused += 1;
                return;
            };
            if self
                .store_block(lane, *h, rec.seq(), s.medium, now, None)
                .is_none()
            {
                return;
            }
        }
    }

    /// Records `engine → seq` in `lane` with one more reference on `tier`, and returns the
    /// record; `None` when the capacity limit refused it (the caller stops the event there).
    /// `parent` is the record of the block before it in its chain, with that block's hash.
    fn store_block(
        &mut self,
        lane: LaneId,
        engine: u64,
        seq: u64,
        tier: Medium,
        now: u32,
        parent: Option<(RecId, u64)>,
    ) -> Option<RecId> {
        let (st, ns) = self.store.lane_parts(lane);
        let mut found = self.store.find_engine(st, engine);
        if let Some(r) = found {
            let old = self.store.rec(r);
            if self.store.ns_of(&old) != ns || old.seq() != seq {
                // The engine reused a hash for other content: forget the old block first.
                let mut freed = Vec::new();
                self.drop_record(r, &mut freed);
                self.store.unindex_many(&freed);
                found = None;
            }
        }
        let adding = found.is_none_or(|r| self.store.rec(r).refs(tier) == 0);
        if adding {
            let evicted = self.counters.evicted;
            if !self.room(now) {
                return None;
            }
            if self.counters.evicted != evicted {
                // The eviction may have dropped this record.
                found = self.store.find_engine(st, engine);
            }
        }
        let (id, new_membership, new_record) = match found {
            Some(r) => (r, self.store.add_ref(r, tier, now), false),
            None => match self.store.insert(lane, engine, seq, tier, now, parent) {
                Some(r) => (r, true, true),
                None => {
                    self.counters.capacity_refused += 1;
                    return None;
                }
            },
        };
        if let Some(s) = self.stream_mut(st) {
            if new_membership {
                s.tier_blocks[tier.index()] += 1;
            }
            if new_record {
                s.records += 1;
            }
        }
        self.counters.stored += 1;
        Some(id)
    }

    fn apply_removed(&mut self, id: StreamId, r: &Removed) {
        if r.group.is_some_and(|g| g != 0) {
            self.counters.other_group += 1;
            return;
        }
        for h in &r.hashes {
            let found = self.store.find_engine(id.0 as u16, *h);
            let Some(rec) = found.filter(|x| self.store.rec(*x).refs(r.medium) > 0) else {
                self.counters.unknown_hashes += 1;
                continue;
            };
            if self.drop_ref(rec, r.medium, false) {
                self.counters.removed += 1;
                if self.store.rec(rec).is_free() {
                    self.store.unindex_many(&[rec]);
                }
            }
        }
    }

    /// Drops every membership not stored again since `now - ttl`; returns how many.
    pub fn expire(&mut self, now: u32) -> usize {
        let mut from = 0;
        let mut n = 0;
        loop {
            let (dropped, next) = self.expire_slice(from, SWEEP_SLICE, now);
            n += dropped;
            match next {
                Some(x) => from = x,
                None => return n,
            }
        }
    }

    /// The sweep over `len` records of the arena from `from`: [`Index::expire`] in slices,
    /// so that one lock hold walks a bounded part of the index whatever the streams. With a
    /// TTL it drops what is too old; with or without, it clamps the store times older than
    /// the 16-bit clock tells apart (a walk of the whole arena must come at least every few
    /// hours: see [`MAX_AGE`]). Returns the memberships dropped and where the next slice
    /// starts (`None`: done).
    pub fn expire_slice(&mut self, from: usize, len: usize, now: u32) -> (usize, Option<usize>) {
        let end = from.saturating_add(len.max(1)).min(self.store.arena_len());
        let next = (end < self.store.arena_len()).then_some(end);
        let mut n = 0;
        let mut freed = Vec::new();
        let tick = self.store.tick(now);
        for i in from..end {
            let i = i as RecId;
            let r = self.store.rec(i);
            if r.is_free() {
                continue;
            }
            if self.ttl_ticks.is_some_and(|ttl| r.age(tick) > ttl) {
                n += self.drop_record(i, &mut freed);
            } else {
                self.store.clamp_age(i, tick);
            }
        }
        self.store.unindex_many(&freed);
        self.counters.expired += n as u64;
        self.collect();
        (n, next)
    }

    /// The blocks of stream `id` in arena order: each standard sequence hash with its
    /// references per tier (GPU, CPU, disk), for `/dump`. Walks the whole arena.
    pub fn stream_blocks(&self, id: StreamId) -> Vec<(u64, [u8; 3])> {
        if self.stream(id).is_none() {
            return Vec::new();
        }
        (0..self.store.arena_len() as RecId)
            .map(|i| self.store.rec(i))
            .filter(|r| !r.is_free() && u32::from(self.store.stream_of(r)) == id.0)
            .map(|r| (r.seq(), Medium::ALL.map(|m| r.refs(m))))
            .collect()
    }

    /// Every stream's id.
    pub fn stream_ids(&self) -> Vec<StreamId> {
        self.streams
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_some())
            .map(|(i, _)| StreamId(i as u32))
            .collect()
    }

    /// Frees room at the capacity limit: drops records stored longest ago. The cutoff is
    /// the 1/16 quantile of the ages of up to 4,096 records sampled across the arena;
    /// records of the cutoff's age go too, unless that age holds most of the sample (a burst
    /// filling the index within one tick): then only older ones go. The walk goes on from
    /// where the last one stopped and ends once about 1/256 of the memberships (at least
    /// one) went, so one call walks about 1/16 of the arena, not all of it. Returns whether
    /// any went.
    ///
    /// Deterministic (the arena depends only on what was applied), so a replica applying
    /// the same changes evicts the same blocks.
    fn evict_oldest(&mut self, now: u32) -> bool {
        let len = self.store.arena_len();
        if self.store.records() == 0 {
            return false;
        }
        let step = len.div_ceil(4096).max(1);
        let tick = self.store.tick(now);
        let mut sample: Vec<u32> = (0..len)
            .step_by(step)
            .map(|i| self.store.rec(i as RecId))
            .filter(|r| !r.is_free())
            .map(|r| r.age(tick))
            .collect();
        if sample.is_empty() {
            // Every sampled slot was free: take the first live record's age.
            sample.extend(
                (0..len as RecId)
                    .map(|i| self.store.rec(i))
                    .find(|r| !r.is_free())
                    .map(|r| r.age(tick)),
            );
        }
        // Oldest first.
        sample.sort_unstable_by(|a, b| b.cmp(a));
        let cutoff = sample[sample.len() / 16];
        let inclusive = sample.partition_point(|&a| a >= cutoff) * 2 <= sample.len();
        let target = self.store.memberships().div_ceil(256).max(1);
        let mut n = 0;
        let mut freed = Vec::new();
        for _ in 0..len {
            if self.hand >= self.store.arena_len() {
                self.hand = 0;
            }
            let i = self.hand as RecId;
            self.hand += 1;
            let r = self.store.rec(i);
            if r.is_free() {
                continue;
            }
            let age = r.age(tick);
            if age > cutoff || (inclusive && age == cutoff) {
                n += self.drop_record(i, &mut freed);
                if n >= target {
                    break;
                }
            }
        }
        self.store.unindex_many(&freed);
        self.counters.evicted += n as u64;
        n > 0
    }

    /// Answers `/query`: the standard hashes of every complete block of `tokens`.
    pub fn query_tokens(
        &self,
        scope: &QueryScope<'_>,
        tokens: &[u32],
    ) -> BTreeMap<String, InstanceMatch> {
        // Every hash first, then the lookups: with no hashing between them, the CPU overlaps
        // the lookups' cache misses (two a block in a large table).
        let seqs = hash::seq_hashes(tokens, scope.block_size as usize, self.config.seed);
        self.walk(scope, seqs.into_iter())
    }

    /// Answers `/query_by_hash`: the rolling hashes are given.
    pub fn query_hashes(
        &self,
        scope: &QueryScope<'_>,
        seq_hashes: &[u64],
    ) -> BTreeMap<String, InstanceMatch> {
        self.walk(scope, seq_hashes.iter().copied())
    }

    /// The walk of spec §1.3: prefix-continuous per tier and per rank, never joining ranks.
    fn walk(
        &self,
        scope: &QueryScope<'_>,
        seqs: impl Iterator<Item = u64>,
    ) -> BTreeMap<String, InstanceMatch> {
        struct Row {
            stream: u32,
            instance: usize,
            rank: u32,
            tier_len: [u64; 3],
            tier_alive: [bool; 3],
            len: u64,
            alive: bool,
        }
        /// A stream of another medium: its name, instance, the row or shared pool it counts
        /// for, and its own prefix.
        struct OtherMedium {
            stream: u32,
            name: &'static str,
            instance: usize,
            owner: u32,
            len: u64,
            alive: bool,
        }
        let mut instances: Vec<&str> = Vec::new();
        let mut rows: Vec<Row> = Vec::new();
        // Shared pools: stream → instance index.
        let mut shared: Vec<(u32, usize)> = Vec::new();
        let mut others: Vec<OtherMedium> = Vec::new();
        for (i, s) in self.streams.iter().enumerate() {
            let Some(s) = s else { continue };
            let sp = &s.spec;
            if sp.tenant != scope.tenant
                || sp.model != scope.model
                || sp.block_size != scope.block_size
                || scope.instance.is_some_and(|x| x != sp.instance)
            {
                continue;
            }
            let inst = match instances.iter().position(|x| *x == sp.instance) {
                Some(p) => p,
                None => {
                    instances.push(&sp.instance);
                    instances.len() - 1
                }
            };
            if let Some((name, owner)) = s.medium {
                others.push(OtherMedium {
                    stream: i as u32,
                    name: name.as_str(),
                    instance: inst,
                    owner,
                    len: 0,
                    alive: true,
                });
            } else if sp.shared {
                shared.push((i as u32, inst));
            } else {
                rows.push(Row {
                    stream: i as u32,
                    instance: inst,
                    rank: sp.dp_rank,
                    tier_len: [0; 3],
                    tier_alive: [true; 3],
                    len: 0,
                    alive: true,
                });
            }
        }
        let key = NsKey {
            tenant: scope.tenant.to_owned(),
            model: scope.model.to_owned(),
            lora: scope.lora.clone(),
            block_size: scope.block_size,
            salt: scope.salt.to_owned(),
        };
        if let Some(&ns) = self.ns_ids.get(&key) {
            // The streams that answer: rows and shared pools, sorted for a binary search.
            let mut wanted: Vec<u32> = rows
                .iter()
                .map(|r| r.stream)
                .chain(shared.iter().map(|s| s.0))
                .chain(others.iter().map(|o| o.stream))
                .collect();
            wanted.sort_unstable();
            let mut masks: Vec<(u32, u8)> = Vec::new();
            let mut shared_masks = vec![0u8; instances.len()];
            // Blocks on another medium of a row's own stream (bit 3: no tier of the three).
            let mut other_masks: Vec<(u32, u8)> = Vec::new();
            // The records holding the previous block, and this one's.
            let mut held: Vec<RecId> = Vec::new();
            let mut next: Vec<RecId> = Vec::new();
            for (k, seq) in seqs.enumerate() {
                masks.clear();
                shared_masks.iter_mut().for_each(|m| *m = 0);
                // A record holding this block either continues one holding the previous
                // block (the next in the arena) or is a chain head.
                next.clear();
                next.extend(
                    held.iter()
                        .filter_map(|&r| self.store.next_in_chain(r, seq)),
                );
                self.store.for_each_head(ns, seq, |r| {
                    let st = u32::from(self.store.stream_of(&self.store.rec(r)));
                    if wanted.binary_search(&st).is_ok() {
                        next.push(r);
                    }
                });
                std::mem::swap(&mut held, &mut next);
                for &r in &held {
                    let rec = self.store.rec(r);
                    let st = u32::from(self.store.stream_of(&rec));
                    let bit = rec.mask();
                    if let Some(&(_, inst)) = shared.iter().find(|(s, _)| *s == st) {
                        shared_masks[inst] |= bit;
                    } else if let Some(m) = masks.iter_mut().find(|(s, _)| *s == st) {
                        m.1 |= bit;
                    } else {
                        masks.push((st, bit));
                    }
                }
                other_masks.clear();
                for o in &mut others {
                    let held = masks.iter().any(|(s, m)| *s == o.stream && *m != 0);
                    if o.alive && held {
                        o.len = k as u64 + 1;
                    } else {
                        o.alive = false;
                    }
                    if !held {
                        continue;
                    }
                    if shared.iter().any(|(s, _)| *s == o.owner) {
                        shared_masks[o.instance] |= 1 << 3;
                    } else {
                        other_masks.push((o.owner, 1 << 3));
                    }
                }
                let mut any_alive = false;
                for row in &mut rows {
                    let own = masks
                        .iter()
                        .find(|(s, _)| *s == row.stream)
                        .map_or(0, |m| m.1);
                    let on_other = other_masks
                        .iter()
                        .find(|(s, _)| *s == row.stream)
                        .map_or(0, |m| m.1);
                    let mask = own | on_other | shared_masks[row.instance];
                    for t in 0..3 {
                        if row.tier_alive[t] && mask & (1 << t) != 0 {
                            row.tier_len[t] = k as u64 + 1;
                        } else {
                            row.tier_alive[t] = false;
                        }
                    }
                    if row.alive && mask != 0 {
                        row.len = k as u64 + 1;
                    } else {
                        row.alive = false;
                    }
                    any_alive |= row.alive;
                }
                if !any_alive {
                    break;
                }
            }
        }
        let bs = u64::from(scope.block_size);
        let mut out: BTreeMap<String, InstanceMatch> = BTreeMap::new();
        for row in &rows {
            let m = out.entry(instances[row.instance].to_owned()).or_default();
            m.gpu = m.gpu.max(row.tier_len[0] * bs);
            m.cpu = m.cpu.max(row.tier_len[1] * bs);
            m.disk = m.disk.max(row.tier_len[2] * bs);
            let dp = m.dp.entry(row.rank).or_default();
            *dp = (*dp).max(row.len * bs);
            m.longest_matched = m.longest_matched.max(row.len * bs);
        }
        for o in &others {
            let m = out.entry(instances[o.instance].to_owned()).or_default();
            let len = m.other.entry(o.name).or_default();
            *len = (*len).max(o.len * bs);
        }
        out
    }
}

#[path = "index_dump.rs"]
mod dump;
pub use dump::IndexDump;

#[path = "index_media.rs"]
mod media;

#[cfg(test)]
#[path = "index_tests.rs"]
pub(crate) mod tests;

#[cfg(test)]
#[path = "index_model_tests.rs"]
mod model_tests;
