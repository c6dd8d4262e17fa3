//! What the controller's commands do to the tiers (a child of `tiers`, which keeps the
//! locks): find the keys a token prefix names, hold (pin) and release them, move them between
//! L1 and L2, re-encode them (compress, decompress), and take objects out for a peer.

use super::disk;
use super::{decode, Deleted, Object, TierId, TieredStore};
use crate::node::model::compress::Codec;
use crate::node::model::keys::{chunk_hash, key_rank};
use crate::protocol::ChunkHash;
use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::Arc;

/// The keys a token prefix resolved to in one tier.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Resolved {
    /// Every matching key of the chunks of the prefix, chunk by chunk.
    pub(crate) keys: Vec<String>,
    /// Tokens of the prefix held: the end of the last chunk found before the first gap.
    pub(crate) tokens: usize,
}

impl TieredStore {
    /// The keys of `tier` (L2: complete files only) for which `keep` holds, with the tokens
    /// each object holds.
    pub(crate) fn keys_in(&self, tier: TierId, keep: impl Fn(&str) -> bool) -> Vec<(String, u32)> {
        match tier {
            TierId::L1 => {
                let l1 = self.l1.lock();
                l1.keys()
                    .filter(|k| keep(k))
                    .filter_map(|k| l1.peek(k).map(|o| (k.to_owned(), o.meta.num_tokens())))
                    .collect()
            }
            TierId::L2 => self.l2.as_ref().map_or_else(Vec::new, |l2| {
                let index = l2.index.lock();
                index
                    .keys()
                    .filter(|k| keep(k))
                    .filter_map(|k| {
                        index
                            .peek(k)
                            .filter(|e| e.ready)
                            .map(|e| (k.to_owned(), e.tokens))
                    })
                    .collect()
            }),
        }
    }

    /// The keys of `tier` holding the chunks `(end, hash)` of a token sequence, as LMCache's
    /// `lookup` matches them: chunk by chunk from the first, stopping at the first chunk the
    /// tier does not hold. `rank`: only keys of that TP rank (the key's worker id field);
    /// `None`: every rank. One scan of the tier's keys.
    pub(crate) fn resolve(
        &self,
        tier: TierId,
        chunks: &[(usize, ChunkHash)],
        rank: Option<u32>,
    ) -> Resolved {
        let wanted: HashSet<ChunkHash> = chunks.iter().map(|(_, h)| *h).collect();
        let mut by_hash: HashMap<ChunkHash, Vec<String>> = HashMap::new();
        for (key, _) in self.keys_in(tier, |k| rank.is_none_or(|r| key_rank(k) == Some(r))) {
            if let Some(h) = chunk_hash(&key).filter(|h| wanted.contains(h)) {
                by_hash.entry(h).or_default().push(key);
            }
        }
        let mut out = Resolved::default();
        for (end, hash) in chunks {
            let Some(keys) = by_hash.remove(hash) else {
                break;
            };
            out.keys.extend(keys);
            out.tokens = *end;
        }
        out
    }

    /// Holds (`on`) or releases `keys` in `tier`: a held object is never evicted, cleared or
    /// deleted by a coordinator until released. L2's holds are written to its pins file
    /// (they survive a restart). Returns how many of `keys` the tier has.
    pub(crate) async fn hold(
        self: &Arc<Self>,
        tier: TierId,
        keys: &[String],
        on: bool,
    ) -> io::Result<usize> {
        let found = match tier {
            TierId::L1 => {
                let mut l1 = self.l1.lock();
                keys.iter().filter(|k| l1.set_held(k, on)).count()
            }
            TierId::L2 => {
                let Some(l2) = &self.l2 else { return Ok(0) };
                let found = {
                    let mut index = l2.index.lock();
                    keys.iter().filter(|k| index.set_held(k, on)).count()
                };
                self.persist_holds().await?;
                found
            }
        };
        Ok(found)
    }

    /// Rewrites L2's pins file from the index.
    async fn persist_holds(self: &Arc<Self>) -> io::Result<()> {
        let Some(l2) = &self.l2 else { return Ok(()) };
        let held = self.held_keys(TierId::L2);
        let (root, fsync) = (l2.root.clone(), l2.fsync);
        tokio::task::spawn_blocking(move || disk::write_pins(&root, &held, fsync))
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e)))
    }

    /// The keys held in `tier`.
    pub(crate) fn held_keys(&self, tier: TierId) -> Vec<String> {
        match tier {
            TierId::L1 => {
                let l1 = self.l1.lock();
                l1.keys()
                    .filter(|k| l1.is_held(k))
                    .map(str::to_owned)
                    .collect()
            }
            TierId::L2 => self.l2.as_ref().map_or_else(Vec::new, |l2| {
                let index = l2.index.lock();
                index
                    .keys()
                    .filter(|k| index.is_held(k))
                    .map(str::to_owned)
                    .collect()
            }),
        }
    }

    /// Whether `key` is held in `tier`.
    pub(crate) fn is_held(&self, tier: TierId, key: &str) -> bool {
        match tier {
            TierId::L1 => self.l1.lock().is_held(key),
            TierId::L2 => self
                .l2
                .as_ref()
                .is_some_and(|l2| l2.index.lock().is_held(key)),
        }
    }

    /// Held objects per tier (L1, L2).
    pub(crate) fn held_counts(&self) -> (usize, usize) {
        (
            self.l1.lock().held_count(),
            self.l2
                .as_ref()
                .map_or(0, |l2| l2.index.lock().held_count()),
        )
    }

    /// `key`'s object as `tier` stores it (L2: read and verified from its file).
    pub(crate) async fn fetch(self: &Arc<Self>, tier: TierId, key: &str) -> Option<Object> {
        match tier {
            TierId::L1 => self.l1.lock().peek(key).cloned(),
            TierId::L2 => self.read_l2(key).await,
        }
    }

    /// Stores `obj` in `tier` only, keeping a hold; returns whether the tier took it (L2:
    /// once its file is in place).
    async fn store_in(self: &Arc<Self>, tier: TierId, key: &str, obj: Object, held: bool) -> bool {
        let stored = match tier {
            TierId::L1 => self.put_l1(key, obj),
            TierId::L2 => self.store_l2(key, obj).await,
        };
        if stored && held {
            self.set_held(tier, key);
        }
        stored
    }

    /// Holds `key` in `tier` (no pins file write).
    fn set_held(&self, tier: TierId, key: &str) {
        match tier {
            TierId::L1 => {
                self.l1.lock().set_held(key, true);
            }
            TierId::L2 => {
                if let Some(l2) = &self.l2 {
                    l2.index.lock().set_held(key, true);
                }
            }
        }
    }

    /// Whether `tier` has `key` (L2: its file complete).
    fn holds(&self, tier: TierId, key: &str) -> bool {
        match tier {
            TierId::L1 => self.l1.lock().contains(key),
            TierId::L2 => self
                .l2
                .as_ref()
                .is_some_and(|l2| l2.index.lock().peek(key).is_some_and(|e| e.ready)),
        }
    }

    /// Copies `keys` from one tier to the other (a hold goes with its object), then, unless
    /// `copy`, removes them from the source. Returns the keys now in `to`.
    pub(crate) async fn move_between(
        self: &Arc<Self>,
        from: TierId,
        to: TierId,
        keys: &[String],
        copy: bool,
    ) -> io::Result<Vec<String>> {
        let mut moved = Vec::new();
        let mut holds = false;
        for key in keys {
            let held = self.is_held(from, key);
            if self.holds(to, key) {
                // Already there (L2 written through): only the hold moves.
                if held {
                    self.set_held(to, key);
                    holds = true;
                }
                moved.push(key.clone());
                continue;
            }
            let Some(obj) = self.fetch(from, key).await else {
                continue;
            };
            if self.store_in(to, key, obj, held).await {
                holds |= held;
                moved.push(key.clone());
            }
        }
        if !copy {
            self.remove_unread(from, &moved).await?;
        }
        if holds && to == TierId::L2 {
            self.persist_holds().await?;
        }
        Ok(moved)
    }

    /// Re-encodes `keys` in `tier` with `codec` (`Codec::Raw`: decompress); an object already
    /// so encoded, or one the codec would not shrink, is left as is. Returns the keys done.
    pub(crate) async fn recode(
        self: &Arc<Self>,
        tier: TierId,
        keys: &[String],
        codec: Codec,
    ) -> Vec<String> {
        let mut done = Vec::new();
        for key in keys {
            let Some(obj) = self.fetch(tier, key).await else {
                continue;
            };
            if obj.codec == codec {
                done.push(key.clone());
                continue;
            }
            let Ok(raw) = decode(obj).await else {
                continue;
            };
            let raw_len = raw.data.len();
            let encoded = tokio::task::spawn_blocking(move || Object {
                meta: raw.meta,
                data: codec.encode(&raw.data),
                codec,
            })
            .await;
            let Ok(obj) = encoded else { continue };
            if codec != Codec::Raw && obj.data.len() >= raw_len {
                // Nothing gained (dense float16 KV under LZ4): kept as it is.
                done.push(key.clone());
                continue;
            }
            let stored = match tier {
                TierId::L1 => self.replace_l1(key, obj),
                TierId::L2 => self.store_l2(key, obj).await,
            };
            if stored {
                done.push(key.clone());
            }
        }
        done
    }

    /// Replaces an L1 object that is still there (never re-adds one evicted meanwhile).
    fn replace_l1(&self, key: &str, obj: Object) -> bool {
        if !self.l1.lock().contains(key) {
            return false;
        }
        self.put_l1(key, obj)
    }

    /// Removes `keys` from `tier` whatever their holds (a move takes its objects away), but
    /// not while a client reads them or their file is being written. L2 files are deleted
    /// and the pins file rewritten if a held key left.
    pub(crate) async fn remove_unread(
        self: &Arc<Self>,
        tier: TierId,
        keys: &[String],
    ) -> io::Result<Deleted> {
        let mut removed = Deleted::default();
        match tier {
            TierId::L1 => {
                let mut l1 = self.l1.lock();
                for k in keys {
                    if l1.reading(k) == 0 {
                        if let Some(o) = l1.remove(k) {
                            removed.keys += 1;
                            removed.tokens += u64::from(o.meta.num_tokens());
                            self.left(TierId::L1, &[(k.clone(), o)]);
                        }
                    }
                }
            }
            TierId::L2 => {
                let Some(l2) = &self.l2 else {
                    return Ok(removed);
                };
                let mut held_left = false;
                let mut files = Vec::new();
                {
                    let mut index = l2.index.lock();
                    for k in keys {
                        let ready = index.peek(k).is_some_and(|e| e.ready);
                        if ready && index.reading(k) == 0 {
                            held_left |= index.is_held(k);
                            if let Some(e) = index.remove(k) {
                                removed.keys += 1;
                                removed.tokens += u64::from(e.tokens);
                                self.left(TierId::L2, &[(k.clone(), e)]);
                                files.push(k.clone());
                            }
                        }
                    }
                }
                let root = l2.root.clone();
                tokio::task::spawn_blocking(move || {
                    for key in files {
                        disk::delete_object(&root, &key)?;
                    }
                    Ok::<_, io::Error>(())
                })
                .await
                .unwrap_or_else(|e| Err(io::Error::other(e)))?;
                if held_left {
                    self.persist_holds().await?;
                }
            }
        }
        Ok(removed)
    }
}
