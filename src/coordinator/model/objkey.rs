//! Object keys: LMCache's JSON form ([`EncodedKey`]) and the fixed-size form the key store
//! keeps (`CompactKey`), with why a key cannot be tracked ([`KeyError`]). Pure.

/// Longest chunk hash kept inline (blake3 and sha256 are 32 bytes).
pub(crate) const MAX_HASH_BYTES: usize = 32;

/// Why an event key cannot be tracked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum KeyError {
    /// `chunk_hash_hex` is not an even-length hex string.
    #[error("chunk_hash_hex is not hex")]
    BadHex,
    /// The chunk hash is longer than 32 bytes.
    #[error("chunk_hash_hex is longer than {MAX_HASH_BYTES} bytes")]
    HashTooLong,
    /// `kv_rank`, `object_group_id` or the size does not fit the compact form.
    #[error("{0} out of range")]
    OutOfRange(&'static str),
    /// Too many distinct model names.
    #[error("too many distinct model names")]
    TooManyModels,
    /// `model_name` contains `@` or `cache_salt` contains `@ / \ NUL` or is too long.
    #[error("invalid {0}")]
    Invalid(&'static str),
}

/// An object key in LMCache's JSON form (`EncodedObjectKey`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
pub struct EncodedKey {
    /// Hex of the chunk hash (any case on input; lowercase on output).
    pub chunk_hash_hex: String,
    /// Model name (no `@`).
    pub model_name: String,
    /// Bit-packed `world_size<<24 | global_rank<<16 | local_world_size<<8 | local_rank`.
    pub kv_rank: i64,
    /// Object group (default 0).
    #[serde(default)]
    pub object_group_id: i64,
    /// Tenant salt (default "").
    #[serde(default)]
    pub cache_salt: String,
}

/// A key without its salt, in fixed size: what a slot stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct CompactKey {
    pub(crate) hash: [u8; MAX_HASH_BYTES],
    pub(crate) hash_len: u8,
    pub(crate) group: u8,
    pub(crate) model: u16,
    pub(crate) kv_rank: u32,
}

pub(crate) const HEX: &[u8; 16] = b"0123456789abcdef";

/// The model-independent part of `KeyStore::compact` (model left 0).
pub(crate) fn lookup_compact(key: &EncodedKey) -> Result<CompactKey, KeyError> {
    let hex = key.chunk_hash_hex.as_bytes();
    if !hex.len().is_multiple_of(2) {
        return Err(KeyError::BadHex);
    }
    if hex.len() / 2 > MAX_HASH_BYTES {
        return Err(KeyError::HashTooLong);
    }
    let mut hash = [0u8; MAX_HASH_BYTES];
    for (i, pair) in hex.chunks_exact(2).enumerate() {
        let hi = nibble(pair[0]).ok_or(KeyError::BadHex)?;
        let lo = nibble(pair[1]).ok_or(KeyError::BadHex)?;
        hash[i] = hi << 4 | lo;
    }
    let salt = &key.cache_salt;
    if salt.len() > 128 || salt.contains(['@', '/', '\\', '\0']) {
        return Err(KeyError::Invalid("cache_salt"));
    }
    Ok(CompactKey {
        hash,
        hash_len: u8::try_from(hex.len() / 2).map_err(|_| KeyError::HashTooLong)?,
        group: u8::try_from(key.object_group_id)
            .map_err(|_| KeyError::OutOfRange("object_group_id"))?,
        model: 0,
        kv_rank: u32::try_from(key.kv_rank).map_err(|_| KeyError::OutOfRange("kv_rank"))?,
    })
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}
