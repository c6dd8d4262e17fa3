//! The `/directory` routes of LMCache 0.5.6's coordinator, over the key directory
//! ([`crate::coordinator::model::directory`]): `POST /directory/lookup` (keys, or a token sequence resolved as
//! the pin routes do), `GET /directory/keys` (paged, filtered), `GET /directory/stats`,
//! `POST /directory/blend-lookup` (CacheBlend fragments; matches only with
//! `--enable-blend-lookup`). Large lookups and listings run as several owner jobs, so event
//! ingest and quota requests wait for one slice, not a whole listing.

use super::limits::JsonBody;
use super::parse;
use crate::coordinator::model::blend::BlendIndex;
use crate::coordinator::model::directory::{KeyFilter, Scan};
use crate::coordinator::model::events::Tier;
use crate::coordinator::model::keys::EncodedKey;
use crate::coordinator::model::pins::{self, MAX_TOKEN_IDS};
use crate::coordinator::state::api_state::ApiState;
use crate::web::error::ApiError;
use crate::web::exposition::{Exposition, Kind};
use axum::extract::{Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Keys looked up, or slots scanned, in one job of the owner.
const KEYS_PER_JOB: usize = 4_096;
const SLOTS_PER_JOB: usize = 65_536;
/// Most keys a token lookup reaches with the other object groups' copies.
const MAX_LOOKUP_KEYS: usize = 1_000_000;

/// The `/directory` routes.
pub(crate) fn routes() -> Router<Arc<ApiState>> {
    Router::new()
        .route("/directory/lookup", post(lookup))
        .route("/directory/blend-lookup", post(blend_lookup))
        .route("/directory/keys", get(list_keys))
        .route("/directory/stats", get(stats))
}

fn one() -> i64 {
    1
}

#[derive(Deserialize)]
struct LookupBody {
    #[serde(default)]
    keys: Vec<EncodedKey>,
    #[serde(default)]
    token_ids: Vec<u32>,
    #[serde(default)]
    model_name: String,
    #[serde(default = "one")]
    world_size: i64,
    #[serde(default)]
    cache_salt: String,
}

fn invalid_at(s: &ApiState, loc: &[&str], msg: impl Into<String>) -> ApiError {
    s.refused.invalid_bodies.fetch_add(1, Ordering::Relaxed);
    ApiError::value_error(loc.iter().map(|l| json!(l)).collect(), msg.into())
}

/// Why LMCache would refuse to build an `ObjectKey` from `k` (None: valid).
fn key_error(k: &EncodedKey) -> Option<String> {
    let hex = k.chunk_hash_hex.as_bytes();
    if !hex.len().is_multiple_of(2) || !hex.iter().all(u8::is_ascii_hexdigit) {
        return Some(format!(
            "chunk_hash_hex is not valid hex (got {:?})",
            k.chunk_hash_hex
        ));
    }
    if k.model_name.contains('@') {
        return Some(format!(
            "model_name must not contain '@' (got {:?})",
            k.model_name
        ));
    }
    if k.cache_salt.chars().count() > 128 || k.cache_salt.contains(['@', '/', '\\', '\0']) {
        return Some(format!(
            "cache_salt must be at most 128 characters without '@', '/', '\\' or NUL (got {:?})",
            k.cache_salt
        ));
    }
    if k.object_group_id < 0 {
        return Some(format!(
            "object_group_id must be >= 0 (got {})",
            k.object_group_id
        ));
    }
    None
}

fn world(s: &ApiState, w: i64) -> Result<u8, ApiError> {
    if w < 1 {
        return Err(invalid_at(
            s,
            &["body", "world_size"],
            "Input should be greater than or equal to 1",
        ));
    }
    u8::try_from(w)
        .map_err(|_| invalid_at(s, &["body", "world_size"], "world_size must be in 1..=255"))
}

/// `POST /directory/lookup`.
async fn lookup(
    State(s): State<Arc<ApiState>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let b: LookupBody = parse(&s, &body)?;
    if let Some(e) = b.keys.iter().find_map(key_error) {
        return Err(invalid_at(
            &s,
            &["body", "keys"],
            format!("Value error, {e}"),
        ));
    }
    let world = world(&s, b.world_size)?;
    // The names are checked whichever form is given, as the document says.
    pins::check_names(&b.model_name, &b.cache_salt)
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    if b.keys.is_empty() == b.token_ids.is_empty() {
        return Err(invalid_at(
            &s,
            &["body"],
            "Value error, supply exactly one of 'keys' or 'token_ids'",
        ));
    }
    if !b.token_ids.is_empty() && b.model_name.is_empty() {
        return Err(invalid_at(
            &s,
            &["body"],
            "Value error, 'model_name' is required with 'token_ids'",
        ));
    }
    let (keys, chunks) = if b.keys.is_empty() {
        let (keys, chunks) =
            super::cache::resolve_keys(&s, &b.model_name, world, &b.token_ids, &b.cache_salt)?;
        let keys = s
            .handle
            .with(move |m, _, _| m.directory.across_groups(keys, MAX_LOOKUP_KEYS))
            .await?;
        (keys, chunks)
    } else {
        let n = b.keys.len();
        (b.keys, n)
    };
    let mut results = Vec::with_capacity(keys.len());
    for part in keys.chunks(KEYS_PER_JOB) {
        let part = part.to_vec();
        let views = s
            .handle
            .with(move |m, _, _| {
                let v = m.directory.lookup(&part);
                (part, v)
            })
            .await?;
        for (key, v) in views.0.into_iter().zip(views.1) {
            results.push(json!({
                "key": key, "placements": v.placements, "token_ids": v.token_ids,
                "access_count": v.access_count,
            }));
        }
    }
    Ok(Json(json!({ "chunks": chunks, "results": results })))
}

/// The query of `GET /directory/keys` (parsed by hand for FastAPI's 422s).
#[derive(Deserialize)]
struct KeysQuery {
    tier: Option<String>,
    #[serde(default)]
    instance_id: String,
    #[serde(default)]
    backend: String,
    offset: Option<String>,
    limit: Option<String>,
}

/// `GET /directory/keys?tier=all&instance_id=&backend=&offset=0&limit=1000`.
async fn list_keys(
    State(s): State<Arc<ApiState>>,
    Query(q): Query<KeysQuery>,
) -> Result<Json<Value>, ApiError> {
    let tier = match q.tier.as_deref() {
        None | Some("all") => None,
        Some("l1") => Some(Tier::L1),
        Some("l2") => Some(Tier::L2),
        Some(_) => {
            return Err(invalid_at(
                &s,
                &["query", "tier"],
                "Input should be 'l1', 'l2' or 'all'",
            ))
        }
    };
    // FastAPI's checks of `Query(ge=…, le=…)`, with its messages.
    let int = |name: &str, v: Option<&str>, default: i64, ge: i64, le: i64| {
        let n = v.map_or(Ok(default), |v| v.parse::<i64>()).map_err(|_| {
            "Input should be a valid integer, unable to parse string as an integer".to_owned()
        });
        let n = n.and_then(|n| match n {
            n if n < ge => Err(format!("Input should be greater than or equal to {ge}")),
            n if n > le => Err(format!("Input should be less than or equal to {le}")),
            n => Ok(n),
        });
        n.map_err(|msg| invalid_at(&s, &["query", name], msg))
    };
    let offset = int("offset", q.offset.as_deref(), 0, 0, i64::MAX)?;
    let limit = int("limit", q.limit.as_deref(), 1000, 1, 10_000)?;
    let filter = std::sync::Arc::new(KeyFilter {
        tier,
        instance_id: q.instance_id,
        backend: q.backend,
    });
    let (offset, limit) = (
        usize::try_from(offset).unwrap_or(usize::MAX),
        limit as usize,
    );
    let mut scan = Scan::default();
    loop {
        let f = std::sync::Arc::clone(&filter);
        let (st, done) = s
            .handle
            .with(move |m, _, _| {
                let done = m
                    .directory
                    .scan(&f, offset, limit, SLOTS_PER_JOB, &mut scan);
                (scan, done)
            })
            .await?;
        scan = st;
        if done {
            break;
        }
    }
    Ok(Json(json!({ "total": scan.total, "keys": scan.page })))
}

/// `GET /directory/stats`.
async fn stats(State(s): State<Arc<ApiState>>) -> Result<Json<Value>, ApiError> {
    let st = s.handle.with(|m, _, _| m.directory.stats()).await?;
    Ok(Json(json!(st)))
}

#[derive(Deserialize)]
struct BlendBody {
    #[serde(default)]
    tokens_b64: String,
    #[serde(default)]
    model_name: String,
    #[serde(default = "one")]
    world_size: i64,
    #[serde(default)]
    cache_salt: String,
}

/// Python's `b64decode(validate=True)` then the `uint32` check, with its messages.
fn decode_tokens(b64: &str) -> Result<Vec<u32>, String> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| {
            let why = match e {
                base64::DecodeError::InvalidByte(..) => "Non-base64 digit found",
                base64::DecodeError::InvalidLength(_)
                | base64::DecodeError::InvalidLastSymbol(..)
                | base64::DecodeError::InvalidPadding => "Incorrect padding",
            };
            format!("tokens_b64 is not valid base64: {why}")
        })?;
    if !raw.len().is_multiple_of(4) {
        return Err(format!(
            "tokens_b64 byte length {} is not a multiple of 4 (malformed uint32 token buffer)",
            raw.len()
        ));
    }
    Ok(raw
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// `POST /directory/blend-lookup`: `{"matches": [{"chunk_hash", "old_st", "cur_st"}]}`.
async fn blend_lookup(
    State(s): State<Arc<ApiState>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let b: BlendBody = parse(&s, &body)?;
    let tokens = decode_tokens(&b.tokens_b64)
        .map_err(|e| invalid_at(&s, &["body", "tokens_b64"], format!("Value error, {e}")))?;
    let world = world(&s, b.world_size)?;
    if !b.tokens_b64.is_empty() && b.model_name.is_empty() {
        return Err(invalid_at(
            &s,
            &["body"],
            "Value error, 'model_name' is required with 'tokens_b64'",
        ));
    }
    if tokens.len() > MAX_TOKEN_IDS {
        return Err(ApiError::BadRequest(format!(
            "too many token ids in a single request (limit={MAX_TOKEN_IDS}, got={})",
            tokens.len()
        )));
    }
    let Some((chunk, stride)) = s.blend else {
        return Ok(Json(json!({ "matches": [] })));
    };
    // The rolling fingerprints walk the whole query: here, not on the owner task.
    let probes = BlendIndex::probes(chunk, stride, &tokens);
    let (model, salt) = (b.model_name, b.cache_salt);
    let found = s
        .handle
        .with(move |m, _, _| {
            m.directory
                .blend_match(&tokens, &probes, (&model, &salt, world))
        })
        .await?;
    let matches: Vec<Value> = found
        .into_iter()
        .map(|(h, old, cur)| json!({"chunk_hash": h, "old_st": old, "cur_st": cur}))
        .collect();
    Ok(Json(json!({ "matches": matches })))
}

/// The key directory's `/metrics` figures (its size and what its limits kept out), read on
/// the key owner and written after.
pub(crate) struct DirectoryMetrics([(&'static str, Kind, &'static str, u64); 10]);

impl DirectoryMetrics {
    /// Reads the directory.
    pub(crate) fn of(m: &crate::coordinator::model::Model) -> Self {
        let d = &m.directory;
        let st = d.stats();
        let c = &d.counters;
        Self([
            (
                "directory_keys",
                Kind::Gauge,
                "Keys in the key directory (/directory/*).",
                d.len() as u64,
            ),
            (
                "directory_placements",
                Kind::Gauge,
                "Placements (instance, tier, backend) over the directory's keys.",
                st.num_placements as u64,
            ),
            (
                "directory_token_ids",
                Kind::Gauge,
                "Token ids the directory keeps (once per chunk hash).",
                d.token_ids() as u64,
            ),
            (
                "directory_token_ids_limit",
                Kind::Gauge,
                "Most token ids the directory keeps.",
                d.config().max_token_ids as u64,
            ),
            (
                "directory_memory_bytes",
                Kind::Gauge,
                "Bytes allocated for the key directory and its blend index.",
                d.memory_bytes() as u64,
            ),
            (
                "directory_keys_refused_total",
                Kind::Counter,
                "New directory keys not kept at the key limit.",
                c.keys_refused,
            ),
            (
                "directory_keys_rejected_total",
                Kind::Counter,
                "Directory keys that do not fit the compact form.",
                c.keys_rejected,
            ),
            (
                "directory_names_refused_total",
                Kind::Counter,
                "Placements not kept: the instance, backend or salt table was full.",
                c.names_refused,
            ),
            (
                "directory_tokens_refused_total",
                Kind::Counter,
                "Chunks kept without their token ids at the token limit.",
                c.tokens_refused,
            ),
            (
                "directory_blend_chunks",
                Kind::Gauge,
                "Chunks in the CacheBlend index (--enable-blend-lookup).",
                st.blend.num_chunks as u64,
            ),
        ])
    }

    /// Writes the directory's series.
    pub(crate) fn write_to(&self, out: &mut Exposition) {
        for (name, kind, help, v) in self.0 {
            out.one(format_args!("kvplane_coordinator_{name}"), kind, help, v);
        }
    }
}
