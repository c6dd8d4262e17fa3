//! KV events as engines publish them, decoded into one engine-neutral form.
//!
//! Accepted (spec §2, §4.2–4.4): vLLM's positional events (≤ 0.23, 7 to 12 elements with the
//! tag first), vLLM's tagged maps (≥ 0.24, any map header: fixmap, map16, map32), SGLang's
//! maps (signed hashes, `cache_salt`), and the standardized Mooncake events (`event_type`,
//! decoded with their envelope; `super::mooncake` orders their `event_id`s).
//! The batch is `[ts, events, dp_rank]` (or a map with those names). Unknown map keys and
//! trailing array elements are skipped. A bad event is reported beside its good siblings, which
//! still apply. Hashes may be unsigned, negative (two's complement) or `bin` (the last 8 bytes,
//! big-endian). Pure: no I/O, never panics.

use super::msgpack::{self, Value};
use serde::{Deserialize, Serialize};

/// Where a block is: one of the three tiers the index answers by, to which every known alias
/// maps, or any other medium, kept under its own name ([`MediumName`]) and never dropped.
///
/// GPU: `GPU`, `HBM`, `DEVICE`, `VRAM`, `CUDA` and `cuda:N` (LMCache stamps a tensor's
/// device); CPU: `CPU` (vLLM, LMCache, Mooncake's `cpu`), `CPU_PINNED` (SGLang), `DRAM`,
/// `HOST`, `PINNED`, `MEMORY`; DISK: `DISK` (SGLang, Mooncake's `disk`), `STORAGE` (vLLM
/// 0.33), `EXTERNAL` (SGLang), `SSD`, `NVME`, `LOCAL_DISK`. Compared case-insensitively.
/// Anything else (`NPU`, `3FS`, `NFS`, `DFS`, a new one) is an [`Medium::Other`].
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(from = "MediumWire", into = "MediumWire")]
pub enum Medium {
    /// Device memory (the default when an event names none).
    #[default]
    Gpu,
    /// Host memory.
    Cpu,
    /// Disk, remote or external storage.
    Disk,
    /// A medium no alias names, by its name.
    Other(MediumName),
}

/// How a [`Medium`] is written in the replication log and snapshots: by name.
#[derive(Serialize, Deserialize)]
enum MediumWire {
    Gpu,
    Cpu,
    Disk,
    Other(String),
}

impl From<MediumWire> for Medium {
    fn from(w: MediumWire) -> Self {
        match w {
            MediumWire::Gpu => Medium::Gpu,
            MediumWire::Cpu => Medium::Cpu,
            MediumWire::Disk => Medium::Disk,
            MediumWire::Other(n) => Medium::Other(MediumName::intern(&n)),
        }
    }
}

impl From<Medium> for MediumWire {
    fn from(m: Medium) -> Self {
        match m {
            Medium::Gpu => MediumWire::Gpu,
            Medium::Cpu => MediumWire::Cpu,
            Medium::Disk => MediumWire::Disk,
            Medium::Other(n) => MediumWire::Other(n.as_str().to_owned()),
        }
    }
}

/// Distinct names of other media kept at most; beyond, a new name is reported as `OTHER`
/// (counted in [`MediumName::overflowed`]).
pub const MAX_MEDIA: usize = 64;
/// The longest medium name kept, bytes (longer ones are cut).
pub const MAX_MEDIUM_NAME: usize = 32;

/// The name of a medium outside the three tiers, interned process-wide (at most
/// [`MAX_MEDIA`] names, so at most a few KiB; written out by name, never by number).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MediumName(u16);

static MEDIA: parking_lot::RwLock<Vec<&'static str>> = parking_lot::RwLock::new(Vec::new());
static MEDIA_OVERFLOW: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl MediumName {
    /// The name for `raw` (upper case, ASCII letters, digits and `_-.:/` only, at most
    /// [`MAX_MEDIUM_NAME`] bytes); `OTHER` once [`MAX_MEDIA`] names are taken.
    pub fn intern(raw: &str) -> MediumName {
        let name: String = raw
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || "_-.:/".contains(*c))
            .take(MAX_MEDIUM_NAME)
            .collect::<String>()
            .to_ascii_uppercase();
        // Names the answer's own keys use stay apart from them.
        let name = match name.as_str() {
            "" | "DP" | "OTHER" => "OTHER".to_owned(),
            _ => name,
        };
        if let Some(i) = MEDIA.read().iter().position(|n| *n == name) {
            return MediumName(i as u16);
        }
        let mut media = MEDIA.write();
        if let Some(i) = media.iter().position(|n| *n == name) {
            return MediumName(i as u16);
        }
        if media.is_empty() {
            media.push("OTHER");
        }
        if media.len() >= MAX_MEDIA {
            MEDIA_OVERFLOW.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return MediumName(0);
        }
        if name == "OTHER" {
            return MediumName(0);
        }
        media.push(Box::leak(name.into_boxed_str()));
        MediumName((media.len() - 1) as u16)
    }

    /// The name.
    pub fn as_str(self) -> &'static str {
        MEDIA
            .read()
            .get(usize::from(self.0))
            .copied()
            .unwrap_or("OTHER")
    }

    /// Names kept so far (`OTHER` included once used).
    pub fn count() -> usize {
        MEDIA.read().len()
    }

    /// New names reported as `OTHER` because [`MAX_MEDIA`] were taken.
    pub fn overflowed() -> u64 {
        MEDIA_OVERFLOW.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Medium {
    /// The three tiers, in query order.
    pub const ALL: [Medium; 3] = [Medium::Gpu, Medium::Cpu, Medium::Disk];

    /// The medium an engine's name stands for: a tier for a known alias, else
    /// [`Medium::Other`] under its own name. `None` only for a name with no letter or digit.
    pub fn parse(name: &str) -> Option<Medium> {
        let n = name.trim().to_ascii_uppercase();
        match n.as_str() {
            "GPU" | "HBM" | "DEVICE" | "VRAM" | "CUDA" => Some(Medium::Gpu),
            "CPU" | "CPU_PINNED" | "DRAM" | "HOST" | "PINNED" | "MEMORY" => Some(Medium::Cpu),
            "DISK" | "STORAGE" | "SSD" | "EXTERNAL" | "NVME" | "LOCAL_DISK" => Some(Medium::Disk),
            _ if n.starts_with("CUDA:") => Some(Medium::Gpu),
            _ if !n.chars().any(|c| c.is_ascii_alphanumeric()) => None,
            _ => Some(Medium::Other(MediumName::intern(&n))),
        }
    }

    /// The index of this tier (0..3). Other media never reach the records' tiers (the index
    /// keeps them in streams of their own): they answer 0, as GPU, in that stream.
    pub fn index(self) -> usize {
        match self {
            Medium::Gpu | Medium::Other(_) => 0,
            Medium::Cpu => 1,
            Medium::Disk => 2,
        }
    }

    /// The name of a medium outside the three tiers.
    pub fn other(self) -> Option<MediumName> {
        match self {
            Medium::Other(n) => Some(n),
            _ => None,
        }
    }
}

/// Which LoRA adapter a block belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Lora {
    /// Not given by the event: the stream's registered default.
    #[default]
    Unspecified,
    /// An adapter by name.
    Name(String),
    /// An adapter known only by id (vLLM ≤ 0.11 events).
    Id(i64),
}

/// A block store.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stored {
    /// The engine's block hashes, one per block (for Mooncake: standard rolling hashes).
    pub hashes: Vec<u64>,
    /// The engine hash of the parent of the first block, `None` for a root.
    pub parent: Option<u64>,
    /// The tokens of every block, concatenated; empty for token-less (placeholder) events.
    pub tokens: Vec<u32>,
    /// Tokens per block as the event says (0 when absent).
    pub block_size: u32,
    /// The adapter.
    pub lora: Lora,
    /// The tier.
    pub medium: Medium,
    /// The per-request cache salt (SGLang's field, or vLLM's `extra_keys[0]`).
    pub cache_salt: Option<String>,
    /// The KV cache group (vLLM ≥ 0.20); `None` means the only group.
    pub group: Option<u64>,
    /// Extra keys that tokens alone do not reproduce (multimodal ids, prompt embeddings).
    pub opaque_extra_keys: bool,
    /// For Mooncake events: `hashes` are already standard rolling hashes.
    pub standard_hashes: bool,
}

/// A block removal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Removed {
    /// The engine's block hashes.
    pub hashes: Vec<u64>,
    /// The tier the blocks left.
    pub medium: Medium,
    /// The KV cache group, if given.
    pub group: Option<u64>,
}

/// One KV event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum KvEvent {
    /// Blocks were stored.
    Stored(Stored),
    /// Blocks were removed.
    Removed(Removed),
    /// Every block of the stream was cleared: of one tier (vLLM's `AllBlocksCleared` covers
    /// the GPU tier unless it names another), or of all tiers (`None`, Mooncake's `cleared`).
    Cleared(Option<Medium>),
}

/// A decoded batch: the events that decoded, and why the others did not.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// The batch timestamp as sent (seconds for vLLM, milliseconds for Mooncake).
    pub ts: f64,
    /// The data-parallel rank stamped on the batch, if any.
    pub dp_rank: Option<u64>,
    /// The events that decoded, in order.
    pub events: Vec<KvEvent>,
    /// Beside each event of [`Batch::events`] (same length), its Mooncake standard envelope
    /// (`None` for vLLM's and SGLang's events).
    pub envelopes: Vec<Option<Envelope>>,
    /// Events that did not decode (their position in the batch and the reason); their
    /// siblings are unaffected.
    pub rejected: Vec<(usize, EventError)>,
}

/// Why a payload or one of its events could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// Not well-formed msgpack.
    #[error("malformed msgpack: {0}")]
    Malformed(&'static str),
    /// Well-formed, but not `[ts, events, dp_rank]`.
    #[error("not an event batch: {0}")]
    NotABatch(&'static str),
    /// The event's type tag is missing or not a string.
    #[error("event has no type tag")]
    MissingTag,
    /// The event's type is not one kvplane knows.
    #[error("unknown event type {0:?}")]
    UnknownType(String),
    /// A field has the wrong type or value.
    #[error("invalid field {field}: {detail}")]
    BadField {
        /// The field.
        field: &'static str,
        /// What was wrong.
        detail: &'static str,
    },
    /// A well-formed event kvplane deliberately does not index (SGLang bigram pages).
    #[error("unsupported event: {0}")]
    Unsupported(&'static str),
}

impl EventError {
    /// A short, stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            EventError::Malformed(_) => "malformed",
            EventError::NotABatch(_) => "not_a_batch",
            EventError::MissingTag => "missing_tag",
            EventError::UnknownType(_) => "unknown_type",
            EventError::BadField { .. } => "bad_field",
            EventError::Unsupported(_) => "unsupported",
        }
    }
}

pub(super) fn bad(field: &'static str, detail: &'static str) -> EventError {
    EventError::BadField { field, detail }
}

/// Decodes one payload frame (the last frame of a live or replayed message).
///
/// # Errors
/// [`EventError`] when the payload as a whole is not a batch; per-event problems are in
/// [`Batch::rejected`] instead.
pub fn decode_batch(payload: &[u8]) -> Result<Batch, EventError> {
    let root = msgpack::decode(payload).map_err(|e| {
        EventError::Malformed(match e {
            msgpack::MsgpackError::Truncated => "truncated",
            msgpack::MsgpackError::Reserved => "reserved byte",
            msgpack::MsgpackError::TooDeep => "too deep",
            msgpack::MsgpackError::Trailing => "trailing bytes",
        })
    })?;
    let (ts, events, dp) = match &root {
        Value::Array(items) if items.len() >= 2 => (&items[0], &items[1], items.get(2)),
        Value::Map(_) => (
            root.get("ts").unwrap_or(&Value::Nil),
            root.get("events")
                .ok_or(EventError::NotABatch("no events"))?,
            root.get("data_parallel_rank")
                .or_else(|| root.get("attn_dp_rank")),
        ),
        _ => return Err(EventError::NotABatch("not a 2+ element array or a map")),
    };
    let ts = match ts {
        Value::Float(f) => *f,
        Value::UInt(u) => *u as f64,
        Value::NegInt(i) => *i as f64,
        Value::Nil => 0.0,
        _ => return Err(EventError::NotABatch("ts is not a number")),
    };
    let dp_rank = match dp {
        None | Some(Value::Nil) => None,
        Some(Value::UInt(u)) => Some(*u),
        Some(_) => return Err(EventError::NotABatch("dp rank is not an unsigned integer")),
    };
    let Value::Array(list) = events else {
        return Err(EventError::NotABatch("events is not an array"));
    };
    let mut batch = Batch {
        ts,
        dp_rank,
        events: Vec::with_capacity(list.len()),
        envelopes: Vec::with_capacity(list.len()),
        rejected: Vec::new(),
    };
    for (i, ev) in list.iter().enumerate() {
        match decode_event(ev) {
            Ok((e, envelope)) => {
                batch.events.push(e);
                batch.envelopes.push(envelope);
            }
            Err(e) => batch.rejected.push((i, e)),
        }
    }
    Ok(batch)
}

fn decode_event(ev: &Value<'_>) -> Result<(KvEvent, Option<Envelope>), EventError> {
    match ev {
        Value::Array(items) => {
            let tag = items
                .first()
                .and_then(Value::as_str)
                .ok_or(EventError::MissingTag)?;
            Ok((positional(tag, &items[1..])?, None))
        }
        Value::Map(_) => {
            if let Some(kind) = ev.get("event_type") {
                let kind = kind.as_str().ok_or(bad("event_type", "not a string"))?;
                let (event, envelope) = standard(kind, ev)?;
                return Ok((event, Some(envelope)));
            }
            let tag = ev
                .get("type")
                .and_then(Value::as_str)
                .ok_or(EventError::MissingTag)?;
            Ok((tagged(tag, ev)?, None))
        }
        _ => Err(EventError::NotABatch(
            "an event is neither an array nor a map",
        )),
    }
}

/// vLLM ≤ 0.23: fields in declaration order after the tag.
fn positional(tag: &str, f: &[Value<'_>]) -> Result<KvEvent, EventError> {
    let nil = Value::Nil;
    let at = |i: usize| f.get(i).unwrap_or(&nil);
    match tag {
        "BlockStored" => {
            let lora_name = at(6);
            stored(StoredFields {
                hashes: at(0),
                parent: at(1),
                tokens: at(2),
                block_size: at(3),
                lora_id: at(4),
                medium: at(5),
                lora_name,
                extra_keys: at(7),
                group: at(8),
                cache_salt: &nil,
            })
        }
        "BlockRemoved" => removed(at(0), at(1), at(2)),
        "AllBlocksCleared" => cleared(at(0)),
        other => Err(EventError::UnknownType(other.chars().take(64).collect())),
    }
}

/// vLLM ≥ 0.24 and SGLang: a map with `"type"`.
fn tagged(tag: &str, ev: &Value<'_>) -> Result<KvEvent, EventError> {
    let nil = Value::Nil;
    let get = |k: &str| ev.get(k).unwrap_or(&nil);
    match tag {
        "BlockStored" => stored(StoredFields {
            hashes: get("block_hashes"),
            parent: get("parent_block_hash"),
            tokens: get("token_ids"),
            block_size: get("block_size"),
            lora_id: get("lora_id"),
            medium: get("medium"),
            lora_name: get("lora_name"),
            extra_keys: get("extra_keys"),
            group: get("group_idx"),
            cache_salt: get("cache_salt"),
        }),
        "BlockRemoved" => removed(get("block_hashes"), get("medium"), get("group_idx")),
        "AllBlocksCleared" => cleared(get("medium")),
        other => Err(EventError::UnknownType(other.chars().take(64).collect())),
    }
}

struct StoredFields<'v, 'a> {
    hashes: &'v Value<'a>,
    parent: &'v Value<'a>,
    tokens: &'v Value<'a>,
    block_size: &'v Value<'a>,
    lora_id: &'v Value<'a>,
    medium: &'v Value<'a>,
    lora_name: &'v Value<'a>,
    extra_keys: &'v Value<'a>,
    group: &'v Value<'a>,
    cache_salt: &'v Value<'a>,
}

fn stored(f: StoredFields<'_, '_>) -> Result<KvEvent, EventError> {
    let lora = lora(f.lora_name, f.lora_id)?;
    let mut s = Stored {
        hashes: hashes(f.hashes, "block_hashes")?,
        parent: opt_hash(f.parent, "parent_block_hash")?,
        tokens: tokens(f.tokens)?,
        block_size: block_size(f.block_size)?,
        medium: medium(f.medium)?,
        cache_salt: match f.cache_salt {
            Value::Nil => None,
            Value::Str("") => None,
            Value::Str(s) => Some((*s).to_owned()),
            _ => return Err(bad("cache_salt", "not a string")),
        },
        group: match f.group {
            Value::Nil => None,
            Value::UInt(g) => Some(*g),
            _ => return Err(bad("group_idx", "not an unsigned integer")),
        },
        lora,
        opaque_extra_keys: false,
        standard_hashes: false,
    };
    extra_keys(f.extra_keys, &mut s)?;
    Ok(KvEvent::Stored(s))
}

/// Reads vLLM's `extra_keys` (one entry per block, each nil or a list of keys): the LoRA
/// name is skipped, a later string in block 0 is the cache salt, `[id, offset]` pairs
/// (multimodal) and binaries (prompt embeddings) make the blocks opaque.
fn extra_keys(v: &Value<'_>, s: &mut Stored) -> Result<(), EventError> {
    let blocks = match v {
        Value::Nil => return Ok(()),
        Value::Array(b) => b,
        // Every block's entry an integer: none is a list of keys.
        Value::UInts(_) => return Err(bad("extra_keys", "an entry is not an array")),
        _ => return Err(bad("extra_keys", "not an array")),
    };
    let lora_name = match &s.lora {
        Lora::Name(n) => Some(n.as_str()),
        _ => None,
    };
    for (i, block) in blocks.iter().enumerate() {
        let keys = match block {
            Value::Nil => continue,
            // Integer keys say nothing about the LoRA or the salt (as before: ignored).
            Value::UInts(_) => continue,
            Value::Array(k) => k,
            _ => return Err(bad("extra_keys", "an entry is not an array")),
        };
        let mut lora_seen = false;
        for key in keys {
            match key {
                Value::Str(k) if !lora_seen && Some(*k) == lora_name => lora_seen = true,
                Value::Str(k) if i == 0 && s.cache_salt.is_none() => {
                    s.cache_salt = Some((*k).to_owned());
                }
                Value::Str(_) => {}
                // Tagged keys (vLLM 0.33): ("lora", name, path) is the adapter; others are
                // multimodal or embedding identities.
                Value::Array(parts) if parts.first().and_then(Value::as_str) == Some("lora") => {}
                Value::Array(_) | Value::UInts(_) | Value::Bin(_) => s.opaque_extra_keys = true,
                _ => {}
            }
        }
    }
    Ok(())
}

fn removed(h: &Value<'_>, m: &Value<'_>, g: &Value<'_>) -> Result<KvEvent, EventError> {
    Ok(KvEvent::Removed(Removed {
        hashes: hashes(h, "block_hashes")?,
        medium: medium(m)?,
        group: match g {
            Value::Nil => None,
            Value::UInt(g) => Some(*g),
            _ => return Err(bad("group_idx", "not an unsigned integer")),
        },
    }))
}

fn cleared(m: &Value<'_>) -> Result<KvEvent, EventError> {
    Ok(KvEvent::Cleared(Some(medium(m)?)))
}

pub(super) fn medium(v: &Value<'_>) -> Result<Medium, EventError> {
    match v {
        Value::Nil => Ok(Medium::Gpu),
        Value::Str(s) => Medium::parse(s).ok_or(bad("medium", "names no medium")),
        _ => Err(bad("medium", "not a string")),
    }
}

// The Mooncake standard envelope's events (the Conductor's KV Events API, RFC #1527); the
// order of their `event_id`s is `super::mooncake`'s.

/// The longest `backend_id` or `tenant_id` accepted, bytes.
pub const MAX_ID_BYTES: usize = 256;
/// The envelope fields of one standardized event that the index's event does not carry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Envelope {
    /// Orders the backend's events (`None`: the event had none; applied unordered).
    pub event_id: Option<u64>,
    /// The cache that owns the blocks (`None`: not named).
    pub backend_id: Option<String>,
    /// The tenant the blocks belong to (`None`: not named, any registration's).
    pub tenant_id: Option<String>,
    /// The depth of the event's first block.
    pub base_block_idx: Option<u32>,
}

fn id_field(v: &Value<'_>, field: &'static str) -> Result<Option<String>, EventError> {
    match v {
        Value::Nil | Value::Str("") => Ok(None),
        Value::Str(s) if s.len() <= MAX_ID_BYTES => Ok(Some((*s).to_owned())),
        Value::Str(_) => Err(bad(field, "longer than 256 bytes")),
        _ => Err(bad(field, "not a string")),
    }
}

fn uint_field(v: &Value<'_>, field: &'static str, max: u64) -> Result<Option<u64>, EventError> {
    match v {
        Value::Nil => Ok(None),
        Value::UInt(u) if *u <= max => Ok(Some(*u)),
        Value::UInt(_) => Err(bad(field, "out of range")),
        _ => Err(bad(field, "not an unsigned integer")),
    }
}

/// Decodes a standardized event: its index event and its envelope.
///
/// # Errors
/// A malformed field, or a stored event whose depth and parent disagree.
pub(super) fn standard(kind: &str, ev: &Value<'_>) -> Result<(KvEvent, Envelope), EventError> {
    let nil = Value::Nil;
    let get = |k: &str| ev.get(k).unwrap_or(&nil);
    let envelope = Envelope {
        event_id: uint_field(get("event_id"), "event_id", u64::MAX)?,
        backend_id: id_field(get("backend_id"), "backend_id")?,
        tenant_id: id_field(get("tenant_id"), "tenant_id")?,
        base_block_idx: uint_field(get("base_block_idx"), "base_block_idx", u64::from(u32::MAX))?
            .map(|d| d as u32),
    };
    let medium = medium(get("medium"))?;
    let seq = match get("seq_hashes") {
        Value::Nil => get("block_hashes"),
        v => v,
    };
    let event = match kind.to_ascii_lowercase().as_str() {
        "stored" => {
            let mut s = Stored {
                hashes: hashes(seq, "seq_hashes")?,
                parent: opt_hash(get("parent_hash"), "parent_hash")?,
                tokens: tokens(get("token_ids"))?,
                block_size: block_size(get("block_size"))?,
                lora: lora(get("lora_name"), &nil)?,
                medium,
                cache_salt: None,
                group: None,
                opaque_extra_keys: false,
                standard_hashes: true,
            };
            if let Some(salt) = get("additional_salt").as_str().filter(|s| !s.is_empty()) {
                s.cache_salt = Some(salt.to_owned());
            }
            at_depth(&mut s, envelope.base_block_idx)?;
            KvEvent::Stored(s)
        }
        "removed" => KvEvent::Removed(Removed {
            hashes: hashes(seq, "seq_hashes")?,
            medium,
            group: None,
        }),
        "cleared" => KvEvent::Cleared(None),
        other => return Err(EventError::UnknownType(other.chars().take(64).collect())),
    };
    Ok((event, envelope))
}

/// Places a stored event at its depth: a root names no parent; a deeper run without its
/// parent cannot be hashed from tokens, so its rolling hashes are taken as given.
fn at_depth(s: &mut Stored, depth: Option<u32>) -> Result<(), EventError> {
    match (depth, s.parent) {
        (Some(0), Some(_)) => Err(bad("base_block_idx", "0 (a root) with a parent_hash")),
        (Some(d), None) if d > 0 => {
            if s.hashes.is_empty() {
                return Err(bad(
                    "parent_hash",
                    "missing at base_block_idx > 0, and no seq_hashes",
                ));
            }
            // Tokens of a run whose parent is unknown would hash as a root: wrong blocks.
            s.tokens.clear();
            Ok(())
        }
        _ => Ok(()),
    }
}

/// One hash: unsigned, negative (two's complement) or `bin` (last 8 bytes, big-endian).
fn hash(v: &Value<'_>) -> Option<u64> {
    match v {
        Value::UInt(u) => Some(*u),
        Value::NegInt(i) => Some(*i as u64),
        Value::Bin(b) if !b.is_empty() => {
            let tail = &b[b.len().saturating_sub(8)..];
            Some(tail.iter().fold(0u64, |acc, x| (acc << 8) | u64::from(*x)))
        }
        _ => None,
    }
}

pub(super) fn opt_hash(v: &Value<'_>, field: &'static str) -> Result<Option<u64>, EventError> {
    match v {
        Value::Nil => Ok(None),
        v => hash(v).map(Some).ok_or(bad(field, "not an integer or bin")),
    }
}

pub(super) fn hashes(v: &Value<'_>, field: &'static str) -> Result<Vec<u64>, EventError> {
    match v {
        Value::Nil => Ok(Vec::new()),
        Value::UInts(items) => Ok(items.clone()),
        Value::Array(items) => items
            .iter()
            .map(|h| hash(h).ok_or(bad(field, "an element is not an integer or bin")))
            .collect(),
        _ => Err(bad(field, "not an array")),
    }
}

pub(super) fn tokens(v: &Value<'_>) -> Result<Vec<u32>, EventError> {
    match v {
        Value::Nil => Ok(Vec::new()),
        Value::UInts(items) => items
            .iter()
            .map(|u| u32::try_from(*u).map_err(|_| bad("token_ids", "above u32")))
            .collect(),
        Value::Array(items) => items
            .iter()
            .map(|t| match t {
                Value::UInt(u) => u32::try_from(*u).map_err(|_| bad("token_ids", "above u32")),
                Value::Array(_) | Value::UInts(_) => {
                    Err(EventError::Unsupported("token pages (bigram ids)"))
                }
                _ => Err(bad("token_ids", "an element is not an unsigned integer")),
            })
            .collect(),
        _ => Err(bad("token_ids", "not an array")),
    }
}

pub(super) fn block_size(v: &Value<'_>) -> Result<u32, EventError> {
    match v {
        Value::Nil => Ok(0),
        Value::UInt(u) => u32::try_from(*u).map_err(|_| bad("block_size", "above u32")),
        _ => Err(bad("block_size", "not an unsigned integer")),
    }
}

pub(super) fn lora(name: &Value<'_>, id: &Value<'_>) -> Result<Lora, EventError> {
    match name {
        Value::Str(n) if !n.is_empty() => return Ok(Lora::Name((*n).to_owned())),
        Value::Str(_) | Value::Nil => {}
        _ => return Err(bad("lora_name", "not a string")),
    }
    match id {
        Value::Nil => Ok(Lora::Unspecified),
        Value::UInt(u) => Ok(Lora::Id(i64::try_from(*u).unwrap_or(i64::MAX))),
        Value::NegInt(i) => Ok(Lora::Id(*i)),
        _ => Err(bad("lora_id", "not an integer")),
    }
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
