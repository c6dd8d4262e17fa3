//! The probes and the service's own documents: `/health` (vLLM's probe path) and `/readyz`
//! (200 while an engine is up), `/healthz` (liveness), `/openapi.json`, `/metrics`.

use super::St;
use crate::router::metrics::EngineGauges;
use crate::router::state::RouterState;
use crate::web::access::Access;
use crate::web::exposition::Exposition;
use crate::web::metrics_layer::HttpMetrics;
use crate::web::openapi::Operation;
use axum::extract::State;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::Arc;

/// The probes, `/openapi.json` answering `doc`, and `/metrics`.
pub(super) fn routes(doc: Arc<Value>) -> Router<Arc<RouterState>> {
    Router::new()
        .route("/health", get(health))
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(health))
        .route(
            "/openapi.json",
            get(move || async move { Json(Value::clone(&doc)) }),
        )
        .route("/metrics", get(metrics))
}

/// Open, but for `/metrics` (a read).
pub(super) fn operations() -> Vec<Operation> {
    // What /health and /readyz answer, up or not.
    let health = json!({"type": "object", "required": ["status", "engines"], "properties": {
        "status": {"type": "string"}, "engines": {"type": "array", "items": {"type": "object"}}}});
    vec![
        Operation::new(
            Method::GET,
            "/health",
            Access::Open,
            "Whether an engine is up (vLLM's probe path)",
        )
        .answers(&[(200, "An engine is up"), (503, "No engine is up")])
        .answer_body(200, health.clone())
        .answer_body(503, health.clone()),
        Operation::new(Method::GET, "/healthz", Access::Open, "Liveness"),
        Operation::new(
            Method::GET,
            "/readyz",
            Access::Open,
            "Ready: an engine is up",
        )
        .answers(&[(200, "An engine is up"), (503, "No engine is up")])
        .answer_body(200, health.clone())
        .answer_body(503, health),
        Operation::new(Method::GET, "/openapi.json", Access::Open, "This document"),
        Operation::new(Method::GET, "/metrics", Access::Read, "Prometheus metrics"),
    ]
}

/// 200 while at least one engine is up, 503 otherwise; the engines either way.
async fn health(State(st): St) -> Response {
    let up = st.engines().iter().any(|e| e.is_up());
    let status = if up {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(
            json!({"status": if up {"ok"} else {"no engine up"}, "engines": super::engines_json(&st)}),
        ),
    )
        .into_response()
}

async fn metrics(
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
