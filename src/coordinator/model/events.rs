//! Usage-event wire types (both forms) and the per-instance sequence gate.
//!
//! Two bodies carry usage events: the documented `POST /quota/events`
//! ([`LegacyEvents`]: one batch, `{"instance_id","seq","tier","events":[{type,key,bytes}]}`)
//! and what 0.5.5/0.5.6 MP servers post to `POST /events` ([`CacheEvents`]:
//! `{"batches":[{instance_id, incarnation, seq, event_type, tier, backend, entries, …}]}`).
//! Both become [`Batch`]es and pass the [`Gate`]: per instance a cursor
//! `(incarnation, last_seq)`; an older incarnation is stale, a repeated or older seq a
//! duplicate, a jump a gap (admitted and counted). Owns no usage state; the model applies
//! admitted batches to the key store.

use super::keys::EncodedKey;
use super::tokens::ChunkTokens;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// Which cache tier (ordered `l1` < `l2`, as LMCache sorts them).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// The local memory tier (not tracked by fleet quotas).
    L1,
    /// The shared storage tier the quotas govern.
    #[default]
    L2,
}

/// What one batch records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventType {
    /// Keys were stored (sizes counted).
    Store,
    /// Keys were deleted.
    Delete,
    /// Keys were read (LRU touch).
    Access,
    /// A capacity declaration (no entries; not tracked).
    Config,
}

/// One entry of a 0.5.6 batch.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct BatchEntry {
    /// The object key.
    pub key: EncodedKey,
    /// Stored size (store only).
    #[serde(default)]
    pub size_bytes: u64,
    /// The chunk's token ids (store only; `None` when one is outside `u32`: accepted, not
    /// kept, as 0.5.6 does).
    #[serde(default)]
    pub token_ids: super::tokens::WireTokens,
    /// The chunk's first token's position in its sequence (-1: unknown).
    #[serde(default = "super::tokens::unknown_offset")]
    pub token_offset: i64,
}

/// One batch of a 0.5.6 `POST /events` body (unknown fields such as `token_ids` ignored).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct WireBatch {
    /// Sender.
    pub instance_id: String,
    /// Sender's boot incarnation.
    pub incarnation: u64,
    /// Per-(instance, incarnation) sequence number, from 1.
    pub seq: u64,
    /// What the entries record.
    pub event_type: EventType,
    /// Which tier.
    pub tier: Tier,
    /// The storage backend within the tier (`dram`, `fs`, …).
    #[serde(default)]
    pub backend: String,
    /// The backend is a pool the fleet shares (its bytes belong to no one instance).
    #[serde(default)]
    pub shared: bool,
    /// `config` only: the compartment's declared capacity (0: no limit declared).
    #[serde(default)]
    pub capacity_bytes: u64,
    /// `config` only: which declaration this batch belongs to.
    #[serde(default)]
    pub capacity_revision: u64,
    /// The entries.
    #[serde(default)]
    pub entries: Vec<BatchEntry>,
}

/// The 0.5.6 `POST /events` body.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct CacheEvents {
    /// The batches, applied in order.
    pub batches: Vec<WireBatch>,
}

/// A documented `POST /quota/events` event type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LegacyType {
    /// Stored `bytes`.
    Store,
    /// Read (LRU touch).
    Lookup,
    /// Deleted.
    Delete,
}

/// One documented `POST /quota/events` event.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct LegacyEvent {
    /// What happened.
    #[serde(rename = "type")]
    pub kind: LegacyType,
    /// The object key.
    pub key: EncodedKey,
    /// Stored size (store only).
    pub bytes: u64,
}

/// The documented `POST /quota/events` body.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct LegacyEvents {
    /// Sender.
    pub instance_id: String,
    /// Per-instance sequence number, from 1.
    pub seq: u64,
    /// Which tier (default l2).
    #[serde(default)]
    pub tier: Tier,
    /// The events, in order.
    pub events: Vec<LegacyEvent>,
}

/// One thing a batch does to one key.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub enum Op {
    /// Stored with this size.
    Store(EncodedKey, u64),
    /// Read.
    Access(EncodedKey),
    /// Deleted.
    Delete(EncodedKey),
}

/// A batch in the form the model applies, from either body.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct Batch {
    /// Sender.
    pub instance_id: String,
    /// Sender's incarnation (0 for the documented form, which has none).
    pub incarnation: u64,
    /// Sequence number.
    pub seq: u64,
    /// Which tier.
    pub tier: Tier,
    /// Storage backend within the tier (`"default"` for the documented form, which has none).
    pub backend: String,
    /// A fleet-shared backend.
    pub shared: bool,
    /// A `config` batch: `(capacity_bytes, capacity_revision)`; it has no operations.
    pub capacity: Option<(u64, u64)>,
    /// The operations, in order.
    pub ops: Vec<Op>,
    /// Token ids of the stored chunks, one per chunk hash (for the key directory).
    #[serde(default)]
    pub tokens: Vec<super::tokens::ChunkTokens>,
}

impl From<WireBatch> for Batch {
    fn from(b: WireBatch) -> Self {
        let capacity =
            (b.event_type == EventType::Config).then_some((b.capacity_bytes, b.capacity_revision));
        let tokens = if b.event_type == EventType::Store {
            of_entries(&b.entries)
        } else {
            Vec::new()
        };
        let ops = match b.event_type {
            EventType::Config => Vec::new(),
            EventType::Store => b
                .entries
                .into_iter()
                .map(|e| Op::Store(e.key, e.size_bytes))
                .collect(),
            EventType::Access => b.entries.into_iter().map(|e| Op::Access(e.key)).collect(),
            EventType::Delete => b.entries.into_iter().map(|e| Op::Delete(e.key)).collect(),
        };
        Batch {
            instance_id: b.instance_id,
            incarnation: b.incarnation,
            seq: b.seq,
            tier: b.tier,
            backend: b.backend,
            shared: b.shared,
            capacity,
            ops,
            tokens,
        }
    }
}

impl From<LegacyEvents> for Batch {
    fn from(b: LegacyEvents) -> Self {
        let ops = b
            .events
            .into_iter()
            .map(|e| match e.kind {
                LegacyType::Store => Op::Store(e.key, e.bytes),
                LegacyType::Lookup => Op::Access(e.key),
                LegacyType::Delete => Op::Delete(e.key),
            })
            .collect();
        Batch {
            instance_id: b.instance_id,
            incarnation: 0,
            seq: b.seq,
            tier: b.tier,
            backend: "default".into(),
            // The documented (≤ 0.5.2) fleet shares one L2: its usage is per key, whoever
            // reports it, and a victim goes to one server.
            shared: true,
            capacity: None,
            ops,
            tokens: Vec::new(),
        }
    }
}

/// The gate's verdict on a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Next in sequence (or first contact): apply.
    InOrder,
    /// Apply, but `missing` batches were skipped.
    Gap {
        /// How many sequence numbers were jumped.
        missing: u64,
    },
    /// Already seen: drop.
    Duplicate,
    /// From an older incarnation: drop.
    Stale,
    /// A new instance while `max` cursors are held: drop.
    Full,
}

#[derive(Clone, Copy, Debug)]
struct SeqCursor {
    incarnation: u64,
    last_seq: u64,
}

/// Per-instance sequence cursors.
#[derive(Debug, Default)]
pub struct Gate {
    cursors: HashMap<String, SeqCursor>,
    max: usize,
}

impl Gate {
    /// A gate holding at most `max` cursors.
    pub fn new(max: usize) -> Self {
        Gate {
            cursors: HashMap::new(),
            max,
        }
    }

    /// Judges a batch and advances the cursor when it is admitted. A first contact is
    /// in order whatever its seq (after a coordinator restart a server continues its count).
    pub fn admit(&mut self, instance: &str, incarnation: u64, seq: u64) -> Admit {
        let Some(c) = self.cursors.get_mut(instance) else {
            if self.cursors.len() >= self.max {
                return Admit::Full;
            }
            self.cursors.insert(
                instance.to_owned(),
                SeqCursor {
                    incarnation,
                    last_seq: seq,
                },
            );
            return Admit::InOrder;
        };
        if incarnation < c.incarnation {
            return Admit::Stale;
        }
        if incarnation > c.incarnation {
            *c = SeqCursor {
                incarnation,
                last_seq: seq,
            };
            return Admit::InOrder;
        }
        if seq <= c.last_seq {
            return Admit::Duplicate;
        }
        let missing = seq - c.last_seq - 1;
        c.last_seq = seq;
        if missing == 0 {
            Admit::InOrder
        } else {
            Admit::Gap { missing }
        }
    }

    /// Every cursor as `(instance, incarnation, last seq)`, by instance (for a snapshot).
    pub fn dump(&self) -> Vec<(String, u64, u64)> {
        let mut rows: Vec<_> = self
            .cursors
            .iter()
            .map(|(id, c)| (id.clone(), c.incarnation, c.last_seq))
            .collect();
        rows.sort_unstable();
        rows
    }

    /// A gate of at most `max` cursors holding `rows` ([`Gate::dump`]; beyond `max`, dropped).
    pub fn restore(max: usize, rows: Vec<(String, u64, u64)>) -> Self {
        let mut gate = Gate::new(max);
        for (id, incarnation, last_seq) in rows.into_iter().take(max) {
            gate.cursors.insert(
                id,
                SeqCursor {
                    incarnation,
                    last_seq,
                },
            );
        }
        gate
    }

    /// The incarnation of an instance's cursor, if it has one.
    pub fn incarnation(&self, instance: &str) -> Option<u64> {
        self.cursors.get(instance).map(|c| c.incarnation)
    }

    /// Forgets an instance's cursor (deregistered or timed out).
    pub fn forget(&mut self, instance: &str) {
        self.cursors.remove(instance);
    }

    /// Cursors held.
    pub fn len(&self) -> usize {
        self.cursors.len()
    }

    /// True when no cursor is held.
    pub fn is_empty(&self) -> bool {
        self.cursors.is_empty()
    }
}

/// The part of a batch's token bindings: see [`of_entries`] and [`for_ops`].
/// The tokens of a store batch's entries, one per chunk hash (the last entry of a hash wins,
/// as 0.5.6 applies entries in order); entries without tokens carry none.
pub fn of_entries(entries: &[BatchEntry]) -> Vec<ChunkTokens> {
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
    use crate::coordinator::model::tokens::{WireTokens, UNKNOWN_OFFSET};

    #[test]
    fn out_of_range_tokens_drop_only_the_tokens() {
        let e: BatchEntry = serde_json::from_str(
            r#"{"key":{"chunk_hash_hex":"AA","model_name":"m","kv_rank":0},"size_bytes":3,"token_ids":[1,4294967296],"token_offset":0}"#,
        )
        .unwrap();
        assert_eq!(e.token_ids, WireTokens(None));
        assert_eq!(e.size_bytes, 3);
        let e: BatchEntry = serde_json::from_str(
            r#"{"key":{"chunk_hash_hex":"AA","model_name":"m","kv_rank":0},"token_ids":[1,-1]}"#,
        )
        .unwrap();
        assert_eq!(e.token_ids, WireTokens(None));
        assert_eq!(e.token_offset, UNKNOWN_OFFSET);
        assert!(serde_json::from_str::<BatchEntry>(
            r#"{"key":{"chunk_hash_hex":"AA","model_name":"m","kv_rank":0},"token_ids":[1.5]}"#,
        )
        .is_err());
    }

    #[test]
    fn one_binding_per_chunk_and_slices_keep_theirs() {
        let entry = |hex: &str, rank: i64, first: u32| -> BatchEntry {
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

    #[test]
    fn gate_orders_per_instance() {
        let mut g = Gate::new(2);
        assert_eq!(g.admit("a", 5, 7), Admit::InOrder);
        assert_eq!(g.admit("a", 5, 8), Admit::InOrder);
        assert_eq!(g.admit("a", 5, 8), Admit::Duplicate);
        assert_eq!(g.admit("a", 5, 3), Admit::Duplicate);
        assert_eq!(g.admit("a", 5, 11), Admit::Gap { missing: 2 });
        assert_eq!(g.admit("a", 4, 100), Admit::Stale);
        assert_eq!(g.admit("a", 6, 1), Admit::InOrder);
        assert_eq!(g.admit("a", 6, 2), Admit::InOrder);
        assert_eq!(g.admit("b", 0, 1), Admit::InOrder);
        assert_eq!(g.admit("c", 0, 1), Admit::Full);
        g.forget("b");
        assert_eq!(g.admit("c", 0, 1), Admit::InOrder);
        // A forgotten instance starts over.
        g.forget("a");
        assert_eq!(g.admit("a", 6, 1), Admit::InOrder);
        assert_eq!(g.len(), 2);
    }

    #[test]
    fn both_wire_forms_parse_into_batches() {
        let sniffed = r#"{"batches":[
          {"instance_id":"mp-a","incarnation":1795378491,"seq":1,"event_type":"config","tier":"l1","backend":"dram","entries":[],"shared":false,"ts":1.5,"capacity_bytes":268435456,"capacity_revision":1},
          {"instance_id":"mp-a","incarnation":1795378491,"seq":2,"event_type":"store","tier":"l2","backend":"fs","entries":[
            {"key":{"chunk_hash_hex":"9e73","model_name":"test-model","kv_rank":16777472,"object_group_id":0,"cache_salt":""},"size_bytes":16384,"token_ids":[1,2],"token_offset":0}]}]}"#;
        let body: CacheEvents = serde_json::from_str(sniffed).unwrap();
        let batches: Vec<Batch> = body.batches.into_iter().map(Batch::from).collect();
        assert!(batches[0].ops.is_empty());
        assert_eq!(batches[0].tier, Tier::L1);
        assert_eq!(batches[0].capacity, Some((268_435_456, 1)));
        assert_eq!(batches[0].backend, "dram");
        assert_eq!(batches[1].capacity, None);
        assert_eq!(batches[1].backend, "fs");
        assert_eq!(batches[1].seq, 2);
        assert!(matches!(&batches[1].ops[0], Op::Store(k, 16384) if k.chunk_hash_hex == "9e73"));

        let doc = r#"{"instance_id":"server-1","seq":1,"events":[
          {"type":"store","key":{"chunk_hash_hex":"aa","model_name":"m","kv_rank":0,"cache_salt":"user-a"},"bytes":1024},
          {"type":"lookup","key":{"chunk_hash_hex":"aa","model_name":"m","kv_rank":0,"cache_salt":"user-a"},"bytes":0},
          {"type":"delete","key":{"chunk_hash_hex":"aa","model_name":"m","kv_rank":0,"cache_salt":"user-a"},"bytes":0}]}"#;
        let b = Batch::from(serde_json::from_str::<LegacyEvents>(doc).unwrap());
        assert_eq!((b.incarnation, b.seq, b.tier), (0, 1, Tier::L2));
        assert!(matches!(
            b.ops.as_slice(),
            [Op::Store(_, 1024), Op::Access(_), Op::Delete(_)]
        ));
    }
}
