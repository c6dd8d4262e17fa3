//! Scans over both tiers' keys (a child of `tiers`, which keeps the locks): the `lm://`
//! LIST reply, the object routes' pages in key order, the keys a predicate names (a warm
//! prefetch), and the delete of every key a predicate names (a controller's clear, the
//! object routes' delete). Each scan is O(objects) under one tier lock at a time and takes no
//! file I/O on the caller's thread: deleted L2 files go to the background tracker.

use super::disk;
use super::{Deleted, TierId, TierSet, TieredStore};
use crate::node::model::lru::Weighted;
use std::sync::Arc;

/// One listed object: its key and its size in the tier (body bytes in L1, file bytes in L2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    /// The node's key.
    pub(crate) key: String,
    /// Bytes in the tier.
    pub(crate) size_bytes: u64,
}

/// The `limit` smallest keys greater than `after` for which `keep` holds, in key order
/// (bounded: at most `limit + 1` kept at once); and whether more follow.
fn page_of<'a, V: Weighted + 'a>(
    entries: impl Iterator<Item = (&'a str, &'a V)>,
    after: Option<&str>,
    limit: usize,
    keep: impl Fn(&V) -> bool,
) -> (Vec<Listed>, bool) {
    let mut best: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for (k, v) in entries {
        if after.is_some_and(|a| k <= a) || !keep(v) {
            continue;
        }
        best.insert(k, v.bytes());
        if best.len() > limit + 1 {
            best.pop_last();
        }
    }
    let more = best.len() > limit;
    let out = best
        .into_iter()
        .take(limit)
        .map(|(k, size_bytes)| Listed {
            key: k.to_owned(),
            size_bytes,
        })
        .collect();
    (out, more)
}

impl TieredStore {
    /// The keys of either tier for which `matches` holds (an O(objects) scan).
    pub(crate) fn keys_where(&self, matches: impl Fn(&str) -> bool) -> Vec<String> {
        // L1, then L2's index: the order `list` takes them in.
        let l1 = self.l1.lock();
        let mut out: Vec<String> = l1
            .keys()
            .filter(|k| matches(k))
            .map(str::to_owned)
            .collect();
        if let Some(l2) = &self.l2 {
            let index = l2.index.lock();
            out.extend(
                index
                    .keys()
                    .filter(|k| !l1.contains(k) && matches(k))
                    .map(str::to_owned),
            );
        }
        out
    }

    /// Every key (L1's, then L2's not in L1), newline-joined, whole keys only, at most
    /// `max_bytes`.
    pub(crate) fn list(&self, max_bytes: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut push = |k: &str| {
            let extra = k.len() + usize::from(!out.is_empty());
            if out.len() + extra > max_bytes {
                return false;
            }
            if !out.is_empty() {
                out.push(b'\n');
            }
            out.extend_from_slice(k.as_bytes());
            true
        };
        let l1 = self.l1.lock();
        let mut full = false;
        for k in l1.keys() {
            if !push(k) {
                full = true;
                break;
            }
        }
        if let (false, Some(l2)) = (full, &self.l2) {
            let index = l2.index.lock();
            for k in index.keys() {
                // Entries still being written are listed too: GET serves them from memory.
                if l1.contains(k) {
                    continue;
                }
                if !push(k) {
                    break;
                }
            }
        }
        out
    }

    /// A page of `tier`'s keys (`l2`: complete files only) after `after`, in key order.
    pub(crate) fn page(
        &self,
        l2_tier: bool,
        after: Option<&str>,
        limit: usize,
    ) -> (Vec<Listed>, bool) {
        if l2_tier {
            let Some(l2) = &self.l2 else {
                return (Vec::new(), false);
            };
            let index = l2.index.lock();
            page_of(
                index.keys().filter_map(|k| index.peek(k).map(|v| (k, v))),
                after,
                limit,
                |e| e.ready,
            )
        } else {
            let l1 = self.l1.lock();
            page_of(
                l1.keys().filter_map(|k| l1.peek(k).map(|v| (k, v))),
                after,
                limit,
                |_| true,
            )
        }
    }

    /// Deletes every key for which `matches` holds from the tiers `which` names (objects being
    /// read — unless `force` —, L2 files still being written and objects the controller
    /// pinned are left alone); counts the distinct keys
    /// removed (an object in both tiers once) and the tokens removed, tier by tier (an object
    /// removed from both tiers counts in each, as LMCache sums its backends' clears).
    pub(crate) fn delete_in(
        self: &Arc<Self>,
        which: TierSet,
        force: bool,
        matches: impl Fn(&str) -> bool,
    ) -> Deleted {
        let mut removed = std::collections::HashSet::new();
        let mut tokens = 0u64;
        if which.l1 {
            let mut l1 = self.l1.lock();
            let victims: Vec<String> = l1
                .keys()
                .filter(|k| {
                    matches(k)
                        && if force {
                            !l1.is_held(k)
                        } else {
                            l1.pins(k) == 0
                        }
                })
                .map(str::to_owned)
                .collect();
            for k in victims {
                if let Some(o) = l1.remove(&k) {
                    tokens += u64::from(o.meta.num_tokens());
                    self.left(TierId::L1, &[(k.clone(), o)]);
                    removed.insert(k);
                }
            }
        }
        let done = |removed: std::collections::HashSet<String>, tokens| Deleted {
            keys: removed.len(),
            tokens,
        };
        let Some(l2) = self.l2.as_ref().filter(|_| which.l2) else {
            return done(removed, tokens);
        };
        let files: Vec<String> = {
            let mut index = l2.index.lock();
            let victims: Vec<String> = index
                .keys()
                .filter(|k| {
                    // A file being written holds its writer's pin, and is not `ready`.
                    let free = if force {
                        !index.is_held(k)
                    } else {
                        index.pins(k) == 0
                    };
                    matches(k) && free && index.peek(k).is_some_and(|e| e.ready)
                })
                .map(str::to_owned)
                .collect();
            for k in &victims {
                if let Some(e) = index.remove(k) {
                    tokens += u64::from(e.tokens);
                    self.left(TierId::L2, &[(k.clone(), e)]);
                }
            }
            victims
        };
        removed.extend(files.iter().cloned());
        if !files.is_empty() {
            let root = l2.root.clone();
            self.tasks.spawn_blocking(move || {
                for key in files {
                    if let Err(e) = disk::delete_object(&root, &key) {
                        tracing::warn!(key, "cannot delete an L2 file: {e}");
                    }
                }
            });
        }
        done(removed, tokens)
    }
}
