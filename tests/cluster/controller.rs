//! Controller hot standby and read replicas (docs/CLUSTER.md).
//!
//! Failover: NATS, two `kvplane serve --cluster` processes on
//! the same ports (the standby binds nothing until it holds the lease), two real LMCache 0.5.6
//! workers and a simulated fleet pushing admits. SIGKILL the leader: the standby takes over
//! with the index the leader published, P2P lookups are answered again, no worker is asked
//! for a full sync, and admits go on. The admits lost in flight are printed; how long the
//! takeover takes is measured by `kvplane bench --scenarios failover`
//! (scripts/bench-cluster.sh), not here.

use crate::support::http::{http, try_http, until_json};
use crate::support::lmcache::worker_pair;
use crate::support::nats::{Member, Nats};
use crate::support::{eventually, free_port, loopback, ServePorts, TestWorker, SLOW};
use bytes::Bytes;
use kvplane::protocol::{decode, encode, BatchedP2PLookupMsg, ChunkHash, Msg};
use kvplane::transport::DealerClient;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const CPU: &str = "LocalCPUBackend";

/// A `kvplane serve --cluster` process on `ports`.
type Controller = Member;

fn controller(nats: &Nats, cluster: &str, ports: &ServePorts, name: &str) -> Controller {
    controller_with(nats, cluster, ports, name, &[])
}

fn controller_with(
    nats: &Nats,
    cluster: &str,
    ports: &ServePorts,
    name: &str,
    env: &[(&str, &str)],
) -> Controller {
    let on_ports = ports.env();
    let mut all: Vec<(&str, &str)> = on_ports.iter().map(|(k, v)| (*k, v.as_str())).collect();
    all.extend_from_slice(env);
    nats.member("serve", cluster, name, &all)
}

async fn get(ports: &ServePorts, path: &str) -> Value {
    http(loopback(ports.http), "GET", path, None, &[]).await.1
}

/// Polls `path` until `cond` holds on its JSON (connection errors count as not yet).
async fn until(ports: &ServePorts, path: &str, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    until_on(ports.http, path, what, cond).await
}

/// A member of `cluster` named `name` (`env` on top) on fresh ports, once it leads: the
/// ports, the process and its `/controller/cluster` status.
async fn leader(
    nats: &Nats,
    cluster: &str,
    name: &str,
    env: &[(&str, &str)],
) -> (ServePorts, Controller, Value) {
    let ports = ServePorts::free();
    let member = controller_with(nats, cluster, &ports, name, env);
    let what = format!("{name} leads");
    let status = until(&ports, "/controller/cluster", &what, |v| {
        v["role"] == "leader"
    })
    .await;
    (ports, member, status)
}

/// `/controller/key-stats` of the leader on `ports` once it holds `held` keys in all.
async fn key_stats_at(ports: &ServePorts, held: u64) -> Value {
    until(
        ports,
        "/controller/key-stats",
        "the leader applied all",
        |v| v["total_key_count"] == held,
    )
    .await
}

/// [`until`] on any HTTP port (a replica's).
async fn until_on(port: u16, path: &str, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    until_json(loopback(port), path, what, SLOW, cond).await
}

fn instance_keys(stats: &Value, instance: &str) -> u64 {
    stats["instances"]
        .as_array()
        .and_then(|l| l.iter().find(|i| i["instance_id"] == instance))
        .and_then(|i| i["key_count"].as_u64())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_takes_over_a_killed_leader_without_full_syncs() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let cluster = "failover";
    let (ports, mut first, leader) = leader(&nats, cluster, "first", &[]).await;
    let first_me = leader["me"].clone();
    let second = controller(&nats, cluster, &ports, "second");
    second.wait_for_line("waiting for the lease").await;

    // Two real LMCache workers (A serves peers) and a simulated fleet.
    let pull = format!("127.0.0.1:{}", ports.pull);
    let reply = format!("127.0.0.1:{}", ports.reply);
    let (mut a, peer_a, mut b) = worker_pair(&pull, &reply).await;
    a.wait_for("A registered", SLOW, |e| e["event"] == "registered")
        .await;
    b.wait_for("B registered", SLOW, |e| e["event"] == "registered")
        .await;
    // The simulated fleet: LMCache's wire protocol, fire-and-forget pushes as LMCache's.
    const SIMS: usize = 6;
    const BEFORE: i64 = 500;
    let mut sims = Vec::new();
    for i in 0..SIMS {
        let mut w = TestWorker::at(&reply, &pull, &format!("sim-{i}"), 0);
        let ok = w.register(free_port(), None).await;
        assert!(matches!(ok, Msg::RegisterRetMsg(_)), "{ok:?}");
        sims.push(w);
    }
    let a_keys: Vec<u64> = (1..=40).collect();
    a.call(json!({"cmd": "admit", "keys": a_keys}), SLOW).await;
    let key = |i: usize, k: i64| ((i as i64) << 32) | k;
    for (i, w) in sims.iter_mut().enumerate() {
        for chunk in (0..BEFORE).collect::<Vec<_>>().chunks(50) {
            let ops: Vec<(bool, i64)> = chunk.iter().map(|&k| (true, key(i, k))).collect();
            let batch = w.batch(CPU, &ops);
            w.push(&[batch]).await;
        }
    }
    let total = 40 + SIMS as u64 * BEFORE as u64;
    until(
        &ports,
        "/controller/key-stats",
        "every admit applied",
        |v| v["total_key_count"] == total && v["total_worker_count"] == 2 + SIMS as u64,
    )
    .await;
    // Every change the leader applied is in NATS (acknowledged) before it dies.
    until(&ports, "/controller/cluster", "changes replicated", |v| {
        let p = &v["published"];
        p["queued"].as_u64() > Some(0) && p["queued"] == p["acked"]
    })
    .await;

    // The fleet keeps pushing admits while the leader dies (a push that cannot be handed to
    // the socket in 50 ms is dropped, as LMCache's sender drops it).
    let pushing = Arc::new(AtomicBool::new(true));
    let pushed = Arc::new(AtomicU64::new(0));
    let pusher = {
        let (pushing, pushed) = (pushing.clone(), pushed.clone());
        tokio::spawn(async move {
            let mut k = BEFORE;
            while pushing.load(Ordering::Relaxed) && k < 1_000_000 {
                for (i, w) in sims.iter_mut().enumerate() {
                    let batch = w.batch(CPU, &[(true, key(i, k))]);
                    let frames = vec![Bytes::from(encode(&batch))];
                    if w.push.send(frames, Duration::from_millis(50)).await.is_ok() {
                        pushed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                k += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            sims
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;

    first.kill().await;
    // A router-side P2P lookup, as B's worker sends it, retried until answered.
    let lookup = Bytes::from(encode(&Msg::BatchedP2PLookupMsg(BatchedP2PLookupMsg {
        hashes: a_keys.iter().map(|&k| ChunkHash::from(k)).collect(),
        instance_id: "inst-B".into(),
        worker_id: 0,
    })));
    let answer = eventually("a P2P lookup answered after the kill", SLOW, async || {
        let mut dealer = DealerClient::new(reply.clone(), Duration::from_millis(200));
        dealer
            .request(lookup.clone())
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    let answer = decode(&answer).expect("lookup answer decodes");
    let Msg::BatchedP2PLookupRetMsg(m) = answer else {
        panic!("{answer:?}")
    };
    assert_eq!(
        m.layout_info,
        vec![("inst-A".into(), CPU.into(), 40, peer_a.clone())]
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    pushing.store(false, Ordering::Relaxed);
    let sims = pusher.await.expect("pusher");
    let sent: Vec<i64> = sims.iter().map(|w| w.seq).collect();

    let now = get(&ports, "/controller/cluster").await;
    assert_eq!(now["role"], "leader", "{now}");
    assert_ne!(now["me"], first_me, "the standby leads now: {now}");
    assert_eq!(now["followed"]["in_sync"], true, "{now}");
    assert_eq!(now["followed"]["gaps"], 0, "{now}");
    assert!(now["epoch"].as_u64() > leader["epoch"].as_u64(), "{now}");

    // What the new leader holds against the workers' truth: everything acknowledged before
    // the kill, exactly; of the admits pushed across the failover, those that reached the dead
    // leader's socket buffers but not NATS are lost (reported, not hidden).
    let stats = get(&ports, "/controller/key-stats").await;
    assert_eq!(instance_keys(&stats, "inst-A"), 40, "{stats}");
    let mut held = 0;
    for i in 0..SIMS {
        let n = instance_keys(&stats, &format!("sim-{i}"));
        assert!(
            n >= BEFORE as u64,
            "sim-{i} lost pre-failover admits: {stats} (sent {:?})\n{}",
            sent,
            second.log()
        );
        held += n - BEFORE as u64;
    }
    let pushed = pushed.load(Ordering::Relaxed);
    eprintln!(
        "failover: admits pushed across it {pushed}, held by the new leader {held}, lost {}",
        pushed.saturating_sub(held)
    );

    // No full sync was asked of anyone: the heartbeats go on against the new leader.
    let beats = |s: &Value| s["heartbeats_sent"].as_u64().unwrap_or(0);
    let a0 = beats(&a.call(json!({"cmd": "state"}), SLOW).await);
    let b0 = beats(&b.call(json!({"cmd": "state"}), SLOW).await);
    eventually("both workers heartbeat on", SLOW, async || {
        let (sa, sb) = (
            a.call(json!({"cmd": "state"}), SLOW).await,
            b.call(json!({"cmd": "state"}), SLOW).await,
        );
        beats(&sa) >= a0 + 2 && beats(&sb) >= b0 + 2
    })
    .await;
    for w in [&a, &b] {
        let asked: Vec<&Value> = w
            .events
            .iter()
            .filter(|e| e["event"] == "heartbeat_commands" || e["event"] == "full_sync_started")
            .collect();
        assert!(asked.is_empty(), "{}: {asked:?}", w.name);
    }
    assert!(
        !second.log().contains("full sync started"),
        "{}",
        second.log()
    );

    // The real workers' own paths work against the new leader: B's P2P lookup finds A, the
    // downlink to A answers, and A's new admits are applied.
    let found = b
        .call(json!({"cmd": "lookup", "hashes": [1, 2, 3, 999]}), SLOW)
        .await;
    assert_eq!(
        found["layout_info"],
        json!([["inst-A", CPU, 3, peer_a]]),
        "{found}"
    );
    let (status, health) = http(
        loopback(ports.http),
        "POST",
        "/health",
        Some(r#"{"instance_id": "inst-A"}"#),
        &[],
    )
    .await;
    assert_eq!(
        (status, &health["error_codes"]),
        (200, &json!({"0": 0})),
        "{health}"
    );
    a.call(json!({"cmd": "admit", "keys": [41, 42]}), SLOW)
        .await;
    until(&ports, "/controller/key-stats", "A's new admits", |v| {
        instance_keys(v, "inst-A") == 42
    })
    .await;

    a.close().await;
    b.close().await;
    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_replicas_answer_lookups_as_the_leader_within_the_reported_lag() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let cluster = "replicas";
    let (ports, _leader, _) = leader(&nats, cluster, "leader", &[]).await;
    let replica_ports: Vec<u16> = (0..2).map(|_| free_port()).collect();
    let _replicas: Vec<Controller> = replica_ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            controller_with(
                &nats,
                cluster,
                &ports,
                &format!("replica-{i}"),
                &[
                    ("KVPLANE_SERVE_PORT", &port.to_string()),
                    ("KVPLANE_SERVE_REPLICA", "true"),
                ],
            )
        })
        .collect();

    // A fleet of four workers, 1,000 admits each and a few evicts, while the replicas follow.
    let pull = format!("127.0.0.1:{}", ports.pull);
    let reply = format!("127.0.0.1:{}", ports.reply);
    let mut held = 0;
    for i in 0..4i64 {
        let mut w = TestWorker::at(&reply, &pull, &format!("inst-{i}"), 0);
        let peer = format!("127.0.0.1:{}", 20000 + i);
        w.register(free_port(), Some(&peer)).await;
        for chunk in (0..1000i64).collect::<Vec<_>>().chunks(100) {
            let ops: Vec<(bool, i64)> = chunk.iter().map(|&k| (true, (i << 20) | k)).collect();
            let batch = w.batch(CPU, &ops);
            w.push(&[batch]).await;
        }
        let evicts = w.batch(CPU, &[(false, i << 20), (false, (i << 20) | 1)]);
        w.push(&[evicts]).await;
        held += 998;
    }
    let leader_stats = key_stats_at(&ports, held).await;

    // The leader applies before its records reach the stream; a replica's readiness speaks for
    // what the stream holds, so wait for every record to be acknowledged there first.
    until(
        &ports,
        "/controller/cluster",
        "the leader's records are all in the stream",
        |v| v["published"]["pending"] == 0 && v["published"]["acked"].as_u64() > Some(0),
    )
    .await;
    let lookup = json!({"hashes": [2, 3, 4, 5]}).to_string();
    let (_, at_leader) = http(loopback(ports.http), "POST", "/lookup", Some(&lookup), &[]).await;
    for &port in &replica_ports {
        // Readiness comes from the last delivery's count of what remains, so it can be one
        // delivery behind: the index must converge to the leader's, and then say ready.
        let stats = until_on(
            port,
            "/controller/key-stats",
            "the replica holds the leader's index",
            |v| *v == leader_stats,
        )
        .await;
        assert_eq!(stats["total_key_count"], held);
        let ready = until_on(port, "/readyz", "the replica is caught up", |v| {
            v["status"] == "ready"
        })
        .await;
        assert_eq!(ready["replica"]["pending"], 0, "{ready}");
        let workers = until_on(port, "/controller/workers", "replica workers", |_| true).await;
        assert_eq!(workers["total_count"], 4, "{workers}");
        let (status, answer) = http(loopback(port), "POST", "/lookup", Some(&lookup), &[]).await;
        assert_eq!(
            (status, &answer["layout_info"]),
            (200, &at_leader["layout_info"])
        );
        let cluster = until_on(port, "/controller/cluster", "replica status", |_| true).await;
        assert_eq!(cluster["role"], "replica", "{cluster}");
        assert_eq!(cluster["followed"]["in_sync"], true, "{cluster}");
        // Commands need the workers' downlinks: the leader's job.
        let (status, refused) = http(
            loopback(port),
            "POST",
            "/clear",
            Some(r#"{"instance_id": "inst-0", "location": "LocalCPUBackend"}"#),
            &[],
        )
        .await;
        assert_eq!(status, 409, "{refused}");
        assert!(refused.to_string().contains("read replica"), "{refused}");
    }
    assert!(
        at_leader["layout_info"].to_string().contains("inst-0"),
        "{at_leader}"
    );

    // The dashboard of a replica and of the leader name their role in the topbar.
    if crate::support::browser::ready() {
        for (port, page, expect) in [
            (
                replica_ports[0],
                "controller-replica",
                json!({"role": "replica", "badge": ["replica", "replicas", "caught up"]}),
            ),
            (
                ports.http,
                "controller-leader",
                json!({"role": "leader", "badge": ["leader", "epoch"]}),
            ),
        ] {
            let mut expect = expect;
            expect["title"] = json!("controller");
            expect["rows"] = json!(4);
            let shot = crate::support::browser::screenshot(&format!("dashboard-{page}.png"));
            let report = crate::support::browser::run(
                "services.mjs",
                &[
                    format!("http://127.0.0.1:{port}").into(),
                    "controller-cluster".into(),
                    shot.clone().into(),
                    expect.to_string().into(),
                ],
                Duration::from_secs(90),
            )
            .await;
            assert_eq!(report["ok"], true, "{report}");
        }
    }

    // A deregistration reaches the replicas too.
    let mut w = TestWorker::at(&reply, &pull, "inst-3", 0);
    w.push(&[Msg::DeRegisterMsg(kvplane::protocol::DeRegisterMsg {
        instance_id: "inst-3".into(),
        worker_id: 0,
        ip: "127.0.0.1".into(),
        port: 1,
    })])
    .await;
    for &port in &replica_ports {
        until_on(
            port,
            "/controller/key-stats",
            "the deregistration replicated",
            |v| v["total_worker_count"] == 3 && v["total_key_count"] == held - 998,
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_follower_restores_a_snapshot_after_the_log_dropped_its_start() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let cluster = "snapshots";
    // A 1 MiB log: the first records are dropped once ~1 MiB more follows them.
    let small: &[(&str, &str)] = &[
        ("KVPLANE_SERVE_CLUSTER_MAX_BYTES", "1048576"),
        ("KVPLANE_SERVE_CLUSTER_SNAPSHOT_RECORDS", "100"),
    ];
    let (ports, _leader, _) = leader(&nats, cluster, "leader", small).await;
    let replica = |name: &str, port: u16| {
        controller_with(
            &nats,
            cluster,
            &ports,
            name,
            &[
                ("KVPLANE_SERVE_PORT", &port.to_string()),
                ("KVPLANE_SERVE_REPLICA", "true"),
                ("KVPLANE_SERVE_CLUSTER_MAX_BYTES", "1048576"),
                ("KVPLANE_SERVE_CLUSTER_SNAPSHOT_RECORDS", "100"),
            ],
        )
    };
    let early_port = free_port();
    let _early = replica("early", early_port);
    until_on(early_port, "/readyz", "the early replica follows", |v| {
        v["status"] == "ready"
    })
    .await;

    // Records of ~14 KiB (4 batches of 100 admits per multipart, LMCache's map encoding): the
    // 1 MiB log keeps about the last 70.
    let pull = format!("127.0.0.1:{}", ports.pull);
    let reply = format!("127.0.0.1:{}", ports.reply);
    let mut w = TestWorker::at(&reply, &pull, "inst-0", 0);
    w.register(free_port(), None).await;
    let mut next = 0i64;
    let mut push = |w: &mut TestWorker, records: usize| {
        let mut sends = Vec::new();
        for _ in 0..records {
            let batches: Vec<Msg> = (0..4)
                .map(|_| {
                    let ops: Vec<(bool, i64)> = (next..next + 100).map(|k| (true, k)).collect();
                    next += 100;
                    w.batch(CPU, &ops)
                })
                .collect();
            sends.push(batches);
        }
        sends
    };
    for batches in push(&mut w, 110) {
        w.push(&batches).await;
    }
    let early = until_on(
        early_port,
        "/controller/cluster",
        "a snapshot published",
        |v| v["followed"]["snapshots_published"].as_u64() >= Some(1),
    )
    .await;
    assert_eq!(early["followed"]["in_sync"], true, "{early}");
    for batches in push(&mut w, 30) {
        w.push(&batches).await;
    }
    let held = 140 * 400;
    let leader_stats = key_stats_at(&ports, held).await;

    // A replica starting now cannot read the log from its start any more: it restores the
    // snapshot and reads on from there, in sync, holding what the leader holds.
    let late_port = free_port();
    let late = replica("late", late_port);
    let ready = eventually("the late replica ready", SLOW, async || {
        match try_http(loopback(late_port), "GET", "/readyz", None, &[]).await {
            Ok((200, v)) => Ok(v),
            probe => Err(format!("{probe:?}\n{}", late.tail(20))),
        }
    })
    .await;
    assert_eq!(ready["replica"]["pending"], 0, "{ready}");
    late.wait_for_line("restored a snapshot").await;
    let stats = until_on(late_port, "/controller/key-stats", "late stats", |_| true).await;
    assert_eq!(stats, leader_stats);
    let status = until_on(late_port, "/controller/cluster", "late status", |_| true).await;
    assert_eq!(status["followed"]["in_sync"], true, "{status}");
    assert_eq!(status["followed"]["gaps"], 0, "{status}");
    assert!(
        status["followed"]["applied"].as_u64() < Some(60),
        "it applied only the records after the snapshot: {status}"
    );
    // Without the snapshot it could not be in sync: the log no longer starts at record 1.
    let client = async_nats::connect(nats.url.as_str()).await.expect("nats");
    let mut log = async_nats::jetstream::new(client)
        .get_stream(format!("KVPLANE_{cluster}_controller"))
        .await
        .expect("the controller's log");
    let first = log.info().await.expect("stream info").state.first_sequence;
    assert!(first > 1, "the log kept its start (first sequence {first})");
    assert!(
        first <= 101,
        "the log lost records after the snapshot (first {first})"
    );
}
