//! Handler tests: every route through `router(state).oneshot(..)` — no HTTP port — with each
//! status code it can answer. Commands reach fake workers over real ZMQ REP sockets on
//! 127.0.0.1 (the downlinks are real); every await is bounded.

use crate::support::{call, eventually, vector, within, Answer, FakeWorker, STEP};
use kvplane::config::{ApiToken, ServeConfig};
use kvplane::controller::routes::router;
use kvplane::controller::{Clock, RouterKind, Shared};
use kvplane::protocol::*;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

const CPU: &str = "LocalCPUBackend";

fn shared_with(tweak: impl FnOnce(&mut ServeConfig)) -> Arc<Shared> {
    let mut config = ServeConfig::ephemeral();
    config.downlink_timeout = Duration::from_millis(400);
    tweak(&mut config);
    // A clock standing still, so registration times are exact.
    Arc::new(Shared::with_clock(
        config,
        None,
        Clock::fixed(1_700_000_000.0),
    ))
}

fn shared() -> Arc<Shared> {
    shared_with(|_| {})
}

/// Registers a worker (as its `RegisterMsg` would; the downlink to `port` opens with it).
fn register(shared: &Shared, instance: &str, worker: i64, port: u16, peer: Option<&str>) {
    let reply = shared.handle_request(
        RouterKind::Reply,
        Msg::RegisterMsg(RegisterMsg {
            instance_id: instance.to_owned(),
            worker_id: worker,
            ip: "127.0.0.1".to_owned(),
            port: i64::from(port),
            peer_init_url: peer.map(str::to_owned),
            distributed_url: None,
        }),
    );
    assert!(matches!(reply, Msg::RegisterRetMsg(_)), "{reply:?}");
}

fn admit(shared: &Shared, instance: &str, worker: i64, hashes: &[ChunkHash]) {
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

async fn post(shared: &Arc<Shared>, uri: &str, body: &str) -> Answer {
    call(router(Arc::clone(shared)), "POST", uri, Some(body), &[]).await
}

async fn get(shared: &Arc<Shared>, uri: &str) -> Answer {
    call(router(Arc::clone(shared)), "GET", uri, None, &[]).await
}

/// Starts `POST uri` in its own task (so a fake worker can answer meanwhile).
fn post_later(
    shared: &Arc<Shared>,
    uri: &'static str,
    body: Value,
) -> tokio::task::JoinHandle<Answer> {
    let app = router(Arc::clone(shared));
    tokio::spawn(async move { call(app, "POST", uri, Some(&body.to_string()), &[]).await })
}

async fn joined(task: tokio::task::JoinHandle<Answer>) -> Answer {
    within("request task", task).await.expect("request task")
}

fn clear_ret(n: i64) -> Option<Msg> {
    Some(Msg::ClearWorkerRetMsg(ClearWorkerRetMsg { num_tokens: n }))
}

fn assert_event_id(v: &Value, prefix: &str) {
    let id = v["event_id"].as_str().expect("event_id");
    assert!(
        id.starts_with(prefix) && id.len() == prefix.len() + 36,
        "{id}"
    );
}

fn vector_hashes(v: &Value) -> Vec<ChunkHash> {
    v["chunks"]
        .as_array()
        .expect("chunks")
        .iter()
        .map(|c| serde_json::from_value(c["chunk_hash"].clone()).expect("hash"))
        .collect()
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

// ---------------------------------------------------------------- commands

#[tokio::test]
async fn clear_reaches_every_worker_and_returns_their_answer() {
    let shared = shared();
    let mut w0 = FakeWorker::start(|_| clear_ret(7)).await;
    let mut w1 = FakeWorker::start(|_| clear_ret(7)).await;
    register(&shared, "inst", 1, w1.port, None);
    register(&shared, "inst", 0, w0.port, None);
    let a = post(
        &shared,
        "/clear",
        r#"{"instance_id":"inst","location":"LocalCPUBackend"}"#,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_event_id(&a.body, "Clear");
    assert_eq!(a.body["num_tokens"], 7);
    assert_eq!(a.body["num_tokens_by_worker"], json!({ "0": 7, "1": 7 }));
    let event = a.body["event_id"].as_str().expect("id");
    for (w, rank) in [(&mut w0, 0), (&mut w1, 1)] {
        match w.next_command().await {
            Msg::ClearWorkerMsg(m) => {
                assert_eq!(m.location, CPU);
                assert_eq!(m.worker_event_id, format!("Worker{rank}{event}"));
            }
            other => panic!("{other:?}"),
        }
    }
    // The command is recorded as finished with its answer.
    let f = post(
        &shared,
        "/check_finish",
        &json!({ "event_id": event }).to_string(),
    )
    .await;
    assert_eq!(f.status, 200);
    assert_eq!(f.body["status"], "finished");
    assert_eq!(f.body["command"], "clear");
    assert_eq!(f.body["result"]["num_tokens"], 7);
}

#[tokio::test]
async fn commands_to_an_unknown_instance_are_404() {
    let shared = shared();
    for (uri, body) in [
        ("/clear", json!({"instance_id": "ghost", "location": CPU})),
        (
            "/pin",
            json!({"instance_id": "ghost", "location": CPU, "tokens": [1]}),
        ),
        (
            "/compress",
            json!({"instance_id": "ghost", "method": "m", "location": CPU}),
        ),
        (
            "/decompress",
            json!({"instance_id": "ghost", "method": "m", "location": CPU}),
        ),
        (
            "/move",
            json!({"old_position": ["ghost", CPU], "new_position": ["x", CPU]}),
        ),
    ] {
        let a = post(&shared, uri, &body.to_string()).await;
        assert_eq!(a.status, 404, "{uri}: {}", a.body);
        assert_eq!(
            a.body["detail"], "Instance ghost is not registered",
            "{uri}"
        );
    }
}

#[tokio::test]
async fn commands_reject_bad_bodies_with_422() {
    let shared = shared();
    let a = post(&shared, "/clear", r#"{"instance_id":"x"}"#).await;
    assert_eq!(a.status, 422);
    // FastAPI's body, with the one error shape's `error`, `reason` and `field` beside it.
    assert_eq!(
        a.body,
        json!({"detail":[{"type":"missing","loc":["body","location"],"msg":"Field required",
                          "input":{"instance_id":"x"}}],
               "error": "body.location: Field required", "reason": "missing",
               "field": "location"})
    );
    let a = post(&shared, "/pin", r#"{"instance_id":"x","location":"y"}"#).await;
    assert_eq!(a.body["detail"][0]["loc"], json!(["body", "tokens"]));
    let a = post(
        &shared,
        "/compress",
        r#"{"instance_id":"x","location":"y"}"#,
    )
    .await;
    assert_eq!(a.body["detail"][0]["loc"], json!(["body", "method"]));
    let a = post(
        &shared,
        "/decompress",
        r#"{"instance_id":1,"method":"m","location":"y"}"#,
    )
    .await;
    assert_eq!(a.body["detail"][0]["type"], "string_type");
    let a = post(
        &shared,
        "/move",
        r#"{"old_position":["a"],"new_position":["a","b","c"],"should_copy":"maybe"}"#,
    )
    .await;
    assert_eq!(a.status, 422);
    let kinds: Vec<&str> = a.body["detail"]
        .as_array()
        .expect("list")
        .iter()
        .map(|e| e["type"].as_str().expect("type"))
        .collect();
    assert_eq!(kinds, ["missing", "too_long", "bool_type"]);
    let a = post(&shared, "/health", "[]").await;
    assert_eq!(a.body["detail"][0]["type"], "model_attributes_type");
    let a = post(&shared, "/check_finish", "").await;
    assert_eq!(a.body["detail"][0]["loc"], json!(["body"]));
}

#[tokio::test]
async fn a_silent_worker_makes_the_command_504_naming_it_within_the_timeout() {
    let shared = shared();
    let mut ok = FakeWorker::start(|_| clear_ret(3)).await;
    let mut silent = FakeWorker::start(|_| None).await;
    register(&shared, "inst", 0, ok.port, None);
    register(&shared, "inst", 1, silent.port, None);
    let task = post_later(
        &shared,
        "/clear",
        json!({"instance_id": "inst", "location": CPU}),
    );
    // While the silent worker holds the command, its status is pending.
    let event = match silent.next_command().await {
        Msg::ClearWorkerMsg(m) => m
            .worker_event_id
            .strip_prefix("Worker1")
            .expect("Worker{rank}{event_id}")
            .to_owned(),
        other => panic!("{other:?}"),
    };
    let f = post(
        &shared,
        "/check_finish",
        &json!({ "event_id": event }).to_string(),
    )
    .await;
    assert_eq!(f.body["status"], "pending", "{}", f.body);
    let a = joined(task).await;
    assert_eq!(a.status, 504, "{}", a.body);
    assert_eq!(a.body["event_id"], event.as_str());
    let detail = a.body["detail"].as_str().expect("detail");
    assert!(
        detail.contains("(inst, 1)") && detail.contains(&format!("127.0.0.1:{}", silent.port)),
        "{detail}"
    );
    assert_eq!(a.body["workers"][0]["error"], "timeout");
    assert_eq!(a.body["workers"].as_array().map(Vec::len), Some(1));
    let _ = ok.next_command().await;
    let f = post(
        &shared,
        "/check_finish",
        &json!({ "event_id": event }).to_string(),
    )
    .await;
    assert_eq!(f.body["status"], "failed");
    assert!(f.body["detail"]
        .as_str()
        .expect("detail")
        .contains("(inst, 1)"));
}

#[tokio::test]
async fn worker_errors_are_502_and_disagreeing_counts_answer_the_smallest() {
    let shared = shared();
    let _e = FakeWorker::start(|_| {
        Some(Msg::ErrorMsg(ErrorMsg {
            error: "boom".into(),
        }))
    })
    .await;
    register(&shared, "bad", 0, _e.port, None);
    let a = post(&shared, "/clear", r#"{"instance_id":"bad","location":"x"}"#).await;
    assert_eq!(a.status, 502, "{}", a.body);
    assert_eq!(a.body["workers"][0]["error"], "error_reply");
    assert!(a.body["detail"].as_str().expect("detail").contains("boom"));

    // A reply of the wrong type is also the worker's fault.
    let _u = FakeWorker::start(|_| clear_ret(1)).await;
    register(&shared, "odd", 0, _u.port, None);
    let a = post(
        &shared,
        "/pin",
        r#"{"instance_id":"odd","location":"x","tokens":[1]}"#,
    )
    .await;
    assert_eq!(a.status, 502);
    assert_eq!(a.body["workers"][0]["error"], "unexpected_reply");

    let pin = |n| move |_: &Msg| Some(Msg::PinWorkerRetMsg(PinWorkerRetMsg { num_tokens: n }));
    let mut w0 = FakeWorker::start(pin(7)).await;
    let _w1 = FakeWorker::start(pin(5)).await;
    register(&shared, "tp", 0, w0.port, None);
    register(&shared, "tp", 1, _w1.port, None);
    let a = post(
        &shared,
        "/pin",
        r#"{"instance_id":"tp","location":"x","tokens":[4,5,6]}"#,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["num_tokens"], 5);
    assert_eq!(a.body["num_tokens_by_worker"], json!({ "0": 7, "1": 5 }));
    match w0.next_command().await {
        Msg::PinWorkerMsg(m) => assert_eq!(m.tokens, vec![4, 5, 6]),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn compress_and_decompress_send_lmcache_defaults() {
    let shared = shared();
    let mut w = FakeWorker::start(|m| match m {
        Msg::CompressWorkerMsg(_) => Some(Msg::CompressWorkerRetMsg(CompressWorkerRetMsg {
            num_tokens: 11,
        })),
        _ => Some(Msg::DecompressWorkerRetMsg(DecompressWorkerRetMsg {
            num_tokens: 12,
        })),
    })
    .await;
    register(&shared, "inst", 0, w.port, None);
    let a = post(
        &shared,
        "/compress",
        r#"{"instance_id":"inst","method":"cachegen","location":"L"}"#,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_event_id(&a.body, "Compress");
    assert_eq!(a.body["num_tokens"], 11);
    match w.next_command().await {
        Msg::CompressWorkerMsg(m) => {
            assert_eq!((m.method.as_str(), m.location.as_str()), ("cachegen", "L"));
            assert_eq!(m.tokens, Some(vec![]), "LMCache's default is [], not null");
            assert!(m.worker_event_id.starts_with("CompressWorker0Compress"));
        }
        other => panic!("{other:?}"),
    }
    let a = post(
        &shared,
        "/decompress",
        r#"{"instance_id":"inst","method":"m","location":"L","tokens":null}"#,
    )
    .await;
    assert_eq!(a.status, 200);
    assert_event_id(&a.body, "Decompress");
    assert_eq!(a.body["num_tokens"], 12);
    match w.next_command().await {
        Msg::DecompressWorkerMsg(m) => assert_eq!(m.tokens, None),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn move_pairs_ranks_and_needs_p2p_on_the_destination() {
    let shared = shared();
    let mv = |_: &Msg| Some(Msg::MoveWorkerRetMsg(MoveWorkerRetMsg { num_tokens: 256 }));
    let mut s0 = FakeWorker::start(mv).await;
    let mut s1 = FakeWorker::start(mv).await;
    register(&shared, "src", 1, s1.port, None);
    register(&shared, "src", 0, s0.port, None);
    register(&shared, "dst", 1, 9, Some("10.0.0.2:8201"));
    register(&shared, "dst", 0, 9, Some("10.0.0.2:8200"));
    register(&shared, "dst", 2, 9, Some("10.0.0.2:8202"));
    let a = post(
        &shared,
        "/move",
        r#"{"old_position":["src","LocalCPUBackend"],"new_position":["dst","LocalCPUBackend"],
            "tokens":[1,2],"should_copy":true}"#,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_event_id(&a.body, "Move");
    assert_eq!(a.body["num_tokens"], 256);
    assert_eq!(
        a.body["num_tokens_by_worker"],
        json!({ "0": 256, "1": 256 })
    );
    for (w, url) in [(&mut s0, "10.0.0.2:8200"), (&mut s1, "10.0.0.2:8201")] {
        match w.next_command().await {
            Msg::MoveWorkerMsg(m) => {
                assert_eq!(m.old_position, CPU);
                assert_eq!(m.new_position, (url.to_owned(), CPU.to_owned()));
                assert_eq!(m.tokens, Some(vec![1, 2]));
                assert_eq!(m.copy, Some(true));
            }
            other => panic!("{other:?}"),
        }
    }
    register(&shared, "nop2p", 0, 9, None);
    let a = post(
        &shared,
        "/move",
        r#"{"old_position":["src","L"],"new_position":["nop2p","L"]}"#,
    )
    .await;
    assert_eq!(a.status, 409, "{}", a.body);
    assert!(a.body["detail"]
        .as_str()
        .expect("detail")
        .contains("(nop2p, 0)"));
    let a = post(
        &shared,
        "/move",
        r#"{"old_position":["src","L"],"new_position":["none","L"]}"#,
    )
    .await;
    assert_eq!(a.status, 404);
    assert_eq!(a.body["detail"], "Instance none is not registered");
}

#[tokio::test]
async fn health_reports_codes_keeps_lmcache_200_for_unknown_and_504s_on_silence() {
    let shared = shared();
    let _ok = FakeWorker::start(|_| {
        Some(Msg::HealthWorkerRetMsg(HealthWorkerRetMsg {
            error_code: 0,
        }))
    })
    .await;
    let _err = FakeWorker::start(|_| Some(Msg::ErrorMsg(ErrorMsg { error: "no".into() }))).await;
    let _odd = FakeWorker::start(|_| clear_ret(0)).await;
    register(&shared, "inst", 0, _ok.port, None);
    register(&shared, "inst", 1, _err.port, None);
    register(&shared, "inst", 2, _odd.port, None);
    let a = post(&shared, "/health", r#"{"instance_id":"inst"}"#).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_event_id(&a.body, "health");
    assert_eq!(
        a.body["error_codes"],
        json!({ "0": 0, "1": kvplane::controller::routes::HEALTH_ERROR_REPLY, "2": kvplane::controller::routes::HEALTH_UNEXPECTED_REPLY })
    );
    let a = post(&shared, "/health", r#"{"instance_id":"nobody"}"#).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body["error_codes"], json!({}));
    let id = a.body["event_id"].as_str().expect("event id");
    let f = post(
        &shared,
        "/check_finish",
        &json!({ "event_id": id }).to_string(),
    )
    .await;
    assert_eq!(
        f.body["status"], "finished",
        "every command's event id can be checked"
    );

    let _silent = FakeWorker::start(|_| None).await;
    register(&shared, "quiet", 0, _ok.port, None);
    register(&shared, "quiet", 1, _silent.port, None);
    let a = post(&shared, "/health", r#"{"instance_id":"quiet"}"#).await;
    assert_eq!(a.status, 504, "{}", a.body);
    assert_eq!(
        a.body["error_codes"],
        json!({ "0": 0, "1": kvplane::controller::routes::HEALTH_TIMEOUT })
    );
    assert_eq!(a.body["workers"][0]["worker_id"], 1);
}

#[tokio::test]
async fn check_finish_unknown_event_is_404() {
    let shared = shared();
    let a = post(&shared, "/check_finish", r#"{"event_id":"Clear-nope"}"#).await;
    assert_eq!(a.status, 404);
    assert!(a.body["detail"]
        .as_str()
        .expect("detail")
        .contains("Clear-nope"));
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
    for r in kvplane::controller::routes::api_routes() {
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

#[tokio::test]
async fn fan_out_is_concurrent_and_full_queues_are_503() {
    // Both workers are asked at once: each answers only once both hold the command. Asked
    // one after the other, the first would wait for the second until its timeout: a 504.
    let roomy = shared_with(|c| c.downlink_timeout = STEP);
    let both = Arc::new(tokio::sync::Barrier::new(2));
    let answer_together = |both: Arc<tokio::sync::Barrier>| {
        FakeWorker::start_async(move |_| {
            let both = Arc::clone(&both);
            async move {
                both.wait().await;
                Some(Msg::HealthWorkerRetMsg(HealthWorkerRetMsg {
                    error_code: 0,
                }))
            }
        })
    };
    let _x = answer_together(Arc::clone(&both)).await;
    let _y = answer_together(Arc::clone(&both)).await;
    register(&roomy, "pair", 0, _x.port, None);
    register(&roomy, "pair", 1, _y.port, None);
    let a = post(&roomy, "/health", r#"{"instance_id":"pair"}"#).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["error_codes"], json!({"0": 0, "1": 0}), "{}", a.body);

    // Two silent workers: one 504 naming both.
    let shared = shared();
    let _a = FakeWorker::start(|_| None).await;
    let _b = FakeWorker::start(|_| None).await;
    register(&shared, "two", 0, _a.port, None);
    register(&shared, "two", 1, _b.port, None);
    let a = post(&shared, "/health", r#"{"instance_id":"two"}"#).await;
    assert_eq!(a.status, 504);
    assert_eq!(a.body["workers"].as_array().map(Vec::len), Some(2));

    // A worker with 64 commands already queued refuses more at once: 503 "busy".
    let _c = FakeWorker::start(|_| None).await;
    register(&shared, "slow", 0, _c.port, None);
    let tasks: Vec<_> = (0..80)
        .map(|_| post_later(&shared, "/health", json!({ "instance_id": "slow" })))
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        let a = joined(t).await;
        if a.status == 503 {
            assert_eq!(a.body["workers"][0]["error"], "busy", "{}", a.body);
            assert_eq!(
                a.body["error_codes"],
                json!({ "0": kvplane::controller::routes::HEALTH_UNREACHABLE })
            );
        }
        statuses.push(a.status.as_u16());
    }
    assert!(statuses.contains(&503), "{statuses:?}");
    assert!(
        statuses.iter().all(|s| [503, 504].contains(s)),
        "{statuses:?}"
    );
}

/// One command reaches at most `MAX_FAN_OUT` workers of its instance at once. Counted at the
/// workers, which hold every answer until the test releases them: with an unbounded fan-out
/// all of them would hold a request at the same time.
#[tokio::test]
async fn a_command_reaches_at_most_max_fan_out_workers_at_once() {
    use kvplane::controller::routes::MAX_FAN_OUT;
    use kvplane::transport::RepServer;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let workers = MAX_FAN_OUT + 6;
    let shared = shared_with(|c| c.downlink_timeout = Duration::from_secs(20));
    let outstanding = Arc::new(AtomicUsize::new(0));
    let max = Arc::new(AtomicUsize::new(0));
    let received = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let mut servers = Vec::new();
    for wid in 0..workers {
        let (mut rep, addr) = within("bind rep", RepServer::bind("127.0.0.1:0"))
            .await
            .expect("rep binds");
        register(&shared, "wide", wid as i64, addr.port(), None);
        let (outstanding, max, received, release) = (
            Arc::clone(&outstanding),
            Arc::clone(&max),
            Arc::clone(&received),
            Arc::clone(&release),
        );
        servers.push(crate::support::AbortOnDrop(tokio::spawn(async move {
            if rep.recv().await.is_err() {
                return;
            }
            let now = outstanding.fetch_add(1, Ordering::SeqCst) + 1;
            max.fetch_max(now, Ordering::SeqCst);
            received.fetch_add(1, Ordering::SeqCst);
            let Ok(permit) = release.acquire().await else {
                return;
            };
            permit.forget();
            outstanding.fetch_sub(1, Ordering::SeqCst);
            let reply = Msg::HealthWorkerRetMsg(HealthWorkerRetMsg { error_code: 0 });
            let _ = rep.reply(bytes::Bytes::from(encode(&reply))).await;
        })));
    }
    let call = post_later(&shared, "/health", json!({"instance_id": "wide"}));
    eventually("MAX_FAN_OUT requests arrived", STEP, async || {
        received.load(Ordering::SeqCst) >= MAX_FAN_OUT
    })
    .await;
    release.add_permits(workers);
    let answer = joined(call).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        answer.body["error_codes"].as_object().map(|o| o.len()),
        Some(workers)
    );
    assert_eq!(
        received.load(Ordering::SeqCst),
        workers,
        "every worker asked once"
    );
    assert_eq!(
        max.load(Ordering::SeqCst),
        MAX_FAN_OUT,
        "at most MAX_FAN_OUT requests held at once, and that many used"
    );
}
