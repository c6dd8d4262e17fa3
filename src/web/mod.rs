//! Shared HTTP plumbing for kvplane's five services: the route table, the one error type and its FastAPI-shaped bodies,
//! declarative request schemas, bearer-token auth, the cross-origin guard, request metrics,
//! embedded static assets, and the server loop with its connection and read-time limits.
//!
//! Sits below every service: nothing here may use `crate::controller` or any other service
//! module. What a service must supply (its metric handles, its token, what a limit hit does)
//! comes in as values: [`metrics_layer::HttpMetrics`], [`auth::BearerToken`],
//! [`limits::LimitHook`].
//!
//! * `error` — [`error::ApiError`] and its status codes and bodies;
//! * `schema` — request body schemas: validation (bounded) and their OpenAPI form;
//! * `body` — the rule every serde-read body follows first (a JSON object);
//! * `access` — route classes, each service's policy and the one token check ([`access::enforce`]);
//! * `auth` — the bearer token itself;
//! * `guard` — the CSRF guard of state-changing routes (JSON content type, same origin);
//! * `metrics_layer` — request counts and times by matched route, limit hits;
//! * `exposition` — [`exposition::Exposition`], the one writer of every service's `/metrics`
//!   text (families, escaped labels, the format's values; a `prometheus` registry appended
//!   through the crate's encoder);
//! * `assets` — a `rust-embed` folder served with ETags and a strict CSP (the dashboards'
//!   `frontend/`, one page per service);
//! * `history` — a dashboard's server-side history: a bounded ring of samples and its sampler;
//! * `json` — the one way a route reads its body ([`json::Json`], [`json::Serde`],
//!   [`json::RawBody`]: limits, object check, the field at fault) and handlers' own failures
//!   ([`json::ServiceError`]), refused in the service's [`json::ErrorStyle`];
//! * `route` — one route table per service ([`route::Routes`]), from which its axum router, its
//!   access policy and its `/openapi.json` are all derived;
//! * `limits` — the HTTP limits, their defaults and their reporting;
//! * `stack` — [`stack::Stack`]: the layers every service's router is finished with;
//! * `serve` — [`serve::serve`], the accept loop with the connection cap and read timeouts,
//!   over TLS with [`serve::serve_tls`];
//! * `tls` — `--tls-cert`/`--tls-key`/`--tls-client-ca` on every HTTP listener, reloaded when
//!   the files change;
//! * `testing` — (tests only) one GET through a router and its body, JSON and content type.

pub mod access;
pub mod assets;
pub mod auth;
pub mod body;
pub mod client;
pub mod error;
pub mod exposition;
pub mod guard;
pub mod history;
pub mod json;
pub mod limits;
pub mod metrics_layer;
pub mod openapi;
pub mod route;
pub mod schema;
pub mod serve;
pub mod stack;
#[cfg(test)]
pub mod testing;
pub mod tls;

pub use limits::HttpLimits;
pub use serve::{serve, serve_tls};
