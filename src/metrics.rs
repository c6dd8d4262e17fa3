//! Every metric kvplane exports, declared in one place under one prefix.
//!
//! Counters are updated on the hot paths with no lock beyond prometheus' atomics; the
//! LMCache-named gauges are refreshed from the index when `/metrics` is scraped.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

/// kvplane's own metric prefix.
pub const PREFIX: &str = "kvplane";

/// The metrics of one kvplane process (each server has its own registry, so tests can run
/// several servers in one process).
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Frames received, by socket (`pull`, `reply`, `heartbeat`).
    pub frames_received: IntCounterVec,
    /// Frames dropped, by socket and reason (`malformed`, `unknown_tag`, `bad_field`,
    /// `too_large`, `bad_envelope`, `wrong_socket`, …).
    pub frames_dropped: IntCounterVec,
    /// KV operations applied to the index, by op (`admit`, `evict`).
    pub ops_applied: IntCounterVec,
    /// Admit/evict batches not applied, by reason (`syncing`, `unknown_worker`).
    pub batches_discarded: IntCounterVec,
    /// Batches with a sequence gap (LMCache's discontinuity count).
    pub seq_discontinuities: IntCounter,
    /// Requests answered on the ROUTER sockets, by message type.
    pub requests: IntCounterVec,
    /// P2P lookups, by result (`hit`, `miss`).
    pub p2p_lookups: IntCounterVec,
    /// P2P lookup time inside the controller, seconds.
    pub p2p_lookup_seconds: Histogram,
    /// Downlink commands, by command and outcome (`ok`, `timeout`, `error`).
    pub downlink_requests: IntCounterVec,
    /// Downlink round-trip time, seconds, by command.
    pub downlink_seconds: HistogramVec,
    /// Workers removed, by reason (`deregistered`, `probe_failed`).
    pub workers_removed: IntCounterVec,
    /// Registered workers.
    pub workers: IntGauge,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let registry = Registry::new();
        let name = |n: &str| format!("{PREFIX}_{n}");
        let counter_vec = |n: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name(n), help), labels)
                .unwrap_or_else(|e| unreachable!("static metric {n} is valid: {e}"));
            registry
                .register(Box::new(c.clone()))
                .unwrap_or_else(|e| unreachable!("metric {n} registered twice: {e}"));
            c
        };
        let frames_received = counter_vec(
            "frames_received_total",
            "ZMQ frames received, by socket.",
            &["socket"],
        );
        let frames_dropped = counter_vec(
            "frames_dropped_total",
            "ZMQ frames dropped without effect, by socket and reason.",
            &["socket", "reason"],
        );
        let ops_applied = counter_vec(
            "kv_ops_applied_total",
            "KV operations applied to the index.",
            &["op"],
        );
        let batches_discarded = counter_vec(
            "kv_batches_discarded_total",
            "Admit/evict batches not applied, by reason.",
            &["reason"],
        );
        let requests = counter_vec(
            "requests_total",
            "Requests answered on ROUTER sockets, by type.",
            &["type"],
        );
        let p2p_lookups = counter_vec("p2p_lookups_total", "P2P lookups, by result.", &["result"]);
        let downlink_requests = counter_vec(
            "downlink_requests_total",
            "Commands sent on worker downlinks, by command and outcome.",
            &["command", "outcome"],
        );
        let workers_removed = counter_vec(
            "workers_removed_total",
            "Workers removed, by reason.",
            &["reason"],
        );
        let seq_discontinuities = IntCounter::new(
            name("kv_seq_discontinuities_total"),
            "Admit/evict batches with a sequence-number gap.",
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        let workers = IntGauge::new(name("workers"), "Registered workers.")
            .unwrap_or_else(|e| unreachable!("{e}"));
        let p2p_lookup_seconds = Histogram::with_opts(
            HistogramOpts::new(name("p2p_lookup_seconds"), "P2P lookup time in the index.")
                .buckets(prometheus::exponential_buckets(1e-7, 4.0, 10).unwrap_or_default()),
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        let downlink_seconds = HistogramVec::new(
            HistogramOpts::new(
                name("downlink_seconds"),
                "Downlink command round-trip time.",
            )
            .buckets(prometheus::exponential_buckets(1e-4, 4.0, 10).unwrap_or_default()),
            &["command"],
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        for c in [
            Box::new(seq_discontinuities.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(workers.clone()),
            Box::new(p2p_lookup_seconds.clone()),
            Box::new(downlink_seconds.clone()),
        ] {
            registry.register(c).unwrap_or_else(|e| unreachable!("{e}"));
        }
        Metrics {
            registry,
            frames_received,
            frames_dropped,
            ops_applied,
            batches_discarded,
            seq_discontinuities,
            requests,
            p2p_lookups,
            p2p_lookup_seconds,
            downlink_requests,
            downlink_seconds,
            workers_removed,
            workers,
        }
    }

    /// Counts a dropped frame.
    pub fn dropped(&self, socket: &str, reason: &str) {
        self.frames_dropped
            .with_label_values(&[socket, reason])
            .inc();
    }

    /// The registry, for exporting.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Renders every metric in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec only fails on invalid metric families, which we never build.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
