//! An open-addressing table of 4-byte record ids, for the membership store ([`super::table`]).
//!
//! Each slot is one `u32`: the record id in its low `id_bits` and, above it, a tag of the
//! key's hash that filters out most candidates without reading their records. There is no
//! control byte and no stored hash: a slot costs 4 bytes, and a lookup reads only the records
//! whose tag matches (1 in 256 of the other slots it scans with the 24-bit ids of a 10M-record
//! arena, 1 in 65,536 with the 16-bit ids of a small one).
//!
//! Slots come in groups of 16 (one 64-byte cache line). A key's home group is its hash
//! scaled to the number of groups (any number: the table grows by a quarter, not by
//! doubling, so it runs between 70% and 87.5% full), and a full group overflows into the
//! next one. A search scans groups until one with an empty slot. A removal leaves an empty
//! slot when its group has one already (no search can have gone past that group since it was
//! last full) and a tombstone otherwise; tombstones count as full until the next rebuild.
//!
//! The table does not know its keys: the caller passes the hash and, for a lookup, a test of
//! a candidate id. Growing is the caller's job too (it rebuilds from its records), which is
//! why [`IdTable::full`] only says when.

/// Slots per group: one cache line of `u32`s.
const GROUP: usize = 16;
/// A slot that never held an id since the group was last empty of tombstones.
const EMPTY: u32 = u32::MAX;
/// A slot whose id was removed while the group was full.
const TOMB: u32 = u32::MAX - 1;
/// Most slots in use (ids and tombstones) before the table must grow: 7/8.
const MAX_LOAD: (usize, usize) = (7, 8);
/// A rebuilt table has room for this many times the ids it holds: 5/4 (70% full).
const GROWTH: (usize, usize) = (5, 4);
/// The narrowest tag: ids are at most 28 bits.
pub(crate) const MAX_ID_BITS: u32 = 28;
/// The widest tag: ids are at least 16 bits.
pub(crate) const MIN_ID_BITS: u32 = 16;

#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Group([u32; GROUP]);

const EMPTY_GROUP: Group = Group([EMPTY; GROUP]);

impl Group {
    /// Bit `i` set in the first mask for each slot holding an id under `tag` (the bits of
    /// `tag_bits`), in the second for each empty slot. Branch-free, so that the compiler
    /// compares the 16 slots a vector at a time.
    #[inline(always)]
    fn scan(&self, tag: u32, tag_bits: u32) -> (u32, u32) {
        let (mut hits, mut open) = (0u32, 0u32);
        for (i, &e) in self.0.iter().enumerate() {
            // The markers have all-ones tags: `e < TOMB` keeps them out of the hits.
            hits |= u32::from((e & tag_bits == tag) & (e < TOMB)) << i;
            open |= u32::from(e == EMPTY) << i;
        }
        (hits, open)
    }
}

impl Group {
    /// Whether some slot holds an id under `tag` (or, when `tag` is all of `tag_bits`, a
    /// marker), and whether some slot is empty: one compare a vector at a time and no bit
    /// per slot, so that a probe whose group holds no candidate (most of them) is done in a
    /// few instructions; [`Group::scan`] is for a group that does.
    #[inline(always)]
    fn quick(&self, tag: u32, tag_bits: u32) -> (bool, bool) {
        let (mut candidate, mut open) = (false, false);
        for &e in &self.0 {
            candidate |= e & tag_bits == tag;
            open |= e == EMPTY;
        }
        (candidate, open)
    }
}

/// The largest id a table of `id_bits`-bit ids holds (the two values above it, with an
/// all-ones tag, are the empty and tombstone markers).
pub(crate) fn max_id(id_bits: u32) -> u32 {
    (1u32 << id_bits) - 3
}

/// A table of record ids under 64-bit hashes.
#[derive(Debug)]
pub(crate) struct IdTable {
    groups: Vec<Group>,
    len: usize,
    tombs: usize,
    id_bits: u32,
}

impl IdTable {
    /// A table with room for `n` ids of `id_bits` bits before it is [`IdTable::full`], sized
    /// so that holding `n` it is about 70% full.
    pub(crate) fn with_room(n: usize, id_bits: u32) -> Self {
        debug_assert!((MIN_ID_BITS..=MAX_ID_BITS).contains(&id_bits));
        let want = n.max(1).saturating_mul(GROWTH.0).div_ceil(GROWTH.1);
        let slots = want.saturating_mul(MAX_LOAD.1).div_ceil(MAX_LOAD.0);
        let groups = slots.div_ceil(GROUP).max(1);
        Self {
            groups: vec![EMPTY_GROUP; groups],
            len: 0,
            tombs: 0,
            id_bits,
        }
    }

    /// An empty table of no groups' worth of memory beyond one.
    pub(crate) fn new(id_bits: u32) -> Self {
        Self::with_room(1, id_bits)
    }

    /// Ids held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The id width this table was built for.
    pub(crate) fn id_bits(&self) -> u32 {
        self.id_bits
    }

    /// Slots.
    pub(crate) fn slots(&self) -> usize {
        self.groups.len() * GROUP
    }

    /// Bytes allocated.
    pub(crate) fn allocation_size(&self) -> usize {
        self.groups.capacity() * std::mem::size_of::<Group>()
    }

    /// Whether one more id would take the table past 7/8 of its slots (tombstones count):
    /// the caller rebuilds it before inserting.
    pub(crate) fn full(&self) -> bool {
        (self.len + self.tombs + 1) * MAX_LOAD.1 > self.slots() * MAX_LOAD.0
    }

    #[inline]
    fn home(&self, hash: u64) -> usize {
        ((u128::from(hash) * self.groups.len() as u128) >> 64) as usize
    }

    /// The tag bits of `hash`, in place above the id (the home group takes the high bits of
    /// the hash, the tag some of the low ones).
    #[inline]
    fn tag(&self, hash: u64) -> u32 {
        (hash as u32) >> self.id_bits << self.id_bits
    }

    /// The group a probe goes on to after `g` (the last wraps to the first).
    #[inline]
    fn next_group(&self, g: usize) -> usize {
        if g + 1 == self.groups.len() {
            0
        } else {
            g + 1
        }
    }

    #[inline]
    fn id_mask(&self) -> u32 {
        (1u32 << self.id_bits) - 1
    }

    /// Touches `hash`'s home group, so that a later lookup finds it in cache.
    pub(crate) fn warm(&self, hash: u64) {
        prefetch(&self.groups[self.home(hash)]);
    }

    /// Calls `f(id)` for every id under `hash`'s tag along its probe sequence (a superset of
    /// the ids stored under `hash`); stops early when `f` returns true, and returns that.
    #[inline(always)]
    pub(crate) fn any(&self, hash: u64, mut f: impl FnMut(u32) -> bool) -> bool {
        let tag = self.tag(hash);
        let mask = self.id_mask();
        let mut g = self.home(hash);
        for _ in 0..self.groups.len() {
            let group = &self.groups[g];
            let (candidate, open) = group.quick(tag, !mask);
            if candidate {
                let (mut hits, _) = group.scan(tag, !mask);
                while hits != 0 {
                    let e = group.0[hits.trailing_zeros() as usize];
                    if f(e & mask) {
                        return true;
                    }
                    hits &= hits - 1;
                }
            }
            if open {
                return false;
            }
            g = self.next_group(g);
        }
        false
    }

    /// The first id under `hash` for which `eq` holds.
    pub(crate) fn find(&self, hash: u64, mut eq: impl FnMut(u32) -> bool) -> Option<u32> {
        let mut found = None;
        self.any(hash, |id| {
            if eq(id) {
                found = Some(id);
                true
            } else {
                false
            }
        });
        found
    }

    /// Stores `id` under `hash`. The caller made sure the table is not [`IdTable::full`]
    /// and that `id` fits its id width.
    pub(crate) fn insert(&mut self, hash: u64, id: u32) {
        debug_assert!(id <= max_id(self.id_bits));
        debug_assert!(self.len + self.tombs < self.slots());
        self.place(self.home(hash), self.tag(hash) | id);
    }

    /// Puts `entry` in the first free slot from group `g` on.
    fn place(&mut self, mut g: usize, entry: u32) {
        // Callers keep the table below 7/8 full; a full one would be a bug, and a panic says
        // so where a search for a free slot would go round for ever.
        assert!(self.len + self.tombs < self.slots(), "an id table is full");
        loop {
            let group = &mut self.groups[g].0;
            if let Some(slot) = group.iter_mut().find(|e| **e == EMPTY || **e == TOMB) {
                if *slot == TOMB {
                    self.tombs -= 1;
                }
                *slot = entry;
                self.len += 1;
                return;
            }
            g = self.next_group(g);
        }
    }

    /// Takes `id` out from under `hash`; false when it was not there.
    pub(crate) fn remove(&mut self, hash: u64, id: u32) -> bool {
        let entry = self.tag(hash) | id;
        let mut g = self.home(hash);
        for _ in 0..self.groups.len() {
            let group = &mut self.groups[g].0;
            let open = group.contains(&EMPTY);
            if let Some(slot) = group.iter_mut().find(|e| **e == entry) {
                if open {
                    *slot = EMPTY;
                } else {
                    *slot = TOMB;
                    self.tombs += 1;
                }
                self.len -= 1;
                return true;
            }
            if open {
                return false;
            }
            g = self.next_group(g);
        }
        false
    }
}

/// Builds a table from `(hash, id)` pairs pushed in any order, several times faster than
/// inserting them one by one when the table is big: each pair's home group is prefetched
/// when it is pushed and the pair placed [`AHEAD`] pushes later, so that many cache misses
/// are in flight at once instead of one at a time (at 10M ids each insert was a miss).
/// No memory beyond the table itself.
pub(crate) struct Builder {
    table: IdTable,
    /// Pairs whose home group was prefetched, placed once [`AHEAD`] more arrived.
    ring: [(u32, u32); AHEAD],
    n: usize,
}

/// How many placements a [`Builder`] keeps in flight.
const AHEAD: usize = 32;

impl Builder {
    /// A builder of a table with room for `room` ids of `id_bits` bits.
    pub(crate) fn new(room: usize, id_bits: u32) -> Self {
        Self {
            table: IdTable::with_room(room, id_bits),
            ring: [(0, 0); AHEAD],
            n: 0,
        }
    }

    /// Adds `id` under `hash`.
    pub(crate) fn push(&mut self, hash: u64, id: u32) {
        let g = self.table.home(hash);
        prefetch(&self.table.groups[g]);
        let slot = self.n % AHEAD;
        if self.n >= AHEAD {
            let (g0, e0) = self.ring[slot];
            self.table.place(g0 as usize, e0);
        }
        self.ring[slot] = (g as u32, self.table.tag(hash) | id);
        self.n += 1;
    }

    /// The table.
    pub(crate) fn finish(mut self) -> IdTable {
        let from = self.n.saturating_sub(AHEAD);
        for k in from..self.n {
            let (g, e) = self.ring[k % AHEAD];
            self.table.place(g as usize, e);
        }
        self.table
    }
}

/// Asks for `g`'s cache line, without waiting for it.
#[inline]
#[allow(unsafe_code)]
fn prefetch(g: &Group) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it reads nothing into the program and cannot fault; SSE
    // is part of every x86_64 target.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>((g as *const Group).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = g;
}

/// The narrowest ids that can hold `n` (at least [`MIN_ID_BITS`], at most [`MAX_ID_BITS`]).
pub(crate) fn id_bits_for(n: usize) -> u32 {
    let mut bits = MIN_ID_BITS;
    while bits < MAX_ID_BITS && (max_id(bits) as usize) < n {
        bits += 1;
    }
    bits
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn mix(mut x: u64) -> u64 {
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    }

    #[test]
    fn a_slot_is_four_bytes_and_a_group_one_cache_line() {
        assert_eq!(std::mem::size_of::<Group>(), 64);
        assert_eq!(std::mem::align_of::<Group>(), 64);
        let t = IdTable::with_room(1000, 16);
        assert!(t.slots() >= 1000 * 5 / 4 * 8 / 7);
        assert_eq!(t.allocation_size(), t.slots() * 4);
    }

    #[test]
    fn the_markers_are_never_an_entry() {
        for bits in MIN_ID_BITS..=MAX_ID_BITS {
            let t = IdTable::new(bits);
            for id in [0, 1, max_id(bits)] {
                let e = t.tag(u64::MAX) | id;
                assert!(e != EMPTY && e != TOMB, "{bits} {id}");
            }
        }
    }

    #[test]
    fn a_built_table_finds_what_inserts_find() {
        let n = 300_000u32;
        let key = |id: u32| mix(u64::from(id / 3));
        // Fewer pairs than the ring holds, and many more.
        for count in [AHEAD as u32 / 2, n] {
            let mut b = Builder::new(count as usize, 20);
            (0..count).for_each(|i| b.push(key(i), i));
            let built = b.finish();
            let mut inserted = IdTable::with_room(count as usize, 20);
            (0..count).for_each(|i| inserted.insert(key(i), i));
            assert_eq!(
                (built.len(), built.slots()),
                (inserted.len(), inserted.slots())
            );
            for i in (0..count).step_by(7) {
                assert_eq!(built.find(key(i), |j| j == i), Some(i));
                let (mut a, mut b) = (Vec::new(), Vec::new());
                built.any(key(i), |j| {
                    a.push(j);
                    false
                });
                inserted.any(key(i), |j| {
                    b.push(j);
                    false
                });
                a.sort_unstable();
                b.sort_unstable();
                assert_eq!(a, b);
            }
            assert_eq!(built.find(key(n + 10), |_| true), None);
        }
    }

    /// Keys whose tag is all ones, as the markers' are: the quick check of a group takes its
    /// empty slots and tombstones for candidates, and a probe still yields only stored ids,
    /// every one under its key included.
    #[test]
    fn an_all_ones_tag_never_yields_a_marker() {
        let mut t = IdTable::with_room(64, 16);
        // The low 32 bits all ones: the tag is all ones. The home group is group 0 for every
        // key, so the 40 ids fill it and overflow, and removals from it leave tombstones.
        let key = |i: u32| (u64::from(i % 4) << 40) | u64::from(u32::MAX);
        (0..40u32).for_each(|i| t.insert(key(i), i));
        for i in (0..40u32).step_by(3) {
            assert!(t.remove(key(i), i));
        }
        assert!(t.tombs > 0);
        for k in 0..4u32 {
            let mut seen = Vec::new();
            t.any(key(k), |id| {
                seen.push(id);
                false
            });
            assert!(seen.iter().all(|&id| id < 40 && id % 3 != 0), "{seen:?}");
            for i in (0..40u32).filter(|i| i % 4 == k && i % 3 != 0) {
                assert!(seen.contains(&i), "{i} {seen:?}");
                assert_eq!(t.find(key(i), |j| j == i), Some(i));
            }
            assert_eq!(t.find(key(k), |j| j >= 40), None);
        }
    }

    #[test]
    fn id_widths_hold_their_counts() {
        assert_eq!(id_bits_for(0), MIN_ID_BITS);
        assert_eq!(id_bits_for(max_id(20) as usize), 20);
        assert_eq!(id_bits_for(max_id(20) as usize + 1), 21);
        assert_eq!(id_bits_for(usize::MAX), MAX_ID_BITS);
    }

    /// Random inserts and removals of ids under colliding keys (a key is `id % 97`, so many
    /// ids share one), checked against a model, through growth by rebuilding.
    #[test]
    fn matches_a_model_under_random_inserts_and_removals() {
        let key = |id: u32| mix(u64::from(id % 97));
        let mut t = IdTable::new(16);
        let mut model: BTreeMap<u32, ()> = BTreeMap::new();
        let mut x: u64 = 0x9e37_79b9;
        for step in 0..200_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let id = (x % 3000) as u32;
            if model.contains_key(&id) {
                if x & (1 << 40) != 0 {
                    assert!(t.remove(key(id), id));
                    model.remove(&id);
                }
            } else {
                if t.full() {
                    let mut n = IdTable::with_room(model.len() + 1, 16);
                    for &i in model.keys() {
                        n.insert(key(i), i);
                    }
                    t = n;
                }
                t.insert(key(id), id);
                model.insert(id, ());
            }
            assert_eq!(t.len(), model.len());
            if step % 997 == 0 {
                for probe in 0..3000u32 {
                    let found = t.find(key(probe), |i| i == probe);
                    assert_eq!(found.is_some(), model.contains_key(&probe), "{probe}");
                }
            }
            // Every id under one key, exactly once.
            let k = (x % 97) as u32;
            let mut under = Vec::new();
            t.any(mix(u64::from(k)), |i| {
                if i % 97 == k {
                    under.push(i);
                }
                false
            });
            under.sort_unstable();
            let want: Vec<u32> = model.keys().copied().filter(|i| i % 97 == k).collect();
            assert_eq!(under, want);
        }
    }
}
