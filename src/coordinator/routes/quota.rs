//! `/quota`: per-salt L2 quotas, the default quota and their usage (0.5.6's
//! FleetEvictionController's routes; each change saved to `--metadata-path` before the reply).

use super::{invalid, parse, JsonBody};
use crate::coordinator::model::QuotaError;
use crate::coordinator::state::api_state::ApiState;
use crate::web::error::ApiError;
use axum::extract::{Path, Query, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;

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
pub(super) struct TierQuery {
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

pub(super) async fn set_quota_config(
    State(s): State<Arc<ApiState>>,
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

pub(super) async fn get_quota_config(
    State(s): State<Arc<ApiState>>,
    Query(q): Query<TierQuery>,
) -> Result<Json<Value>, ApiError> {
    require_quota_tier(tier_of(&s, q.tier.as_deref(), "query")?)?;
    let limit = s.handle.with(|m, _, _| m.default_limit_gb()).await?;
    Ok(Json(json!({ "default_limit_gb": limit })))
}

pub(super) async fn set_quota(
    State(s): State<Arc<ApiState>>,
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

pub(super) async fn get_quota(
    State(s): State<Arc<ApiState>>,
    Path(salt): Path<String>,
    Query(q): Query<TierQuery>,
) -> Result<Json<Value>, ApiError> {
    require_accounted_tier(tier_of(&s, q.tier.as_deref(), "query")?)?;
    let salt = salt_of(&salt).to_owned();
    let st = s.handle.with(move |m, _, _| m.quota_status(&salt)).await?;
    Ok(Json(json!(st)))
}

pub(super) async fn remove_quota(
    State(s): State<Arc<ApiState>>,
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

pub(super) async fn list_quota(
    State(s): State<Arc<ApiState>>,
    Query(q): Query<TierQuery>,
) -> Result<Json<Value>, ApiError> {
    require_accounted_tier(tier_of(&s, q.tier.as_deref(), "query")?)?;
    let (total, rows) = s.handle.with(|m, _, _| m.quota_list()).await?;
    Ok(Json(json!({"total_gb": total, "by_cache_salt": rows})))
}

/// `_default` names the empty salt.
fn salt_of(path: &str) -> &str {
    if path == "_default" {
        ""
    } else {
        path
    }
}
