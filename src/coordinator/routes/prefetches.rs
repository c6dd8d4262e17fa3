//! `/cache/prefetches`: warm prefetch, forwarded to the named MP server (submit, then poll).

use super::{address_of, invalid, parse, JsonBody};
use crate::coordinator::state::api_state::ApiState;
use crate::coordinator::state::outbound;
use crate::web::error::ApiError;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

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

pub(super) async fn prefetch(
    State(s): State<Arc<ApiState>>,
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

pub(super) async fn prefetch_status(
    State(s): State<Arc<ApiState>>,
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
