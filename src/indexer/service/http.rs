//! The indexer's routes (spec §1): `POST /register`, `/unregister`, `/query`,
//! `/query_by_hash`; `GET /services`, `/healthz`, `/metrics`, `/openapi.json`. Every error is
//! JSON (`api::Refusal`), a wrong method included (405). The dashboard (`/`, `/static/*`,
//! `/api/dashboard`) is `super::dashboard`; a POST from a page of another origin is a 403.

use super::api::{self, Refusal};
use super::IndexerState;
use crate::indexer::index::{InstanceMatch, QueryScope};
use crate::web::access::{Access, Auth, Policy};
use crate::web::exposition::{Exposition, Kind};
use crate::web::limits::{RefusalCounter, WebLimit};
use crate::web::metrics_layer::HttpMetrics;
use crate::web::stack::{Guard, Stack};
use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

type St = State<Arc<IndexerState>>;

/// One per-publisher metric: name, help, and how to read it from the status.
type PublisherFamily = (
    &'static str,
    &'static str,
    fn(&super::PublisherStatus) -> u64,
);

/// The routes that never need a token, and the queries (POSTs that read); registrations
/// are writes.
pub(crate) fn policy(auth: Auth) -> Policy {
    use axum::http::Method as M;
    use Access::{Open, Read};
    let routes = vec![
        (M::POST, "/query", Read),
        (M::POST, "/query_by_hash", Read),
        (M::GET, "/healthz", Open),
        (M::GET, "/readyz", Open),
        (M::GET, "/openapi.json", Open),
    ];
    Policy::new("indexer", routes, auth)
}

/// The router.
pub(crate) fn router(state: Arc<IndexerState>) -> Router {
    let limits = crate::web::HttpLimits {
        max_body_bytes: state.config.max_body_bytes,
        // Not enforced by the indexer: its bodies are parsed into typed requests whose
        // sizes `max_body_bytes` bounds.
        max_body_items: usize::MAX,
        max_connections: state.config.max_http_connections,
        read_timeout: state.config.http_read_timeout,
    };
    let http = Arc::new(HttpMetrics::standalone(
        "kvplane_indexer_",
        limits.max_body_bytes,
        crate::web::limits::counting_hook("indexer", refusals(&state)),
    ));
    let stack = Stack {
        policy: Arc::new(policy(state.config.auth.clone())),
        limits,
        metrics: Arc::clone(&http),
        // The Conductor's clients post without a content type.
        guard: Guard::OriginOnly,
        style: crate::web::json::ErrorStyle::Conductor,
    };
    let routes = Router::new()
        .merge(super::dashboard::routes(&state))
        .route("/register", post(register))
        .route("/unregister", post(unregister))
        .route("/query", post(query))
        .route("/query_by_hash", post(query_by_hash))
        .route("/services", get(services))
        .route("/global_view", get(super::views::global_view))
        .route("/dump", get(super::views::dump))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/indexer/cluster", get(cluster_status))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi));
    stack
        .finish(routes)
        .layer(Extension(http))
        .with_state(state)
}

/// A request body, or the [`Refusal`] saying why it could not be read (413, 408, 400).
struct Body(Bytes);

impl FromRequest<Arc<IndexerState>> for Body {
    type Rejection = Refusal;

    async fn from_request(req: Request, state: &Arc<IndexerState>) -> Result<Self, Refusal> {
        Bytes::from_request(req, state)
            .await
            .map(Body)
            .map_err(|e| Refusal::unreadable_body(&e, state.config.max_body_bytes))
    }
}

/// Counts a refusal of the indexer's HTTP server in `http_limits_hit_total{limit}`.
pub(crate) fn refusals(state: &Arc<IndexerState>) -> RefusalCounter {
    let state = Arc::clone(state);
    Arc::new(move |limit: WebLimit| state.metrics.http_limit_hit(limit.label()))
}

async fn register(State(st): St, Body(body): Body) -> Result<Json<Value>, Refusal> {
    let reg = api::registration(&api::object(&body)?)?;
    let instance = reg.instance.clone();
    st.register(reg)?;
    Ok(Json(
        json!({"status": "registered successfully", "instance_id": instance}),
    ))
}

async fn unregister(State(st): St, Body(body): Body) -> Result<Json<Value>, Refusal> {
    let req = api::unregistration(&api::object(&body)?)?;
    let removed = st.unregister(&req)?;
    Ok(Json(
        json!({"status": "unregistered successfully", "removed_instances": removed}),
    ))
}

/// The `/query` and `/query_by_hash` answer, `{tenant: {instance: {"longest_matched", "GPU",
/// "CPU", "DISK", "DP": {rank: tokens}}}}` (`{}` when nothing matched), serialized straight
/// from the rows: building it as a `serde_json::Value` first cost a map, a string and a boxed
/// value per field of every row.
struct Answer<'a> {
    tenant: &'a str,
    rows: &'a BTreeMap<String, InstanceMatch>,
}

impl Serialize for Answer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Rows<'a>(&'a BTreeMap<String, InstanceMatch>);
        struct Row<'a>(&'a InstanceMatch);
        impl Serialize for Rows<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_map(self.0.iter().map(|(inst, m)| (inst, Row(m))))
            }
        }
        impl Serialize for Row<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let m = self.0;
                let mut map = s.serialize_map(Some(5 + m.other.len()))?;
                map.serialize_entry("longest_matched", &m.longest_matched)?;
                map.serialize_entry("GPU", &m.gpu)?;
                map.serialize_entry("CPU", &m.cpu)?;
                map.serialize_entry("DISK", &m.disk)?;
                // Other media under their own names (never GPU, CPU, DISK, DP or OTHER's
                // neighbours: the names are upper case and `DP` is kept apart).
                for (name, tokens) in &m.other {
                    map.serialize_entry(name, tokens)?;
                }
                map.serialize_entry("DP", &m.dp)?;
                map.end()
            }
        }
        let mut map = s.serialize_map(Some(usize::from(!self.rows.is_empty())))?;
        if !self.rows.is_empty() {
            map.serialize_entry(self.tenant, &Rows(self.rows))?;
        }
        map.end()
    }
}

/// The answer as a JSON response.
fn answer(tenant: &str, rows: &BTreeMap<String, InstanceMatch>) -> Response {
    let mut out = Vec::with_capacity(64 + rows.len() * 128);
    match serde_json::to_writer(&mut out, &Answer { tenant, rows }) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            out,
        )
            .into_response(),
        Err(e) => Refusal {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            reason: "internal",
            message: format!("cannot write the answer: {e}"),
            field: None,
            index: None,
        }
        .into_response(),
    }
}

async fn query(State(st): St, Body(body): Body) -> Result<Response, Refusal> {
    let body = super::query_body::QueryBody::parse(&body)?;
    let head = api::query_head(&body.fields)?;
    let tokens = body.token_ids()?;
    let scope = scope(&head);
    let rows = st.core.read().index.query_tokens(&scope, &tokens);
    Ok(answer(&head.tenant, &rows))
}

async fn query_by_hash(State(st): St, Body(body): Body) -> Result<Response, Refusal> {
    let body = api::object(&body)?;
    let head = api::query_head(&body)?;
    let hashes = api::seq_hashes(&body)?;
    let rows = st.core.read().index.query_hashes(&scope(&head), &hashes);
    Ok(answer(&head.tenant, &rows))
}

fn scope(head: &api::QueryHead) -> QueryScope<'_> {
    QueryScope {
        tenant: &head.tenant,
        model: &head.model,
        lora: head.lora.clone(),
        block_size: head.block_size,
        salt: &head.salt,
        instance: head.instance.as_deref(),
    }
}

async fn services(State(st): St) -> Json<Value> {
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
                "backends": super::mooncake::backends_json(s),
            });
        }
        list.push(entry);
    }
    Json(json!({"count": list.len(), "hash_seed": core.index.config().seed, "services": list}))
}

async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Ready when queries are answered from a complete index: always for a standalone indexer
/// or an ingester; for a replica, once it has applied every change in the stream (503 with
/// the reason and the lag until then).
async fn readyz(State(st): St) -> impl IntoResponse {
    let (ready, body) = super::cluster::readyz(&st);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body))
}

/// This indexer's place in its `--cluster`: the replication core's status document, as
/// `/controller/cluster` and `/coordinator/cluster` answer it.
async fn cluster_status(State(st): St) -> Json<Value> {
    Json(super::cluster::status_json(&st))
}

async fn metrics(State(st): St, Extension(http): Extension<Arc<HttpMetrics>>) -> impl IntoResponse {
    let mut out = Exposition::new();
    st.metrics.render_own(&mut out);
    http.write_to(&mut out);
    super::cluster::render(&st, &mut out);
    {
        let core = st.core.read();
        let ix = &core.index;
        for (name, help, v) in [
            (
                "memberships",
                "(holder, block) memberships stored.",
                ix.memberships(),
            ),
            (
                "records",
                "(stream, block) records stored, whatever tiers each holds.",
                ix.records(),
            ),
            (
                "chain_heads",
                "Records queries find through the block table (the first of each stored run of a chain; the others follow it in the arena).",
                ix.chain_heads(),
            ),
            (
                "namespaces",
                "(tenant, model, LoRA, block size, salt) namespaces in use.",
                ix.namespaces(),
            ),
            (
                "heap_bytes",
                "Heap bytes of the record arena, its two id tables and the lanes.",
                ix.heap_bytes(),
            ),
        ] {
            out.one(format_args!("kvplane_indexer_{name}"), Kind::Gauge, help, v as u64);
        }
        let c = ix.counters();
        for (name, help, v) in [
            ("stored", "Block stores applied.", c.stored),
            ("removed", "Block memberships removed.", c.removed),
            (
                "orphans",
                "Stores dropped: parent engine hash unknown.",
                c.orphans,
            ),
            (
                "unknown_hashes",
                "Removals or token-less stores of an unknown engine hash.",
                c.unknown_hashes,
            ),
            (
                "shape_mismatch",
                "Stores whose tokens do not fill the blocks or whose block size differs.",
                c.shape_mismatch,
            ),
            (
                "opaque",
                "Stores with multimodal or embedding keys, not indexed.",
                c.opaque,
            ),
            (
                "other_group",
                "Events of a KV cache group other than 0, not indexed.",
                c.other_group,
            ),
            (
                "capacity_refused",
                "Memberships refused at the capacity limit.",
                c.capacity_refused,
            ),
            ("expired", "Memberships dropped by the TTL.", c.expired),
            (
                "evicted",
                "Memberships evicted at the capacity limit, least recently stored first.",
                c.evicted,
            ),
            (
                "clears",
                "Stream clears (events, restarts, unregistrations).",
                c.clears,
            ),
        ] {
            out.one(
                format_args!("kvplane_indexer_{name}_total"),
                Kind::Counter,
                help,
                v,
            );
        }
    }
    let registry = st.registry.lock();
    let families: [PublisherFamily; 7] = [
        ("gaps", "Sequence gaps seen.", |s| s.seq.lock().gaps),
        ("replays", "Replays started.", |s| s.seq.lock().replays),
        ("replay_failures", "Replays failed or timed out.", |s| {
            s.seq.lock().replay_failures
        }),
        ("restarts", "Publisher restarts detected.", |s| {
            s.seq.lock().restarts
        }),
        ("duplicates", "Duplicate messages dropped.", |s| {
            s.seq.lock().duplicates
        }),
        (
            "queue_full",
            "Live messages that found the queue full and waited (the socket unread meanwhile).",
            |s| s.queue_full.load(Ordering::Relaxed),
        ),
        (
            "dropped",
            "Live messages from a --bind socket dropped because the queue was full (replayed).",
            |s| s.dropped.load(Ordering::Relaxed),
        ),
    ];
    for (name, help, f) in families {
        let mut family = out.family(
            format_args!("kvplane_indexer_publisher_{name}_total"),
            Kind::Counter,
            help,
        );
        for (endpoint, p) in &registry.publishers {
            family.sample(&[("endpoint", endpoint)], f(&p.status));
        }
    }
    super::mooncake::render_backends(&registry, &mut out);
    let mut family = out.family(
        "kvplane_indexer_publisher_connected",
        Kind::Gauge,
        "1 while the SUB connection is up.",
    );
    for (endpoint, p) in &registry.publishers {
        family.sample(
            &[("endpoint", endpoint)],
            u64::from(p.status.connected.load(Ordering::Relaxed)),
        );
    }
    out.response()
}

async fn openapi(State(st): St) -> Json<Value> {
    let mut doc = super::openapi_doc();
    crate::web::openapi::annotate(&mut doc, &policy(st.config.auth.clone()));
    Json(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    /// The answer as it was built before: a `serde_json::Value`.
    fn as_value(tenant: &str, rows: BTreeMap<String, InstanceMatch>) -> Value {
        if rows.is_empty() {
            return json!({});
        }
        let mut instances = Map::new();
        for (inst, m) in rows {
            let dp: Map<String, Value> =
                m.dp.iter()
                    .map(|(r, v)| (r.to_string(), json!(v)))
                    .collect();
            instances.insert(
                inst,
                json!({"longest_matched": m.longest_matched, "GPU": m.gpu, "CPU": m.cpu,
                       "DISK": m.disk, "DP": dp}),
            );
        }
        json!({ tenant: instances })
    }

    /// The answer's bytes are those of the `Value` it replaced, key order included.
    #[test]
    fn the_answer_is_the_bytes_of_the_value() {
        let row = |n: u64, ranks: &[u32]| InstanceMatch {
            longest_matched: n,
            gpu: n / 2,
            cpu: n / 3,
            disk: 0,
            dp: ranks.iter().map(|&r| (r, n + u64::from(r))).collect(),
            other: BTreeMap::new(),
        };
        let cases: Vec<(&str, Vec<(&str, InstanceMatch)>)> = vec![
            ("default", vec![]),
            ("default", vec![("vllm-1", row(2048, &[0]))]),
            (
                "t\"\\é",
                vec![
                    ("b", row(16, &[0, 1, 2, 10, 11, 100])),
                    ("a\n\u{1}", row(u64::MAX, &[])),
                    ("", row(0, &[u32::MAX])),
                ],
            ),
        ];
        for (tenant, rows) in cases {
            let rows: BTreeMap<String, InstanceMatch> =
                rows.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            let mut bytes = Vec::new();
            serde_json::to_writer(
                &mut bytes,
                &Answer {
                    tenant,
                    rows: &rows,
                },
            )
            .expect("written");
            let want = serde_json::to_vec(&as_value(tenant, rows)).expect("written");
            assert_eq!(String::from_utf8(bytes), String::from_utf8(want));
        }
    }
}
