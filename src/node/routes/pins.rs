//! The controller's pins on the node's HTTP port: `GET /pins` counts them per tier (and
//! names up to 1,000 keys each), `POST /unpin` releases them. The controller's protocol has
//! no unpin (an LMCache worker's pins end with the request that made them), so a node, whose
//! pins last until released, takes the release here.

use super::error::NodeError;
use super::{i64_schema, AppState};
use crate::node::controller_link::{location, tier_of};
use crate::node::tiers::TierId;
use crate::web::error::ApiError;
use crate::web::json::{from_object, RawBody};
use crate::web::route::Documented;
use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

/// Keys named per tier in `GET /pins`.
const LISTED_KEYS: usize = 1000;

/// `POST /unpin`'s body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UnpinBody {
    /// `LocalCPUBackend` or `LocalDiskBackend`; absent: both.
    location: Option<String>,
    /// The tokens a `/pin` named (their prefix's objects, every rank); absent: every pinned
    /// object of the location.
    tokens: Option<Vec<i64>>,
}

impl Documented for UnpinBody {
    fn schema() -> Value {
        json!({"type": "object", "additionalProperties": false, "properties": {
            "location": {"type": ["string", "null"],
                "enum": ["LocalCPUBackend", "LocalDiskBackend", null]},
            "tokens": {"type": ["array", "null"], "items": i64_schema()}}})
    }
}

/// `GET /pins` → `{"LocalCPUBackend": {"count": n, "keys": [...]}, "LocalDiskBackend": …}`.
pub(super) async fn list(State(s): State<AppState>) -> Json<Value> {
    let tiers = &s.tiers;
    let mut out = serde_json::Map::new();
    for tier in [TierId::L1, TierId::L2] {
        let keys = tiers.held_keys(tier);
        out.insert(
            location(tier).to_owned(),
            json!({
                "count": keys.len(),
                "keys": keys.iter().take(LISTED_KEYS).collect::<Vec<_>>(),
            }),
        );
    }
    Json(Value::Object(out))
}

/// `POST /unpin {"location"?, "tokens"?}` → `{"released": objects, "num_tokens": prefix}`.
/// The body may be left out (both locations, every pin).
pub(super) async fn unpin(
    State(s): State<AppState>,
    RawBody(body): RawBody,
) -> Result<Json<Value>, ApiError> {
    let (tiers, chunks) = (&s.tiers, s.chunks);
    let parsed: UnpinBody = if body.is_empty() {
        UnpinBody::default()
    } else {
        from_object(&body)?
    };
    let which: Vec<TierId> = match parsed.location.as_deref() {
        None => vec![TierId::L1, TierId::L2],
        Some(loc) => match tier_of(loc) {
            Some(t) => vec![t],
            None => {
                return Err(NodeError::Unsupported(format!(
                    "unknown location {loc:?}: {} or {}",
                    location(TierId::L1),
                    location(TierId::L2)
                ))
                .into())
            }
        },
    };
    let mut released = 0;
    let mut num_tokens = 0;
    for tier in which {
        let keys = match &parsed.tokens {
            Some(tokens) => {
                let found = tiers.resolve(tier, &chunks.of(tokens), None);
                num_tokens = num_tokens.max(found.tokens);
                found.keys
            }
            None => tiers.held_keys(tier),
        };
        released += tiers
            .hold(tier, &keys, false)
            .await
            .map_err(|e| NodeError::Internal(format!("cannot record the release: {e}")))?;
    }
    Ok(Json(
        json!({ "released": released, "num_tokens": num_tokens }),
    ))
}
