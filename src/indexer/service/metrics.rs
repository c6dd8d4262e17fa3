//! The indexer's counters and their Prometheus text rendering (`kvplane_indexer_*`). Every
//! name and help text is here.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt::Write;
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
    pub envelope: super::mooncake::EnvelopeCounters,
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

/// Builds the text exposition.
#[derive(Default)]
pub(crate) struct Text(pub(crate) String);

impl Text {
    pub(crate) fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    pub(crate) fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let v = v
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                let _ = write!(self.0, "{k}=\"{v}\"");
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {value}");
    }

    pub(crate) fn one(&mut self, name: &str, kind: &str, help: &str, value: u64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }
}

impl IndexerMetrics {
    pub(crate) fn render_own(&self, out: &mut Text) {
        out.one(
            "kvplane_indexer_events_applied_total",
            "counter",
            "KV events applied to the index.",
            self.events_applied.load(Ordering::Relaxed),
        );
        out.family(
            "kvplane_indexer_frames_dropped_total",
            "counter",
            "Messages or payloads dropped whole, by reason.",
        );
        for (reason, n) in self.frames_dropped.lock().iter() {
            out.sample(
                "kvplane_indexer_frames_dropped_total",
                &[("reason", reason)],
                *n,
            );
        }
        out.family(
            "kvplane_indexer_events_rejected_total",
            "counter",
            "Events of a batch that did not decode (their siblings applied), by reason.",
        );
        for (reason, n) in self.events_rejected.lock().iter() {
            out.sample(
                "kvplane_indexer_events_rejected_total",
                &[("reason", reason)],
                *n,
            );
        }
        out.family(
            "kvplane_indexer_http_limits_hit_total",
            "counter",
            "HTTP limits hit, by limit (http_connections: a client waited for a slot, \
             http_read_timeout: a client was cut off, http_body_bytes: a 413).",
        );
        for (limit, n) in self.http_limits_hit.lock().iter() {
            out.sample(
                "kvplane_indexer_http_limits_hit_total",
                &[("limit", limit)],
                *n,
            );
        }
        out.one(
            "kvplane_indexer_media_names",
            "gauge",
            "Names of media outside GPU/CPU/DISK kept so far (NPU, 3FS, ...; OTHER included once used).",
            crate::indexer::events::MediumName::count() as u64,
        );
        out.one(
            "kvplane_indexer_media_overflow_total",
            "counter",
            "New medium names reported as OTHER because the most names kept (64) were taken.",
            crate::indexer::events::MediumName::overflowed(),
        );
        out.family(
            "kvplane_indexer_topic_refused_total",
            "counter",
            "Messages on --bind sockets that reached no instance, by reason (too_few_frames, \
             topic_too_long, no_match: not of --topic-pattern, instance_cap: \
             --max-topic-instances reached, conflict: the endpoint is fed by another socket or \
             its registration was refused).",
        );
        for (reason, n) in self.topics.by_reason() {
            out.sample(
                "kvplane_indexer_topic_refused_total",
                &[("reason", reason)],
                n,
            );
        }
        self.envelope.render(out);
    }
}
