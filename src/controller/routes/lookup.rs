//! The read-only POST routes: `/lookup`, `/query_instance`, `/query_worker_info`. They only
//! read the index (one read lock each, never held across an `.await`) and reach no worker.

use super::lookup_hash::chunk_hashes;
use super::new_event_id;
use crate::controller::model::index::WorkerView;
use crate::controller::Driver;
use crate::protocol::ChunkHash;
use crate::web::error::{ApiError, FieldError};
use crate::web::json::Json as Valid;
use crate::web::schema::{Body, BodySpec, Field, FieldDefault, FieldType};
use axum::extract::State;
use axum::Json;
use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

/// `POST /lookup`: `tokens` (LMCache), or the chunk `hashes` directly.
#[derive(Debug, Deserialize)]
pub(crate) struct LookupRequest {
    tokens: Option<Vec<i64>>,
    hashes: Option<Vec<ChunkHash>>,
    offsets: Option<Vec<i64>>,
}

impl Body for LookupRequest {
    const SPEC: BodySpec = BodySpec {
        name: "LookupRequest",
        fields: &[
            Field::maybe(
                "tokens",
                FieldType::IntList,
                "Token ids; hashed into chunks as an LMCache worker with \
                 pre_caching_hash_algorithm=builtin does (--lookup-chunk-size, \
                 --lookup-none-hash).",
            ),
            Field::maybe(
                "hashes",
                FieldType::HashList,
                "Chunk hashes in prefix order, instead of tokens (kvplane extension).",
            ),
            Field::optional(
                "offsets",
                FieldType::CountList,
                FieldDefault::Absent,
                "With hashes: tokens in each chunk (default --lookup-chunk-size), for end \
                 positions; extra entries are ignored.",
            ),
        ],
        exactly_one_of: &["tokens", "hashes"],
    };
}

/// `POST /query_instance`.
#[derive(Debug, Deserialize)]
pub(crate) struct QueryInstRequest {
    ip: String,
}

impl Body for QueryInstRequest {
    const SPEC: BodySpec = BodySpec {
        name: "QueryInstRequest",
        fields: &[
            Field::optional(
                "event_id",
                FieldType::Str,
                FieldDefault::Absent,
                "Ignored (LMCache requires it and ignores it too; the answer carries a new one).",
            ),
            Field::required("ip", FieldType::Str, "A worker's ip, as it registered."),
        ],
        exactly_one_of: &[],
    };
}

/// `POST /query_worker_info`.
#[derive(Debug, Deserialize)]
pub(crate) struct QueryWorkerInfoRequest {
    instance_id: String,
    worker_ids: Option<Vec<i64>>,
}

impl Body for QueryWorkerInfoRequest {
    const SPEC: BodySpec = BodySpec {
        name: "QueryWorkerInfoRequest",
        fields: &[
            Field::required(
                "instance_id",
                FieldType::Str,
                "An instance, or \"all\" for every instance.",
            ),
            Field::optional(
                "worker_ids",
                FieldType::IntList,
                FieldDefault::Null,
                "Only these workers (null or [] = all); unknown ids are skipped.",
            ),
        ],
        exactly_one_of: &[],
    };
}

/// `POST /lookup`. `layout_info` is LMCache's answer, computed the way LMCache computes it:
/// for each chunk in order, its first holder in registration order (instance, worker,
/// location), stopping at the first chunk nobody holds; each holder's instance maps to
/// (location, end token of the last chunk credited to it). `holders` (kvplane, LMCache PR
/// #4471) lists *every* holder of the first chunk with how many consecutive chunks of the
/// query it holds.
pub(crate) async fn lookup(
    State(shared): State<Arc<Driver>>,
    Valid(req): Valid<LookupRequest>,
) -> Result<Json<Value>, ApiError> {
    let started = Instant::now();
    let chunk_size = shared.config.lookup_chunk_size;
    let (hashes, ends): (Vec<ChunkHash>, Vec<usize>) = match (req.tokens, req.hashes) {
        (Some(tokens), _) => chunk_hashes(&tokens, chunk_size, shared.config.lookup_none_hash)
            .into_iter()
            .map(|c| (c.hash, c.end))
            .unzip(),
        (None, Some(hashes)) => {
            let offsets = req.offsets.unwrap_or_default();
            let mut end = 0usize;
            let ends = (0..hashes.len())
                .map(|i| {
                    let n = offsets
                        .get(i)
                        .and_then(|&n| usize::try_from(n).ok())
                        .unwrap_or(chunk_size);
                    end = end.saturating_add(n);
                    end
                })
                .collect();
            (hashes, ends)
        }
        (None, None) => {
            // Validation requires one of them; kept total for safety.
            return Err(ApiError::field(FieldError::new(
                "missing",
                vec!["body".into(), "tokens".into()],
                "Field required",
                Value::Null,
            )));
        }
    };
    let end_of = |chunks: usize| ends.get(chunks.wrapping_sub(1)).copied().unwrap_or(0);
    let (layout_info, holders) = {
        let index = shared.index();
        let mut layout: IndexMap<String, (String, usize)> = IndexMap::new();
        for (hash, &end) in hashes.iter().zip(&ends) {
            let holders = index.prefix_holders(std::slice::from_ref(hash));
            let Some(first) = holders.first() else {
                break;
            };
            layout.insert(
                first.instance_id.to_owned(),
                (first.location.to_owned(), end),
            );
        }
        let holders: Vec<Value> = index
            .prefix_holders(&hashes)
            .into_iter()
            .map(|h| {
                json!({
                    "instance_id": h.instance_id,
                    "worker_id": h.worker_id,
                    "location": h.location,
                    "matched_chunks": h.matched,
                    "end_token": end_of(h.matched),
                    "peer_init_url": h.peer_init_url,
                })
            })
            .collect();
        (layout, holders)
    };
    let m = &shared.metrics;
    m.http_lookup_seconds
        .observe(started.elapsed().as_secs_f64());
    let result = if layout_info.is_empty() {
        "miss"
    } else {
        "hit"
    };
    m.http_lookups.with_label_values(&[result]).inc();
    Ok(Json(json!({
        "event_id": new_event_id("Lookup"),
        "layout_info": layout_info,
        "num_chunks": hashes.len(),
        "holders": holders,
    })))
}

/// `POST /query_instance`: the first instance (registration order) with a worker at `ip`;
/// 404 if none (LMCache: 500).
pub(crate) async fn query_instance(
    State(shared): State<Arc<Driver>>,
    Valid(req): Valid<QueryInstRequest>,
) -> Result<Json<Value>, ApiError> {
    let instance = shared.index().instance_by_ip(&req.ip).map(str::to_owned);
    match instance {
        Some(res) => Ok(Json(
            json!({ "event_id": new_event_id("QueryInst"), "res": res }),
        )),
        None => Err(ApiError::NotFound(format!(
            "No instance has a worker at ip {}",
            req.ip
        ))),
    }
}

/// LMCache's `WorkerInfo` as JSON.
pub(crate) fn worker_info(w: &WorkerView) -> Value {
    json!({
        "instance_id": w.instance_id,
        "worker_id": w.worker_id,
        "ip": w.ip,
        "port": w.port,
        "peer_init_url": w.peer_init_url,
        "registration_time": w.registration_time,
        "last_heartbeat_time": w.last_heartbeat_time,
    })
}

/// `POST /query_worker_info`: `WorkerInfo` of every worker of an instance (sorted by worker
/// id), or of the workers listed in `worker_ids` (in that order, unknown ids skipped), or with
/// `instance_id = "all"` of every worker (registration order, filtered by `worker_ids`).
/// An unknown instance is a 404 (LMCache: 200 with an empty list).
pub(crate) async fn query_worker_info(
    State(shared): State<Arc<Driver>>,
    Valid(req): Valid<QueryWorkerInfoRequest>,
) -> Result<Json<Value>, ApiError> {
    let wanted = req.worker_ids.filter(|ids| !ids.is_empty());
    let workers: Vec<WorkerView> = if req.instance_id == "all" {
        let all = shared.index().workers();
        match &wanted {
            Some(ids) => all
                .into_iter()
                .filter(|w| ids.contains(&w.worker_id))
                .collect(),
            None => all,
        }
    } else {
        let Some(mut all) = shared
            .index()
            .instance_workers(&req.instance_id)
            .filter(|w| !w.is_empty())
        else {
            return Err(ApiError::NotFound(format!(
                "Instance {} is not registered",
                req.instance_id
            )));
        };
        match &wanted {
            Some(ids) => ids
                .iter()
                .filter_map(|id| all.iter().find(|w| w.worker_id == *id).cloned())
                .collect(),
            None => {
                all.sort_by_key(|w| w.worker_id);
                all
            }
        }
    };
    let infos: Vec<Value> = workers.iter().map(worker_info).collect();
    Ok(Json(json!({
        "event_id": new_event_id("QueryWorkerInfo"),
        "worker_infos": infos,
    })))
}
