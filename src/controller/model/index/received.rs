//! The set of batch ids one full sync has received, and the budget that bounds all such sets
//! together (review finding §2.1.5: a bitset sized by the *announced* batch count made
//! 65,536 workers × 10^7 announced batches reachable, ~82 GB).
//!
//! A set is stored as disjoint, non-adjacent ranges `start → end` (end exclusive), so its
//! memory follows what the worker *sent*, never what it announced: a worker that sends its
//! batches in order (LMCache does) holds one range whatever the count; every further range
//! needs a batch that arrived out of order, and costs one entry (~40 bytes).
//!
//! The first range of each sync is free; every further range is taken from a per-sync cap and
//! from one budget shared by all syncs of the index ([`RangeBudget`]). A batch that would need
//! a range over either is refused (it stays missing; the worker resends it later). Ranges go
//! back to the budget when two ranges merge and when the set is dropped (sync over, worker
//! reset or removed), so the accounting cannot drift whatever path ends a sync.
//!
//! Owns nothing else: the sync state machine is in `sync.rs`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Extra ranges (beyond each sync's first) all syncing workers may hold together, by default.
/// At ~40 bytes per range that is ~40 MiB at most (docs/RELIABILITY.md).
pub const DEFAULT_MAX_SYNC_RANGES: usize = 1 << 20;

/// Extra ranges one sync may hold, by default (~2.5 MiB), so that one worker cannot take the
/// whole [`DEFAULT_MAX_SYNC_RANGES`] budget.
pub const DEFAULT_MAX_SYNC_RANGES_PER_WORKER: usize = 1 << 16;

/// The shared count of extra ranges held by every sync of one index, and its limits.
#[derive(Clone, Debug)]
pub(crate) struct RangeBudget {
    used: Arc<AtomicUsize>,
    limit: usize,
    per_sync: usize,
}

impl RangeBudget {
    pub(crate) fn new(limit: usize, per_sync: usize) -> Self {
        RangeBudget {
            used: Arc::new(AtomicUsize::new(0)),
            limit,
            per_sync,
        }
    }

    /// Extra ranges held now, over all syncs.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn take(&self) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                (u < self.limit).then_some(u + 1)
            })
            .is_ok()
    }

    fn give(&self, n: usize) {
        if n > 0 {
            self.used.fetch_sub(n, Ordering::Relaxed);
        }
    }
}

impl Default for RangeBudget {
    fn default() -> Self {
        RangeBudget::new(DEFAULT_MAX_SYNC_RANGES, DEFAULT_MAX_SYNC_RANGES_PER_WORKER)
    }
}

/// What [`Received::insert`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Insert {
    /// The id was new and is now recorded.
    New,
    /// The id was already recorded.
    Duplicate,
    /// The id needs a new range and the per-sync cap or the shared budget is spent: not
    /// recorded.
    OverBudget,
}

/// Received batch ids as disjoint, non-adjacent ranges.
#[derive(Debug)]
pub(crate) struct Received {
    ranges: BTreeMap<u64, u64>,
    len: u64,
    budget: RangeBudget,
}

impl Received {
    pub(crate) fn new(budget: RangeBudget) -> Self {
        Received {
            ranges: BTreeMap::new(),
            len: 0,
            budget,
        }
    }

    /// Distinct ids recorded.
    #[cfg(test)]
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Ranges held (the memory the set uses is proportional to this).
    #[cfg(test)]
    pub(crate) fn range_count(&self) -> usize {
        self.ranges.len()
    }

    pub(crate) fn contains(&self, id: u64) -> bool {
        self.ranges
            .range(..=id)
            .next_back()
            .is_some_and(|(_, &end)| id < end)
    }

    /// The budget this set draws from.
    pub(crate) fn budget(&self) -> &RangeBudget {
        &self.budget
    }

    /// Whether [`Received::insert`] of `id` would not return [`Insert::OverBudget`].
    pub(crate) fn would_fit(&self, id: u64) -> bool {
        if self.ranges.is_empty() || self.contains(id) {
            return true;
        }
        let joins_prev = id > 0 && self.contains(id - 1);
        let joins_next = id
            .checked_add(1)
            .is_some_and(|a| self.ranges.contains_key(&a));
        joins_prev
            || joins_next
            || (self.ranges.len() <= self.budget.per_sync && self.budget.used() < self.budget.limit)
    }

    /// Records `id`, merging it with the ranges it touches.
    pub(crate) fn insert(&mut self, id: u64) -> Insert {
        let prev = self.ranges.range(..=id).next_back().map(|(&s, &e)| (s, e));
        if prev.is_some_and(|(_, end)| id < end) {
            return Insert::Duplicate;
        }
        let Some(after) = id.checked_add(1) else {
            return Insert::OverBudget;
        };
        let joins_prev = prev.filter(|&(_, end)| end == id).map(|(start, _)| start);
        let joins_next = self.ranges.get(&after).copied();
        match (joins_prev, joins_next) {
            (Some(start), Some(end)) => {
                self.ranges.remove(&after);
                self.ranges.insert(start, end);
                // Two ranges became one; at least one remains, so the freed one was extra.
                self.budget.give(1);
            }
            (Some(start), None) => {
                self.ranges.insert(start, after);
            }
            (None, Some(end)) => {
                self.ranges.remove(&after);
                self.ranges.insert(id, end);
            }
            (None, None) => {
                let over = |r: &Self| r.ranges.len() > r.budget.per_sync || !r.budget.take();
                if !self.ranges.is_empty() && over(self) {
                    return Insert::OverBudget;
                }
                self.ranges.insert(id, after);
            }
        }
        self.len += 1;
        Insert::New
    }

    /// The first `max` ids in `0..count` not recorded, in order. Visits at most `max + 1`
    /// ranges: every range but the last is followed by a gap.
    pub(crate) fn missing(&self, count: u64, max: usize) -> Vec<i64> {
        let mut out = Vec::new();
        let mut next = 0_u64;
        let push_gap = |from: u64, to: u64, out: &mut Vec<i64>| {
            let room = (max - out.len()) as u64;
            let to = to.min(count).min(from.saturating_add(room));
            out.extend((from..to).map(|b| b as i64));
        };
        for (&start, &end) in &self.ranges {
            if out.len() >= max || start >= count {
                break;
            }
            push_gap(next, start, &mut out);
            next = end;
        }
        if out.len() < max && next < count {
            push_gap(next, count, &mut out);
        }
        out
    }
}

impl Drop for Received {
    fn drop(&mut self) {
        self.budget.give(self.ranges.len().saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(limit: usize, per_sync: usize) -> (Received, RangeBudget) {
        let budget = RangeBudget::new(limit, per_sync);
        (Received::new(budget.clone()), budget)
    }

    #[test]
    fn in_order_ids_hold_one_range_and_no_budget() {
        let (mut r, budget) = set(0, 0);
        for b in 0..100_000 {
            assert_eq!(r.insert(b), Insert::New);
        }
        assert_eq!((r.len(), r.range_count(), budget.used()), (100_000, 1, 0));
        assert_eq!(r.insert(500), Insert::Duplicate);
        assert!(r.missing(100_000, 10).is_empty());
        assert_eq!(r.missing(100_003, 10), vec![100_000, 100_001, 100_002]);
    }

    #[test]
    fn ranges_merge_and_give_back_their_budget() {
        let (mut r, budget) = set(10, 10);
        for b in [0, 2, 4, 6] {
            assert_eq!(r.insert(b), Insert::New);
        }
        assert_eq!((r.range_count(), budget.used()), (4, 3));
        assert_eq!(r.missing(8, 100), vec![1, 3, 5, 7]);
        assert_eq!(r.missing(8, 2), vec![1, 3]);
        assert_eq!(r.insert(1), Insert::New); // joins 0 and 2
        assert_eq!(r.insert(5), Insert::New); // joins 4 and 6
        assert_eq!((r.range_count(), budget.used()), (2, 1));
        assert_eq!(r.insert(7), Insert::New); // extends 4..7
        assert_eq!(r.insert(3), Insert::New); // joins everything
        assert_eq!((r.range_count(), r.len(), budget.used()), (1, 8, 0));
        assert!((0..8).all(|b| r.contains(b)) && !r.contains(8));
        assert_eq!(r.insert(9), Insert::New);
        assert_eq!(budget.used(), 1);
        drop(r);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_new_range_over_the_shared_budget_is_refused_until_one_is_freed() {
        let budget = RangeBudget::new(2, 100);
        let mut a = Received::new(budget.clone());
        let mut b = Received::new(budget.clone());
        // Each set's first range is free.
        assert_eq!(a.insert(0), Insert::New);
        assert_eq!(b.insert(0), Insert::New);
        assert_eq!(a.insert(10), Insert::New);
        assert_eq!(a.insert(20), Insert::New);
        assert_eq!(budget.used(), 2);
        assert_eq!(b.insert(10), Insert::OverBudget);
        assert!(!b.contains(10));
        // Growing an existing range needs no budget.
        assert_eq!(b.insert(1), Insert::New);
        assert_eq!(b.len(), 2);
        drop(a);
        assert_eq!(budget.used(), 0);
        assert_eq!(b.insert(10), Insert::New);
        assert_eq!(budget.used(), 1);
    }

    #[test]
    fn one_sync_cannot_take_more_than_its_cap() {
        let budget = RangeBudget::new(1_000, 3);
        let mut r = Received::new(budget.clone());
        for b in [0, 2, 4, 6] {
            assert_eq!(r.insert(b), Insert::New);
        }
        assert_eq!(r.insert(8), Insert::OverBudget);
        assert_eq!((r.range_count(), budget.used()), (4, 3));
    }

    #[test]
    fn missing_visits_few_ranges_however_fragmented() {
        let (mut r, _) = set(usize::MAX, usize::MAX);
        for b in (0..200_000).step_by(2) {
            r.insert(b);
        }
        let m = r.missing(200_000, 5);
        assert_eq!(m, vec![1, 3, 5, 7, 9]);
        assert_eq!(r.missing(200_000, usize::MAX).len(), 100_000);
        assert_eq!(r.missing(3, 10), vec![1]);
    }
}
