//! The controller's worker commands through `router(state).oneshot(..)`: `/clear`, `/pin`,
//! `/compress`, `/decompress`, `/move`, `/health` and `/check_finish`, each status code they
//! answer, and the fan-out to an instance's workers (concurrent, bounded, 503 on full queues).
//! Commands reach fake workers over real ZMQ REP sockets on 127.0.0.1 (the downlinks are
//! real); every await is bounded. The shared helpers are in `http.rs`.

use crate::http::{
    assert_event_id, check_finish, clear_ret, detail, joined, post, post_later, register, shared,
    shared_with, CPU,
};
use crate::support::{eventually, within, FakeWorker, STEP};
use kvplane::protocol::*;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

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
    let f = check_finish(&shared, event).await;
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
    let f = check_finish(&shared, &event).await;
    assert_eq!(f.body["status"], "pending", "{}", f.body);
    let a = joined(task).await;
    assert_eq!(a.status, 504, "{}", a.body);
    assert_eq!(a.body["event_id"], event.as_str());
    let named = detail(&a);
    assert!(
        named.contains("(inst, 1)") && named.contains(&format!("127.0.0.1:{}", silent.port)),
        "{named}"
    );
    assert_eq!(a.body["workers"][0]["error"], "timeout");
    assert_eq!(a.body["workers"].as_array().map(Vec::len), Some(1));
    let _ = ok.next_command().await;
    let f = check_finish(&shared, &event).await;
    assert_eq!(f.body["status"], "failed");
    assert!(detail(&f).contains("(inst, 1)"));
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
    assert!(detail(&a).contains("(nop2p, 0)"));
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
    let f = check_finish(&shared, id).await;
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
    assert!(detail(&a).contains("Clear-nope"));
}

// ---------------------------------------------------------------- fan-out

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
