//! The controller's HTTP routes: LMCache's orchestration API, kvplane's read routes,
//! `/metrics`, `/openapi.json` and the dashboard, on one axum router.
//!
//! One file per domain:
//! * `orchestration` — the commands that reach workers (`/clear /pin /compress /decompress
//!   /move /health`) and `/check_finish`;
//! * `lookup` — the index queries (`/lookup /query_instance /query_worker_info`);
//! * `fleet` — the fleet and process reads (`/controller/*`, `/healthz`, `/readyz`,
//!   `/metrics`);
//! * `lookup_hash` — CPython's builtin hash of token chunks, as LMCache workers compute it;
//! * `openapi` — the OpenAPI 3.0 document of every route.
//!
//! The generic plumbing (errors, JSON bodies, auth, the metrics layer, the dashboard) lives
//! in [`crate::http`]. The router is built by [`router`], a plain function of the shared
//! state: tests call it and drive it with `oneshot`, no socket needed. Every route is declared
//! once, in [`api_routes`], with its method and access class; the router and the OpenAPI
//! document are both built from that table. Routes read the controller's state through
//! [`Shared`] and never hold its lock across an `.await`.

mod fleet;
mod lookup;
pub mod lookup_hash;
mod openapi;
mod orchestration;

pub use orchestration::{
    HEALTH_ERROR_REPLY, HEALTH_TIMEOUT, HEALTH_UNDECODABLE, HEALTH_UNEXPECTED_REPLY,
    HEALTH_UNREACHABLE, MAX_FAN_OUT,
};

use crate::controller::Shared;
use crate::http::{auth, dashboard, metrics_layer};
use axum::extract::DefaultBodyLimit;
use axum::http::{Method, StatusCode};
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::{get, post, MethodRouter};
use axum::{Json, Router};
use std::sync::Arc;

/// Who may call a route when `--api-token` is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Anyone: reads, lookups, health probes, metrics.
    Open,
    /// Only with `Authorization: Bearer <token>`: commands that change workers' caches.
    Token,
}

/// One route of the API.
pub struct ApiRoute {
    /// HTTP method.
    pub method: Method,
    /// Path (axum syntax).
    pub path: &'static str,
    /// Access class.
    pub access: Access,
    handler: MethodRouter<Arc<Shared>>,
}

fn route(
    method: Method,
    path: &'static str,
    access: Access,
    handler: MethodRouter<Arc<Shared>>,
) -> ApiRoute {
    ApiRoute {
        method,
        path,
        access,
        handler,
    }
}

/// Every API route (the dashboard's routes come from its own module).
pub fn api_routes() -> Vec<ApiRoute> {
    use Access::{Open, Token};
    use Method as M;
    vec![
        route(M::POST, "/lookup", Open, post(lookup::lookup)),
        route(
            M::POST,
            "/query_instance",
            Open,
            post(lookup::query_instance),
        ),
        route(
            M::POST,
            "/query_worker_info",
            Open,
            post(lookup::query_worker_info),
        ),
        route(M::POST, "/clear", Token, post(orchestration::clear)),
        route(M::POST, "/pin", Token, post(orchestration::pin)),
        route(M::POST, "/compress", Token, post(orchestration::compress)),
        route(
            M::POST,
            "/decompress",
            Token,
            post(orchestration::decompress),
        ),
        route(M::POST, "/move", Token, post(orchestration::move_kv)),
        route(M::POST, "/health", Open, post(orchestration::health)),
        route(
            M::POST,
            "/check_finish",
            Open,
            post(orchestration::check_finish),
        ),
        route(M::GET, "/controller/key-stats", Open, get(fleet::key_stats)),
        route(M::GET, "/controller/workers", Open, get(fleet::workers)),
        route(M::GET, "/healthz", Open, get(fleet::healthz)),
        route(M::GET, "/readyz", Open, get(fleet::readyz)),
        route(M::GET, "/metrics", Open, get(fleet::metrics)),
        route(M::GET, "/openapi.json", Open, get(openapi::serve)),
    ]
}

/// Builds the router (no socket: tests call it with `oneshot`).
pub fn router(shared: Arc<Shared>) -> Router {
    let mut open = Router::new();
    let mut guarded = Router::new();
    for r in api_routes() {
        match r.access {
            Access::Open => open = open.route(r.path, r.handler),
            Access::Token => guarded = guarded.route(r.path, r.handler),
        }
    }
    let guarded = guarded.route_layer(middleware::from_fn_with_state(
        Arc::clone(&shared),
        auth::require_token,
    ));
    Router::new()
        .merge(open)
        .merge(guarded)
        .merge(dashboard::routes())
        .fallback(not_found)
        // Layers last, so that they wrap every route above.
        .layer(DefaultBodyLimit::max(shared.config.max_body_bytes))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&shared),
            metrics_layer::track,
        ))
        .with_state(shared)
}

async fn not_found() -> impl IntoResponse {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({ "detail": "Not Found" })),
    )
}

/// A new event id: `prefix` + a random UUID (version 4), as LMCache builds them.
pub(crate) fn new_event_id(prefix: &str) -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{prefix}{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_are_prefixed_uuid4s() {
        let id = new_event_id("Clear");
        let uuid = id.strip_prefix("Clear").expect("prefix");
        let parts: Vec<&str> = uuid.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('4'), "version 4: {uuid}");
        assert!(
            matches!(parts[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'),
            "RFC 4122 variant: {uuid}"
        );
        assert_ne!(new_event_id("Clear"), id);
    }

    #[test]
    fn paths_are_unique() {
        let routes = api_routes();
        let mut paths: Vec<&str> = routes.iter().map(|r| r.path).collect();
        paths.sort_unstable();
        paths.dedup();
        assert_eq!(paths.len(), routes.len());
    }
}
