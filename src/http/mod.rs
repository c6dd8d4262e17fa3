//! The HTTP server: health and metrics (the orchestration API and dashboard build on this).

use crate::controller::Shared;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use std::sync::Arc;

/// Builds the router (no socket: tests call it with `oneshot`).
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .with_state(shared)
}

async fn healthz(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let index = shared.index.read();
    Json(serde_json::json!({
        "status": "ok",
        "workers": index.worker_count(),
        "instances": index.instance_count(),
        "keys": index.key_count(),
    }))
}

async fn metrics(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    shared.refresh_gauges();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        shared.metrics.render(),
    )
}
