//! How LMCache names a stored object, and how tokens become those names. Pure.
//!
//! A node stores LMCache's key strings (`CacheEngineKey.to_string()`:
//! `model@world_size@worker_id@chunk_hash_hex@dtype[@…]`). A coordinator names an object by
//! its encoded form ([`encode`] → [`EncodedKey`]: `kv_rank` packed as one host,
//! `world_size<<24 | worker_id<<16 | world_size<<8 | worker_id`); a controller knows its chunk
//! hash ([`chunk_hash`]) and the worker its TP rank ([`key_rank`]). Keys of another shape
//! have none of these.
//!
//! Tokens become chunk hashes two ways: a controller's commands hash them as an LMCache
//! worker's `lookup` does ([`TokenChunks`], the builtin-hash chain), a coordinator's warm
//! prefetch as LMCache 0.5.6's MP server does ([`blake3_chunk_hashes`]).

use crate::protocol::token_hash::chunk_hashes;
use crate::protocol::ChunkHash;
use serde::{Deserialize, Serialize};

/// The coordinator's form of a key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct EncodedKey {
    /// Lowercase, even-length hex of the chunk hash.
    pub(crate) chunk_hash_hex: String,
    /// Model name.
    pub(crate) model_name: String,
    /// Packed ranks.
    pub(crate) kv_rank: i64,
    /// Object group (always 0 here).
    #[serde(default)]
    pub(crate) object_group_id: i64,
    /// Tenant salt (always "" here).
    #[serde(default)]
    pub(crate) cache_salt: String,
}

/// Lowercase, left-padded to even length; `None` if not hex.
pub(crate) fn norm_hex(h: &str) -> Option<String> {
    if h.is_empty() || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut s = h.to_ascii_lowercase();
    if s.len() % 2 == 1 {
        s.insert(0, '0');
    }
    Some(s)
}

/// The key tag carrying a salt: LMCache writes request config `lmcache.tag.cache_salt = S`
/// into the key as `@cache_salt%S`.
pub(crate) const SALT_TAG: &str = "cache_salt%";

/// The coordinator's form of an LMCache key string, if it has one.
pub(crate) fn encode(key: &str) -> Option<EncodedKey> {
    let mut parts = key.split('@');
    let model = parts.next()?;
    let world: i64 = parts.next()?.parse().ok()?;
    let worker: i64 = parts.next()?.parse().ok()?;
    let hash = norm_hex(parts.next()?)?;
    if model.is_empty() || !(0..256).contains(&world) || !(0..256).contains(&worker) {
        return None;
    }
    // The rest: the dtype, a layer id, then LMCache's tags `name%value` (request configs
    // `lmcache.tag.name`); the tag `cache_salt` is the key's salt.
    let mut cache_salt = String::new();
    for part in parts {
        if let Some(salt) = part.strip_prefix(SALT_TAG) {
            if salt.len() > 128 || salt.contains(['/', '\\', '\0']) {
                return None;
            }
            salt.clone_into(&mut cache_salt);
        }
    }
    Some(EncodedKey {
        chunk_hash_hex: hash,
        model_name: model.to_owned(),
        kv_rank: (world << 24) | (worker << 16) | (world << 8) | worker,
        object_group_id: 0,
        cache_salt,
    })
}

/// The chunk hash of an LMCache key string: its fourth `@` field, hex with an optional `-`
/// (`f"{chunk_hash:x}"` of a Python int, negative for CPython's `hash`). A digest longer than
/// 64 bits (`bytes.hex()`) is folded to its first 8 bytes, big-endian, as LMCache's controller
/// folds digests. `None` for keys of another shape.
pub(crate) fn chunk_hash(key: &str) -> Option<ChunkHash> {
    let mut parts = key.split('@');
    let _model = parts.next()?;
    parts.next()?.parse::<u32>().ok()?;
    parts.next()?.parse::<u32>().ok()?;
    let hex = parts.next()?;
    let (negative, digits) = match hex.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, hex),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    if negative {
        let v = i128::from_str_radix(digits, 16).ok()?;
        return ChunkHash::from_i128(-v);
    }
    // An int's hex has at most 16 digits; a longer string is a digest's `bytes.hex()`.
    let digits = digits.get(..16).unwrap_or(digits);
    u64::from_str_radix(digits, 16)
        .ok()
        .map(ChunkHash::from_u64)
}

/// The TP rank of an LMCache key string: its third `@` field (`worker_id`). `None` for keys
/// of another shape.
pub(crate) fn key_rank(key: &str) -> Option<u32> {
    let mut parts = key.split('@');
    parts.next()?;
    parts.next()?.parse::<u32>().ok()?;
    parts.next()?.parse::<u32>().ok()
}

/// How tokens become chunk hashes (an LMCache worker's builtin-hash chain).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenChunks {
    /// Tokens per chunk (LMCache's `chunk_size`).
    pub(crate) chunk_size: usize,
    /// The chain's starting hash (LMCache's `NONE_HASH`, the controller's
    /// `--lookup-none-hash`).
    pub(crate) none_hash: ChunkHash,
}

impl TokenChunks {
    /// Each chunk's end and hash.
    pub(crate) fn of(&self, tokens: &[i64]) -> Vec<(usize, ChunkHash)> {
        chunk_hashes(tokens, self.chunk_size, self.none_hash)
            .into_iter()
            .map(|c| (c.end, c.hash))
            .collect()
    }
}

/// The rolling BLAKE3 hashes of the complete `chunk_size`-token chunks of `tokens`, as hex.
pub(crate) fn blake3_chunk_hashes(tokens: &[u32], chunk_size: usize) -> Vec<String> {
    let mut prev: [u8; 32] = {
        let mut h = blake3::Hasher::new();
        h.update(&0i64.to_be_bytes());
        h.update(&0u32.to_be_bytes());
        *h.finalize().as_bytes()
    };
    tokens
        .chunks_exact(chunk_size.max(1))
        .map(|chunk| {
            let mut h = blake3::Hasher::new();
            h.update(&prev);
            for t in chunk {
                h.update(&t.to_be_bytes());
            }
            prev = *h.finalize().as_bytes();
            prev.iter().map(|b| format!("{b:02x}")).collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_lmcache_keys() {
        let e = encode("m/x@2@1@ABC@bfloat16").unwrap_or_else(|| unreachable!());
        assert_eq!(e.chunk_hash_hex, "0abc");
        assert_eq!(e.model_name, "m/x");
        assert_eq!(e.kv_rank, (2 << 24) | (1 << 16) | (2 << 8) | 1);
        assert!(encode("plain-key").is_none());
        assert!(encode("m@x@1@ab").is_none());
        assert!(encode("m@1@1@zz").is_none());
        assert_eq!(e.cache_salt, "");
        // LMCache's tag `lmcache.tag.cache_salt` names the salt; other tags do not.
        let salted = encode("m@1@0@ab@bfloat16@user%7@cache_salt%tenant-a").expect("salted");
        assert_eq!(salted.cache_salt, "tenant-a");
        assert_eq!(salted.chunk_hash_hex, "ab");
        assert_eq!(
            encode("m@1@0@ab@bfloat16@user%7").map(|e| e.cache_salt),
            Some(String::new())
        );
        assert!(
            encode("m@1@0@ab@bf16@cache_salt%a/b").is_none(),
            "a salt LMCache refuses"
        );
    }

    #[test]
    fn parses_lmcache_chunk_hashes() {
        assert_eq!(
            chunk_hash("m@1@0@ff@bfloat16"),
            Some(ChunkHash::from_u64(255))
        );
        assert_eq!(
            chunk_hash("m/x@2@1@-1a@half@k%v"),
            Some(ChunkHash::from_i64(-26))
        );
        assert_eq!(
            chunk_hash("m@1@0@ffffffffffffffff@bf16"),
            Some(ChunkHash::from_u64(u64::MAX))
        );
        assert_eq!(
            chunk_hash("m@1@0@-8000000000000000@bf16"),
            Some(ChunkHash::from_i64(i64::MIN))
        );
        // A blake3 digest folds to its first 8 bytes.
        let digest = format!("0102030405060708{}", "ab".repeat(24));
        assert_eq!(
            chunk_hash(&format!("m@1@0@{digest}@bf16")),
            Some(ChunkHash::from_u64(0x0102_0304_0506_0708))
        );
        for bad in [
            "plain",
            "m@1@0@xyz@bf16",
            "m@one@0@ff@bf16",
            "m@1@0@-@bf16",
            "m@1@0@-10000000000000000@bf16",
        ] {
            assert_eq!(chunk_hash(bad), None, "{bad}");
        }
    }

    #[test]
    fn chunk_hashes_roll_over_complete_chunks() {
        assert!(blake3_chunk_hashes(&[1, 2, 3], 4).is_empty());
        let two = blake3_chunk_hashes(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 4);
        assert_eq!(two.len(), 2);
        assert_eq!(two[0].len(), 64);
        // Rolling: the second chunk's hash depends on the first.
        assert_ne!(blake3_chunk_hashes(&[0, 2, 3, 4, 5, 6, 7, 8], 4)[1], two[1]);
        assert_eq!(blake3_chunk_hashes(&[1, 2, 3, 4], 4)[0], two[0]);
    }
}
