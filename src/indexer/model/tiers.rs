//! LMCache's tiers as index events: the L1 (CPU) and L2 (disk) chunks an LMCache
//! multi-process server reports, turned into the standard-hash stores and removals of the
//! engine instances that server serves, at their block size.
//!
//! An MP server reports chunks (`chunk_size` tokens, 256 by default) by their rolling BLAKE3
//! chunk hash, with the chunk's token ids and position (`token_offset`), one key per tensor-
//! parallel rank and object group. A chunk counts on a tier once a key of every rank of its
//! `world_size` is there, and leaves it when one goes. Each chunk's blocks get the index's
//! own rolling hashes (XXH3 with the index's seed, from the block before: the last block of
//! the parent chunk), so they meet the engine's blocks and `/query`'s hashes. The parent of a
//! chunk at position `p > 0` is found among the server's chunks at position `p - chunk_size`
//! (those of the same batch first, the most recent first, at most 1,024 hashed) and
//! verified: `blake3(parent ‖ tokens as u32 big-endian)` must be the chunk's hash. A server
//! reports a store when its write completes, so a child may come before its parent: such a
//! store waits (at most 4,096 a server, `waiting`) and is applied once its parent is
//! tracked; one that never finds it is dropped and counted (`orphans`), never guessed.
//!
//! Only block sizes that divide the chunk size are mapped (every block then lies in one
//! chunk); a link of another block size is counted (`unaligned`) and gets nothing. Bounded:
//! at most `max_chunks` chunks are tracked over all servers (beyond: `refused`). Pure: no
//! I/O, no clock, no lock; the caller applies the returned events to the index.

use super::events::{KvEvent, Medium, Removed, Stored};
use super::hash;
use super::index::StreamId;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};

/// The LMCache tier a batch reports on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// The MP server's memory tier: the instance's CPU tier.
    L1,
    /// The MP server's storage tier (file system, object store, …): the instance's DISK tier.
    L2,
}

impl Tier {
    /// The index tier a chunk on this LMCache tier counts as.
    pub fn medium(self) -> Medium {
        match self {
            Tier::L1 => Medium::Cpu,
            Tier::L2 => Medium::Disk,
        }
    }

    fn slot(self) -> usize {
        match self {
            Tier::L1 => 0,
            Tier::L2 => 1,
        }
    }
}

/// What a batch does to its chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// The keys were stored.
    Store,
    /// The keys were deleted (evicted or removed).
    Delete,
}

/// One object key of a batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkKey {
    /// The chunk hash (32 bytes for BLAKE3).
    pub hash: Vec<u8>,
    /// The packed `kv_rank` (`world_size << 24 | rank << 16 | …`).
    pub kv_rank: u32,
    /// The object group.
    pub group: u32,
    /// The tenant salt (`cache_salt`; the namespace's request salt).
    pub salt: String,
    /// The chunk's token ids (stores; `None` when the server did not send them).
    pub tokens: Option<Vec<u32>>,
    /// The position of the chunk's first token (-1: unknown).
    pub offset: i64,
}

/// What an MP server reported in one batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierBatch {
    /// The MP server's instance id (as registered with the coordinator).
    pub server: String,
    /// The server's boot incarnation: a newer one means its L1 is gone.
    pub incarnation: u64,
    /// The tier.
    pub tier: Tier,
    /// Store or delete.
    pub op: Op,
    /// The keys, in the server's order.
    pub keys: Vec<ChunkKey>,
}

/// An index stream an MP server's chunks feed, with its block size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierLink {
    /// The stream (a shared pool of the engine instance).
    pub stream: StreamId,
    /// The instance's tokens per block.
    pub block_size: u32,
}

/// What the bridge counted (monotonic, except `chunks`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TierCounters {
    /// Chunks tracked now.
    pub chunks: u64,
    /// Chunk stores that put the chunk on a tier (for every linked stream).
    pub chunk_stores: u64,
    /// Chunk deletes that took the chunk off a tier.
    pub chunk_removals: u64,
    /// Stores waiting for their parent chunk now.
    pub waiting: u64,
    /// Stores dropped while waiting for their parent chunk (the oldest beyond 4,096 a
    /// server, or a server's restart): not indexed.
    pub orphans: u64,
    /// Stores of a chunk not yet tracked without token ids or position: not indexed.
    pub no_tokens: u64,
    /// Chunk and block size pairs the mapping does not cover (the block size does not divide
    /// the chunk's length).
    pub unaligned: u64,
    /// Chunks not tracked because `max_chunks` were.
    pub refused: u64,
    /// A server's new incarnation dropped its L1 chunks.
    pub fences: u64,
    /// Batches from servers no engine instance is linked to (nothing indexed).
    pub unlinked_batches: u64,
}

/// Most candidates hashed to find one chunk's parent.
const MAX_CANDIDATES: usize = 1024;
/// Most stores of a server waiting for their parent chunk.
const MAX_WAITING: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    hash: Box<[u8]>,
    salt: Box<str>,
}

/// One chunk an MP server holds, with where it sits in its prompt and on which tiers.
#[derive(Debug)]
struct TrackedChunk {
    offset: i64,
    tokens: Box<[u32]>,
    parent: Option<Key>,
    /// The rolling block hashes per block size.
    seqs: Vec<(u32, Box<[u64]>)>,
    /// Per tier (L1, L2): the `(kv_rank, group)` keys held.
    keys: [Vec<(u32, u32)>; 2],
    /// Per tier: whether the chunk counts on it (every rank holds a key).
    shown: [bool; 2],
}

impl TrackedChunk {
    fn complete(&self, slot: usize) -> bool {
        let keys = &self.keys[slot];
        let Some(&(first, _)) = keys.first() else {
            return false;
        };
        let world = (first >> 24).max(1) as usize;
        let mut ranks: Vec<u32> = keys.iter().map(|(r, _)| (r >> 16) & 0xff).collect();
        ranks.sort_unstable();
        ranks.dedup();
        ranks.len() >= world
    }
}

/// One MP server's incarnation and the chunks it holds.
#[derive(Debug, Default)]
struct ServerChunks {
    incarnation: u64,
    chunks: HashMap<Key, TrackedChunk>,
    /// Tracked chunks by position: the candidates for a parent.
    by_offset: HashMap<i64, Vec<Key>>,
    /// Stores whose parent is not tracked yet, oldest first.
    waiting: VecDeque<(ChunkKey, Tier)>,
}

/// The bridge: links, per MP server, its chunks and the streams they feed.
#[derive(Debug)]
pub struct Tiers {
    seed: u64,
    max_chunks: usize,
    links: HashMap<String, Vec<TierLink>>,
    servers: HashMap<String, ServerChunks>,
    chunks: usize,
    counters: TierCounters,
}

/// The BLAKE3 chunk hash of `tokens` after the chunk hashed `parent` (LMCache's
/// `TokenHasher`: the parent hash, then each token as a big-endian u32).
pub fn chunk_hash(parent: &[u8], tokens: &[u32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(parent);
    for t in tokens {
        h.update(&t.to_be_bytes());
    }
    h.finalize().into()
}

impl Tiers {
    /// An empty bridge hashing blocks with `seed`, tracking at most `max_chunks` chunks.
    pub fn new(seed: u64, max_chunks: usize) -> Self {
        Self {
            seed,
            max_chunks,
            links: HashMap::new(),
            servers: HashMap::new(),
            chunks: 0,
            counters: TierCounters::default(),
        }
    }

    /// What was counted so far.
    pub fn counters(&self) -> TierCounters {
        TierCounters {
            chunks: self.chunks as u64,
            waiting: self.servers.values().map(|s| s.waiting.len() as u64).sum(),
            ..self.counters
        }
    }

    /// The MP servers linked to streams, with the streams.
    pub fn links(&self) -> impl Iterator<Item = (&str, &[TierLink])> {
        self.links.iter().map(|(s, t)| (s.as_str(), t.as_slice()))
    }

    /// Chunks tracked per server and tier (L1, L2 counted where every rank holds a key).
    pub fn server_chunks(&self) -> Vec<(String, u64, [u64; 2])> {
        let mut out: Vec<(String, u64, [u64; 2])> = self
            .servers
            .iter()
            .map(|(id, s)| {
                let mut shown = [0u64; 2];
                for c in s.chunks.values() {
                    for (n, on) in shown.iter_mut().zip(c.shown) {
                        *n += u64::from(on);
                    }
                }
                (id.clone(), s.incarnation, shown)
            })
            .collect();
        out.sort();
        out
    }

    /// Links `server`'s chunks to `target`; returns the stores of the chunks it already
    /// shows (so the stream starts complete).
    pub fn link(&mut self, server: &str, target: TierLink) -> Vec<(StreamId, KvEvent)> {
        let links = self.links.entry(server.to_owned()).or_default();
        if links.contains(&target) {
            return Vec::new();
        }
        links.push(target);
        let mut out = Vec::new();
        let Some(keys) = self.servers.get(server).map(|s| {
            let mut k: Vec<(i64, Key)> = s
                .chunks
                .iter()
                .map(|(k, c)| (c.offset, k.clone()))
                .collect();
            k.sort_by_key(|(o, _)| *o);
            k
        }) else {
            return out;
        };
        for (_, key) in keys {
            let Some(seqs) = self.seqs(server, &key, target.block_size) else {
                continue;
            };
            let shown = self.servers[server].chunks[&key].shown;
            for tier in [Tier::L1, Tier::L2] {
                if shown[tier.slot()] {
                    out.push((target.stream, stored(&seqs, tier, &key.salt)));
                }
            }
        }
        out
    }

    /// Forgets every link to `stream` (its blocks go with the stream).
    pub fn unlink_stream(&mut self, stream: StreamId) {
        for targets in self.links.values_mut() {
            targets.retain(|t| t.stream != stream);
        }
        self.links.retain(|_, t| !t.is_empty());
    }

    /// A server left the fleet: its L1 is gone (its L2 may stay).
    pub fn server_left(&mut self, server: &str) -> Vec<(StreamId, KvEvent)> {
        self.drop_tier(server, Tier::L1)
    }

    /// Applies one batch; returns the events for the linked streams, in order.
    pub fn apply(&mut self, b: &TierBatch) -> Vec<(StreamId, KvEvent)> {
        let mut out = Vec::new();
        if !self.links.contains_key(&b.server) {
            self.counters.unlinked_batches += 1;
            return out;
        }
        let fenced = self
            .servers
            .get(&b.server)
            .is_some_and(|s| s.incarnation < b.incarnation);
        if fenced {
            self.counters.fences += 1;
            out.extend(self.drop_tier(&b.server, Tier::L1));
            if let Some(s) = self.servers.get_mut(&b.server) {
                self.counters.orphans += s.waiting.len() as u64;
                s.waiting.clear();
            }
        }
        let server = self.servers.entry(b.server.clone()).or_default();
        server.incarnation = server.incarnation.max(b.incarnation);
        // Stores commute (the coordinator applies a store batch in reverse, LRU order):
        // taken by position, a chunk's parent is tracked before it.
        let mut keys: Vec<&ChunkKey> = b.keys.iter().collect();
        if b.op == Op::Store {
            keys.sort_by_key(|k| k.offset);
        }
        // This batch's tracked chunks by position: the first candidates for a parent.
        let mut batch: HashMap<i64, Vec<Key>> = HashMap::new();
        for k in keys {
            let key = Key {
                hash: k.hash.clone().into_boxed_slice(),
                salt: k.salt.clone().into_boxed_str(),
            };
            match b.op {
                Op::Store => match self.store(&b.server, &key, k, b.tier, &batch, &mut out) {
                    Outcome::Tracked => batch.entry(k.offset).or_default().push(key),
                    Outcome::NoParent => self.wait(&b.server, k, b.tier),
                    Outcome::Dropped => {}
                },
                Op::Delete => self.delete(&b.server, &key, k, b.tier, &mut out),
            }
        }
        if b.op == Op::Store {
            self.retry_waiting(&b.server, &mut out);
        }
        out
    }

    fn wait(&mut self, server: &str, k: &ChunkKey, tier: Tier) {
        let Some(s) = self.servers.get_mut(server) else {
            return;
        };
        s.waiting.push_back((k.clone(), tier));
        if s.waiting.len() > MAX_WAITING {
            s.waiting.pop_front();
            self.counters.orphans += 1;
        }
    }

    /// Applies the waiting stores whose parent is tracked now: one pass in position order
    /// (a parent comes before its children in it).
    fn retry_waiting(&mut self, server: &str, out: &mut Vec<(StreamId, KvEvent)>) {
        let Some(s) = self.servers.get_mut(server) else {
            return;
        };
        if s.waiting.is_empty() {
            return;
        }
        let mut waiting: Vec<(ChunkKey, Tier)> = s.waiting.drain(..).collect();
        waiting.sort_by_key(|(k, _)| k.offset);
        let none = HashMap::new();
        for (k, tier) in waiting {
            let key = Key {
                hash: k.hash.clone().into_boxed_slice(),
                salt: k.salt.clone().into_boxed_str(),
            };
            if self.store(server, &key, &k, tier, &none, out) == Outcome::NoParent {
                if let Some(s) = self.servers.get_mut(server) {
                    s.waiting.push_back((k, tier));
                }
            }
        }
    }

    /// Stores one key.
    fn store(
        &mut self,
        server: &str,
        key: &Key,
        k: &ChunkKey,
        tier: Tier,
        batch: &HashMap<i64, Vec<Key>>,
        out: &mut Vec<(StreamId, KvEvent)>,
    ) -> Outcome {
        if !self.servers[server].chunks.contains_key(key) {
            let tracked = self.track(server, key, k, batch);
            if tracked != Outcome::Tracked {
                return tracked;
            }
        }
        let slot = tier.slot();
        let s = self.servers.get_mut(server).expect("server entry");
        let c = s.chunks.get_mut(key).expect("tracked chunk");
        if !c.keys[slot].contains(&(k.kv_rank, k.group)) {
            c.keys[slot].push((k.kv_rank, k.group));
        }
        if c.shown[slot] || !c.complete(slot) {
            return Outcome::Tracked;
        }
        c.shown[slot] = true;
        self.counters.chunk_stores += 1;
        let targets = self.links.get(server).cloned().unwrap_or_default();
        for t in targets {
            if let Some(seqs) = self.seqs(server, key, t.block_size) {
                out.push((t.stream, stored(&seqs, tier, &key.salt)));
            }
        }
        Outcome::Tracked
    }

    /// Starts tracking a chunk: its parent found and verified, its block hashes computed.
    fn track(
        &mut self,
        server: &str,
        key: &Key,
        k: &ChunkKey,
        batch: &HashMap<i64, Vec<Key>>,
    ) -> Outcome {
        let tokens = match &k.tokens {
            Some(t) if !t.is_empty() && k.offset >= 0 => t,
            _ => {
                self.counters.no_tokens += 1;
                return Outcome::Dropped;
            }
        };
        if self.chunks >= self.max_chunks {
            self.counters.refused += 1;
            return Outcome::Dropped;
        }
        let s = &self.servers[server];
        let parent = if k.offset == 0 {
            None
        } else {
            let want = k.offset - tokens.len() as i64;
            let found = batch
                .get(&want)
                .into_iter()
                .flatten()
                .chain(s.by_offset.get(&want).into_iter().flatten().rev())
                .filter(|c| c.salt == key.salt)
                .take(MAX_CANDIDATES)
                .find(|c| {
                    s.chunks.get(*c).is_some_and(|pc| pc.offset == want)
                        && chunk_hash(&c.hash, tokens)[..] == key.hash[..]
                })
                .cloned();
            match found {
                Some(p) => Some(p),
                None => return Outcome::NoParent,
            }
        };
        let s = self.servers.get_mut(server).expect("server entry");
        s.chunks.insert(
            key.clone(),
            TrackedChunk {
                offset: k.offset,
                tokens: tokens.clone().into_boxed_slice(),
                parent,
                seqs: Vec::new(),
                keys: [Vec::new(), Vec::new()],
                shown: [false; 2],
            },
        );
        s.by_offset.entry(k.offset).or_default().push(key.clone());
        self.chunks += 1;
        // Hashed now, while its ancestors are tracked (they may leave before it shows).
        let sizes: Vec<u32> = self.links[server].iter().map(|t| t.block_size).collect();
        for bs in sizes {
            let _ = self.seqs(server, key, bs);
        }
        Outcome::Tracked
    }

    fn delete(
        &mut self,
        server: &str,
        key: &Key,
        k: &ChunkKey,
        tier: Tier,
        out: &mut Vec<(StreamId, KvEvent)>,
    ) {
        let slot = tier.slot();
        let Some(s) = self.servers.get_mut(server) else {
            return;
        };
        // A store still waiting for its parent is withdrawn.
        s.waiting.retain(|(w, t)| {
            !(*t == tier
                && w.hash == k.hash
                && w.salt == k.salt
                && (w.kv_rank, w.group) == (k.kv_rank, k.group))
        });
        let Some(c) = s.chunks.get_mut(key) else {
            return;
        };
        c.keys[slot].retain(|x| *x != (k.kv_rank, k.group));
        if c.shown[slot] && !c.complete(slot) {
            c.shown[slot] = false;
            self.counters.chunk_removals += 1;
            self.removed(server, key, tier, out);
        }
        self.forget_if_empty(server, key);
    }

    /// Takes every chunk of `server` off `tier`.
    fn drop_tier(&mut self, server: &str, tier: Tier) -> Vec<(StreamId, KvEvent)> {
        let slot = tier.slot();
        let mut out = Vec::new();
        let Some(keys) = self.servers.get_mut(server).map(|s| {
            s.chunks
                .iter_mut()
                .filter_map(|(k, c)| {
                    c.keys[slot].clear();
                    std::mem::take(&mut c.shown[slot]).then(|| k.clone())
                })
                .collect::<Vec<_>>()
        }) else {
            return out;
        };
        for key in &keys {
            self.counters.chunk_removals += 1;
            self.removed(server, key, tier, &mut out);
        }
        let all: Vec<Key> = self.servers[server].chunks.keys().cloned().collect();
        for key in &all {
            self.forget_if_empty(server, key);
        }
        out
    }

    fn removed(&mut self, server: &str, key: &Key, tier: Tier, out: &mut Vec<(StreamId, KvEvent)>) {
        let targets = self.links.get(server).cloned().unwrap_or_default();
        for t in targets {
            if let Some(seqs) = self.seqs(server, key, t.block_size) {
                out.push((
                    t.stream,
                    KvEvent::Removed(Removed {
                        hashes: seqs.to_vec(),
                        medium: tier.medium(),
                        group: None,
                    }),
                ));
            }
        }
    }

    fn forget_if_empty(&mut self, server: &str, key: &Key) {
        let Some(s) = self.servers.get_mut(server) else {
            return;
        };
        if s.chunks
            .get(key)
            .is_some_and(|c| c.keys.iter().all(Vec::is_empty))
        {
            if let Some(c) = s.chunks.remove(key) {
                if let Some(at) = s.by_offset.get_mut(&c.offset) {
                    at.retain(|k| k != key);
                    if at.is_empty() {
                        s.by_offset.remove(&c.offset);
                    }
                }
            }
            self.chunks -= 1;
        }
    }

    /// The rolling block hashes of a tracked chunk at `block_size` (computed from its
    /// ancestors' once, then kept); `None` when the size does not divide the chunk or an
    /// ancestor is no longer tracked.
    fn seqs(&mut self, server: &str, key: &Key, block_size: u32) -> Option<Box<[u64]>> {
        let bs = block_size as usize;
        // The chain from this chunk up to the first one with hashes at this size (or a root).
        let mut chain: Vec<Key> = Vec::new();
        let mut parent_seq: Option<u64> = None;
        let mut at = Some(key.clone());
        let chunks = &self.servers.get(server)?.chunks;
        while let Some(k) = at {
            let c = chunks.get(&k)?;
            if let Some((_, s)) = c.seqs.iter().find(|(b, _)| *b == block_size) {
                if chain.is_empty() {
                    return Some(s.clone());
                }
                parent_seq = s.last().copied();
                break;
            }
            if bs == 0 || c.tokens.len() % bs != 0 {
                self.counters.unaligned += 1;
                return None;
            }
            at = c.parent.clone();
            chain.push(k);
        }
        let seed = self.seed;
        let chunks = &mut self.servers.get_mut(server)?.chunks;
        let mut last: Option<Box<[u64]>> = None;
        for k in chain.iter().rev() {
            let c = chunks.get_mut(k)?;
            let mut seqs = Vec::with_capacity(c.tokens.len() / bs);
            for block in c.tokens.chunks_exact(bs) {
                let h = hash::next_seq_hash(parent_seq, block, seed);
                seqs.push(h);
                parent_seq = Some(h);
            }
            let seqs = seqs.into_boxed_slice();
            c.seqs.push((block_size, seqs.clone()));
            last = Some(seqs);
        }
        last
    }
}

/// What became of a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// The chunk is tracked.
    Tracked,
    /// Its parent is not tracked (yet).
    NoParent,
    /// Not tracked, and never will be (no tokens, the chunk limit).
    Dropped,
}

fn stored(seqs: &[u64], tier: Tier, salt: &str) -> KvEvent {
    KvEvent::Stored(Stored {
        hashes: seqs.to_vec(),
        medium: tier.medium(),
        cache_salt: (!salt.is_empty()).then(|| salt.to_owned()),
        standard_hashes: true,
        ..Stored::default()
    })
}

#[cfg(test)]
#[path = "tiers_tests.rs"]
mod tests;
