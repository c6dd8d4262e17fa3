//! The key store's storage (a child of `keys`): the 56-byte [`Slot`] of a tracked key in a
//! segmented arena, a key's [`Placement`]s, one salt's hash tables and byte total
//! ([`SaltKeys`]), and the intrusive per-salt LRU list over the slots (`unlink`,
//! `push_newest`). Plain structure: no accounting, limits, holders or snapshot here; the
//! `KeyStore` in `keys` decides what is stored and where.

use crate::coordinator::model::objkey::CompactKey;
use hashbrown::HashTable;

/// Slots per arena segment.
pub(crate) const SEGMENT: usize = 4 * 1024;
/// No slot (the end of an LRU list).
pub(super) const NIL: u32 = u32::MAX;

/// One copy of a key: its holder, backend and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placement {
    /// Holder index ([`crate::coordinator::model::holders`]; [`FLEET`](crate::coordinator::model::holders::FLEET) for a shared backend).
    pub(crate) holder: u16,
    /// Backend index.
    pub(crate) backend: u8,
    /// In a slot's first placement: 1 when more placements are in the side table.
    pub(super) more: u8,
    /// Bytes.
    pub(crate) size: u32,
}

/// One tracked key in the arena: the key, its two LRU links and its first placement.
#[derive(Clone, Copy)]
pub(super) struct Slot {
    pub(super) key: CompactKey,
    /// Older neighbour in the salt's LRU list.
    pub(super) prev: u32,
    /// Newer neighbour.
    pub(super) next: u32,
    pub(super) first: Placement,
}

/// One salt's keys: its hash tables (one, or [`SHARDS`](super::SHARDS) once split), LRU list and byte total.
pub(super) struct SaltKeys {
    pub(super) tables: Vec<HashTable<u32>>,
    pub(super) len: usize,
    /// Bytes of its placements with a live holder.
    pub(super) bytes: u64,
    /// Object groups a key of this salt was ever stored in (bit per group; never cleared,
    /// so it may list a group with no key left: lookups then find nothing).
    pub(super) groups: [u64; 4],
    /// Least recently used slot.
    pub(super) head: u32,
    /// Most recently used slot.
    pub(super) tail: u32,
}

impl Default for SaltKeys {
    fn default() -> Self {
        SaltKeys {
            tables: vec![HashTable::new()],
            len: 0,
            bytes: 0,
            groups: [0; 4],
            head: NIL,
            tail: NIL,
        }
    }
}

impl SaltKeys {
    /// The table a hash belongs to: bits 40.. of the hash (hashbrown uses the low bits for
    /// the bucket and the top 7 for its tag, so a shard's table stays well spread).
    fn shard(&self, h: u64) -> usize {
        (h >> 40) as usize & (self.tables.len() - 1)
    }

    pub(super) fn table(&self, h: u64) -> &HashTable<u32> {
        &self.tables[self.shard(h)]
    }

    pub(super) fn table_mut(&mut self, h: u64) -> &mut HashTable<u32> {
        let i = self.shard(h);
        &mut self.tables[i]
    }

    pub(super) fn indices(&self) -> impl Iterator<Item = u32> + '_ {
        self.tables.iter().flat_map(|t| t.iter().copied())
    }
}

/// Slot `i` of the arena.
pub(super) fn at(segments: &[Vec<Slot>], i: u32) -> &Slot {
    let i = i as usize;
    &segments[i / SEGMENT][i % SEGMENT]
}

/// Slot `i` of the arena, to change.
pub(super) fn at_mut(segments: &mut [Vec<Slot>], i: u32) -> &mut Slot {
    let i = i as usize;
    &mut segments[i / SEGMENT][i % SEGMENT]
}

/// Takes slot `i` out of its salt's LRU list.
pub(super) fn unlink(segments: &mut [Vec<Slot>], s: &mut SaltKeys, i: u32) {
    let Slot { prev, next, .. } = *at(segments, i);
    if prev == NIL {
        s.head = next;
    } else {
        at_mut(segments, prev).next = next;
    }
    if next == NIL {
        s.tail = prev;
    } else {
        at_mut(segments, next).prev = prev;
    }
}

/// Puts slot `i` at the most recent end of its salt's LRU list.
pub(super) fn push_newest(segments: &mut [Vec<Slot>], s: &mut SaltKeys, i: u32) {
    let tail = s.tail;
    {
        let slot = at_mut(segments, i);
        slot.prev = tail;
        slot.next = NIL;
    }
    if tail == NIL {
        s.head = i;
    } else {
        at_mut(segments, tail).next = i;
    }
    s.tail = i;
}
