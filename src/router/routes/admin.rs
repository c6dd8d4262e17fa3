//! The router's own read and action: `GET /router/stats` (predicted against delivered cached
//! tokens) and `POST /router/doctor` (the hash-parity probe of every engine).

use super::St;
use crate::router::doctor::{self, Verdict};
use crate::router::model::accounting::Tally;
use crate::router::state::RouterState;
use crate::web::access::Access;
use crate::web::openapi::Operation;
use axum::extract::State;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// `/router/stats` and `/router/doctor`.
pub(super) fn routes() -> Router<Arc<RouterState>> {
    Router::new()
        .route("/router/stats", get(stats))
        .route("/router/doctor", post(run_doctor))
}

/// `/router/stats` a read; `POST /router/doctor` (it sends probe prompts to every engine) a
/// write.
pub(super) fn operations() -> Vec<Operation> {
    // The doctor's verdicts, agreeing or not.
    let verdicts = json!({"type": "object", "required": ["ok", "engines"], "properties": {
        "ok": {"type": "boolean"}, "engines": {"type": "array", "items": {"type": "object"}}}});
    vec![
        Operation::new(
            Method::GET,
            "/router/stats",
            Access::Read,
            "Predicted against delivered cached tokens",
        ),
        // The body is read by nothing, but the CSRF guard wants a JSON one: `{}`.
        Operation::new(
            Method::POST,
            "/router/doctor",
            Access::Write,
            "Hash-parity probe of every engine",
        )
        .body(json!({"type": "object"}))
        .answers(&[(200, "Every engine agrees"), (409, "A mismatch, named")])
        .answer_body(200, verdicts.clone())
        .answer_body(409, verdicts),
    ]
}

fn totals_json(t: &Tally) -> Value {
    json!({"requests": t.requests, "reusable": t.reusable, "predicted": t.predicted,
           "delivered": t.delivered, "unpredicted": t.unpredicted,
           "delivered_ratio": t.delivered_ratio(), "hit_ratio": t.hit_ratio(),
           "missed": {"no_reuse_possible": t.misses.no_reuse_possible,
                      "routed_for_load": t.misses.routed_for_load,
                      "index_stale": t.misses.index_stale}})
}

/// Runs the hash-parity doctor now (docs/ROUTER.md): 200 when every engine agrees, 409
/// with the verdicts otherwise. Sends each engine two small probe completions.
async fn run_doctor(State(st): St) -> Response {
    let verdicts = doctor::run(&st, st.config.connect_timeout * 5).await;
    let ok = verdicts.iter().all(Verdict::ok);
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::CONFLICT
    };
    (status, Json(json!({"ok": ok, "engines": verdicts}))).into_response()
}

/// Predicted against delivered cached tokens, per engine and overall, and the engines.
async fn stats(State(st): St) -> Json<Value> {
    let a = st.accounting.lock();
    let per: Map<String, Value> = a
        .per_engine()
        .iter()
        .map(|(k, t)| (k.clone(), totals_json(t)))
        .collect();
    Json(
        json!({"overall": totals_json(&a.overall()), "per_engine": per,
                "engines": super::engines_json(&st)}),
    )
}
