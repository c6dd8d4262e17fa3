//! The compact membership table: `(namespace, sequence hash) → holders`, where a holder is a
//! `(stream, tier)` pair packed in a `u32`.
//!
//! Memory is the point of this file. Each block is one 16-byte slot of a `hashbrown`
//! [`HashTable`] (`seq: u64`, `ns: u32`, `head: u32`); a block with one holder keeps it inline
//! in `head`. A block with more holders points `head` at a singly linked list in one shared
//! node pool (8 bytes a node, recycled through a free list), so no entry owns a heap
//! allocation. Keys are hashed with a 64-bit finalizer ([`mix`]) instead of SipHash: fast,
//! and good enough for hashes an engine chose (kvplane trusts no engine for its distribution).

use hashbrown::HashTable;

/// Marks `head` as a node index rather than an inline holder.
const LIST_BIT: u32 = 1 << 31;
/// End of a node list.
const NIL: u32 = u32::MAX;

/// A `(stream, tier)` pair: `stream << 2 | tier`. Streams stay below 2^29.
pub(crate) type Holder = u32;

#[derive(Clone, Copy, Debug)]
struct Slot {
    seq: u64,
    ns: u32,
    head: u32,
}

#[derive(Clone, Copy, Debug)]
struct Node {
    holder: Holder,
    next: u32,
}

/// `(namespace, sequence hash) → holders`, 16 bytes a block plus 8 a extra holder.
#[derive(Debug, Default)]
pub(crate) struct BlockTable {
    slots: HashTable<Slot>,
    nodes: Vec<Node>,
    free: u32,
    memberships: usize,
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

fn key_hash(ns: u32, seq: u64) -> u64 {
    mix(seq ^ u64::from(ns).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

fn slot_hash(s: &Slot) -> u64 {
    key_hash(s.ns, s.seq)
}

impl BlockTable {
    /// An empty table (the free list starts empty).
    pub(crate) fn new() -> Self {
        Self {
            free: NIL,
            ..Self::default()
        }
    }

    /// How many `(holder, block)` memberships are stored.
    pub(crate) fn memberships(&self) -> usize {
        self.memberships
    }

    /// How many distinct blocks are stored.
    pub(crate) fn blocks(&self) -> usize {
        self.slots.len()
    }

    /// Heap bytes held: the slot table's allocation plus the node pool's.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.slots.allocation_size() + self.nodes.capacity() * std::mem::size_of::<Node>()
    }

    fn alloc_node(&mut self, holder: Holder, next: u32) -> u32 {
        if self.free != NIL {
            let i = self.free;
            let n = &mut self.nodes[i as usize];
            self.free = n.next;
            *n = Node { holder, next };
            i
        } else {
            self.nodes.push(Node { holder, next });
            (self.nodes.len() - 1) as u32
        }
    }

    fn free_node(&mut self, i: u32) {
        self.nodes[i as usize].next = self.free;
        self.free = i;
    }

    /// Adds `holder` to the block; false if it was already there.
    pub(crate) fn insert(&mut self, ns: u32, seq: u64, holder: Holder) -> bool {
        debug_assert!(holder & LIST_BIT == 0);
        let hash = key_hash(ns, seq);
        let found = self
            .slots
            .find_mut(hash, |s| s.seq == seq && s.ns == ns)
            .map(|s| s.head);
        let Some(head) = found else {
            self.slots.insert_unique(
                hash,
                Slot {
                    seq,
                    ns,
                    head: holder,
                },
                slot_hash,
            );
            self.memberships += 1;
            return true;
        };
        if head & LIST_BIT == 0 {
            if head == holder {
                return false;
            }
            let tail = self.alloc_node(head, NIL);
            let first = self.alloc_node(holder, tail);
            self.set_head(ns, seq, hash, first | LIST_BIT);
        } else {
            let mut i = head & !LIST_BIT;
            while i != NIL {
                let n = self.nodes[i as usize];
                if n.holder == holder {
                    return false;
                }
                i = n.next;
            }
            let first = self.alloc_node(holder, head & !LIST_BIT);
            self.set_head(ns, seq, hash, first | LIST_BIT);
        }
        self.memberships += 1;
        true
    }

    fn set_head(&mut self, ns: u32, seq: u64, hash: u64, head: u32) {
        if let Some(s) = self.slots.find_mut(hash, |s| s.seq == seq && s.ns == ns) {
            s.head = head;
        }
    }

    /// Removes `holder` from the block (and the block when it was the last); false if absent.
    pub(crate) fn remove(&mut self, ns: u32, seq: u64, holder: Holder) -> bool {
        let hash = key_hash(ns, seq);
        let Ok(entry) = self.slots.find_entry(hash, |s| s.seq == seq && s.ns == ns) else {
            return false;
        };
        let head = entry.get().head;
        if head & LIST_BIT == 0 {
            if head != holder {
                return false;
            }
            entry.remove();
            self.memberships -= 1;
            return true;
        }
        // Unlink from the list; collapse to inline when one holder is left.
        let first = head & !LIST_BIT;
        let mut prev = NIL;
        let mut i = first;
        while i != NIL {
            let n = self.nodes[i as usize];
            if n.holder == holder {
                break;
            }
            prev = i;
            i = n.next;
        }
        if i == NIL {
            return false;
        }
        let next = self.nodes[i as usize].next;
        let new_first = if prev == NIL {
            next
        } else {
            self.nodes[prev as usize].next = next;
            first
        };
        self.free_node(i);
        let only = self.nodes[new_first as usize];
        let new_head = if only.next == NIL {
            self.free_node(new_first);
            only.holder
        } else {
            new_first | LIST_BIT
        };
        self.set_head(ns, seq, hash, new_head);
        self.memberships -= 1;
        true
    }

    /// Calls `f` with every holder of the block.
    pub(crate) fn for_each_holder(&self, ns: u32, seq: u64, mut f: impl FnMut(Holder)) {
        let Some(s) = self
            .slots
            .find(key_hash(ns, seq), |s| s.seq == seq && s.ns == ns)
        else {
            return;
        };
        if s.head & LIST_BIT == 0 {
            f(s.head);
            return;
        }
        let mut i = s.head & !LIST_BIT;
        while i != NIL {
            let n = self.nodes[i as usize];
            f(n.holder);
            i = n.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn holders(t: &BlockTable, ns: u32, seq: u64) -> BTreeSet<Holder> {
        let mut out = BTreeSet::new();
        t.for_each_holder(ns, seq, |h| {
            assert!(out.insert(h), "holder {h} listed twice");
        });
        out
    }

    #[test]
    fn slots_are_sixteen_bytes_and_nodes_eight() {
        assert_eq!(std::mem::size_of::<Slot>(), 16);
        assert_eq!(std::mem::size_of::<Node>(), 8);
    }

    #[test]
    fn matches_a_model_under_random_operations() {
        let mut t = BlockTable::new();
        let mut model: BTreeMap<(u32, u64), BTreeSet<Holder>> = BTreeMap::new();
        let mut x: u64 = 0x1234_5678;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let ns = (x % 3) as u32;
            let seq = (x >> 8) % 40;
            let holder = ((x >> 20) % 6) as u32;
            let set = model.entry((ns, seq)).or_default();
            if x & 1 == 0 {
                assert_eq!(t.insert(ns, seq, holder), set.insert(holder));
            } else {
                assert_eq!(t.remove(ns, seq, holder), set.remove(&holder));
            }
        }
        model.retain(|_, s| !s.is_empty());
        assert_eq!(t.blocks(), model.len());
        assert_eq!(
            t.memberships(),
            model.values().map(BTreeSet::len).sum::<usize>()
        );
        for ((ns, seq), set) in &model {
            assert_eq!(&holders(&t, *ns, *seq), set);
        }
        // Nodes are recycled: the pool never outgrows the peak of extra holders.
        assert!(t.nodes.len() <= 3 * 40 * 6);
    }

    /// The memory target: ≤ 32 bytes per membership at 10M memberships. A 10M-entry table
    /// is too big for a unit test on a shared machine, so this fills 1M single-holder blocks
    /// (the worst case: no sharing of slots) and checks the allocation the table reports,
    /// then extrapolates the one power-of-two step to 10M.
    #[test]
    fn bytes_per_membership_stay_under_the_target() {
        let mut t = BlockTable::new();
        let n = 1_000_000u64;
        for i in 0..n {
            t.insert(0, i.wrapping_mul(0x9e37_79b9_7f4a_7c15), (i % 64) as u32);
        }
        assert_eq!(t.memberships(), n as usize);
        let per = t.heap_bytes() as f64 / n as f64;
        // 1M entries need 2^21 buckets (load ≤ 7/8): 17 bytes each (slot + control byte).
        assert!(per <= 36.0, "{per} bytes per membership at 1M");
        // At 10M: 2^24 buckets × 17 B / 10M = 28.5 B.
        let buckets_10m = (10_000_000f64 * 8.0 / 7.0).log2().ceil().exp2();
        let per_10m = buckets_10m * 17.0 / 10_000_000.0;
        assert!(per_10m <= 32.0, "{per_10m}");
    }
}
