//! The controller's HTTP routes: LMCache's orchestration API, kvplane's read routes,
//! `/metrics`, `/openapi.json` and the dashboard feed, on one axum router.
//!
//! One file per domain:
//! * `orchestration` — the commands that reach workers (`/clear /pin /compress /decompress
//!   /move /health`) and `/check_finish`;
//! * `lookup` — the index queries (`/lookup /query_instance /query_worker_info`);
//! * `fleet` — the fleet and process reads (`/controller/*`, `/healthz`, `/readyz`,
//!   `/metrics`);
//! * `lookup_hash` (`crate::protocol::token_hash`, shared with the node) — CPython's builtin hash of token chunks, as LMCache workers compute it;
//! * `failure` — how a downlink error becomes a [`crate::web::error::WorkerFailure`];
//! * `openapi` — the OpenAPI 3.0 document of every route;
//! * `dashboard` — the embedded web UI, its JSON feed and the feed's server-side history of
//!   counters (`crate::web::history`, as every service's page);
//! * `counters` — the cumulative counters the feed and the history read.
//!
//! The generic plumbing (errors, body schemas, auth, the CSRF guard, request metrics, static
//! assets, the server loop and its limits) is in [`crate::web`], which knows no service.
//!
//! The router is built by [`router`], a plain function of the shared state: tests call it and
//! drive it with `oneshot`, no socket needed. Every route is declared once, in [`api_routes`],
//! with its method and access class; the router and the OpenAPI document are both built from
//! that table. Routes read the controller's state through [`Driver`] and never hold its lock
//! across an `.await`.

mod counters;
mod dashboard;
mod failure;
mod fleet;
mod lookup;
pub use crate::protocol::token_hash as lookup_hash;
mod openapi;
mod orchestration;

pub use orchestration::{
    HEALTH_ERROR_REPLY, HEALTH_TIMEOUT, HEALTH_UNDECODABLE, HEALTH_UNEXPECTED_REPLY,
    HEALTH_UNREACHABLE, MAX_FAN_OUT,
};

use crate::controller::limits::Limit;
use crate::controller::Driver;
use crate::web::access::{Auth, Policy};
use crate::web::history::History;
use crate::web::limits::{HttpLimits, LimitHook};
use crate::web::metrics_layer::HttpMetrics;
use crate::web::stack::{Guard, Stack};
use axum::http::Method;
use axum::routing::{get, post, MethodRouter};
use axum::{Extension, Router};
use std::sync::Arc;

pub use crate::web::access::Access;

/// One route of the API.
pub struct ApiRoute {
    /// HTTP method.
    pub method: Method,
    /// Path (axum syntax).
    pub path: &'static str,
    /// Access class.
    pub access: Access,
    handler: MethodRouter<Arc<Driver>>,
}

fn route(
    method: Method,
    path: &'static str,
    access: Access,
    handler: MethodRouter<Arc<Driver>>,
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
    use Access::{Open, Read, Write};
    use Method as M;
    vec![
        route(M::POST, "/lookup", Read, post(lookup::lookup)),
        route(
            M::POST,
            "/query_instance",
            Read,
            post(lookup::query_instance),
        ),
        route(
            M::POST,
            "/query_worker_info",
            Read,
            post(lookup::query_worker_info),
        ),
        route(M::POST, "/clear", Write, post(orchestration::clear)),
        route(M::POST, "/pin", Write, post(orchestration::pin)),
        route(M::POST, "/compress", Write, post(orchestration::compress)),
        route(
            M::POST,
            "/decompress",
            Write,
            post(orchestration::decompress),
        ),
        route(M::POST, "/move", Write, post(orchestration::move_kv)),
        route(M::POST, "/health", Read, post(orchestration::health)),
        route(
            M::POST,
            "/check_finish",
            Read,
            post(orchestration::check_finish),
        ),
        route(M::GET, "/controller/key-stats", Read, get(fleet::key_stats)),
        route(M::GET, "/controller/workers", Read, get(fleet::workers)),
        route(M::GET, "/controller/cluster", Read, get(fleet::cluster)),
        route(M::GET, "/healthz", Open, get(fleet::healthz)),
        route(M::GET, "/readyz", Open, get(fleet::readyz)),
        route(M::GET, "/metrics", Read, get(fleet::metrics)),
        route(M::GET, "/openapi.json", Open, get(openapi::serve)),
    ]
}

/// Whether the route sends commands to workers (through their downlinks).
fn commands_workers(path: &str) -> bool {
    matches!(
        path,
        "/clear" | "/pin" | "/compress" | "/decompress" | "/move" | "/health"
    )
}

/// 409 on a read replica for a command route.
async fn replica_refuses() -> crate::web::error::ApiError {
    crate::web::error::ApiError::Conflict(
        "this controller is a read replica (serve --replica, docs/CLUSTER.md): send commands \
         to the leader"
            .into(),
    )
}

/// Builds the router with an empty history (no socket: tests call it with `oneshot`).
pub fn router(shared: Arc<Driver>) -> Router {
    router_with(shared, dashboard::history())
}

/// Builds the router of a serving controller: its dashboard's history sampled every 2 s until
/// the controller stops.
pub(crate) fn serving_router(shared: Arc<Driver>) -> Router {
    let history = dashboard::sampled_history(&shared);
    router_with(shared, history)
}

/// What a refusal by an HTTP limit does in the controller: one `kvplane_limit_hits_total`
/// increment and a throttled warning naming the flag.
pub fn limit_hook(shared: &Arc<Driver>) -> LimitHook {
    let shared = Arc::clone(shared);
    Arc::new(move |hit, detail| {
        shared
            .limits
            .hit(&shared.metrics, Limit::from(hit.limit), hit.value, &|| {
                detail.to_owned()
            });
    })
}

/// The HTTP limits of the controller's configuration.
pub fn http_limits(shared: &Driver) -> HttpLimits {
    let c = &shared.config;
    HttpLimits {
        max_body_bytes: c.max_body_bytes,
        max_body_items: c.max_body_items,
        max_connections: c.max_http_connections,
        read_timeout: c.http_read_timeout,
    }
}

/// The controller's token settings.
pub fn auth(shared: &Driver) -> Auth {
    Auth {
        token: shared.config.api_token.clone(),
        reads: shared.config.api_token_reads,
        peers: false,
    }
}

/// Every route's access class, the dashboard's included.
pub fn policy(shared: &Driver) -> Policy {
    let mut routes: Vec<_> = api_routes()
        .into_iter()
        .map(|r| (r.method, r.path, r.access))
        .collect();
    routes.extend(
        openapi::DASHBOARD_ROUTES
            .iter()
            .map(|(path, _)| (Method::GET, *path, Access::Read)),
    );
    Policy::new("controller", routes, auth(shared))
}

/// Builds the router, its dashboard feed serving `history`.
fn router_with(shared: Arc<Driver>, history: Arc<History>) -> Router {
    let mut app = Router::new();
    let replica = shared.cluster().is_some_and(|c| c.is_replica());
    for r in api_routes() {
        // A read replica has no downlinks: the commands go to the leader.
        let handler = if replica && commands_workers(r.path) {
            axum::routing::on(
                axum::routing::MethodFilter::try_from(r.method.clone())
                    .unwrap_or(axum::routing::MethodFilter::POST),
                replica_refuses,
            )
        } else {
            r.handler
        };
        app = app.route(r.path, handler);
    }
    let limits = http_limits(&shared);
    let stack = Stack {
        policy: Arc::new(policy(&shared)),
        limits,
        metrics: Arc::new(HttpMetrics {
            requests: shared.metrics.http_requests.clone(),
            seconds: shared.metrics.http_request_seconds.clone(),
            max_body_bytes: limits.max_body_bytes,
            on_limit: limit_hook(&shared),
        }),
        guard: Guard::JsonWrites,
        style: crate::web::json::ErrorStyle::FastApi,
    };
    stack
        .finish(app.merge(dashboard::routes()))
        .layer(Extension(limits))
        .layer(Extension(history))
        .with_state(shared)
}

/// Logs, once at start, whether the mutating routes are protected.
pub fn log_policy(shared: &Driver) {
    policy(shared).log();
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
