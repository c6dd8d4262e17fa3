//! `/instances`: MP servers register, heartbeat and deregister (their own routes, open to
//! peers); the fleet and its usage per instance are read.

use super::{invalid, parse, JsonBody};
use crate::coordinator::model::fleet::{FleetError, Registration};
use crate::coordinator::state::api_state::ApiState;
use crate::web::error::ApiError;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

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

pub(super) async fn register(
    State(s): State<Arc<ApiState>>,
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

pub(super) async fn heartbeat(
    State(s): State<Arc<ApiState>>,
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

pub(super) async fn deregister(
    State(s): State<Arc<ApiState>>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    s.handle.deregister(id).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn list_instances(
    State(s): State<Arc<ApiState>>,
) -> Result<Json<Value>, ApiError> {
    let list = s
        .handle
        .fleet(|f, _, _| f.iter().cloned().collect::<Vec<_>>())
        .await?;
    Ok(Json(json!({ "instances": list })))
}

/// `GET /instances/usage`: the registered ids from the fleet owner, then the model's view.
pub(super) async fn fleet_usage(State(s): State<Arc<ApiState>>) -> Result<Json<Value>, ApiError> {
    let ids = s
        .handle
        .fleet(|f, _, _| f.iter().map(|i| i.instance_id.clone()).collect::<Vec<_>>())
        .await?;
    let view = s.handle.with(move |m, _, _| m.fleet_usage(ids)).await?;
    Ok(Json(json!(view)))
}

/// `GET /instances/{id}/usage`: 404 when the id is not registered, holds no bytes and
/// declared nothing.
pub(super) async fn instance_usage(
    State(s): State<Arc<ApiState>>,
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
