//! The `/query` and `/query_by_hash` walk (spec §1.3): per instance, the longest prefix per
//! tier, per rank and per other medium, following chains in arena order from their heads.
//!
//! Must not: change the index, or join blocks of different ranks into one prefix.
use super::{hash, Index, InstanceMatch, NsKey, QueryScope};
use crate::indexer::model::table::RecId;
use std::collections::BTreeMap;

impl Index {
    /// Answers `/query`: the standard hashes of every complete block of `tokens`.
    pub fn query_tokens(
        &self,
        scope: &QueryScope<'_>,
        tokens: &[u32],
    ) -> BTreeMap<String, InstanceMatch> {
        // Every hash first, then the lookups: with no hashing between them, the CPU overlaps
        // the lookups' cache misses (two a block in a large table).
        let seqs = hash::seq_hashes(tokens, scope.block_size as usize, self.config.seed);
        self.walk(scope, seqs.into_iter())
    }

    /// Answers `/query_by_hash`: the rolling hashes are given.
    pub fn query_hashes(
        &self,
        scope: &QueryScope<'_>,
        seq_hashes: &[u64],
    ) -> BTreeMap<String, InstanceMatch> {
        self.walk(scope, seq_hashes.iter().copied())
    }

    /// The walk of spec §1.3: prefix-continuous per tier and per rank, never joining ranks.
    fn walk(
        &self,
        scope: &QueryScope<'_>,
        seqs: impl Iterator<Item = u64>,
    ) -> BTreeMap<String, InstanceMatch> {
        struct Row {
            stream: u32,
            instance: usize,
            rank: u32,
            tier_len: [u64; 3],
            tier_alive: [bool; 3],
            len: u64,
            alive: bool,
        }
        /// A stream of another medium: its name, instance, the row or shared pool it counts
        /// for, and its own prefix.
        struct OtherMedium {
            stream: u32,
            name: &'static str,
            instance: usize,
            owner: u32,
            len: u64,
            alive: bool,
        }
        let mut instances: Vec<&str> = Vec::new();
        let mut rows: Vec<Row> = Vec::new();
        // Shared pools: stream → instance index.
        let mut shared: Vec<(u32, usize)> = Vec::new();
        let mut others: Vec<OtherMedium> = Vec::new();
        for (i, s) in self.streams.iter().enumerate() {
            let Some(s) = s else { continue };
            let sp = &s.spec;
            if sp.tenant != scope.tenant
                || sp.model != scope.model
                || sp.block_size != scope.block_size
                || scope.instance.is_some_and(|x| x != sp.instance)
            {
                continue;
            }
            let inst = match instances.iter().position(|x| *x == sp.instance) {
                Some(p) => p,
                None => {
                    instances.push(&sp.instance);
                    instances.len() - 1
                }
            };
            if let Some((name, owner)) = s.medium {
                others.push(OtherMedium {
                    stream: i as u32,
                    name: name.as_str(),
                    instance: inst,
                    owner,
                    len: 0,
                    alive: true,
                });
            } else if sp.shared {
                shared.push((i as u32, inst));
            } else {
                rows.push(Row {
                    stream: i as u32,
                    instance: inst,
                    rank: sp.dp_rank,
                    tier_len: [0; 3],
                    tier_alive: [true; 3],
                    len: 0,
                    alive: true,
                });
            }
        }
        let key = NsKey {
            tenant: scope.tenant.to_owned(),
            model: scope.model.to_owned(),
            lora: scope.lora.clone(),
            block_size: scope.block_size,
            salt: scope.salt.to_owned(),
        };
        if let Some(&ns) = self.ns_ids.get(&key) {
            // The streams that answer: rows and shared pools, sorted for a binary search.
            let mut wanted: Vec<u32> = rows
                .iter()
                .map(|r| r.stream)
                .chain(shared.iter().map(|s| s.0))
                .chain(others.iter().map(|o| o.stream))
                .collect();
            wanted.sort_unstable();
            let mut masks: Vec<(u32, u8)> = Vec::new();
            let mut shared_masks = vec![0u8; instances.len()];
            // Blocks on another medium of a row's own stream (bit 3: no tier of the three).
            let mut other_masks: Vec<(u32, u8)> = Vec::new();
            // The records holding the previous block, and this one's.
            let mut held: Vec<RecId> = Vec::new();
            let mut next: Vec<RecId> = Vec::new();
            for (k, seq) in seqs.enumerate() {
                masks.clear();
                shared_masks.iter_mut().for_each(|m| *m = 0);
                // A record holding this block either continues one holding the previous
                // block (the next in the arena) or is a chain head.
                next.clear();
                next.extend(
                    held.iter()
                        .filter_map(|&r| self.store.next_in_chain(r, seq)),
                );
                self.store.for_each_head(ns, seq, |r| {
                    let st = u32::from(self.store.stream_of(&self.store.rec(r)));
                    if wanted.binary_search(&st).is_ok() {
                        next.push(r);
                    }
                });
                std::mem::swap(&mut held, &mut next);
                for &r in &held {
                    let rec = self.store.rec(r);
                    let st = u32::from(self.store.stream_of(&rec));
                    let bit = rec.mask();
                    if let Some(&(_, inst)) = shared.iter().find(|(s, _)| *s == st) {
                        shared_masks[inst] |= bit;
                    } else if let Some(m) = masks.iter_mut().find(|(s, _)| *s == st) {
                        m.1 |= bit;
                    } else {
                        masks.push((st, bit));
                    }
                }
                other_masks.clear();
                for o in &mut others {
                    let held = masks.iter().any(|(s, m)| *s == o.stream && *m != 0);
                    if o.alive && held {
                        o.len = k as u64 + 1;
                    } else {
                        o.alive = false;
                    }
                    if !held {
                        continue;
                    }
                    if shared.iter().any(|(s, _)| *s == o.owner) {
                        shared_masks[o.instance] |= 1 << 3;
                    } else {
                        other_masks.push((o.owner, 1 << 3));
                    }
                }
                let mut any_alive = false;
                for row in &mut rows {
                    let own = masks
                        .iter()
                        .find(|(s, _)| *s == row.stream)
                        .map_or(0, |m| m.1);
                    let on_other = other_masks
                        .iter()
                        .find(|(s, _)| *s == row.stream)
                        .map_or(0, |m| m.1);
                    let mask = own | on_other | shared_masks[row.instance];
                    for t in 0..3 {
                        if row.tier_alive[t] && mask & (1 << t) != 0 {
                            row.tier_len[t] = k as u64 + 1;
                        } else {
                            row.tier_alive[t] = false;
                        }
                    }
                    if row.alive && mask != 0 {
                        row.len = k as u64 + 1;
                    } else {
                        row.alive = false;
                    }
                    any_alive |= row.alive;
                }
                if !any_alive {
                    break;
                }
            }
        }
        let bs = u64::from(scope.block_size);
        let mut out: BTreeMap<String, InstanceMatch> = BTreeMap::new();
        for row in &rows {
            let m = out.entry(instances[row.instance].to_owned()).or_default();
            m.gpu = m.gpu.max(row.tier_len[0] * bs);
            m.cpu = m.cpu.max(row.tier_len[1] * bs);
            m.disk = m.disk.max(row.tier_len[2] * bs);
            let dp = m.dp.entry(row.rank).or_default();
            *dp = (*dp).max(row.len * bs);
            m.longest_matched = m.longest_matched.max(row.len * bs);
        }
        for o in &others {
            let m = out.entry(instances[o.instance].to_owned()).or_default();
            let len = m.other.entry(o.name).or_default();
            *len = (*len).max(o.len * bs);
        }
        out
    }
}
