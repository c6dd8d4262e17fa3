//! The probes and `/metrics`: `/health` (vLLM's probe path, which engines' clients and load
//! balancers ask) and `/readyz` (200 while an engine is up), `/healthz` (liveness), `/metrics`.

use super::{engines_json, St};
use crate::router::metrics::EngineGauges;
use crate::web::exposition::Exposition;
use crate::web::metrics_layer::HttpMetrics;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

/// What `/health` and `/readyz` answer, up or not.
pub(super) fn health_body() -> Value {
    json!({"type": "object", "required": ["status", "engines"], "properties": {
        "status": {"type": "string"}, "engines": {"type": "array", "items": {"type": "object"}}}})
}

/// Liveness: the process answers.
pub(super) async fn alive() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// 200 while at least one engine is up, 503 otherwise; the engines either way.
pub(super) async fn health(State(st): St) -> Response {
    let up = st.engines().iter().any(|e| e.is_up());
    let status = if up {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(json!({"status": if up {"ok"} else {"no engine up"}, "engines": engines_json(&st)})),
    )
        .into_response()
}

pub(super) async fn metrics(
    State(st): St,
    axum::Extension(http): axum::Extension<Arc<HttpMetrics>>,
) -> Response {
    let accounting = st.accounting.lock();
    let now = crate::cluster::now_ms();
    let engines = st.engines();
    let mut out = Exposition::new();
    st.metrics.write_to(
        &mut out,
        engines.iter().map(|e| {
            let load = e.load();
            EngineGauges {
                name: &e.spec.instance,
                in_flight: load.in_flight,
                waiting: load.waiting,
                up: e.is_up(),
                shared: st.shared.as_ref().map(|s| s.live(&e.spec.instance, now)),
                reported: load.reported,
            }
        }),
        &accounting,
    );
    drop(accounting);
    http.write_to(&mut out);
    out.response()
}
