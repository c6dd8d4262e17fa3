//! The reverse index: chunk hash → set of holders.
//!
//! Owns the memory-critical hot map and the holder table. A *holder* is a compact `u32` id for
//! one (worker, location) pair; this module knows nothing about workers or locations beyond an
//! opaque `owner` tag per holder, and nothing about strings.
//!
//! Layout:
//! * two `hashbrown` maps `u64 → Slot`, one for negative hashes and one for non-negative ones
//!   (a [`ChunkHash`] spans 65 bits of range: `-16` and `2^64 - 16` share a bit pattern);
//! * a [`Slot`] is 8 bytes holding up to two holder ids inline, or a tagged index into a side
//!   table of sorted holder sets once a chunk has more than two holders;
//! * removing a whole holder is O(1): it is marked dead (tombstone), lookups and counts ignore it
//!   at once, and its memberships are reclaimed by [`Chunks::compact`] or opportunistically when
//!   a slot that still contains it is touched. An id is reused only after every one of its
//!   memberships is physically gone, so a live id found in a slot is always a real membership.

use crate::protocol::ChunkHash;
use hashbrown::hash_map::Entry;
use hashbrown::HashMap;

/// Compact id of one (worker, location) pair.
pub(crate) type HolderId = u32;

/// Marks an unused inline position.
const NONE: u32 = u32::MAX;
/// Set on the first inline position when the slot points into the spill table.
const SPILL: u32 = 1 << 31;
/// Holder ids are `0..SPILL`.
const MAX_HOLDERS: usize = SPILL as usize;
/// Spill indices are `0..SPILL - 1`, so `SPILL | index` never equals [`NONE`].
const MAX_SPILLS: usize = (SPILL - 1) as usize;
/// Group width of hashbrown's control bytes (SSE2), used by the size estimate.
const GROUP_WIDTH: usize = 16;

/// The 8-byte value of the hot map: `[a, NONE]` (one holder), `[a, b]` (two holders) or
/// `[SPILL | index, NONE]` (three or more holders, sorted set in the spill table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot([u32; 2]);

impl Slot {
    const EMPTY: Slot = Slot([NONE, NONE]);

    fn spill_index(self) -> Option<usize> {
        let a = self.0[0];
        (a != NONE && a & SPILL != 0).then_some((a & !SPILL) as usize)
    }

    fn is_empty(self) -> bool {
        self.0[0] == NONE
    }
}

/// Lifecycle of a holder id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HolderState {
    /// Owned by a (worker, location); `keys` is its exact key count.
    Live,
    /// Tombstoned; `keys` is the number of memberships not yet reclaimed.
    Dead,
    /// No memberships left; on the free list.
    Free,
}

#[derive(Clone, Copy, Debug)]
struct HolderMeta {
    state: HolderState,
    owner: u32,
    keys: u64,
}

/// The holder table plus global membership counters.
#[derive(Debug, Default)]
struct Holders {
    meta: Vec<HolderMeta>,
    free: Vec<HolderId>,
    live_members: u64,
    dead_members: u64,
}

impl Holders {
    fn is_live(&self, h: HolderId) -> bool {
        matches!(self.meta.get(h as usize), Some(m) if m.state == HolderState::Live)
    }

    /// Accounts for one physical membership of dead holder `h` being dropped.
    fn reclaim_one(&mut self, h: HolderId) {
        if let Some(m) = self
            .meta
            .get_mut(h as usize)
            .filter(|m| m.state == HolderState::Dead)
        {
            m.keys = m.keys.saturating_sub(1);
            self.dead_members = self.dead_members.saturating_sub(1);
            if m.keys == 0 {
                m.state = HolderState::Free;
                self.free.push(h);
            }
        }
    }
}

/// Sorted holder sets for chunks with more than two holders.
#[derive(Debug, Default)]
struct SpillTable {
    sets: Vec<Vec<HolderId>>,
    free: Vec<u32>,
}

impl SpillTable {
    fn alloc(&mut self, sorted: [HolderId; 3]) -> Option<u32> {
        if let Some(i) = self.free.pop() {
            let set = &mut self.sets[i as usize];
            set.clear();
            set.extend_from_slice(&sorted);
            return Some(i);
        }
        if self.sets.len() >= MAX_SPILLS {
            return None;
        }
        self.sets.push(sorted.to_vec());
        u32::try_from(self.sets.len() - 1).ok()
    }

    /// Moves set `i` back inline into `slot` (and frees it) once it has two members or fewer.
    fn unspill_if_small(&mut self, slot: &mut Slot, i: usize) {
        let Some(set) = self.sets.get_mut(i) else {
            return;
        };
        if set.len() > 2 {
            return;
        }
        *slot = Slot([
            set.first().copied().unwrap_or(NONE),
            set.get(1).copied().unwrap_or(NONE),
        ]);
        set.clear();
        set.shrink_to(8);
        self.free.push(i as u32);
    }
}

/// Drops dead members from `slot` (reclaiming them) and normalises it: inline members are
/// left-aligned and a spilled set with two or fewer members moves back inline. The slot may be
/// left empty.
fn purge(slot: &mut Slot, holders: &mut Holders, spill: &mut SpillTable) {
    if let Some(i) = slot.spill_index() {
        let Some(set) = spill.sets.get_mut(i) else {
            *slot = Slot::EMPTY;
            return;
        };
        set.retain(|&h| {
            let live = holders.is_live(h);
            if !live {
                holders.reclaim_one(h);
            }
            live
        });
        spill.unspill_if_small(slot, i);
        return;
    }
    let mut kept = [NONE; 2];
    let mut n = 0;
    for h in slot.0 {
        if h == NONE {
            continue;
        }
        if holders.is_live(h) {
            kept[n] = h;
            n += 1;
        } else {
            holders.reclaim_one(h);
        }
    }
    *slot = Slot(kept);
}

/// The members of `slot` (live or dead).
fn members<'a>(slot: &'a Slot, spill: &'a SpillTable) -> &'a [HolderId] {
    match slot.spill_index() {
        Some(i) => spill.sets.get(i).map_or(&[], Vec::as_slice),
        None if slot.0[0] == NONE => &[],
        None if slot.0[1] == NONE => &slot.0[..1],
        None => &slot.0,
    }
}

/// Whether `members` (as returned by [`Chunks::members`]) contains `h`. Spilled sets are sorted.
pub(crate) fn has(members: &[HolderId], h: HolderId) -> bool {
    if members.len() <= 8 {
        members.contains(&h)
    } else {
        members.binary_search(&h).is_ok()
    }
}

/// Memory accounting of the reverse index, for benchmarks and `/metrics`.
///
/// Size math: each hot-map bucket is a `u64` key plus an 8-byte slot (16 bytes) plus one
/// control byte, so a table costs `buckets × 17 + 16` bytes. hashbrown keeps at most 7/8 of the
/// buckets full and grows by doubling, so 10M chunks with one holder each need `2^24` buckets
/// (both maps together) ≈ 285 MB ≈ **28.5 bytes per membership**; the range over load factors is
/// ~19.4 B (7/8 full) to ~39 B (just after a resize). A second holder of the same chunk costs
/// nothing extra (inline); from the third holder on, the chunk's set moves to the spill table
/// (a `Vec<u32>`: 24 bytes plus its heap block).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MemoryStats {
    /// Entries (distinct chunk hashes, including entries only dead holders still reference).
    pub map_entries: usize,
    /// Buckets allocated across both hot maps.
    pub map_buckets: usize,
    /// Estimated bytes of both hot maps' tables (`buckets × 17 + 16` each).
    pub map_bytes: usize,
    /// Chunks whose holder set is spilled (more than two holders).
    pub spilled_sets: usize,
    /// Estimated bytes of the spill table (vector headers plus heap blocks).
    pub spill_bytes: usize,
    /// Bytes of the holder table.
    pub holder_table_bytes: usize,
    /// Live (holder, chunk) memberships.
    pub live_memberships: u64,
    /// Tombstoned memberships awaiting compaction.
    pub dead_memberships: u64,
    /// Total estimated bytes divided by live memberships (0 when there are none).
    pub bytes_per_membership: f64,
}

/// Reverse index from chunk hash to the set of holders that hold it.
#[derive(Debug, Default)]
pub(crate) struct Chunks {
    neg: HashMap<u64, Slot>,
    pos: HashMap<u64, Slot>,
    spill: SpillTable,
    holders: Holders,
    compactions: u64,
}

impl Chunks {
    /// Allocates a live holder tagged with `owner`; `None` when the id space is exhausted.
    pub(crate) fn alloc_holder(&mut self, owner: u32) -> Option<HolderId> {
        let meta = HolderMeta {
            state: HolderState::Live,
            owner,
            keys: 0,
        };
        if let Some(h) = self.holders.free.pop() {
            self.holders.meta[h as usize] = meta;
            return Some(h);
        }
        if self.holders.meta.len() >= MAX_HOLDERS {
            return None;
        }
        self.holders.meta.push(meta);
        HolderId::try_from(self.holders.meta.len() - 1).ok()
    }

    /// Tombstones holder `h`: all its memberships disappear from lookups and counts at once.
    pub(crate) fn kill_holder(&mut self, h: HolderId) {
        let Some(m) = self.holders.meta.get_mut(h as usize) else {
            return;
        };
        if m.state != HolderState::Live {
            return;
        }
        self.holders.live_members = self.holders.live_members.saturating_sub(m.keys);
        if m.keys == 0 {
            m.state = HolderState::Free;
            self.holders.free.push(h);
        } else {
            m.state = HolderState::Dead;
            self.holders.dead_members += m.keys;
        }
    }

    /// Whether `h` is a live holder.
    pub(crate) fn is_live(&self, h: HolderId) -> bool {
        self.holders.is_live(h)
    }

    /// The owner tag of holder `h`.
    pub(crate) fn owner(&self, h: HolderId) -> u32 {
        self.holders
            .meta
            .get(h as usize)
            .map_or(u32::MAX, |m| m.owner)
    }

    /// Exact key count of holder `h` (0 unless live).
    pub(crate) fn key_count(&self, h: HolderId) -> u64 {
        match self.holders.meta.get(h as usize) {
            Some(m) if m.state == HolderState::Live => m.keys,
            _ => 0,
        }
    }

    /// Live memberships.
    pub(crate) fn live_members(&self) -> u64 {
        self.holders.live_members
    }

    /// Tombstoned memberships not yet reclaimed.
    pub(crate) fn dead_members(&self) -> u64 {
        self.holders.dead_members
    }

    fn map(&self, key: ChunkHash) -> (&HashMap<u64, Slot>, u64) {
        let (negative, bits) = key.split();
        (if negative { &self.neg } else { &self.pos }, bits)
    }

    /// Adds `key` to live holder `h`; returns whether it was new.
    pub(crate) fn admit(&mut self, h: HolderId, key: ChunkHash) -> bool {
        let (negative, bits) = key.split();
        let map = if negative {
            &mut self.neg
        } else {
            &mut self.pos
        };
        let holders = &mut self.holders;
        let spill = &mut self.spill;
        let added = match map.entry(bits) {
            Entry::Vacant(v) => {
                v.insert(Slot([h, NONE]));
                true
            }
            Entry::Occupied(mut o) => {
                let slot = o.get_mut();
                purge(slot, holders, spill);
                insert(slot, h, spill)
            }
        };
        if added {
            if let Some(m) = holders.meta.get_mut(h as usize) {
                m.keys += 1;
            }
            holders.live_members += 1;
        }
        added
    }

    /// Removes `key` from live holder `h`; returns whether it was present.
    pub(crate) fn evict(&mut self, h: HolderId, key: ChunkHash) -> bool {
        let (negative, bits) = key.split();
        let map = if negative {
            &mut self.neg
        } else {
            &mut self.pos
        };
        let Entry::Occupied(mut o) = map.entry(bits) else {
            return false;
        };
        let holders = &mut self.holders;
        let spill = &mut self.spill;
        let slot = o.get_mut();
        purge(slot, holders, spill);
        let removed = remove(slot, h, spill);
        if slot.is_empty() {
            o.remove();
        }
        if removed {
            if let Some(m) = holders.meta.get_mut(h as usize) {
                m.keys = m.keys.saturating_sub(1);
            }
            holders.live_members = holders.live_members.saturating_sub(1);
        }
        removed
    }

    /// All holder ids stored for `key`, live or dead (spilled sets are sorted). Use with
    /// [`has`] and [`Chunks::is_live`].
    pub(crate) fn members(&self, key: ChunkHash) -> &[HolderId] {
        let (map, bits) = self.map(key);
        map.get(&bits)
            .map_or(&[], |slot| members(slot, &self.spill))
    }

    /// The live holders of `key`.
    pub(crate) fn live_holders(&self, key: ChunkHash) -> impl Iterator<Item = HolderId> + '_ {
        self.members(key)
            .iter()
            .copied()
            .filter(|&h| self.holders.is_live(h))
    }

    /// Every live membership, `(holder, key)`, in map order (one pass over the maps).
    pub(crate) fn memberships(&self) -> impl Iterator<Item = (HolderId, ChunkHash)> + '_ {
        [(true, &self.neg), (false, &self.pos)]
            .into_iter()
            .flat_map(move |(negative, map)| {
                map.iter().flat_map(move |(&bits, slot)| {
                    members(slot, &self.spill)
                        .iter()
                        .copied()
                        .filter(|&h| self.holders.is_live(h))
                        .map(move |h| (h, ChunkHash::join(negative, bits)))
                })
            })
    }

    /// Every key of live holder `h`, sorted (full scan; for tests and debugging).
    pub(crate) fn keys_of(&self, h: HolderId) -> Vec<ChunkHash> {
        if !self.is_live(h) {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (negative, map) in [(true, &self.neg), (false, &self.pos)] {
            for (&bits, slot) in map {
                if has(members(slot, &self.spill), h) {
                    out.push(ChunkHash::join(negative, bits));
                }
            }
        }
        out.sort_unstable();
        out
    }

    /// Whether dead memberships are at least `min_dead` and at least a quarter of all.
    pub(crate) fn needs_compaction(&self, min_dead: u64) -> bool {
        let dead = self.holders.dead_members;
        dead > 0 && dead >= min_dead && dead.saturating_mul(4) >= dead + self.holders.live_members
    }

    /// Reclaims every tombstoned membership in one pass over the maps and frees dead holder
    /// ids; returns how many memberships were reclaimed.
    pub(crate) fn compact(&mut self) -> u64 {
        let before = self.holders.dead_members;
        if before == 0 {
            return 0;
        }
        let holders = &mut self.holders;
        let spill = &mut self.spill;
        for map in [&mut self.neg, &mut self.pos] {
            map.retain(|_, slot| {
                purge(slot, holders, spill);
                !slot.is_empty()
            });
            if map.capacity() > 64 && map.len() < map.capacity() / 4 {
                map.shrink_to(map.len() * 2);
            }
        }
        // Every dead membership is gone now; free any id the counters did not already free.
        for (i, m) in holders.meta.iter_mut().enumerate() {
            if m.state == HolderState::Dead {
                m.state = HolderState::Free;
                m.keys = 0;
                holders.free.push(i as HolderId);
            }
        }
        holders.dead_members = 0;
        self.compactions += 1;
        before
    }

    /// How many compactions have run.
    pub(crate) fn compactions(&self) -> u64 {
        self.compactions
    }

    /// Memory accounting; see [`MemoryStats`] for the size math.
    pub(crate) fn memory_stats(&self) -> MemoryStats {
        let bucket = std::mem::size_of::<(u64, Slot)>();
        let mut map_entries = 0;
        let mut map_buckets = 0;
        let mut map_bytes = 0;
        for map in [&self.neg, &self.pos] {
            let buckets = buckets_for_capacity(map.capacity());
            map_entries += map.len();
            map_buckets += buckets;
            if buckets > 0 {
                map_bytes += buckets * (bucket + 1) + GROUP_WIDTH;
            }
        }
        let vec_header = std::mem::size_of::<Vec<HolderId>>();
        let spill_bytes = self
            .spill
            .sets
            .iter()
            .map(|s| vec_header + s.capacity() * 4)
            .sum::<usize>()
            + self.spill.free.capacity() * 4;
        let holder_table_bytes = self.holders.meta.capacity() * std::mem::size_of::<HolderMeta>()
            + self.holders.free.capacity() * 4;
        let live = self.holders.live_members;
        let total = map_bytes + spill_bytes + holder_table_bytes;
        MemoryStats {
            map_entries,
            map_buckets,
            map_bytes,
            spilled_sets: self.spill.sets.len() - self.spill.free.len(),
            spill_bytes,
            holder_table_bytes,
            live_memberships: live,
            dead_memberships: self.holders.dead_members,
            bytes_per_membership: if live == 0 {
                0.0
            } else {
                total as f64 / live as f64
            },
        }
    }
}

/// Inverse of hashbrown's `bucket_mask_to_capacity`.
fn buckets_for_capacity(cap: usize) -> usize {
    match cap {
        0 => 0,
        1..=7 => cap + 1,
        _ => cap / 7 * 8,
    }
}

/// Adds live `h` to a purged slot; returns whether it was new.
fn insert(slot: &mut Slot, h: HolderId, spill: &mut SpillTable) -> bool {
    if let Some(i) = slot.spill_index() {
        let Some(set) = spill.sets.get_mut(i) else {
            return false;
        };
        return match set.binary_search(&h) {
            Ok(_) => false,
            Err(pos) => {
                set.insert(pos, h);
                true
            }
        };
    }
    let [a, b] = slot.0;
    if a == h || b == h {
        false
    } else if a == NONE {
        *slot = Slot([h, NONE]);
        true
    } else if b == NONE {
        *slot = Slot([a, h]);
        true
    } else {
        let mut sorted = [a, b, h];
        sorted.sort_unstable();
        match spill.alloc(sorted) {
            Some(i) => {
                *slot = Slot([SPILL | i, NONE]);
                true
            }
            None => false,
        }
    }
}

/// Removes `h` from a purged slot; returns whether it was present.
fn remove(slot: &mut Slot, h: HolderId, spill: &mut SpillTable) -> bool {
    if let Some(i) = slot.spill_index() {
        let Some(set) = spill.sets.get_mut(i) else {
            return false;
        };
        let Ok(pos) = set.binary_search(&h) else {
            return false;
        };
        set.remove(pos);
        spill.unspill_if_small(slot, i);
        return true;
    }
    let [a, b] = slot.0;
    if a == h {
        *slot = Slot([b, NONE]);
        true
    } else if b == h && b != NONE {
        *slot = Slot([a, NONE]);
        true
    } else {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(v: i64) -> ChunkHash {
        ChunkHash::from_i64(v)
    }

    #[test]
    fn slot_is_eight_bytes_and_bucket_sixteen() {
        assert_eq!(std::mem::size_of::<Slot>(), 8);
        assert_eq!(std::mem::size_of::<(u64, Slot)>(), 16);
    }

    #[test]
    fn admit_is_idempotent_and_evict_of_absent_is_noop() {
        let mut c = Chunks::default();
        let h = c.alloc_holder(0).unwrap();
        assert!(c.admit(h, k(1)));
        assert!(!c.admit(h, k(1)));
        assert_eq!(c.key_count(h), 1);
        assert!(!c.evict(h, k(2)));
        assert!(c.evict(h, k(1)));
        assert!(!c.evict(h, k(1)));
        assert_eq!(c.key_count(h), 0);
        assert_eq!(c.memory_stats().map_entries, 0);
    }

    #[test]
    fn spill_and_unspill() {
        let mut c = Chunks::default();
        let hs: Vec<_> = (0..5).map(|i| c.alloc_holder(i).unwrap()).collect();
        for &h in hs.iter().rev() {
            assert!(c.admit(h, k(7)));
        }
        assert_eq!(c.members(k(7)), &[0, 1, 2, 3, 4]);
        assert_eq!(c.memory_stats().spilled_sets, 1);
        for &h in &hs[..3] {
            assert!(c.evict(h, k(7)));
        }
        assert_eq!(c.memory_stats().spilled_sets, 0);
        let mut m = c.members(k(7)).to_vec();
        m.sort_unstable();
        assert_eq!(m, vec![3, 4]);
        assert_eq!(c.live_members(), 2);
    }

    #[test]
    fn tombstone_then_compact_frees_ids() {
        let mut c = Chunks::default();
        let a = c.alloc_holder(0).unwrap();
        let b = c.alloc_holder(1).unwrap();
        for v in 0..100 {
            c.admit(a, k(v));
            c.admit(b, k(v));
        }
        c.kill_holder(a);
        assert_eq!(c.live_members(), 100);
        assert_eq!(c.dead_members(), 100);
        assert_eq!(c.live_holders(k(5)).collect::<Vec<_>>(), vec![b]);
        assert!(c.needs_compaction(10));
        assert_eq!(c.compact(), 100);
        assert_eq!(c.dead_members(), 0);
        assert_eq!(c.members(k(5)), &[b]);
        // The freed id is reused and starts empty.
        let a2 = c.alloc_holder(2).unwrap();
        assert_eq!(a2, a);
        assert_eq!(c.key_count(a2), 0);
        assert!(c.keys_of(a2).is_empty());
    }

    #[test]
    fn touching_a_slot_reclaims_dead_members() {
        let mut c = Chunks::default();
        let a = c.alloc_holder(0).unwrap();
        let b = c.alloc_holder(1).unwrap();
        c.admit(a, k(1));
        c.admit(b, k(1));
        c.kill_holder(a);
        c.kill_holder(b);
        let x = c.alloc_holder(2).unwrap();
        assert!(c.admit(x, k(1)));
        // Both dead members were reclaimed instead of spilling, and their ids freed.
        assert_eq!(c.members(k(1)), &[x]);
        assert_eq!(c.dead_members(), 0);
        assert_eq!(c.memory_stats().spilled_sets, 0);
        assert!(c.alloc_holder(3).is_some_and(|h| h == a || h == b));
    }

    #[test]
    fn negative_and_unsigned_with_same_bits_are_distinct() {
        let mut c = Chunks::default();
        let h = c.alloc_holder(0).unwrap();
        let neg = ChunkHash::from_i64(-16);
        let pos = ChunkHash::from_u64(u64::MAX - 15);
        c.admit(h, neg);
        assert!(c.members(pos).is_empty());
        c.admit(h, pos);
        assert_eq!(c.keys_of(h), vec![neg, pos]);
        c.evict(h, neg);
        assert_eq!(c.keys_of(h), vec![pos]);
    }

    #[test]
    fn bucket_inverse_matches_hashbrown() {
        for n in [1usize, 3, 7, 8, 100, 1000, 5000] {
            let m: HashMap<u64, Slot> = HashMap::with_capacity(n);
            let b = buckets_for_capacity(m.capacity());
            assert!(b.is_power_of_two(), "{n} -> {b}");
            assert!(b > m.capacity());
        }
    }
}
