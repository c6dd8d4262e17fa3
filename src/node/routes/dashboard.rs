//! The node's dashboard on `--http-port`: the shared `frontend/` app with `node.html` at `/`,
//! and its one JSON feed, `GET /api/dashboard[?history=1]`: tier usage (bytes and objects of
//! L1 and L2 against their budgets), the counters (GET hits and misses, evictions, bytes in
//! and out, refusals) and, on request, the server-side history of those figures
//! ([`crate::web::history`], a sample every 2 s for 15 minutes), so the charts are full on
//! open. Each tier also shows its pinned objects (the controller's `/pin`), and the feed
//! lists the controller's commands run on the node, done and failed, by command.
//!
//! Read-only: no route here changes anything. Reads the tiers' usage (two short locks) and
//! the node's own prometheus registry (never `with_label_values` on a read, which would
//! create empty series in `/metrics`).

use super::AppState;
use crate::node::metrics::NodeMetrics;
use crate::node::tiers::TieredStore;
use crate::web::assets::{asset, Frontend};
use crate::web::history::{
    feed_response, spawn_sampler, unix_now, History, HistoryPage, HistoryQuery, Sample,
};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use prometheus::core::Collector;
use serde::Serialize;
use std::sync::Arc;

/// Values per history sample: the node sends 10.
const MAX_SERIES: usize = 16;

/// The dashboard's history, and its sampler (which ends when the history's last owner, the
/// router's state, is dropped).
pub(super) fn history(tiers: &Arc<TieredStore>, metrics: &Arc<NodeMetrics>) -> Arc<History> {
    let history = Arc::new(History::dashboard(MAX_SERIES));
    let (t, m) = (Arc::clone(tiers), Arc::clone(metrics));
    spawn_sampler(&history, move || {
        let s = sample(&t, &m, unix_now());
        async move { Some(s) }
    });
    history
}

/// `GET /`: the node's page of the shared `frontend/` app.
pub(super) async fn page(headers: HeaderMap) -> Response {
    asset::<Frontend>("node.html", &headers)
}

/// `GET /static/<path>`: the app's modules.
pub(super) async fn static_file(Path(path): Path<String>, headers: HeaderMap) -> Response {
    asset::<Frontend>(&format!("static/{path}"), &headers)
}

/// Sum of the samples of `metric` (a counter or gauge family) whose labels include every
/// `(name, value)` of `want`.
fn read(metric: &impl Collector, want: &[(&str, &str)]) -> u64 {
    let mut sum = 0.0;
    for family in metric.collect() {
        let counter = family.get_field_type() == prometheus::proto::MetricType::COUNTER;
        for m in family.get_metric() {
            let labels = m.get_label();
            if want
                .iter()
                .all(|(k, v)| labels.iter().any(|l| l.name() == *k && l.value() == *v))
            {
                sum += if counter {
                    m.get_counter().get_value()
                } else {
                    m.get_gauge().get_value()
                };
            }
        }
    }
    if sum > 0.0 {
        sum as u64
    } else {
        0
    }
}

/// One tier's figures.
#[derive(Serialize)]
struct TierFigures {
    bytes: u64,
    objects: usize,
    /// The byte budget (`--l1-size-gb` / `--l2-size-gb`).
    capacity_bytes: u64,
    evictions: u64,
    evicted_bytes: u64,
    stores_refused: u64,
    /// Objects held by the controller's pin command.
    pinned: usize,
}

/// One controller command's runs on the node since start.
#[derive(Serialize)]
struct CommandRuns {
    command: String,
    ok: u64,
    error: u64,
}

/// Cumulative since start: the page turns deltas into rates.
#[derive(Serialize)]
struct Counters {
    get_hit: u64,
    get_miss: u64,
    exist_hit: u64,
    exist_miss: u64,
    puts: u64,
    put_bytes: u64,
    get_bytes: u64,
    bad_requests: u64,
    connections_open: u64,
    connections_total: u64,
    connections_refused: u64,
    l2_writes_ok: u64,
    l2_write_errors: u64,
    l2_reads_ok: u64,
    l2_read_errors: u64,
    l2_promotions: u64,
}

#[derive(Serialize)]
struct Feed {
    server_time: f64,
    version: &'static str,
    service: &'static str,
    l1: TierFigures,
    /// `null` without `--l2-path`.
    l2: Option<TierFigures>,
    counters: Counters,
    /// By command name; empty until the controller sends one.
    commands: Vec<CommandRuns>,
    #[serde(skip_serializing_if = "Option::is_none")]
    history: Option<HistoryPage>,
}

fn tier(tiers: &crate::node::TierUsage, m: &NodeMetrics, name: &str, pinned: usize) -> TierFigures {
    let (bytes, objects) = if name == "l1" {
        (tiers.l1_bytes, tiers.l1_objects)
    } else {
        (tiers.l2_bytes, tiers.l2_objects)
    };
    let t = [("tier", name)];
    TierFigures {
        bytes,
        objects,
        capacity_bytes: read(&m.tier_capacity_bytes, &t),
        evictions: read(&m.evictions, &t),
        evicted_bytes: read(&m.evicted_bytes, &t),
        stores_refused: read(&m.stores_refused, &t),
        pinned,
    }
}

/// `controller_commands_total` by command (its `outcome` label folded into `ok` / `error`).
fn commands(m: &NodeMetrics) -> Vec<CommandRuns> {
    let mut by: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    for family in m.controller_commands.collect() {
        for s in family.get_metric() {
            let label = |n: &str| {
                s.get_label()
                    .iter()
                    .find(|l| l.name() == n)
                    .map(|l| l.value().to_owned())
            };
            let (Some(command), Some(outcome)) = (label("command"), label("outcome")) else {
                continue;
            };
            let n = s.get_counter().get_value() as u64;
            let e = by.entry(command).or_default();
            if outcome == "ok" {
                e.0 += n;
            } else {
                e.1 += n;
            }
        }
    }
    by.into_iter()
        .map(|(command, (ok, error))| CommandRuns { command, ok, error })
        .collect()
}

fn counters(m: &NodeMetrics) -> Counters {
    let req = |command: &str, outcome: &str| {
        read(&m.requests, &[("command", command), ("outcome", outcome)])
    };
    Counters {
        get_hit: req("get", "hit"),
        get_miss: req("get", "miss"),
        exist_hit: req("exist", "hit"),
        exist_miss: req("exist", "miss"),
        puts: read(&m.requests, &[("command", "put")]),
        put_bytes: m.put_bytes.get(),
        get_bytes: m.get_bytes.get(),
        bad_requests: read(&m.bad_requests, &[]),
        connections_open: u64::try_from(m.connections_open.get()).unwrap_or(0),
        connections_total: m.connections_total.get(),
        connections_refused: m.connections_refused.get(),
        l2_writes_ok: read(&m.l2_writes, &[("outcome", "ok")]),
        l2_write_errors: read(&m.l2_writes, &[("outcome", "error")]),
        l2_reads_ok: read(&m.l2_reads, &[("outcome", "ok")]),
        l2_read_errors: read(&m.l2_reads, &[("outcome", "error")]),
        l2_promotions: m.l2_promotions.get(),
    }
}

/// Whether the node has an L2 tier (its budget gauge was set at start).
fn has_l2(m: &NodeMetrics) -> bool {
    m.tier_capacity_bytes
        .collect()
        .iter()
        .flat_map(|f| f.get_metric())
        .any(|s| s.get_label().iter().any(|l| l.value() == "l2"))
}

/// One history sample: tier gauges, then cumulative counters.
fn sample(tiers: &TieredStore, m: &NodeMetrics, now: f64) -> Sample {
    let u = tiers.usage();
    let c = counters(m);
    let ev = |t: &str| read(&m.evictions, &[("tier", t)]) as f64;
    Sample::at(now)
        .with("l1_bytes", u.l1_bytes as f64)
        .with("l2_bytes", u.l2_bytes as f64)
        .with("l1_objects", u.l1_objects as f64)
        .with("l2_objects", u.l2_objects as f64)
        .with("hit", c.get_hit as f64)
        .with("miss", c.get_miss as f64)
        .with("evict_l1", ev("l1"))
        .with("evict_l2", ev("l2"))
        .with("put_bytes", c.put_bytes as f64)
        .with("get_bytes", c.get_bytes as f64)
}

/// `GET /api/dashboard[?history=1]`.
pub(super) async fn feed(State(d): State<AppState>, Query(q): Query<HistoryQuery>) -> Response {
    let usage = d.tiers.usage();
    let m = &d.metrics;
    let (l1_pinned, l2_pinned) = d.tiers.held_counts();
    let body = Feed {
        server_time: (unix_now() * 1000.0).round() / 1000.0,
        version: env!("CARGO_PKG_VERSION"),
        service: "node",
        l1: tier(&usage, m, "l1", l1_pinned),
        l2: has_l2(m).then(|| tier(&usage, m, "l2", l2_pinned)),
        counters: counters(m),
        commands: commands(m),
        history: q.page(&d.history),
    };
    feed_response(&body)
}
