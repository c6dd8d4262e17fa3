//! The node's small HTTP listener: `/metrics` (the node's own registry, tier gauges refreshed
//! at scrape), `/healthz`, the coordinator's `GET`/`DELETE /cache/objects` (`objects`), warm prefetch
//! (`POST /cache/prefetches`, `GET /cache/prefetches/{request}`: `prefetch`), the
//! controller's pins (`GET /pins`, `POST /unpin`: `pins`), and the
//! dashboard (`dashboard`: `/`, `/static/*`, `/api/dashboard`).

use super::metrics::NodeMetrics;
use super::prefetch::Prefetches;
use super::tiers::Tiers;
use crate::web::access::{Auth, Policy};
use crate::web::exposition::Exposition;
use crate::web::limits::{RefusalCounter, WebLimit};
use crate::web::metrics_layer::HttpMetrics;
use crate::web::stack::{Guard, Stack};
use crate::web::HttpLimits;
use axum::extract::rejection::QueryRejection;
use axum::extract::State;
use axum::extract::{Path, Query};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use serde_json::Value;
use std::sync::Arc;

#[derive(Clone)]
struct AppState {
    tiers: Arc<Tiers>,
    metrics: Arc<NodeMetrics>,
    prefetches: Arc<Prefetches>,
    chunks: super::commands::TokenChunks,
}

/// The coordinator's calls, which LMCache's coordinator makes without a token
/// (`--api-token-peers` covers them), and the routes that never need one; the rest by
/// method (GETs read; `POST /unpin`, an operator's, writes).
pub(crate) fn policy(auth: Auth) -> Policy {
    let routes = super::openapi::operations()
        .into_iter()
        .map(|op| (op.method, op.path, op.access))
        .collect();
    Policy::new("node", routes, auth)
}

/// The node's HTTP routes.
pub(crate) fn router(
    tiers: Arc<Tiers>,
    metrics: Arc<NodeMetrics>,
    prefetches: Arc<Prefetches>,
    chunks: super::commands::TokenChunks,
    limits: HttpLimits,
    auth: Auth,
) -> Router {
    let doc = Arc::new(super::openapi::document(&auth));
    let stack = Stack {
        policy: Arc::new(policy(auth)),
        limits,
        metrics: Arc::new(HttpMetrics::standalone(
            "kvplane_node_",
            limits.max_body_bytes,
            crate::web::limits::counting_hook("node", refusals(Arc::clone(&metrics))),
        )),
        // The coordinator's DELETE carries JSON; the prefetch and unpin bodies may come
        // from scripts without a content type.
        guard: Guard::OriginOnly,
        style: crate::web::json::ErrorStyle::FastApi,
    };
    let http = Arc::clone(&stack.metrics);
    let routes = Router::new()
        .merge(super::dashboard::routes(&tiers, &metrics))
        .route("/metrics", get(metrics_route))
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/cache/objects",
            get(
                |State(s): State<AppState>,
                 q: Result<Query<super::objects::PageQuery>, QueryRejection>| {
                    super::objects::list(s.tiers, s.metrics, q)
                },
            )
            .delete(
                |State(s): State<AppState>, body: Result<axum::body::Bytes, _>| {
                    super::objects::delete(s.tiers, s.metrics, body)
                },
            ),
        )
        .route(
            "/pins",
            get(|State(s): State<AppState>| super::pins::list(s.tiers)),
        )
        .route(
            "/unpin",
            post(|State(s): State<AppState>, body: axum::body::Bytes| {
                super::pins::unpin(s.tiers, s.chunks, body)
            }),
        )
        .route(
            "/cache/prefetches",
            post(|State(s): State<AppState>, body: axum::body::Bytes| {
                super::prefetch::submit(s.tiers, s.metrics, s.prefetches, body)
            }),
        )
        .route(
            "/cache/prefetches/{request}",
            get(
                |State(s): State<AppState>, Path(request): Path<String>| async move {
                    super::prefetch::poll(&s.prefetches, &request)
                },
            ),
        )
        .route("/readyz", get(|| async { "ok\n" }))
        .route(
            "/openapi.json",
            get(move || async move { axum::Json(Value::clone(&doc)) }),
        );
    stack
        .finish(routes)
        .layer(axum::Extension(http))
        .with_state(AppState {
            tiers,
            metrics,
            prefetches,
            chunks,
        })
}

/// Counts a refusal of the node's HTTP listener in `http_limits_hit_total{limit}`.
pub(crate) fn refusals(metrics: Arc<NodeMetrics>) -> RefusalCounter {
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
