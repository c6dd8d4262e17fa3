//! The chunk hashes an LMCache worker computes with `pre_caching_hash_algorithm = "builtin"`:
//! CPython's builtin `hash` of `(prefix_hash, tuple(chunk_tokens), ())`, chained from
//! `NONE_HASH` over chunks of `chunk_size` tokens, the last chunk possibly partial
//! (`lmcache/v1/token_database.py`, `ChunkedTokenDatabase`; spec §3.7).
//!
//! For int tuples the builtin hash does not depend on `PYTHONHASHSEED`, so it can be computed
//! here exactly: [`int_hash`] is CPython's `long_hash` (`Objects/longobject.c`) and
//! [`tuple_hash`] its xxHash-based `tuplehash` (`Objects/tupleobject.c`, CPython ≥ 3.8, 64-bit
//! build). Pure functions; no I/O.

use crate::protocol::ChunkHash;

/// CPython's `_PyHASH_MODULUS` on 64-bit builds: the Mersenne prime 2^61 − 1.
pub const PY_HASH_MODULUS: u64 = (1 << 61) - 1;

const XXPRIME_1: u64 = 11_400_714_785_074_694_791;
const XXPRIME_2: u64 = 14_029_467_366_897_019_727;
const XXPRIME_5: u64 = 2_870_177_450_012_600_261;

/// `hash(v)` for a Python int `v`: `sign(v) · (|v| mod (2^61 − 1))`, with −1 replaced by −2
/// (−1 is CPython's error value).
pub fn int_hash(v: i128) -> i64 {
    let modulus = u128::from(PY_HASH_MODULUS);
    // `|v| mod P` < 2^61, so it fits an i64 with either sign.
    let magnitude = (v.unsigned_abs() % modulus) as i64;
    let h = if v < 0 { -magnitude } else { magnitude };
    if h == -1 {
        -2
    } else {
        h
    }
}

/// `hash(t)` for a tuple whose items hash to `item_hashes` (in order).
pub fn tuple_hash<I>(item_hashes: I) -> i64
where
    I: IntoIterator<Item = i64>,
{
    let mut acc = XXPRIME_5;
    let mut len: u64 = 0;
    for lane in item_hashes {
        // Py_uhash_t arithmetic: the signed hash reinterpreted as unsigned.
        acc = acc.wrapping_add((lane as u64).wrapping_mul(XXPRIME_2));
        acc = acc.rotate_left(31);
        acc = acc.wrapping_mul(XXPRIME_1);
        len += 1;
    }
    // "Add input length, mangled to keep the historical value of hash(())."
    acc = acc.wrapping_add(len ^ (XXPRIME_5 ^ 3_527_539));
    if acc == u64::MAX {
        1_546_275_796
    } else {
        acc as i64
    }
}

/// `hash(())`.
fn empty_tuple_hash() -> i64 {
    tuple_hash(std::iter::empty())
}

/// The hash of one chunk: `hash((prefix, tuple(tokens), ()))`.
pub fn chunk_hash(prefix: i128, tokens: &[i64]) -> i64 {
    let tokens_hash = tuple_hash(tokens.iter().map(|&t| int_hash(i128::from(t))));
    tuple_hash([int_hash(prefix), tokens_hash, empty_tuple_hash()])
}

/// One chunk of a token sequence, as `ChunkedTokenDatabase.process_tokens` yields it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Index of the chunk's first token.
    pub start: usize,
    /// One past its last token.
    pub end: usize,
    /// Its prefix hash.
    pub hash: ChunkHash,
}

/// The prefix-chained chunk hashes of `tokens` (`chunk_size` ≥ 1; the last chunk may be
/// shorter), starting from `none_hash`.
pub fn chunk_hashes(tokens: &[i64], chunk_size: usize, none_hash: ChunkHash) -> Vec<Chunk> {
    let chunk_size = chunk_size.max(1);
    let mut prefix = none_hash.as_i128();
    tokens
        .chunks(chunk_size)
        .enumerate()
        .map(|(i, chunk)| {
            let h = chunk_hash(prefix, chunk);
            prefix = i128::from(h);
            let start = i * chunk_size;
            Chunk {
                start,
                end: start + chunk.len(),
                hash: ChunkHash::from_i64(h),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn vectors() -> Vec<Value> {
        let text = crate::protocol::tests::conformance_file("lookup_token_hashes.jsonl");
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).expect("vector is JSON"))
            .collect()
    }

    #[test]
    fn every_conformance_vector_matches() {
        let vectors = vectors();
        assert!(
            vectors.len() >= 7,
            "expected the 7 vectors, got {}",
            vectors.len()
        );
        for v in vectors {
            let name = v["name"].as_str().expect("name");
            assert_eq!(v["hash"], "python-builtin", "{name}");
            let chunk_size = v["chunk_size"].as_u64().expect("chunk_size") as usize;
            let none_hash: ChunkHash =
                serde_json::from_value(v["none_hash"].clone()).expect("none_hash");
            let tokens: Vec<i64> = serde_json::from_value(v["tokens"].clone()).expect("tokens");
            let got = chunk_hashes(&tokens, chunk_size, none_hash);
            let want: Vec<Chunk> = v["chunks"]
                .as_array()
                .expect("chunks")
                .iter()
                .map(|c| Chunk {
                    start: c["start"].as_u64().expect("start") as usize,
                    end: c["end"].as_u64().expect("end") as usize,
                    hash: serde_json::from_value(c["chunk_hash"].clone()).expect("hash"),
                })
                .collect();
            assert_eq!(got, want, "vector {name}");
        }
    }

    /// Values printed by CPython 3.11 (`python3 -c 'print(hash(...))'`).
    #[test]
    fn cpython_int_and_tuple_hashes() {
        assert_eq!(int_hash(-1), -2);
        assert_eq!(int_hash(0), 0);
        assert_eq!(int_hash(i128::from(PY_HASH_MODULUS)), 0);
        assert_eq!(int_hash(i128::from(u64::MAX)), 7);
        assert_eq!(int_hash(-(1 << 62)), -2);
        assert_eq!(int_hash(-(1 << 62) - 1), -3);
        assert_eq!(int_hash(i128::from(i64::MIN)), -4);
        assert_eq!(empty_tuple_hash(), 5_740_354_900_026_072_187);
        assert_eq!(
            tuple_hash([int_hash(1), int_hash(2)]),
            -3_550_055_125_485_641_917
        );
        assert_eq!(tuple_hash([int_hash(-1)]), 8_078_679_518_589_016_365);
        assert_eq!(tuple_hash([int_hash(-2)]), 8_078_679_518_589_016_365);
    }

    /// Other chunk sizes and `NONE_HASH` values (vLLM folds its digest into a u64), checked
    /// against CPython 3.11 with the same chaining as `ChunkedTokenDatabase`.
    #[test]
    fn chunk_size_and_none_hash_flags() {
        let hashes = |tokens: &[i64], cs, nh| {
            chunk_hashes(tokens, cs, nh)
                .into_iter()
                .map(|c| c.hash)
                .collect::<Vec<_>>()
        };
        let ids = |v: &[i64]| {
            v.iter()
                .map(|&h| ChunkHash::from_i64(h))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            hashes(
                &[5, -7, 1 << 40, 9, 1, 2, 3, 4, 5, 6],
                4,
                ChunkHash::from_u64(u64::MAX - 4)
            ),
            ids(&[
                -5_843_446_676_173_179_213,
                3_103_139_294_156_893_578,
                -1_245_491_098_781_978_578
            ])
        );
        assert_eq!(
            hashes(&[0, 1, 2], 2, ChunkHash::from_i64(i64::MIN)),
            ids(&[7_862_291_594_611_447_200, -7_666_373_384_711_926_768])
        );
        let chunks = chunk_hashes(&[1, 2, 3], 2, ChunkHash::from_i64(0));
        assert_eq!(
            chunks.iter().map(|c| (c.start, c.end)).collect::<Vec<_>>(),
            [(0, 2), (2, 3)]
        );
        assert!(chunk_hashes(&[], 256, ChunkHash::from_i64(0)).is_empty());
    }
}
