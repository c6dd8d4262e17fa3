//! The indexer's counters and their series (`kvplane_indexer_*`), written into the one
//! `/metrics` writer (`web::exposition`). Every name and help text is here.

use super::IndexerState;
use crate::web::exposition::{Exposition, Kind};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters the tasks bump; index and per-publisher figures are read at render time.
#[derive(Debug, Default)]
pub struct IndexerMetrics {
    /// Events applied to the index.
    pub events_applied: AtomicU64,
    frames_dropped: Mutex<BTreeMap<&'static str, u64>>,
    events_rejected: Mutex<BTreeMap<&'static str, u64>>,
    http_limits_hit: Mutex<BTreeMap<&'static str, u64>>,
    /// Messages on `--bind` sockets that reached no instance, by reason.
    pub topics: super::central::TopicCounters,
    /// Standardized (Mooncake) events dropped or applied unordered.
    pub envelope: super::backends::EnvelopeCounters,
}

impl IndexerMetrics {
    /// Counts a message or payload dropped whole, by reason.
    pub fn frame_dropped(&self, reason: &'static str) {
        *self.frames_dropped.lock().entry(reason).or_default() += 1;
    }

    /// Counts one event of a batch that did not decode, by reason.
    pub fn event_rejected(&self, reason: &'static str) {
        *self.events_rejected.lock().entry(reason).or_default() += 1;
    }

    /// Counts one hit of an HTTP limit, by its label (`web::limits::WebLimit::label`).
    pub fn http_limit_hit(&self, limit: &'static str) {
        *self.http_limits_hit.lock().entry(limit).or_default() += 1;
    }

    /// Frames dropped for `reason` so far.
    pub fn frames_dropped(&self, reason: &str) -> u64 {
        self.frames_dropped.lock().get(reason).copied().unwrap_or(0)
    }
}

impl IndexerMetrics {
    pub(crate) fn render_own(&self, out: &mut Exposition) {
        out.one(
            "kvplane_indexer_events_applied_total",
            Kind::Counter,
            "KV events applied to the index.",
            self.events_applied.load(Ordering::Relaxed),
        );
        type ByLabel<'a> = (
            &'a str,
            &'a str,
            &'a str,
            &'a Mutex<BTreeMap<&'static str, u64>>,
        );
        let by_label: [ByLabel<'_>; 3] = [
            (
                "kvplane_indexer_frames_dropped_total",
                "Messages or payloads dropped whole, by reason.",
                "reason",
                &self.frames_dropped,
            ),
            (
                "kvplane_indexer_events_rejected_total",
                "Events of a batch that did not decode (their siblings applied), by reason.",
                "reason",
                &self.events_rejected,
            ),
            (
                "kvplane_indexer_http_limits_hit_total",
                "HTTP limits hit, by limit (http_connections: a client waited for a slot, \
                 http_read_timeout: a client was cut off, http_body_bytes: a 413).",
                "limit",
                &self.http_limits_hit,
            ),
        ];
        for (name, help, label, counts) in by_label {
            let mut family = out.family(name, Kind::Counter, help);
            for (value, n) in counts.lock().iter() {
                family.sample(&[(label, value)], *n);
            }
        }
        out.one(
            "kvplane_indexer_media_names",
            Kind::Gauge,
            "Names of media outside GPU/CPU/DISK kept so far (NPU, 3FS, ...; OTHER included once used).",
            crate::indexer::model::events::MediumName::count() as u64,
        );
        out.one(
            "kvplane_indexer_media_overflow_total",
            Kind::Counter,
            "New medium names reported as OTHER because the most names kept (64) were taken.",
            crate::indexer::model::events::MediumName::overflowed(),
        );
        let mut family = out.family(
            "kvplane_indexer_topic_refused_total",
            Kind::Counter,
            "Messages on --bind sockets that reached no instance, by reason (too_few_frames, \
             topic_too_long, no_match: not of --topic-pattern, instance_cap: \
             --max-topic-instances reached, conflict: the endpoint is fed by another socket or \
             its registration was refused).",
        );
        for (reason, n) in self.topics.by_reason() {
            family.sample(&[("reason", reason)], n);
        }
        self.envelope.render(out);
    }
}

/// One per-publisher metric: name, help, and how to read it from the status.
type PublisherFamily = (
    &'static str,
    &'static str,
    fn(&super::PublisherStatus) -> u64,
);

/// The index's sizes and counters and every publisher's series, read from the state now
/// (the index's lock, then the registry's; neither across an `.await`).
pub(super) fn render_state(st: &IndexerState, out: &mut Exposition) {
    {
        let core = st.core.read();
        let ix = &core.index;
        for (name, help, v) in [
            (
                "memberships",
                "(holder, block) memberships stored.",
                ix.memberships(),
            ),
            (
                "records",
                "(stream, block) records stored, whatever tiers each holds.",
                ix.records(),
            ),
            (
                "chain_heads",
                "Records queries find through the block table (the first of each stored run of a chain; the others follow it in the arena).",
                ix.chain_heads(),
            ),
            (
                "namespaces",
                "(tenant, model, LoRA, block size, salt) namespaces in use.",
                ix.namespaces(),
            ),
            (
                "heap_bytes",
                "Heap bytes of the record arena, its two id tables and the lanes.",
                ix.heap_bytes(),
            ),
        ] {
            out.one(format_args!("kvplane_indexer_{name}"), Kind::Gauge, help, v as u64);
        }
        let c = ix.counters();
        for (name, help, v) in [
            ("stored", "Block stores applied.", c.stored),
            ("removed", "Block memberships removed.", c.removed),
            (
                "orphans",
                "Stores dropped: parent engine hash unknown.",
                c.orphans,
            ),
            (
                "unknown_hashes",
                "Removals or token-less stores of an unknown engine hash.",
                c.unknown_hashes,
            ),
            (
                "shape_mismatch",
                "Stores whose tokens do not fill the blocks or whose block size differs.",
                c.shape_mismatch,
            ),
            (
                "opaque",
                "Stores with multimodal or embedding keys, not indexed.",
                c.opaque,
            ),
            (
                "other_group",
                "Events of a KV cache group other than 0, not indexed.",
                c.other_group,
            ),
            (
                "capacity_refused",
                "Memberships refused at the capacity limit.",
                c.capacity_refused,
            ),
            ("expired", "Memberships dropped by the TTL.", c.expired),
            (
                "evicted",
                "Memberships evicted at the capacity limit, least recently stored first.",
                c.evicted,
            ),
            (
                "clears",
                "Stream clears (events, restarts, unregistrations).",
                c.clears,
            ),
        ] {
            out.one(
                format_args!("kvplane_indexer_{name}_total"),
                Kind::Counter,
                help,
                v,
            );
        }
    }
    let registry = st.registry.lock();
    let families: [PublisherFamily; 7] = [
        ("gaps", "Sequence gaps seen.", |s| s.seq.lock().gaps),
        ("replays", "Replays started.", |s| s.seq.lock().replays),
        ("replay_failures", "Replays failed or timed out.", |s| {
            s.seq.lock().replay_failures
        }),
        ("restarts", "Publisher restarts detected.", |s| {
            s.seq.lock().restarts
        }),
        ("duplicates", "Duplicate messages dropped.", |s| {
            s.seq.lock().duplicates
        }),
        (
            "queue_full",
            "Live messages that found the queue full and waited (the socket unread meanwhile).",
            |s| s.queue_full.load(Ordering::Relaxed),
        ),
        (
            "dropped",
            "Live messages from a --bind socket dropped because the queue was full (replayed).",
            |s| s.dropped.load(Ordering::Relaxed),
        ),
    ];
    for (name, help, f) in families {
        let mut family = out.family(
            format_args!("kvplane_indexer_publisher_{name}_total"),
            Kind::Counter,
            help,
        );
        for (endpoint, p) in &registry.publishers {
            family.sample(&[("endpoint", endpoint)], f(&p.status));
        }
    }
    super::backends::render_backends(&registry, out);
    let mut family = out.family(
        "kvplane_indexer_publisher_connected",
        Kind::Gauge,
        "1 while the SUB connection is up.",
    );
    for (endpoint, p) in &registry.publishers {
        family.sample(
            &[("endpoint", endpoint)],
            u64::from(p.status.connected.load(Ordering::Relaxed)),
        );
    }
}
