//! Registrations: `POST /register` and `/unregister` (bodies validated by `api`), and
//! `GET /services`, every registration with its blocks per tier and its publisher's
//! connection. Locks: the registry, then the index for reading; neither across an `.await`.

use super::St;
use crate::indexer::api;
use crate::web::error::ApiError;
use crate::web::json::RawBody;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

pub(super) async fn register(
    State(st): St,
    RawBody(body): RawBody,
) -> Result<Json<Value>, ApiError> {
    let reg = api::registration(&api::object(&body)?)?;
    let instance = reg.instance.clone();
    st.register(reg)?;
    Ok(Json(
        json!({"status": "registered successfully", "instance_id": instance}),
    ))
}

pub(super) async fn unregister(
    State(st): St,
    RawBody(body): RawBody,
) -> Result<Json<Value>, ApiError> {
    let req = api::unregistration(&api::object(&body)?)?;
    let removed = st.unregister(&req)?;
    Ok(Json(
        json!({"status": "unregistered successfully", "removed_instances": removed}),
    ))
}

pub(super) async fn services(State(st): St) -> Json<Value> {
    let registry = st.registry.lock();
    let core = st.core.read();
    let mut list = Vec::new();
    for service in registry.services.values() {
        let mut entry = service.reg.to_json();
        let stats = core.index.stream_stats(service.stream).unwrap_or_default();
        entry["blocks"] = json!({"GPU": stats.tier_blocks[0], "CPU": stats.tier_blocks[1],
            "DISK": stats.tier_blocks[2]});
        for (name, blocks) in core.index.stream_media(service.stream) {
            entry["blocks"][name] = json!(blocks);
        }
        if let Some(store) = service.store {
            let t = core
                .index
                .stream_stats(store)
                .unwrap_or_default()
                .tier_blocks;
            entry["mooncake_blocks"] = json!({"GPU": t[0], "CPU": t[1], "DISK": t[2]});
        }
        if let Some(p) = registry.publishers.get(&service.reg.endpoint) {
            let s = &p.status;
            let seq = *s.seq.lock();
            let last = s.last_seq.load(Ordering::Relaxed);
            entry["connection"] = json!({
                "connected": s.connected.load(Ordering::Relaxed),
                "connects": s.connects.load(Ordering::Relaxed),
                "replaying": s.replaying.load(Ordering::Relaxed),
                "last_seq": (last != u64::MAX).then_some(last),
                "gaps": seq.gaps,
                "replays": seq.replays,
                "replay_failures": seq.replay_failures,
                "partial_replays": seq.partial_replays,
                "restarts": seq.restarts,
                "duplicates": seq.duplicates,
                "unrepaired_gaps": seq.unrepaired_gaps,
                "queue_full": s.queue_full.load(Ordering::Relaxed),
                "dropped": s.dropped.load(Ordering::Relaxed),
                "bound": p.bound.is_some(),
                "by_topic": p.by_topic,
                "queued_bytes": s.queued_bytes.load(Ordering::Relaxed),
                "error": s.error.lock().clone(),
                "backends": crate::indexer::backends::backends_json(s),
            });
        }
        list.push(entry);
    }
    Json(json!({"count": list.len(), "hash_seed": core.index.config().seed, "services": list}))
}
