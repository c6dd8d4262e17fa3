//! The live dashboard: the `frontend/` folder embedded with `rust-embed`, served at `/` and
//! `/static/*`, and the one JSON feed it polls, `GET /api/dashboard`.
//!
//! Owns only read access to the shared state: one read lock on the index per feed request
//! (never held across an `.await`) and atomic reads of the metric counters. The dashboard's
//! actions go to the orchestration routes (`/clear`, `/pin`, `/move`, `/health`), not here.
//!
//! Asset rules: `/` is `index.html`; `/static/<path>` is `frontend/static/<path>`; anything
//! else under `/static/` is a 404, so no fallback ever shadows an API route. Every answer
//! carries a strong `ETag` (the file's SHA-256) with `Cache-Control: no-cache`, so a browser
//! revalidates with `If-None-Match` and gets a 304 until the binary changes. A
//! `Content-Security-Policy` of `'self'` only makes the browser itself refuse any request
//! that would leave the host.

use crate::controller::Shared;
use crate::index::{LocationView, WorkerView};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use prometheus::core::Collector;
use prometheus::IntCounterVec;
use rust_embed::RustEmbed;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The dashboard's files, compiled into the binary (read from disk in debug builds).
#[derive(RustEmbed)]
#[folder = "frontend/"]
struct Assets;

/// The page's security policy: nothing but this origin, no inline script or style sheet.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// The dashboard routes, merged into the API router before its state is attached.
pub fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/", get(index_page))
        .route("/static/{*path}", get(static_asset))
        .route("/api/dashboard", get(feed))
}

async fn index_page(headers: HeaderMap) -> Response {
    asset("index.html", &headers)
}

async fn static_asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    asset(&format!("static/{path}"), &headers)
}

/// Serves one embedded file, or a JSON 404.
fn asset(path: &str, headers: &HeaderMap) -> Response {
    let file = if path.split('/').any(|seg| seg.is_empty() || seg == "..") {
        None
    } else {
        Assets::get(path)
    };
    let Some(file) = file else {
        return (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({ "detail": "Not Found" })),
        )
            .into_response();
    };
    let etag = format!("\"{}\"", hex(&file.metadata.sha256_hash()[..16]));
    let common = [
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
    ];
    let etag_value = HeaderValue::from_str(&etag).unwrap_or(HeaderValue::from_static("\"\""));
    let matches = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    if matches {
        return (
            StatusCode::NOT_MODIFIED,
            common,
            [(header::ETAG, etag_value)],
        )
            .into_response();
    }
    (
        common,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static(content_type(path)),
            ),
            (header::ETAG, etag_value),
        ],
        file.data.into_owned(),
    )
        .into_response()
}

/// The content type of an asset, from its extension (the few kinds `frontend/` holds).
fn content_type(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map_or("", |(_, e)| e);
    match ext.to_ascii_lowercase().as_str() {
        "html" | "htm" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "json" | "map" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "webmanifest" => "application/manifest+json",
        "woff2" => "font/woff2",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

// ---------------------------------------------------------------------------------------------
// GET /api/dashboard
// ---------------------------------------------------------------------------------------------

/// `?offset=&limit=` of the workers page (default: every worker).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FeedQuery {
    offset: Option<usize>,
    limit: Option<usize>,
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
}

#[derive(Serialize)]
struct FeedConfig {
    worker_timeout_s: f64,
    health_check_interval_s: Option<f64>,
    downlink_timeout_s: f64,
    sync_completion_threshold: f64,
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

#[derive(Serialize)]
struct Counters {
    ops_admit: u64,
    ops_evict: u64,
    p2p_lookup_hit: u64,
    p2p_lookup_miss: u64,
    frames_received: u64,
    frames_dropped: u64,
    frames_dropped_by_reason: BTreeMap<String, u64>,
    batches_discarded: u64,
    seq_discontinuities: u64,
    downlink_ok: u64,
    downlink_timeout: u64,
    downlink_error: u64,
    workers_removed: u64,
}

/// Column names of [`Row`], sent once so the array form stays self-describing.
const COLUMNS: [&str; 12] = [
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
];

#[derive(Serialize)]
struct WorkerPage {
    total: usize,
    offset: usize,
    columns: [&'static str; 12],
    /// Location entries are `[name, key_count, last_seq]`.
    location_columns: [&'static str; 3],
    rows: Vec<Row>,
}

/// One worker as a JSON array (about a third of the object form's size), in [`COLUMNS`] order.
#[derive(Serialize)]
struct Row(
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

impl From<WorkerView> for Row {
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
        Row(
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
        )
    }
}

/// Sum of a counter vector's children whose `label` is `value` (every child if `label` is
/// empty).
fn counter_sum(vec: &IntCounterVec, label: &str, value: &str) -> u64 {
    vec.collect()
        .iter()
        .flat_map(|family| family.get_metric())
        .filter(|m| {
            label.is_empty()
                || m.get_label()
                    .iter()
                    .any(|l| l.name() == label && l.value() == value)
        })
        .map(|m| m.get_counter().get_value() as u64)
        .sum()
}

/// Per-`label` sums of a counter vector.
fn counter_by(vec: &IntCounterVec, label: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for family in vec.collect() {
        for m in family.get_metric() {
            if let Some(l) = m.get_label().iter().find(|l| l.name() == label) {
                *out.entry(l.value().to_owned()).or_insert(0) += m.get_counter().get_value() as u64;
            }
        }
    }
    out
}

fn counters(shared: &Shared) -> Counters {
    let m = &shared.metrics;
    let frames_dropped_by_reason = counter_by(&m.frames_dropped, "reason");
    Counters {
        ops_admit: counter_sum(&m.ops_applied, "op", "admit"),
        ops_evict: counter_sum(&m.ops_applied, "op", "evict"),
        p2p_lookup_hit: counter_sum(&m.p2p_lookups, "result", "hit"),
        p2p_lookup_miss: counter_sum(&m.p2p_lookups, "result", "miss"),
        frames_received: counter_sum(&m.frames_received, "", ""),
        frames_dropped: frames_dropped_by_reason.values().sum(),
        frames_dropped_by_reason,
        batches_discarded: counter_sum(&m.batches_discarded, "", ""),
        seq_discontinuities: m.seq_discontinuities.get(),
        downlink_ok: counter_sum(&m.downlink_requests, "outcome", "ok"),
        downlink_timeout: counter_sum(&m.downlink_requests, "outcome", "timeout"),
        downlink_error: counter_sum(&m.downlink_requests, "outcome", "error"),
        workers_removed: counter_sum(&m.workers_removed, "", ""),
    }
}

/// `GET /api/dashboard[?offset=N&limit=N]`: totals, counters and a page of workers (all of
/// them by default) in registration order, as compact rows.
async fn feed(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<FeedQuery>, QueryRejection>,
) -> Response {
    let q = match query {
        Ok(Query(q)) => q,
        Err(e) => {
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                Json(serde_json::json!({ "detail": e.body_text() })),
            )
                .into_response()
        }
    };
    let (totals, views) = {
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
        (totals, index.workers())
    };
    let server_time = shared.now();
    let total = views.len();
    let offset = q.offset.unwrap_or(0).min(total);
    let limit = q.limit.unwrap_or(usize::MAX);
    let rows = views
        .into_iter()
        .skip(offset)
        .take(limit)
        .map(Row::from)
        .collect();
    let config = &shared.config;
    let body = Feed {
        server_time: ms(server_time),
        version: env!("CARGO_PKG_VERSION"),
        config: FeedConfig {
            worker_timeout_s: config.worker_timeout.as_secs_f64(),
            health_check_interval_s: config.health_check_interval.map(|d| d.as_secs_f64()),
            downlink_timeout_s: config.downlink_timeout.as_secs_f64(),
            sync_completion_threshold: config.full_sync_completion_threshold,
        },
        totals,
        counters: counters(&shared),
        workers: WorkerPage {
            total,
            offset,
            columns: COLUMNS,
            location_columns: ["name", "key_count", "last_seq"],
            rows,
        },
    };
    ([(header::CACHE_CONTROL, "no-store")], Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServeConfig;
    use crate::protocol::{ChunkHash, KVOpEvent, OpType};
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use serde_json::Value;
    use tower::ServiceExt;

    fn app(shared: &Arc<Shared>) -> Router {
        routes().with_state(Arc::clone(shared))
    }

    fn shared() -> Arc<Shared> {
        Arc::new(Shared::new(ServeConfig::ephemeral(), None))
    }

    async fn get_req(app: Router, uri: &str, headers: &[(&str, &str)]) -> Response {
        let mut req = Request::get(uri);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        app.oneshot(req.body(Body::empty()).expect("request"))
            .await
            .expect("infallible")
    }

    async fn body_bytes(resp: Response) -> Vec<u8> {
        resp.into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes()
            .to_vec()
    }

    async fn json(resp: Response) -> Value {
        serde_json::from_slice(&body_bytes(resp).await).expect("JSON body")
    }

    fn ctype(resp: &Response) -> &str {
        resp.headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    #[tokio::test]
    async fn assets_are_served_with_their_types_and_unknown_paths_are_404() {
        let s = shared();
        let cases = [
            ("/", "text/html; charset=utf-8"),
            ("/static/app.js", "text/javascript; charset=utf-8"),
            ("/static/app.css", "text/css; charset=utf-8"),
            ("/static/favicon.svg", "image/svg+xml"),
        ];
        for (path, want) in cases {
            let resp = get_req(app(&s), path, &[]).await;
            assert_eq!(resp.status(), StatusCode::OK, "{path}");
            assert_eq!(ctype(&resp), want, "{path}");
            let h = resp.headers();
            assert_eq!(h[header::CACHE_CONTROL], "no-cache", "{path}");
            assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{path}");
            assert!(h.contains_key(header::ETAG), "{path}");
            assert!(!body_bytes(resp).await.is_empty(), "{path}");
        }
        // No fallback to index.html: unknown assets, traversal, the bare folder and paths
        // outside the dashboard's routes are all 404 (API routes are never shadowed).
        for path in [
            "/static/missing.js",
            "/static/../index.html",
            "/static/%2e%2e/index.html",
            "/static//app.js",
            "/static/",
            "/index.html",
            "/workers",
            "/controller/workers",
            "/api/dashboard/extra",
        ] {
            let resp = get_req(app(&s), path, &[]).await;
            assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{path}");
        }
        let resp = get_req(app(&s), "/static/nope.css", &[]).await;
        assert_eq!(ctype(&resp), "application/json");
        assert_eq!(json(resp).await["detail"], "Not Found");
    }

    #[tokio::test]
    async fn every_embedded_static_file_is_served_with_a_known_type() {
        let s = shared();
        let mut served = 0;
        for path in Assets::iter() {
            if path
                .rsplit('/')
                .next()
                .is_some_and(|name| name.starts_with('.'))
            {
                continue; // never reachable: `/static/` maps only into frontend/static/
            }
            let Some(rest) = path.strip_prefix("static/") else {
                assert_eq!(path, "index.html", "only index.html lives outside static/");
                continue;
            };
            let resp = get_req(app(&s), &format!("/static/{rest}"), &[]).await;
            assert_eq!(resp.status(), StatusCode::OK, "{path}");
            assert_ne!(ctype(&resp), "application/octet-stream", "{path}");
            served += 1;
        }
        assert!(served >= 5, "app.js, its modules, app.css, favicon.svg");
    }

    #[tokio::test]
    async fn etag_revalidation_answers_304() {
        let s = shared();
        let first = get_req(app(&s), "/static/app.js", &[]).await;
        let etag = first.headers()[header::ETAG]
            .to_str()
            .expect("ascii")
            .to_owned();
        let again = get_req(app(&s), "/static/app.js", &[("if-none-match", &etag)]).await;
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        assert!(body_bytes(again).await.is_empty());
        let stale = get_req(app(&s), "/static/app.js", &[("if-none-match", "\"x\"")]).await;
        assert_eq!(stale.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn the_page_references_only_embedded_same_origin_assets() {
        let s = shared();
        let resp = get_req(app(&s), "/", &[]).await;
        let csp = resp.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .expect("ascii")
            .to_owned();
        assert!(csp.contains("connect-src 'self'") && csp.contains("default-src 'none'"));
        let html = String::from_utf8(body_bytes(resp).await).expect("utf-8");
        assert!(
            !html.contains("http://") && !html.contains("https://"),
            "no remote URL"
        );
        for attr in ["src=\"", "href=\""] {
            for (i, _) in html.match_indices(attr) {
                let url = &html[i + attr.len()..];
                let url = &url[..url.find('"').expect("closed attribute")];
                if url.starts_with('#') {
                    continue;
                }
                let path = url.split('?').next().unwrap_or(url);
                let resp = get_req(app(&s), path, &[]).await;
                assert_eq!(resp.status(), StatusCode::OK, "{url} is embedded");
            }
        }
    }

    #[test]
    fn content_types_by_extension() {
        assert_eq!(content_type("a/b.HTML"), "text/html; charset=utf-8");
        assert_eq!(content_type("x.mjs"), "text/javascript; charset=utf-8");
        assert_eq!(content_type("x.png"), "image/png");
        assert_eq!(content_type("x.woff2"), "font/woff2");
        assert_eq!(content_type("noext"), "application/octet-stream");
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

        for bad in ["?limit=-1", "?offset=x", "?page=2"] {
            let resp = get_req(app(&s), &format!("/api/dashboard{bad}"), &[]).await;
            assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
            let v = json(resp).await;
            assert!(v["detail"].as_str().is_some_and(|d| !d.is_empty()), "{bad}");
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
        let start = std::time::Instant::now();
        let resp = get_req(app(&s), "/api/dashboard", &[]).await;
        let bytes = body_bytes(resp).await;
        let took = start.elapsed();
        let v: Value = serde_json::from_slice(&bytes).expect("JSON");
        assert_eq!(v["workers"]["rows"].as_array().map(Vec::len), Some(1000));
        assert_eq!(v["totals"]["keys"], 10_000);
        // ~150 bytes a worker; generous bounds so a slow CI machine never flakes.
        assert!(bytes.len() < 250_000, "{} bytes", bytes.len());
        assert!(took < std::time::Duration::from_secs(2), "{took:?}");
    }
}
