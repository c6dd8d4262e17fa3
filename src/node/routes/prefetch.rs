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

use crate::node::metrics::NodeMetrics;
use crate::node::model::keys::{blake3_chunk_hashes, encode, EncodedKey};
use crate::node::model::prefetches::{PrefetchJob, Prefetches};
use crate::node::tiers::{TieredStore, Warmed};
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;

/// Most token ids in one request (0.5.6's cap).
const MAX_TOKEN_IDS: usize = 1_000_000;

#[derive(Deserialize)]
struct Submit {
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

fn detail(status: StatusCode, text: impl Into<String>) -> Response {
    crate::web::error::ApiError::of_status(status, text).into_response()
}

/// `POST /cache/prefetches`.
pub(crate) async fn submit(
    tiers: Arc<TieredStore>,
    metrics: Arc<NodeMetrics>,
    prefetches: Arc<Prefetches>,
    body: Bytes,
) -> Response {
    let refused = |status, text: String| {
        metrics.prefetches.with_label_values(&["refused"]).inc();
        detail(status, text)
    };
    let b: Submit = match crate::web::body::read(&body) {
        Ok(b) => b,
        Err(e) => return refused(StatusCode::UNPROCESSABLE_ENTITY, format!("body: {e}")),
    };
    let Ok(world) = u8::try_from(b.world_size) else {
        return refused(
            StatusCode::UNPROCESSABLE_ENTITY,
            "world_size must be in 1..=255".into(),
        );
    };
    if world == 0 {
        return refused(
            StatusCode::UNPROCESSABLE_ENTITY,
            "world_size must be in 1..=255".into(),
        );
    }
    if b.source_tier.as_deref().unwrap_or("l2") != "l2"
        || b.target_tier.as_deref().unwrap_or("l1") != "l1"
    {
        return refused(
            StatusCode::BAD_REQUEST,
            "only source_tier l2 to target_tier l1 is supported".into(),
        );
    }
    if b.token_ids.len() > MAX_TOKEN_IDS {
        return refused(
            StatusCode::BAD_REQUEST,
            format!(
                "too many token_ids in a single request (limit={MAX_TOKEN_IDS}, got={})",
                b.token_ids.len()
            ),
        );
    }
    if b.model_name.contains('@') {
        return refused(
            StatusCode::BAD_REQUEST,
            "model_name must not contain '@'".into(),
        );
    }
    if b.cache_salt.chars().count() > 128 || b.cache_salt.contains(['@', '/', '\\', '\0']) {
        return refused(
            StatusCode::BAD_REQUEST,
            "cache_salt: at most 128 characters, without '@ / \\ NUL'".into(),
        );
    }
    let hashes = blake3_chunk_hashes(&b.token_ids, prefetches.chunk_size());
    if hashes.is_empty() {
        return (
            StatusCode::ACCEPTED,
            Json(json!({"chunks": 0, "status": "noop"})),
        )
            .into_response();
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
    let Some(id) = prefetches.reserve() else {
        return refused(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many warm prefetches running; retry later".into(),
        );
    };
    metrics.prefetches.with_label_values(&["submitted"]).inc();
    let chunks = hashes.len();
    let (job, t) = (id.clone(), Arc::clone(&tiers));
    tiers.spawn(async move {
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
    (
        StatusCode::ACCEPTED,
        Json(json!({"request_id": id, "chunks": chunks, "status": "submitted"})),
    )
        .into_response()
}

/// `GET /cache/prefetches/{request_id}`.
pub(crate) fn poll(prefetches: &Prefetches, id: &str) -> Response {
    let job = prefetches.job(id);
    match job {
        Some(PrefetchJob::Pending) => Json(json!({"request_id": id, "status": "pending"})).into_response(),
        Some(PrefetchJob::Completed { found, total }) => Json(json!({
            "request_id": id, "status": "completed", "found_keys": found, "total_keys": total
        }))
        .into_response(),
        None => detail(
            StatusCode::NOT_FOUND,
            format!("unknown prefetch request_id={id:?} (never submitted, or forgotten)"),
        ),
    }
}
