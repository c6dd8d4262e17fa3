//! Tracked L2 keys: per-salt usage and an LRU per salt, at ≤ 64 bytes per key.
//!
//! Owns the compact key representation ([`CompactKey`]), the slot arena and the per-salt hash
//! tables and LRU lists. It knows nothing about HTTP, instances, quotas or time: the quota
//! module asks it for the oldest keys of a salt, the event module feeds it stores, accesses
//! and deletes.
//!
//! Layout: every tracked key is one 48-byte `Slot` in a segmented arena (segments of
//! [`SEGMENT`] slots, so growth never copies and never doubles), holding the chunk hash
//! inline (≤ 32 bytes), the size, the packed `kv_rank`, an interned model name, the object
//! group and its last-use tick. Recency is a per-store monotonic `u32` tick (renumbered
//! densely before it would wrap), so the LRU needs no links: the eviction cycle selects the
//! `n` smallest ticks of a salt (`select_nth_unstable`, O(keys of the salt) every few
//! seconds). Each salt has `hashbrown::HashTable<u32>`s of slot indices (5 bytes per bucket,
//! load ≥ 7/16 after a resize), so a key costs 48 + at most ~11.5 + ~1 (segment slack) bytes.
//!
//! No big resize: a salt starts with one table and, when it reaches [`SPLIT_AT`] keys, is
//! split once into [`SHARDS`] tables by bits of the key's hash. A table doubles on its own, so
//! the longest single resize moves `max(SPLIT_AT, keys of the salt / SHARDS)` entries (~65k
//! at the 16 Mi key limit: milliseconds) instead of every key of the salt (hundreds of
//! milliseconds at millions of keys, on the owner task).
//! [`KeyStore::memory_bytes`] counts the real allocations; the `memory_per_key` test asserts
//! the bound.

use hashbrown::{DefaultHashBuilder, HashTable};
use indexmap::IndexSet;
use std::hash::BuildHasher;

/// Slots per arena segment.
pub(crate) const SEGMENT: usize = 4 * 1024;
/// Keys of one salt at which its table is split into [`SHARDS`] tables.
pub(crate) const SPLIT_AT: usize = 64 * 1024;
/// Tables of a split salt (a power of two).
pub(crate) const SHARDS: usize = 256;
/// Longest chunk hash kept inline (blake3 and sha256 are 32 bytes).
pub(crate) const MAX_HASH_BYTES: usize = 32;

/// Why an event key cannot be tracked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// `chunk_hash_hex` is not an even-length hex string.
    #[error("chunk_hash_hex is not hex")]
    BadHex,
    /// The chunk hash is longer than 32 bytes.
    #[error("chunk_hash_hex is longer than {MAX_HASH_BYTES} bytes")]
    HashTooLong,
    /// `kv_rank`, `object_group_id` or the size does not fit the compact form.
    #[error("{0} out of range")]
    OutOfRange(&'static str),
    /// Too many distinct model names.
    #[error("too many distinct model names")]
    TooManyModels,
    /// `model_name` contains `@` or `cache_salt` contains `@ / \ NUL` or is too long.
    #[error("invalid {0}")]
    Invalid(&'static str),
}

/// An object key in LMCache's JSON form (`EncodedObjectKey`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
pub struct EncodedKey {
    /// Hex of the chunk hash (any case on input; lowercase on output).
    pub chunk_hash_hex: String,
    /// Model name (no `@`).
    pub model_name: String,
    /// Bit-packed `world_size<<24 | global_rank<<16 | local_world_size<<8 | local_rank`.
    pub kv_rank: i64,
    /// Object group (default 0).
    #[serde(default)]
    pub object_group_id: i64,
    /// Tenant salt (default "").
    #[serde(default)]
    pub cache_salt: String,
}

/// A key without its salt, in fixed size: what a slot stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct CompactKey {
    hash: [u8; MAX_HASH_BYTES],
    hash_len: u8,
    group: u8,
    model: u16,
    kv_rank: u32,
}

#[derive(Clone, Copy)]
struct Slot {
    key: CompactKey,
    size: u32,
    tick: u32,
}

/// One salt's keys: its hash tables (one, or [`SHARDS`] once split) and byte total.
struct SaltKeys {
    tables: Vec<HashTable<u32>>,
    len: usize,
    bytes: u64,
    /// Object groups a key of this salt was ever stored in (bit per group; never cleared,
    /// so it may list a group with no key left: lookups then find nothing).
    groups: [u64; 4],
}

impl Default for SaltKeys {
    fn default() -> Self {
        SaltKeys {
            tables: vec![HashTable::new()],
            len: 0,
            bytes: 0,
            groups: [0; 4],
        }
    }
}

impl SaltKeys {
    /// The table a hash belongs to: bits 40.. of the hash (hashbrown uses the low bits for
    /// the bucket and the top 7 for its tag, so a shard's table stays well spread).
    fn shard(&self, h: u64) -> usize {
        (h >> 40) as usize & (self.tables.len() - 1)
    }

    fn table(&self, h: u64) -> &HashTable<u32> {
        &self.tables[self.shard(h)]
    }

    fn table_mut(&mut self, h: u64) -> &mut HashTable<u32> {
        let i = self.shard(h);
        &mut self.tables[i]
    }

    fn indices(&self) -> impl Iterator<Item = u32> + '_ {
        self.tables.iter().flat_map(|t| t.iter().copied())
    }
}

/// Every tracked key of every salt.
pub(crate) struct KeyStore {
    segments: Vec<Vec<Slot>>,
    free: Vec<u32>,
    len: usize,
    salts: indexmap::IndexMap<String, SaltKeys>,
    models: IndexSet<String>,
    hasher: DefaultHashBuilder,
    /// The next last-use tick.
    clock: u32,
    /// Where the clock is renumbered (a field so tests can lower it).
    clock_limit: u32,
}

/// The key store's content in a snapshot: model names in interning order (keys refer to them
/// by index), and each salt in order with its object-group bits and its keys, least recently
/// used first (the ticks themselves are not kept: a restore numbers them anew in that order).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KeysDump {
    models: Vec<String>,
    salts: Vec<SaltDump>,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct SaltDump {
    salt: String,
    groups: [u64; 4],
    /// `(hash, group, model index, kv_rank, size)`, least recently used first.
    keys: Vec<(serde_bytes::ByteBuf, u8, u16, u32, u32)>,
}

/// What a store did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stored {
    /// A new key.
    New,
    /// A known key, size updated (from the size given) and moved to most recently used.
    Updated(u32),
}

impl KeyStore {
    pub(crate) fn new() -> Self {
        KeyStore {
            segments: Vec::new(),
            free: Vec::new(),
            len: 0,
            salts: indexmap::IndexMap::new(),
            models: IndexSet::new(),
            hasher: DefaultHashBuilder::default(),
            clock: 0,
            clock_limit: u32::MAX - 1,
        }
    }

    /// The content for a snapshot ([`KeysDump`]).
    pub(crate) fn dump(&self) -> KeysDump {
        let salts = self
            .salts
            .iter()
            .map(|(salt, s)| {
                let mut order: Vec<(u32, u32)> =
                    s.indices().map(|i| (self.slot(i).tick, i)).collect();
                order.sort_unstable();
                let keys = order
                    .into_iter()
                    .map(|(_, i)| {
                        let Slot { key, size, .. } = *self.slot(i);
                        let hash = key.hash[..usize::from(key.hash_len)].to_vec();
                        let hash = serde_bytes::ByteBuf::from(hash);
                        (hash, key.group, key.model, key.kv_rank, size)
                    })
                    .collect();
                SaltDump {
                    salt: salt.clone(),
                    groups: s.groups,
                    keys,
                }
            })
            .collect();
        KeysDump {
            models: self.models.iter().cloned().collect(),
            salts,
        }
    }

    /// A store holding `dump`'s keys in its LRU order, at most `limit` of them.
    ///
    /// # Errors
    /// A key that does not fit (a bad hash or model index) or more than `limit` keys.
    pub(crate) fn restore(dump: KeysDump, limit: usize) -> Result<Self, String> {
        let mut store = KeyStore::new();
        for m in dump.models {
            store.models.insert(m);
        }
        for s in dump.salts {
            for (hash, group, model, kv_rank, size) in s.keys {
                if hash.len() > MAX_HASH_BYTES || usize::from(model) >= store.models.len() {
                    return Err(format!("a key of salt {:?} does not fit", s.salt));
                }
                let mut key = CompactKey {
                    hash: [0; MAX_HASH_BYTES],
                    hash_len: u8::try_from(hash.len()).unwrap_or(0),
                    group,
                    model,
                    kv_rank,
                };
                key.hash[..hash.len()].copy_from_slice(&hash);
                if store.store(&s.salt, key, size, limit).is_none() {
                    return Err(format!("more than {limit} keys"));
                }
            }
            if let Some(salt) = store.salts.get_mut(&s.salt) {
                salt.groups = s.groups;
            }
        }
        Ok(store)
    }

    /// Keys tracked over all salts.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes used by `salt` (sum of the sizes of its tracked keys).
    pub(crate) fn salt_bytes(&self, salt: &str) -> u64 {
        self.salts.get(salt).map_or(0, |s| s.bytes)
    }

    /// Keys tracked for `salt`.
    pub(crate) fn salt_len(&self, salt: &str) -> usize {
        self.salts.get(salt).map_or(0, |s| s.len)
    }

    /// Every salt with tracked keys and its byte total.
    pub(crate) fn salts(&self) -> impl Iterator<Item = (&str, u64)> {
        self.salts.iter().map(|(k, v)| (k.as_str(), v.bytes))
    }

    /// Converts a wire key, interning its model name.
    pub(crate) fn compact(&mut self, key: &EncodedKey) -> Result<CompactKey, KeyError> {
        let model = match self.models.get_index_of(key.model_name.as_str()) {
            Some(i) => i,
            None => {
                if key.model_name.contains('@') {
                    return Err(KeyError::Invalid("model_name"));
                }
                if self.models.len() > usize::from(u16::MAX) {
                    return Err(KeyError::TooManyModels);
                }
                self.models.insert_full(key.model_name.clone()).0
            }
        };
        let mut k = lookup_compact(key)?;
        k.model = u16::try_from(model).map_err(|_| KeyError::TooManyModels)?;
        Ok(k)
    }

    /// Converts a wire key without interning (`None` if its model was never seen: such a key
    /// cannot be tracked).
    pub(crate) fn find_compact(&self, key: &EncodedKey) -> Result<Option<CompactKey>, KeyError> {
        let Some(model) = self.models.get_index_of(key.model_name.as_str()) else {
            return Ok(None);
        };
        let mut k = lookup_compact(key)?;
        k.model = u16::try_from(model).map_err(|_| KeyError::TooManyModels)?;
        Ok(Some(k))
    }

    /// The wire form of a tracked key.
    pub(crate) fn encode(&self, salt: &str, key: &CompactKey) -> EncodedKey {
        let hash = &key.hash[..usize::from(key.hash_len)];
        let mut hex = String::with_capacity(hash.len() * 2);
        for b in hash {
            hex.push(char::from(HEX[usize::from(b >> 4)]));
            hex.push(char::from(HEX[usize::from(b & 0xf)]));
        }
        EncodedKey {
            chunk_hash_hex: hex,
            model_name: self
                .models
                .get_index(usize::from(key.model))
                .cloned()
                .unwrap_or_default(),
            kv_rank: i64::from(key.kv_rank),
            object_group_id: i64::from(key.group),
            cache_salt: salt.to_owned(),
        }
    }

    fn slot(&self, i: u32) -> &Slot {
        let i = i as usize;
        &self.segments[i / SEGMENT][i % SEGMENT]
    }

    fn slot_mut(&mut self, i: u32) -> &mut Slot {
        let i = i as usize;
        &mut self.segments[i / SEGMENT][i % SEGMENT]
    }

    fn hash_of(hasher: &DefaultHashBuilder, key: &CompactKey) -> u64 {
        hasher.hash_one(key)
    }

    fn find(&self, salt: &str, key: &CompactKey) -> Option<u32> {
        let s = self.salts.get(salt)?;
        let h = Self::hash_of(&self.hasher, key);
        s.table(h).find(h, |&i| self.slot(i).key == *key).copied()
    }

    /// The next tick, renumbering every slot's tick densely first if the clock is spent.
    fn tick(&mut self) -> u32 {
        if self.clock >= self.clock_limit {
            self.renumber();
        }
        let t = self.clock;
        self.clock += 1;
        t
    }

    /// Renumbers the live ticks 0..len in their order (keeps every salt's LRU order).
    fn renumber(&mut self) {
        let mut live: Vec<(u32, u32)> = Vec::with_capacity(self.len);
        for s in self.salts.values() {
            for i in s.indices() {
                live.push((self.slot(i).tick, i));
            }
        }
        live.sort_unstable();
        for (rank, &(_, i)) in live.iter().enumerate() {
            self.slot_mut(i).tick = u32::try_from(rank).unwrap_or(u32::MAX);
        }
        self.clock = u32::try_from(live.len()).unwrap_or(u32::MAX);
    }

    /// Records a store of `size` bytes; the key becomes the most recently used of its salt.
    /// Returns `None` when the key is new and `limit` keys are already tracked.
    pub(crate) fn store(
        &mut self,
        salt: &str,
        key: CompactKey,
        size: u32,
        limit: usize,
    ) -> Option<Stored> {
        if let Some(i) = self.find(salt, &key) {
            let tick = self.tick();
            let slot = self.slot_mut(i);
            let old = slot.size;
            slot.size = size;
            slot.tick = tick;
            if let Some(s) = self.salts.get_mut(salt) {
                s.bytes = s.bytes - u64::from(old) + u64::from(size);
            }
            return Some(Stored::Updated(old));
        }
        if self.len >= limit {
            return None;
        }
        let slot = Slot {
            key,
            size,
            tick: self.tick(),
        };
        let i = match self.free.pop() {
            Some(i) => {
                *self.slot_mut(i) = slot;
                i
            }
            None => {
                if self.segments.last().is_none_or(|s| s.len() == SEGMENT) {
                    self.segments.push(Vec::with_capacity(SEGMENT));
                }
                let i =
                    (self.segments.len() - 1) * SEGMENT + self.segments.last().map_or(0, Vec::len);
                let i = u32::try_from(i).ok()?;
                if let Some(seg) = self.segments.last_mut() {
                    seg.push(slot);
                }
                i
            }
        };
        self.len += 1;
        let h = Self::hash_of(&self.hasher, &key);
        let (segments, hasher) = (&self.segments, &self.hasher);
        let rehash = |&j: &u32| {
            let j = j as usize;
            Self::hash_of(hasher, &segments[j / SEGMENT][j % SEGMENT].key)
        };
        let s = self.salts.entry(salt.to_owned()).or_default();
        if s.len == SPLIT_AT && s.tables.len() == 1 {
            // One-time split into SHARDS tables (moves SPLIT_AT entries).
            let one = std::mem::take(&mut s.tables[0]);
            s.tables = (0..SHARDS).map(|_| HashTable::new()).collect();
            for j in one {
                let hj = rehash(&j);
                s.table_mut(hj).insert_unique(hj, j, rehash);
            }
        }
        s.table_mut(h).insert_unique(h, i, rehash);
        s.groups[usize::from(key.group / 64)] |= 1 << (key.group % 64);
        s.len += 1;
        s.bytes += u64::from(size);
        Some(Stored::New)
    }

    /// True if the key is tracked.
    pub(crate) fn contains(&self, salt: &str, key: &CompactKey) -> bool {
        self.find(salt, key).is_some()
    }

    /// Marks a key most recently used; false if it is not tracked.
    pub(crate) fn touch(&mut self, salt: &str, key: &CompactKey) -> bool {
        match self.find(salt, key) {
            Some(i) => {
                let tick = self.tick();
                self.slot_mut(i).tick = tick;
                true
            }
            None => false,
        }
    }

    /// Forgets a key; returns its size, or `None` if it was not tracked.
    pub(crate) fn remove(&mut self, salt: &str, key: &CompactKey) -> Option<u32> {
        let i = self.find(salt, key)?;
        let h = Self::hash_of(&self.hasher, key);
        let size = self.slot(i).size;
        let s = self.salts.get_mut(salt)?;
        if let Ok(entry) = s.table_mut(h).find_entry(h, |&j| j == i) {
            entry.remove();
            s.len -= 1;
        }
        s.bytes -= u64::from(size);
        if s.len == 0 {
            self.salts.shift_remove(salt);
        }
        self.free.push(i);
        self.len -= 1;
        Some(size)
    }

    /// The tracked keys that differ from `key` only in object group, by ascending group
    /// (`POST /cache/delete` reaches a chunk's copies in every group). Probes only the groups
    /// the salt has held, so a fleet using group 0 alone pays one bitmask read.
    pub(crate) fn in_other_groups(&self, key: &EncodedKey) -> Vec<EncodedKey> {
        let Some(s) = self.salts.get(key.cache_salt.as_str()) else {
            return Vec::new();
        };
        let Ok(Some(mut k)) = self.find_compact(key) else {
            return Vec::new();
        };
        let own = k.group;
        let mut out = Vec::new();
        for g in 0..=u8::MAX {
            if g == own || s.groups[usize::from(g / 64)] & (1 << (g % 64)) == 0 {
                continue;
            }
            k.group = g;
            if self.find(&key.cache_salt, &k).is_some() {
                out.push(self.encode(&key.cache_salt, &k));
            }
        }
        out
    }

    /// Up to `n` least recently used keys of `salt`, oldest first.
    pub(crate) fn oldest(&self, salt: &str, n: usize) -> Vec<CompactKey> {
        let Some(s) = self.salts.get(salt) else {
            return Vec::new();
        };
        if n == 0 {
            return Vec::new();
        }
        // A max-heap of the n oldest seen so far: O(keys · log n) time, 8n bytes of memory
        // (never a copy of the whole salt).
        let mut heap: std::collections::BinaryHeap<(u32, u32)> =
            std::collections::BinaryHeap::with_capacity(n.min(s.len));
        for i in s.indices() {
            let t = (self.slot(i).tick, i);
            if heap.len() < n {
                heap.push(t);
            } else if heap.peek().is_some_and(|&top| t < top) {
                heap.pop();
                heap.push(t);
            }
        }
        heap.into_sorted_vec()
            .into_iter()
            .map(|(_, i)| self.slot(i).key)
            .collect()
    }

    /// Bytes allocated for tracked keys: arena segments, free list and hash tables.
    pub(crate) fn memory_bytes(&self) -> usize {
        let arena: usize = self
            .segments
            .iter()
            .map(|s| s.capacity() * std::mem::size_of::<Slot>())
            .sum();
        let tables: usize = self
            .salts
            .values()
            .flat_map(|s| &s.tables)
            .map(|t| t.allocation_size() + std::mem::size_of::<HashTable<u32>>())
            .sum();
        arena + tables + self.free.capacity() * 4
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The model-independent part of [`KeyStore::compact`] (model left 0).
fn lookup_compact(key: &EncodedKey) -> Result<CompactKey, KeyError> {
    let hex = key.chunk_hash_hex.as_bytes();
    if !hex.len().is_multiple_of(2) {
        return Err(KeyError::BadHex);
    }
    if hex.len() / 2 > MAX_HASH_BYTES {
        return Err(KeyError::HashTooLong);
    }
    let mut hash = [0u8; MAX_HASH_BYTES];
    for (i, pair) in hex.chunks_exact(2).enumerate() {
        let hi = nibble(pair[0]).ok_or(KeyError::BadHex)?;
        let lo = nibble(pair[1]).ok_or(KeyError::BadHex)?;
        hash[i] = hi << 4 | lo;
    }
    let salt = &key.cache_salt;
    if salt.len() > 128 || salt.contains(['@', '/', '\\', '\0']) {
        return Err(KeyError::Invalid("cache_salt"));
    }
    Ok(CompactKey {
        hash,
        hash_len: u8::try_from(hex.len() / 2).map_err(|_| KeyError::HashTooLong)?,
        group: u8::try_from(key.object_group_id)
            .map_err(|_| KeyError::OutOfRange("object_group_id"))?,
        model: 0,
        kv_rank: u32::try_from(key.kv_rank).map_err(|_| KeyError::OutOfRange("kv_rank"))?,
    })
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn key(n: u64, salt: &str) -> EncodedKey {
        EncodedKey {
            chunk_hash_hex: format!("{n:064x}"),
            model_name: "m".into(),
            kv_rank: 16_777_472,
            object_group_id: 0,
            cache_salt: salt.into(),
        }
    }

    #[test]
    fn store_touch_remove_keep_usage_and_lru_order() {
        let mut ks = KeyStore::new();
        for n in 0..4 {
            let k = ks.compact(&key(n, "a")).unwrap();
            assert_eq!(ks.store("a", k, 100, 10), Some(Stored::New));
        }
        assert_eq!(ks.salt_bytes("a"), 400);
        let k1 = ks.compact(&key(1, "a")).unwrap();
        assert!(ks.touch("a", &k1));
        let k0 = ks.compact(&key(0, "a")).unwrap();
        assert_eq!(ks.store("a", k0, 50, 10), Some(Stored::Updated(100)));
        assert_eq!(ks.salt_bytes("a"), 350);
        let order: Vec<_> = ks
            .oldest("a", 10)
            .iter()
            .map(|k| ks.encode("a", k).chunk_hash_hex)
            .collect();
        let want: Vec<_> = [2u64, 3, 1, 0]
            .iter()
            .map(|n| format!("{n:064x}"))
            .collect();
        assert_eq!(order, want);
        assert_eq!(ks.remove("a", &k1), Some(100));
        assert_eq!(ks.remove("a", &k1), None);
        assert_eq!(ks.salt_bytes("a"), 250);
        assert_eq!(ks.oldest("a", 2).len(), 2);
        // Another salt with the same key is a different key.
        assert!(!ks.touch("b", &k0));
        assert_eq!(ks.store("b", k0, 1, 10), Some(Stored::New));
        assert_eq!(ks.len(), 4);
        // The limit applies to new keys only.
        let mut full = KeyStore::new();
        let a = full.compact(&key(1, "")).unwrap();
        let b = full.compact(&key(2, "")).unwrap();
        assert_eq!(full.store("", a, 1, 1), Some(Stored::New));
        assert_eq!(full.store("", b, 1, 1), None);
        assert_eq!(full.store("", a, 2, 1), Some(Stored::Updated(1)));
    }

    #[test]
    fn removing_the_last_key_forgets_the_salt_and_reuses_the_slot() {
        let mut ks = KeyStore::new();
        let k = ks.compact(&key(7, "s")).unwrap();
        ks.store("s", k, 9, 10);
        ks.remove("s", &k);
        assert_eq!(ks.salts().count(), 0);
        ks.store("t", k, 9, 10);
        assert_eq!(ks.segments.iter().map(Vec::len).sum::<usize>(), 1);
        assert_eq!(ks.oldest("t", 5), vec![k]);
    }

    #[test]
    fn renumbering_the_clock_keeps_the_lru_order() {
        let mut ks = KeyStore::new();
        ks.clock_limit = 8;
        let keys: Vec<_> = (0..5).map(|n| ks.compact(&key(n, "a")).unwrap()).collect();
        for k in &keys {
            ks.store("a", *k, 1, 100);
        }
        for _ in 0..10 {
            // Touch 0 then 1 repeatedly: the clock passes its limit several times.
            ks.touch("a", &keys[0]);
            ks.touch("a", &keys[1]);
        }
        assert!(ks.clock <= 8);
        assert_eq!(
            ks.oldest("a", 5),
            vec![keys[2], keys[3], keys[4], keys[0], keys[1]]
        );
    }

    #[test]
    fn encode_round_trips_and_normalises_case() {
        let mut ks = KeyStore::new();
        let mut wire = key(0xABCD, "user-a");
        wire.chunk_hash_hex = "0ABCDEF1".into();
        wire.object_group_id = 3;
        let k = ks.compact(&wire).unwrap();
        let back = ks.encode("user-a", &k);
        assert_eq!(back.chunk_hash_hex, "0abcdef1");
        assert_eq!(back.object_group_id, 3);
        assert_eq!(back.kv_rank, 16_777_472);
        assert_eq!(back.model_name, "m");
        assert_eq!(back.cache_salt, "user-a");
        // The empty hash is valid.
        wire.chunk_hash_hex.clear();
        assert!(ks.compact(&wire).is_ok());
    }

    #[test]
    fn bad_keys_are_rejected_with_the_reason() {
        let mut ks = KeyStore::new();
        type Case = (fn(&mut EncodedKey), KeyError);
        let cases: [Case; 7] = [
            (|k| k.chunk_hash_hex = "abc".into(), KeyError::BadHex),
            (|k| k.chunk_hash_hex = "zz".into(), KeyError::BadHex),
            (
                |k| k.chunk_hash_hex = "00".repeat(33),
                KeyError::HashTooLong,
            ),
            (|k| k.kv_rank = -1, KeyError::OutOfRange("kv_rank")),
            (
                |k| k.object_group_id = 256,
                KeyError::OutOfRange("object_group_id"),
            ),
            (
                |k| k.model_name = "a@b".into(),
                KeyError::Invalid("model_name"),
            ),
            (
                |k| k.cache_salt = "a/b".into(),
                KeyError::Invalid("cache_salt"),
            ),
        ];
        for (mutate, want) in cases {
            let mut k = key(1, "");
            mutate(&mut k);
            assert_eq!(ks.compact(&k), Err(want));
        }
    }

    #[test]
    fn copies_in_other_object_groups_are_found() {
        let mut ks = KeyStore::new();
        let mut g3 = key(1, "s");
        g3.object_group_id = 3;
        let mut g200 = key(1, "s");
        g200.object_group_id = 200;
        for k in [&g200, &g3, &key(2, "s")] {
            let c = ks.compact(k).unwrap();
            ks.store("s", c, 1, 100);
        }
        // Key 1 in group 0 is not tracked itself; its copies are, by ascending group.
        assert_eq!(
            ks.in_other_groups(&key(1, "s")),
            vec![g3.clone(), g200.clone()]
        );
        assert_eq!(ks.in_other_groups(&g3), vec![g200]);
        assert!(ks.in_other_groups(&key(2, "s")).is_empty());
        assert!(ks.in_other_groups(&key(1, "other")).is_empty());
    }

    /// A salt past [`SPLIT_AT`] keys is split into [`SHARDS`] tables: every key stays
    /// findable, removable and in LRU order across the split.
    #[test]
    fn a_large_salt_is_split_and_keeps_its_keys_and_order() {
        let mut ks = KeyStore::new();
        let n = (SPLIT_AT + 1_000) as u64;
        let keys: Vec<_> = (0..n)
            .map(|i| ks.compact(&key(i, "big")).unwrap())
            .collect();
        for k in &keys {
            assert_eq!(ks.store("big", *k, 2, usize::MAX), Some(Stored::New));
        }
        assert_eq!(ks.salts["big"].tables.len(), SHARDS);
        assert_eq!(ks.salt_len("big"), n as usize);
        assert!(ks.salts["big"].tables.iter().all(|t| !t.is_empty()));
        assert!(keys.iter().all(|k| ks.contains("big", k)));
        // Updates find the key in its shard (no duplicate); removes shrink the salt.
        assert_eq!(
            ks.store("big", keys[0], 3, usize::MAX),
            Some(Stored::Updated(2))
        );
        for k in &keys[1..1_001] {
            assert_eq!(ks.remove("big", k), Some(2));
        }
        assert_eq!(ks.salt_len("big"), n as usize - 1_000);
        assert_eq!(ks.salt_bytes("big"), 2 * (n - 1_001) + 3);
        // Oldest: 1_001, 1_002, … (0 was stored again last).
        assert_eq!(ks.oldest("big", 2), vec![keys[1_001], keys[1_002]]);
        assert_eq!(ks.oldest("big", n as usize).last(), Some(&keys[0]));
        ks.renumber();
        assert_eq!(ks.oldest("big", 1), vec![keys[1_001]]);
    }

    /// The ≤ 64 bytes per tracked key bound, measured from the real allocations (arena
    /// segments and hash tables) at sizes just before and just after a table resize.
    #[test]
    fn memory_per_key() {
        assert_eq!(std::mem::size_of::<Slot>(), 48);
        let mut ks = KeyStore::new();
        let mut worst = 0.0f64;
        for n in 0..300_000u64 {
            let k = ks.compact(&key(n, "")).unwrap();
            ks.store("", k, 1, usize::MAX);
            let len = n + 1;
            if len >= 50_000 && (len % 4_096 == 1 || len % 7_919 == 0) {
                let per_key = ks.memory_bytes() as f64 / len as f64;
                worst = worst.max(per_key);
            }
        }
        eprintln!("worst bytes per tracked key: {worst:.1}");
        assert!(worst <= 64.0, "worst bytes per tracked key: {worst:.1}");
        assert!(worst > 48.0, "measured {worst:.1}: the arena alone is 48");
    }
}
