//! Tracked L2 keys and their placements: per-salt usage and an LRU list per salt.
//!
//! Owns the compact key representation ([`CompactKey`]), the slot arena, the per-salt hash
//! tables and LRU lists, and where each key is held (`Placement`: a holder — an MP server's
//! private L2, or the fleet for a shared backend — a backend and a size; see [`super::holders`]).
//! It knows nothing about HTTP, quotas or time: the model asks it for a salt's oldest keys and
//! feeds it stores, accesses and deletes.
//!
//! Layout: every tracked key is one 56-byte `Slot` in a segmented arena (segments of
//! [`SEGMENT`] slots, so growth never copies and never doubles), holding the chunk hash
//! inline (≤ 32 bytes), the packed `kv_rank`, an interned model name, the object group, its
//! two LRU links and its first placement (8 bytes). A key held in more places keeps the others
//! in a side table (`more`: slot → placements, 8 bytes each), bounded by
//! `max_extra_placements`. Recency is an intrusive doubly linked list per salt over the slots
//! (oldest at the head), so a touch is O(1) and picking the `n` oldest walks `n` slots (plus
//! the pinned and departed ones it passes), never the whole salt. Each salt has
//! `hashbrown::HashTable<u32>`s of slot indices (5 bytes per bucket, load ≥ 7/16 after a
//! resize), so a key with one placement costs 56 + at most ~11.5 + ~1 (segment slack) bytes.
//!
//! Usage: a placement counts its size in its salt's total while its holder is live, once per
//! holder (a private copy per server, a shared backend once for the fleet); a delete removes
//! one placement, never another holder's, and the key goes with its last placement.
//!
//! No big resize: a salt starts with one table and, when it reaches [`SPLIT_AT`] keys, is
//! split once into [`SHARDS`] tables by bits of the key's hash. A table doubles on its own, so
//! the longest single resize moves `max(SPLIT_AT, keys of the salt / SHARDS)` entries (~65k
//! at the 16 Mi key limit: milliseconds) instead of every key of the salt.
//! [`KeyStore::memory_bytes`] counts the real allocations; the `memory_per_key` test asserts
//! the bound.

use super::holders::{Holders, FLEET};
pub(crate) use super::objkey::{lookup_compact, CompactKey, HEX};
pub(crate) use super::objkey::{EncodedKey, KeyError};
use hashbrown::{DefaultHashBuilder, HashTable};
use indexmap::IndexSet;
use std::hash::BuildHasher;

mod slots;
use slots::{at, at_mut, push_newest, unlink, SaltKeys, Slot, NIL};
pub(crate) use slots::{Placement, SEGMENT};

mod dump;
pub(crate) use dump::KeysDump;

/// Keys of one salt at which its table is split into [`SHARDS`] tables.
pub(crate) const SPLIT_AT: usize = 64 * 1024;
/// Tables of a split salt (a power of two).
pub(crate) const SHARDS: usize = 256;
pub(crate) use super::objkey::MAX_HASH_BYTES;

/// Why a store was not tracked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Untracked {
    /// A new key at the tracked-key limit.
    Keys,
    /// Another placement at the placement limit, or the holder or backend table is full.
    Placements,
}

/// The key store's limits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Most keys.
    pub(crate) keys: usize,
    /// Most placements beyond each key's first.
    pub(crate) extra_placements: usize,
}

/// Every tracked key of every salt.
pub(crate) struct KeyStore {
    segments: Vec<Vec<Slot>>,
    free: Vec<u32>,
    len: usize,
    salts: indexmap::IndexMap<String, SaltKeys>,
    models: IndexSet<String>,
    hasher: DefaultHashBuilder,
    /// Placements after a key's first, as `(slot, placement)` entries hashed by slot, in
    /// [`SHARDS`] tables (so no resize moves more than 1/[`SHARDS`] of them).
    more: Vec<HashTable<(u32, Placement)>>,
    /// Placements in `more`.
    extra: usize,
    /// Holders and backends.
    pub(crate) holders: Holders,
}

impl KeyStore {
    /// Empty; at most `max_holders` holders (the fleet included).
    pub(crate) fn new(max_holders: usize) -> Self {
        KeyStore {
            segments: Vec::new(),
            free: Vec::new(),
            len: 0,
            salts: indexmap::IndexMap::new(),
            models: IndexSet::new(),
            hasher: DefaultHashBuilder::default(),
            more: (0..SHARDS).map(|_| HashTable::new()).collect(),
            extra: 0,
            holders: Holders::new(max_holders),
        }
    }

    /// Keys tracked over all salts.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Placements tracked (every key's first and the others).
    pub(crate) fn placement_count(&self) -> usize {
        self.len + self.extra
    }

    /// Bytes used by `salt`: its placements with a live holder.
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
        at(&self.segments, i)
    }

    fn hash_of(hasher: &DefaultHashBuilder, key: &CompactKey) -> u64 {
        hasher.hash_one(key)
    }

    fn find(&self, salt: &str, key: &CompactKey) -> Option<u32> {
        let s = self.salts.get(salt)?;
        let h = Self::hash_of(&self.hasher, key);
        s.table(h).find(h, |&i| self.slot(i).key == *key).copied()
    }

    /// The hash and shard of slot `i` in the side table.
    fn more_hash(&self, i: u32) -> (u64, usize) {
        let h = self.hasher.hash_one(i);
        (h, (h >> 40) as usize & (SHARDS - 1))
    }

    /// Slot `i`'s placements, its first one first.
    fn placements(&self, i: u32) -> impl Iterator<Item = Placement> + '_ {
        let first = self.slot(i).first;
        let (h, shard) = self.more_hash(i);
        let more = (first.more == 1).then(|| {
            self.more[shard]
                .iter_hash(h)
                .filter(move |(j, _)| *j == i)
                .map(|(_, p)| *p)
        });
        std::iter::once(first).chain(more.into_iter().flatten())
    }

    /// Moves `delta` bytes of `holder` in `salt` (its own total, and the salt's if live).
    fn account(&mut self, salt: &str, holder: u16, delta: i64) {
        if delta == 0 {
            return;
        }
        let Some(h) = self.holders.get_mut(holder) else {
            return;
        };
        let live = h.live();
        let b = h.salt_bytes.entry_ref(salt).or_insert(0);
        *b = b.saturating_add_signed(delta);
        if *b == 0 {
            h.salt_bytes.remove(salt);
        }
        if live {
            if let Some(s) = self.salts.get_mut(salt) {
                s.bytes = s.bytes.saturating_add_signed(delta);
            }
        }
    }

    /// Records a store of `size` bytes by `holder` into `backend`; the key becomes the most
    /// recently used of its salt. Returns how much the placement's bytes moved.
    pub(crate) fn store(
        &mut self,
        salt: &str,
        key: CompactKey,
        holder: u16,
        backend: u8,
        size: u32,
        limits: Limits,
    ) -> Result<i64, Untracked> {
        let placement = Placement {
            holder,
            backend,
            more: 0,
            size,
        };
        if let Some(i) = self.find(salt, &key) {
            let delta = self.upsert(i, placement, limits)?;
            if let Some(s) = self.salts.get_mut(salt) {
                unlink(&mut self.segments, s, i);
                push_newest(&mut self.segments, s, i);
            }
            self.account(salt, holder, delta);
            return Ok(delta);
        }
        if self.len >= limits.keys {
            return Err(Untracked::Keys);
        }
        let slot = Slot {
            key,
            prev: NIL,
            next: NIL,
            first: placement,
        };
        let i = match self.free.pop() {
            Some(i) => {
                *at_mut(&mut self.segments, i) = slot;
                i
            }
            None => {
                if self.segments.last().is_none_or(|s| s.len() == SEGMENT) {
                    self.segments.push(Vec::with_capacity(SEGMENT));
                }
                let i =
                    (self.segments.len() - 1) * SEGMENT + self.segments.last().map_or(0, Vec::len);
                let i = u32::try_from(i).map_err(|_| Untracked::Keys)?;
                if let Some(seg) = self.segments.last_mut() {
                    seg.push(slot);
                }
                i
            }
        };
        self.len += 1;
        let h = Self::hash_of(&self.hasher, &key);
        let (segments, hasher) = (&mut self.segments, &self.hasher);
        let s = self.salts.entry(salt.to_owned()).or_default();
        {
            let segs: &[Vec<Slot>] = segments;
            let rehash = |&j: &u32| Self::hash_of(hasher, &at(segs, j).key);
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
        }
        push_newest(segments, s, i);
        s.groups[usize::from(key.group / 64)] |= 1 << (key.group % 64);
        s.len += 1;
        if let Some(h) = self.holders.get_mut(holder) {
            h.placements += 1;
        }
        self.account(salt, holder, i64::from(size));
        Ok(i64::from(size))
    }

    /// Sets slot `i`'s placement of `(p.holder, p.backend)` to `p.size`, adding it if new;
    /// returns the size's change.
    fn upsert(&mut self, i: u32, p: Placement, limits: Limits) -> Result<i64, Untracked> {
        let same = |q: &Placement| q.holder == p.holder && q.backend == p.backend;
        let first = at_mut(&mut self.segments, i);
        if same(&first.first) {
            let old = std::mem::replace(&mut first.first.size, p.size);
            return Ok(i64::from(p.size) - i64::from(old));
        }
        let has_more = first.first.more == 1;
        let (h, shard) = self.more_hash(i);
        if has_more {
            if let Some((_, q)) = self.more[shard].find_mut(h, |(j, q)| *j == i && same(q)) {
                let old = std::mem::replace(&mut q.size, p.size);
                return Ok(i64::from(p.size) - i64::from(old));
            }
        }
        if self.extra >= limits.extra_placements {
            return Err(Untracked::Placements);
        }
        at_mut(&mut self.segments, i).first.more = 1;
        let hasher = &self.hasher;
        self.more[shard].insert_unique(h, (i, p), |(j, _)| hasher.hash_one(*j));
        self.extra += 1;
        if let Some(h) = self.holders.get_mut(p.holder) {
            h.placements += 1;
        }
        Ok(i64::from(p.size))
    }

    /// True if the key is tracked.
    pub(crate) fn contains(&self, salt: &str, key: &CompactKey) -> bool {
        self.find(salt, key).is_some()
    }

    /// Marks a key most recently used; false if it is not tracked.
    pub(crate) fn touch(&mut self, salt: &str, key: &CompactKey) -> bool {
        let Some(i) = self.find(salt, key) else {
            return false;
        };
        if let Some(s) = self.salts.get_mut(salt) {
            unlink(&mut self.segments, s, i);
            push_newest(&mut self.segments, s, i);
        }
        true
    }

    /// Removes `holder`'s copy of a key in `backend` (no other holder's); the key goes with
    /// its last copy. Returns the copy's size, or `None` if there was no such copy.
    pub(crate) fn delete(
        &mut self,
        salt: &str,
        key: &CompactKey,
        holder: u16,
        backend: u8,
    ) -> Option<u32> {
        let i = self.find(salt, key)?;
        let size = self.remove_placement(salt, i, holder, backend)?;
        self.account(salt, holder, -i64::from(size));
        if let Some(h) = self.holders.get_mut(holder) {
            h.placements -= 1;
        }
        self.holders.release_if_unused(holder);
        Some(size)
    }

    /// Takes one placement off slot `i` (the slot goes with its last); its size.
    fn remove_placement(&mut self, salt: &str, i: u32, holder: u16, backend: u8) -> Option<u32> {
        let same = |q: &Placement| q.holder == holder && q.backend == backend;
        let first = self.slot(i).first;
        if first.more == 1 {
            let (h, shard) = self.more_hash(i);
            let table = &mut self.more[shard];
            // The copy to drop: an other one, or (dropping the first) any other one, which
            // then becomes the first.
            let entry = if same(&first) {
                table.find_entry(h, |(j, _)| *j == i)
            } else {
                table.find_entry(h, |(j, q)| *j == i && same(q))
            };
            let ((_, taken), _) = entry.ok()?.remove();
            self.extra -= 1;
            let left = table.find(h, |(j, _)| *j == i).is_some();
            let slot = at_mut(&mut self.segments, i);
            if same(&first) {
                slot.first = taken;
            }
            slot.first.more = u8::from(left);
            return Some(if same(&first) { first.size } else { taken.size });
        }
        if !same(&first) {
            return None;
        }
        let key = self.slot(i).key;
        let h = Self::hash_of(&self.hasher, &key);
        let s = self.salts.get_mut(salt)?;
        if let Ok(entry) = s.table_mut(h).find_entry(h, |&j| j == i) {
            entry.remove();
            s.len -= 1;
        }
        unlink(&mut self.segments, s, i);
        if s.len == 0 {
            self.salts.shift_remove(salt);
        }
        self.free.push(i);
        self.len -= 1;
        Some(first.size)
    }

    /// Holder `id` left at `now`: its placements stop counting (and are no victims) until it
    /// comes back ([`KeyStore::revive`]) or they expire ([`KeyStore::expire`]).
    pub(crate) fn depart(&mut self, id: &str, now: f64) {
        let Some(i) = self.holders.find(id).filter(|&i| i != FLEET) else {
            return;
        };
        if let Some(h) = self.holders.get(i).filter(|h| h.live()) {
            for (salt, bytes) in &h.salt_bytes {
                if let Some(s) = self.salts.get_mut(salt.as_str()) {
                    s.bytes -= bytes;
                }
            }
        }
        self.holders.leave(i, now);
    }

    /// Holder `id` is back (it sent events): its placements count again.
    pub(crate) fn revive(&mut self, id: &str) {
        let Some(h) = self.holders.find(id).and_then(|i| self.holders.get_mut(i)) else {
            return;
        };
        if h.departed_at.take().is_none() {
            return;
        }
        for (salt, bytes) in &h.salt_bytes {
            if let Some(s) = self.salts.get_mut(salt.as_str()) {
                s.bytes += bytes;
            }
        }
    }

    /// Drops every placement of the departed holders that left at or before `cutoff` (one
    /// pass over all keys) and frees them; returns `(holder id, backend, bytes)` of what
    /// was dropped, per holder and backend, for the per-instance usage.
    pub(crate) fn expire(&mut self, cutoff: f64) -> Vec<(String, String, u64)> {
        let gone: hashbrown::HashSet<u16> =
            self.holders.departed_before(cutoff).into_iter().collect();
        if gone.is_empty() {
            return Vec::new();
        }
        let mut hits: Vec<(String, u32, u16, u8)> = Vec::new();
        for (salt, s) in &self.salts {
            for i in s.indices() {
                for p in self.placements(i).filter(|p| gone.contains(&p.holder)) {
                    hits.push((salt.clone(), i, p.holder, p.backend));
                }
            }
        }
        let mut dropped: Vec<(String, String, u64)> = Vec::new();
        for (salt, i, holder, backend) in hits {
            let Some(size) = self.remove_placement(&salt, i, holder, backend) else {
                continue;
            };
            self.account(&salt, holder, -i64::from(size));
            if let Some(h) = self.holders.get_mut(holder) {
                h.placements -= 1;
            }
            let id = self.holders.get(holder).map_or("", |h| h.id.as_str());
            let name = self.holders.backend_name(backend);
            match dropped.iter_mut().find(|(d, b, _)| d == id && b == name) {
                Some(row) => row.2 += u64::from(size),
                None => dropped.push((id.to_owned(), name.to_owned(), u64::from(size))),
            }
        }
        for i in gone {
            if let Some(h) = self.holders.get_mut(i) {
                h.shared_member = [0; 4];
            }
            self.holders.release_if_unused(i);
        }
        dropped
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

    /// The slot of a tracked key (stable while the key is tracked).
    pub(crate) fn slot_of(&self, salt: &str, key: &CompactKey) -> Option<u32> {
        self.find(salt, key)
    }

    /// Up to `n` least recently used keys of `salt` with a live placement, oldest first, with
    /// their slots and those placements; `skip` (a pinned key, one in flight) passes a key
    /// over. At most `budget` keys are looked at. A key with no live placement met on the way
    /// (its holders left) moves to the most recent end: it counts nothing and no server can
    /// delete it, so the next walk does not pass it again. O(keys looked at), whatever the
    /// salt's size.
    pub(crate) fn oldest_live(
        &mut self,
        salt: &str,
        n: usize,
        budget: usize,
        skip: impl Fn(&KeyStore, u32, &CompactKey) -> bool,
    ) -> Vec<(u32, CompactKey, Vec<Placement>)> {
        let mut out = Vec::new();
        let Some(s) = self.salts.get(salt) else {
            return out;
        };
        let (mut i, mut looked) = (s.head, 0);
        let mut dead = Vec::new();
        while i != NIL && out.len() < n && looked < budget {
            looked += 1;
            let slot = *self.slot(i);
            let here = i;
            i = slot.next;
            if skip(self, here, &slot.key) {
                continue;
            }
            let live: Vec<Placement> = self
                .placements(here)
                .filter(|p| self.holders.live(p.holder))
                .collect();
            if live.is_empty() {
                dead.push(here);
            } else {
                out.push((here, slot.key, live));
            }
        }
        if let Some(s) = self.salts.get_mut(salt) {
            for j in dead {
                unlink(&mut self.segments, s, j);
                push_newest(&mut self.segments, s, j);
            }
        }
        out
    }

    /// Bytes allocated for tracked keys: arena segments, free list, hash tables, the other
    /// placements and the holder tables.
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
        let more: usize = self
            .more
            .iter()
            .map(|t| t.allocation_size() + std::mem::size_of::<HashTable<(u32, Placement)>>())
            .sum();
        arena + tables + more + self.free.capacity() * 4 + self.holders.memory_bytes()
    }
}

#[cfg(test)]
mod tests;
