//! The node's small HTTP listener: `/metrics` (the node's own registry, tier gauges refreshed
//! at scrape), `/healthz`, the coordinator's `GET`/`DELETE /cache/objects` (`objects`), warm prefetch
//! (`POST /cache/prefetches`, `GET /cache/prefetches/{request}`: `prefetch`), and the
//! dashboard (`dashboard`: `/`, `/static/*`, `/api/dashboard`).

use super::metrics::NodeMetrics;
use super::prefetch::Prefetches;
use super::tiers::Tiers;
use crate::web::limits::{LimitHit, LimitHook, WebLimit};
use axum::extract::Request;
use axum::extract::State;
use axum::extract::{DefaultBodyLimit, Path, Query};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;

#[derive(Clone)]
struct AppState {
    tiers: Arc<Tiers>,
    metrics: Arc<NodeMetrics>,
    prefetches: Arc<Prefetches>,
}

/// The node's HTTP routes.
pub(crate) fn router(
    tiers: Arc<Tiers>,
    metrics: Arc<NodeMetrics>,
    prefetches: Arc<Prefetches>,
    max_body_bytes: usize,
) -> Router {
    Router::new()
        .merge(super::dashboard::routes(&tiers, &metrics))
        .route("/metrics", get(metrics_route))
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/cache/objects",
            get(
                |State(s): State<AppState>, q: Query<super::objects::PageQuery>| {
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
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(
            max_body_bytes,
            crate::web::limits::refuse_announced_oversize,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&metrics),
            count_refusals,
        ))
        .layer(axum::middleware::from_fn(
            crate::web::guard::same_origin_only,
        ))
        .with_state(AppState {
            tiers,
            metrics,
            prefetches,
        })
}

/// What `web::serve` calls when a client waits for a connection slot or is cut off by the
/// read timeout: counted, logged at debug (a client can trigger it at will).
pub(crate) fn limit_hook(metrics: Arc<NodeMetrics>) -> LimitHook {
    Arc::new(move |hit: LimitHit, detail: &str| {
        metrics
            .http_limits_hit
            .with_label_values(&[hit.limit.label()])
            .inc();
        tracing::debug!(
            limit = hit.limit.label(),
            value = hit.value,
            "node HTTP limit {} hit: {detail}",
            hit.limit.flag()
        );
    })
}

/// Middleware: counts each 413 once, by the limit it names (body bytes when it names none).
async fn count_refusals(
    State(metrics): State<Arc<NodeMetrics>>,
    request: Request,
    next: Next,
) -> Response {
    let response = next.run(request).await;
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE {
        let limit = response
            .extensions()
            .get::<LimitHit>()
            .map_or(WebLimit::BodyBytes, |h| h.limit);
        metrics
            .http_limits_hit
            .with_label_values(&[limit.label()])
            .inc();
    }
    response
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

async fn metrics_route(State(s): State<AppState>) -> impl IntoResponse {
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
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        m.render(),
    )
}
