//! The indexer's own state, read: `GET /healthz`, `/readyz` (a replica's lag),
//! `/indexer/cluster` (its place in `--cluster`) and `/metrics` (the series are
//! `crate::indexer::metrics`'s, the per-route HTTP families the stack's, the cluster's its).

use super::St;
use crate::web::exposition::Exposition;
use crate::web::metrics_layer::HttpMetrics;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::{Extension, Json};
use serde_json::{json, Value};
use std::sync::Arc;

/// Liveness, `{"status": "ok"}`: the Conductor's clients read this answer.
pub(super) async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Ready when queries are answered from a complete index: always for a standalone indexer
/// or an ingester; for a replica, once it has applied every change in the stream (503 with
/// the reason and the lag until then).
pub(super) async fn readyz(State(st): St) -> impl IntoResponse {
    let (ready, body) = crate::indexer::cluster::readyz(&st);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body))
}

/// This indexer's place in its `--cluster`: the replication core's status document, as
/// `/controller/cluster` and `/coordinator/cluster` answer it.
pub(super) async fn cluster_status(State(st): St) -> Json<Value> {
    Json(crate::indexer::cluster::status_json(&st))
}

/// Every `kvplane_indexer_*` series, the HTTP families and, with `--cluster`, the cluster's.
pub(super) async fn metrics(
    State(st): St,
    Extension(http): Extension<Arc<HttpMetrics>>,
) -> impl IntoResponse {
    let mut out = Exposition::new();
    st.metrics.render_own(&mut out);
    http.write_to(&mut out);
    crate::indexer::cluster::render(&st, &mut out);
    crate::indexer::metrics::render_state(&st, &mut out);
    out.response()
}
