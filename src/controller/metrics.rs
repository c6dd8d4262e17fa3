//! Every metric kvplane exports, declared in one place under one prefix.
//!
//! Counters are updated on the hot paths with no lock beyond prometheus' atomics; the
//! LMCache-named gauges ([`LmcacheGauges`]) are refreshed from the index and the socket loops'
//! live counters when `/metrics` is scraped.

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    Opts, Registry, TextEncoder,
};

/// kvplane's own metric prefix.
pub(crate) const PREFIX: &str = "kvplane";

/// Prefix of the gauges LMCache 0.5.6's controller exports (all labelled `role="controller"`).
pub(crate) const LMCACHE_PREFIX: &str = "lmcache:cache_controller_";

/// The 13 gauges of LMCache 0.5.6's controller (`cache_controller/observability.py`), same
/// names, help texts and `role="controller"` label, so existing dashboards and alerts keep
/// working. Set at scrape time (`Driver::refresh_lmcache_gauges`).
#[derive(Clone)]
pub struct LmcacheGauges {
    /// Keys over every worker and location (a chunk held twice counts twice, as in LMCache).
    pub kv_pool_keys_count: Gauge,
    /// Registered workers.
    pub registered_workers_count: Gauge,
    /// Frames received on the PULL socket.
    pub pull_socket_message_count: Gauge,
    /// Messages received on the ROUTER sockets (reply and heartbeat, as in LMCache).
    pub reply_socket_message_count: Gauge,
    /// 1 if the PULL loop found a message waiting when it last came back for one.
    pub pull_socket_has_pending: Gauge,
    /// Same for the ROUTER loops (1 if either found one waiting).
    pub reply_socket_has_pending: Gauge,
    /// Frames from the PULL socket being handled right now.
    pub pull_socket_active_requests: Gauge,
    /// Requests from the ROUTER sockets being handled right now.
    pub reply_socket_active_requests: Gauge,
    /// Admit/evict batches with a sequence gap.
    pub kv_op_seq_discontinuity_count: Gauge,
    /// Workers in a full sync.
    pub full_sync_workers_syncing: Gauge,
    /// Workers whose last full sync completed.
    pub full_sync_workers_completed: Gauge,
    /// Fraction of workers idle or completed (1.0 with no workers).
    pub full_sync_global_progress: Gauge,
    /// Batches missing, summed over syncing workers.
    pub full_sync_missing_batches_total: Gauge,
}

impl LmcacheGauges {
    fn new(registry: &Registry) -> Self {
        let gauge = |name: &str, help: &str| {
            let g = Gauge::with_opts(
                Opts::new(format!("{LMCACHE_PREFIX}{name}"), help)
                    .const_label("role", "controller"),
            )
            .unwrap_or_else(|e| unreachable!("static metric {name} is valid: {e}"));
            registry
                .register(Box::new(g.clone()))
                .unwrap_or_else(|e| unreachable!("metric {name} registered twice: {e}"));
            g
        };
        LmcacheGauges {
            kv_pool_keys_count: gauge("kv_pool_keys_count", "The number of keys in the KV pool"),
            registered_workers_count: gauge(
                "registered_workers_count",
                "The total number of registered workers",
            ),
            pull_socket_message_count: gauge(
                "pull_socket_message_count",
                "The total number of messages received on PULL socket",
            ),
            reply_socket_message_count: gauge(
                "reply_socket_message_count",
                "The total number of messages received on REPLY socket",
            ),
            pull_socket_has_pending: gauge(
                "pull_socket_has_pending",
                "Whether PULL socket has pending messages (1=yes, 0=no)",
            ),
            reply_socket_has_pending: gauge(
                "reply_socket_has_pending",
                "Whether REPLY socket has pending messages (1=yes, 0=no)",
            ),
            pull_socket_active_requests: gauge(
                "pull_socket_active_requests",
                "Number of requests being processed from PULL socket",
            ),
            reply_socket_active_requests: gauge(
                "reply_socket_active_requests",
                "Number of requests being processed from REPLY socket",
            ),
            kv_op_seq_discontinuity_count: gauge(
                "kv_op_seq_discontinuity_count",
                "Total count of KV operation sequence number discontinuities",
            ),
            full_sync_workers_syncing: gauge(
                "full_sync_workers_syncing",
                "Number of workers currently in full sync",
            ),
            full_sync_workers_completed: gauge(
                "full_sync_workers_completed",
                "Number of workers that have completed full sync",
            ),
            full_sync_global_progress: gauge(
                "full_sync_global_progress",
                "Global full sync progress (0.0 to 1.0)",
            ),
            full_sync_missing_batches_total: gauge(
                "full_sync_missing_batches_total",
                "Total count of missing batches across all syncing workers",
            ),
        }
    }
}

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
    /// LMCache's controller gauges.
    pub lmcache: LmcacheGauges,
    /// HTTP requests, by method, matched route (`unmatched` for none) and status code.
    pub http_requests: IntCounterVec,
    /// HTTP request handling time, seconds, by method and matched route.
    pub http_request_seconds: HistogramVec,
    /// HTTP `/lookup` calls, by result (`hit`, `miss`).
    pub http_lookups: IntCounterVec,
    /// HTTP `/lookup` time inside the controller (hashing and index), seconds.
    pub http_lookup_seconds: Histogram,
    /// Orchestration commands, by command and outcome (`ok`, `not_found`, `timeout`,
    /// `worker_error`, `busy`, `conflict`).
    pub commands: IntCounterVec,
    /// Times a resource limit refused something, by limit (`workers`, `keys_per_worker`,
    /// `batch_ops`, `frame_bytes`, `http_body_bytes`, `http_body_items`, `http_connections`,
    /// `http_read_timeout`, `sync_ranges`, and from the ZMQ transport `message_bytes`,
    /// `zmq_handshake_timeout`, `zmq_idle_timeout`, `zmq_connections`).
    pub limit_hits: IntCounterVec,
    /// ZMQ peer connections a listening socket closed, by socket (`pull`, `reply`,
    /// `heartbeat`) and reason (`frame_too_large`, `message_too_large`, `handshake_timeout`,
    /// `idle_timeout`, `connection_limit`, `protocol_error`, `io_error`). Updated at scrape
    /// time.
    pub peer_disconnects: IntCounterVec,
    /// Admits refused because their worker held `--max-keys-per-worker` keys.
    pub keys_refused: IntCounter,
    /// Tokio tasks alive in the process (set at scrape time).
    pub tasks: IntGauge,
    /// Liveness probes in flight (at most `--max-concurrent-probes`).
    pub probes_in_flight: IntGauge,
    /// Liveness probes finished, by outcome (`answered`, `failed`, `removed`: failed and the
    /// worker was removed).
    pub probes: IntCounterVec,
    /// Worker downlinks open (one task and at most one socket each; set at scrape time).
    pub downlinks: IntGauge,
    /// File descriptors open in the process, from `/proc/self/fd` (set at scrape time; 0
    /// where that does not exist).
    pub open_fds: IntGauge,
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
        let http_requests = counter_vec(
            "http_requests_total",
            "HTTP requests, by method, matched route and status code.",
            &["method", "route", "status"],
        );
        let http_lookups = counter_vec(
            "http_lookups_total",
            "HTTP /lookup calls, by result.",
            &["result"],
        );
        let commands = counter_vec(
            "commands_total",
            "Orchestration commands (clear, pin, compress, decompress, move, health), by outcome.",
            &["command", "outcome"],
        );
        let http_request_seconds = HistogramVec::new(
            HistogramOpts::new(
                name("http_request_seconds"),
                "HTTP request handling time, by method and matched route.",
            )
            .buckets(prometheus::exponential_buckets(1e-5, 4.0, 12).unwrap_or_default()),
            &["method", "route"],
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        let limit_hits = counter_vec(
            "limit_hits_total",
            "Times a resource limit refused something (a registration, a batch, keys, a frame, a request), by limit.",
            &["limit"],
        );
        let peer_disconnects = counter_vec(
            "peer_disconnects_total",
            "ZMQ peer connections a listening socket closed (a limit broken, a timeout, bad framing, a failed read), by socket and reason.",
            &["socket", "reason"],
        );
        let keys_refused = IntCounter::new(
            name("keys_refused_total"),
            "Admits refused because the worker already held --max-keys-per-worker keys.",
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        let gauge = |n: &str, help: &str| {
            IntGauge::new(name(n), help).unwrap_or_else(|e| unreachable!("{e}"))
        };
        let tasks = gauge("tasks", "Tokio tasks alive in the process.");
        let downlinks = gauge("downlinks", "Worker downlinks open.");
        let open_fds = gauge("open_fds", "File descriptors open in the process.");
        let probes_in_flight = gauge(
            "probes_in_flight",
            "Liveness probes in flight (at most --max-concurrent-probes).",
        );
        let probes = counter_vec(
            "probes_total",
            "Liveness probes finished, by outcome (answered, failed, removed).",
            &["outcome"],
        );
        let http_lookup_seconds = Histogram::with_opts(
            HistogramOpts::new(
                name("http_lookup_seconds"),
                "HTTP /lookup time in the controller: token hashing plus the index query.",
            )
            .buckets(prometheus::exponential_buckets(1e-6, 4.0, 12).unwrap_or_default()),
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        for c in [
            Box::new(seq_discontinuities.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(workers.clone()),
            Box::new(p2p_lookup_seconds.clone()),
            Box::new(downlink_seconds.clone()),
            Box::new(http_request_seconds.clone()),
            Box::new(http_lookup_seconds.clone()),
            Box::new(keys_refused.clone()),
            Box::new(tasks.clone()),
            Box::new(downlinks.clone()),
            Box::new(probes_in_flight.clone()),
            Box::new(open_fds.clone()),
        ] {
            registry.register(c).unwrap_or_else(|e| unreachable!("{e}"));
        }
        let lmcache = LmcacheGauges::new(&registry);
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
            lmcache,
            http_requests,
            http_request_seconds,
            http_lookups,
            http_lookup_seconds,
            commands,
            limit_hits,
            peer_disconnects,
            keys_refused,
            tasks,
            downlinks,
            probes_in_flight,
            probes,
            open_fds,
        }
    }

    /// Counts one refusal by a resource limit.
    pub fn limit_hit(&self, limit: &str) {
        self.limit_hits.with_label_values(&[limit]).inc();
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
