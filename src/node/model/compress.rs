//! The codecs of the controller's `compress` command: an object's body is kept compressed in
//! its tier and decompressed on every read, so a GET returns the bytes that were PUT.
//!
//! - `lz4`: LZ4 block compression (`lz4_flex`, pure Rust), the body length prepended. LZ4
//!   finds repeated runs of 4+ bytes: it shrinks objects with padding, zeros or repeats, not
//!   dense float16 KV (about 1.0×, docs/NODE.md), whose bytes rarely repeat.
//!
//! Pure; no I/O.

use bytes::Bytes;
use thiserror::Error;

/// How a stored body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub(crate) enum Codec {
    /// As PUT.
    #[default]
    Raw,
    /// LZ4 block, length prepended.
    Lz4,
}

/// A body that does not decode (never served).
#[derive(Debug, Error)]
#[error("compressed body does not decode: {0}")]
pub(crate) struct DecompressError(String);

impl DecompressError {
    /// A failure with this reason.
    pub(crate) fn new(why: String) -> Self {
        DecompressError(why)
    }
}

impl Codec {
    /// The codec a controller `method` names (`None` for an unknown method).
    pub(crate) fn from_method(method: &str) -> Option<Codec> {
        match method.to_ascii_lowercase().as_str() {
            "lz4" => Some(Codec::Lz4),
            _ => None,
        }
    }

    /// The methods the node accepts, for error messages.
    pub(crate) const METHODS: &'static str = "lz4";

    /// The id kept in an L2 file's header.
    pub(crate) fn id(self) -> u16 {
        match self {
            Codec::Raw => 0,
            Codec::Lz4 => 1,
        }
    }

    /// The codec of an L2 file's header id.
    pub(crate) fn from_id(id: u16) -> Option<Codec> {
        match id {
            0 => Some(Codec::Raw),
            1 => Some(Codec::Lz4),
            _ => None,
        }
    }

    /// Encodes a raw body.
    pub(crate) fn encode(self, raw: &[u8]) -> Bytes {
        match self {
            Codec::Raw => Bytes::copy_from_slice(raw),
            Codec::Lz4 => lz4_flex::compress_prepend_size(raw).into(),
        }
    }

    /// Decodes a body this codec encoded; at most `max_len` bytes come out.
    pub(crate) fn decode(self, stored: &Bytes, max_len: usize) -> Result<Bytes, DecompressError> {
        if self == Codec::Raw {
            return Ok(stored.clone());
        }
        let declared = stored
            .get(..4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or_else(|| DecompressError("shorter than its length prefix".into()))?;
        if declared > max_len {
            return Err(DecompressError(format!(
                "declares {declared} bytes, over the {max_len}-byte limit"
            )));
        }
        lz4_flex::decompress_size_prepended(stored)
            .map(Bytes::from)
            .map_err(|e| DecompressError(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// float16 values like a KV cache's: small magnitudes around zero.
    fn kv_like(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        let mut out = Vec::with_capacity(n * 2);
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // A normal sample (sum of uniforms), scale ~0.5: float16 bits by hand.
            let u: f32 = (0..4)
                .map(|i| ((x >> (i * 16)) & 0xffff) as f32 / 65536.0)
                .sum();
            let v = (u - 2.0) * 0.5;
            out.extend_from_slice(&f16_bits(v).to_le_bytes());
        }
        out
    }

    fn f16_bits(v: f32) -> u16 {
        let b = v.to_bits();
        let sign = ((b >> 16) & 0x8000) as u16;
        let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
        if exp <= 0 {
            return sign;
        }
        let mant = ((b >> 13) & 0x3ff) as u16;
        sign | ((exp as u16) << 10) | mant
    }

    #[test]
    fn every_codec_round_trips_exactly() {
        let mut bodies = vec![Vec::new(), vec![7u8], vec![1, 2, 3], kv_like(10_000, 9)];
        bodies.push((0..=255u8).cycle().take(70_001).collect());
        for codec in [Codec::Raw, Codec::Lz4] {
            for raw in &bodies {
                let enc = codec.encode(raw);
                let dec = codec.decode(&enc, raw.len()).expect("decodes");
                assert_eq!(&dec[..], &raw[..], "{codec:?} {}", raw.len());
            }
        }
    }

    /// The ratio and speed on KV-like float16 and on a zero-padded object, for docs/NODE.md:
    /// `cargo test --release --lib node::compress -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn measure_ratio_and_speed() {
        let mut padded = kv_like(1 << 19, 5);
        padded[1 << 19..].fill(0);
        for (name, raw) in [
            ("float16 KV", kv_like(1 << 20, 3)),
            ("half zero-padded", padded),
        ] {
            let t = std::time::Instant::now();
            let enc = Codec::Lz4.encode(&raw);
            let c = t.elapsed();
            let t = std::time::Instant::now();
            let dec = Codec::Lz4.decode(&enc, raw.len()).expect("decodes");
            let d = t.elapsed();
            assert_eq!(dec.len(), raw.len());
            let mb = raw.len() as f64 / 1e6;
            println!(
                "{name}: ratio {:.3}, compress {:.0} MB/s, decompress {:.0} MB/s",
                raw.len() as f64 / enc.len() as f64,
                mb / c.as_secs_f64(),
                mb / d.as_secs_f64()
            );
        }
    }

    #[test]
    fn repeats_compress() {
        let raw = vec![0u8; 100_000];
        assert!(Codec::Lz4.encode(&raw).len() < 1_000);
    }

    #[test]
    fn bad_bodies_are_refused_not_served() {
        let enc = Codec::Lz4.encode(&[5u8; 1000]);
        assert!(Codec::Lz4.decode(&enc, 999).is_err(), "over the limit");
        assert!(Codec::Lz4.decode(&Bytes::from_static(&[1, 0]), 10).is_err());
        let mut torn = enc.to_vec();
        torn.truncate(enc.len() - 3);
        assert!(Codec::Lz4.decode(&Bytes::from(torn), 1000).is_err());
        assert_eq!(Codec::from_method("LZ4"), Some(Codec::Lz4));
        assert_eq!(Codec::from_method("cachegen"), None);
        for c in [Codec::Raw, Codec::Lz4] {
            assert_eq!(Codec::from_id(c.id()), Some(c));
        }
        assert_eq!(Codec::from_id(9), None);
    }
}
