//! The router's HTTP routes, one file per resource: [`openai`] (the OpenAI-compatible front:
//! `/v1/completions`, `/v1/chat/completions`, `/v1/models`), [`probes`] (`/health`,
//! `/healthz`, `/readyz`, `/openapi.json`, `/metrics`), [`admin`] (`/router/stats`,
//! `/router/doctor`). Each declares its routes and their operations; the policy and the
//! document are made of those operations.

mod admin;
mod openai;
mod probes;

use super::state::RouterState;
use crate::web::openapi::{self, Operation};
use crate::web::stack::Stack;
use axum::extract::State;
use axum::Router;
use serde_json::{json, Value};
use std::sync::Arc;

type St = State<Arc<RouterState>>;

/// The router's axum router, on the HTTP stack ([`crate::web::stack`]).
pub(super) fn router(state: Arc<RouterState>, stack: &Stack) -> Router {
    let doc = Arc::new(openapi::document(
        "kvplane router",
        &operations(),
        stack.policy.auth(),
    ));
    let routes = openai::routes()
        .merge(probes::routes(doc))
        .merge(admin::routes());
    stack
        .finish(routes)
        .layer(axum::Extension(Arc::clone(&stack.metrics)))
        .with_state(state)
}

/// The router's access policy, from [`operations`].
pub(crate) fn policy(auth: crate::web::access::Auth) -> crate::web::access::Policy {
    let routes = operations()
        .into_iter()
        .map(|op| (op.method, op.path, op.access))
        .collect();
    crate::web::access::Policy::new("router", routes, auth)
}

/// The routes that never need a token; the OpenAI routes and the other reads by
/// `--api-token-reads`; `POST /router/doctor` (it sends probe prompts to every engine) is a
/// write.
pub(crate) fn operations() -> Vec<Operation> {
    let mut ops = openai::operations();
    ops.extend(probes::operations());
    ops.extend(admin::operations());
    ops
}

/// The engines as `/health`, `/readyz` and `/router/stats` show them.
fn engines_json(st: &RouterState) -> Vec<Value> {
    st.engines()
        .iter()
        .map(|e| {
            let load = e.load();
            json!({"instance": e.spec.instance, "url": e.spec.url, "up": e.is_up(),
                   "in_flight": load.in_flight, "waiting": load.waiting})
        })
        .collect()
}
