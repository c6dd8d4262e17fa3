//! The process's own status: `GET /metrics`, `GET /readyz` and `GET /coordinator/cluster`.

use crate::coordinator::metrics;
use crate::coordinator::state::api_state::ApiState;
use crate::web::error::ApiError;
use crate::web::exposition::Exposition;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

pub(super) async fn metrics_text(State(s): State<Arc<ApiState>>) -> Result<Response, ApiError> {
    let fleet = s
        .handle
        .fleet(|f, _, _| metrics::FleetNumbers::of(f))
        .await?;
    let snapshot = s
        .handle
        .with(move |m, _, _| metrics::Snapshot::of(m, fleet))
        .await?;
    let directory = s
        .handle
        .with(|m, _, _| super::directory::DirectoryMetrics::of(m))
        .await?;
    let mut out = Exposition::new();
    metrics::write(
        &mut out,
        &snapshot,
        &s.handle.stats,
        &s.refused,
        &s.metadata,
    );
    directory.write_to(&mut out);
    if let Some(c) = &s.checkpoint {
        c.write_metrics(&mut out);
    }
    if let Some(c) = &s.cluster {
        c.write_metrics(&mut out);
    }
    s.http_metrics.write_to(&mut out);
    Ok(out.response())
}

/// `GET /readyz`: 200 while the owner tasks answer (this process serves: a `--cluster`
/// standby binds no port), 503 once they stopped.
pub(super) async fn readyz(State(s): State<Arc<ApiState>>) -> Response {
    match s.handle.fleet(|_, _, _| ()).await {
        Ok(()) => Json(json!({"status": "ready"})).into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "stopping", "detail": e.to_string()})),
        )
            .into_response(),
    }
}

/// `GET /coordinator/cluster`: this coordinator's place in its cluster (`--cluster`), or
/// `{"role": "standalone"}`.
pub(super) async fn cluster_status(State(s): State<Arc<ApiState>>) -> Json<Value> {
    Json(
        s.cluster
            .as_ref()
            .map_or_else(|| json!({"role": "standalone"}), |c| c.json()),
    )
}
