//! The controller's HTTP routes: LMCache's orchestration API, kvplane's read routes, the
//! probes, `/metrics`, `/openapi.json` and the dashboard, on one axum router.
//!
//! Every route is written once, in [`table`]: its method, path, access class, document (the
//! body it reads, its answers) and handler. The axum router, the access policy and
//! `/openapi.json` all come from that table ([`crate::web::route`]), so they cannot drift
//! apart. The handlers live one file per resource:
//! * `orchestration` — the commands that reach workers (`/clear /pin /compress /decompress
//!   /move /health`) and `/check_finish`;
//! * `lookup` — the index queries (`/lookup /query_instance /query_worker_info`);
//! * `fleet` — the fleet and process reads (`/controller/*`) and the probes and `/metrics`;
//! * `dashboard` — the embedded web UI, its JSON feed and the feed's server-side history of
//!   counters (`crate::web::history`, as every service's page), with `counters`, what the
//!   feed and the history read;
//! * `schemas` — the JSON schemas of the answers (bodies document themselves);
//! * `failure` — how a downlink error becomes a [`crate::web::error::WorkerFailure`];
//! * `lookup_hash` (`crate::protocol::token_hash`, shared with the node) — CPython's builtin
//!   hash of token chunks, as LMCache workers compute it.
//!
//! The generic plumbing (the table, errors, body extractors, auth, the CSRF guard, request
//! metrics, static assets, the server loop and its limits) is in [`crate::web`], which knows
//! no service.
//!
//! The router is built by [`router`], a plain function of the shared state: tests call it and
//! drive it with `oneshot`, no socket needed. Routes read the controller's state through
//! [`Driver`] and never hold its lock across an `.await`.

mod counters;
mod dashboard;
mod failure;
mod fleet;
mod lookup;
pub use crate::protocol::token_hash as lookup_hash;
mod orchestration;
mod schemas;

pub use orchestration::{
    HEALTH_ERROR_REPLY, HEALTH_TIMEOUT, HEALTH_UNDECODABLE, HEALTH_UNEXPECTED_REPLY,
    HEALTH_UNREACHABLE, MAX_FAN_OUT,
};

use crate::controller::limits::Limit;
use crate::controller::Driver;
use crate::web::access::Auth;
use crate::web::error::ApiError;
use crate::web::history::History;
use crate::web::json::ErrorStyle;
use crate::web::limits::{HttpLimits, LimitHook};
use crate::web::metrics_layer::HttpMetrics;
use crate::web::openapi::Operation;
use crate::web::route::{get, post, Route, Routes, Spec};
use crate::web::stack::{Guard, Stack};
use axum::handler::Handler;
use axum::{Extension, Router};
use serde_json::json;
use std::sync::Arc;

pub use crate::web::access::Access;

/// A successful answer, as FastAPI describes one.
const OK: (u16, &str) = (200, "Successful Response");
/// A command to an instance nobody registered.
const UNKNOWN_INSTANCE: (u16, &str) = (404, "Unknown instance.");
/// How a command to every worker of an instance fails (bodies: [`schemas::workers_error`]).
const WORKERS_FAILED: [(u16, &str); 3] = [
    (
        502,
        "A worker answered ErrorMsg, a wrong reply type, or could not be reached.",
    ),
    (
        503,
        "Every failing worker already had too many commands queued.",
    ),
    (504, "A worker did not answer within --downlink-timeout."),
];
/// The answers of `/clear`, `/pin`, `/compress`, `/decompress`.
const COMMAND: [(u16, &str); 5] = [
    OK,
    UNKNOWN_INSTANCE,
    WORKERS_FAILED[0],
    WORKERS_FAILED[1],
    WORKERS_FAILED[2],
];

/// The controller's route table (module docs). On a read replica (`serve --replica`) the
/// commands that reach workers answer 409: it has no downlinks, the commands go to the leader.
pub fn table(replica: bool) -> Routes<Arc<Driver>> {
    use Access::{Read, Write};
    let command = |spec: Spec| {
        spec.answer_body(502, schemas::workers_error())
            .answer_body(503, schemas::workers_error())
            .answer_body(504, schemas::workers_error())
    };
    Routes::new("controller", "kvplane controller")
        .health(fleet::healthz)
        .ready(fleet::readyz)
        .metrics(fleet::metrics)
        .route(
            post("/lookup", Read, "Which instances hold this prefix")
                .describe(
                    "LMCache's /lookup: the tokens are hashed into chunks as an LMCache worker \
                     hashes them (CPython's builtin hash, --lookup-chunk-size, \
                     --lookup-none-hash), or the chunk hashes are given directly. layout_info \
                     maps each instance credited with a chunk (first holder per chunk, \
                     stopping at the first miss) to [location, end token]; holders lists \
                     every holder of the prefix.",
                )
                .body::<lookup::LookupRequest>()
                .answers(&[OK])
                .answer_body(200, schemas::lookup())
                .to(lookup::lookup),
        )
        .route(
            post("/query_instance", Read, "Instance of a worker ip")
                .describe("The first instance (registration order) with a worker at this ip.")
                .body::<lookup::QueryInstRequest>()
                .answers(&[OK, (404, "No worker has this ip.")])
                .answer_body(200, schemas::query_instance())
                .to(lookup::query_instance),
        )
        .route(
            post("/query_worker_info", Read, "WorkerInfo records")
                .describe("Workers of an instance (or of every instance with \"all\").")
                .body::<lookup::QueryWorkerInfoRequest>()
                .answers(&[OK, UNKNOWN_INSTANCE])
                .answer_body(200, schemas::query_worker_info())
                .to(lookup::query_worker_info),
        )
        .route(worker_command(
            command(
                post(
                    "/clear",
                    Write,
                    "Clear a location on every worker of an instance",
                )
                .describe("Sends ClearWorkerMsg to every worker of the instance concurrently.")
                .body::<orchestration::ClearRequest>()
                .answers(&COMMAND)
                .answer_body(200, schemas::num_tokens()),
            ),
            orchestration::clear,
            replica,
        ))
        .route(worker_command(
            command(
                post("/pin", Write, "Pin tokens on every worker of an instance")
                    .describe("Sends PinWorkerMsg to every worker of the instance concurrently.")
                    .body::<orchestration::PinRequest>()
                    .answers(&COMMAND)
                    .answer_body(200, schemas::num_tokens()),
            ),
            orchestration::pin,
            replica,
        ))
        .route(worker_command(
            command(
                post(
                    "/compress",
                    Write,
                    "Compress KV on every worker of an instance",
                )
                .describe("Sends CompressWorkerMsg to every worker of the instance.")
                .body::<orchestration::CompressRequest>()
                .answers(&COMMAND)
                .answer_body(200, schemas::num_tokens()),
            ),
            orchestration::compress,
            replica,
        ))
        .route(worker_command(
            command(
                post(
                    "/decompress",
                    Write,
                    "Decompress KV on every worker of an instance",
                )
                .describe("Sends DecompressWorkerMsg to every worker of the instance.")
                .body::<orchestration::DecompressRequest>()
                .answers(&COMMAND)
                .answer_body(200, schemas::num_tokens()),
            ),
            orchestration::decompress,
            replica,
        ))
        .route(worker_command(
            command(
                post("/move", Write, "Move KV between instances")
                    .describe(
                        "Pairs source and destination workers by rank (worker-id order, the \
                         shorter list decides) and sends each source a MoveWorkerMsg whose \
                         new_position is (destination peer_init_url, destination location).",
                    )
                    .body::<orchestration::MoveRequest>()
                    .answers(&[
                        OK,
                        UNKNOWN_INSTANCE,
                        (
                            409,
                            "A destination worker has no peer_init_url (P2P not enabled).",
                        ),
                        WORKERS_FAILED[0],
                        WORKERS_FAILED[1],
                        WORKERS_FAILED[2],
                    ])
                    .answer_body(200, schemas::num_tokens()),
            ),
            orchestration::move_kv,
            replica,
        ))
        .route(worker_command(
            command(
                post("/health", Read, "Probe the workers of an instance")
                    .describe(
                        "error_codes: worker id -> 0 healthy, -1 memory check failed, -1001 \
                         ErrorMsg, -1002 unexpected reply, -1003 undecodable; in a 504/502 \
                         body also -1004 timeout, -1005 unreachable. An unknown instance \
                         answers 200 with no codes (LMCache's behaviour; its dashboard relies \
                         on it).",
                    )
                    .body::<orchestration::HealthRequest>()
                    .answers(&[OK, WORKERS_FAILED[0], WORKERS_FAILED[1], WORKERS_FAILED[2]])
                    .answer_body(200, schemas::health()),
            ),
            orchestration::health,
            replica,
        ))
        .route(
            post("/check_finish", Read, "Status of a command")
                .describe("pending, finished or failed, for the last 10,000 commands.")
                .body::<orchestration::CheckFinishRequest>()
                .answers(&[OK, (404, "Unknown or forgotten event_id.")])
                .answer_body(200, schemas::check_finish())
                .to(orchestration::check_finish),
        )
        .route(
            get("/controller/key-stats", Read, "Key counts")
                .describe("Totals and per-instance key and worker counts.")
                .answers(&[OK])
                .answer_body(200, schemas::key_stats())
                .to(fleet::key_stats),
        )
        .route(
            get("/controller/workers", Read, "Registered workers")
                .describe(
                    "All workers; ?instance_id= one instance; ?instance_id=&worker_id= one \
                     worker object; ?worker_id= that worker id in every instance.",
                )
                .query("instance_id", json!({ "type": "string" }), false)
                .query(
                    "worker_id",
                    json!({ "type": "integer", "format": "int64" }),
                    false,
                )
                .answers(&[
                    OK,
                    (404, "Unknown instance or worker."),
                    (422, "worker_id is not an integer."),
                ])
                .answer_body(200, schemas::workers())
                .answer_body(422, schemas::validation_error())
                .to(fleet::workers),
        )
        .route(
            get(
                "/controller/cluster",
                Read,
                "Place in the cluster (--cluster)",
            )
            .describe(
                "role (standalone, leader), this process's lease name, the lease holder \
                     and epoch, the change log followed before taking over (epoch, seq, \
                     in_sync, gaps, fenced) and published since, and the last failover \
                     (docs/CLUSTER.md).",
            )
            .answers(&[OK])
            .answer_body(200, schemas::cluster())
            .to(fleet::cluster),
        )
        .route(
            get("/", Read, "The dashboard page (HTML)")
                .answers(&[(200, "The page."), (304, "Not modified (ETag).")])
                .to(dashboard::page),
        )
        .undocumented(
            Read,
            "/static/{*path}",
            axum::routing::get(dashboard::static_file),
        )
        .route(
            get(
                "/api/dashboard",
                Read,
                "The dashboard's JSON feed: totals, counters and worker rows",
            )
            .query("offset", json!({ "type": "integer", "minimum": 0 }), false)
            .query("limit", json!({ "type": "integer", "minimum": 0 }), false)
            .query(
                "history",
                json!({ "type": "integer", "enum": [0, 1] }),
                false,
            )
            .answers(&[OK, (422, "Bad query.")])
            .answer_body(422, schemas::validation_error())
            .to(dashboard::feed),
        )
}

/// A route that sends commands to workers: served by `handler`, or on a read replica, which
/// has no downlinks, refused with 409 (the commands go to the leader).
fn worker_command<H, T>(spec: Spec, handler: H, replica: bool) -> Route<Arc<Driver>>
where
    H: Handler<T, Arc<Driver>>,
    T: 'static,
{
    if replica {
        spec.to(replica_refuses)
    } else {
        spec.to(handler)
    }
}

/// 409 on a read replica for a command route.
async fn replica_refuses() -> ApiError {
    ApiError::Conflict(
        "this controller is a read replica (serve --replica, docs/CLUSTER.md): send commands \
         to the leader"
            .into(),
    )
}

/// Every documented operation of the table (tests and the fuzz target walk them).
pub fn operations() -> Vec<Operation> {
    table(false).operations()
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

/// Builds the router from the table, its dashboard feed serving `history`.
fn router_with(shared: Arc<Driver>, history: Arc<History>) -> Router {
    let table = table(shared.cluster().is_some_and(|c| c.is_replica()));
    let auth = auth(&shared);
    let limits = http_limits(&shared);
    let stack = Stack {
        policy: Arc::new(table.policy(auth.clone())),
        limits,
        metrics: Arc::new(HttpMetrics {
            requests: shared.metrics.http_requests.clone(),
            seconds: shared.metrics.http_request_seconds.clone(),
            max_body_bytes: limits.max_body_bytes,
            on_limit: limit_hook(&shared),
        }),
        guard: Guard::JsonWrites,
        style: ErrorStyle::FastApi,
    };
    stack
        .finish(table.into_router(&auth))
        .layer(Extension(history))
        .with_state(shared)
}

/// Logs, once at start, whether the mutating routes are protected.
pub fn log_policy(shared: &Driver) {
    table(false).policy(auth(shared)).log();
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
    fn the_table_serves_each_route_once() {
        let ops = operations();
        let mut routes: Vec<(String, &str)> = ops
            .iter()
            .map(|op| (op.method.to_string(), op.path))
            .collect();
        routes.sort_unstable();
        routes.dedup();
        assert_eq!(routes.len(), ops.len());
        let get = |p: &'static str| ("GET".to_owned(), p);
        let post = |p: &'static str| ("POST".to_owned(), p);
        let mut expected = vec![
            post("/lookup"),
            post("/query_instance"),
            post("/query_worker_info"),
            post("/clear"),
            post("/pin"),
            post("/compress"),
            post("/decompress"),
            post("/move"),
            post("/health"),
            post("/check_finish"),
            get("/controller/key-stats"),
            get("/controller/workers"),
            get("/controller/cluster"),
            get("/healthz"),
            get("/readyz"),
            get("/metrics"),
            get("/openapi.json"),
            get("/"),
            get("/api/dashboard"),
        ];
        expected.sort_unstable();
        assert_eq!(routes, expected);
    }

    #[test]
    fn every_route_has_its_access_class() {
        let auth = Auth::token("t");
        let policy = table(false).policy(auth);
        use axum::http::Method;
        for (method, path, access) in [
            (Method::POST, "/lookup", Access::Read),
            (Method::POST, "/clear", Access::Write),
            (Method::POST, "/move", Access::Write),
            (Method::POST, "/health", Access::Read),
            (Method::GET, "/controller/workers", Access::Read),
            (Method::GET, "/healthz", Access::Open),
            (Method::GET, "/readyz", Access::Open),
            (Method::GET, "/openapi.json", Access::Open),
            (Method::GET, "/metrics", Access::Read),
            (Method::GET, "/", Access::Read),
            (Method::GET, "/static/{*path}", Access::Read),
            (Method::GET, "/api/dashboard", Access::Read),
        ] {
            assert_eq!(policy.access(&method, path), access, "{method} {path}");
        }
    }
}
