//! Handler tests: every route through `router(state).oneshot(..)` — no HTTP port — with each
//! status code it can answer: `/lookup`, access control, the queries and the GET routes here,
//! the worker commands in `http_commands.rs`, and the helpers both use (a `Driver` on a
//! standing clock, registration, admission, requests). Every await is bounded.

use crate::support::{call, vector, within, Answer, FakeWorker};
use kvplane::config::{ApiToken, ServeConfig};
use kvplane::controller::routes::router;
use kvplane::controller::{Clock, Driver, RouterKind};
use kvplane::protocol::*;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

pub(crate) const CPU: &str = "LocalCPUBackend";

pub(crate) fn shared_with(tweak: impl FnOnce(&mut ServeConfig)) -> Arc<Driver> {
    let mut config = ServeConfig::ephemeral();
    config.downlink_timeout = Duration::from_millis(400);
    tweak(&mut config);
    // A clock standing still, so registration times are exact.
    Arc::new(Driver::with_clock(
        config,
        None,
        Clock::fixed(1_700_000_000.0),
    ))
}

pub(crate) fn shared() -> Arc<Driver> {
    shared_with(|_| {})
}

/// Registers a worker (as its `RegisterMsg` would; the downlink to `port` opens with it).
pub(crate) fn register(
    shared: &Driver,
    instance: &str,
    worker: i64,
    port: u16,
    peer: Option<&str>,
) {
    let reply = shared.handle_request(
        RouterKind::Reply,
        crate::support::register_msg(instance, worker, port, peer),
    );
    assert!(matches!(reply, Msg::RegisterRetMsg(_)), "{reply:?}");
}

pub(crate) fn admit(shared: &Driver, instance: &str, worker: i64, hashes: &[ChunkHash]) {
    let operations: Vec<KVOpEvent> = hashes
        .iter()
        .enumerate()
        .map(|(i, &key)| KVOpEvent {
            op_type: OpType::Admit,
            key,
            seq_num: i as i64,
        })
        .collect();
    let batch = Msg::BatchedKVOperationMsg(BatchedKVOperationMsg {
        instance_id: instance.to_owned(),
        worker_id: worker,
        location: CPU.to_owned(),
        operations,
    });
    assert_eq!(shared.handle_push(batch), Ok(()));
}

pub(crate) async fn post(shared: &Arc<Driver>, uri: &str, body: &str) -> Answer {
    call(router(Arc::clone(shared)), "POST", uri, Some(body), &[]).await
}

pub(crate) async fn get(shared: &Arc<Driver>, uri: &str) -> Answer {
    call(router(Arc::clone(shared)), "GET", uri, None, &[]).await
}

/// Starts `POST uri` in its own task (so a fake worker can answer meanwhile).
pub(crate) fn post_later(
    shared: &Arc<Driver>,
    uri: &'static str,
    body: Value,
) -> tokio::task::JoinHandle<Answer> {
    let app = router(Arc::clone(shared));
    tokio::spawn(async move { call(app, "POST", uri, Some(&body.to_string()), &[]).await })
}

pub(crate) async fn joined(task: tokio::task::JoinHandle<Answer>) -> Answer {
    within("request task", task).await.expect("request task")
}

pub(crate) fn clear_ret(n: i64) -> Option<Msg> {
    Some(Msg::ClearWorkerRetMsg(ClearWorkerRetMsg { num_tokens: n }))
}

pub(crate) fn assert_event_id(v: &Value, prefix: &str) {
    let id = v["event_id"].as_str().expect("event_id");
    assert!(
        id.starts_with(prefix) && id.len() == prefix.len() + 36,
        "{id}"
    );
}

pub(crate) fn vector_hashes(v: &Value) -> Vec<ChunkHash> {
    v["chunks"]
        .as_array()
        .expect("chunks")
        .iter()
        .map(|c| serde_json::from_value(c["chunk_hash"].clone()).expect("hash"))
        .collect()
}

/// `POST /check_finish` for `event`.
pub(crate) async fn check_finish(shared: &Arc<Driver>, event: &str) -> Answer {
    post(
        shared,
        "/check_finish",
        &json!({ "event_id": event }).to_string(),
    )
    .await
}

/// The `detail` text of an error answer.
pub(crate) fn detail(a: &Answer) -> &str {
    a.body["detail"].as_str().expect("detail")
}

// ---------------------------------------------------------------- /lookup

#[tokio::test]
async fn lookup_by_tokens_matches_lmcache_semantics_and_lists_every_holder() {
    let shared = shared();
    let v = vector("three_chunks_random");
    let hashes = vector_hashes(&v);
    // inst-a (registered first) holds chunks 0-1, inst-b holds 0-2: LMCache credits chunks 0
    // and 1 to inst-a (first holder) and chunk 2 to inst-b.
    register(&shared, "inst-a", 0, 1, None);
    register(&shared, "inst-b", 0, 2, Some("127.0.0.1:7002"));
    admit(&shared, "inst-a", 0, &hashes[..2]);
    admit(&shared, "inst-b", 0, &hashes);
    let body = json!({ "tokens": v["tokens"] }).to_string();
    let a = post(&shared, "/lookup", &body).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_event_id(&a.body, "Lookup");
    assert_eq!(
        a.body["layout_info"],
        json!({ "inst-a": [CPU, 512], "inst-b": [CPU, 768] })
    );
    assert_eq!(a.body["num_chunks"], 3);
    assert_eq!(
        a.body["holders"],
        json!([
            { "instance_id": "inst-a", "worker_id": 0, "location": CPU, "matched_chunks": 2,
              "end_token": 512, "peer_init_url": null },
            { "instance_id": "inst-b", "worker_id": 0, "location": CPU, "matched_chunks": 3,
              "end_token": 768, "peer_init_url": "127.0.0.1:7002" }
        ])
    );
    // LMCache stops at the first chunk nobody holds, even if later ones are held.
    let v = vector("partial_tail");
    let tail = vector_hashes(&v);
    admit(&shared, "inst-a", 0, &tail[1..]);
    let a = post(
        &shared,
        "/lookup",
        &json!({ "tokens": v["tokens"] }).to_string(),
    )
    .await;
    assert_eq!(a.body["layout_info"], json!({}));
    assert_eq!(a.body["holders"], json!([]));
}

#[tokio::test]
async fn lookup_by_hashes_with_offsets() {
    let shared = shared();
    register(&shared, "inst-a", 3, 1, Some("h:1"));
    let big = ChunkHash::from_u64(u64::MAX - 1);
    admit(&shared, "inst-a", 3, &[ChunkHash::from_i64(-5), big]);
    let a = post(
        &shared,
        "/lookup",
        r#"{"hashes": [-5, 18446744073709551614, 7], "offsets": [256, 10]}"#,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["layout_info"], json!({ "inst-a": [CPU, 266] }));
    assert_eq!(a.body["holders"][0]["matched_chunks"], 2);
    assert_eq!(a.body["holders"][0]["worker_id"], 3);
    assert_eq!(a.body["num_chunks"], 3);
    // Without offsets every chunk counts --lookup-chunk-size tokens.
    let a = post(&shared, "/lookup", r#"{"hashes": [-5]}"#).await;
    assert_eq!(a.body["layout_info"], json!({ "inst-a": [CPU, 256] }));
}

#[tokio::test]
async fn lookup_flags_change_the_hashing() {
    let shared = shared_with(|c| {
        c.lookup_chunk_size = 2;
        c.lookup_none_hash = ChunkHash::from_i64(i64::MIN);
    });
    register(&shared, "inst-a", 0, 1, None);
    // CPython 3.11: chain of [0, 1, 2] in chunks of 2 from NONE_HASH = -2^63.
    admit(
        &shared,
        "inst-a",
        0,
        &[
            ChunkHash::from_i64(7_862_291_594_611_447_200),
            ChunkHash::from_i64(-7_666_373_384_711_926_768),
        ],
    );
    let a = post(&shared, "/lookup", r#"{"tokens": [0, 1, 2]}"#).await;
    assert_eq!(a.body["layout_info"], json!({ "inst-a": [CPU, 3] }));
}

#[tokio::test]
async fn lookup_rejects_bad_bodies_with_422_naming_the_field() {
    let shared = shared();
    let a = post(&shared, "/lookup", "{}").await;
    assert_eq!(a.status, 422);
    assert_eq!(a.body["detail"][0]["loc"], json!(["body", "tokens"]));
    assert_eq!(a.body["detail"][0]["type"], "missing");
    let a = post(&shared, "/lookup", r#"{"tokens": [1], "hashes": [1]}"#).await;
    assert_eq!(a.status, 422);
    let a = post(&shared, "/lookup", r#"{"tokens": [1, "two"]}"#).await;
    assert_eq!(a.status, 422);
    assert_eq!(a.body["detail"][0]["loc"], json!(["body", "tokens", 1]));
    let a = post(&shared, "/lookup", r#"{"hashes": [18446744073709551616]}"#).await;
    assert_eq!(a.status, 422);
    let a = post(&shared, "/lookup", "{").await;
    assert_eq!(a.status, 422);
    assert_eq!(a.body["detail"][0]["type"], "json_invalid");
}

// ---------------------------------------------------------------- access control

#[tokio::test]
async fn api_token_guards_mutating_routes_only() {
    let shared = shared_with(|c| c.api_token = Some(ApiToken::new("s3cret")));
    let w = FakeWorker::start(|_| clear_ret(1)).await;
    register(&shared, "inst", 0, w.port, None);
    let clear = r#"{"instance_id":"inst","location":"x"}"#;
    let app = || router(Arc::clone(&shared));
    let a = call(app(), "POST", "/clear", Some(clear), &[]).await;
    assert_eq!(a.status, 401);
    assert_eq!(a.headers["www-authenticate"], "Bearer");
    assert_eq!(a.body["detail"], "Not authenticated");
    let a = call(
        app(),
        "POST",
        "/clear",
        Some(clear),
        &[("authorization", "Bearer wrong")],
    )
    .await;
    assert_eq!(a.status, 401);
    assert_eq!(
        a.headers["www-authenticate"],
        "Bearer error=\"invalid_token\""
    );
    // Auth comes before validation: no token, bad body is still a 401.
    let a = call(app(), "POST", "/move", Some("{}"), &[]).await;
    assert_eq!(a.status, 401);
    let a = call(
        app(),
        "POST",
        "/clear",
        Some(clear),
        &[("authorization", "Bearer s3cret")],
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    for uri in ["/pin", "/compress", "/decompress", "/move"] {
        let a = call(app(), "POST", uri, Some("{}"), &[]).await;
        assert_eq!(a.status, 401, "{uri}");
    }
    // Reads stay open.
    let a = call(app(), "POST", "/lookup", Some(r#"{"tokens":[1]}"#), &[]).await;
    assert_eq!(a.status, 200);
    let a = call(
        app(),
        "POST",
        "/health",
        Some(r#"{"instance_id":"x"}"#),
        &[],
    )
    .await;
    assert_eq!(a.status, 200);
    let a = call(
        app(),
        "POST",
        "/query_worker_info",
        Some(r#"{"instance_id":"all"}"#),
        &[],
    )
    .await;
    assert_eq!(a.status, 200);
    for uri in [
        "/controller/workers",
        "/metrics",
        "/openapi.json",
        "/healthz",
    ] {
        assert_eq!(
            call(app(), "GET", uri, None, &[]).await.status,
            200,
            "{uri}"
        );
    }
    let doc = call(app(), "GET", "/openapi.json", None, &[]).await.body;
    assert_eq!(
        doc["paths"]["/clear"]["post"]["security"],
        json!([{ "bearerAuth": [] }])
    );
}

// ---------------------------------------------------------------- queries

#[tokio::test]
async fn query_instance_and_query_worker_info() {
    let shared = shared();
    register(&shared, "inst-a", 1, 5001, Some("p:1"));
    register(&shared, "inst-a", 0, 5000, None);
    register(&shared, "inst-b", 0, 5002, None);
    let a = post(
        &shared,
        "/query_instance",
        r#"{"event_id":"x","ip":"127.0.0.1"}"#,
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body["res"], "inst-a");
    assert_event_id(&a.body, "QueryInst");
    let a = post(&shared, "/query_instance", r#"{"ip":"10.9.9.9"}"#).await;
    assert_eq!(a.status, 404);
    let a = post(&shared, "/query_instance", r#"{"event_id":"x"}"#).await;
    assert_eq!(a.status, 422);

    let a = post(&shared, "/query_worker_info", r#"{"instance_id":"inst-a"}"#).await;
    assert_eq!(a.status, 200);
    assert_event_id(&a.body, "QueryWorkerInfo");
    let infos = a.body["worker_infos"].as_array().expect("list");
    assert_eq!(infos.len(), 2);
    assert_eq!(
        infos[0],
        json!({"instance_id":"inst-a","worker_id":0,"ip":"127.0.0.1","port":5000,
               "peer_init_url":null,"registration_time":1_700_000_000.0,
               "last_heartbeat_time":1_700_000_000.0})
    );
    assert_eq!(infos[1]["worker_id"], 1);
    let a = post(
        &shared,
        "/query_worker_info",
        r#"{"instance_id":"inst-a","worker_ids":[1,7]}"#,
    )
    .await;
    assert_eq!(a.body["worker_infos"].as_array().map(Vec::len), Some(1));
    let a = post(
        &shared,
        "/query_worker_info",
        r#"{"instance_id":"all","worker_ids":[]}"#,
    )
    .await;
    assert_eq!(a.body["worker_infos"].as_array().map(Vec::len), Some(3));
    let a = post(
        &shared,
        "/query_worker_info",
        r#"{"instance_id":"all","worker_ids":[0]}"#,
    )
    .await;
    assert_eq!(a.body["worker_infos"].as_array().map(Vec::len), Some(2));
    let a = post(&shared, "/query_worker_info", r#"{"instance_id":"ghost"}"#).await;
    assert_eq!(a.status, 404);
    let a = post(&shared, "/query_worker_info", r#"{"worker_ids":[1]}"#).await;
    assert_eq!(a.status, 422);
}

// ---------------------------------------------------------------- GET routes

#[tokio::test]
async fn key_stats_and_workers_have_lmcache_shapes() {
    let shared = shared();
    register(&shared, "inst-a", 0, 5000, None);
    register(&shared, "inst-a", 1, 5001, None);
    register(&shared, "inst-b", 0, 5002, None);
    admit(
        &shared,
        "inst-a",
        0,
        &[ChunkHash::from_i64(1), ChunkHash::from_i64(2)],
    );
    admit(&shared, "inst-b", 0, &[ChunkHash::from_i64(1)]);
    let a = get(&shared, "/controller/key-stats").await;
    assert_eq!(a.status, 200);
    assert_eq!(
        a.body,
        json!({"total_key_count": 3, "total_instance_count": 2, "total_worker_count": 3,
               "instances": [
                   {"instance_id": "inst-a", "key_count": 2, "worker_count": 2},
                   {"instance_id": "inst-b", "key_count": 1, "worker_count": 1}]})
    );
    let a = get(&shared, "/controller/workers").await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body["total_count"], 3);
    let first = &a.body["workers"][0];
    assert_eq!(first["key_count"], 2);
    assert_eq!(
        first["locations"],
        json!([{"name": CPU, "key_count": 2, "last_seq": 1}])
    );
    assert_eq!(first["sync"]["state"], "idle");
    let a = get(&shared, "/controller/workers?instance_id=inst-a").await;
    assert_eq!(a.body["total_count"], 2);
    let a = get(
        &shared,
        "/controller/workers?instance_id=inst-b&worker_id=0",
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body["instance_id"], "inst-b");
    assert_eq!(a.body["key_count"], 1);
    let a = get(&shared, "/controller/workers?worker_id=0").await;
    assert_eq!(a.body["total_count"], 2);
    let a = get(&shared, "/controller/workers?instance_id=zz").await;
    assert_eq!(
        (a.status.as_u16(), &a.body),
        (
            404,
            &json!({"detail": "No workers found for instance zz",
                    "error": "No workers found for instance zz", "reason": "not_found"})
        )
    );
    let a = get(
        &shared,
        "/controller/workers?instance_id=inst-a&worker_id=9",
    )
    .await;
    assert_eq!(
        (a.status.as_u16(), &a.body),
        (
            404,
            &json!({"detail": "Worker (inst-a, 9) not found",
                    "error": "Worker (inst-a, 9) not found", "reason": "not_found"})
        )
    );
    let a = get(&shared, "/controller/workers?worker_id=abc").await;
    assert_eq!(a.status, 422);
    assert_eq!(a.body["detail"][0]["loc"], json!(["query", "worker_id"]));
    assert_eq!(a.body["detail"][0]["type"], "int_parsing");
}

#[tokio::test]
async fn healthz_readyz_and_fallbacks() {
    let shared = shared();
    let a = get(&shared, "/healthz").await;
    assert_eq!((a.status.as_u16(), &a.body["status"]), (200, &json!("ok")));
    // No socket loop runs in a handler test: not ready until they serve.
    let a = get(&shared, "/readyz").await;
    assert_eq!(a.status, 503);
    assert_eq!(a.body["sockets"]["pull"], "not_serving");
    {
        let s = &shared.sockets;
        let _guards = (
            s.pull.start_serving(),
            s.reply.start_serving(),
            s.heartbeat.start_serving(),
        );
        let a = get(&shared, "/readyz").await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.body["status"], "ready");
    }
    assert_eq!(
        get(&shared, "/readyz").await.status,
        503,
        "loops stopped: not ready"
    );
    let a = get(&shared, "/nope").await;
    assert_eq!(
        (a.status.as_u16(), &a.body),
        (
            404,
            &json!({"detail": "Not Found", "error": "Not Found", "reason": "not_found"})
        )
    );
    let a = get(&shared, "/clear").await;
    assert_eq!(a.status, 405);
    assert_eq!(a.body["reason"], "method_not_allowed");
    let huge = format!(
        "{{\"tokens\": [{}1]}}",
        " ".repeat(kvplane::config::defaults::MAX_BODY_BYTES)
    );
    let a = post(&shared, "/lookup", &huge).await;
    assert_eq!(a.status, 413);
}

#[tokio::test]
async fn every_route_answers_its_method_and_is_in_the_openapi_document() {
    let shared = shared();
    let doc = get(&shared, "/openapi.json").await;
    assert_eq!(doc.status, 200);
    assert_eq!(doc.body["openapi"], "3.0.3");
    for r in kvplane::controller::routes::operations() {
        let method = r.method.as_str();
        let body = (method == "POST").then_some("{}");
        let a = call(router(Arc::clone(&shared)), method, r.path, body, &[]).await;
        assert!(
            a.status != 405 && a.body["detail"] != "Not Found",
            "{method} {} is not routed ({})",
            r.path,
            a.status
        );
        assert!(
            doc.body["paths"][r.path][method.to_ascii_lowercase()].is_object(),
            "{method} {} missing from /openapi.json",
            r.path
        );
    }
}

#[tokio::test]
async fn metrics_export_lmcache_gauges_and_http_requests_by_route() {
    let shared = shared();
    register(&shared, "inst", 0, 5000, None);
    admit(
        &shared,
        "inst",
        0,
        &[ChunkHash::from_i64(1), ChunkHash::from_i64(2)],
    );
    let app = router(Arc::clone(&shared));
    let _ = call(
        app.clone(),
        "GET",
        "/controller/workers?instance_id=inst",
        None,
        &[],
    )
    .await;
    let _ = call(
        app.clone(),
        "POST",
        "/lookup",
        Some(r#"{"hashes":[1]}"#),
        &[],
    )
    .await;
    let _ = call(app.clone(), "GET", "/no/such/path", None, &[]).await;
    let a = call(app, "GET", "/metrics", None, &[]).await;
    assert_eq!(a.status, 200);
    assert!(a.headers["content-type"]
        .to_str()
        .expect("ascii")
        .starts_with("text/plain"));
    let text = a.body.as_str().expect("text");
    let gauges = [
        "kv_pool_keys_count",
        "registered_workers_count",
        "pull_socket_message_count",
        "reply_socket_message_count",
        "pull_socket_has_pending",
        "reply_socket_has_pending",
        "pull_socket_active_requests",
        "reply_socket_active_requests",
        "kv_op_seq_discontinuity_count",
        "full_sync_workers_syncing",
        "full_sync_workers_completed",
        "full_sync_global_progress",
        "full_sync_missing_batches_total",
    ];
    for g in gauges {
        let line = format!("lmcache:cache_controller_{g}{{role=\"controller\"}} ");
        assert!(text.contains(&line), "missing {line}\n{text}");
    }
    assert!(text.contains("lmcache:cache_controller_kv_pool_keys_count{role=\"controller\"} 2\n"));
    assert!(
        text.contains("lmcache:cache_controller_registered_workers_count{role=\"controller\"} 1\n")
    );
    assert!(text
        .contains("lmcache:cache_controller_full_sync_global_progress{role=\"controller\"} 1\n"));
    assert!(text.contains(
        "kvplane_http_requests_total{method=\"GET\",route=\"/controller/workers\",status=\"200\"} 1"
    ), "{text}");
    assert!(text.contains(
        "kvplane_http_requests_total{method=\"GET\",route=\"unmatched\",status=\"404\"} 1"
    ));
    assert!(text.contains("kvplane_http_lookups_total{result=\"hit\"} 1"));
    assert!(text.contains("kvplane_http_lookup_seconds_count 1"));
}
