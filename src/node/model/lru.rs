//! The eviction policy both tiers share, pure and synchronous: a byte-budgeted map with LRU
//! order, a trigger watermark and an eviction ratio, and pins. It owns no bytes and does no
//! I/O: L1 stores `Bytes` in it, L2 stores file descriptions, and the caller acts on what
//! [`TierIndex::insert`] and [`TierIndex::evict_if_triggered`] hand back.
//!
//! Rules (docs/NODE.md, "Tiers and eviction"):
//! - an insert that would take `used` over the budget first evicts least recently used,
//!   unpinned entries until it fits; if it cannot fit, it is refused;
//! - after an insert, when `used > trigger_watermark × budget`, one eviction cycle removes at
//!   least `eviction_ratio × used` bytes, least recently used first, skipping pinned entries;
//! - a pinned entry (being read) is never evicted; replacing it keeps its pins;
//! - a held entry (the controller's `pin` command) is never evicted until released; replacing
//!   it keeps it held.

use std::collections::{BTreeMap, HashMap};

/// What a tier index entry weighs.
pub(crate) trait Weighted {
    /// Bytes the entry accounts for.
    fn bytes(&self) -> u64;
}

/// The eviction knobs of one tier.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvictionPolicy {
    /// Byte budget.
    pub budget: u64,
    /// Fraction of the budget above which an eviction cycle runs (0 < w ≤ 1).
    pub trigger_watermark: f64,
    /// Fraction of used bytes one cycle frees (0 < r ≤ 1).
    pub eviction_ratio: f64,
    /// `false` = LMCache's `noop` policy: nothing is evicted, inserts that do not fit are
    /// refused.
    pub lru: bool,
}

struct LruEntry<V> {
    value: V,
    tick: u64,
    pins: u32,
    held: bool,
}

impl<V> LruEntry<V> {
    /// Neither pinned by a read nor held by a pin command.
    fn evictable(&self) -> bool {
        self.pins == 0 && !self.held
    }
}

/// The result of an insert.
#[derive(Debug)]
pub(crate) enum Inserted<V> {
    /// Stored (replacing any value under the key); these entries were evicted to make room.
    Stored {
        /// Evicted to make room.
        evicted: Vec<(String, V)>,
    },
    /// Refused: larger than the budget, or the rest is pinned.
    Refused(V),
}

/// A byte-budgeted LRU map with pins.
pub(crate) struct TierIndex<V> {
    policy: EvictionPolicy,
    used: u64,
    /// Entries held (kept here so reading it is O(1)).
    held: usize,
    clock: u64,
    slots: HashMap<String, LruEntry<V>>,
    order: BTreeMap<u64, String>,
}

impl<V: Weighted> TierIndex<V> {
    /// An empty tier.
    pub(crate) fn new(policy: EvictionPolicy) -> Self {
        TierIndex {
            policy,
            used: 0,
            held: 0,
            clock: 0,
            slots: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    /// Bytes accounted.
    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Whether `key` is held (does not touch LRU order).
    pub(crate) fn contains(&self, key: &str) -> bool {
        self.slots.contains_key(key)
    }

    /// The entry, without touching LRU order.
    pub(crate) fn peek(&self, key: &str) -> Option<&V> {
        self.slots.get(key).map(|s| &s.value)
    }

    /// Mutable access, without touching LRU order (the size must not change).
    pub(crate) fn peek_mut(&mut self, key: &str) -> Option<&mut V> {
        self.slots.get_mut(key).map(|s| &mut s.value)
    }

    /// Marks `key` most recently used and returns it.
    pub(crate) fn touch(&mut self, key: &str) -> Option<&V> {
        let tick = self.tick();
        let slot = self.slots.get_mut(key)?;
        self.order.remove(&slot.tick);
        slot.tick = tick;
        self.order.insert(tick, key.to_owned());
        Some(&slot.value)
    }

    /// Pins `key` (touching it); returns `false` if absent.
    pub(crate) fn pin(&mut self, key: &str) -> bool {
        if self.touch(key).is_none() {
            return false;
        }
        if let Some(slot) = self.slots.get_mut(key) {
            slot.pins += 1;
        }
        true
    }

    /// Releases one pin of `key` (a no-op if absent or unpinned).
    pub(crate) fn unpin(&mut self, key: &str) {
        if let Some(slot) = self.slots.get_mut(key) {
            slot.pins = slot.pins.saturating_sub(1);
        }
    }

    /// Pins held on `key` (a hold counts as one).
    pub(crate) fn pins(&self, key: &str) -> u32 {
        self.slots
            .get(key)
            .map_or(0, |s| s.pins + u32::from(s.held))
    }

    /// Holds (`on`) or releases `key` (the controller's pin): a held entry is never evicted.
    /// Returns whether `key` is present.
    pub(crate) fn set_held(&mut self, key: &str, on: bool) -> bool {
        match self.slots.get_mut(key) {
            Some(s) => {
                if s.held != on {
                    s.held = on;
                    if on {
                        self.held += 1;
                    } else {
                        self.held -= 1;
                    }
                }
                true
            }
            None => false,
        }
    }

    /// Whether `key` is held.
    pub(crate) fn is_held(&self, key: &str) -> bool {
        self.slots.get(key).is_some_and(|s| s.held)
    }

    /// Held entries.
    pub(crate) fn held_count(&self) -> usize {
        self.held
    }

    /// Reads in progress on `key` (pins other than the hold).
    pub(crate) fn reading(&self, key: &str) -> u32 {
        self.slots.get(key).map_or(0, |s| s.pins)
    }

    /// Removes `key`, pinned or not.
    pub(crate) fn remove(&mut self, key: &str) -> Option<V> {
        let slot = self.slots.remove(key)?;
        if slot.held {
            self.held -= 1;
        }
        self.order.remove(&slot.tick);
        self.used -= slot.value.bytes();
        Some(slot.value)
    }

    /// Evicts unpinned entries, least recently used first, until `needed` bytes are freed or
    /// nothing evictable is left; `skip` is never evicted.
    fn evict_bytes(&mut self, needed: u64, skip: Option<&str>) -> Vec<(String, V)> {
        let mut out = Vec::new();
        if !self.policy.lru {
            return out;
        }
        let victims: Vec<String> = self
            .order
            .values()
            .filter(|k| skip != Some(k.as_str()))
            .filter(|k| self.slots.get(k.as_str()).is_some_and(LruEntry::evictable))
            .scan(0u64, |acc, k| {
                if *acc >= needed {
                    return None;
                }
                *acc += self.slots.get(k.as_str()).map_or(0, |s| s.value.bytes());
                Some(k.clone())
            })
            .collect();
        for key in victims {
            if let Some(v) = self.remove(&key) {
                out.push((key, v));
            }
        }
        out
    }

    /// Stores `value` under `key` as most recently used, evicting to make room.
    pub(crate) fn insert(&mut self, key: &str, value: V) -> Inserted<V> {
        let size = value.bytes();
        let old_size = self.slots.get(key).map_or(0, |s| s.value.bytes());
        if size > self.policy.budget {
            return Inserted::Refused(value);
        }
        let after = self.used - old_size + size;
        let mut evicted = Vec::new();
        if after > self.policy.budget {
            let evictable: u64 = self
                .slots
                .iter()
                .filter(|(k, s)| s.evictable() && k.as_str() != key)
                .map(|(_, s)| s.value.bytes())
                .sum();
            if !self.policy.lru || after - evictable > self.policy.budget {
                return Inserted::Refused(value);
            }
            evicted = self.evict_bytes(after - self.policy.budget, Some(key));
        }
        let tick = self.tick();
        match self.slots.remove(key) {
            Some(old) => {
                self.order.remove(&old.tick);
                self.used -= old.value.bytes();
                self.slots.insert(
                    key.to_owned(),
                    LruEntry {
                        value,
                        tick,
                        pins: old.pins,
                        held: old.held,
                    },
                );
            }
            None => {
                self.slots.insert(
                    key.to_owned(),
                    LruEntry {
                        value,
                        tick,
                        pins: 0,
                        held: false,
                    },
                );
            }
        }
        self.used += size;
        self.order.insert(tick, key.to_owned());
        Inserted::Stored { evicted }
    }

    /// Runs one eviction cycle if `used` is above the trigger watermark: frees at least
    /// `eviction_ratio × used` bytes (fewer if the rest is pinned), LRU first.
    pub(crate) fn evict_if_triggered(&mut self) -> Vec<(String, V)> {
        let p = self.policy;
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        let (trigger, target) = (
            (p.budget as f64 * p.trigger_watermark) as u64,
            (self.used as f64 * p.eviction_ratio).ceil() as u64,
        );
        if self.used <= trigger {
            return Vec::new();
        }
        self.evict_bytes(target, None)
    }

    /// Keys, least recently used first.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &str> {
        self.order.values().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Weighted for u64 {
        fn bytes(&self) -> u64 {
            *self
        }
    }

    fn tier(budget: u64, w: f64, r: f64) -> TierIndex<u64> {
        TierIndex::new(EvictionPolicy {
            budget,
            trigger_watermark: w,
            eviction_ratio: r,
            lru: true,
        })
    }

    fn evicted_keys(out: &[(String, u64)]) -> Vec<&str> {
        out.iter().map(|(k, _)| k.as_str()).collect()
    }

    #[test]
    fn watermark_cycle_frees_the_ratio_lru_first() {
        let mut t = tier(100, 0.8, 0.2);
        for k in ["a", "b", "c", "d"] {
            assert!(matches!(t.insert(k, 20), Inserted::Stored { .. }));
            assert!(t.evict_if_triggered().is_empty(), "80 is not above 80");
        }
        t.touch("a");
        assert!(matches!(t.insert("e", 10), Inserted::Stored { .. }));
        // 90 > 80: free ceil(0.2 × 90) = 18 bytes → the least recent, "b" (20).
        let out = t.evict_if_triggered();
        assert_eq!(evicted_keys(&out), ["b"]);
        assert_eq!((t.used(), t.len()), (70, 4));
        assert_eq!(t.keys().collect::<Vec<_>>(), ["c", "d", "a", "e"]);
    }

    #[test]
    fn insert_over_budget_evicts_to_fit_or_is_refused() {
        let mut t = tier(100, 1.0, 0.1);
        for k in ["a", "b", "c", "d", "e"] {
            assert!(matches!(t.insert(k, 20), Inserted::Stored { .. }));
        }
        match t.insert("f", 30) {
            Inserted::Stored { evicted, .. } => assert_eq!(evicted_keys(&evicted), ["a", "b"]),
            Inserted::Refused(_) => panic!("fits after eviction"),
        }
        assert_eq!(t.used(), 90);
        assert!(matches!(t.insert("huge", 101), Inserted::Refused(101)));
        // Everything pinned: nothing can make room.
        for k in ["c", "d", "e", "f"] {
            assert!(t.pin(k));
        }
        assert!(matches!(t.insert("g", 20), Inserted::Refused(20)));
        assert!(t.evict_if_triggered().is_empty());
        t.unpin("d");
        match t.insert("g", 20) {
            Inserted::Stored { evicted, .. } => assert_eq!(evicted_keys(&evicted), ["d"]),
            Inserted::Refused(_) => panic!("d is unpinned"),
        }
    }

    #[test]
    fn pinned_entries_survive_cycles_and_replacement_keeps_pins() {
        let mut t = tier(100, 0.5, 1.0);
        t.insert("a", 30);
        t.insert("b", 30);
        assert!(t.pin("a"));
        let out = t.evict_if_triggered();
        assert_eq!(evicted_keys(&out), ["b"]);
        assert!(t.contains("a"));
        match t.insert("a", 60) {
            Inserted::Stored { evicted } => assert!(evicted.is_empty()),
            Inserted::Refused(_) => panic!("fits"),
        }
        assert_eq!((t.used(), t.pins("a")), (60, 1));
        assert!(t.evict_if_triggered().is_empty(), "a is still pinned");
        t.unpin("a");
        assert_eq!(evicted_keys(&t.evict_if_triggered()), ["a"]);
        assert_eq!(t.used(), 0);
    }

    #[test]
    fn held_entries_stay_through_reads_replacement_and_pressure_until_released() {
        let mut t = tier(100, 0.5, 1.0);
        t.insert("a", 30);
        t.insert("b", 30);
        assert!(t.set_held("a", true));
        assert!(!t.set_held("zz", true), "absent");
        // A read's pin and release do not release the hold.
        assert!(t.pin("a"));
        t.unpin("a");
        assert_eq!(evicted_keys(&t.evict_if_triggered()), ["b"]);
        match t.insert("a", 40) {
            Inserted::Stored { .. } => {}
            Inserted::Refused(_) => panic!("fits"),
        }
        assert!(t.is_held("a"), "replacement keeps the hold");
        // A store that could only fit by evicting the held entry is refused.
        assert!(matches!(t.insert("c", 70), Inserted::Refused(_)));
        assert_eq!(t.held_count(), 1);
        assert!(t.set_held("a", false));
        assert_eq!(t.held_count(), 0);
        match t.insert("c", 70) {
            Inserted::Stored { evicted } => assert_eq!(evicted_keys(&evicted), ["a"]),
            Inserted::Refused(_) => panic!("a is released"),
        }
    }

    #[test]
    fn noop_policy_never_evicts() {
        let mut t = TierIndex::new(EvictionPolicy {
            budget: 50,
            trigger_watermark: 0.1,
            eviction_ratio: 1.0,
            lru: false,
        });
        t.insert("a", 30);
        assert!(t.evict_if_triggered().is_empty());
        assert!(matches!(t.insert("b", 30), Inserted::Refused(30)));
        assert_eq!(t.remove("a"), Some(30));
        assert_eq!(t.used(), 0);
    }
}
