//! Warm prefetch, the MP server's routes a coordinator forwards to: `POST /cache/prefetches`
//! (`{"model_name","world_size","token_ids","cache_salt"}` → 202 `{"request_id","chunks",
//! "status":"submitted"}`) loads the objects of a token sequence from L2 into L1 in the
//! background; `GET /cache/prefetches/{request_id}` reports `pending`, or `completed` with
//! `found_keys` of `total_keys`.
//!
//! Tokens become keys as LMCache 0.5.6's MP server resolves them: the complete chunks of
//! `--chunk-size` tokens get rolling BLAKE3 hashes (`h_0 = blake3(0 as i64 BE ‖ 0 as u32 BE)`,
//! `h_i = blake3(h_{i-1} ‖ chunk tokens as u32 BE)`), one key per rank of `world_size`. The
//! node's keys are LMCache key strings; one matches when its coordinator form (`model::keys::
//! encode`: model, chunk hash hex, packed `kv_rank`) is one of them, whatever its dtype. Finding
//! them scans both tiers' keys once per request.
//!
//! The jobs are `model::prefetches`' (bounded): a submit while every slot holds a running job
//! gets 503.

use super::error::NodeError;
use super::AppState;
use crate::node::model::keys::{blake3_chunk_hashes, encode, EncodedKey};
use crate::node::model::prefetches::PrefetchJob;
use crate::node::tiers::Warmed;
use crate::web::error::ApiError;
use crate::web::json::{from_object, RawBody};
use crate::web::route::Documented;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashSet;

/// Most token ids in one request (0.5.6's cap).
const MAX_TOKEN_IDS: usize = 1_000_000;

/// `POST /cache/prefetches`'s body (LMCache 0.5.6's MP server's).
#[derive(Deserialize)]
pub(super) struct PrefetchBody {
    model_name: String,
    world_size: i64,
    token_ids: Vec<u32>,
    #[serde(default)]
    cache_salt: String,
    #[serde(default)]
    source_tier: Option<String>,
    #[serde(default)]
    target_tier: Option<String>,
}

/// A salt as LMCache writes it into a key (`@cache_salt%S`): the node refuses others.
fn salt_schema() -> Value {
    json!({"type": "string", "maxLength": 128, "pattern": r"^[^@/\\\x00]*$"})
}

impl Documented for PrefetchBody {
    fn schema() -> Value {
        json!({"type": "object", "required": ["model_name", "world_size", "token_ids"],
            "properties": {"model_name": {"type": "string", "pattern": "^[^@]*$"},
                "world_size": {"type": "integer", "minimum": 1, "maximum": 255},
                "token_ids": {"type": "array", "items": {"type": "integer", "minimum": 0,
                    "maximum": u32::MAX}},
                "cache_salt": salt_schema(),
                "source_tier": {"type": ["string", "null"], "enum": ["l2", null]},
                "target_tier": {"type": ["string", "null"], "enum": ["l1", null]}}})
    }
}

/// `POST /cache/prefetches`: 202 whether submitted or a noop (no complete chunk).
pub(super) async fn submit(
    State(s): State<AppState>,
    RawBody(body): RawBody,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let submitted = start(&s, &body);
    if submitted.is_err() {
        s.metrics.prefetches.with_label_values(&["refused"]).inc();
    }
    submitted.map(|answer| (StatusCode::ACCEPTED, Json(answer)))
}

/// Checks a submit, and starts its job unless it names no complete chunk.
fn start(s: &AppState, body: &[u8]) -> Result<Value, ApiError> {
    let b: PrefetchBody = from_object(body)?;
    let world = u8::try_from(b.world_size)
        .ok()
        .filter(|w| *w != 0)
        .ok_or_else(|| NodeError::Invalid("world_size must be in 1..=255".into()))?;
    if b.source_tier.as_deref().unwrap_or("l2") != "l2"
        || b.target_tier.as_deref().unwrap_or("l1") != "l1"
    {
        return Err(NodeError::Unsupported(
            "only source_tier l2 to target_tier l1 is supported".into(),
        )
        .into());
    }
    if b.token_ids.len() > MAX_TOKEN_IDS {
        return Err(NodeError::Unsupported(format!(
            "too many token_ids in a single request (limit={MAX_TOKEN_IDS}, got={})",
            b.token_ids.len()
        ))
        .into());
    }
    if b.model_name.contains('@') {
        return Err(NodeError::Unsupported("model_name must not contain '@'".into()).into());
    }
    if b.cache_salt.chars().count() > 128 || b.cache_salt.contains(['@', '/', '\\', '\0']) {
        return Err(NodeError::Unsupported(
            "cache_salt: at most 128 characters, without '@ / \\ NUL'".into(),
        )
        .into());
    }
    let hashes = blake3_chunk_hashes(&b.token_ids, s.prefetches.chunk_size());
    if hashes.is_empty() {
        return Ok(json!({"chunks": 0, "status": "noop"}));
    }
    let mut wanted: HashSet<EncodedKey> = HashSet::with_capacity(hashes.len() * usize::from(world));
    for h in &hashes {
        for rank in 0..world {
            let (w, r) = (i64::from(world), i64::from(rank));
            wanted.insert(EncodedKey {
                chunk_hash_hex: h.clone(),
                model_name: b.model_name.clone(),
                kv_rank: (w << 24) | (r << 16) | (w << 8) | r,
                object_group_id: 0,
                cache_salt: b.cache_salt.clone(),
            });
        }
    }
    let id = s.prefetches.reserve().ok_or(NodeError::PrefetchesBusy)?;
    s.metrics.prefetches.with_label_values(&["submitted"]).inc();
    let chunks = hashes.len();
    let AppState {
        tiers: t,
        metrics,
        prefetches,
        ..
    } = s.clone();
    let job = id.clone();
    s.tiers.spawn(async move {
        let total = wanted.len();
        let keys = t.keys_where(|k| encode(k).is_some_and(|e| wanted.contains(&e)));
        // Each wanted key counts once, whichever stored dtypes match it.
        let mut found: HashSet<EncodedKey> = HashSet::new();
        for k in keys {
            let outcome = t.warm(&k).await;
            let label = match outcome {
                Warmed::InL1 => "l1",
                Warmed::Loaded => "l2",
                Warmed::Missing => "missing",
            };
            metrics.prefetched_keys.with_label_values(&[label]).inc();
            if outcome != Warmed::Missing {
                if let Some(e) = encode(&k) {
                    found.insert(e);
                }
            }
        }
        metrics.prefetches.with_label_values(&["completed"]).inc();
        prefetches.complete(&job, found.len(), total);
    });
    Ok(json!({"request_id": id, "chunks": chunks, "status": "submitted"}))
}

/// `GET /cache/prefetches/{request_id}`.
pub(super) async fn poll(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    match s.prefetches.job(&id) {
        Some(PrefetchJob::Pending) => Ok(Json(json!({"request_id": id, "status": "pending"}))),
        Some(PrefetchJob::Completed { found, total }) => Ok(Json(json!({
            "request_id": id, "status": "completed", "found_keys": found, "total_keys": total
        }))),
        None => Err(NodeError::UnknownPrefetch(id).into()),
    }
}
