//! The indexer's routes (spec §1), one file per resource: `register` (`POST /register`,
//! `/unregister`, `GET /services`), `query` (`POST /query`, `/query_by_hash`), `views`
//! (`GET /global_view`, `/dump`), `status` (`GET /healthz`, `/readyz`, `/indexer/cluster`,
//! `/metrics`), `openapi` (`GET /openapi.json`), `dashboard` (`/`, `/static/*`,
//! `/api/dashboard`; a POST from a page of another origin is a 403). Every error is JSON
//! (`api::Refusal`), a wrong method included (405).

mod dashboard;
pub(super) mod openapi;
mod query;
mod query_body;
mod register;
mod status;
mod views;

use crate::indexer::api::Refusal;
use crate::indexer::IndexerState;
use crate::web::access::{Access, Auth, Policy};
use crate::web::limits::{RefusalCounter, WebLimit};
use crate::web::metrics_layer::HttpMetrics;
use crate::web::stack::{Guard, Stack};
use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::routing::{get, post};
use axum::{Extension, Router};
use std::sync::Arc;

type St = State<Arc<IndexerState>>;

/// The routes that never need a token, and the queries (POSTs that read); registrations
/// are writes.
pub(super) fn policy(auth: Auth) -> Policy {
    use axum::http::Method as M;
    use Access::{Open, Read};
    let routes = vec![
        (M::POST, "/query", Read),
        (M::POST, "/query_by_hash", Read),
        (M::GET, "/healthz", Open),
        (M::GET, "/readyz", Open),
        (M::GET, "/openapi.json", Open),
    ];
    Policy::new("indexer", routes, auth)
}

/// The router.
pub(super) fn router(state: Arc<IndexerState>) -> Router {
    let limits = state.config.http_limits();
    let http = Arc::new(HttpMetrics::standalone(
        "kvplane_indexer_",
        limits.max_body_bytes,
        crate::web::limits::counting_hook("indexer", refusals(&state)),
    ));
    let stack = Stack {
        policy: Arc::new(policy(state.config.auth.clone())),
        limits,
        metrics: Arc::clone(&http),
        // The Conductor's clients post without a content type.
        guard: Guard::OriginOnly,
        style: crate::web::json::ErrorStyle::Conductor,
    };
    let routes = Router::new()
        .merge(dashboard::routes(&state))
        .route("/register", post(register::register))
        .route("/unregister", post(register::unregister))
        .route("/query", post(query::query))
        .route("/query_by_hash", post(query::query_by_hash))
        .route("/services", get(register::services))
        .route("/global_view", get(views::global_view))
        .route("/dump", get(views::dump))
        .route("/healthz", get(status::healthz))
        .route("/readyz", get(status::readyz))
        .route("/indexer/cluster", get(status::cluster_status))
        .route("/metrics", get(status::metrics))
        .route("/openapi.json", get(openapi::openapi));
    stack
        .finish(routes)
        .layer(Extension(http))
        .with_state(state)
}

/// A request body, or the [`Refusal`] saying why it could not be read (413, 408, 400).
pub(super) struct Body(Bytes);

impl FromRequest<Arc<IndexerState>> for Body {
    type Rejection = Refusal;

    async fn from_request(req: Request, state: &Arc<IndexerState>) -> Result<Self, Refusal> {
        Bytes::from_request(req, state)
            .await
            .map(Body)
            .map_err(|e| Refusal::unreadable_body(&e, state.config.max_body_bytes))
    }
}

/// Counts a refusal of the indexer's HTTP server in `http_limits_hit_total{limit}`.
pub(super) fn refusals(state: &Arc<IndexerState>) -> RefusalCounter {
    let state = Arc::clone(state);
    Arc::new(move |limit: WebLimit| state.metrics.http_limit_hit(limit.label()))
}
