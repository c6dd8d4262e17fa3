//! Token ids carried by 0.5.6 store events (`entries[].token_ids`, `token_offset`): read off
//! the wire without failing a batch (a value outside `u32` drops that entry's tokens, as
//! 0.5.6 skips the binding with a warning), kept once per chunk hash in a [`Batch`]'s
//! `tokens` (the ranks and object groups of one chunk share its tokens), and cut along with
//! a batch's slices. The key directory ([`super::directory`]) keeps them. Pure.
//!
//! [`Batch`]: super::events::Batch

use super::events::{Entry, Op};
use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// The "unknown position" of a chunk (`token_offset` -1).
pub const UNKNOWN_OFFSET: i64 = -1;

/// Serde default of `token_offset`.
pub fn unknown_offset() -> i64 {
    UNKNOWN_OFFSET
}

/// `token_ids` as sent: `None` when a value is outside `u32` (the entry is kept, its tokens
/// are not).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WireTokens(pub Option<Vec<u32>>);

impl<'de> Deserialize<'de> for WireTokens {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Seq;
        struct Token(Option<u32>);
        impl<'de> Deserialize<'de> for Token {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Int;
                impl Visitor<'_> for Int {
                    type Value = Token;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("an integer token id")
                    }
                    fn visit_u64<E>(self, v: u64) -> Result<Token, E> {
                        Ok(Token(u32::try_from(v).ok()))
                    }
                    fn visit_i64<E>(self, v: i64) -> Result<Token, E> {
                        Ok(Token(u32::try_from(v).ok()))
                    }
                }
                d.deserialize_any(Int)
            }
        }
        impl<'de> Visitor<'de> for Seq {
            type Value = WireTokens;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of integer token ids")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<WireTokens, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                let mut ok = true;
                while let Some(Token(t)) = seq.next_element()? {
                    match t {
                        Some(t) if ok => out.push(t),
                        _ => ok = false,
                    }
                }
                Ok(WireTokens(ok.then_some(out)))
            }
        }
        d.deserialize_seq(Seq)
    }
}

/// One chunk's tokens, as a batch carries them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkTokens {
    /// The chunk hash, lowercase hex.
    pub chunk_hash_hex: String,
    /// Position of the chunk's first token in its sequence (-1: unknown).
    pub token_offset: i64,
    /// The token ids.
    pub token_ids: Vec<u32>,
}

/// The tokens of a store batch's entries, one per chunk hash (the last entry of a hash wins,
/// as 0.5.6 applies entries in order); entries without tokens carry none.
pub fn of_entries(entries: &[Entry]) -> Vec<ChunkTokens> {
    let mut out: Vec<ChunkTokens> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    for e in entries {
        let Some(ids) = &e.token_ids.0 else { continue };
        if ids.is_empty() {
            continue;
        }
        let hex = e.key.chunk_hash_hex.to_ascii_lowercase();
        let t = ChunkTokens {
            chunk_hash_hex: hex.clone(),
            token_offset: e.token_offset,
            token_ids: ids.clone(),
        };
        match at.get(&hex) {
            Some(&i) => out[i] = t,
            None => {
                at.insert(hex, out.len());
                out.push(t);
            }
        }
    }
    out
}

/// The part of `tokens` whose chunks `ops` store (for one slice of a batch).
pub fn for_ops(tokens: &[ChunkTokens], ops: &[Op]) -> Vec<ChunkTokens> {
    if tokens.is_empty() {
        return Vec::new();
    }
    let stored: HashSet<String> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Store(k, _) => Some(k.chunk_hash_hex.to_ascii_lowercase()),
            _ => None,
        })
        .collect();
    tokens
        .iter()
        .filter(|t| stored.contains(&t.chunk_hash_hex))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_tokens_drop_only_the_tokens() {
        let e: Entry = serde_json::from_str(
            r#"{"key":{"chunk_hash_hex":"AA","model_name":"m","kv_rank":0},"size_bytes":3,"token_ids":[1,4294967296],"token_offset":0}"#,
        )
        .unwrap();
        assert_eq!(e.token_ids, WireTokens(None));
        assert_eq!(e.size_bytes, 3);
        let e: Entry = serde_json::from_str(
            r#"{"key":{"chunk_hash_hex":"AA","model_name":"m","kv_rank":0},"token_ids":[1,-1]}"#,
        )
        .unwrap();
        assert_eq!(e.token_ids, WireTokens(None));
        assert_eq!(e.token_offset, UNKNOWN_OFFSET);
        assert!(serde_json::from_str::<Entry>(
            r#"{"key":{"chunk_hash_hex":"AA","model_name":"m","kv_rank":0},"token_ids":[1.5]}"#,
        )
        .is_err());
    }

    #[test]
    fn one_binding_per_chunk_and_slices_keep_theirs() {
        let entry = |hex: &str, rank: i64, first: u32| -> Entry {
            serde_json::from_value(serde_json::json!({
                "key": {"chunk_hash_hex": hex, "model_name": "m", "kv_rank": rank},
                "size_bytes": 1, "token_ids": [first, first + 1], "token_offset": 0}))
            .unwrap()
        };
        let t = of_entries(&[entry("AA", 0, 1), entry("aa", 1, 7), entry("bb", 0, 3)]);
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].chunk_hash_hex.as_str(), t[0].token_ids[0]), ("aa", 7));
        let e = entry("BB", 0, 3);
        let part = for_ops(&t, &[Op::Store(e.key.clone(), 1), Op::Delete(e.key)]);
        assert_eq!(part.len(), 1);
        assert_eq!(part[0].chunk_hash_hex, "bb");
    }
}
