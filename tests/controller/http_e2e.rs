//! End to end: the whole controller on 127.0.0.1 with ephemeral ports, workers that register
//! and push over real ZMQ sockets (tests/support), fake worker REP sockets answering the
//! commands, and HTTP over a real TCP connection. Every await is bounded.

use crate::support::{
    eventually, http, http_post, server_with, vector, FakeWorker, TestWorker, STEP,
};
use kvplane::protocol::*;
use serde_json::json;
use std::time::Duration;

const CPU: &str = "LocalCPUBackend";

async fn fast_server() -> kvplane::controller::Server {
    server_with(|c| c.downlink_timeout = Duration::from_millis(500)).await
}

/// Registers `instance`/`worker` over the reply socket with its REP at `port`.
async fn join(
    server: &kvplane::controller::Server,
    instance: &str,
    worker: i64,
    port: u16,
    peer: Option<&str>,
) -> TestWorker {
    let mut w = TestWorker::new(server, instance, worker);
    match w.register(port, peer).await {
        Msg::RegisterRetMsg(_) => w,
        other => panic!("registration failed: {other:?}"),
    }
}

#[tokio::test]
async fn clear_reaches_the_worker_and_its_answer_comes_back() {
    let server = fast_server().await;
    let addr = server.addrs.http;
    let mut rep = FakeWorker::start(|m| match m {
        Msg::ClearWorkerMsg(_) => Some(Msg::ClearWorkerRetMsg(ClearWorkerRetMsg { num_tokens: 7 })),
        _ => Some(Msg::ErrorMsg(ErrorMsg {
            error: "unexpected".into(),
        })),
    })
    .await;
    let _w = join(&server, "inst-a", 0, rep.port, None).await;
    let (status, body) = http_post(
        addr,
        "/clear",
        r#"{"instance_id":"inst-a","location":"LocalCPUBackend"}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["num_tokens"], 7);
    let event = body["event_id"].as_str().expect("event id").to_owned();
    match rep.next_command().await {
        Msg::ClearWorkerMsg(m) => {
            assert_eq!(m.location, CPU);
            assert_eq!(m.worker_event_id, format!("Worker0{event}"));
        }
        other => panic!("{other:?}"),
    }
    let (status, body) = http_post(
        addr,
        "/check_finish",
        &json!({ "event_id": event }).to_string(),
    )
    .await;
    assert_eq!((status, body["status"].as_str()), (200, Some("finished")));
    server.stop().await;
}

#[tokio::test]
async fn move_pairs_source_and_destination_ranks() {
    let server = fast_server().await;
    let mv = |_: &Msg| Some(Msg::MoveWorkerRetMsg(MoveWorkerRetMsg { num_tokens: 512 }));
    let mut src0 = FakeWorker::start(mv).await;
    let mut src1 = FakeWorker::start(mv).await;
    let dst = FakeWorker::start(|_| None).await;
    // Registration order differs from rank order on purpose.
    let _s1 = join(&server, "src", 1, src1.port, Some("127.0.0.1:7101")).await;
    let _s0 = join(&server, "src", 0, src0.port, Some("127.0.0.1:7100")).await;
    let _d1 = join(&server, "dst", 1, dst.port, Some("127.0.0.1:7201")).await;
    let _d0 = join(&server, "dst", 0, dst.port, Some("127.0.0.1:7200")).await;
    let body = r#"{"old_position":["src","LocalCPUBackend"],"new_position":["dst","LocalCPUBackend"],
                   "tokens":[1,2,3]}"#;
    let (status, body) = http_post(server.addrs.http, "/move", body).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["num_tokens"], 512);
    for (rep, url) in [(&mut src0, "127.0.0.1:7200"), (&mut src1, "127.0.0.1:7201")] {
        match rep.next_command().await {
            Msg::MoveWorkerMsg(m) => {
                assert_eq!(m.new_position, (url.to_owned(), CPU.to_owned()));
                assert_eq!(m.old_position, CPU);
                assert_eq!(m.tokens, Some(vec![1, 2, 3]));
                assert_eq!(m.copy, Some(false), "should_copy defaults to false");
            }
            other => panic!("{other:?}"),
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn a_silent_worker_yields_504_within_the_timeout_while_another_instance_works() {
    // Long enough that the other instance's answer, however slow the machine, comes while the
    // silent worker's command still waits for it.
    let timeout = Duration::from_secs(3);
    let server = server_with(|c| c.downlink_timeout = timeout).await;
    let addr = server.addrs.http;
    let mut silent = FakeWorker::start(|_| None).await;
    let healthy = FakeWorker::start(|_| {
        Some(Msg::HealthWorkerRetMsg(HealthWorkerRetMsg {
            error_code: 0,
        }))
    })
    .await;
    let _q = join(&server, "quiet", 0, silent.port, None).await;
    let _h = join(&server, "fine", 0, healthy.port, None).await;
    let started = tokio::time::Instant::now();
    let stuck = tokio::spawn(async move {
        http_post(addr, "/clear", r#"{"instance_id":"quiet","location":"x"}"#).await
    });
    // While the quiet worker holds its command, the other instance answers: the clear to the
    // quiet one is still waiting when the health check comes back.
    silent.next_command().await;
    let (status, body) = http_post(addr, "/health", r#"{"instance_id":"fine"}"#).await;
    assert_eq!((status, &body["error_codes"]), (200, &json!({ "0": 0 })));
    assert!(
        !stuck.is_finished(),
        "answered only after the quiet worker's command ended"
    );
    let (status, body) = crate::support::within("stuck clear", stuck)
        .await
        .expect("task");
    assert_eq!(status, 504, "{body}");
    // Never before the timeout; how soon after it is not a test's question.
    assert!(started.elapsed() >= timeout, "504 before the timeout");
    let detail = body["detail"].as_str().expect("detail");
    assert!(
        detail.contains("(quiet, 0)") && detail.contains(&silent.port.to_string()),
        "{detail}"
    );
    // The controller stays usable: the healthy instance still answers.
    let (status, _) = http_post(addr, "/health", r#"{"instance_id":"fine"}"#).await;
    assert_eq!(status, 200);
    server.stop().await;
}

#[tokio::test]
async fn lookup_by_tokens_finds_chunks_admitted_under_cpython_hashes() {
    let server = fast_server().await;
    let rep = FakeWorker::start(|_| None).await;
    let mut w = join(&server, "inst-a", 0, rep.port, Some("127.0.0.1:7300")).await;
    // The worker admits the hashes CPython computed for these tokens (conformance vector),
    // over the PULL socket as an LMCache worker does.
    let v = vector("big_token_ids");
    let hashes: Vec<i64> = v["chunks"]
        .as_array()
        .expect("chunks")
        .iter()
        .map(|c| c["chunk_hash"].as_i64().expect("i64 hash"))
        .collect();
    let ops: Vec<(bool, i64)> = hashes.iter().map(|&h| (true, h)).collect();
    let batch = w.batch(CPU, &ops);
    w.push(&[batch]).await;
    eventually("keys applied", STEP, async || {
        server.shared.index().key_count() == hashes.len() as u64
    })
    .await;
    let (status, body) = http_post(
        server.addrs.http,
        "/lookup",
        &json!({ "tokens": v["tokens"] }).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["layout_info"], json!({ "inst-a": [CPU, 300] }));
    assert_eq!(body["holders"][0]["matched_chunks"], 2);
    assert_eq!(body["holders"][0]["peer_init_url"], "127.0.0.1:7300");
    server.stop().await;
}

#[tokio::test]
async fn readyz_metrics_and_access_control_on_a_live_server() {
    let server = server_with(|c| {
        c.api_token = Some(kvplane::config::ApiToken::new("tok"));
    })
    .await;
    let addr = server.addrs.http;
    // Ready once every socket loop serves (they start right after `start` returns).
    let body = eventually("ready", STEP, async || {
        match http(addr, "GET", "/readyz", None, &[]).await {
            (200, body) => Ok(body),
            (_, body) => Err(body),
        }
    })
    .await;
    assert_eq!(
        body["sockets"],
        json!({"pull": "serving", "reply": "serving", "heartbeat": "serving"})
    );
    let rep = FakeWorker::start(|_| None).await;
    let mut w = join(&server, "inst", 0, rep.port, None).await;
    let b1 = w.batch(CPU, &[(true, 1), (true, 2)]);
    let b2 = w.batch(CPU, &[(true, 3)]);
    w.push(&[b1, b2]).await;
    eventually("keys applied", STEP, async || {
        server.shared.index().key_count() == 3
    })
    .await;
    let (status, text) = http(addr, "GET", "/metrics", None, &[]).await;
    assert_eq!(status, 200);
    let text = text.as_str().expect("text");
    for line in [
        "lmcache:cache_controller_kv_pool_keys_count{role=\"controller\"} 3\n",
        "lmcache:cache_controller_pull_socket_message_count{role=\"controller\"} 2\n",
        "lmcache:cache_controller_reply_socket_message_count{role=\"controller\"} 1\n",
        "lmcache:cache_controller_registered_workers_count{role=\"controller\"} 1\n",
        "lmcache:cache_controller_pull_socket_active_requests{role=\"controller\"} 0\n",
    ] {
        assert!(text.contains(line), "missing {line}{text}");
    }
    // Mutating routes need the token; reads do not.
    let clear = r#"{"instance_id":"inst","location":"x"}"#;
    let (status, _) = http_post(addr, "/clear", clear).await;
    assert_eq!(status, 401);
    let (status, _) = http_post(addr, "/query_worker_info", r#"{"instance_id":"inst"}"#).await;
    assert_eq!(status, 200);
    server.stop().await;
}
