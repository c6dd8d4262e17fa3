//! `ChunkHash`: a chunk hash as LMCache puts it on the wire.
//!
//! Python ints on the wire may be negative `i64` (CPython's builtin `hash`) or `u64` up to
//! 2^64-1 (digest-style hashes folded to 8 bytes). The union of both ranges does not fit in
//! 64 bits: `-16` and `2^64-16` share a bit pattern but are distinct Python ints. `ChunkHash`
//! keeps both exactly: the value plus the side of zero it came from.

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A chunk hash anywhere in `[-2^63, 2^64 - 1]`, round-tripping exactly.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChunkHash {
    /// A negative value (`-2^63 ..= -1`).
    Neg(i64),
    /// A non-negative value (`0 ..= 2^64 - 1`).
    Pos(u64),
}

impl ChunkHash {
    /// Builds a hash from a signed value (negative values stay negative).
    pub const fn from_i64(v: i64) -> Self {
        if v < 0 {
            ChunkHash::Neg(v)
        } else {
            ChunkHash::Pos(v as u64)
        }
    }

    /// Builds a hash from an unsigned value.
    pub const fn from_u64(v: u64) -> Self {
        ChunkHash::Pos(v)
    }

    /// The value as an `i128`, exact for every representable hash.
    pub const fn as_i128(self) -> i128 {
        match self {
            ChunkHash::Neg(v) => v as i128,
            ChunkHash::Pos(v) => v as i128,
        }
    }

    /// Builds a hash from an `i128`; `None` outside `[-2^63, 2^64 - 1]`.
    pub fn from_i128(v: i128) -> Option<Self> {
        if v < 0 {
            i64::try_from(v).ok().map(ChunkHash::Neg)
        } else {
            u64::try_from(v).ok().map(ChunkHash::Pos)
        }
    }

    /// The 64-bit pattern of the value and whether it is negative. The pair identifies the hash.
    pub const fn split(self) -> (bool, u64) {
        match self {
            ChunkHash::Neg(v) => (true, v as u64),
            ChunkHash::Pos(v) => (false, v),
        }
    }

    /// Inverse of [`ChunkHash::split`].
    pub const fn join(negative: bool, bits: u64) -> Self {
        if negative && (bits as i64) < 0 {
            ChunkHash::Neg(bits as i64)
        } else {
            ChunkHash::Pos(bits)
        }
    }
}

impl From<i64> for ChunkHash {
    fn from(v: i64) -> Self {
        ChunkHash::from_i64(v)
    }
}

impl From<u64> for ChunkHash {
    fn from(v: u64) -> Self {
        ChunkHash::from_u64(v)
    }
}

impl fmt::Debug for ChunkHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for ChunkHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChunkHash::Neg(v) => write!(f, "{v}"),
            ChunkHash::Pos(v) => write!(f, "{v}"),
        }
    }
}

impl Serialize for ChunkHash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match *self {
            ChunkHash::Neg(v) => s.serialize_i64(v),
            ChunkHash::Pos(v) => s.serialize_u64(v),
        }
    }
}

struct ChunkHashVisitor;

impl Visitor<'_> for ChunkHashVisitor {
    type Value = ChunkHash;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an integer in [-2^63, 2^64-1]")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<ChunkHash, E> {
        Ok(ChunkHash::from_i64(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<ChunkHash, E> {
        Ok(ChunkHash::from_u64(v))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<ChunkHash, E> {
        ChunkHash::from_i128(v).ok_or_else(|| E::custom("integer out of range [-2^63, 2^64-1]"))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<ChunkHash, E> {
        u64::try_from(v)
            .map(ChunkHash::Pos)
            .map_err(|_| E::custom("integer out of range [-2^63, 2^64-1]"))
    }
}

impl<'de> Deserialize<'de> for ChunkHash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ChunkHashVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_and_large_unsigned_with_same_bits_are_distinct() {
        let a = ChunkHash::from_i64(-16);
        let b = ChunkHash::from_u64(u64::MAX - 15);
        assert_eq!(a.split().1, b.split().1);
        assert_ne!(a, b);
        assert_eq!(ChunkHash::join(true, a.split().1), a);
        assert_eq!(ChunkHash::join(false, b.split().1), b);
    }

    #[test]
    fn i128_round_trip_at_the_edges() {
        for v in [
            i64::MIN as i128,
            -1,
            0,
            1,
            i64::MAX as i128,
            u64::MAX as i128,
        ] {
            assert_eq!(ChunkHash::from_i128(v).map(ChunkHash::as_i128), Some(v));
        }
        assert_eq!(ChunkHash::from_i128(u64::MAX as i128 + 1), None);
        assert_eq!(ChunkHash::from_i128(i64::MIN as i128 - 1), None);
    }
}
