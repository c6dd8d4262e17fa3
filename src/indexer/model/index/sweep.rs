//! Dropping memberships by age: the TTL sweep over the record arena in bounded slices, and
//! eviction of the least recently stored at the capacity limit.
//!
//! Must not: walk the whole arena under one call of `expire_slice`, or depend on anything but
//! what was applied (a replica must evict the same blocks).
use super::{Index, SWEEP_SLICE};
use crate::indexer::model::table::RecId;

impl Index {
    /// Drops every membership not stored again since `now - ttl`; returns how many.
    pub fn expire(&mut self, now: u32) -> usize {
        let mut from = 0;
        let mut n = 0;
        loop {
            let (dropped, next) = self.expire_slice(from, SWEEP_SLICE, now);
            n += dropped;
            match next {
                Some(x) => from = x,
                None => return n,
            }
        }
    }

    /// The sweep over `len` records of the arena from `from`: [`Index::expire`] in slices,
    /// so that one lock hold walks a bounded part of the index whatever the streams. With a
    /// TTL it drops what is too old; with or without, it clamps the store times older than
    /// the 16-bit clock tells apart (a walk of the whole arena must come at least every few
    /// hours: see [`MAX_AGE`](crate::indexer::model::table::MAX_AGE)). Returns the memberships
    /// dropped and where the next slice starts (`None`: done).
    pub fn expire_slice(&mut self, from: usize, len: usize, now: u32) -> (usize, Option<usize>) {
        let end = from.saturating_add(len.max(1)).min(self.store.arena_len());
        let next = (end < self.store.arena_len()).then_some(end);
        let mut n = 0;
        let mut freed = Vec::new();
        let tick = self.store.tick(now);
        for i in from..end {
            let i = i as RecId;
            let r = self.store.rec(i);
            if r.is_free() {
                continue;
            }
            if self.ttl_ticks.is_some_and(|ttl| r.age(tick) > ttl) {
                n += self.drop_record(i, &mut freed);
            } else {
                self.store.clamp_age(i, tick);
            }
        }
        self.store.unindex_many(&freed);
        self.counters.expired += n as u64;
        self.collect();
        (n, next)
    }

    /// Frees room at the capacity limit: drops records stored longest ago. The cutoff is
    /// the 1/16 quantile of the ages of up to 4,096 records sampled across the arena;
    /// records of the cutoff's age go too, unless that age holds most of the sample (a burst
    /// filling the index within one tick): then only older ones go. The walk goes on from
    /// where the last one stopped and ends once about 1/256 of the memberships (at least
    /// one) went, so one call walks about 1/16 of the arena, not all of it. Returns whether
    /// any went.
    ///
    /// Deterministic (the arena depends only on what was applied), so a replica applying
    /// the same changes evicts the same blocks.
    pub(super) fn evict_oldest(&mut self, now: u32) -> bool {
        let len = self.store.arena_len();
        if self.store.records() == 0 {
            return false;
        }
        let step = len.div_ceil(4096).max(1);
        let tick = self.store.tick(now);
        let mut sample: Vec<u32> = (0..len)
            .step_by(step)
            .map(|i| self.store.rec(i as RecId))
            .filter(|r| !r.is_free())
            .map(|r| r.age(tick))
            .collect();
        if sample.is_empty() {
            // Every sampled slot was free: take the first live record's age.
            sample.extend(
                (0..len as RecId)
                    .map(|i| self.store.rec(i))
                    .find(|r| !r.is_free())
                    .map(|r| r.age(tick)),
            );
        }
        // Oldest first.
        sample.sort_unstable_by(|a, b| b.cmp(a));
        let cutoff = sample[sample.len() / 16];
        let inclusive = sample.partition_point(|&a| a >= cutoff) * 2 <= sample.len();
        let target = self.store.memberships().div_ceil(256).max(1);
        let mut n = 0;
        let mut freed = Vec::new();
        for _ in 0..len {
            if self.hand >= self.store.arena_len() {
                self.hand = 0;
            }
            let i = self.hand as RecId;
            self.hand += 1;
            let r = self.store.rec(i);
            if r.is_free() {
                continue;
            }
            let age = r.age(tick);
            if age > cutoff || (inclusive && age == cutoff) {
                n += self.drop_record(i, &mut freed);
                if n >= target {
                    break;
                }
            }
        }
        self.store.unindex_many(&freed);
        self.counters.evicted += n as u64;
        n > 0
    }
}
