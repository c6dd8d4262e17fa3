//! The operators' views of the whole index: `GET /global_view` (every instance with its
//! streams, blocks per tier, publishers, LMCache servers and Mooncake stores read, and the LMCache bridge's
//! counters) and `GET /dump` (every stream's blocks by standard sequence hash, with their
//! tier references: what a peer needs to rebuild the index by standard-hash stores, as
//! Dynamo's standalone indexer's `/dump` serves its peers). Read-only; each takes the index
//! lock once (the dump walks the record arena once per stream).

use crate::indexer::IndexerState;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// `GET /global_view`.
pub(super) async fn global_view(State(st): State<Arc<IndexerState>>) -> Json<Value> {
    let servers = st.tier_servers();
    let counters = st.tier_counters();
    let registry = st.registry.lock();
    let core = st.core.read();
    let mut instances: BTreeMap<String, Value> = BTreeMap::new();
    for (key, s) in &registry.services {
        let r = &s.reg;
        let name = format!("{}|{}", r.tenant, r.instance);
        let blocks = |id| {
            let t = core.index.stream_stats(id).unwrap_or_default().tier_blocks;
            json!({"GPU": t[0], "CPU": t[1], "DISK": t[2]})
        };
        let entry = instances.entry(name).or_insert_with(|| {
            json!({"tenant_id": r.tenant, "instance_id": r.instance, "modelname": r.model,
                   "block_size": r.block_size, "streams": []})
        });
        if let Some(list) = entry["streams"].as_array_mut() {
            list.push(json!({
                "key": key, "dp_rank": r.dp_rank, "endpoint": r.endpoint, "type": r.kind.name(),
                "connected": st.publisher_connected_locked(&registry, &r.endpoint),
                "blocks": blocks(s.stream),
                "lmcache_instance_id": r.lmcache,
                "lmcache_blocks": s.pool.map(blocks),
                "backend_id": r.backends,
                "mooncake_blocks": s.store.map(blocks),
            }));
        }
    }
    let lmcache: Vec<Value> = servers
        .iter()
        .map(|(id, inc, shown)| {
            json!({"instance_id": id, "incarnation": inc, "chunks_l1": shown[0], "chunks_l2": shown[1]})
        })
        .collect();
    Json(json!({
        "hash_seed": core.index.config().seed,
        "memberships": core.index.memberships(),
        "instances": instances.into_values().collect::<Vec<_>>(),
        "lmcache_servers": lmcache,
        "lmcache_counters": counters,
    }))
}

/// `GET /dump`.
pub(super) async fn dump(State(st): State<Arc<IndexerState>>) -> Json<Value> {
    let registry = st.registry.lock();
    let core = st.core.read();
    let mut streams = Vec::new();
    for (key, s) in &registry.services {
        let mut add = |id, source: &str| {
            let Some(spec) = core.index.stream_spec(id) else {
                return;
            };
            let blocks: Vec<Value> = core
                .index
                .stream_blocks(id)
                .into_iter()
                .map(|(seq, refs)| json!([seq, refs[0], refs[1], refs[2]]))
                .collect();
            streams.push(json!({"key": key, "source": source, "spec": spec, "blocks": blocks}));
        };
        add(s.stream, "engine");
        if let Some(pool) = s.pool {
            add(pool, "lmcache");
        }
        if let Some(store) = s.store {
            add(store, "mooncake");
        }
    }
    Json(json!({
        "hash_seed": core.index.config().seed,
        "block_fields": ["seq_hash", "GPU", "CPU", "DISK"],
        "streams": streams,
    }))
}
