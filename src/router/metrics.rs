//! The router's metrics (`kvplane_router_*`): every name and help text is here.

use super::model::accounting::Tally;
use crate::web::exposition::Exposition;
use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// Counters the routes bump; gauges are set at render time.
pub struct RouterMetrics {
    registry: Registry,
    /// Requests answered, by engine (`none` when no engine took it) and status class.
    pub requests: IntCounterVec,
    /// Engine calls that failed, by engine and kind (`connect`, `timeout`, `broken`,
    /// `too_large`).
    pub engine_errors: IntCounterVec,
    /// Prompts tokenized, by source (`local`, `engine`, `ids`) or `failed`.
    pub tokenized: IntCounterVec,
    /// Time to decide (tokenize, query, score), seconds.
    pub decision_seconds: HistogramVec,
    /// Answers whose `usage.prompt_tokens` differs from the router's token count.
    pub prompt_mismatch: IntCounterVec,
    /// Answers without `usage.prompt_tokens_details.cached_tokens` (nothing to account).
    pub usage_missing: IntCounterVec,
    /// Requests refused by a router limit, by limit.
    pub limits_hit: IntCounterVec,
    /// Requests of a session, by outcome: new, kept (its engine again), moved.
    pub sessions: IntCounterVec,
    /// Scrapes of the engines' `/metrics`, by engine and outcome.
    pub scrapes: IntCounterVec,
    /// The counters of the reservations shared with other replicas (`--cluster`).
    pub shared: super::cluster::SharedCounters,
    /// Reads of the registrations engines are discovered from, by outcome (`ok`, `failed`).
    pub discovery_reads: IntCounterVec,
    /// Discovered engines added and removed.
    pub discovery_changes: IntCounterVec,
    /// Registrations a read could not use, by reason (`unreadable`, `subscribe_refused`).
    pub discovery_skipped: IntCounterVec,
    /// Registrations not routed to at the last read, by reason ([`super::model::discovery::Plan`]).
    pub discovery_unrouted: IntGaugeVec,
    /// Engines discovered at the last read.
    pub discovered: IntGauge,
    in_flight: IntGaugeVec,
    shared_held: IntGaugeVec,
    reported: GaugeVec,
    waiting: IntGaugeVec,
    up: IntGaugeVec,
    cached: IntGaugeVec,
    missed: IntGaugeVec,
    ratio: GaugeVec,
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(c.clone())).expect("unique metric");
    c
}

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(g.clone())).expect("unique metric");
    g
}

impl Default for RouterMetrics {
    fn default() -> Self {
        let r = Registry::new();
        let decision_seconds = HistogramVec::new(
            HistogramOpts::new(
                "kvplane_router_decision_seconds",
                "Time to route a request: tokenize, query the index, score",
            )
            .buckets(vec![
                1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2, 0.25, 1.0,
            ]),
            &["tokenizer"],
        )
        .expect("valid metric");
        r.register(Box::new(decision_seconds.clone()))
            .expect("unique metric");
        let ratio = GaugeVec::new(
            Opts::new(
                "kvplane_router_cached_tokens_delivered_ratio",
                "Delivered over predicted cached tokens, a ratio of sums (engine=\"all\": every engine)",
            ),
            &["engine"],
        )
        .expect("valid metric");
        r.register(Box::new(ratio.clone())).expect("unique metric");
        Self {
            requests: counter(
                &r,
                "kvplane_router_requests_total",
                "Requests answered, by engine and status class",
                &["engine", "status"],
            ),
            engine_errors: counter(
                &r,
                "kvplane_router_engine_errors_total",
                "Engine calls that failed: connect (retried on another engine), timeout, broken, too_large (an answer over --max-response-bytes)",
                &["engine", "kind"],
            ),
            tokenized: counter(
                &r,
                "kvplane_router_tokenized_total",
                "Prompts tokenized, by source: local (tokenizer.json), engine (/tokenize), ids (given), failed",
                &["source"],
            ),
            decision_seconds,
            prompt_mismatch: counter(
                &r,
                "kvplane_router_prompt_tokens_mismatch_total",
                "Answers whose usage.prompt_tokens differs from the router's own count (a tokenizer mismatch)",
                &["engine"],
            ),
            usage_missing: counter(
                &r,
                "kvplane_router_usage_missing_total",
                "Answers without usage.prompt_tokens_details.cached_tokens (not accounted)",
                &["engine"],
            ),
            limits_hit: counter(
                &r,
                "kvplane_router_limits_hit_total",
                "Requests refused by a router limit",
                &["limit"],
            ),
            sessions: counter(
                &r,
                "kvplane_router_session_requests_total",
                "Requests of a session (x-session-id or user), by outcome: new, kept (the session's engine again), moved (elsewhere: load or cache outweighed the affinity)",
                &["outcome"],
            ),
            scrapes: counter(
                &r,
                "kvplane_router_engine_scrapes_total",
                "Scrapes of the engines' /metrics, by outcome: ok, no_series (no request counts in it), failed, too_large",
                &["engine", "outcome"],
            ),
            reported: {
                let g = GaugeVec::new(
                    Opts::new(
                        "kvplane_router_engine_reported",
                        "The engine's own figures at its last fresh scrape: running, waiting, kv_usage (0..1)",
                    ),
                    &["engine", "kind"],
                )
                .expect("valid metric");
                r.register(Box::new(g.clone())).expect("unique metric");
                g
            },
            shared: super::cluster::SharedCounters {
                reservations: counter(
                    &r,
                    "kvplane_router_shared_reservations_total",
                    "Reservation writes to the cluster: reserved, conflict (another replica wrote first; decided again), full, too_many, unreachable",
                    &["outcome"],
                ),
                expired: counter(
                    &r,
                    "kvplane_router_shared_reservations_expired_total",
                    "Reservations dropped past their deadline (--reservation-ttl) instead of released",
                    &[],
                ),
                releases: counter(
                    &r,
                    "kvplane_router_shared_releases_total",
                    "Reservations released, by outcome: released, queue_full, gave_up, unreachable (the others expire at their deadline)",
                    &["outcome"],
                ),
            },
            discovery_reads: counter(
                &r,
                "kvplane_router_discovery_reads_total",
                "Reads of the registrations engines are discovered from (--discover), by outcome: ok, failed (the engines found before are kept)",
                &["outcome"],
            ),
            discovery_changes: counter(
                &r,
                "kvplane_router_discovered_engines_changes_total",
                "Discovered engines added and removed as their registrations came and went",
                &["change"],
            ),
            discovery_skipped: counter(
                &r,
                "kvplane_router_discovery_skipped_total",
                "Registrations a read could not use: unreadable (a separate indexer's entry), subscribe_refused (its events not taken into the router's index)",
                &["reason"],
            ),
            discovery_unrouted: gauge(
                &r,
                "kvplane_router_discovery_unrouted",
                "Registrations not routed to at the last read, by reason: other_model, other_tenant, block_size, not_an_engine, no_http_endpoint, http_endpoint_conflict, over_limit",
                &["reason"],
            ),
            discovered: {
                let g = IntGauge::new(
                    "kvplane_router_discovered_engines",
                    "Engines discovered through the registrations at the last read (beyond --engine's)",
                )
                .expect("valid metric");
                r.register(Box::new(g.clone())).expect("unique metric");
                g
            },
            shared_held: gauge(
                &r,
                "kvplane_router_shared_held",
                "Reservations every replica holds on the engine (--cluster), as this replica last saw them",
                &["engine"],
            ),
            in_flight: gauge(
                &r,
                "kvplane_router_in_flight",
                "Requests sent to the engine and not finished",
                &["engine"],
            ),
            waiting: gauge(
                &r,
                "kvplane_router_waiting",
                "Requests sent to the engine without a response yet",
                &["engine"],
            ),
            up: gauge(
                &r,
                "kvplane_router_engine_up",
                "1 when the engine is routed to (last call and health probe answered)",
                &["engine"],
            ),
            cached: gauge(
                &r,
                "kvplane_router_cached_tokens_total",
                "Cached prompt tokens summed over answered requests: reusable, predicted, delivered, unpredicted",
                &["engine", "kind"],
            ),
            missed: gauge(
                &r,
                "kvplane_router_missed_cached_tokens_total",
                "Reusable tokens not reused, by cause: no_reuse_possible, routed_for_load, index_stale",
                &["engine", "reason"],
            ),
            ratio,
            registry: r,
        }
    }
}

/// One engine's live figures at render time.
pub struct EngineGauges<'a> {
    /// The engine's instance id.
    pub name: &'a str,
    /// In flight.
    pub in_flight: u64,
    /// Waiting for a first byte.
    pub waiting: u64,
    /// Routed to.
    pub up: bool,
    /// Every replica's reservations (`None`: not shared).
    pub shared: Option<u64>,
    /// The engine's own figures when fresh.
    pub reported: Option<super::model::score::Reported>,
}

impl RouterMetrics {
    fn totals(&self, engine: &str, t: &Tally) {
        for (kind, v) in [
            ("reusable", t.reusable),
            ("predicted", t.predicted),
            ("delivered", t.delivered),
            ("unpredicted", t.unpredicted),
        ] {
            self.cached.with_label_values(&[engine, kind]).set(v as i64);
        }
        for (reason, v) in [
            ("no_reuse_possible", t.misses.no_reuse_possible),
            ("routed_for_load", t.misses.routed_for_load),
            ("index_stale", t.misses.index_stale),
        ] {
            self.missed
                .with_label_values(&[engine, reason])
                .set(v as i64);
        }
        if let Some(r) = t.delivered_ratio() {
            self.ratio.with_label_values(&[engine]).set(r);
        }
    }

    /// Writes every router metric into a `/metrics` document: the gauges set from the
    /// engines and the accounting, then the registry through the crate's encoder.
    pub fn write_to<'a>(
        &self,
        out: &mut Exposition,
        engines: impl Iterator<Item = EngineGauges<'a>>,
        accounting: &super::model::accounting::Accounting,
    ) {
        for e in engines {
            self.in_flight
                .with_label_values(&[e.name])
                .set(e.in_flight as i64);
            self.waiting
                .with_label_values(&[e.name])
                .set(e.waiting as i64);
            self.up.with_label_values(&[e.name]).set(i64::from(e.up));
            if let Some(r) = e.reported {
                for (kind, v) in [
                    ("running", r.running as f64),
                    ("waiting", r.waiting as f64),
                    (
                        "kv_usage",
                        r.kv_usage_permille
                            .map_or(f64::NAN, |p| f64::from(p) / 1000.0),
                    ),
                ] {
                    self.reported.with_label_values(&[e.name, kind]).set(v);
                }
            }
            if let Some(held) = e.shared {
                self.shared_held
                    .with_label_values(&[e.name])
                    .set(held as i64);
            }
        }
        for (engine, t) in accounting.per_engine() {
            self.totals(engine, t);
        }
        self.totals("all", &accounting.overall());
        out.registry(&self.registry);
    }
}
