//! The indexer's routes (spec §1): its one route table ([`table`]), from which the axum
//! router, the access policy and `/openapi.json` are derived, and the handlers, one file per
//! resource: `register` (`/register`, `/unregister`, `/services`), `query` (`/query` with its
//! one-pass body reader `query_body`, `/query_by_hash`), `views` (`/global_view`, `/dump`),
//! `status` (the probes, `/indexer/cluster`, `/metrics`), `dashboard` (the page and its feed;
//! a POST from a page of another origin is a 403). Bodies are read through
//! `web::json::RawBody` and validated by `api` with the Conductor's refusals; every error is
//! JSON in the Conductor's style (the stack's), a wrong method included (405).

mod dashboard;
mod query;
mod query_body;
mod register;
mod status;
mod views;

use crate::indexer::api::{HashQuery, Registration, Unregistration};
use crate::indexer::IndexerState;
use crate::web::access::Access::{Read, Write};
use crate::web::json::ErrorStyle;
use crate::web::limits::{RefusalCounter, WebLimit};
use crate::web::metrics_layer::HttpMetrics;
use crate::web::route::{get, post, Routes};
use crate::web::stack::{Guard, Stack};
use axum::extract::State;
use axum::{Extension, Router};
use query_body::QueryBody;
use serde_json::json;
use std::sync::Arc;

type St = State<Arc<IndexerState>>;

/// Every route the indexer serves but `/openapi.json` (the table adds it) and the page's
/// static files: method, path, access class, summary, body, answers and handler, each
/// written once. Registrations are writes; the queries (POSTs that read) and every GET but
/// the probes are reads.
fn table(state: &Arc<IndexerState>) -> Routes<Arc<IndexerState>> {
    const WRONG_METHOD: (u16, &str) = (405, "Method not allowed on this route.");
    let ok = [(200, "OK"), WRONG_METHOD];
    let object = || json!({"type": "object"});
    Routes::new("indexer", "kvplane indexer")
        .route(
            post("/register", Write, "Subscribe to a publisher")
                .body::<Registration>()
                .answers(&[
                    (200, "OK"),
                    WRONG_METHOD,
                    (409, "Registered with another configuration."),
                ])
                .answer_body(200, object())
                .to(register::register),
        )
        .route(
            post("/unregister", Write, "Remove a stream and its blocks")
                .body::<Unregistration>()
                .answers(&ok)
                .answer_body(200, object())
                .to(register::unregister),
        )
        .route(
            post(
                "/query",
                Read,
                "Longest cached prefix per instance, tier and rank",
            )
            .body::<QueryBody>()
            .answers(&ok)
            .answer_body(200, query::answer_schema())
            .to(query::query),
        )
        .route(
            post(
                "/query_by_hash",
                Read,
                "As /query, from rolling XXH3 sequence hashes (alias block_hash)",
            )
            .body::<HashQuery>()
            .answers(&ok)
            .answer_body(200, query::answer_schema())
            .to(query::query_by_hash),
        )
        .route(
            get(
                "/services",
                Read,
                "Registered streams with connection and sequence state",
            )
            .answers(&ok)
            .answer_body(200, object())
            .to(register::services),
        )
        .route(
            get(
                "/global_view",
                Read,
                "Every instance with its streams, blocks per tier, publishers and LMCache servers",
            )
            .answers(&ok)
            .answer_body(200, object())
            .to(views::global_view),
        )
        .route(
            get(
                "/dump",
                Read,
                "Every stream's blocks by standard sequence hash with their tier references",
            )
            .answers(&ok)
            .answer_body(200, object())
            .to(views::dump),
        )
        .route(
            get(
                "/indexer/cluster",
                Read,
                "Place in the --cluster (role, log position, lag, published records; \
                 {\"role\": \"standalone\"} without one)",
            )
            .answers(&ok)
            .answer_body(200, object())
            .to(status::cluster_status),
        )
        .health(status::healthz)
        .ready(status::readyz)
        .metrics(status::metrics)
        .undocumented(Read, "/api/dashboard", dashboard::feed_route(state))
}

/// The router: the table's routes and the page's, in the stack (the Conductor's error
/// style; its clients post without a content type, so the CSRF guard checks origins only).
pub(super) fn router(state: Arc<IndexerState>) -> Router {
    let limits = state.config.http_limits();
    let http = Arc::new(HttpMetrics::standalone(
        "kvplane_indexer_",
        limits.max_body_bytes,
        crate::web::limits::counting_hook("indexer", refusals(&state)),
    ));
    let table = table(&state);
    let stack = Stack {
        policy: Arc::new(table.policy(state.config.auth.clone())),
        limits,
        metrics: Arc::clone(&http),
        guard: Guard::OriginOnly,
        style: ErrorStyle::Conductor,
    };
    let routes = table
        .into_router(&state.config.auth)
        .merge(dashboard::page());
    stack
        .finish(routes)
        .layer(Extension(http))
        .with_state(state)
}

/// Counts a refusal of the indexer's HTTP server in `http_limits_hit_total{limit}`.
pub(super) fn refusals(state: &Arc<IndexerState>) -> RefusalCounter {
    let state = Arc::clone(state);
    Arc::new(move |limit: WebLimit| state.metrics.http_limit_hit(limit.label()))
}
