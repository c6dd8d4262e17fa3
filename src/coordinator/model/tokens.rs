//! Token ids carried by 0.5.6 store events (`entries[].token_ids`, `token_offset`): read off
//! the wire without failing a batch (a value outside `u32` drops that entry's tokens, as
//! 0.5.6 skips the binding with a warning), kept once per chunk hash in a [`Batch`]'s
//! `tokens` (the ranks and object groups of one chunk share its tokens), and cut along with
//! a batch's slices. The key directory (`super::directory`) keeps them. Pure.
//!
//! [`Batch`]: super::events::Batch

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

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
                    // A whole number JSON writes as a float (`7.0`, or an integer beyond
                    // 64 bits): an integer to the document, outside u32 unless it fits.
                    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Token, E> {
                        if v.fract() != 0.0 || !v.is_finite() {
                            return Err(E::invalid_type(serde::de::Unexpected::Float(v), &self));
                        }
                        let fits = (0.0..=f64::from(u32::MAX)).contains(&v);
                        Ok(Token(fits.then_some(v as u32)))
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
