//! The LMCache 0.5.6 server wire format (`lm://host:port`): the 186-byte request header
//! (`struct` format `iiiiiiiii150s`) and the 36-byte reply header (`iiiiiiiii`, `location`
//! last). Pure: bytes in, typed values or a typed error out; no sockets, no store.
//!
//! Decoding is split in two: [`request_complete`] says whether a whole header is buffered,
//! then [`parse_request`] turns exactly [`REQUEST_HEADER_LEN`] bytes into an [`LmRequest`] or a
//! [`CodecError`] whose [`CodecError::reason`] is a stable metric label.

use thiserror::Error;

/// Bytes in a request header: 9 × `int32` + a 150-byte key.
pub const REQUEST_HEADER_LEN: usize = 186;
/// Bytes in a reply header: 9 × `int32`.
pub const REPLY_HEADER_LEN: usize = 36;
/// Bytes of the key field (LMCache's `MAX_KEY_LENGTH`).
pub const MAX_KEY_LEN: usize = 150;
/// `ServerReturnCode.SUCCESS`.
pub const CODE_SUCCESS: i32 = 200;
/// `ServerReturnCode.FAIL`.
pub const CODE_FAIL: i32 = 400;

/// A client command (`ClientCommand`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LmCommand {
    /// Store the body under the key; no reply.
    Put,
    /// Fetch the object stored under the key.
    Get,
    /// Is the key stored?
    Exist,
    /// Every stored key, newline-joined.
    List,
    /// Is the server alive?
    Health,
}

impl LmCommand {
    /// The wire value (1..=5).
    #[must_use]
    pub fn code(self) -> i32 {
        match self {
            LmCommand::Put => 1,
            LmCommand::Get => 2,
            LmCommand::Exist => 3,
            LmCommand::List => 4,
            LmCommand::Health => 5,
        }
    }

    /// A lower-case label for metrics and logs.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            LmCommand::Put => "put",
            LmCommand::Get => "get",
            LmCommand::Exist => "exist",
            LmCommand::List => "list",
            LmCommand::Health => "health",
        }
    }

    fn from_code(code: i32) -> Option<Self> {
        Some(match code {
            1 => LmCommand::Put,
            2 => LmCommand::Get,
            3 => LmCommand::Exist,
            4 => LmCommand::List,
            5 => LmCommand::Health,
            _ => return None,
        })
    }
}

/// The fields the server stores with an object and returns unchanged on GET: memory format,
/// dtype, location and the shape padded to 4 dims. Opaque to the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ObjectMeta {
    /// `MemoryFormat` value.
    pub fmt: i32,
    /// dtype code (0 none, 1 half, 2 float16, …).
    pub dtype: i32,
    /// location code (0 none, 1 LocalCPUBackend, 2 LocalDiskBackend).
    pub location: i32,
    /// Shape padded with trailing zeros to 4 dims.
    pub shape: [i32; 4],
}

impl ObjectMeta {
    /// Tokens the object holds, read from its shape as LMCache 0.5.6's
    /// `MemoryFormat.token_dim()` does: dim 2 for `KV_2LTD` (1) and `KV_MLA_FMT` (6), dim 1 for
    /// `KV_T2D` (2), dim 0 for every other format. A negative size counts as 0.
    pub fn num_tokens(&self) -> u32 {
        let dim = match self.fmt {
            1 | 6 => 2,
            2 => 1,
            _ => 0,
        };
        u32::try_from(self.shape[dim]).unwrap_or(0)
    }
}

/// A parsed request header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LmRequest {
    /// The command.
    pub command: LmCommand,
    /// Body bytes that follow (PUT only; 0 for every other command).
    pub length: usize,
    /// Stored and returned unchanged.
    pub meta: ObjectMeta,
    /// The key, with LMCache's space padding stripped.
    pub key: String,
}

/// A reply header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LmReply {
    /// [`CODE_SUCCESS`] or [`CODE_FAIL`].
    pub code: i32,
    /// Body bytes that follow.
    pub length: usize,
    /// The stored object's fields (zeros when there is none).
    pub meta: ObjectMeta,
}

impl LmReply {
    /// SUCCESS with no body and zero fields (EXIST hit, HEALTH).
    #[must_use]
    pub fn success() -> Self {
        LmReply {
            code: CODE_SUCCESS,
            length: 0,
            meta: ObjectMeta::default(),
        }
    }

    /// FAIL with zero fields (miss, bad request).
    #[must_use]
    pub fn fail() -> Self {
        LmReply {
            code: CODE_FAIL,
            length: 0,
            meta: ObjectMeta::default(),
        }
    }
}

/// Why a header (or a value to encode) is refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CodecError {
    /// `command` is not 1..=5.
    #[error("unknown command {0}")]
    UnknownCommand(i32),
    /// `length` is negative.
    #[error("negative length {0}")]
    NegativeLength(i32),
    /// A PUT body larger than the configured limit.
    #[error("length {length} exceeds the limit of {max} bytes")]
    TooLarge {
        /// The announced length.
        length: usize,
        /// The limit.
        max: usize,
    },
    /// A command other than PUT announced a body.
    #[error("{command:?} carries a body of {length} bytes; only PUT may")]
    UnexpectedBody {
        /// The command.
        command: LmCommand,
        /// The announced length.
        length: usize,
    },
    /// The key is not UTF-8.
    #[error("key is not valid UTF-8")]
    BadUtf8,
    /// The key is empty once padding is stripped.
    #[error("key is empty")]
    EmptyKey,
    /// A key longer than 150 bytes cannot be encoded.
    #[error("key of {0} bytes exceeds {MAX_KEY_LEN}")]
    KeyTooLong(usize),
    /// A body length does not fit the wire's `int32`.
    #[error("length {0} does not fit an int32")]
    LengthOverflow(usize),
}

impl CodecError {
    /// A stable label for metrics (`reason="…"`).
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            CodecError::UnknownCommand(_) => "unknown_command",
            CodecError::NegativeLength(_) => "negative_length",
            CodecError::TooLarge { .. } => "too_large",
            CodecError::UnexpectedBody { .. } => "unexpected_body",
            CodecError::BadUtf8 => "bad_utf8",
            CodecError::EmptyKey => "empty_key",
            CodecError::KeyTooLong(_) => "key_too_long",
            CodecError::LengthOverflow(_) => "length_overflow",
        }
    }

    /// Whether the stream can still be read after this error (the header announced no body
    /// the server failed to consume), so a FAIL reply can be sent and the connection kept.
    #[must_use]
    pub fn framing_intact(&self) -> bool {
        matches!(self, CodecError::BadUtf8 | CodecError::EmptyKey)
    }
}

/// Whether `buf` holds at least one whole request header.
#[must_use]
pub fn request_complete(buf: &[u8]) -> bool {
    buf.len() >= REQUEST_HEADER_LEN
}

fn int_at(buf: &[u8], i: usize) -> i32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&buf[4 * i..4 * i + 4]);
    i32::from_le_bytes(word)
}

/// Parses one request header. `max_body` bounds a PUT's length.
///
/// # Errors
/// [`CodecError`]; for a non-PUT command with a bad key, the error is
/// [`framing_intact`](CodecError::framing_intact).
pub fn parse_request(
    buf: &[u8; REQUEST_HEADER_LEN],
    max_body: usize,
) -> Result<LmRequest, CodecError> {
    let raw_command = int_at(buf, 0);
    let command =
        LmCommand::from_code(raw_command).ok_or(CodecError::UnknownCommand(raw_command))?;
    let raw_length = int_at(buf, 1);
    let length = usize::try_from(raw_length).map_err(|_| CodecError::NegativeLength(raw_length))?;
    if command == LmCommand::Put && length > max_body {
        return Err(CodecError::TooLarge {
            length,
            max: max_body,
        });
    }
    if command != LmCommand::Put && length != 0 {
        return Err(CodecError::UnexpectedBody { command, length });
    }
    let meta = ObjectMeta {
        fmt: int_at(buf, 2),
        dtype: int_at(buf, 3),
        location: int_at(buf, 4),
        shape: [
            int_at(buf, 5),
            int_at(buf, 6),
            int_at(buf, 7),
            int_at(buf, 8),
        ],
    };
    let key = std::str::from_utf8(&buf[36..])
        .map_err(|_| CodecError::BadUtf8)?
        // Python's `str.strip()` on the server side; `struct` pads a short field with NULs.
        .trim_end_matches('\0')
        .trim();
    if key.is_empty() {
        return Err(CodecError::EmptyKey);
    }
    Ok(LmRequest {
        command,
        length,
        meta,
        key: key.to_owned(),
    })
}

fn to_i32(n: usize) -> Result<i32, CodecError> {
    i32::try_from(n).map_err(|_| CodecError::LengthOverflow(n))
}

/// Encodes a request header exactly as `ClientMetaMessage.serialize` does.
///
/// # Errors
/// [`CodecError::KeyTooLong`], [`CodecError::LengthOverflow`].
pub fn encode_request(req: &LmRequest) -> Result<[u8; REQUEST_HEADER_LEN], CodecError> {
    let key = req.key.as_bytes();
    if key.len() > MAX_KEY_LEN {
        return Err(CodecError::KeyTooLong(key.len()));
    }
    let m = &req.meta;
    let ints = [
        req.command.code(),
        to_i32(req.length)?,
        m.fmt,
        m.dtype,
        m.location,
        m.shape[0],
        m.shape[1],
        m.shape[2],
        m.shape[3],
    ];
    let mut out = [b' '; REQUEST_HEADER_LEN];
    for (i, v) in ints.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    out[36..36 + key.len()].copy_from_slice(key);
    Ok(out)
}

/// Encodes a reply header exactly as `ServerMetaMessage.serialize` does (`location` last).
///
/// # Errors
/// [`CodecError::LengthOverflow`] for a body over `i32::MAX` bytes.
pub fn encode_reply(reply: &LmReply) -> Result<[u8; REPLY_HEADER_LEN], CodecError> {
    let m = &reply.meta;
    let ints = [
        reply.code,
        to_i32(reply.length)?,
        m.fmt,
        m.dtype,
        m.shape[0],
        m.shape[1],
        m.shape[2],
        m.shape[3],
        m.location,
    ];
    let mut out = [0u8; REPLY_HEADER_LEN];
    for (i, v) in ints.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    Ok(out)
}

/// Parses a reply header (the client side, for tests and tools).
///
/// # Errors
/// [`CodecError::NegativeLength`].
pub fn parse_reply(buf: &[u8; REPLY_HEADER_LEN]) -> Result<LmReply, CodecError> {
    let raw_length = int_at(buf, 1);
    let length = usize::try_from(raw_length).map_err(|_| CodecError::NegativeLength(raw_length))?;
    Ok(LmReply {
        code: int_at(buf, 0),
        length,
        meta: ObjectMeta {
            fmt: int_at(buf, 2),
            dtype: int_at(buf, 3),
            shape: [
                int_at(buf, 4),
                int_at(buf, 5),
                int_at(buf, 6),
                int_at(buf, 7),
            ],
            location: int_at(buf, 8),
        },
    })
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
