//! The controller over real ZMQ sockets on 127.0.0.1 (ephemeral ports): registration,
//! batches, lookups, heartbeats, full sync, downlink commands, liveness, bad input.

use crate::support::*;
use bytes::Bytes;
use kvplane::protocol::*;
use std::collections::BTreeSet;
use std::time::Duration;

const CPU: &str = "LocalCPUBackend";

fn lookup_msg(instance: &str, worker_id: i64, hashes: &[i64]) -> Msg {
    Msg::BatchedP2PLookupMsg(BatchedP2PLookupMsg {
        hashes: hashes.iter().map(|h| ChunkHash::from_i64(*h)).collect(),
        instance_id: instance.into(),
        worker_id,
    })
}

fn layout(reply: Msg) -> (String, String, i64, String) {
    match reply {
        Msg::BatchedP2PLookupRetMsg(r) => {
            assert_eq!(r.layout_info.len(), 1, "P2P replies are one-element lists");
            r.layout_info.into_iter().next().expect("one element")
        }
        other => panic!("expected a lookup reply, got {other:?}"),
    }
}

fn miss() -> (String, String, i64, String) {
    (String::new(), String::new(), 0, String::new())
}

#[tokio::test]
async fn register_returns_a_reachable_heartbeat_url() {
    let server = server().await;
    let mut w = TestWorker::new(&server, "inst-a", 0);
    let (_rep, port) = rep().await;
    match w.register(port, None).await {
        Msg::RegisterRetMsg(r) => {
            let url = r
                .extra_config
                .get("heartbeat_url")
                .expect("heartbeat_url present");
            assert_eq!(url, &ep(server.addrs.heartbeat), "host:port without scheme");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(server.shared.index().worker_count(), 1);
    server.stop().await;
}

#[tokio::test]
async fn batches_apply_in_order_and_peers_find_each_other() {
    let server = server().await;
    let (_rep_a, port_a) = rep().await;
    let (_rep_b, port_b) = rep().await;
    let mut a = TestWorker::new(&server, "inst-a", 0);
    let mut b = TestWorker::new(&server, "inst-b", 0);
    a.register(port_a, Some("127.0.0.1:7001")).await;
    b.register(port_b, Some("127.0.0.1:7002")).await;

    // Two batches in one multipart, then a third: admit 10..15, evict 12, re-admit 12 later.
    let first = a.batch(CPU, &[(true, 10), (true, 11), (true, 12)]);
    let second = a.batch(CPU, &[(true, 13), (false, 12), (true, 14)]);
    a.push(&[first, second]).await;
    let third = a.batch(
        CPU,
        &[(true, -9_000_000_000_000_000_000), (true, 12), (false, 14)],
    );
    a.push(&[third]).await;
    eventually("all ops applied", STEP, async || {
        keys(&server, "inst-a", 0).len() == 5
    })
    .await;
    assert_eq!(
        keys(&server, "inst-a", 0),
        BTreeSet::from([-9_000_000_000_000_000_000, 10, 11, 12, 13])
    );

    // b finds a's prefix 10, 11, 12, 13 (14 was evicted).
    let hit = layout(
        b.request(lookup_msg("inst-b", 0, &[10, 11, 12, 13, 14]))
            .await,
    );
    assert_eq!(
        hit,
        ("inst-a".into(), CPU.into(), 4, "127.0.0.1:7001".into())
    );
    // a never finds itself.
    assert_eq!(
        layout(a.request(lookup_msg("inst-a", 0, &[10])).await),
        miss()
    );
    // Unknown first hash, empty request: the sentinel.
    assert_eq!(
        layout(b.request(lookup_msg("inst-b", 0, &[99, 10])).await),
        miss()
    );
    assert_eq!(
        layout(b.request(lookup_msg("inst-b", 0, &[])).await),
        miss()
    );
    server.stop().await;
}

#[tokio::test]
async fn lookup_prefers_the_requesters_tp_rank() {
    let server = server().await;
    let mut workers = Vec::new();
    for rank in 0..2 {
        let (rep, port) = rep().await;
        let mut w = TestWorker::new(&server, "holder", rank);
        w.register(port, Some(&format!("127.0.0.1:{}", 7100 + rank)))
            .await;
        let batch = w.batch(CPU, &[(true, 1), (true, 2)]);
        w.push(&[batch]).await;
        workers.push((w, rep));
    }
    eventually("both ranks hold both keys", STEP, async || {
        keys(&server, "holder", 0).len() == 2 && keys(&server, "holder", 1).len() == 2
    })
    .await;
    let mut asker = TestWorker::new(&server, "asker", 1);
    let hit = layout(asker.request(lookup_msg("asker", 1, &[1, 2])).await);
    assert_eq!(
        hit,
        ("holder".into(), CPU.into(), 2, "127.0.0.1:7101".into())
    );
    let hit = layout(asker.request(lookup_msg("asker", 0, &[1, 2])).await);
    assert_eq!(hit.3, "127.0.0.1:7100");
    server.stop().await;
}

#[tokio::test]
async fn heartbeats_known_unknown_and_on_the_heartbeat_socket_only() {
    let server = server().await;
    let (_rep, port) = rep().await;
    let mut w = TestWorker::new(&server, "inst-h", 2);
    let mut hb =
        kvplane::transport::DealerClient::new(ep(server.addrs.heartbeat), Duration::from_secs(5));
    let beat = Msg::HeartbeatMsg(HeartbeatMsg {
        instance_id: "inst-h".into(),
        worker_id: 2,
        ip: "127.0.0.1".into(),
        port: i64::from(port),
        peer_init_url: None,
        distributed_url: None,
    });
    // Unknown worker: re-registered and told to full-sync.
    match ask(&mut hb, &beat).await {
        Msg::HeartbeatRetMsg(r) => {
            assert_eq!(
                r.commands,
                vec![HeartbeatCommand::full_sync("worker_re_registered")]
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(server.shared.index().worker_count(), 1);
    // Known worker: no commands (no controller_restart storm on a fresh controller).
    match ask(&mut hb, &beat).await {
        Msg::HeartbeatRetMsg(r) => assert!(r.commands.is_empty(), "{:?}", r.commands),
        other => panic!("{other:?}"),
    }
    // A RegisterMsg on the heartbeat socket is refused, as LMCache does.
    let reg = register_msg("x", 0, 1, None);
    match ask(&mut hb, &reg).await {
        Msg::ErrorMsg(e) => assert!(e.error.contains("Expected HeartbeatMsg"), "{}", e.error),
        other => panic!("{other:?}"),
    }
    // Heartbeats are also accepted on the reply socket.
    assert!(matches!(w.request(beat).await, Msg::HeartbeatRetMsg(_)));
    server.stop().await;
}

#[tokio::test]
async fn re_register_clears_the_workers_keys() {
    let server = server().await;
    let (_rep, port) = rep().await;
    let mut w = TestWorker::new(&server, "inst-r", 0);
    w.register(port, None).await;
    let batch = w.batch(CPU, &[(true, 1), (true, 2)]);
    w.push(&[batch]).await;
    eventually("keys applied", STEP, async || {
        keys(&server, "inst-r", 0).len() == 2
    })
    .await;
    w.register(port, None).await;
    assert!(keys(&server, "inst-r", 0).is_empty());
    assert_eq!(server.shared.index().worker_count(), 1);
    server.stop().await;
}

#[tokio::test]
async fn deregister_removes_the_worker_and_its_chunks() {
    let server = server().await;
    let (_rep, port) = rep().await;
    let mut a = TestWorker::new(&server, "gone", 0);
    let mut b = TestWorker::new(&server, "asker", 0);
    a.register(port, Some("127.0.0.1:7001")).await;
    let batch = a.batch(CPU, &[(true, 5)]);
    a.push(&[batch]).await;
    eventually("applied", STEP, async || {
        keys(&server, "gone", 0).len() == 1
    })
    .await;
    a.push(&[Msg::DeRegisterMsg(DeRegisterMsg {
        instance_id: "gone".into(),
        worker_id: 0,
        ip: "127.0.0.1".into(),
        port: i64::from(port),
    })])
    .await;
    eventually("deregistered", STEP, async || {
        server.shared.index().worker_count() == 0
    })
    .await;
    assert_eq!(
        layout(b.request(lookup_msg("asker", 0, &[5])).await),
        miss()
    );
    assert!(server.shared.downlink("gone", 0).is_none());
    server.stop().await;
}

fn sync_batch(sync_id: &str, batch_id: i64, keys: &[i64]) -> Msg {
    Msg::FullSyncBatchMsg(FullSyncBatchMsg {
        instance_id: "inst-s".into(),
        worker_id: 0,
        location: CPU.into(),
        sync_id: sync_id.into(),
        batch_id,
        keys: keys.iter().map(|k| ChunkHash::from_i64(*k)).collect(),
    })
}

async fn status(w: &mut TestWorker, sync_id: &str) -> FullSyncStatusRetMsg {
    match w
        .request(Msg::FullSyncStatusMsg(FullSyncStatusMsg {
            instance_id: "inst-s".into(),
            worker_id: 0,
            sync_id: sync_id.into(),
        }))
        .await
    {
        Msg::FullSyncStatusRetMsg(s) => s,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn full_sync_with_a_missing_batch_completes_only_when_it_arrives() {
    let server = server().await;
    let (mut w, _rep) = TestWorker::registered(&server, "inst-s", 0, None).await;
    let stale = w.batch(CPU, &[(true, 999)]);
    w.push(&[stale]).await;
    eventually("pre-sync key", STEP, async || {
        keys(&server, "inst-s", 0).len() == 1
    })
    .await;

    let start = Msg::FullSyncStartMsg(FullSyncStartMsg {
        instance_id: "inst-s".into(),
        worker_id: 0,
        location: CPU.into(),
        sync_id: "s1".into(),
        total_keys: 4,
        batch_count: 2,
    });
    match w.request(start).await {
        Msg::FullSyncStartRetMsg(r) => assert!(r.accepted, "{:?}", r.error_msg),
        other => panic!("{other:?}"),
    }
    // A different sync id while syncing is refused.
    let other_start = Msg::FullSyncStartMsg(FullSyncStartMsg {
        instance_id: "inst-s".into(),
        worker_id: 0,
        location: CPU.into(),
        sync_id: "s2".into(),
        total_keys: 1,
        batch_count: 1,
    });
    match w.request(other_start).await {
        Msg::FullSyncStartRetMsg(r) => assert!(!r.accepted && r.error_msg.is_some()),
        other => panic!("{other:?}"),
    }
    // Batch 1 and End arrive; batch 0 is lost. An incremental op during the sync is discarded.
    let during = w.batch(CPU, &[(true, 555)]);
    let end = Msg::FullSyncEndMsg(FullSyncEndMsg {
        instance_id: "inst-s".into(),
        worker_id: 0,
        location: CPU.into(),
        sync_id: "s1".into(),
        actual_total_keys: 4,
    });
    w.push(&[sync_batch("s1", 1, &[3, 4]), during, end.clone()])
        .await;
    eventually("batch 1 applied", STEP, async || {
        keys(&server, "inst-s", 0).len() == 2
    })
    .await;
    let s = status(&mut w, "s1").await;
    assert!(!s.is_complete && !s.can_exit_freeze, "{s:?}");
    assert_eq!(s.missing_batches, vec![0]);

    // The worker resends the missing batch and End, as FullSyncSender does.
    w.push(&[sync_batch("s1", 0, &[1, 2]), end]).await;
    let s = eventually(
        "the sync completes once the missing batch arrived",
        STEP,
        async || {
            let s = status(&mut w, "s1").await;
            s.is_complete.then_some(s)
        },
    )
    .await;
    assert!(s.can_exit_freeze && s.missing_batches.is_empty() && s.global_progress == 1.0);
    assert_eq!(keys(&server, "inst-s", 0), BTreeSet::from([1, 2, 3, 4]));
    server.stop().await;
}

#[tokio::test]
async fn downlink_command_round_trip_and_timeout() {
    let server = server_with(|c| c.downlink_timeout = Duration::from_millis(500)).await;
    let (mut rep, port) = rep().await;
    let mut w = TestWorker::new(&server, "inst-d", 0);
    w.register(port, None).await;
    let downlink = server
        .shared
        .downlink("inst-d", 0)
        .expect("downlink opened")
        .downlink;
    let clear = Msg::ClearWorkerMsg(ClearWorkerMsg {
        worker_event_id: "ev-1".into(),
        location: CPU.into(),
    });
    let call = tokio::spawn({
        let downlink = downlink.clone();
        let clear = clear.clone();
        async move { downlink.request(clear).await }
    });
    let seen = serve_one(&mut rep, |_| {
        Msg::ClearWorkerRetMsg(ClearWorkerRetMsg { num_tokens: 7 })
    })
    .await;
    assert_eq!(seen, clear);
    let answer = within("command answer", call)
        .await
        .expect("task")
        .expect("answered");
    assert_eq!(
        answer,
        Msg::ClearWorkerRetMsg(ClearWorkerRetMsg { num_tokens: 7 })
    );

    // The worker receives the next command but never answers: a timeout, not a hang (the
    // `within` bounds the wait).
    let call = tokio::spawn({
        let downlink = downlink.clone();
        async move {
            downlink
                .request(Msg::HealthWorkerMsg(HealthWorkerMsg {
                    worker_event_id: "ev-2".into(),
                }))
                .await
        }
    });
    let _unanswered = within("rep recv", rep.recv()).await.expect("received");
    let result = within("timed out call", call).await.expect("task");
    assert!(
        matches!(result, Err(kvplane::controller::DownlinkError::Timeout(_))),
        "{result:?}"
    );

    // A fresh socket serves the next command once the worker answers again.
    drop(rep);
    let mut rep = rebind_rep(port).await;
    let call = tokio::spawn({
        let downlink = downlink.clone();
        async move {
            downlink
                .request(Msg::HealthWorkerMsg(HealthWorkerMsg {
                    worker_event_id: "ev-3".into(),
                }))
                .await
        }
    });
    serve_one(&mut rep, |_| {
        Msg::HealthWorkerRetMsg(HealthWorkerRetMsg { error_code: 0 })
    })
    .await;
    let answer = within("answer after failure", call).await.expect("task");
    assert_eq!(
        answer,
        Ok(Msg::HealthWorkerRetMsg(HealthWorkerRetMsg {
            error_code: 0
        }))
    );
    server.stop().await;
}

/// The probe-then-remove sweep over real downlinks. The server's clock is skipped past the
/// worker timeout (tokio's own time keeps running, so the sockets behave normally), and the
/// sweeps are run directly: no sleeping, and each sweep's outcome is counted.
#[tokio::test]
async fn silent_workers_are_probed_dead_ones_removed_live_ones_kept() {
    use kvplane::controller::liveness::{sweep, SweepStats};
    let timeout = Duration::from_secs(60);
    let server = server_with(|c| {
        c.worker_timeout = timeout;
        c.downlink_timeout = Duration::from_millis(300);
    })
    .await;
    // A live worker that never heartbeats but answers probes.
    let (mut live_rep, live_port) = rep().await;
    let mut live = TestWorker::new(&server, "live", 0);
    live.register(live_port, None).await;
    let responder = tokio::spawn(async move {
        for _ in 0..100 {
            if tokio::time::timeout(
                Duration::from_secs(5),
                serve_one(&mut live_rep, |_| {
                    Msg::HealthWorkerRetMsg(HealthWorkerRetMsg { error_code: 0 })
                }),
            )
            .await
            .is_err()
            {
                break;
            }
        }
    });
    // A dead worker: its command port has nothing behind it.
    let dead_port = {
        let (rep, port) = rep().await;
        drop(rep);
        port
    };
    let mut dead = TestWorker::new(&server, "dead", 0);
    dead.register(dead_port, Some("127.0.0.1:7009")).await;
    let batch = dead.batch(CPU, &[(true, 77)]);
    dead.push(&[batch]).await;
    eventually("dead worker's key applied", STEP, async || {
        keys(&server, "dead", 0).len() == 1
    })
    .await;

    // Before the timeout nobody is even probed.
    let shared = &server.shared;
    shared.clock().skip(timeout - Duration::from_secs(1));
    assert_eq!(within("sweep", sweep(shared)).await, SweepStats::default());

    shared.clock().skip(Duration::from_secs(2));
    let stats = within("sweep", sweep(shared)).await;
    assert_eq!(
        stats,
        SweepStats {
            stale: 2,
            answered: 1,
            removed: 1
        }
    );
    assert!(
        shared.index().worker("dead", 0).is_none(),
        "dead worker removed"
    );
    assert!(
        shared.index().worker("live", 0).is_some(),
        "live worker kept"
    );
    shared
        .check_consistency()
        .expect("model and downlinks agree");
    let mut asker = TestWorker::new(&server, "asker", 0);
    assert_eq!(
        layout(asker.request(lookup_msg("asker", 0, &[77])).await),
        miss()
    );
    // The answer counts as contact: the live worker is not stale again until a full timeout
    // later, and then it answers again.
    assert_eq!(within("sweep", sweep(shared)).await.stale, 0);
    shared.clock().skip(timeout + Duration::from_secs(1));
    let stats = within("sweep", sweep(shared)).await;
    assert_eq!(
        (stats.stale, stats.answered, stats.removed),
        (1, 1, 0),
        "{stats:?}"
    );
    assert!(
        shared.index().worker("live", 0).is_some(),
        "live worker kept"
    );
    responder.abort();
    server.stop().await;
}

/// The liveness loop itself runs the sweep on its interval.
#[tokio::test]
async fn the_liveness_loop_removes_a_dead_worker() {
    let timeout = Duration::from_secs(60);
    let server = server_with(|c| {
        c.health_check_interval = Some(Duration::from_millis(50));
        c.worker_timeout = timeout;
        c.downlink_timeout = Duration::from_millis(300);
    })
    .await;
    let dead_port = {
        let (rep, port) = rep().await;
        drop(rep);
        port
    };
    let mut dead = TestWorker::new(&server, "dead", 0);
    dead.register(dead_port, None).await;
    server.shared.clock().skip(timeout * 2);
    eventually("dead worker removed", STEP, async || {
        server.shared.index().worker("dead", 0).is_none()
    })
    .await;
    server.shared.check_consistency().expect("consistent");
    server.stop().await;
}

/// Issue 9's race over real sockets: a restarting worker sends `DeRegisterMsg` on PUSH and at
/// once `RegisterMsg` on its DEALER; the two land on different controller tasks. Whatever the
/// interleaving, every registered worker ends with exactly one live downlink of its current
/// generation, and none is leaked.
#[tokio::test]
async fn rapid_deregister_register_cycles_leave_one_downlink_per_worker() {
    const WORKERS: i64 = 8;
    const CYCLES: usize = 150;
    let server = server().await;
    let (_rep, port) = rep().await;
    let mut lanes = Vec::new();
    for wid in 0..WORKERS {
        let mut w = TestWorker::new(&server, "churn", wid);
        w.register(port, None).await;
        lanes.push(tokio::spawn(async move {
            for _ in 0..CYCLES {
                let bye = Msg::DeRegisterMsg(DeRegisterMsg {
                    instance_id: w.instance_id.clone(),
                    worker_id: w.worker_id,
                    ip: "127.0.0.1".into(),
                    port: i64::from(port),
                });
                // No wait between the two: the PULL and ROUTER tasks race.
                w.push(&[bye]).await;
                w.register(port, None).await;
            }
            w
        }));
    }
    let mut workers = Vec::new();
    for lane in lanes {
        workers.push(within("churn lane", lane).await.expect("lane"));
    }
    // The last DeRegisters may still be in flight on PULL: a final round of registrations
    // after a barrier message on PULL settles every worker as registered.
    for w in &mut workers {
        let batch = w.batch(CPU, &[(true, 1)]);
        w.push(&[batch]).await;
    }
    eventually("every PULL message applied", STEP, async || {
        server
            .shared
            .metrics
            .frames_received
            .with_label_values(&["pull"])
            .get()
            == (WORKERS as u64) * (CYCLES as u64 + 1)
    })
    .await;
    server
        .shared
        .check_consistency()
        .expect("consistent after the churn");
    for w in &mut workers {
        w.register(port, None).await;
    }
    server.shared.check_consistency().expect("consistent");
    assert_eq!(server.shared.index().worker_count(), WORKERS as usize);
    assert_eq!(server.shared.downlink_count(), WORKERS as usize);
    for wid in 0..WORKERS {
        let entry = server
            .shared
            .downlink("churn", wid)
            .expect("a live downlink");
        let record = server
            .shared
            .read(|f| f.downlink("churn", wid).map(|d| d.generation));
        assert_eq!(
            Some(entry.generation),
            record,
            "live generation is the model's"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn garbage_on_every_socket_is_counted_and_valid_traffic_still_works() {
    let server = server().await;
    let (mut w, _rep) = TestWorker::registered(&server, "inst-g", 0, Some("127.0.0.1:7001")).await;

    // PULL: random bytes, a truncated message, an unknown tag, a wrong field type, JSON
    // garbage, then a valid batch in the same multipart.
    let valid = encode(&w.batch(CPU, &[(true, 1)]));
    let unknown = br#"{"type":"NoSuchMsg"}"#.to_vec();
    let wrong_type = br#"{"type":"BatchedKVOperationMsg","instance_id":1,"worker_id":0,"location":"L","operations":[]}"#.to_vec();
    w.push_raw(vec![
        Bytes::from_static(&[0xc1, 0xff, 0x00, 0x13]),
        Bytes::copy_from_slice(&valid[..valid.len() / 2]),
        Bytes::from(unknown.clone()),
        Bytes::from(wrong_type),
        Bytes::from_static(b"{{{{"),
        Bytes::new(),
        Bytes::from(valid),
    ])
    .await;
    eventually("valid op after garbage applied", STEP, async || {
        keys(&server, "inst-g", 0).len() == 1
    })
    .await;

    // ROUTERs: garbage payloads get an ErrorMsg; the next valid request works.
    for payload in [Bytes::from_static(&[0xde, 0xad]), Bytes::from(unknown)] {
        let reply = within("garbage request", w.dealer.request(payload))
            .await
            .expect("answered");
        assert!(matches!(decode(&reply), Ok(Msg::ErrorMsg(_))));
    }
    let mut hb =
        kvplane::transport::DealerClient::new(ep(server.addrs.heartbeat), Duration::from_secs(5));
    let reply = within(
        "garbage heartbeat",
        hb.request(Bytes::from_static(b"\x00\x01")),
    )
    .await
    .expect("answered");
    assert!(matches!(decode(&reply), Ok(Msg::ErrorMsg(_))));
    let mut b = TestWorker::new(&server, "inst-b", 0);
    assert_eq!(layout(b.request(lookup_msg("inst-b", 0, &[1])).await).2, 1);

    let metrics = server.shared.metrics.render();
    let dropped: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("kvplane_frames_dropped_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(
        dropped >= 9,
        "every bad frame counted, got {dropped}:\n{metrics}"
    );
    server.stop().await;
}

#[tokio::test]
async fn json_frames_are_accepted_on_pull_and_router() {
    let server = server().await;
    let (_rep, port) = rep().await;
    let mut w = TestWorker::new(&server, "json-inst", 0);
    let register = format!(
        r#"{{"type":"RegisterMsg","instance_id":"json-inst","worker_id":0,"ip":"127.0.0.1","port":{port},"peer_init_url":null}}"#
    );
    let reply = within("json register", w.dealer.request(Bytes::from(register)))
        .await
        .expect("answered");
    assert!(
        matches!(decode(&reply), Ok(Msg::RegisterRetMsg(_))),
        "replies are msgpack"
    );
    w.push_raw(vec![Bytes::from_static(
        br#"{"type":"BatchedKVOperationMsg","instance_id":"json-inst","worker_id":0,"location":"LocalCPUBackend","operations":[{"op_type":"admit","key":18446744073709551615,"seq_num":0}]}"#,
    )])
    .await;
    eventually("json batch applied", STEP, async || {
        server.shared.index().keys_of("json-inst", 0, CPU) == vec![ChunkHash::from_u64(u64::MAX)]
    })
    .await;
    server.stop().await;
}

#[tokio::test]
async fn healthz_answers_over_http() {
    let server = server().await;
    let (status, body) = http(server.addrs.http, "GET", "/healthz", None, &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "ok", "{body}");
    server.stop().await;
}

/// Dropping a `Server` without `stop()` still stops it: every loop and downlink task ends.
#[tokio::test]
async fn dropping_the_server_cancels_its_tasks() {
    let server = server().await;
    let (_w, _rep) = TestWorker::registered(&server, "drop", 0, None).await;
    let shared = std::sync::Arc::clone(&server.shared);
    let tasks = shared.tasks().clone();
    assert!(!tasks.is_empty(), "loops and a downlink are running");
    drop(server);
    assert!(shared.shutdown_token().is_cancelled());
    tasks.close();
    within("every task ends after the drop", tasks.wait()).await;
}
