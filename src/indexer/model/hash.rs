//! The standard block hashing of the Conductor Indexer API, as Dynamo implements it.
//!
//! ```text
//! local[i] = XXH3_64(u32_le(tok[i*B]) ‖ … ‖ u32_le(tok[i*B+B-1]), seed = S)
//! seq[0]   = local[0]
//! seq[i]   = XXH3_64(u64_le(seq[i-1]) ‖ u64_le(local[i]), seed = S)
//! ```
//!
//! Only complete blocks are hashed; a partial tail is dropped. The seed defaults to 1337
//! (Dynamo's `XXH3_SEED`) and is configurable. Pure: no state beyond the seed.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Dynamo's seed, the default for `--hash-seed`.
pub const DEFAULT_SEED: u64 = 1337;

/// Tokens hashed per stack buffer chunk when a block is large.
const STACK_TOKENS: usize = 256;

/// The hash of one block's tokens on its own (`local[i]`).
pub fn local_hash(tokens: &[u32], seed: u64) -> u64 {
    // The common block sizes get a buffer of exactly their size, filled by a loop of known
    // length: no 1 KiB zeroing and no `memcpy` call per block (together about a third of
    // `/query`'s hashing in a profile of block size 16).
    if let Ok(t) = tokens.try_into() {
        return exact::<16, 64>(t, seed);
    }
    if let Ok(t) = tokens.try_into() {
        return exact::<32, 128>(t, seed);
    }
    if let Ok(t) = tokens.try_into() {
        return exact::<64, 256>(t, seed);
    }
    if let Ok(t) = tokens.try_into() {
        return exact::<128, 512>(t, seed);
    }
    if let Ok(t) = tokens.try_into() {
        return exact::<256, 1024>(t, seed);
    }
    if tokens.len() <= STACK_TOKENS {
        let mut buf = [0u8; STACK_TOKENS * 4];
        for (chunk, t) in buf.chunks_exact_mut(4).zip(tokens) {
            chunk.copy_from_slice(&t.to_le_bytes());
        }
        xxh3_64_with_seed(&buf[..tokens.len() * 4], seed)
    } else {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        xxh3_64_with_seed(&bytes, seed)
    }
}

/// [`local_hash`] of exactly `N` tokens, through a buffer of `B` = 4 × `N` bytes.
fn exact<const N: usize, const B: usize>(tokens: &[u32; N], seed: u64) -> u64 {
    const { assert!(B == 4 * N) };
    let mut buf = [0u8; B];
    for (chunk, t) in buf.chunks_exact_mut(4).zip(tokens) {
        chunk.copy_from_slice(&t.to_le_bytes());
    }
    xxh3_64_with_seed(&buf, seed)
}

/// The rolling hash of a block whose parent's rolling hash is `parent` (`seq[i]`, i > 0).
pub fn chain_hash(parent: u64, local: u64, seed: u64) -> u64 {
    let mut buf = [0u8; 16];
    buf[..8].copy_from_slice(&parent.to_le_bytes());
    buf[8..].copy_from_slice(&local.to_le_bytes());
    xxh3_64_with_seed(&buf, seed)
}

/// The rolling hash of a block given its parent's rolling hash (`None` for the first block).
pub fn next_seq_hash(parent: Option<u64>, tokens: &[u32], seed: u64) -> u64 {
    let local = local_hash(tokens, seed);
    match parent {
        None => local,
        Some(p) => chain_hash(p, local, seed),
    }
}

/// The rolling hashes of every complete block of `tokens`; empty when `block_size` is 0.
pub fn seq_hashes(tokens: &[u32], block_size: usize, seed: u64) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(tokens.len() / block_size);
    let mut parent = None;
    for block in tokens.chunks_exact(block_size) {
        let h = next_seq_hash(parent, block, seed);
        out.push(h);
        parent = Some(h);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn vectors() -> serde_json::Map<String, Value> {
        // Read at test time (not `include_str!`): test data is not part of the crate's sources,
        // so the Docker build context does not need it.
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/conformance/kv-indexer/hash-vectors.json"
        );
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        match serde_json::from_str(&text) {
            Ok(Value::Object(map)) => map,
            other => panic!("hash-vectors.json is not an object: {other:?}"),
        }
    }

    fn u64s(v: &Value) -> Vec<u64> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|x| x.as_u64().expect("u64"))
            .collect()
    }

    #[test]
    fn every_xxh3_vector_of_the_spec_matches() {
        let mut checked = 0;
        for (name, case) in vectors() {
            let seed = if name.starts_with("xxh3_seed0/") {
                0
            } else if name.starts_with("xxh3_seed1337/") {
                1337
            } else {
                continue;
            };
            let tokens: Vec<u32> = u64s(&case["tokens"])
                .into_iter()
                .map(|t| u32::try_from(t).expect("u32 token"))
                .collect();
            let bs = case["block_size"].as_u64().expect("block_size") as usize;
            let local: Vec<u64> = tokens
                .chunks_exact(bs)
                .map(|b| local_hash(b, seed))
                .collect();
            assert_eq!(local, u64s(&case["local"]), "{name}: local");
            assert_eq!(
                seq_hashes(&tokens, bs, seed),
                u64s(&case["seq"]),
                "{name}: seq"
            );
            let hex: Vec<String> = local.iter().map(|h| format!("{h:016x}")).collect();
            let want: Vec<String> = case["local_hex"]
                .as_array()
                .expect("local_hex")
                .iter()
                .map(|s| s.as_str().expect("str").to_owned())
                .collect();
            assert_eq!(hex, want, "{name}: local_hex");
            checked += 1;
        }
        assert_eq!(checked, 10, "the spec has 5 cases for each of 2 seeds");
    }

    #[test]
    fn chain_input_is_parent_le_then_local_le() {
        // Case A, seed 0: the spec's byte-level example.
        let seq0 = local_hash(&[1, 2, 3, 4], 0);
        let local1 = local_hash(&[5, 6, 7, 8], 0);
        let mut input = seq0.to_le_bytes().to_vec();
        input.extend_from_slice(&local1.to_le_bytes());
        let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "31ead6f4d4ebc16f2089039f11643fc0");
        assert_eq!(chain_hash(seq0, local1, 0), 4185132130981121146);
        assert_eq!(
            local_hash(&[1, 2, 3, 4], DEFAULT_SEED),
            14643705804678351452
        );
    }

    #[test]
    fn large_blocks_hash_like_small_ones() {
        let tokens: Vec<u32> = (0..1000).collect();
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(local_hash(&tokens, 7), xxh3_64_with_seed(&bytes, 7));
        assert!(seq_hashes(&tokens, 0, 7).is_empty());
        assert_eq!(seq_hashes(&tokens[..3], 4, 7).len(), 0);
    }

    /// Every block length, the exact-size ones (16 … 256) included, hashes its tokens'
    /// little-endian bytes.
    #[test]
    fn every_block_length_hashes_its_bytes() {
        let tokens: Vec<u32> = (0..300u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
        for n in 0..=tokens.len() {
            let bytes: Vec<u8> = tokens[..n].iter().flat_map(|t| t.to_le_bytes()).collect();
            for seed in [0, DEFAULT_SEED] {
                assert_eq!(
                    local_hash(&tokens[..n], seed),
                    xxh3_64_with_seed(&bytes, seed),
                    "{n} tokens"
                );
            }
        }
    }
}
