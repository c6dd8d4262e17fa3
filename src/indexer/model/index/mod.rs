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
//!
//! This file holds the types, the streams and the namespaces; events are applied in
//! [`apply`](self::apply), the TTL sweep and capacity eviction are [`sweep`](self::sweep), the
//! `/query` walk is [`query`](self::query), other media [`media`](self::media).
//!
//! Must not: read a clock, do I/O, or trust an engine hash for content.

use super::events::{KvEvent, Medium, MediumName};
use super::hash;
use super::table::{RecId, Store, MAX_AGE};
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
}

mod apply;

mod query;

mod sweep;

mod dump;
pub use dump::IndexDump;

mod media;

#[cfg(test)]
pub(crate) mod tests;

#[cfg(test)]
mod model_tests;
