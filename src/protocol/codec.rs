//! Encoding and tolerant decoding of frames.
//!
//! Encoding writes exactly what msgspec writes for LMCache's `tag=True` structs: a map with
//! `"type"` first, then every field in declaration order, integers in their smallest form,
//! floats as float64. Decoding accepts any key order, ignores unknown keys, and takes a frame
//! whose first non-blank byte is `{` as JSON (LMCache's Mooncake path).
//!
//! Decoding never panics: a msgpack frame is first walked once without allocation
//! ([`peek_tag`]) to check its structure, find its `"type"` and reject trailing bytes; only
//! then is the body decoded straight into the concrete struct for that tag.

use super::messages::{decode_tagged, BodyDecoder, Msg};
use thiserror::Error;

/// Nesting deeper than this is rejected before any decoding (LMCache messages nest ≤ 4).
const MAX_DEPTH: usize = 32;

/// Why a frame could not be decoded. [`DecodeError::reason`] gives a stable metric label.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The frame has no bytes.
    #[error("empty frame")]
    Empty,
    /// The bytes are not a well-formed msgpack value.
    #[error("malformed msgpack: {0}")]
    Malformed(&'static str),
    /// The frame is valid msgpack or JSON but not a map.
    #[error("message is not a map")]
    NotAMap,
    /// The frame is not valid JSON.
    #[error("malformed JSON: {0}")]
    Json(String),
    /// The map has no string `"type"` key.
    #[error("message has no \"type\" tag")]
    MissingTag,
    /// The tag names no message of the LMCache 0.5.6 union.
    #[error("unknown message type {0:?}")]
    UnknownTag(String),
    /// The tag is known but a field is missing or has the wrong type.
    #[error("invalid {tag}: {detail}")]
    Field {
        /// The message type.
        tag: &'static str,
        /// What was wrong, naming the field where the decoder knows it.
        detail: String,
    },
}

impl DecodeError {
    /// A short, stable label for metrics (`frames dropped by reason`).
    pub fn reason(&self) -> &'static str {
        match self {
            DecodeError::Empty => "empty",
            DecodeError::Malformed(_) | DecodeError::Json(_) | DecodeError::NotAMap => "malformed",
            DecodeError::MissingTag => "missing_tag",
            DecodeError::UnknownTag(_) => "unknown_tag",
            DecodeError::Field { .. } => "bad_field",
        }
    }
}

/// Decodes one frame (msgpack, or JSON when it starts with `{`).
///
/// # Errors
/// Any [`DecodeError`]; the caller counts and drops the frame.
pub fn decode(frame: &[u8]) -> Result<Msg, DecodeError> {
    let start = frame.iter().position(|b| !b.is_ascii_whitespace());
    match start.map(|i| frame[i]) {
        None if frame.is_empty() => Err(DecodeError::Empty),
        Some(b'{') => decode_json(frame),
        _ => decode_msgpack(frame),
    }
}

/// Encodes a message as msgspec would (map form, `"type"` first, declaration order).
pub fn encode(msg: &Msg) -> Vec<u8> {
    // Writing into a Vec cannot fail, and every field type of `Msg` has a msgpack form
    // (maps have string or integer keys), so serialisation has no error path in practice.
    // Sized for the common small replies, so that writing them does not grow the buffer
    // several times over.
    let mut buf = Vec::with_capacity(ENCODE_CAPACITY);
    match rmp_serde::encode::write_named(&mut buf, msg) {
        Ok(()) => buf,
        Err(e) => {
            let fallback = Msg::ErrorMsg(super::ErrorMsg {
                error: format!("kvplane could not encode {}: {e}", msg.tag()),
            });
            rmp_serde::to_vec_named(&fallback).unwrap_or_default()
        }
    }
}

/// Initial buffer of [`encode`]: a P2P lookup or heartbeat reply fits.
const ENCODE_CAPACITY: usize = 256;

/// Encodes a message as JSON (the same map; for logs, tests and the JSON frame path).
pub fn encode_json(msg: &Msg) -> String {
    serde_json::to_string(msg).unwrap_or_default()
}

fn decode_msgpack(frame: &[u8]) -> Result<Msg, DecodeError> {
    let tag = peek_tag(frame)?;
    decode_tagged(tag, Msgpack(frame)).ok_or_else(|| DecodeError::UnknownTag(tag.to_owned()))?
}

fn decode_json(frame: &[u8]) -> Result<Msg, DecodeError> {
    let value: serde_json::Value =
        serde_json::from_slice(frame).map_err(|e| DecodeError::Json(e.to_string()))?;
    let tag = match value.as_object() {
        None => return Err(DecodeError::NotAMap),
        Some(map) => match map.get("type").and_then(|t| t.as_str()) {
            Some(tag) => tag.to_owned(),
            None => return Err(DecodeError::MissingTag),
        },
    };
    decode_tagged(&tag, Json(value)).ok_or(DecodeError::UnknownTag(tag))?
}

struct Msgpack<'a>(&'a [u8]);

impl BodyDecoder for Msgpack<'_> {
    type Error = DecodeError;
    fn decode<T: serde::de::DeserializeOwned>(self) -> Result<T, DecodeError> {
        rmp_serde::from_slice(self.0).map_err(|e| field_error::<T>(e.to_string()))
    }
}

struct Json(serde_json::Value);

impl BodyDecoder for Json {
    type Error = DecodeError;
    fn decode<T: serde::de::DeserializeOwned>(self) -> Result<T, DecodeError> {
        serde_json::from_value(self.0).map_err(|e| field_error::<T>(e.to_string()))
    }
}

fn field_error<T>(detail: String) -> DecodeError {
    let full = std::any::type_name::<T>();
    let tag = full.rsplit("::").next().unwrap_or(full);
    // `type_name` is 'static; keep only the struct name for the message.
    let tag: &'static str = super::messages::TAGS
        .iter()
        .find(|t| **t == tag)
        .copied()
        .unwrap_or("message");
    DecodeError::Field { tag, detail }
}

/// Walks a msgpack frame once, without allocating: checks that it is exactly one well-formed
/// map (no trailing bytes, nesting ≤ 32) and returns its `"type"` string.
///
/// # Errors
/// [`DecodeError::Malformed`], [`DecodeError::NotAMap`] or [`DecodeError::MissingTag`].
pub fn peek_tag(frame: &[u8]) -> Result<&str, DecodeError> {
    let mut cur = Cursor { buf: frame, pos: 0 };
    if frame.is_empty() {
        return Err(DecodeError::Empty);
    }
    let entries = match cur.header()? {
        Header::Map(n) => n,
        _ => return Err(DecodeError::NotAMap),
    };
    let mut tag = None;
    for _ in 0..entries {
        let key = match cur.header()? {
            Header::Str(len) => Some(cur.take(len)?),
            other => {
                cur.skip_body(other, 1)?;
                None
            }
        };
        if key == Some(b"type".as_slice()) {
            match cur.header()? {
                Header::Str(len) => {
                    let bytes = cur.take(len)?;
                    tag = Some(std::str::from_utf8(bytes).map_err(|_| DecodeError::MissingTag)?);
                }
                _ => return Err(DecodeError::MissingTag),
            }
        } else {
            cur.skip_value(1)?;
        }
    }
    if cur.pos != frame.len() {
        return Err(DecodeError::Malformed("trailing bytes after the message"));
    }
    tag.ok_or(DecodeError::MissingTag)
}

/// What a msgpack marker announces.
#[derive(Clone, Copy)]
enum Header {
    /// A scalar whose payload is this many bytes.
    Scalar(usize),
    Str(usize),
    Bin(usize),
    /// Extension: payload bytes (the type byte is already consumed).
    Ext(usize),
    Array(usize),
    Map(usize),
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.remaining() {
            return Err(DecodeError::Malformed("truncated"));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn uint(&mut self, n: usize) -> Result<usize, DecodeError> {
        let bytes = self.take(n)?;
        let v = bytes.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
        usize::try_from(v).map_err(|_| DecodeError::Malformed("length overflow"))
    }

    fn header(&mut self) -> Result<Header, DecodeError> {
        let marker = *self
            .take(1)?
            .first()
            .ok_or(DecodeError::Malformed("truncated"))?;
        Ok(match marker {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => Header::Scalar(0),
            0x80..=0x8f => Header::Map(usize::from(marker & 0x0f)),
            0x90..=0x9f => Header::Array(usize::from(marker & 0x0f)),
            0xa0..=0xbf => Header::Str(usize::from(marker & 0x1f)),
            0xc1 => return Err(DecodeError::Malformed("reserved marker 0xc1")),
            0xc4 => Header::Bin(self.uint(1)?),
            0xc5 => Header::Bin(self.uint(2)?),
            0xc6 => Header::Bin(self.uint(4)?),
            0xc7..=0xc9 => {
                let len = self.uint(1 << (marker - 0xc7))?;
                self.take(1)?;
                Header::Ext(len)
            }
            0xca => Header::Scalar(4),
            0xcb => Header::Scalar(8),
            0xcc..=0xcf => Header::Scalar(1 << (marker - 0xcc)),
            0xd0..=0xd3 => Header::Scalar(1 << (marker - 0xd0)),
            0xd4..=0xd8 => {
                self.take(1)?;
                Header::Ext(1 << (marker - 0xd4))
            }
            0xd9 => Header::Str(self.uint(1)?),
            0xda => Header::Str(self.uint(2)?),
            0xdb => Header::Str(self.uint(4)?),
            0xdc => Header::Array(self.uint(2)?),
            0xdd => Header::Array(self.uint(4)?),
            0xde => Header::Map(self.uint(2)?),
            0xdf => Header::Map(self.uint(4)?),
        })
    }

    fn skip_value(&mut self, depth: usize) -> Result<(), DecodeError> {
        let h = self.header()?;
        self.skip_body(h, depth)
    }

    fn skip_body(&mut self, h: Header, depth: usize) -> Result<(), DecodeError> {
        match h {
            Header::Scalar(n) | Header::Str(n) | Header::Bin(n) | Header::Ext(n) => {
                self.take(n).map(|_| ())
            }
            Header::Array(n) | Header::Map(n) => {
                if depth >= MAX_DEPTH {
                    return Err(DecodeError::Malformed("nesting too deep"));
                }
                let items = if matches!(h, Header::Map(_)) {
                    n.saturating_mul(2)
                } else {
                    n
                };
                // Every item takes at least one byte: refuse impossible counts up front.
                if items > self.remaining() {
                    return Err(DecodeError::Malformed("truncated"));
                }
                (0..items).try_for_each(|_| self.skip_value(depth + 1))
            }
        }
    }
}
