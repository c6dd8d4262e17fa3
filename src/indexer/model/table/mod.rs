//! The membership store: one 22-byte record per `(stream, engine hash)` in one dense arena,
//! found through two tables of 4-byte record ids ([`super::idtable`]).
//!
//! Memory is the point of this file. A record holds the block's standard sequence hash, the
//! engine's hash, a lane (the `(stream, namespace)` pair, from a small side table), the
//! per-tier references, a chain bit and the last store time. No record owns an allocation;
//! freed records are reused, so the arena never outgrows the peak of live records.
//!
//! * `by_engine` finds a record from `(stream, engine hash)`: removals, parents, token-less
//!   offload stores. Every live record is in it.
//! * `by_block` finds the records of a `(namespace, sequence hash)` for queries, but only the
//!   chain **heads**. A record stored right after its parent in the arena (the next block of
//!   the same stream's chain, which is how a prompt's blocks arrive) is marked as continuing
//!   it and is not in `by_block`: a query that matched the parent reads the next record and
//!   compares its sequence hash. A query starts at a prompt's first block, which has no
//!   parent and so is always a head; from there every record of the prompt is either a head
//!   or the continuation of a record the query already matched. When a record goes, the one
//!   continuing it becomes a head. So a prompt stored in one piece costs one `by_block` entry,
//!   not one per block, and a query reads its blocks in arena order.
//!
//! Records sit at stable positions, which is what the TTL sweep and capacity eviction walk:
//! in slices of the arena, not stream by stream. Keys are hashed with a 64-bit finalizer
//! ([`mix`]) over the key and a per-process random value, so an engine choosing its hashes
//! cannot choose their table slots.

use super::events::Medium;
use super::idtable::{self, Builder, IdTable, MAX_ID_BITS, MIN_ID_BITS};
use std::collections::HashMap;

/// A record's position in the arena.
pub(crate) type RecId = u32;

/// End of the free list.
const NIL: u32 = u32::MAX;

/// The most references an offload tier (CPU, disk) counts; more stores saturate.
pub(crate) const MAX_OFFLOAD_REFS: u8 = 15;

const LANE_BITS: u32 = 22;
const LANE_MASK: u32 = (1 << LANE_BITS) - 1;
/// At most this many `(stream, namespace)` lanes at once (the all-ones lane marks a free
/// record).
pub(crate) const MAX_LANES: usize = LANE_MASK as usize;
const GPU_SHIFT: u32 = LANE_BITS;
const GPU_BIT: u32 = 1 << GPU_SHIFT;
const CPU_SHIFT: u32 = 23;
const DISK_SHIFT: u32 = 27;
const TIERS: u32 = 0x1ff << GPU_SHIFT;
/// The record continues the one before it in the arena (and is not in `by_block`).
const CONT: u32 = 1 << 31;
/// The `meta` of a record on the free list.
const FREE: u32 = LANE_MASK;

/// Ages of at most this many ticks are exact; the sweep clamps older ones to it, so that the
/// 16-bit store times never wrap into looking young. That holds while the sweep visits
/// every record at least every `2^16 - MAX_AGE` ticks (13.6 hours of 1-second ticks).
pub(crate) const MAX_AGE: u32 = 1 << 14;

/// One stream's block: a sequence hash stored under an engine hash.
///
/// Packed to 22 bytes (alignment 2): `seq` and `engine` are read unaligned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C, packed(2))]
pub(crate) struct Rec {
    /// The standard sequence hash (the next free record, while free).
    seq: u64,
    /// The engine's hash (the previous free record, while free).
    engine: u64,
    /// The lane (22 bits), GPU held (1 bit), CPU and disk references (4 bits each), and the
    /// chain bit [`CONT`].
    meta: u32,
    /// The last store time, in ticks, wrapping.
    touched: u16,
}

impl Rec {
    /// The standard sequence hash.
    #[inline]
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    /// The engine's hash.
    #[cfg(test)]
    pub(crate) fn engine(&self) -> u64 {
        self.engine
    }

    #[inline]
    fn lane(&self) -> usize {
        (self.meta & LANE_MASK) as usize
    }

    /// References on `tier`.
    pub(crate) fn refs(&self, tier: Medium) -> u8 {
        let m = self.meta;
        (match tier {
            Medium::Gpu | Medium::Other(_) => u32::from(m & GPU_BIT != 0),
            Medium::Cpu => (m >> CPU_SHIFT) & 0xf,
            Medium::Disk => (m >> DISK_SHIFT) & 0xf,
        }) as u8
    }

    fn set_refs(&mut self, tier: Medium, n: u8) {
        let (shift, width, cap) = match tier {
            Medium::Gpu | Medium::Other(_) => (GPU_SHIFT, 1, 1),
            Medium::Cpu => (CPU_SHIFT, 0xf, MAX_OFFLOAD_REFS),
            Medium::Disk => (DISK_SHIFT, 0xf, MAX_OFFLOAD_REFS),
        };
        let m = self.meta & !(width << shift);
        self.meta = m | u32::from(n.min(cap)) << shift;
    }

    /// Bit `t` set for every tier `t` held (GPU 1, CPU 2, disk 4).
    #[inline]
    pub(crate) fn mask(&self) -> u8 {
        let m = self.meta;
        u8::from(m & GPU_BIT != 0)
            | u8::from((m >> CPU_SHIFT) & 0xf != 0) << 1
            | u8::from((m >> DISK_SHIFT) & 0xf != 0) << 2
    }

    /// Age at `tick` (the store's clock), in ticks: exact up to [`MAX_AGE`], which is the
    /// most it says for an older record once the sweep clamped it.
    pub(crate) fn age(&self, tick: u16) -> u32 {
        u32::from(tick.wrapping_sub(self.touched))
    }

    /// Whether the record holds nothing (free, or about to be freed).
    pub(crate) fn is_free(&self) -> bool {
        self.meta & TIERS == 0
    }

    #[inline]
    fn continues(&self) -> bool {
        self.meta & (CONT | TIERS) > CONT
    }
}

/// MurmurHash3's 64-bit finalizer: every input bit reaches every output bit, so keys that
/// differ only in high bits (sequential engine hashes, say) still spread over the groups.
#[inline]
pub(crate) fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// A record's key in `by_engine`.
fn engine_key(key: u64, stream: u16, engine: u64) -> u64 {
    mix(engine ^ key ^ u64::from(stream).wrapping_mul(0xd6e8_feb8_6659_fd93))
}

/// A chain head's key in `by_block`.
#[inline]
fn block_key(key: u64, ns: u32, seq: u64) -> u64 {
    mix(seq ^ key.rotate_left(32) ^ u64::from(ns).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// A `(stream, namespace)` pair that records refer to by a 22-bit id.
#[derive(Clone, Copy, Debug)]
struct Lane {
    stream: u16,
    ns: u32,
    /// Live records in the lane (0: the lane is freed at the next [`Store::collect_lanes`]).
    records: u32,
}

/// A lane's id, valid until the next [`Store::collect_lanes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LaneId(u32);

/// The records, their two tables, the lanes and the counts the index reports.
#[derive(Debug)]
pub(crate) struct Store {
    recs: Vec<Rec>,
    free: u32,
    by_engine: IdTable,
    by_block: IdTable,
    lanes: Vec<Lane>,
    free_lanes: Vec<u32>,
    lane_of: HashMap<(u16, u32), u32>,
    /// Lanes per namespace id.
    ns_lanes: Vec<u32>,
    /// Lanes whose record count fell to 0 (or that never got one), to free.
    emptied: Vec<u32>,
    /// Namespaces whose last lane went, for the index to forget.
    released_ns: Vec<u32>,
    tick_secs: u32,
    key: u64,
    memberships: usize,
    live: usize,
    /// Live records not continuing the one before them (what `by_block` holds once a batch
    /// of frees is done).
    heads: usize,
}

impl Store {
    /// An empty store whose store times count in ticks of `tick_secs` seconds.
    pub(crate) fn new(tick_secs: u32) -> Self {
        use std::hash::BuildHasher;
        Self {
            recs: Vec::new(),
            free: NIL,
            by_engine: IdTable::new(MIN_ID_BITS),
            by_block: IdTable::new(MIN_ID_BITS),
            lanes: Vec::new(),
            free_lanes: Vec::new(),
            lane_of: HashMap::new(),
            ns_lanes: Vec::new(),
            emptied: Vec::new(),
            released_ns: Vec::new(),
            tick_secs: tick_secs.max(1),
            key: std::collections::hash_map::RandomState::new().hash_one(0x006b_7670_6c61_6e65_u64),
            memberships: 0,
            live: 0,
            heads: 0,
        }
    }

    /// `(stream, tier, block)` memberships held: each record counts once per tier it holds.
    pub(crate) fn memberships(&self) -> usize {
        self.memberships
    }

    /// Live records (`(stream, block)` pairs, whatever tiers they hold).
    pub(crate) fn records(&self) -> usize {
        self.live
    }

    /// Chain heads: records a query finds through `by_block`.
    pub(crate) fn heads(&self) -> usize {
        self.heads
    }

    /// Lanes in use.
    #[cfg(test)]
    pub(crate) fn lanes(&self) -> usize {
        self.lanes.len() - self.free_lanes.len()
    }

    /// The arena's length: record ids are below it.
    pub(crate) fn arena_len(&self) -> usize {
        self.recs.len()
    }

    /// Bytes allocated: the arena, both tables and the lanes.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.recs.capacity() * std::mem::size_of::<Rec>()
            + self.by_engine.allocation_size()
            + self.by_block.allocation_size()
            + self.lanes.capacity() * std::mem::size_of::<Lane>()
    }

    /// The record at `id`.
    #[inline]
    pub(crate) fn rec(&self, id: RecId) -> Rec {
        self.recs[id as usize]
    }

    /// The stream of a live record.
    #[inline]
    pub(crate) fn stream_of(&self, r: &Rec) -> u16 {
        self.lanes[r.lane()].stream
    }

    /// The namespace of a live record.
    pub(crate) fn ns_of(&self, r: &Rec) -> u32 {
        self.lanes[r.lane()].ns
    }

    /// Clamps record `id`'s age at `tick` to [`MAX_AGE`] if it is older; true when it did.
    pub(crate) fn clamp_age(&mut self, id: RecId, tick: u16) -> bool {
        let r = &mut self.recs[id as usize];
        if r.age(tick) <= MAX_AGE {
            return false;
        }
        r.touched = tick.wrapping_sub(MAX_AGE as u16);
        true
    }

    /// Seconds per tick of the store's clock.
    pub(crate) fn tick_secs(&self) -> u32 {
        self.tick_secs
    }

    /// The store's clock at `now` (seconds): ticks, wrapping at 16 bits.
    pub(crate) fn tick(&self, now: u32) -> u16 {
        (now / self.tick_secs) as u16
    }

    fn engine_key(&self, stream: u16, engine: u64) -> u64 {
        engine_key(self.key, stream, engine)
    }

    #[inline]
    fn block_key(&self, ns: u32, seq: u64) -> u64 {
        block_key(self.key, ns, seq)
    }

    fn rec_engine_key(&self, r: &Rec) -> u64 {
        self.engine_key(self.stream_of(r), r.engine)
    }

    fn rec_block_key(&self, r: &Rec) -> u64 {
        self.block_key(self.ns_of(r), r.seq)
    }

    /// The lane of `(stream, ns)`, made if new; `None` when [`MAX_LANES`] are in use. Valid
    /// until the next [`Store::collect_lanes`].
    pub(crate) fn lane(&mut self, stream: u16, ns: u32) -> Option<LaneId> {
        if let Some(&l) = self.lane_of.get(&(stream, ns)) {
            return Some(LaneId(l));
        }
        let lane = Lane {
            stream,
            ns,
            records: 0,
        };
        let l = match self.free_lanes.pop() {
            Some(l) => {
                self.lanes[l as usize] = lane;
                l
            }
            None if self.lanes.len() < MAX_LANES => {
                self.lanes.push(lane);
                (self.lanes.len() - 1) as u32
            }
            None => return None,
        };
        self.lane_of.insert((stream, ns), l);
        let ns = ns as usize;
        if self.ns_lanes.len() <= ns {
            self.ns_lanes.resize(ns + 1, 0);
        }
        self.ns_lanes[ns] += 1;
        // Until a record is stored in it.
        self.emptied.push(l);
        Some(LaneId(l))
    }

    /// The stream and namespace of a lane.
    pub(crate) fn lane_parts(&self, lane: LaneId) -> (u16, u32) {
        let l = &self.lanes[lane.0 as usize];
        (l.stream, l.ns)
    }

    /// Frees the lanes left without records (their namespaces may then be released: see
    /// [`Store::take_released_ns`]). Lane ids taken before are invalid after.
    pub(crate) fn collect_lanes(&mut self) {
        for l in std::mem::take(&mut self.emptied) {
            let lane = self.lanes[l as usize];
            if lane.records != 0 || self.lane_of.get(&(lane.stream, lane.ns)) != Some(&l) {
                continue;
            }
            self.lane_of.remove(&(lane.stream, lane.ns));
            self.free_lanes.push(l);
            let n = &mut self.ns_lanes[lane.ns as usize];
            *n -= 1;
            if *n == 0 {
                self.released_ns.push(lane.ns);
            }
        }
    }

    /// Namespaces no lane refers to any more (each once), for the index to forget.
    pub(crate) fn take_released_ns(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.released_ns)
    }

    /// Whether a lane refers to namespace `ns`.
    pub(crate) fn ns_in_use(&self, ns: u32) -> bool {
        self.ns_lanes.get(ns as usize).is_some_and(|&n| n > 0)
    }

    /// The record `stream` stored under `engine`.
    pub(crate) fn find_engine(&self, stream: u16, engine: u64) -> Option<RecId> {
        let recs = &self.recs;
        let lanes = &self.lanes;
        self.by_engine.find(self.engine_key(stream, engine), |i| {
            let r = &recs[i as usize];
            r.engine == engine && lanes[r.lane()].stream == stream
        })
    }

    /// Reads the table slots a lookup of `(stream, engine)` will touch, so that a caller
    /// warming a whole event's blocks first has their cache misses overlap (the reads are
    /// independent) instead of paying them one after another in the stores.
    pub(crate) fn warm(&self, stream: u16, engine: u64) {
        self.by_engine.warm(self.engine_key(stream, engine));
    }

    /// Calls `f` with every chain head holding `(ns, seq)`.
    #[inline(always)]
    pub(crate) fn for_each_head(&self, ns: u32, seq: u64, mut f: impl FnMut(RecId)) {
        let recs = &self.recs;
        let lanes = &self.lanes;
        self.by_block.any(self.block_key(ns, seq), |i| {
            let r = &recs[i as usize];
            if r.seq == seq && lanes[r.lane()].ns == ns {
                f(i);
            }
            false
        });
    }

    /// The record continuing `id` in its chain, if it holds `seq`.
    #[inline]
    pub(crate) fn next_in_chain(&self, id: RecId, seq: u64) -> Option<RecId> {
        let next = id as usize + 1;
        let r = self.recs.get(next)?;
        (r.continues() && r.seq == seq).then_some(next as RecId)
    }

    /// A new record of `lane` holding one reference on `tier`; `parent` is the record of the
    /// block before it in the chain with its sequence hash, when `seq` was chained from it.
    /// The caller knows the lane's stream has no record under `engine`. `None` when the
    /// arena holds [`idtable::max_id`] of 28 bits already.
    pub(crate) fn insert(
        &mut self,
        lane: LaneId,
        engine: u64,
        seq: u64,
        tier: Medium,
        now: u32,
        parent: Option<(RecId, u64)>,
    ) -> Option<RecId> {
        let parent = parent.filter(|&(p, pseq)| {
            let r = &self.recs[p as usize];
            !r.is_free() && r.lane() == lane.0 as usize && r.seq == pseq
        });
        // Where it goes: right after its parent if that slot is free; else a free slot; else
        // the arena's end (right after its parent if that is the last record).
        let after = parent.map(|(p, _)| p as usize + 1);
        let (id, cont) = match after {
            Some(a) if a < self.recs.len() && self.recs[a].meta == FREE => (a as u32, true),
            _ if self.free != NIL => (self.free, false),
            _ => {
                let id = self.recs.len() as u32;
                if id > idtable::max_id(self.by_engine.id_bits()) {
                    if self.by_engine.id_bits() == MAX_ID_BITS {
                        return None;
                    }
                    self.rebuild(self.by_engine.id_bits() + 1);
                }
                (id, after == Some(id as usize))
            }
        };
        if self.by_engine.full() || (!cont && self.by_block.full()) {
            self.rebuild(self.by_engine.id_bits());
        }
        if (id as usize) < self.recs.len() {
            self.unlink(id);
        } else {
            self.recs.push(Rec::default());
        }
        let mut rec = Rec {
            seq,
            engine,
            meta: lane.0 | if cont { CONT } else { 0 },
            touched: self.tick(now),
        };
        rec.set_refs(tier, 1);
        self.recs[id as usize] = rec;
        let (stream, ns) = self.lane_parts(lane);
        self.by_engine.insert(self.engine_key(stream, engine), id);
        if !cont {
            self.by_block.insert(self.block_key(ns, seq), id);
            self.heads += 1;
        }
        self.lanes[lane.0 as usize].records += 1;
        self.memberships += 1;
        self.live += 1;
        Some(id)
    }

    /// Takes free record `id` off the free list.
    fn unlink(&mut self, id: RecId) {
        let r = self.recs[id as usize];
        let (next, prev) = (r.seq as u32, r.engine as u32);
        if prev == NIL {
            self.free = next;
        } else {
            self.recs[prev as usize].seq = u64::from(next);
        }
        if next != NIL {
            self.recs[next as usize].engine = u64::from(prev);
        }
    }

    /// Puts record `id` at the head of the free list.
    fn push_free(&mut self, id: RecId) {
        if self.free != NIL {
            self.recs[self.free as usize].engine = u64::from(id);
        }
        self.recs[id as usize] = Rec {
            seq: u64::from(self.free),
            engine: u64::from(NIL),
            meta: FREE,
            touched: 0,
        };
        self.free = id;
    }

    /// Builds both tables again from one sequential pass over the arena, with room for a
    /// quarter more ids than they hold: rather than rehashing in place, which would read
    /// every record at random to hash it again. The ids get the width that the arena needs
    /// until the tables are next full (`min_bits` at least), so that the arena outgrowing
    /// them between two growths never costs a rebuild of its own.
    fn rebuild(&mut self, min_bits: u32) {
        let heads = self.heads;
        let room = (self.live + 1).max(self.recs.len());
        let id_bits = min_bits.max(idtable::id_bits_for(room + room / 4 + 16));
        let mut engines = Builder::new(self.live + 1, id_bits);
        let mut blocks = Builder::new(heads + 1, id_bits);
        for (i, r) in self.recs.iter().enumerate() {
            if r.is_free() {
                continue;
            }
            let lane = &self.lanes[r.lane()];
            engines.push(engine_key(self.key, lane.stream, r.engine), i as RecId);
            if r.meta & CONT == 0 {
                blocks.push(block_key(self.key, lane.ns, r.seq), i as RecId);
            }
        }
        self.by_engine = engines.finish();
        self.by_block = blocks.finish();
    }

    /// One more reference on `tier` (GPU stays at 1, offload tiers saturate) and a new store
    /// time; true when the record did not hold `tier` before (a new membership).
    pub(crate) fn add_ref(&mut self, id: RecId, tier: Medium, now: u32) -> bool {
        let touched = self.tick(now);
        let r = &mut self.recs[id as usize];
        let before = r.refs(tier);
        r.set_refs(tier, before.saturating_add(1));
        r.touched = touched;
        if before == 0 {
            self.memberships += 1;
        }
        before == 0
    }

    /// One reference fewer on `tier` (all of them when `all`); true when the record no
    /// longer holds `tier` (a membership ended). A record left holding nothing is freed.
    #[cfg(test)]
    pub(crate) fn drop_ref(&mut self, id: RecId, tier: Medium, all: bool) -> bool {
        let ended = self.drop_ref_deferred(id, tier, all);
        if ended && self.recs[id as usize].is_free() {
            self.unindex_many(&[id]);
        }
        ended
    }

    /// [`Store::drop_ref`] without freeing a record left holding nothing: the caller
    /// collects those and frees them together with [`Store::unindex_many`] before anything
    /// else reads the store.
    pub(crate) fn drop_ref_deferred(&mut self, id: RecId, tier: Medium, all: bool) -> bool {
        let r = &mut self.recs[id as usize];
        let before = r.refs(tier);
        if before == 0 {
            return false;
        }
        let after = if all { 0 } else { before - 1 };
        r.set_refs(tier, after);
        if after > 0 {
            return false;
        }
        self.memberships -= 1;
        true
    }

    /// Frees records left holding nothing: out of both tables (the records continuing them
    /// become heads) and onto the free list, in the order given (so the arena's reuse order
    /// does not depend on how they went). One by one (a few table probes each) for a few;
    /// for many (a quarter of the records or more: a clear, a mass expiry) both tables are
    /// built again from one pass over the arena instead.
    pub(crate) fn unindex_many(&mut self, ids: &[RecId]) {
        if ids.is_empty() {
            return;
        }
        if ids.len().saturating_mul(4) < self.live {
            for &id in ids {
                self.unindex_one(id);
            }
        } else {
            for &id in ids {
                if self.recs[id as usize].meta & CONT == 0 {
                    self.heads -= 1;
                }
                self.promote_next(id);
            }
            self.rebuild(self.by_engine.id_bits());
        }
        for &id in ids {
            let lane = self.recs[id as usize].lane();
            self.lanes[lane].records -= 1;
            if self.lanes[lane].records == 0 {
                self.emptied.push(lane as u32);
            }
            self.push_free(id);
        }
        self.live -= ids.len();
    }

    /// Makes the record continuing `id` (if it stays) a head: its flag only; the caller
    /// puts it in `by_block`. True when there was one.
    fn promote_next(&mut self, id: RecId) -> bool {
        let next = id as usize + 1;
        match self.recs.get_mut(next) {
            Some(r) if r.continues() => {
                r.meta &= !CONT;
                self.heads += 1;
                true
            }
            _ => false,
        }
    }

    fn unindex_one(&mut self, id: RecId) {
        let r = self.recs[id as usize];
        self.by_engine.remove(self.rec_engine_key(&r), id);
        if r.meta & CONT == 0 {
            self.by_block.remove(self.rec_block_key(&r), id);
            self.heads -= 1;
        }
        if self.promote_next(id) {
            if self.by_block.full() {
                // The rebuild takes the new head from the arena.
                self.rebuild(self.by_engine.id_bits());
            } else {
                let next = self.recs[id as usize + 1];
                self.by_block.insert(self.rec_block_key(&next), id + 1);
            }
        }
    }
}

mod dump;
pub(crate) use dump::StoreDump;

#[cfg(test)]
mod tests;
