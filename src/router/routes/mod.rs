//! The router's HTTP routes: the one table ([`table`]) from which the axum router, the access
//! policy and `/openapi.json` all come ([`crate::web::route`]), and one file per resource for
//! the handlers — [`openai`] (the OpenAI-compatible front: `/v1/completions`,
//! `/v1/chat/completions`, `/v1/models`, refused in OpenAI's shape), [`probes`] (`/health`,
//! `/healthz`, `/readyz`, `/metrics`), [`admin`] (`/router/stats`, `/router/doctor`).

mod admin;
mod openai;
mod probes;

use super::state::RouterState;
use crate::web::access::{Access, Auth, Policy};
use crate::web::json::ErrorStyle;
use crate::web::route::{get, post, Routes};
use crate::web::stack::Stack;
use axum::extract::State;
use axum::Router;
use openai::{ChatCompletions, Completions, Endpoint, OpenAiBody};
use serde_json::{json, Value};
use std::sync::Arc;

type St = State<Arc<RouterState>>;

/// Every route of the router: each written once here, its handler in its resource's file.
pub(crate) fn table() -> Routes<Arc<RouterState>> {
    Routes::new("router", "kvplane router")
        // The OpenAI routes: reads (`--api-token-reads`), refused in OpenAI's shape.
        .route(
            post(
                Completions::PATH,
                Access::Read,
                "OpenAI completions, routed by KV prefix",
            )
            .body::<OpenAiBody<Completions>>()
            .answers(openai::PROXIED)
            .style(ErrorStyle::OpenAi)
            .to(openai::proxy::<Completions>),
        )
        .route(
            post(
                ChatCompletions::PATH,
                Access::Read,
                "OpenAI chat completions, routed by KV prefix",
            )
            .body::<OpenAiBody<ChatCompletions>>()
            .answers(openai::PROXIED)
            .style(ErrorStyle::OpenAi)
            .to(openai::proxy::<ChatCompletions>),
        )
        .route(
            get(openai::MODELS, Access::Read, "The engines' models")
                .answers(&[(200, "The models"), (503, "No engine is up")])
                .style(ErrorStyle::OpenAi)
                .to(openai::models),
        )
        // The probes: open (vLLM's `/health` kept beside the stack's `/readyz`, which engines'
        // clients and load balancers ask), and `/metrics`, a read.
        .route(
            get(
                "/health",
                Access::Open,
                "Whether an engine is up (vLLM's probe path)",
            )
            .answers(&[(200, "An engine is up"), (503, "No engine is up")])
            .answer_body(200, probes::health_body())
            .answer_body(503, probes::health_body())
            .to(probes::health),
        )
        .health(probes::alive)
        .ready(probes::health)
        .metrics(probes::metrics)
        // The router's own: its accounting, a read; the doctor (it sends probe prompts to
        // every engine), a write.
        .route(
            get(
                "/router/stats",
                Access::Read,
                "Predicted against delivered cached tokens",
            )
            .to(admin::stats),
        )
        .route(
            post(
                "/router/doctor",
                Access::Write,
                "Hash-parity probe of every engine",
            )
            // The body is read by nothing, but the CSRF guard wants a JSON one: `{}`.
            .body_schema(json!({"type": "object"}))
            .answers(&[(200, "Every engine agrees"), (409, "A mismatch, named")])
            .answer_body(200, admin::verdicts_body())
            .answer_body(409, admin::verdicts_body())
            .to(admin::run_doctor),
        )
}

/// The router's axum router, on the HTTP stack ([`crate::web::stack`]).
pub(crate) fn router(state: Arc<RouterState>, stack: &Stack) -> Router {
    stack
        .finish(table().into_router(stack.policy.auth()))
        .layer(axum::Extension(Arc::clone(&stack.metrics)))
        .with_state(state)
}

/// The router's access policy: the table's, the token settings `auth`'s.
pub(crate) fn policy(auth: Auth) -> Policy {
    table().policy(auth)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::web::access::Access::{self, Open, Read, Write};
    use axum::http::Method;

    #[test]
    fn one_table_classes_and_documents_every_route() {
        let auth = Auth::token("t");
        let policy = policy(auth.clone());
        let classes: Vec<(Method, &str, Access)> = vec![
            (Method::POST, "/v1/completions", Read),
            (Method::POST, "/v1/chat/completions", Read),
            (Method::GET, "/v1/models", Read),
            (Method::GET, "/health", Open),
            (Method::GET, "/healthz", Open),
            (Method::GET, "/readyz", Open),
            (Method::GET, "/metrics", Read),
            (Method::GET, "/router/stats", Read),
            (Method::POST, "/router/doctor", Write),
            (Method::GET, "/openapi.json", Open),
        ];
        let mut routes = policy.routes().to_vec();
        routes.sort_by_key(|(m, p, _)| (*p, m.to_string()));
        let mut want = classes.clone();
        want.sort_by_key(|(m, p, _)| (*p, m.to_string()));
        assert_eq!(routes, want);
        let doc = table().document(&auth);
        let paths = doc["paths"].as_object().expect("paths");
        assert_eq!(paths.len(), classes.len());
        // The OpenAI routes document their errors in OpenAI's shape, the others in the one shape.
        let error = |path: &str, method: &str| {
            doc["paths"][path][method]["responses"]["503"]["content"]["application/json"]["schema"]
                .clone()
        };
        assert_eq!(error("/v1/models", "get")["required"][0], "error");
        assert_eq!(error("/v1/completions", "post")["required"][0], "error");
        assert_eq!(
            doc["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]
                ["schema"]["required"][0],
            "prompt"
        );
    }
}
