//! The live dashboard of the controller: the `frontend/` folder (served by
//! [`crate::web::assets`]) at `/` ([`page`]) and `/static/*` ([`static_file`]), and the one
//! JSON feed it polls ([`feed`]),
//! `GET /api/dashboard`, with on request the server-side history ([`crate::web::history`], as
//! every service's page: the cumulative counters the charts draw, sampled every 2 s for 15
//! minutes, so the charts are full on open).
//!
//! Owns only read access to the shared state, all of it in [`snapshot`]: one read lock on the
//! index per feed request (never held across an `.await`), in which only the requested page of
//! workers is built, and atomic reads of the metric counters. The dashboard's actions go to
//! the orchestration routes (`/clear`, `/pin`, `/move`, `/health`), not here.

use super::counters::{counters, Counters};
use crate::controller::model::index::{LocationView, WorkerView};
use crate::controller::Driver;
use crate::web::error::{ApiError, FieldError};
use crate::web::history::{feed_response, spawn_sampler, History, HistoryPage, Sample};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The dashboards' files, compiled into the binary once for every service.
use crate::web::assets::{asset, Frontend};

/// `GET /`: the page (`frontend/index.html`).
pub(super) async fn page(headers: HeaderMap) -> Response {
    asset::<Frontend>("index.html", &headers)
}

/// `GET /static/{*path}`: its scripts, styles and images (`frontend/static/`).
pub(super) async fn static_file(Path(path): Path<String>, headers: HeaderMap) -> Response {
    asset::<Frontend>(&format!("static/{path}"), &headers)
}

/// The values a history sample holds (the charts' five counters).
const HISTORY_SERIES: usize = 5;

/// An empty history, never sampled (a router built for tests).
pub(crate) fn history() -> Arc<History> {
    Arc::new(History::dashboard(HISTORY_SERIES))
}

/// The history of a serving controller: its counters sampled every 2 s, the first at once,
/// until the controller stops (the sampler holds it weakly and ends at its shutdown).
pub(crate) fn sampled_history(shared: &Arc<Driver>) -> Arc<History> {
    let history = history();
    let driver = Arc::downgrade(shared);
    spawn_sampler(&history, move || {
        let taken = driver
            .upgrade()
            .filter(|d| !d.shutdown_token().is_cancelled())
            .map(|d| sample(&d, d.now()));
        std::future::ready(taken)
    });
    history
}

/// One history sample at Unix time `now`: the cumulative counters the charts turn into rates
/// (ops admitted, ops evicted, P2P lookup hits, misses, frames dropped).
fn sample(shared: &Driver, now: f64) -> Sample {
    let c = counters(shared);
    Sample::at(now)
        .with("admit", c.ops_admit as f64)
        .with("evict", c.ops_evict as f64)
        .with("hit", c.p2p_lookup_hit as f64)
        .with("miss", c.p2p_lookup_miss as f64)
        .with("dropped", c.frames_dropped as f64)
}

// ---------------------------------------------------------------------------------------------
// GET /api/dashboard
// ---------------------------------------------------------------------------------------------

/// `?offset=&limit=` of the workers page (default: every worker); `?history=1` adds the
/// server-side history (the page asks for it on its first poll).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FeedQuery {
    offset: Option<usize>,
    limit: Option<usize>,
    history: Option<u8>,
}

/// The feed: everything the page shows, from one lock and one serialisation.
#[derive(Serialize)]
struct Feed {
    /// Server wall clock (Unix seconds): the page computes heartbeat ages against it.
    server_time: f64,
    version: &'static str,
    config: FeedConfig,
    totals: Totals,
    /// Cumulative since start: the page turns deltas into rates.
    counters: Counters,
    workers: WorkerPage,
    /// This controller's place in its `--cluster` (`GET /controller/cluster`); absent when
    /// standalone.
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<serde_json::Value>,
    /// Cumulative counters sampled every few seconds by the server (with `?history=1`).
    #[serde(skip_serializing_if = "Option::is_none")]
    history: Option<HistoryPage>,
}

#[derive(Serialize)]
struct FeedConfig {
    worker_timeout_s: f64,
    health_check_interval_s: Option<f64>,
    downlink_timeout_s: f64,
    sync_completion_threshold: f64,
    status: StatusRule,
}

/// How the page turns a worker's last contact into its status: the controller's own rule,
/// served so the page hard-codes no threshold.
#[derive(Serialize)]
struct StatusRule {
    /// The row column the age is taken from: `last_seen`, the last message of any kind
    /// (heartbeat, admit/evict batch, probe answer, …), not the heartbeat alone.
    basis: &'static str,
    /// Contact younger than this: `active` (`--lmcache-worker-timeout`, the silence the
    /// controller tolerates before probing).
    active_s: f64,
    /// Contact younger than this: `warning` (silent, probe due or under way); older:
    /// `inactive` (the probe is overdue: liveness sweeps are off or the worker is stuck).
    warning_s: f64,
}

#[derive(Serialize)]
struct Totals {
    instances: usize,
    workers: usize,
    keys: u64,
    syncing: usize,
    sync_completed: usize,
    sync_missing_batches: u64,
    global_sync_progress: f64,
}

/// Column names of [`FeedRow`], sent once so the array form stays self-describing.
const COLUMNS: [&str; 13] = [
    "instance_id",
    "worker_id",
    "ip",
    "port",
    "peer_init_url",
    "registration_time",
    "last_heartbeat_time",
    "last_seen",
    "key_count",
    "locations",
    "sync",
    "heartbeated",
    "protocol",
];

#[derive(Serialize)]
struct WorkerPage {
    total: usize,
    offset: usize,
    columns: [&'static str; 13],
    /// Location entries are `[name, key_count, last_seq]`.
    location_columns: [&'static str; 3],
    rows: Vec<FeedRow>,
}

/// One worker as a JSON array (about a third of the object form's size), in [`COLUMNS`] order.
#[derive(Serialize)]
struct FeedRow(
    String,
    i64,
    String,
    u16,
    Option<String>,
    f64,
    f64,
    f64,
    u64,
    Vec<(String, u64, Option<i64>)>,
    Option<SyncInfo>,
    bool,
    &'static str,
);

/// A worker's full-sync state; `null` in the row while it is idle.
#[derive(Serialize)]
struct SyncInfo {
    state: &'static str,
    sync_id: Option<String>,
    location: Option<String>,
    progress: f64,
    received_batches: u64,
    expected_batches: u64,
    missing_batches: u64,
    expected_keys: i64,
    received_keys: u64,
    end_total_keys: Option<i64>,
    start_time: Option<f64>,
    failure: Option<&'static str>,
}

/// Unix seconds rounded to the millisecond (shorter JSON, no loss that matters).
fn ms(t: f64) -> f64 {
    (t * 1000.0).round() / 1000.0
}

impl From<WorkerView> for FeedRow {
    fn from(w: WorkerView) -> Self {
        let s = w.sync;
        let sync = (s.state != "idle").then(|| SyncInfo {
            state: s.state,
            sync_id: s.sync_id,
            location: s.location,
            progress: s.progress,
            received_batches: s.received_batches,
            expected_batches: s.expected_batches,
            missing_batches: s.missing_batches,
            expected_keys: s.expected_keys,
            received_keys: s.received_keys,
            end_total_keys: s.end_total_keys,
            start_time: s.start_time.map(ms),
            failure: s.failure,
        });
        let heartbeated = w.last_heartbeat_time > w.registration_time;
        FeedRow(
            w.instance_id,
            w.worker_id,
            w.ip,
            w.port,
            w.peer_init_url,
            ms(w.registration_time),
            ms(w.last_heartbeat_time),
            ms(w.last_seen),
            w.key_count,
            w.locations
                .into_iter()
                .map(
                    |LocationView {
                         name,
                         key_count,
                         last_seq,
                     }| (name, key_count, last_seq),
                )
                .collect(),
            sync,
            heartbeated,
            w.wire.label(),
        )
    }
}

/// Everything the feed reads from the controller's state, in one read lock: the totals and
/// `limit` workers from `offset` (only those are built), with the total worker count.
fn snapshot(shared: &Driver, offset: usize, limit: usize) -> (Totals, Vec<WorkerView>) {
    let index = shared.index();
    let (syncing, sync_completed, sync_missing_batches) = index.sync_counts();
    let totals = Totals {
        instances: index.instance_count(),
        workers: index.worker_count(),
        keys: index.key_count(),
        syncing,
        sync_completed,
        sync_missing_batches,
        global_sync_progress: index.global_sync_progress(),
    };
    let page = index.workers_page(offset, limit);
    (totals, page)
}

/// `GET /api/dashboard[?offset=N&limit=N][&history=1]`: totals, counters and a page of
/// workers (all of them by default) in registration order, as compact rows. The history is
/// the [`History`] the router was built with (an `Extension`).
pub(super) async fn feed(
    State(shared): State<Arc<Driver>>,
    history: Option<Extension<Arc<History>>>,
    query: Result<Query<FeedQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| {
        ApiError::field(FieldError::new(
            "query_invalid",
            vec!["query".into()],
            e.body_text(),
            serde_json::Value::Null,
        ))
    })?;
    if q.history.is_some_and(|h| h > 1) {
        return Err(ApiError::field(FieldError::new(
            "enum",
            vec!["query".into(), "history".into()],
            "Input should be 0 or 1",
            q.history.into(),
        )));
    }
    let offset = q.offset.unwrap_or(0);
    let (totals, views) = snapshot(&shared, offset, q.limit.unwrap_or(usize::MAX));
    let server_time = shared.now();
    let total = totals.workers;
    let rows = views.into_iter().map(FeedRow::from).collect();
    let config = &shared.config;
    let interval = config.health_check_interval.map(|d| d.as_secs_f64());
    let worker_timeout_s = config.worker_timeout.as_secs_f64();
    let body = Feed {
        server_time: ms(server_time),
        version: env!("CARGO_PKG_VERSION"),
        config: FeedConfig {
            worker_timeout_s,
            health_check_interval_s: interval,
            downlink_timeout_s: config.downlink_timeout.as_secs_f64(),
            sync_completion_threshold: config.full_sync_completion_threshold,
            status: StatusRule {
                basis: "last_seen",
                active_s: worker_timeout_s,
                warning_s: worker_timeout_s
                    + interval.unwrap_or(0.0)
                    + config.downlink_timeout.as_secs_f64(),
            },
        },
        totals,
        counters: counters(&shared),
        workers: WorkerPage {
            total,
            offset: offset.min(total),
            columns: COLUMNS,
            location_columns: ["name", "key_count", "last_seq"],
            rows,
        },
        cluster: shared.cluster().map(|c| c.json()),
        history: match (q.history, history) {
            (Some(1), Some(Extension(h))) => Some(h.page()),
            _ => None,
        },
    };
    Ok(feed_response(&body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServeConfig;
    use crate::protocol::{ChunkHash, KVOpEvent, OpType};
    use crate::web::testing::{body_bytes, ctype, get_req, json};
    use axum::http::{header, StatusCode};
    use axum::Router;
    use serde_json::Value;
    use std::time::Duration;

    fn app(shared: &Arc<Driver>) -> Router {
        crate::controller::routes::router(Arc::clone(shared))
    }

    fn shared() -> Arc<Driver> {
        Arc::new(Driver::new(ServeConfig::ephemeral(), None))
    }

    fn ops(keys: std::ops::Range<i64>, first_seq: i64) -> Vec<KVOpEvent> {
        keys.enumerate()
            .map(|(i, k)| KVOpEvent {
                op_type: OpType::Admit,
                key: ChunkHash::from_i64(k),
                seq_num: first_seq + i as i64,
            })
            .collect()
    }

    #[tokio::test]
    async fn feed_reports_totals_counters_and_worker_rows() {
        let s = shared();
        {
            let mut ix = s.index_mut_for_tests();
            ix.register("inst-a", 0, "10.0.0.1", 8000, Some("10.0.0.1:9000"), 100.0)
                .expect("register");
            ix.register("inst-a", 1, "10.0.0.2", 8001, None, 101.0)
                .expect("register");
            ix.register("inst-b", 0, "10.0.0.3", 8002, None, 102.0)
                .expect("register");
            ix.heartbeat("inst-a", 0, "10.0.0.1", 8000, Some("10.0.0.1:9000"), 150.0)
                .expect("heartbeat");
            ix.apply_batch("inst-a", 0, "LocalCPUBackend", &ops(0..5, 0), 151.0);
            ix.apply_batch("inst-b", 0, "LocalDiskBackend", &ops(0..3, 0), 151.0);
            ix.sync_start("inst-a", 1, "LocalCPUBackend", "sync-1", 4000, 4, 152.0)
                .expect("sync starts");
            ix.sync_batch("inst-a", 1, "LocalCPUBackend", "sync-1", 0, &[], 153.0);
        }
        s.metrics
            .ops_applied
            .with_label_values(&["admit"])
            .inc_by(8);
        s.metrics.p2p_lookups.with_label_values(&["hit"]).inc_by(3);
        s.metrics.dropped("pull", "malformed");
        s.metrics.dropped("reply", "malformed");
        s.metrics.dropped("pull", "too_large");

        let resp = get_req(app(&s), "/api/dashboard", &[]).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(ctype(&resp), "application/json");
        assert_eq!(resp.headers()[header::CACHE_CONTROL], "no-store");
        assert_eq!(resp.headers()[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        let v = json(resp).await;
        assert!(v["server_time"].as_f64().expect("time") > 1.6e9);
        let t = &v["totals"];
        assert_eq!(t["instances"], 2);
        assert_eq!(t["workers"], 3);
        assert_eq!(t["keys"], 8);
        assert_eq!(t["syncing"], 1);
        let progress = t["global_sync_progress"].as_f64().expect("f64");
        assert!((progress - 2.0 / 3.0).abs() < 1e-9);
        let c = &v["counters"];
        assert_eq!(c["ops_admit"], 8);
        assert_eq!(c["ops_evict"], 0);
        assert_eq!(c["p2p_lookup_hit"], 3);
        assert_eq!(c["frames_dropped"], 3);
        assert_eq!(c["frames_dropped_by_reason"]["malformed"], 2);
        assert_eq!(v["config"]["sync_completion_threshold"], 0.8);

        let w = &v["workers"];
        assert_eq!(w["total"], 3);
        let cols: Vec<&str> = w["columns"]
            .as_array()
            .expect("columns")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(cols, COLUMNS);
        let rows = w["rows"].as_array().expect("rows");
        assert_eq!(rows.len(), 3);
        let col = |name: &str| cols.iter().position(|c| *c == name).expect("column");
        let a0 = &rows[0];
        assert_eq!(a0[col("instance_id")], "inst-a");
        assert_eq!(a0[col("worker_id")], 0);
        assert_eq!(a0[col("ip")], "10.0.0.1");
        assert_eq!(a0[col("port")], 8000);
        assert_eq!(a0[col("peer_init_url")], "10.0.0.1:9000");
        assert_eq!(a0[col("registration_time")], 100.0);
        assert_eq!(a0[col("last_heartbeat_time")], 150.0);
        assert_eq!(a0[col("key_count")], 5);
        assert_eq!(a0[col("heartbeated")], true);
        assert_eq!(
            a0[col("locations")],
            serde_json::json!([["LocalCPUBackend", 5, 4]])
        );
        assert_eq!(a0[col("sync")], Value::Null, "idle is null");
        let a1 = &rows[1];
        assert_eq!(a1[col("heartbeated")], false, "never heartbeated");
        assert_eq!(a1[col("peer_init_url")], Value::Null);
        let sync = &a1[col("sync")];
        assert_eq!(sync["state"], "syncing");
        assert_eq!(sync["sync_id"], "sync-1");
        assert_eq!(sync["received_batches"], 1);
        assert_eq!(sync["expected_batches"], 4);
        assert_eq!(sync["missing_batches"], 3);
        assert_eq!(sync["progress"], 0.25);
        assert_eq!(rows[2][col("instance_id")], "inst-b");
    }

    #[tokio::test]
    async fn feed_serves_the_status_rule_and_on_request_the_history() {
        let s = shared();
        let history = history();
        for t in 0..3 {
            s.metrics
                .ops_applied
                .with_label_values(&["admit"])
                .inc_by(5);
            history.push(&sample(&s, 1000.0 + 2.0 * f64::from(t)));
        }
        let app = || super::super::router_with(Arc::clone(&s), Arc::clone(&history));
        let v = json(get_req(app(), "/api/dashboard", &[]).await).await;
        assert!(v.get("history").is_none(), "only on request");
        let rule = &v["config"]["status"];
        assert_eq!(rule["basis"], "last_seen");
        assert_eq!(rule["active_s"], 300.0, "the worker timeout");
        assert_eq!(
            rule["warning_s"], 302.0,
            "plus the probe's downlink timeout"
        );
        let v = json(get_req(app(), "/api/dashboard?history=1", &[]).await).await;
        let h = &v["history"];
        assert_eq!(h["interval_s"], 2.0);
        assert_eq!(
            h["columns"],
            serde_json::json!(["t", "admit", "evict", "hit", "miss", "dropped"])
        );
        assert_eq!(
            h["rows"],
            serde_json::json!([
                [1000, 5, 0, 0, 0, 0],
                [1002, 10, 0, 0, 0, 0],
                [1004, 15, 0, 0, 0, 0]
            ])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_history_is_sampled_every_two_seconds_until_the_controller_stops() {
        let s = shared();
        let history = sampled_history(&s);
        s.metrics
            .ops_applied
            .with_label_values(&["evict"])
            .inc_by(7);
        // The first sample at once, then one every 2 s (paused time).
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(history.len(), 6);
        assert_eq!(history.page().rows[5].0[2], Some(7.0), "cumulative evicts");
        s.shutdown_token().cancel();
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(history.len(), 6, "no sample once the controller stops");
    }

    #[tokio::test]
    async fn feed_pages_and_rejects_bad_queries() {
        let s = shared();
        {
            let mut ix = s.index_mut_for_tests();
            for i in 0..5 {
                ix.register("inst", i, "127.0.0.1", 9000, None, 1.0)
                    .expect("register");
            }
        }
        let v = json(get_req(app(&s), "/api/dashboard?offset=3&limit=10", &[]).await).await;
        assert_eq!(v["workers"]["total"], 5);
        assert_eq!(v["workers"]["offset"], 3);
        let rows = v["workers"]["rows"].as_array().expect("rows");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0][1], 3);
        let v = json(get_req(app(&s), "/api/dashboard?limit=0", &[]).await).await;
        assert_eq!(v["workers"]["rows"].as_array().map(Vec::len), Some(0));
        assert_eq!(v["totals"]["workers"], 5);
        let v = json(get_req(app(&s), "/api/dashboard?offset=99", &[]).await).await;
        assert_eq!(v["workers"]["offset"], 5);

        for bad in ["?limit=-1", "?offset=x", "?page=2", "?history=2"] {
            let resp = get_req(app(&s), &format!("/api/dashboard{bad}"), &[]).await;
            assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
            let v = json(resp).await;
            assert!(
                v["detail"][0]["msg"]
                    .as_str()
                    .is_some_and(|d| !d.is_empty()),
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn feed_of_a_thousand_workers_is_one_compact_answer() {
        let s = shared();
        {
            let mut ix = s.index_mut_for_tests();
            for i in 0..1000 {
                let inst = format!("instance-{:03}", i / 8);
                ix.register(&inst, i % 8, "10.1.2.3", 8000, Some("10.1.2.3:9000"), 1.7e9)
                    .expect("register");
                ix.apply_batch(
                    &inst,
                    i % 8,
                    "LocalCPUBackend",
                    &ops(i * 10..i * 10 + 10, 0),
                    1.7e9,
                );
            }
        }
        let resp = get_req(app(&s), "/api/dashboard", &[]).await;
        let bytes = body_bytes(resp).await;
        let v: Value = serde_json::from_slice(&bytes).expect("JSON");
        assert_eq!(v["workers"]["rows"].as_array().map(Vec::len), Some(1000));
        assert_eq!(v["totals"]["keys"], 10_000);
        // ~150 bytes a worker.
        assert!(bytes.len() < 250_000, "{} bytes", bytes.len());
    }
}
