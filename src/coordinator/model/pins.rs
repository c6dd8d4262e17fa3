//! Token sequences to object keys (LMCache 0.5.6's `resolve_object_keys`), and the pin table
//! that keeps keys out of the fleet eviction plan (`POST/DELETE/GET /cache/pins`, and the
//! filter of `POST /cache/delete`). Pure: no I/O.
//!
//! Resolution: the complete chunks of `chunk_size` tokens get rolling BLAKE3 hashes —
//! `h_0 = NONE`, `h_i = blake3(h_{i-1} ‖ tokens_i as u32 big-endian)`, with
//! `NONE = blake3(0 as i64 big-endian ‖ 0 as u32 big-endian)` — and each chunk fans out to one
//! key per rank (`world_size<<24 | rank<<16 | world_size<<8 | rank`), object group 0, chunk
//! by chunk. A pin covers its chunk in every object group (the group is dropped), is counted
//! (pinned twice, unpinned twice), and pins list in the order they were first taken.

use super::keys::EncodedKey;
use std::collections::{BTreeMap, HashMap};

/// Most token ids in one request (0.5.6's `MAX_TOKEN_IDS`).
pub const MAX_TOKEN_IDS: usize = 1_000_000;

/// Why a token sequence cannot be resolved (400).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// Over [`MAX_TOKEN_IDS`].
    #[error("too many token_ids in a single request (limit={MAX_TOKEN_IDS}, got={0})")]
    TooManyTokens(usize),
    /// A key field LMCache refuses.
    #[error("invalid {0}")]
    Invalid(&'static str),
}

/// The packed `kv_rank` of `rank` in a `world_size` fleet (single node).
pub fn kv_rank(world_size: u8, rank: u8) -> i64 {
    let (w, r) = (i64::from(world_size), i64::from(rank));
    (w << 24) | (r << 16) | (w << 8) | r
}

/// The rolling BLAKE3 hashes of the complete chunks of `tokens`.
pub fn chunk_hashes(tokens: &[u32], chunk_size: usize) -> Vec<[u8; 32]> {
    let mut prefix: [u8; 32] = {
        let mut h = blake3::Hasher::new();
        h.update(&0i64.to_be_bytes());
        h.update(&0u32.to_be_bytes());
        h.finalize().into()
    };
    let mut out = Vec::with_capacity(tokens.len() / chunk_size.max(1));
    for chunk in tokens.chunks_exact(chunk_size.max(1)) {
        let mut h = blake3::Hasher::new();
        h.update(&prefix);
        for t in chunk {
            h.update(&t.to_be_bytes());
        }
        prefix = h.finalize().into();
        out.push(prefix);
    }
    out
}

/// Whether LMCache could write `model_name` and `cache_salt` into a key.
///
/// # Errors
/// [`ResolveError::Invalid`] for a model name with `@` or a salt LMCache refuses.
pub fn check_names(model_name: &str, cache_salt: &str) -> Result<(), ResolveError> {
    if model_name.contains('@') {
        return Err(ResolveError::Invalid("model_name: must not contain '@'"));
    }
    if cache_salt.chars().count() > 128 || cache_salt.contains(['@', '/', '\\', '\0']) {
        return Err(ResolveError::Invalid(
            "cache_salt: at most 128 characters, without '@ / \\ NUL'",
        ));
    }
    Ok(())
}

/// The object keys of the complete chunks of `tokens` and the number of chunks.
///
/// # Errors
/// [`ResolveError`] over the token cap, for a model name with `@`, or a salt LMCache refuses.
pub fn resolve(
    model_name: &str,
    world_size: u8,
    tokens: &[u32],
    cache_salt: &str,
    chunk_size: usize,
) -> Result<(Vec<EncodedKey>, usize), ResolveError> {
    if tokens.len() > MAX_TOKEN_IDS {
        return Err(ResolveError::TooManyTokens(tokens.len()));
    }
    check_names(model_name, cache_salt)?;
    let hashes = chunk_hashes(tokens, chunk_size);
    let mut keys = Vec::with_capacity(hashes.len() * usize::from(world_size));
    for h in &hashes {
        let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
        for rank in 0..world_size {
            keys.push(EncodedKey {
                chunk_hash_hex: hex.clone(),
                model_name: model_name.to_owned(),
                kv_rank: kv_rank(world_size, rank),
                object_group_id: 0,
                cache_salt: cache_salt.to_owned(),
            });
        }
    }
    Ok((keys, hashes.len()))
}

/// The pin table key: the key without its object group, hash in lowercase.
fn chunk_key(key: &EncodedKey) -> EncodedKey {
    EncodedKey {
        chunk_hash_hex: key.chunk_hash_hex.to_ascii_lowercase(),
        object_group_id: 0,
        ..key.clone()
    }
}

/// One pinned key and its count (`GET /cache/pins`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Pinned {
    /// The key (object group 0).
    pub key: EncodedKey,
    /// Active pins.
    pub pin_count: u64,
}

/// Pinning would pass the pinned-key limit.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("pin limit of {0} keys reached")]
pub struct PinsFull(pub usize);

/// The pin table: counts, and first-pinned order.
#[derive(Debug, Default)]
pub struct Pins {
    counts: HashMap<EncodedKey, (u64, u64)>,
    order: BTreeMap<u64, EncodedKey>,
    next: u64,
}

impl Pins {
    /// Pinned keys.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether nothing is pinned.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Whether `key` (in any object group) is pinned.
    pub fn contains(&self, key: &EncodedKey) -> bool {
        !self.counts.is_empty() && self.counts.contains_key(&chunk_key(key))
    }

    /// Adds one pin to each key; nothing changes if the new keys would pass `max` keys.
    ///
    /// # Errors
    /// [`PinsFull`] at the limit.
    pub fn pin(&mut self, keys: &[EncodedKey], max: usize) -> Result<(), PinsFull> {
        let fresh = keys
            .iter()
            .map(chunk_key)
            .filter(|k| !self.counts.contains_key(k))
            .collect::<std::collections::HashSet<_>>()
            .len();
        if self.counts.len() + fresh > max {
            return Err(PinsFull(max));
        }
        for key in keys {
            let key = chunk_key(key);
            match self.counts.get_mut(&key) {
                Some((count, _)) => *count += 1,
                None => {
                    self.next += 1;
                    self.order.insert(self.next, key.clone());
                    self.counts.insert(key, (1, self.next));
                }
            }
        }
        Ok(())
    }

    /// Removes one pin from each key (a key at 0 pins leaves the table).
    pub fn unpin(&mut self, keys: &[EncodedKey]) {
        for key in keys {
            let key = chunk_key(key);
            if let Some((count, order)) = self.counts.get_mut(&key) {
                if *count > 1 {
                    *count -= 1;
                } else {
                    let order = *order;
                    self.order.remove(&order);
                    self.counts.remove(&key);
                }
            }
        }
    }

    /// Every pinned key with its count, in first-pinned order (for `--metadata-path`).
    pub fn rows(&self) -> Vec<(EncodedKey, u64)> {
        self.order
            .values()
            .filter_map(|k| self.counts.get(k).map(|&(n, _)| (k.clone(), n)))
            .collect()
    }

    /// Restores one key with `count` pins (after those already pinned); false if it was
    /// already pinned, `count` is 0 or `max` keys are pinned.
    pub fn restore(&mut self, key: &EncodedKey, count: u64, max: usize) -> bool {
        let key = chunk_key(key);
        if count == 0 || self.counts.len() >= max || self.counts.contains_key(&key) {
            return false;
        }
        self.next += 1;
        self.order.insert(self.next, key.clone());
        self.counts.insert(key, (count, self.next));
        true
    }

    /// Removes every pin of each key (a force delete).
    pub fn drop_pins(&mut self, keys: &[EncodedKey]) {
        for key in keys {
            if let Some((_, order)) = self.counts.remove(&chunk_key(key)) {
                self.order.remove(&order);
            }
        }
    }

    /// The keys matching the filters (empty: any), in first-pinned order: their number, and
    /// `limit` of them after `offset`.
    pub fn list(
        &self,
        cache_salt: &str,
        model_name: &str,
        offset: usize,
        limit: usize,
    ) -> (usize, Vec<Pinned>) {
        let matching = self.order.values().filter(|k| {
            (cache_salt.is_empty() || k.cache_salt == cache_salt)
                && (model_name.is_empty() || k.model_name == model_name)
        });
        let mut total = 0;
        let mut page = Vec::new();
        for key in matching {
            if total >= offset && page.len() < limit {
                let pin_count = self.counts.get(key).map_or(0, |c| c.0);
                page.push(Pinned {
                    key: key.clone(),
                    pin_count,
                });
            }
            total += 1;
        }
        (total, page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// `cs16_seq1_bench`, copied from the reference vectors `spec/mp-coordinator/token_key_vectors.json`, made by
    /// LMCache 0.5.6's own `TokenHasher` + `resolve_object_keys`.
    const CS16_SEQ1_BENCH: &str = r#"{"chunks": 4, "keys": [
        {"chunk_hash_hex": "9e735f593b5ffb1be4963a5414c9697b0138f34f6738c58fc8b0239dc263a607", "model_name": "test-model", "kv_rank": 16777472, "object_group_id": 0, "cache_salt": ""},
        {"chunk_hash_hex": "40c615dae7781b00f38d8f4f03e30c0c10b387f506e33cd4232011ca83df036a", "model_name": "test-model", "kv_rank": 16777472, "object_group_id": 0, "cache_salt": ""},
        {"chunk_hash_hex": "8f11f880304548ee6a13c306f7a97caf114125b3091be77097d2c2ffaa6149d3", "model_name": "test-model", "kv_rank": 16777472, "object_group_id": 0, "cache_salt": ""},
        {"chunk_hash_hex": "8abec356228d4081b440ef6afc21f6d90e69166299a5f031793e7696ed0a68bd", "model_name": "test-model", "kv_rank": 16777472, "object_group_id": 0, "cache_salt": ""}]}"#;

    #[test]
    fn resolution_matches_lmcache_token_key_vectors() {
        // The bench client's request: [seq] + [9906] × 64, chunk 16, world size 1.
        let mut tokens = vec![1u32];
        tokens.extend(std::iter::repeat_n(9906, 64));
        let (keys, chunks) = resolve("test-model", 1, &tokens, "", 16).unwrap();
        let want: Value = serde_json::from_str(CS16_SEQ1_BENCH).unwrap();
        assert_eq!(chunks as u64, want["chunks"].as_u64().unwrap());
        let want: Vec<EncodedKey> = serde_json::from_value(want["keys"].clone()).unwrap();
        assert_eq!(keys, want);
        // Under one chunk: nothing.
        assert_eq!(resolve("m", 1, &tokens, "", 256).unwrap(), (vec![], 0));
    }

    #[test]
    fn world_size_fans_out_chunk_by_chunk_and_bad_fields_are_refused() {
        assert_eq!(kv_rank(1, 0), 16_777_472);
        assert_eq!((kv_rank(2, 0), kv_rank(2, 1)), (33_554_944, 33_620_481));
        let tokens: Vec<u32> = (0..32).collect();
        let (keys, chunks) = resolve("m", 2, &tokens, "t", 16).unwrap();
        assert_eq!((keys.len(), chunks), (4, 2));
        assert_eq!(keys[0].chunk_hash_hex, keys[1].chunk_hash_hex);
        assert_ne!(keys[1].chunk_hash_hex, keys[2].chunk_hash_hex);
        assert_eq!(keys[3].kv_rank, 33_620_481);
        assert!(matches!(
            resolve("a@b", 1, &tokens, "", 16),
            Err(ResolveError::Invalid(_))
        ));
        assert!(matches!(
            resolve("m", 1, &tokens, "a/b", 16),
            Err(ResolveError::Invalid(_))
        ));
        let many = vec![0u32; MAX_TOKEN_IDS + 1];
        assert_eq!(
            resolve("m", 1, &many, "", 16),
            Err(ResolveError::TooManyTokens(MAX_TOKEN_IDS + 1))
        );
    }

    #[test]
    fn pins_count_cover_every_group_and_list_in_first_pinned_order() {
        let tokens: Vec<u32> = (0..48).collect();
        let (a, _) = resolve("m", 1, &tokens, "s", 16).unwrap();
        let (b, _) = resolve("n", 1, &tokens[..16], "", 16).unwrap();
        let mut p = Pins::default();
        p.pin(&a, 10).unwrap();
        p.pin(&b, 10).unwrap();
        p.pin(&a[..1], 10).unwrap();
        assert_eq!(p.len(), 4);
        let mut other_group = a[2].clone();
        other_group.object_group_id = 3;
        other_group.chunk_hash_hex = other_group.chunk_hash_hex.to_uppercase();
        assert!(p.contains(&other_group));
        let (total, page) = p.list("", "", 0, 10);
        assert_eq!(total, 4);
        assert_eq!(page[0].pin_count, 2);
        assert_eq!(page[3].key, b[0]);
        assert_eq!(
            p.list("s", "", 1, 1),
            (
                3,
                vec![Pinned {
                    key: a[1].clone(),
                    pin_count: 1
                }]
            )
        );
        assert_eq!(p.list("", "n", 0, 10).0, 1);
        // Twice pinned: unpinned twice. A key at zero leaves; re-pinned it goes last.
        p.unpin(&a[..1]);
        assert!(p.contains(&a[0]));
        p.unpin(&a[..1]);
        assert!(!p.contains(&a[0]));
        p.pin(&a[..1], 10).unwrap();
        assert_eq!(p.list("", "", 0, 10).1[3].key, a[0]);
        p.drop_pins(&a);
        assert_eq!(p.len(), 1);
        // The limit refuses the whole request.
        assert_eq!(p.pin(&a, 3), Err(PinsFull(3)));
        assert_eq!(p.len(), 1);
    }
}
