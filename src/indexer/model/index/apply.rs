//! Applying events to the index: stores (with tokens, standard hashes or token-less
//! placeholders), removals and clears, each store's capacity check, and the bookkeeping of
//! references per stream and tier.
//!
//! Must not: trust an engine hash for content (blocks are keyed by the rolling hash of
//! their tokens), guess a missing parent, or read a clock (the caller passes the time).
use super::{effective_salt, hash, Index, KvEvent, LoraNs, NsKey, StreamId};
use crate::indexer::model::events::{Lora, Medium, Removed, Stored};
use crate::indexer::model::table::{LaneId, RecId};

impl Index {
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
    pub(super) fn drop_ref(&mut self, id: RecId, tier: Medium, all: bool) -> bool {
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
    pub(super) fn drop_record(&mut self, id: RecId, freed: &mut Vec<RecId>) -> usize {
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
    pub(super) fn room(&mut self, now: u32) -> bool {
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
}
