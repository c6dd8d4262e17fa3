//! The coordinator's node routes on the node's HTTP listener: `GET /cache/objects` (a page of
//! one tier's keys) and `DELETE /cache/objects {"keys": [...]}` (the coordinator's quota
//! eviction), in the bodies an LMCache 0.5.6 MP server uses.
//!
//! The coordinator names objects by an encoded key (`model_name`, `chunk_hash_hex`, `kv_rank`,
//! `object_group_id`, `cache_salt`); the node stores LMCache's key strings, and [`encode`]
//! maps one to the other (`model::keys`). Keys that do not parse are left out of listings and
//! cannot be deleted by an encoded key (a DELETE may also name raw key strings).

use super::error::NodeError;
use super::{i64_schema, AppState};
use crate::node::config::MAX_DELETE_KEYS;
use crate::node::metrics::NodeMetrics;
use crate::node::model::keys::{encode, norm_hex, EncodedKey};
use crate::node::tiers::{TierSet, TieredStore};
use crate::web::error::ApiError;
use crate::web::json::{from_object, RawBody};
use crate::web::route::Documented;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::Arc;

/// Largest `page_size` served (a larger one lists this many, as LMCache's MP server).
const MAX_PAGE_SIZE: usize = 1000;
/// Default `page_size`.
const DEFAULT_PAGE_SIZE: usize = 100;

#[derive(Deserialize)]
pub(super) struct PageQuery {
    #[serde(default)]
    tier: Option<String>,
    #[serde(default)]
    page_size: Option<usize>,
    #[serde(default)]
    page_token: Option<String>,
}

#[derive(Serialize)]
struct ListedObject {
    key: EncodedKey,
    size_bytes: u64,
    raw_key: String,
}

#[derive(Serialize)]
pub(super) struct ObjectPage {
    tier: &'static str,
    entries: Vec<ListedObject>,
    next_page_token: Option<String>,
}

/// Counts one call of `route` by its outcome (every refusal is `bad_request`).
fn counted<T>(metrics: &NodeMetrics, route: &str, r: Result<T, ApiError>) -> Result<T, ApiError> {
    let outcome = if r.is_ok() { "ok" } else { "bad_request" };
    metrics
        .coordinator_requests
        .with_label_values(&[route, outcome])
        .inc();
    r
}

/// `GET /cache/objects?tier=l1|l2&page_size=N&page_token=T`: keys in key order; the token is
/// the last key of the previous page.
pub(super) async fn list(
    State(s): State<AppState>,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Json<ObjectPage>, ApiError> {
    counted(&s.metrics, "list", page(&s.tiers, q)).map(Json)
}

fn page(
    tiers: &TieredStore,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> Result<ObjectPage, ApiError> {
    // A query that does not parse gets the one error shape, not axum's text.
    let q = q.map_err(|e| NodeError::Query(e.body_text()))?;
    let l2 = match q.tier.as_deref().unwrap_or("l2") {
        "l2" | "L2" => true,
        "l1" | "L1" => false,
        other => {
            return Err(NodeError::Invalid(format!("tier must be l1 or l2, not {other:?}")).into())
        }
    };
    // 0 is refused, as the document's `minimum: 1` says; above the ceiling the page is the
    // ceiling's size (LMCache's MP server clamps it the same way, and says so).
    let size = match q.page_size.unwrap_or(DEFAULT_PAGE_SIZE) {
        0 => return Err(NodeError::Invalid("page_size must be at least 1".into()).into()),
        n => n.min(MAX_PAGE_SIZE),
    };
    let (listed, more) = tiers.page(l2, q.page_token.as_deref(), size);
    let next_page_token = if more {
        listed.last().map(|l| l.key.clone())
    } else {
        None
    };
    let entries: Vec<ListedObject> = listed
        .into_iter()
        .filter_map(|l| {
            encode(&l.key).map(|key| ListedObject {
                key,
                size_bytes: l.size_bytes,
                raw_key: l.key,
            })
        })
        .collect();
    Ok(ObjectPage {
        tier: if l2 { "l2" } else { "l1" },
        entries,
        next_page_token,
    })
}

#[derive(Deserialize)]
#[serde(untagged)]
enum DeleteKey {
    Encoded(EncodedKey),
    Raw(String),
}

/// `DELETE /cache/objects`'s body (LMCache 0.5.6's MP server's).
#[derive(Deserialize)]
pub(super) struct DeleteKeysBody {
    keys: Vec<DeleteKey>,
    /// `l1`, `l2` or `all`; 0.5.6's default is `l2` (what its eviction loop means).
    #[serde(default)]
    tier: Option<String>,
    /// 0.5.6's `force`: delete objects even while a client reads them (an L1 reply in flight
    /// finishes from its own reference; an L2 read not yet at its file misses). Pinned
    /// objects stay either way. `adapter` is accepted and ignored: a node has one L2.
    #[serde(default)]
    force: bool,
}

impl Documented for DeleteKeysBody {
    fn schema() -> Value {
        let key = json!({"oneOf": [
            {"type": "string", "description": "the key as `lm://` names it"},
            {"type": "object", "required": ["chunk_hash_hex", "model_name", "kv_rank"],
             "properties": {"chunk_hash_hex": {"type": "string"}, "model_name": {"type": "string"},
                            "kv_rank": i64_schema(), "object_group_id": i64_schema(),
                            "cache_salt": {"type": "string"}}}]});
        json!({"type": "object", "required": ["keys"], "properties": {
            "keys": {"type": "array", "items": key},
            "tier": {"type": "string", "enum": ["l1", "l2", "all"]},
            "force": {"type": "boolean"},
            "adapter": {"description": "0.5.6's L2 adapter name: accepted and ignored (a node has one L2)"}}})
    }
}

/// The tiers a delete's `tier` names (0.5.6's default: `l2`).
fn delete_tiers(tier: Option<&str>) -> Option<TierSet> {
    match tier.unwrap_or("l2") {
        "l1" | "L1" => Some(TierSet {
            l1: true,
            l2: false,
        }),
        "l2" | "L2" => Some(TierSet {
            l1: false,
            l2: true,
        }),
        "all" | "ALL" => Some(TierSet::ALL),
        _ => None,
    }
}

/// `DELETE /cache/objects {"keys": [encoded key or key string, ...], "tier": "l1"|"l2"|"all"}`
/// → `{"deleted": n, "skipped": m, "ok": true}`, as LMCache 0.5.6's MP server answers.
pub(super) async fn delete(
    State(s): State<AppState>,
    body: Result<RawBody, ApiError>,
) -> Result<Json<Value>, ApiError> {
    let deleted = counted(&s.metrics, "delete", delete_keys(&s.tiers, body))?;
    s.metrics.coordinator_deleted.inc_by(deleted.deleted);
    Ok(Json(json!({
        "deleted": deleted.deleted,
        "skipped": deleted.requested.saturating_sub(deleted.deleted),
        "ok": true,
    })))
}

/// What a delete did: keys named, keys deleted.
struct DeleteCount {
    requested: u64,
    deleted: u64,
}

fn delete_keys(
    tiers: &Arc<TieredStore>,
    body: Result<RawBody, ApiError>,
) -> Result<DeleteCount, ApiError> {
    // A refused body is counted here too (a read timeout also by `web::serve`'s limit hook).
    let RawBody(body) = body?;
    let parsed: DeleteKeysBody = from_object(&body)?;
    let Some(which) = delete_tiers(parsed.tier.as_deref()) else {
        return Err(NodeError::Invalid(format!(
            "tier must be l1, l2 or all, not {:?}",
            parsed.tier
        ))
        .into());
    };
    if which.l2 && !tiers.has_l2() {
        return Err(NodeError::NoL2.into());
    }
    if parsed.keys.len() > MAX_DELETE_KEYS {
        return Err(
            NodeError::TooLarge(format!("at most {MAX_DELETE_KEYS} keys per request")).into(),
        );
    }
    let requested = parsed.keys.len() as u64;
    let mut encoded = HashSet::new();
    let mut raw = HashSet::new();
    for k in parsed.keys {
        match k {
            DeleteKey::Encoded(mut e) => {
                if let Some(h) = norm_hex(&e.chunk_hash_hex) {
                    e.chunk_hash_hex = h;
                    encoded.insert(e);
                }
            }
            DeleteKey::Raw(s) => {
                raw.insert(s);
            }
        }
    }
    let deleted = tiers
        .delete_in(which, parsed.force, |k| {
            raw.contains(k)
                || (!encoded.is_empty() && encode(k).is_some_and(|e| encoded.contains(&e)))
        })
        .keys;
    Ok(DeleteCount {
        requested,
        deleted: deleted as u64,
    })
}
