//! The node's HTTP listener (`--http-port`) and its one route table ([`table`]): the axum
//! router, the access policy and `/openapi.json` are derived from it, so each route's path,
//! access class, body and answers are written once, here. The handlers live in the file of
//! their resource: the coordinator's objects (`objects`) and warm prefetch (`prefetch`), the
//! controller's pins (`pins`), the dashboard (`dashboard`); every refusal with its status in
//! `error`.

mod dashboard;
mod error;
mod objects;
mod pins;
mod prefetch;

use crate::node::config::NodeConfig;
use crate::node::metrics::NodeMetrics;
use crate::node::model::keys::TokenChunks;
use crate::node::model::prefetches::Prefetches;
use crate::node::tiers::TieredStore;
use crate::web::access::Access::{Peer, Read, Write};
use crate::web::exposition::Exposition;
use crate::web::history::History;
use crate::web::json::ErrorStyle;
use crate::web::limits::{RefusalCounter, WebLimit};
use crate::web::metrics_layer::HttpMetrics;
use crate::web::route::{delete, get, post, Routes};
use crate::web::stack::{Guard, Stack};
use axum::extract::State;
use axum::response::IntoResponse;
use axum::Router;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What the routes reach.
#[derive(Clone)]
struct AppState {
    tiers: Arc<TieredStore>,
    metrics: Arc<NodeMetrics>,
    prefetches: Arc<Prefetches>,
    chunks: TokenChunks,
    /// The dashboard's figures over time (its sampler ends when the router is dropped).
    history: Arc<History>,
}

/// An `i64` in a body's schema.
fn i64_schema() -> Value {
    json!({"type": "integer", "minimum": i64::MIN, "maximum": i64::MAX})
}

/// The coordinator's objects: `GET` lists a page, `DELETE` evicts (one path, two routes).
const OBJECTS: &str = "/cache/objects";

/// Every HTTP route of the node. The coordinator's calls, which LMCache's coordinator makes
/// without a token, are `Peer` (`--api-token-peers` covers them); `POST /unpin`, an
/// operator's, writes.
fn table() -> Routes<AppState> {
    Routes::new("node", "kvplane node")
        // `ok\n`, as the node has always answered (its probes read the status only).
        .health(|| async { "ok\n" })
        .ready(|| async { "ok\n" })
        .metrics(metrics_route)
        .route(
            get(OBJECTS, Read, "Keys held, by tier, one page")
                .query(
                    "tier",
                    json!({"type": "string", "enum": ["l1", "l2"]}),
                    false,
                )
                .query(
                    "page_size",
                    json!({"type": "integer", "minimum": 1, "maximum": u64::MAX,
                        "description": "at most 1000 keys are listed whatever is asked, as \
                            LMCache's MP server"}),
                    false,
                )
                .query("page_token", json!({"type": "string"}), false)
                .answers(&[
                    (200, "A page of keys"),
                    (400, "A query that does not parse"),
                    (422, "A tier other than l1 or l2, or a page_size of 0"),
                ])
                .to(objects::list),
        )
        .route(
            delete(OBJECTS, Peer, "Delete objects (a coordinator's eviction)")
                .body::<objects::DeleteKeysBody>()
                .answers(&[
                    (200, "Deleted"),
                    (503, "The tier includes l2 and the node has no L2"),
                ])
                .to(objects::delete),
        )
        .route(get("/pins", Read, "Pinned objects").to(pins::list))
        .route(
            post("/unpin", Write, "Unpin what a controller's /pin pinned")
                .optional_body::<pins::UnpinBody>()
                .to(pins::unpin),
        )
        .route(
            post("/cache/prefetches", Peer, "Warm prefetch (a coordinator's)")
                .body::<prefetch::PrefetchBody>()
                .answers(&[
                    (202, "Submitted, or a noop (no complete chunk)"),
                    (503, "1,024 prefetches are running"),
                ])
                .to(prefetch::submit),
        )
        .route(get("/cache/prefetches/{request}", Read, "A prefetch's progress").to(prefetch::poll))
        .route(get("/", Read, "The node's dashboard page").to(dashboard::page))
        .route(get("/api/dashboard", Read, "The dashboard's feed").to(dashboard::feed))
        .undocumented(
            Read,
            "/static/{*path}",
            axum::routing::get(dashboard::static_file),
        )
}

/// The node's HTTP routes, in the one stack every service's go through.
pub(crate) fn router(
    config: &NodeConfig,
    tiers: Arc<TieredStore>,
    metrics: Arc<NodeMetrics>,
    chunks: TokenChunks,
) -> Router {
    let (limits, auth) = (config.http, config.auth.clone());
    let table = table();
    let stack = Stack {
        policy: Arc::new(table.policy(auth.clone())),
        limits,
        metrics: Arc::new(HttpMetrics::standalone(
            "kvplane_node_",
            limits.max_body_bytes,
            crate::web::limits::counting_hook("node", refusals(Arc::clone(&metrics))),
        )),
        // The coordinator's DELETE carries JSON; the prefetch and unpin bodies may come
        // from scripts without a content type.
        guard: Guard::OriginOnly,
        // LMCache's MP server, whose routes the coordinator calls, is a FastAPI app.
        style: ErrorStyle::FastApi,
    };
    let http = Arc::clone(&stack.metrics);
    let state = AppState {
        history: dashboard::history(&tiers, &metrics),
        prefetches: Arc::new(Prefetches::new(config.max_prefetch_jobs, config.chunk_size)),
        tiers,
        metrics,
        chunks,
    };
    stack
        .finish(table.into_router(&auth))
        .layer(axum::Extension(http))
        .with_state(state)
}

/// Serves `app` on `listener` until `shutdown`, on `tasks`.
pub(crate) fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    config: &NodeConfig,
    metrics: &Arc<NodeMetrics>,
    shutdown: &CancellationToken,
    tasks: &TaskTracker,
) {
    let served = crate::web::serve(
        listener,
        app,
        config.http,
        crate::web::limits::counting_hook("node", refusals(Arc::clone(metrics))),
        shutdown.clone(),
    );
    tasks.spawn(async move {
        if let Err(e) = served.await {
            tracing::error!("node HTTP server failed: {e}");
        }
    });
}

/// Counts a refusal of the node's HTTP listener in `http_limits_hit_total{limit}`.
fn refusals(metrics: Arc<NodeMetrics>) -> RefusalCounter {
    Arc::new(move |limit: WebLimit| {
        metrics
            .http_limits_hit
            .with_label_values(&[limit.label()])
            .inc();
    })
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

async fn metrics_route(
    State(s): State<AppState>,
    axum::Extension(http): axum::Extension<Arc<HttpMetrics>>,
) -> impl IntoResponse {
    let u = s.tiers.usage();
    let m = &s.metrics;
    m.tier_bytes
        .with_label_values(&["l1"])
        .set(clamp(u.l1_bytes));
    m.tier_bytes
        .with_label_values(&["l2"])
        .set(clamp(u.l2_bytes));
    m.tier_objects
        .with_label_values(&["l1"])
        .set(clamp(u.l1_objects as u64));
    m.tier_objects
        .with_label_values(&["l2"])
        .set(clamp(u.l2_objects as u64));
    let (l1_held, l2_held) = s.tiers.held_counts();
    m.pinned_objects
        .with_label_values(&["l1"])
        .set(clamp(l1_held as u64));
    m.pinned_objects
        .with_label_values(&["l2"])
        .set(clamp(l2_held as u64));
    let mut out = Exposition::new();
    m.write_to(&mut out);
    http.write_to(&mut out);
    out.response()
}
