//! A small, borrowing msgpack reader for KV-event payloads: bytes in, a [`Value`] tree out.
//!
//! It never panics and never allocates more than the input can justify: a length header is
//! checked against the bytes left before anything is reserved, nesting is capped at
//! [`MAX_DEPTH`], and trailing bytes are an error. Strings and binaries borrow from the input.
//! Everything above the msgpack grammar (what an event is) lives in `events.rs`.

/// Nesting deeper than this is rejected (KV events nest at most 5 deep).
pub(crate) const MAX_DEPTH: usize = 16;

/// One decoded msgpack value, borrowing strings and binaries from the frame.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value<'a> {
    Nil,
    Bool(bool),
    /// A non-negative integer.
    UInt(u64),
    /// A negative integer.
    NegInt(i64),
    Float(f64),
    /// A `str`; invalid UTF-8 is kept as [`Value::Bin`].
    Str(&'a str),
    Bin(&'a [u8]),
    Array(Vec<Value<'a>>),
    /// A non-empty array whose every element is a non-negative integer (token ids, block
    /// hashes): 8 bytes an element instead of a whole [`Value`] each.
    UInts(Vec<u64>),
    Map(Vec<(Value<'a>, Value<'a>)>),
    /// An extension value (type, data); no KV event uses one.
    Ext(i8, &'a [u8]),
}

impl<'a> Value<'a> {
    /// The string, if this is one.
    pub(crate) fn as_str(&self) -> Option<&'a str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value under `key` if this is a map with string keys.
    pub(crate) fn get(&self, key: &str) -> Option<&Value<'a>> {
        match self {
            Value::Map(entries) => entries
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Why bytes are not one msgpack value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MsgpackError {
    #[error("truncated msgpack")]
    Truncated,
    #[error("reserved msgpack byte 0xc1")]
    Reserved,
    #[error("msgpack nested deeper than {MAX_DEPTH}")]
    TooDeep,
    #[error("trailing bytes after the msgpack value")]
    Trailing,
}

/// Decodes exactly one value filling `bytes`.
pub(crate) fn decode(bytes: &[u8]) -> Result<Value<'_>, MsgpackError> {
    let mut r = Reader { buf: bytes, pos: 0 };
    let v = r.value(0)?;
    if r.pos != bytes.len() {
        return Err(MsgpackError::Trailing);
    }
    Ok(v)
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], MsgpackError> {
        let end = self.pos.checked_add(n).ok_or(MsgpackError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(MsgpackError::Truncated)?;
        self.pos = end;
        Ok(s)
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], MsgpackError> {
        let s = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn len8(&mut self) -> Result<usize, MsgpackError> {
        Ok(usize::from(self.be::<1>()?[0]))
    }
    fn len16(&mut self) -> Result<usize, MsgpackError> {
        Ok(usize::from(u16::from_be_bytes(self.be()?)))
    }
    fn len32(&mut self) -> Result<usize, MsgpackError> {
        usize::try_from(u32::from_be_bytes(self.be()?)).map_err(|_| MsgpackError::Truncated)
    }

    fn string(&mut self, n: usize) -> Result<Value<'a>, MsgpackError> {
        let s = self.take(n)?;
        Ok(match std::str::from_utf8(s) {
            Ok(s) => Value::Str(s),
            Err(_) => Value::Bin(s),
        })
    }

    fn array(&mut self, n: usize, depth: usize) -> Result<Value<'a>, MsgpackError> {
        if depth >= MAX_DEPTH {
            return Err(MsgpackError::TooDeep);
        }
        // Every element takes at least one byte: a claim beyond that is a lie.
        if n > self.buf.len() - self.pos {
            return Err(MsgpackError::Truncated);
        }
        if let Some(ints) = self.uints(n) {
            return Ok(Value::UInts(ints));
        }
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            items.push(self.value(depth + 1)?);
        }
        Ok(Value::Array(items))
    }

    /// `n ≥ 1` non-negative integers in a row, or `None` (nothing consumed) when one of the
    /// next `n` values is anything else or the input ends first.
    fn uints(&mut self, n: usize) -> Option<Vec<u64>> {
        if n == 0 {
            return None;
        }
        let start = self.pos;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let v = match self.be::<1>().ok()?[0] {
                b @ 0x00..=0x7f => Some(u64::from(b)),
                0xcc => self.be::<1>().ok().map(|b| u64::from(b[0])),
                0xcd => self.be().ok().map(|b| u64::from(u16::from_be_bytes(b))),
                0xce => self.be().ok().map(|b| u64::from(u32::from_be_bytes(b))),
                0xcf => self.be().ok().map(u64::from_be_bytes),
                // Signed encodings of non-negative values (msgpack's `int` family).
                0xd0 => self
                    .be::<1>()
                    .ok()
                    .and_then(|b| u64::try_from(b[0] as i8).ok()),
                0xd1 => self
                    .be()
                    .ok()
                    .and_then(|b| u64::try_from(i16::from_be_bytes(b)).ok()),
                0xd2 => self
                    .be()
                    .ok()
                    .and_then(|b| u64::try_from(i32::from_be_bytes(b)).ok()),
                0xd3 => self
                    .be()
                    .ok()
                    .and_then(|b| u64::try_from(i64::from_be_bytes(b)).ok()),
                _ => None,
            };
            match v {
                Some(v) => out.push(v),
                None => {
                    self.pos = start;
                    return None;
                }
            }
        }
        Some(out)
    }

    fn map(&mut self, n: usize, depth: usize) -> Result<Value<'a>, MsgpackError> {
        if depth >= MAX_DEPTH {
            return Err(MsgpackError::TooDeep);
        }
        if n.saturating_mul(2) > self.buf.len() - self.pos {
            return Err(MsgpackError::Truncated);
        }
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let k = self.value(depth + 1)?;
            let v = self.value(depth + 1)?;
            entries.push((k, v));
        }
        Ok(Value::Map(entries))
    }

    fn ext(&mut self, n: usize) -> Result<Value<'a>, MsgpackError> {
        let t = self.be::<1>()?[0] as i8;
        Ok(Value::Ext(t, self.take(n)?))
    }

    fn value(&mut self, depth: usize) -> Result<Value<'a>, MsgpackError> {
        let b = self.be::<1>()?[0];
        Ok(match b {
            0x00..=0x7f => Value::UInt(u64::from(b)),
            0x80..=0x8f => return self.map(usize::from(b & 0x0f), depth),
            0x90..=0x9f => return self.array(usize::from(b & 0x0f), depth),
            0xa0..=0xbf => return self.string(usize::from(b & 0x1f)),
            0xc0 => Value::Nil,
            0xc1 => return Err(MsgpackError::Reserved),
            0xc2 => Value::Bool(false),
            0xc3 => Value::Bool(true),
            0xc4 => {
                let n = self.len8()?;
                Value::Bin(self.take(n)?)
            }
            0xc5 => {
                let n = self.len16()?;
                Value::Bin(self.take(n)?)
            }
            0xc6 => {
                let n = self.len32()?;
                Value::Bin(self.take(n)?)
            }
            0xc7 => {
                let n = self.len8()?;
                return self.ext(n);
            }
            0xc8 => {
                let n = self.len16()?;
                return self.ext(n);
            }
            0xc9 => {
                let n = self.len32()?;
                return self.ext(n);
            }
            0xca => Value::Float(f64::from(f32::from_be_bytes(self.be()?))),
            0xcb => Value::Float(f64::from_be_bytes(self.be()?)),
            0xcc => Value::UInt(u64::from(self.be::<1>()?[0])),
            0xcd => Value::UInt(u64::from(u16::from_be_bytes(self.be()?))),
            0xce => Value::UInt(u64::from(u32::from_be_bytes(self.be()?))),
            0xcf => Value::UInt(u64::from_be_bytes(self.be()?)),
            0xd0 => int(i64::from(self.be::<1>()?[0] as i8)),
            0xd1 => int(i64::from(i16::from_be_bytes(self.be()?))),
            0xd2 => int(i64::from(i32::from_be_bytes(self.be()?))),
            0xd3 => int(i64::from_be_bytes(self.be()?)),
            0xd4 => return self.ext(1),
            0xd5 => return self.ext(2),
            0xd6 => return self.ext(4),
            0xd7 => return self.ext(8),
            0xd8 => return self.ext(16),
            0xd9 => {
                let n = self.len8()?;
                return self.string(n);
            }
            0xda => {
                let n = self.len16()?;
                return self.string(n);
            }
            0xdb => {
                let n = self.len32()?;
                return self.string(n);
            }
            0xdc => {
                let n = self.len16()?;
                return self.array(n, depth);
            }
            0xdd => {
                let n = self.len32()?;
                return self.array(n, depth);
            }
            0xde => {
                let n = self.len16()?;
                return self.map(n, depth);
            }
            0xdf => {
                let n = self.len32()?;
                return self.map(n, depth);
            }
            0xe0..=0xff => Value::NegInt(i64::from(b as i8)),
        })
    }
}

/// A signed integer as msgpack means it: non-negative ones are [`Value::UInt`].
fn int(i: i64) -> Value<'static> {
    match u64::try_from(i) {
        Ok(u) => Value::UInt(u),
        Err(_) => Value::NegInt(i),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_scalar_and_container_forms() {
        assert_eq!(decode(&[0x05]), Ok(Value::UInt(5)));
        assert_eq!(decode(&[0xff]), Ok(Value::NegInt(-1)));
        assert_eq!(decode(&[0xd0, 0x05]), Ok(Value::UInt(5)));
        assert_eq!(decode(&[0xa2, b'h', b'i']), Ok(Value::Str("hi")));
        assert_eq!(
            decode(&[0xde, 0x00, 0x01, 0xa1, b'a', 0xc0]),
            Ok(Value::Map(vec![(Value::Str("a"), Value::Nil)]))
        );
        assert_eq!(
            decode(&[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
            Ok(Value::UInt(u64::MAX))
        );
    }

    #[test]
    fn arrays_of_non_negative_integers_decode_flat() {
        // fixint, uint8, uint16, uint32, uint64 and a non-negative int8.
        let bytes = [
            0x96, 0x05, 0xcc, 0xc8, 0xcd, 0x01, 0x00, 0xce, 0x00, 0x01, 0x00, 0x00, 0xcf, 0, 0, 0,
            1, 0, 0, 0, 0, 0xd0, 0x07,
        ];
        assert_eq!(
            decode(&bytes),
            Ok(Value::UInts(vec![5, 200, 256, 65_536, 1 << 32, 7]))
        );
        // One element of another kind keeps the general form, nothing lost.
        assert_eq!(
            decode(&[0x93, 0x01, 0xff, 0x02]),
            Ok(Value::Array(vec![
                Value::UInt(1),
                Value::NegInt(-1),
                Value::UInt(2)
            ]))
        );
        assert_eq!(decode(&[0x90]), Ok(Value::Array(Vec::new())));
        // Truncated inside the run: the same error as the general form.
        assert_eq!(
            decode(&[0x92, 0x01, 0xcd, 0x01]),
            Err(MsgpackError::Truncated)
        );
    }

    #[test]
    fn rejects_lies_depth_and_trailing_bytes() {
        assert_eq!(decode(&[]), Err(MsgpackError::Truncated));
        assert_eq!(
            decode(&[0xdd, 0xff, 0xff, 0xff, 0xff]),
            Err(MsgpackError::Truncated)
        );
        assert_eq!(decode(&[0xc1]), Err(MsgpackError::Reserved));
        assert_eq!(decode(&[0x01, 0x02]), Err(MsgpackError::Trailing));
        let deep = vec![0x91; 100];
        assert_eq!(decode(&deep), Err(MsgpackError::TooDeep));
    }

    #[test]
    fn never_panics_on_any_prefix_or_byte_flip() {
        let sample: &[u8] = &[
            0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x91, 0x92, 0xa1, b'x', 0xc4, 0x02, 1, 2,
            0x00,
        ];
        for n in 0..=sample.len() {
            let _ = decode(&sample[..n]);
        }
        for i in 0..sample.len() {
            for b in [0x00, 0x7f, 0x90, 0xc4, 0xdc, 0xdf, 0xff] {
                let mut s = sample.to_vec();
                s[i] = b;
                let _ = decode(&s);
            }
        }
    }
}
