//! The Mooncake standard envelope (the Conductor's KV Events API, RFC #1527): decoding the
//! standardized events (`event_type` stored / removed / cleared) with their envelope fields,
//! and the order of each backend's `event_id`s.
//!
//! - `event_id` orders a backend's events. Its scope is what publishers number: Mooncake's
//!   master keeps one counter per process, from 1, over every tenant and medium
//!   (`mooncake-store/src/kv_event/kv_event_publisher.cpp`, `next_event_id_`), and a master
//!   has one `backend_id`; Dynamo's publisher numbers "per worker". So the ids are tracked per
//!   (publisher, `backend_id`) by the same [`SeqTracker`] that tracks vLLM's sequence numbers
//!   (no replay: a gap is counted and passed over, an id back at 1 or far back is a restart
//!   that clears the backend's blocks, an older id is dropped and counted as a duplicate).
//! - `base_block_idx` is the depth of the event's first block: a stored event at depth 0 must
//!   not name a parent, and one deeper than 0 without `parent_hash` cannot be hashed from its
//!   tokens, so its `seq_hashes` (standard rolling hashes) are indexed as given; with neither
//!   a parent nor `seq_hashes` it is refused.
//! - `backend_id` and `tenant_id` say whose blocks these are; the service decides which
//!   registered streams read them.
//!
//! Pure: no I/O, never panics.

use super::events::{self, bad, EventError, KvEvent, Removed, Stored};
use super::msgpack::Value;
use super::seq::{SeqConfig, SeqCounters, SeqTracker, Step};
use std::collections::BTreeMap;

/// The longest `backend_id` or `tenant_id` accepted, bytes.
pub const MAX_ID_BYTES: usize = 256;
/// Backends whose `event_id`s one publisher's tracker follows at most; events of further
/// backends are refused (counted).
pub const MAX_BACKENDS: usize = 64;

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
    let medium = events::medium(get("medium"))?;
    let seq = match get("seq_hashes") {
        Value::Nil => get("block_hashes"),
        v => v,
    };
    let event = match kind.to_ascii_lowercase().as_str() {
        "stored" => {
            let mut s = Stored {
                hashes: events::hashes(seq, "seq_hashes")?,
                parent: events::opt_hash(get("parent_hash"), "parent_hash")?,
                tokens: events::tokens(get("token_ids"))?,
                block_size: events::block_size(get("block_size"))?,
                lora: events::lora(get("lora_name"), &nil)?,
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
            hashes: events::hashes(seq, "seq_hashes")?,
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

/// What became of one standardized event in its backend's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ordered {
    /// Next in order (or after a gap, counted): apply it.
    Apply,
    /// The backend restarted (its id went back to the first, or far back): clear its
    /// blocks, then apply it.
    ClearThenApply,
    /// An id already passed (a duplicate, or one going backwards): dropped, counted.
    Drop,
    /// The publisher already tracks [`MAX_BACKENDS`] backends: dropped, counted.
    Refused,
}

/// One backend's order as `/services` shows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendOrder {
    /// The last `event_id` applied.
    pub last: Option<u64>,
    /// What the tracker counted (gaps, duplicates, restarts, unrepaired gaps, applied).
    pub counters: SeqCounters,
}

/// The `event_id` order of every backend one publisher carries.
#[derive(Debug, Default)]
pub struct EventOrder {
    backends: BTreeMap<String, SeqTracker<u64>>,
}

impl EventOrder {
    /// Places event `id` of `backend` (`""`: unnamed) in its backend's order.
    pub fn place(&mut self, backend: &str, id: u64) -> Ordered {
        if !self.backends.contains_key(backend) {
            if self.backends.len() >= MAX_BACKENDS {
                return Ordered::Refused;
            }
            let config = SeqConfig {
                first_seq: 1,
                replay: false,
                ..SeqConfig::default()
            };
            self.backends
                .insert(backend.to_owned(), SeqTracker::new(config));
        }
        let Some(tracker) = self.backends.get_mut(backend) else {
            return Ordered::Refused;
        };
        let steps = tracker.on_live(id, id);
        match steps.first() {
            Some(Step::Clear) => Ordered::ClearThenApply,
            Some(Step::Apply(..)) => Ordered::Apply,
            // No replay is configured, so a tracker never asks for one.
            Some(Step::Replay(_)) | None => Ordered::Drop,
        }
    }

    /// Each backend's order, by name.
    pub fn backends(&self) -> BTreeMap<String, BackendOrder> {
        self.backends
            .iter()
            .map(|(name, t)| {
                (
                    name.clone(),
                    BackendOrder {
                        last: t.last(),
                        counters: t.counters(),
                    },
                )
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "mooncake_tests.rs"]
mod tests;
