//! The cache-control routes of LMCache 0.5.6's coordinator: `POST/DELETE/GET /cache/pins`
//! (keys pinned against the fleet eviction plan) and `POST /cache/delete` (a token sequence
//! deleted on one MP server, pinned L2 keys held back unless `force`). Token sequences become
//! object keys with [`crate::coordinator::model::pins::resolve`]; the pin table lives in the model.

use super::limits::JsonBody;
use super::{address_of, invalid, parse};
use crate::config::defaults::coordinator::MAX_PINNED_KEYS;
use crate::coordinator::model::pins::{self, Pinned};
use crate::coordinator::state::api_state::ApiState;
use crate::coordinator::state::outbound;
use crate::web::error::ApiError;
use axum::extract::{Query, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// Most keys one `POST /cache/delete` sends after adding the other object groups' copies (the
/// resolved keys themselves always go).
pub(crate) const MAX_DELETE_KEYS: usize = 1_000_000;

#[derive(Deserialize)]
struct PinBody {
    model_name: String,
    world_size: i64,
    #[serde(default)]
    token_ids: Vec<u32>,
    #[serde(default)]
    cache_salt: String,
}

#[derive(Deserialize)]
struct CacheDeleteBody {
    instance_id: String,
    model_name: String,
    world_size: i64,
    #[serde(default)]
    token_ids: Vec<u32>,
    #[serde(default)]
    cache_salt: String,
    #[serde(default)]
    tier: Option<String>,
    #[serde(default)]
    force: bool,
}

/// `world_size` in 1..=255 (0.5.6 has no upper bound, Q11), else 422.
fn world_size(s: &ApiState, w: i64) -> Result<u8, ApiError> {
    u8::try_from(w)
        .ok()
        .filter(|&w| w >= 1)
        .ok_or_else(|| invalid(s, "world_size", "world_size must be in 1..=255"))
}

fn resolve(
    s: &ApiState,
    model: &str,
    world: i64,
    tokens: &[u32],
    salt: &str,
) -> Result<(Vec<crate::coordinator::model::keys::EncodedKey>, usize), ApiError> {
    resolve_keys(s, model, world_size(s, world)?, tokens, salt)
}

/// The keys of the complete chunks of `tokens` ([`pins::resolve`]) and how many chunks;
/// a sequence that cannot be resolved is a 400.
pub(super) fn resolve_keys(
    s: &ApiState,
    model: &str,
    world: u8,
    tokens: &[u32],
    salt: &str,
) -> Result<(Vec<crate::coordinator::model::keys::EncodedKey>, usize), ApiError> {
    pins::resolve(model, world, tokens, salt, s.chunk_size)
        .map_err(|e| ApiError::BadRequest(e.to_string()))
}

/// `POST /cache/pins`: pins the keys of the complete chunks of `token_ids`.
pub(crate) async fn pin(
    State(s): State<Arc<ApiState>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    pin_or_unpin(&s, &body, true).await
}

/// `DELETE /cache/pins`: removes one pin from each of those keys.
pub(crate) async fn unpin(
    State(s): State<Arc<ApiState>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    pin_or_unpin(&s, &body, false).await
}

/// `pin`s (or removes one pin from) the keys of the complete chunks of the body's
/// `token_ids`, saves the metadata and says how many.
async fn pin_or_unpin(s: &ApiState, body: &[u8], pin: bool) -> Result<Json<Value>, ApiError> {
    let b: PinBody = parse(s, body)?;
    let (keys, chunks) = resolve(s, &b.model_name, b.world_size, &b.token_ids, &b.cache_salt)?;
    let affected = keys.len();
    let status = if pin {
        s.handle
            .pin(keys, MAX_PINNED_KEYS)
            .await?
            .map_err(|e| ApiError::Unavailable(e.to_string()))?;
        "pinned"
    } else {
        s.handle.unpin(keys).await?;
        "unpinned"
    };
    s.metadata.save(s.handle.metadata()).await;
    Ok(Json(
        json!({"requested": chunks, "affected": affected, "status": status}),
    ))
}

/// The query of `GET /cache/pins`.
#[derive(Deserialize)]
pub(crate) struct PinQuery {
    #[serde(default)]
    cache_salt: String,
    #[serde(default)]
    model_name: String,
    #[serde(default)]
    offset: Option<i64>,
    #[serde(default)]
    limit: Option<i64>,
}

/// `GET /cache/pins?cache_salt=&model_name=&offset=0&limit=1000`.
pub(crate) async fn list(
    State(s): State<Arc<ApiState>>,
    Query(q): Query<PinQuery>,
) -> Result<Json<Value>, ApiError> {
    let query_error = |field: &str, msg: &str| {
        ApiError::value_error(vec![json!("query"), json!(field)], msg.to_owned())
    };
    let offset = usize::try_from(q.offset.unwrap_or(0))
        .map_err(|_| query_error("offset", "Input should be greater than or equal to 0"))?;
    let limit = q.limit.unwrap_or(1000);
    if !(1..=10_000).contains(&limit) {
        return Err(query_error("limit", "Input should be in 1..=10000"));
    }
    let (total, page): (usize, Vec<Pinned>) = s
        .handle
        .with(move |m, _, _| {
            m.pins
                .list(&q.cache_salt, &q.model_name, offset, limit as usize)
        })
        .await?;
    Ok(Json(json!({ "total": total, "pins": page })))
}

/// `POST /cache/delete`: resolves the tokens, holds back pinned keys when the delete touches
/// L2 (unless `force`, which deletes them and drops their pins), and sends the rest to the
/// named server as `DELETE /cache/objects {"keys", "tier", "force"}`.
pub(crate) async fn delete(
    State(s): State<Arc<ApiState>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let b: CacheDeleteBody = parse(&s, &body)?;
    let tier = match b.tier.as_deref() {
        None | Some("all") => "all",
        Some("l1") => "l1",
        Some("l2") => "l2",
        Some(other) => {
            return Err(invalid(
                &s,
                "tier",
                format!("Input should be 'l1', 'l2' or 'all' (got {other:?})"),
            ))
        }
    };
    let world = world_size(&s, b.world_size)?;
    let (ip, port) = address_of(&s, &b.instance_id).await?;
    let (keys, chunks) = resolve_keys(&s, &b.model_name, world, &b.token_ids, &b.cache_salt)?;
    if chunks == 0 {
        return Ok(Json(json!({
            "instance_id": b.instance_id, "requested": 0, "affected": 0, "skipped": 0,
            "status": "noop"
        })));
    }
    let touches_l2 = tier != "l1";
    let hold_pinned = touches_l2 && !b.force;
    let (send, held_back) = s
        .handle
        .with(move |m, _, _| {
            // The chunks' tracked copies in other object groups go too (0.5.6).
            let keys = m.expand_object_groups(keys, MAX_DELETE_KEYS);
            if !hold_pinned {
                return (keys, 0);
            }
            let (send, held): (Vec<_>, Vec<_>) =
                keys.into_iter().partition(|k| !m.pins.contains(k));
            (send, held.len())
        })
        .await?;
    let (mut deleted, mut skipped) = (0u64, 0u64);
    if !send.is_empty() {
        let payload = json!({"keys": send, "tier": tier, "force": b.force});
        let v = outbound::call_json(
            &ip,
            port,
            ("DELETE", "/cache/objects"),
            &payload,
            s.outbound_timeout,
            |why| ApiError::BadGateway(format!("delete to '{}' failed: {why}", b.instance_id)),
        )
        .await?;
        deleted = v.get("deleted").and_then(Value::as_u64).unwrap_or(0);
        skipped = v.get("skipped").and_then(Value::as_u64).unwrap_or(0);
    }
    if touches_l2 && b.force {
        s.handle.drop_pins(send).await?;
        s.metadata.save(s.handle.metadata()).await;
    }
    Ok(Json(json!({
        "instance_id": b.instance_id, "requested": chunks, "affected": deleted,
        "skipped": skipped + held_back as u64, "status": "deleted"
    })))
}
