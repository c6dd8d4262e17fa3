//! A chunk hash as LMCache 0.5.6 names chunks (up to 32 bytes, hex on the wire), held inline:
//! the key of the directory and of the CacheBlend index. Pure value type, no I/O.

/// A chunk hash, inline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Hash32 {
    bytes: [u8; 32],
    len: u8,
}

impl Hash32 {
    /// From hex (any case); `None` if not even-length hex of at most 32 bytes.
    pub(crate) fn parse(hex: &str) -> Option<Self> {
        let raw = hex.as_bytes();
        if !raw.len().is_multiple_of(2) || raw.len() > 64 {
            return None;
        }
        let mut h = Hash32 {
            bytes: [0; 32],
            len: u8::try_from(raw.len() / 2).ok()?,
        };
        for (i, pair) in raw.chunks_exact(2).enumerate() {
            let s = std::str::from_utf8(pair).ok()?;
            h.bytes[i] = u8::from_str_radix(s, 16).ok()?;
        }
        Some(h)
    }

    /// From raw bytes; `None` beyond 32.
    pub(super) fn from_bytes(b: &[u8]) -> Option<Self> {
        let mut h = Hash32 {
            bytes: [0; 32],
            len: u8::try_from(b.len()).ok().filter(|&l| l <= 32)?,
        };
        h.bytes[..b.len()].copy_from_slice(b);
        Some(h)
    }

    /// The bytes.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// Lowercase hex.
    pub(crate) fn hex(&self) -> String {
        self.as_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }
}
