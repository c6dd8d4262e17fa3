//! Every metric `kvplane node` exports, in its own prometheus registry (so the node shares
//! nothing with the controller's `crate::controller::metrics`). Counters are bumped on the hot
//! paths; the tier gauges are set from the tiers when `/metrics` is scraped.

use crate::web::exposition::Exposition;
use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// Metric name prefix.
const PREFIX: &str = "kvplane_node";

/// The node's metrics.
pub(crate) struct NodeMetrics {
    registry: Registry,
    /// Requests by `command` and `outcome` (`hit`, `miss`, `ok`, `fail`).
    pub requests: IntCounterVec,
    /// Time from a whole request read to its reply written, by `command`.
    pub request_seconds: HistogramVec,
    /// Requests refused as malformed, by `reason` (the codec's stable labels).
    pub bad_requests: IntCounterVec,
    /// Connections open now.
    pub connections_open: IntGauge,
    /// Bytes of freed body mappings kept for reuse (`node/buffers.rs`).
    pub body_pool_spare_bytes: IntGauge,
    /// Bytes of L1 mapped and faulted in at start (`--l1-preallocate`; 0 without).
    pub l1_preallocated_bytes: IntGauge,
    /// Of those, bytes not yet handed to a body.
    pub l1_preallocated_unused_bytes: IntGauge,
    /// Object bodies by where their memory came from (`preallocated`, `reused`, `mapped`,
    /// `heap`).
    pub body_buffers: IntCounterVec,
    /// Connections accepted since start.
    pub connections_total: IntCounter,
    /// Connections closed at once because `--max-connections` were open.
    pub connections_refused: IntCounter,
    /// Connections closed for a read timeout or a short read mid-request.
    pub connections_aborted: IntCounterVec,
    /// HTTP limits hit, by `limit` (`http_connections`: a client waited for a slot,
    /// `http_read_timeout`: a client was cut off, `http_body_bytes`: a 413).
    pub http_limits_hit: IntCounterVec,
    /// Bytes held, by `tier` (`l1`, `l2`).
    pub tier_bytes: IntGaugeVec,
    /// Objects held, by `tier`.
    pub tier_objects: IntGaugeVec,
    /// Byte budget, by `tier`.
    pub tier_capacity_bytes: IntGaugeVec,
    /// Objects evicted, by `tier`.
    pub evictions: IntCounterVec,
    /// Bytes evicted, by `tier`.
    pub evicted_bytes: IntCounterVec,
    /// Stores refused (larger than the tier, or the rest pinned), by `tier`.
    pub stores_refused: IntCounterVec,
    /// L2 file writes, by `outcome` (`ok`, `error`).
    pub l2_writes: IntCounterVec,
    /// L2 file reads, by `outcome` (`ok`, `error`).
    pub l2_reads: IntCounterVec,
    /// L2 files discarded (torn, truncated, corrupt), by `reason`.
    pub l2_discarded: IntCounterVec,
    /// L2 hits loaded into L1 (`retain` prefetch policy).
    pub l2_promotions: IntCounter,
    /// Body bytes received in PUTs.
    pub put_bytes: IntCounter,
    /// Body bytes sent in GET replies.
    pub get_bytes: IntCounter,
    /// Coordinator route requests (`GET`/`DELETE /cache/objects`), by `route`, `outcome`.
    pub coordinator_requests: IntCounterVec,
    /// Objects deleted through `DELETE /cache/objects`.
    pub coordinator_deleted: IntCounter,
    /// Tier changes handed to a reporter, by `sink` (`controller`, `coordinator`) and
    /// `outcome` (`queued`, `dropped`: bounded queue full, `closed`, `unreportable_key`).
    pub reports: IntCounterVec,
    /// Calls to the coordinator, by `call` (`register`, `heartbeat`, `events`,
    /// `deregister`) and `outcome` (`ok`, `error`, `not_found`).
    pub coordinator_calls: IntCounterVec,
    /// Warm prefetches (`POST /cache/prefetches`), by `outcome` (`submitted`, `refused`,
    /// `completed`).
    pub prefetches: IntCounterVec,
    /// Objects a warm prefetch found, by `where` (`l1`: already there, `l2`: loaded into L1,
    /// `missing`).
    pub prefetched_keys: IntCounterVec,
    /// The controller's commands, by `command` (`pin`, `move`, `compress`, `decompress`,
    /// `clear`) and `outcome` (`ok`, `error`).
    pub controller_commands: IntCounterVec,
    /// Objects held by the controller's `pin`, by `tier` (set at scrape).
    pub pinned_objects: IntGaugeVec,
}

fn reg<T: prometheus::core::Collector + Clone + 'static>(registry: &Registry, c: T) -> T {
    registry
        .register(Box::new(c.clone()))
        .unwrap_or_else(|e| unreachable!("node metrics are registered once: {e}"));
    c
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(format!("{PREFIX}_{name}"), help)
}

impl NodeMetrics {
    /// A fresh registry with every node metric.
    #[must_use]
    pub(crate) fn new() -> Self {
        let registry = Registry::new();
        let r = &registry;
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            reg(
                r,
                IntCounterVec::new(opts(name, help), labels)
                    .unwrap_or_else(|e| unreachable!("static metric {name}: {e}")),
            )
        };
        let gauge_vec = |name: &str, help: &str| {
            reg(
                r,
                IntGaugeVec::new(opts(name, help), &["tier"])
                    .unwrap_or_else(|e| unreachable!("static metric {name}: {e}")),
            )
        };
        let counter = |name: &str, help: &str| {
            reg(
                r,
                IntCounter::with_opts(opts(name, help))
                    .unwrap_or_else(|e| unreachable!("static metric {name}: {e}")),
            )
        };
        let buckets = prometheus::exponential_buckets(20e-6, 2.5, 14)
            .unwrap_or_else(|e| unreachable!("static buckets: {e}"));
        NodeMetrics {
            requests: counter_vec(
                "requests_total",
                "Requests by command and outcome (hit, miss, ok, fail).",
                &["command", "outcome"],
            ),
            request_seconds: reg(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        format!("{PREFIX}_request_seconds"),
                        "Time from a whole request read to its reply written, by command.",
                    )
                    .buckets(buckets),
                    &["command"],
                )
                .unwrap_or_else(|e| unreachable!("static metric: {e}")),
            ),
            bad_requests: counter_vec(
                "bad_requests_total",
                "Malformed requests by reason.",
                &["reason"],
            ),
            connections_open: reg(
                r,
                IntGauge::with_opts(opts("connections_open", "Connections open now."))
                    .unwrap_or_else(|e| unreachable!("static metric: {e}")),
            ),
            body_pool_spare_bytes: reg(
                r,
                IntGauge::with_opts(opts(
                    "body_pool_spare_bytes",
                    "Bytes of freed object-body mappings kept for reuse by later PUTs.",
                ))
                .unwrap_or_else(|e| unreachable!("static metric: {e}")),
            ),
            l1_preallocated_bytes: reg(
                r,
                IntGauge::with_opts(opts(
                    "l1_preallocated_bytes",
                    "Bytes of L1 mapped and faulted in at start (--l1-preallocate).",
                ))
                .unwrap_or_else(|e| unreachable!("static metric: {e}")),
            ),
            l1_preallocated_unused_bytes: reg(
                r,
                IntGauge::with_opts(opts(
                    "l1_preallocated_unused_bytes",
                    "Bytes of the L1 preallocation not yet handed to an object body.",
                ))
                .unwrap_or_else(|e| unreachable!("static metric: {e}")),
            ),
            body_buffers: counter_vec(
                "body_buffers_total",
                "Object bodies by where their memory came from (preallocated, reused, mapped, heap).",
                &["source"],
            ),
            connections_total: counter("connections_total", "Connections accepted."),
            connections_refused: counter(
                "connections_refused_total",
                "Connections closed at once because --max-connections were open.",
            ),
            connections_aborted: counter_vec(
                "connections_aborted_total",
                "Connections closed mid-request, by reason (timeout, eof, io).",
                &["reason"],
            ),
            http_limits_hit: counter_vec(
                "http_limits_hit_total",
                "HTTP listener limits hit, by limit (http_connections, http_read_timeout, http_body_bytes).",
                &["limit"],
            ),
            tier_bytes: gauge_vec("tier_bytes", "Bytes held by tier."),
            tier_objects: gauge_vec("tier_objects", "Objects held by tier."),
            tier_capacity_bytes: gauge_vec("tier_capacity_bytes", "Byte budget by tier."),
            evictions: counter_vec("evictions_total", "Objects evicted by tier.", &["tier"]),
            evicted_bytes: counter_vec("evicted_bytes_total", "Bytes evicted by tier.", &["tier"]),
            stores_refused: counter_vec(
                "stores_refused_total",
                "Stores refused (too large, or the rest pinned) by tier.",
                &["tier"],
            ),
            l2_writes: counter_vec(
                "l2_writes_total",
                "L2 file writes by outcome.",
                &["outcome"],
            ),
            l2_reads: counter_vec("l2_reads_total", "L2 file reads by outcome.", &["outcome"]),
            l2_discarded: counter_vec(
                "l2_discarded_total",
                "L2 files discarded (torn, truncated, corrupt) by reason.",
                &["reason"],
            ),
            l2_promotions: counter("l2_promotions_total", "L2 hits loaded into L1."),
            put_bytes: counter("put_bytes_total", "Body bytes received in PUTs."),
            get_bytes: counter("get_bytes_total", "Body bytes sent in GET replies."),
            coordinator_requests: counter_vec(
                "coordinator_requests_total",
                "Coordinator route requests, by route and outcome.",
                &["route", "outcome"],
            ),
            coordinator_deleted: counter(
                "coordinator_deleted_total",
                "Objects deleted through DELETE /cache/objects.",
            ),
            reports: counter_vec(
                "reports_total",
                "Tier changes handed to a reporter, by sink and outcome.",
                &["sink", "outcome"],
            ),
            coordinator_calls: counter_vec(
                "coordinator_calls_total",
                "Calls to the coordinator, by call and outcome.",
                &["call", "outcome"],
            ),
            prefetches: counter_vec(
                "prefetches_total",
                "Warm prefetches by outcome.",
                &["outcome"],
            ),
            prefetched_keys: counter_vec(
                "prefetched_keys_total",
                "Objects a warm prefetch looked for, by where it found them.",
                &["where"],
            ),
            controller_commands: counter_vec(
                "controller_commands_total",
                "The controller's commands run on the node, by command and outcome.",
                &["command", "outcome"],
            ),
            pinned_objects: gauge_vec(
                "pinned_objects",
                "Objects held by the controller's pin command, by tier.",
            ),
            registry,
        }
    }

    /// Writes every node metric into a `/metrics` document (the registry, through the
    /// crate's encoder).
    pub(crate) fn write_to(&self, out: &mut Exposition) {
        out.registry(&self.registry);
    }

    /// The text exposition of every node metric.
    #[cfg(test)]
    pub(crate) fn render(&self) -> String {
        let mut out = Exposition::new();
        self.write_to(&mut out);
        out.finish()
    }
}

impl Default for NodeMetrics {
    fn default() -> Self {
        Self::new()
    }
}
