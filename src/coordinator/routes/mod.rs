//! The coordinator's HTTP routes (axum): request bodies in, model calls through the owner
//! [`Handle`](crate::coordinator::state::driver::Handle), JSON replies out; prefetch calls
//! forwarded to the named MP server. [`router`] serves them all behind the HTTP stack with
//! the access [`policy`]; one file per resource:
//!
//! - `instances.rs` — `/instances`: registration, heartbeats, the fleet and its usage.
//! - `quota.rs` — `/quota`: quotas, the default quota and their usage.
//! - `events.rs` — the usage events (`POST /quota/events`, `POST /events`).
//! - `prefetches.rs` — `/cache/prefetches`, forwarded to an MP server.
//! - `cache` — `/cache/pins` and `/cache/delete` (token sequences → keys → pins / a
//!   server's `DELETE /cache/objects`).
//! - `directory` — the `/directory` routes.
//! - `dashboard` — the Fleet page (`/`) and its read-only JSON feed (`/api/dashboard`).
//! - `status.rs` — `/metrics`, `/readyz`, `/coordinator/cluster`.
//! - [`openapi`] — `GET /openapi.json`, from the route table.
//! - `limits` — the HTTP limits' refusals (413/408) and their counts.
//!
//! Owns request validation and the error envelope (`{"detail": ...}`, FastAPI's shape; a
//! 422 lists `{"type","loc","msg"}` naming the field), with the helpers every route file uses
//! to read a body (`parse`, `invalid`) and find an MP server (`address_of`). Must not
//! hold model state itself.

mod cache;
mod dashboard;
mod directory;
mod events;
mod instances;
pub(crate) mod limits;
pub mod openapi;
mod prefetches;
mod quota;
mod status;

use super::state::api_state::ApiState;
use super::state::driver::Stopped;
use crate::web::access::{Access, Auth, Policy};
use crate::web::error::ApiError;
use crate::web::stack::{Guard, Stack};
use crate::web::HttpLimits;
use axum::extract::State;
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use limits::JsonBody;
use serde::de::DeserializeOwned;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl From<Stopped> for ApiError {
    fn from(e: Stopped) -> Self {
        ApiError::Unavailable(e.to_string())
    }
}

/// Parses a JSON body; a failure's `loc` is the path to the offending field.
pub(crate) fn parse<T: DeserializeOwned>(state: &ApiState, bytes: &[u8]) -> Result<T, ApiError> {
    if !crate::web::body::is_object(bytes) {
        state.refused.invalid_bodies.fetch_add(1, Ordering::Relaxed);
        return Err(ApiError::value_error(
            vec![json!("body")],
            String::from("Input should be a valid dictionary"),
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de)
        .or_else(|e| {
            // JSON has one number type: `2.0` is the integer 2 to LMCache's pydantic (and to the
            // JSON schema). Tried only after a refusal, so well-formed bodies pay nothing.
            if let Some(v) = crate::web::body::integral_floats_as_integers(bytes) {
                if let Ok(t) = serde_json::from_value(v) {
                    return Ok(t);
                }
            }
            Err(e)
        })
        .map_err(|e| {
            state.refused.invalid_bodies.fetch_add(1, Ordering::Relaxed);
            let mut loc = vec![json!("body")];
            for seg in e.path().iter() {
                match seg {
                    serde_path_to_error::Segment::Seq { index } => loc.push(json!(index)),
                    serde_path_to_error::Segment::Map { key } => loc.push(json!(key)),
                    serde_path_to_error::Segment::Enum { variant } => loc.push(json!(variant)),
                    serde_path_to_error::Segment::Unknown => {}
                }
            }
            let msg = e.into_inner().to_string();
            // serde names a missing field only in its message ("missing field `ip`"): FastAPI
            // puts it in `loc`, and so do we.
            // (The path already ends at an unknown field, for a body that refuses them.)
            if let Some(field) = msg
                .strip_prefix("missing field `")
                .and_then(|rest| rest.split('`').next())
            {
                loc.push(json!(field));
            }
            ApiError::value_error(loc, msg)
        })
}

pub(crate) fn invalid(state: &ApiState, field: &'static str, msg: impl Into<String>) -> ApiError {
    state.refused.invalid_bodies.fetch_add(1, Ordering::Relaxed);
    ApiError::value_error(vec![json!("body"), json!(field)], msg.into())
}

/// The registered address of `id`, or 404.
pub(crate) async fn address_of(s: &ApiState, id: &str) -> Result<(String, u16), ApiError> {
    let key = id.to_owned();
    s.handle
        .fleet(move |f, _, _| f.get(&key).map(|i| (i.ip.clone(), i.http_port)))
        .await?
        .ok_or_else(|| {
            ApiError::NotFound(format!("no MP server registered with instance_id='{id}'"))
        })
}

/// The router of every coordinator route.
pub fn router(state: Arc<ApiState>) -> Router {
    let limits = state.http;
    let features = state.features;
    let mut routes = Router::new()
        .merge(dashboard::routes(&state))
        .merge(directory::routes())
        .route(
            "/instances",
            post(instances::register).get(instances::list_instances),
        )
        .route("/instances/usage", get(instances::fleet_usage))
        .route("/instances/{id}/usage", get(instances::instance_usage))
        .route("/instances/{id}/heartbeat", put(instances::heartbeat))
        .route("/instances/{id}", delete(instances::deregister))
        .route(
            "/healthz",
            get(|| async { Json(json!({"status": "healthy"})) }),
        )
        .route("/readyz", get(status::readyz))
        .route("/quota/events", post(events::legacy_events))
        .route("/events", post(events::events))
        .route("/cache/prefetches", post(prefetches::prefetch))
        .route(
            "/cache/prefetches/{instance}/{request}",
            get(prefetches::prefetch_status),
        )
        .route("/cache/delete", post(cache::delete))
        .route("/coordinator/cluster", get(status::cluster_status))
        .route(
            "/openapi.json",
            get(|State(s): State<Arc<ApiState>>| async move {
                let mut doc = openapi::document();
                crate::web::openapi::annotate(&mut doc, &policy(s.auth.clone()));
                Json(doc)
            }),
        );
    if features.eviction_controller {
        // 0.5.6's FleetEvictionController owns these (`disabled_controllers` removes them).
        routes = routes
            .route("/quota", get(quota::list_quota))
            .route(
                "/quota/config",
                put(quota::set_quota_config).get(quota::get_quota_config),
            )
            .route(
                "/quota/{salt}",
                put(quota::set_quota)
                    .get(quota::get_quota)
                    .delete(quota::remove_quota),
            )
            .route(
                "/cache/pins",
                post(cache::pin).delete(cache::unpin).get(cache::list),
            );
    }
    if features.metrics {
        routes = routes.route("/metrics", get(status::metrics_text));
    }
    stack(&state, limits).finish(routes).with_state(state)
}

/// The routes LMCache's MP servers call, which send no token (`--api-token-peers` covers
/// them), and those that never need one; every other route is classed by its method (GETs
/// read, the rest write), and `POST /directory/*` are reads.
pub fn policy(auth: Auth) -> Policy {
    use axum::http::Method as M;
    use Access::{Open, Peer, Read};
    let routes = vec![
        (M::POST, "/instances", Peer),
        (M::PUT, "/instances/{id}/heartbeat", Peer),
        (M::DELETE, "/instances/{id}", Peer),
        (M::POST, "/events", Peer),
        (M::POST, "/quota/events", Peer),
        (M::POST, "/directory/lookup", Read),
        (M::POST, "/directory/blend-lookup", Read),
        (M::GET, "/healthz", Open),
        (M::GET, "/readyz", Open),
        (M::GET, "/openapi.json", Open),
    ];
    Policy::new("coordinator", routes, auth)
}

/// The HTTP stack of the coordinator's routes.
fn stack(state: &ApiState, limits: HttpLimits) -> Stack {
    Stack {
        policy: Arc::new(policy(state.auth.clone())),
        limits,
        metrics: Arc::clone(&state.http_metrics),
        guard: Guard::OriginOnly,
        style: crate::web::json::ErrorStyle::FastApi,
    }
}
