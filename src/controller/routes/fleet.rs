//! The GET routes: `/controller/key-stats`, `/controller/workers`, `/controller/cluster`,
//! `/healthz`, `/readyz`,
//! `/metrics`. Each takes one read lock on the index at most and never holds it across an
//! `.await`.

use super::lookup::worker_info;
use crate::controller::model::index::WorkerView;
use crate::controller::socket_stats::SocketLoopStats;
use crate::controller::Driver;
use crate::web::error::{ApiError, FieldError};
use crate::web::exposition::Exposition;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// `GET /controller/key-stats`: key, instance and worker totals, and per-instance key and
/// worker counts (LMCache's shape; keys are memberships, as in LMCache).
pub(crate) async fn key_stats(State(shared): State<Arc<Driver>>) -> Json<Value> {
    let (total_keys, workers, instances) = {
        let index = shared.index();
        (index.key_count(), index.worker_count(), index.instances())
    };
    let list: Vec<Value> = instances
        .iter()
        .map(|i| {
            json!({
                "instance_id": i.instance_id,
                "key_count": i.key_count,
                "worker_count": i.worker_count,
            })
        })
        .collect();
    Json(json!({
        "total_key_count": total_keys,
        "total_instance_count": instances.len(),
        "total_worker_count": workers,
        "instances": list,
    }))
}

/// LMCache's `WorkerInfoResponse` (`WorkerInfo` + `key_count`), plus kvplane's `last_seen`,
/// controller-wire generation (`protocol`), per-location key counts and full-sync state.
fn worker_row(w: &WorkerView) -> Value {
    let mut row = worker_info(w);
    if let Value::Object(r) = &mut row {
        r.insert("key_count".into(), w.key_count.into());
        r.insert("last_seen".into(), w.last_seen.into());
        r.insert("protocol".into(), w.wire.label().into());
        let locations: Vec<Value> = w
            .locations
            .iter()
            .map(|l| json!({ "name": l.name, "key_count": l.key_count, "last_seq": l.last_seq }))
            .collect();
        r.insert("locations".into(), locations.into());
        r.insert(
            "sync".into(),
            json!({
                "state": w.sync.state,
                "sync_id": w.sync.sync_id,
                "progress": w.sync.progress,
                "missing_batches": w.sync.missing_batches,
            }),
        );
    }
    row
}

fn query_error(loc: &str, msg: String, input: Value) -> ApiError {
    ApiError::field(FieldError::new(
        "int_parsing",
        vec!["query".into(), loc.into()],
        msg,
        input,
    ))
}

/// `GET /controller/workers`: every worker (`{workers, total_count}`); with `?instance_id=`
/// the workers of one instance (404 `No workers found for instance X`); with
/// `?instance_id=&worker_id=` one worker object (404 `Worker (X, N) not found`). With only
/// `?worker_id=`, the workers with that id in every instance (LMCache ignores it).
pub(crate) async fn workers(
    State(shared): State<Arc<Driver>>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| {
        ApiError::field(FieldError::new(
            "query_invalid",
            vec!["query".into()],
            e.body_text(),
            Value::Null,
        ))
    })?;
    let instance_id = query.get("instance_id");
    let worker_id = match query.get("worker_id") {
        None => None,
        Some(raw) => Some(raw.trim().parse::<i64>().map_err(|_| {
            query_error(
                "worker_id",
                "Input should be a valid integer, unable to parse string as an integer".into(),
                raw.as_str().into(),
            )
        })?),
    };
    let list = |workers: Vec<WorkerView>| {
        let rows: Vec<Value> = workers.iter().map(worker_row).collect();
        Json(json!({ "total_count": rows.len(), "workers": rows }))
    };
    match (instance_id, worker_id) {
        (Some(instance), Some(worker)) => {
            let view = shared.index().worker(instance, worker);
            view.map(|w| Json(worker_row(&w))).ok_or_else(|| {
                ApiError::NotFound(format!("Worker ({instance}, {worker}) not found"))
            })
        }
        (Some(instance), None) => {
            let views = shared.index().instance_workers(instance);
            match views {
                Some(v) if !v.is_empty() => Ok(list(v)),
                _ => Err(ApiError::NotFound(format!(
                    "No workers found for instance {instance}"
                ))),
            }
        }
        (None, worker) => {
            let mut all = shared.index().workers();
            if let Some(id) = worker {
                all.retain(|w| w.worker_id == id);
            }
            Ok(list(all))
        }
    }
}

/// `GET /healthz`: liveness — the process answers HTTP — with fleet totals.
pub(crate) async fn healthz(State(shared): State<Arc<Driver>>) -> Json<Value> {
    let index = shared.index();
    Json(json!({
        "status": "ok",
        "workers": index.worker_count(),
        "instances": index.instance_count(),
        "keys": index.key_count(),
    }))
}

fn socket_state(s: &SocketLoopStats) -> &'static str {
    match (s.configured(), s.serving()) {
        (false, _) => "not_configured",
        (true, true) => "serving",
        (true, false) => "not_serving",
    }
}

/// `GET /readyz`: 200 once every configured ZMQ socket is bound and its loop is receiving
/// (this answer proves the HTTP side), 503 otherwise — before the loops start and during
/// shutdown.
pub(crate) async fn readyz(State(shared): State<Arc<Driver>>) -> impl IntoResponse {
    let s = &shared.sockets;
    let loops = [
        ("pull", &s.pull),
        ("reply", &s.reply),
        ("heartbeat", &s.heartbeat),
    ];
    let mut ready = loops.iter().all(|(_, l)| !l.configured() || l.serving());
    let sockets: serde_json::Map<String, Value> = loops
        .iter()
        .map(|(name, l)| ((*name).to_owned(), socket_state(l).into()))
        .collect();
    let mut body = json!({"http": "serving", "sockets": sockets});
    // A read replica is ready when it answers from the leader's current state.
    if let Some(c) = shared.cluster().filter(|c| c.is_replica()) {
        let p = c.progress();
        ready &= p.ready;
        body["replica"] = json!({"reason": p.reason, "pending": p.pending, "lag_ms": p.lag_ms});
    }
    body["status"] = json!(if ready { "ready" } else { "not_ready" });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body))
}

/// `GET /metrics`: every metric in the Prometheus text format, LMCache's gauges refreshed.
pub(crate) async fn metrics(State(shared): State<Arc<Driver>>) -> impl IntoResponse {
    shared.refresh_lmcache_gauges();
    shared.peer_drops.export(&shared.metrics);
    let mut out = Exposition::new();
    out.registry(shared.metrics.registry());
    if let Some(cluster) = shared.cluster() {
        cluster.write_metrics(&mut out);
    }
    out.response()
}

/// `GET /controller/cluster`: this controller's place in its cluster (`--cluster`), or
/// `{"role": "standalone"}`.
pub(crate) async fn cluster(State(shared): State<Arc<Driver>>) -> Json<Value> {
    Json(
        shared
            .cluster()
            .map_or_else(|| json!({"role": "standalone"}), |c| c.json()),
    )
}
