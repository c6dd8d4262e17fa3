//! The coordinator's HTTP routes (axum): request bodies in, [`Model`] calls through the
//! owner [`Handle`], JSON replies out; prefetch calls forwarded to the named MP server.
//!
//! Owns request validation and the error envelope (`{"detail": ...}`, FastAPI's shape; a
//! 422 lists `{"type","loc","msg"}` naming the field). Must not hold model state itself.

pub use super::api_state::ApiState;
use super::api_state::Shared;
use super::api_state::{address_of, invalid, parse};
use super::cache_api;
use super::events::{Batch, CacheEvents, LegacyEvents};
use super::fleet::{FleetError, Registration};
use super::limits::JsonBody;
use super::metrics;
use super::model::{Ingested, QuotaError, SLICE_OPS};
use super::outbound;
use crate::web::access::{Access, Auth, Policy};
use crate::web::error::ApiError;
use crate::web::exposition::Exposition;
use crate::web::stack::{Guard, Stack};
use crate::web::HttpLimits;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The router of every coordinator route.
pub fn router(state: Shared) -> Router {
    let limits = state.http;
    let features = state.features;
    let mut routes = Router::new()
        .merge(super::dashboard::routes(&state))
        .merge(super::directory_api::routes())
        .route("/instances", post(register).get(list_instances))
        .route("/instances/usage", get(fleet_usage))
        .route("/instances/{id}/usage", get(instance_usage))
        .route("/instances/{id}/heartbeat", put(heartbeat))
        .route("/instances/{id}", delete(deregister))
        .route(
            "/healthz",
            get(|| async { Json(json!({"status": "healthy"})) }),
        )
        .route("/readyz", get(readyz))
        .route("/quota/events", post(legacy_events))
        .route("/events", post(events))
        .route("/cache/prefetches", post(prefetch))
        .route(
            "/cache/prefetches/{instance}/{request}",
            get(prefetch_status),
        )
        .route("/cache/delete", post(cache_api::delete))
        .route("/coordinator/cluster", get(cluster_status))
        .route(
            "/openapi.json",
            get(|State(s): State<Shared>| async move {
                let mut doc = super::openapi::document();
                crate::web::openapi::annotate(&mut doc, &policy(s.auth.clone()));
                Json(doc)
            }),
        );
    if features.eviction_controller {
        // 0.5.6's FleetEvictionController owns these (`disabled_controllers` removes them).
        routes = routes
            .route("/quota", get(list_quota))
            .route("/quota/config", put(set_quota_config).get(get_quota_config))
            .route(
                "/quota/{salt}",
                put(set_quota).get(get_quota).delete(remove_quota),
            )
            .route(
                "/cache/pins",
                post(cache_api::pin)
                    .delete(cache_api::unpin)
                    .get(cache_api::list),
            );
    }
    if features.metrics {
        routes = routes.route("/metrics", get(metrics_text));
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
fn stack(state: &Shared, limits: HttpLimits) -> Stack {
    Stack {
        policy: Arc::new(policy(state.auth.clone())),
        limits,
        metrics: Arc::clone(&state.http_metrics),
        guard: Guard::OriginOnly,
        style: crate::web::json::ErrorStyle::FastApi,
    }
}

/// `_default` names the empty salt.
fn salt_of(path: &str) -> &str {
    if path == "_default" {
        ""
    } else {
        path
    }
}

#[derive(Deserialize)]
struct RegisterBody {
    ip: String,
    http_port: i64,
    #[serde(default)]
    instance_id: Option<String>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    p2p_advertised_url: String,
    #[serde(default)]
    mq_port: i64,
}

async fn register(
    State(s): State<Shared>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let b: RegisterBody = parse(&s, &body)?;
    // The document's rule exactly: 1 to 255 characters, no whitespace, control or '/'.
    let ip = b.ip;
    if ip.is_empty()
        || ip.chars().count() > 255
        || ip.contains(|c: char| c.is_whitespace() || c.is_control() || c == '/')
    {
        return Err(invalid(
            &s,
            "ip",
            "ip must be a non-blank host without spaces or '/'",
        ));
    }
    let http_port = u16::try_from(b.http_port)
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| invalid(&s, "http_port", "http_port must be in 1..=65535"))?;
    let mq_port = u16::try_from(b.mq_port)
        .map_err(|_| invalid(&s, "mq_port", "mq_port must be in 0..=65535"))?;
    let instance_id = b
        .instance_id
        .map(|i| i.trim().to_owned())
        .filter(|i| !i.is_empty());
    if let Some(id) = &instance_id {
        // An id with '/' could register but never heartbeat or deregister (LMCache Q15).
        if id.len() > 256 || id.contains('/') {
            return Err(invalid(
                &s,
                "instance_id",
                "instance_id must be at most 256 characters without '/'",
            ));
        }
    }
    let req = Registration {
        instance_id,
        ip,
        http_port,
        metadata: b.metadata,
        p2p_advertised_url: b.p2p_advertised_url.trim().to_owned(),
        mq_port,
    };
    let gen = || format!("mp-{:032x}", rand::random::<u128>());
    match s.handle.register(req, gen).await? {
        Ok((id, again)) => Ok(Json(json!({"instance_id": id, "re_registered": again}))),
        Err(e @ FleetError::Full(_)) => {
            s.refused.instances.fetch_add(1, Ordering::Relaxed);
            Err(ApiError::Unavailable(e.to_string()))
        }
    }
}

async fn heartbeat(
    State(s): State<Shared>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let known = s.handle.heartbeat(id.clone()).await?;
    if known {
        Ok(Json(json!({ "instance_id": id })))
    } else {
        Err(ApiError::NotFound(format!(
            "unknown instance {id}; re-register"
        )))
    }
}

async fn deregister(
    State(s): State<Shared>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    s.handle.deregister(id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_instances(State(s): State<Shared>) -> Result<Json<Value>, ApiError> {
    let list = s
        .handle
        .fleet(|f, _, _| f.iter().cloned().collect::<Vec<_>>())
        .await?;
    Ok(Json(json!({ "instances": list })))
}

/// `GET /instances/usage`: the registered ids from the fleet owner, then the model's view.
async fn fleet_usage(State(s): State<Shared>) -> Result<Json<Value>, ApiError> {
    let ids = s
        .handle
        .fleet(|f, _, _| f.iter().map(|i| i.instance_id.clone()).collect::<Vec<_>>())
        .await?;
    let view = s.handle.with(move |m, _, _| m.fleet_usage(ids)).await?;
    Ok(Json(json!(view)))
}

/// `GET /instances/{id}/usage`: 404 when the id is not registered, holds no bytes and
/// declared nothing.
async fn instance_usage(
    State(s): State<Shared>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let key = id.clone();
    let registered = s.handle.fleet(move |f, _, _| f.get(&key).is_some()).await?;
    let key = id.clone();
    match s
        .handle
        .with(move |m, _, _| m.instance_usage(&key, registered))
        .await?
    {
        Some(status) => Ok(Json(json!(status))),
        None => Err(ApiError::NotFound(format!("unknown instance '{id}'"))),
    }
}

#[derive(Deserialize)]
struct QuotaBody {
    limit_gb: f64,
    #[serde(default)]
    tier: Option<String>,
}

/// `PUT /quota/config`'s body. Unknown fields are refused (422 naming the field): 0.5.6
/// ignores them, so `{"limit_gb": 5}` silently reset its default quota (Q10). `{}` sets
/// `null`, as in 0.5.6 (salts without a quota exempt: the direction that never evicts).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaConfigBody {
    #[serde(default)]
    default_limit_gb: Option<f64>,
    #[serde(default)]
    tier: Option<String>,
}

/// The `tier` query parameter of the quota routes.
#[derive(Deserialize)]
pub struct TierQuery {
    tier: Option<String>,
}

/// A cache tier as LMCache 0.5.6 names them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum TierName {
    L1,
    L2,
    All,
}

impl TierName {
    fn as_str(self) -> &'static str {
        match self {
            TierName::L1 => "l1",
            TierName::L2 => "l2",
            TierName::All => "all",
        }
    }
}

/// Parses a `tier` (absent: `l2`); any other name is a 422 at `loc`, as FastAPI's enum check.
fn tier_of(s: &ApiState, tier: Option<&str>, loc: &str) -> Result<TierName, ApiError> {
    match tier {
        None | Some("l2") => Ok(TierName::L2),
        Some("l1") => Ok(TierName::L1),
        Some("all") => Ok(TierName::All),
        Some(other) => {
            s.refused.invalid_bodies.fetch_add(1, Ordering::Relaxed);
            Err(ApiError::value_error(
                vec![json!(loc), json!("tier")],
                format!("Input should be 'l1', 'l2' or 'all' (got {other:?})"),
            ))
        }
    }
}

/// Quota writes and `GET /quota/config` apply to `l2` only (400 otherwise, as 0.5.6).
fn require_quota_tier(tier: TierName) -> Result<(), ApiError> {
    if tier == TierName::L2 {
        return Ok(());
    }
    Err(ApiError::BadRequest(format!(
        "quotas apply to tier 'l2' only, not '{}'",
        tier.as_str()
    )))
}

/// Usage reads: `all` is 400 as in 0.5.6; `l1` is 400 too, because kvplane tracks L2 usage
/// only (0.5.6 also counts L1 bytes per salt).
fn require_accounted_tier(tier: TierName) -> Result<(), ApiError> {
    match tier {
        TierName::L2 => Ok(()),
        TierName::All => Err(ApiError::BadRequest(
            "tier 'all' has no usage accounting; only 'l1', 'l2'".into(),
        )),
        TierName::L1 => Err(ApiError::BadRequest(
            "kvplane tracks L2 usage only; tier 'l1' is not accounted".into(),
        )),
    }
}

async fn set_quota_config(
    State(s): State<Shared>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let b: QuotaConfigBody = parse(&s, &body)?;
    require_quota_tier(tier_of(&s, b.tier.as_deref(), "body")?)?;
    let limit = b.default_limit_gb;
    if limit.is_some_and(|l| l < 0.0) {
        return Err(invalid(
            &s,
            "default_limit_gb",
            "default_limit_gb must be >= 0 or null",
        ));
    }
    s.handle
        .set_default_limit(limit)
        .await?
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    s.metadata.save(s.handle.metadata()).await;
    Ok(Json(json!({ "default_limit_gb": limit })))
}

async fn get_quota_config(
    State(s): State<Shared>,
    Query(q): Query<TierQuery>,
) -> Result<Json<Value>, ApiError> {
    require_quota_tier(tier_of(&s, q.tier.as_deref(), "query")?)?;
    let limit = s.handle.with(|m, _, _| m.default_limit_gb()).await?;
    Ok(Json(json!({ "default_limit_gb": limit })))
}

async fn set_quota(
    State(s): State<Shared>,
    Path(salt): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let b: QuotaBody = parse(&s, &body)?;
    require_quota_tier(tier_of(&s, b.tier.as_deref(), "body")?)?;
    let salt = salt_of(&salt).to_owned();
    let limit = b.limit_gb;
    let reply_salt = salt.clone();
    let r = s.handle.set_quota(salt, limit).await?;
    match r {
        Ok(()) => {
            s.metadata.save(s.handle.metadata()).await;
            Ok(Json(
                json!({"cache_salt": reply_salt, "limit_gb": limit, "status": "ok"}),
            ))
        }
        Err(e @ (QuotaError::InvalidLimit | QuotaError::InvalidSalt)) => {
            Err(ApiError::BadRequest(e.to_string()))
        }
        Err(e @ QuotaError::Full(_)) => Err(ApiError::Unavailable(e.to_string())),
    }
}

async fn get_quota(
    State(s): State<Shared>,
    Path(salt): Path<String>,
    Query(q): Query<TierQuery>,
) -> Result<Json<Value>, ApiError> {
    require_accounted_tier(tier_of(&s, q.tier.as_deref(), "query")?)?;
    let salt = salt_of(&salt).to_owned();
    let st = s.handle.with(move |m, _, _| m.quota_status(&salt)).await?;
    Ok(Json(json!(st)))
}

async fn remove_quota(
    State(s): State<Shared>,
    Path(salt): Path<String>,
    Query(q): Query<TierQuery>,
) -> Result<Json<Value>, ApiError> {
    require_quota_tier(tier_of(&s, q.tier.as_deref(), "query")?)?;
    let salt = salt_of(&salt).to_owned();
    let reply_salt = salt.clone();
    let existed = s.handle.remove_quota(salt).await?;
    if existed {
        s.metadata.save(s.handle.metadata()).await;
    }
    let status = if existed { "removed" } else { "not_found" };
    Ok(Json(
        json!({"cache_salt": reply_salt, "limit_gb": 0.0, "status": status}),
    ))
}

async fn list_quota(
    State(s): State<Shared>,
    Query(q): Query<TierQuery>,
) -> Result<Json<Value>, ApiError> {
    require_accounted_tier(tier_of(&s, q.tier.as_deref(), "query")?)?;
    let (total, rows) = s.handle.with(|m, _, _| m.quota_list()).await?;
    Ok(Json(json!({"total_gb": total, "by_cache_salt": rows})))
}

fn check_events(s: &ApiState, n: usize, field: &'static str) -> Result<(), ApiError> {
    if n > s.max_events_per_request {
        s.refused.events_per_request.fetch_add(1, Ordering::Relaxed);
        return Err(invalid(
            s,
            field,
            format!(
                "{n} events in one request; at most {} accepted",
                s.max_events_per_request
            ),
        ));
    }
    Ok(())
}

async fn legacy_events(
    State(s): State<Shared>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let b: LegacyEvents = parse(&s, &body)?;
    if b.seq < 1 {
        return Err(invalid(&s, "seq", "seq must be >= 1"));
    }
    check_events(&s, b.events.len(), "events")?;
    let got = ingest(&s, vec![Batch::from(b)]).await?;
    Ok(Json(json!({ "recorded": got.recorded })))
}

async fn events(
    State(s): State<Shared>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let b: CacheEvents = parse(&s, &body)?;
    let n: usize = b.batches.iter().map(|b| b.entries.len()).sum();
    check_events(&s, n, "batches")?;
    if b.batches
        .iter()
        .any(|b| b.seq < 1 || b.instance_id.is_empty())
    {
        return Err(invalid(
            &s,
            "batches",
            "every batch needs a non-empty instance_id and seq >= 1",
        ));
    }
    let batches: Vec<Batch> = b.batches.into_iter().map(Batch::from).collect();
    let got = ingest(&s, batches).await?;
    Ok(Json(json!(got)))
}

/// Admits the batches and applies the first [`SLICE_OPS`] events in one job (a typical
/// request is one job), then the rest one slice per job (the owner answers other callers in
/// between). The reply waits for the last slice, so usage read after a reply includes the
/// request.
async fn ingest(s: &ApiState, batches: Vec<Batch>) -> Result<Ingested, ApiError> {
    let (got, rest) = s.handle.admit(batches, SLICE_OPS).await?;
    for b in rest {
        s.handle.apply_slice(b).await?;
    }
    Ok(got)
}

#[derive(Deserialize)]
struct PrefetchBody {
    instance_id: String,
    model_name: String,
    world_size: i64,
    #[serde(default)]
    token_ids: Vec<u32>,
    #[serde(default)]
    cache_salt: String,
}

async fn prefetch(
    State(s): State<Shared>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let b: PrefetchBody = parse(&s, &body)?;
    if !(1..=255).contains(&b.world_size) {
        return Err(invalid(&s, "world_size", "world_size must be in 1..=255"));
    }
    let (ip, port) = address_of(&s, &b.instance_id).await?;
    let chunks = b.token_ids.len() / s.chunk_size.max(1);
    if chunks == 0 {
        return Ok(Json(json!({
            "instance_id": b.instance_id, "request_id": "", "chunks": 0, "status": "noop"
        })));
    }
    let fwd = json!({
        "model_name": b.model_name, "world_size": b.world_size,
        "token_ids": b.token_ids, "cache_salt": b.cache_salt,
    });
    let v = outbound::call_json(
        &ip,
        port,
        ("POST", "/cache/prefetches"),
        &fwd,
        s.outbound_timeout,
        |why| {
            ApiError::BadGateway(format!(
                "prefetch submit to '{}' failed: {why}",
                b.instance_id
            ))
        },
    )
    .await?;
    let request_id = v.get("request_id").and_then(Value::as_str).unwrap_or("");
    let chunks = v
        .get("chunks")
        .and_then(Value::as_u64)
        .unwrap_or(chunks as u64);
    Ok(Json(json!({
        "instance_id": b.instance_id, "request_id": request_id,
        "chunks": chunks, "status": "submitted"
    })))
}

async fn prefetch_status(
    State(s): State<Shared>,
    Path((instance, request)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let (ip, port) = address_of(&s, &instance).await?;
    if request.is_empty()
        || !request
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-')
    {
        return Err(ApiError::NotFound(format!(
            "unknown prefetch request_id='{request}'"
        )));
    }
    let path = format!("/cache/prefetches/{request}");
    let reply = outbound::MP
        .call(&ip, port, "GET", &path, None, s.outbound_timeout)
        .await
        .map_err(|e| ApiError::BadGateway(format!("prefetch poll of '{instance}' failed: {e}")))?;
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::BAD_GATEWAY);
    Ok((
        status,
        [(header::CONTENT_TYPE, "application/json")],
        reply.body,
    )
        .into_response())
}

async fn metrics_text(State(s): State<Shared>) -> Result<Response, ApiError> {
    let fleet = s
        .handle
        .fleet(|f, _, _| metrics::FleetNumbers::of(f))
        .await?;
    let snapshot = s
        .handle
        .with(move |m, _, _| metrics::Snapshot::of(m, fleet))
        .await?;
    let directory = s
        .handle
        .with(|m, _, _| super::directory_api::DirectoryMetrics::of(m))
        .await?;
    let mut out = Exposition::new();
    metrics::write(
        &mut out,
        &snapshot,
        &s.handle.stats,
        &s.refused,
        &s.metadata,
    );
    directory.write_to(&mut out);
    if let Some(c) = &s.checkpoint {
        c.write_metrics(&mut out);
    }
    if let Some(c) = &s.cluster {
        c.write_metrics(&mut out);
    }
    s.http_metrics.write_to(&mut out);
    Ok(out.response())
}

/// `GET /readyz`: 200 while the owner tasks answer (this process serves: a `--cluster`
/// standby binds no port), 503 once they stopped.
async fn readyz(State(s): State<Shared>) -> Response {
    match s.handle.fleet(|_, _, _| ()).await {
        Ok(()) => Json(json!({"status": "ready"})).into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "stopping", "detail": e.to_string()})),
        )
            .into_response(),
    }
}

/// `GET /coordinator/cluster`: this coordinator's place in its cluster (`--cluster`), or
/// `{"role": "standalone"}`.
async fn cluster_status(State(s): State<Shared>) -> Json<Value> {
    Json(
        s.cluster
            .as_ref()
            .map_or_else(|| json!({"role": "standalone"}), |c| c.json()),
    )
}
