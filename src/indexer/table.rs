//! The membership store: one 28-byte record per `(stream, engine hash)` in one dense arena,
//! found through two tables of 4-byte record ids.
//!
//! Memory is the point of this file. A record holds the block's namespace and standard
//! sequence hash, the engine's hash, the stream, per-tier references and the last store time.
//! `by_engine` finds a record from `(stream, engine hash)` (removals, parents, token-less
//! offload stores); `by_block` finds every record of a `(namespace, sequence hash)` (queries).
//! Both are `hashbrown` tables of `u32` ids (one control byte each), so a membership costs its
//! record plus two ids, and no record owns a heap allocation. Freed records are reused (a
//! free list threaded through them), so the arena never outgrows the peak of live records.
//!
//! Records sit at stable positions, which is what the TTL sweep and capacity eviction walk:
//! in slices of the arena, not stream by stream. Keys are hashed with a 64-bit finalizer
//! ([`mix`]) instead of SipHash: fast, and good enough for hashes an engine chose.

use super::events::Medium;
use hashbrown::HashTable;

/// A record's position in the arena.
pub(crate) type RecId = u32;

/// End of the free list.
const NIL: u32 = u32::MAX;

/// The most references an offload tier (CPU, disk) counts; more stores saturate.
pub(crate) const MAX_OFFLOAD_REFS: u8 = 15;

/// One stream's block: `(namespace, sequence hash)` as stored under `engine` hash.
///
/// `u64`s are split in halves so that the record aligns to 4 and takes 28 bytes, not 32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Rec {
    seq: [u32; 2],
    engine: [u32; 2],
    /// The namespace id (the next free record, while free).
    ns: u32,
    /// The last store time (seconds).
    pub(crate) touched: u32,
    /// The stream id.
    pub(crate) stream: u16,
    /// GPU held (0/1).
    gpu: u8,
    /// CPU references (low nibble) and disk references (high nibble).
    offload: u8,
}

fn join(x: [u32; 2]) -> u64 {
    u64::from(x[0]) | u64::from(x[1]) << 32
}

fn split(x: u64) -> [u32; 2] {
    [x as u32, (x >> 32) as u32]
}

impl Rec {
    /// The standard sequence hash.
    pub(crate) fn seq(&self) -> u64 {
        join(self.seq)
    }

    /// The engine's hash.
    pub(crate) fn engine(&self) -> u64 {
        join(self.engine)
    }

    /// The namespace id.
    pub(crate) fn ns(&self) -> u32 {
        self.ns
    }

    /// References on `tier`.
    pub(crate) fn refs(&self, tier: Medium) -> u8 {
        match tier {
            Medium::Gpu => self.gpu,
            Medium::Cpu => self.offload & 0x0f,
            Medium::Disk => self.offload >> 4,
        }
    }

    fn set_refs(&mut self, tier: Medium, n: u8) {
        match tier {
            Medium::Gpu => self.gpu = n.min(1),
            Medium::Cpu => self.offload = (self.offload & 0xf0) | n.min(MAX_OFFLOAD_REFS),
            Medium::Disk => self.offload = (self.offload & 0x0f) | n.min(MAX_OFFLOAD_REFS) << 4,
        }
    }

    /// Bit `t` set for every tier `t` held (GPU 1, CPU 2, disk 4).
    pub(crate) fn mask(&self) -> u8 {
        u8::from(self.gpu != 0)
            | u8::from(self.offload & 0x0f != 0) << 1
            | u8::from(self.offload >> 4 != 0) << 2
    }

    /// Its hash in `by_engine`.
    fn engine_key(&self) -> u64 {
        engine_hash(self.stream, self.engine())
    }

    /// Its hash in `by_block`.
    fn block_key(&self) -> u64 {
        block_hash(self.ns, self.seq())
    }

    /// Whether the record holds nothing (a free arena slot).
    pub(crate) fn is_free(&self) -> bool {
        self.gpu == 0 && self.offload == 0
    }
}

/// MurmurHash3's 64-bit finalizer: every input bit reaches every output bit, so keys that
/// differ only in high bits (sequential engine hashes, say) still spread over the buckets.
pub(crate) fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

fn block_hash(ns: u32, seq: u64) -> u64 {
    mix(seq ^ u64::from(ns).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

fn engine_hash(stream: u16, engine: u64) -> u64 {
    mix(engine ^ u64::from(stream).wrapping_mul(0xd6e8_feb8_6659_fd93))
}

/// A table of the live records' ids under `key`, with room for `capacity`.
fn rebuild(recs: &[Rec], capacity: usize, key: fn(&Rec) -> u64) -> HashTable<RecId> {
    let mut t = HashTable::with_capacity(capacity);
    for (i, r) in recs.iter().enumerate() {
        if !r.is_free() {
            t.insert_unique(key(r), i as RecId, |&j| key(&recs[j as usize]));
        }
    }
    t
}

/// The records, their two tables and the counts the index reports.
#[derive(Debug)]
pub(crate) struct Store {
    recs: Vec<Rec>,
    free: u32,
    by_engine: HashTable<RecId>,
    by_block: HashTable<RecId>,
    memberships: usize,
    blocks: usize,
    live: usize,
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

impl Store {
    /// An empty store.
    pub(crate) fn new() -> Self {
        Self {
            recs: Vec::new(),
            free: NIL,
            by_engine: HashTable::new(),
            by_block: HashTable::new(),
            memberships: 0,
            blocks: 0,
            live: 0,
        }
    }

    /// `(stream, tier, block)` memberships held: each record counts once per tier it holds.
    pub(crate) fn memberships(&self) -> usize {
        self.memberships
    }

    /// Distinct `(namespace, sequence hash)` blocks held.
    pub(crate) fn blocks(&self) -> usize {
        self.blocks
    }

    /// Live records.
    pub(crate) fn records(&self) -> usize {
        self.live
    }

    /// The arena's length: record ids are below it.
    pub(crate) fn arena_len(&self) -> usize {
        self.recs.len()
    }

    /// Bytes allocated: the arena and both tables.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.recs.capacity() * std::mem::size_of::<Rec>()
            + self.by_engine.allocation_size()
            + self.by_block.allocation_size()
    }

    /// The record at `id`.
    pub(crate) fn rec(&self, id: RecId) -> &Rec {
        &self.recs[id as usize]
    }

    /// The record `stream` stored under `engine`.
    pub(crate) fn find_engine(&self, stream: u16, engine: u64) -> Option<RecId> {
        let recs = &self.recs;
        self.by_engine
            .find(engine_hash(stream, engine), |&i| {
                let r = &recs[i as usize];
                r.stream == stream && r.engine() == engine
            })
            .copied()
    }

    /// Reads the table slots a store of `(stream, engine)` → `(ns, seq)` will touch, so that
    /// a caller warming a whole event's blocks first has their cache misses overlap (the
    /// reads are independent) instead of paying them one after another in the stores.
    pub(crate) fn warm(&self, stream: u16, engine: u64, ns: u32, seq: u64) {
        std::hint::black_box(self.find_engine(stream, engine));
        let recs = &self.recs;
        std::hint::black_box(self.by_block.find(block_hash(ns, seq), |&i| {
            let r = &recs[i as usize];
            r.seq() == seq && r.ns == ns
        }));
    }

    /// A new record holding one reference on `tier`. The caller knows `stream` has no
    /// record under `engine`.
    pub(crate) fn insert(
        &mut self,
        stream: u16,
        engine: u64,
        ns: u32,
        seq: u64,
        tier: Medium,
        touched: u32,
    ) -> RecId {
        let mut rec = Rec {
            seq: split(seq),
            engine: split(engine),
            ns,
            touched,
            stream,
            gpu: 0,
            offload: 0,
        };
        rec.set_refs(tier, 1);
        // Before the record is in the arena: a rebuild indexes the live records only.
        self.grow_if_full();
        let id = if self.free != NIL {
            let id = self.free;
            self.free = self.recs[id as usize].ns;
            self.recs[id as usize] = rec;
            id
        } else {
            let id = u32::try_from(self.recs.len()).expect("fewer than 2^32 records");
            assert!(id != NIL, "fewer than 2^32 - 1 records");
            self.recs.push(rec);
            id
        };
        let recs = &self.recs;
        self.by_engine
            .insert_unique(engine_hash(stream, engine), id, |&i| {
                recs[i as usize].engine_key()
            });
        let bh = block_hash(ns, seq);
        let seen = self
            .by_block
            .find(bh, |&i| {
                let r = &recs[i as usize];
                r.seq() == seq && r.ns == ns
            })
            .is_some();
        if !seen {
            self.blocks += 1;
        }
        self.by_block
            .insert_unique(bh, id, |&i| recs[i as usize].block_key());
        self.memberships += 1;
        self.live += 1;
        id
    }

    /// Makes room for one more id in each table. A full table is rebuilt at twice the live
    /// records from one sequential pass over the arena, rather than letting `hashbrown`
    /// rehash it: its rehash reads every record at random to hash it again, which at 10M
    /// records was a sixth of the ingest time.
    fn grow_if_full(&mut self) {
        let want = self.live.max(8) * 2;
        if self.by_engine.len() == self.by_engine.capacity() {
            self.by_engine = rebuild(&self.recs, want, Rec::engine_key);
        }
        if self.by_block.len() == self.by_block.capacity() {
            self.by_block = rebuild(&self.recs, want, Rec::block_key);
        }
    }

    /// One more reference on `tier` (GPU stays at 1, offload tiers saturate) and a new store
    /// time; true when the record did not hold `tier` before (a new membership).
    pub(crate) fn add_ref(&mut self, id: RecId, tier: Medium, touched: u32) -> bool {
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

    /// Takes records left holding nothing out of both tables and onto the free list, in
    /// the order given (so the arena's reuse order does not depend on how they went). One
    /// by one (two table probes each) for a few; for many (a sixteenth of the table or
    /// more: a clear, a mass expiry) one sequential pass over each table instead, which at
    /// 10M records is several times faster than 10M pairs of random probes.
    pub(crate) fn unindex_many(&mut self, ids: &[RecId]) {
        if ids.len().saturating_mul(16) < self.by_block.capacity() {
            for &id in ids {
                self.unindex_one(id);
            }
        } else {
            self.unindex_bulk(ids);
        }
        for &id in ids {
            self.recs[id as usize] = Rec {
                ns: self.free,
                ..Rec::default()
            };
            self.free = id;
        }
        self.live -= ids.len();
    }

    fn unindex_one(&mut self, id: RecId) {
        let r = self.recs[id as usize];
        let recs = &self.recs;
        if let Ok(e) = self.by_engine.find_entry(r.engine_key(), |&i| i == id) {
            e.remove();
        }
        let bh = r.block_key();
        if let Ok(e) = self.by_block.find_entry(bh, |&i| i == id) {
            e.remove();
        }
        let still = self
            .by_block
            .find(bh, |&i| {
                let o = &recs[i as usize];
                o.seq() == r.seq() && o.ns == r.ns
            })
            .is_some();
        if !still {
            self.blocks -= 1;
        }
    }

    fn unindex_bulk(&mut self, ids: &[RecId]) {
        let mut gone = vec![0u64; self.recs.len().div_ceil(64)];
        for &id in ids {
            gone[id as usize / 64] |= 1 << (id % 64);
        }
        let is_gone = |i: RecId| gone[i as usize / 64] & (1 << (i % 64)) != 0;
        // A block ends when none of its records stays; it is counted once, by the lowest
        // id among its records that go.
        let recs = &self.recs;
        let mut ended = 0;
        for &id in ids {
            let r = &recs[id as usize];
            let (ns, seq) = (r.ns, r.seq());
            let mut stays = false;
            let mut lowest = RecId::MAX;
            for &i in self.by_block.iter_hash(block_hash(ns, seq)) {
                let o = &recs[i as usize];
                if o.seq() == seq && o.ns == ns {
                    if is_gone(i) {
                        lowest = lowest.min(i);
                    } else {
                        stays = true;
                    }
                }
            }
            if !stays && lowest == id {
                ended += 1;
            }
        }
        self.blocks -= ended;
        self.by_engine.retain(|i| !is_gone(*i));
        self.by_block.retain(|i| !is_gone(*i));
    }

    /// Calls `f(stream, mask)` for every record of the block (a mask of the tiers it holds).
    pub(crate) fn for_each_holder(&self, ns: u32, seq: u64, mut f: impl FnMut(u16, u8)) {
        for &i in self.by_block.iter_hash(block_hash(ns, seq)) {
            let r = &self.recs[i as usize];
            if r.seq() == seq && r.ns == ns {
                f(r.stream, r.mask());
            }
        }
    }
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
