//! Coordinator leader (docs/CLUSTER.md, "Coordinator leader"): a real `nats-server`, two
//! `kvplane coordinator --cluster` processes on the same port (the standby binds nothing until
//! it holds the lease) and a fake MP server. The leader takes registrations, heartbeats, usage
//! events of both bodies, quotas, pins and a startup resync, and dispatches evictions; SIGKILL
//! it: the standby serves the same membership, usage, quotas and pins on the same port without
//! a resync, and only the process holding the lease ever dispatched an eviction.

use crate::support::http::{http, until_json};
use crate::support::nats::{Member, Nats};
use crate::support::{eventually, free_port, loopback, SLOW};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::routing::delete;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a process logs when one of its eviction dispatches fails (the fake server refuses
/// them all): the process dispatched.
const DISPATCHED: &str = "eviction dispatch failed";

/// A `kvplane coordinator --cluster` process.
type Coordinator = Member;

/// A member of `cluster` on `port` named `name`, `env` on top of the test settings.
fn coordinator_with(
    nats: &Nats,
    cluster: &str,
    port: u16,
    name: &str,
    env: &[(&str, &str)],
) -> Coordinator {
    let port = port.to_string();
    let mut all = vec![
        ("KVPLANE_COORDINATOR_HOST", "127.0.0.1"),
        ("KVPLANE_COORDINATOR_PORT", port.as_str()),
        ("KVPLANE_COORDINATOR_EVICTION_CHECK_INTERVAL", "0.2"),
        ("KVPLANE_COORDINATOR_INSTANCE_TIMEOUT", "600"),
        ("KVPLANE_COORDINATOR_RESYNC_POLL_INTERVAL", "0.1"),
    ];
    all.extend_from_slice(env);
    nats.member("coordinator", cluster, name, &all)
}

/// NATS (`None` when the cluster tests are skipped: [`Nats::start`]), a fake MP server, and a
/// free port for the coordinators.
async fn nats_mp_port() -> Option<(Nats, SocketAddr, Arc<FakeMp>, u16)> {
    let nats = Nats::start().await?;
    let (mp, fake) = fake_mp().await;
    Some((nats, mp, fake, free_port()))
}

/// Two members of `cluster` on `port`, started one after the other: the first (named
/// `names[0]`) once it leads, with its `/coordinator/cluster` status, and the second once it
/// waits for the lease.
async fn leader_and_standby(
    nats: &Nats,
    cluster: &str,
    port: u16,
    names: [&str; 2],
    env: &[(&str, &str)],
) -> (Coordinator, Value, Coordinator) {
    let first = coordinator_with(nats, cluster, port, names[0], env);
    let status = until(
        port,
        "/coordinator/cluster",
        "the first member leads",
        |v| v["role"] == "leader",
    )
    .await;
    let second = coordinator_with(nats, cluster, port, names[1], env);
    second.wait_for_line("waiting for the lease").await;
    (first, status, second)
}

/// A fake MP server: refuses every eviction (`DELETE /cache/objects` answers 500, so the
/// dispatching process logs it) and lists one L2 page for the startup resync; counts both.
#[derive(Default)]
struct FakeMp {
    deletes: AtomicU64,
    lists: AtomicU64,
}

fn key(hash: &str, salt: &str) -> Value {
    json!({"chunk_hash_hex": hash, "model_name": "m", "kv_rank": 0, "cache_salt": salt})
}

async fn fake_mp() -> (SocketAddr, Arc<FakeMp>) {
    let state = Arc::new(FakeMp::default());
    let app = Router::new()
        .route(
            "/cache/objects",
            delete(|State(s): State<Arc<FakeMp>>| async move {
                s.deletes.fetch_add(1, Ordering::Relaxed);
                (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({"detail": "refused"})))
            })
            .get(
                |State(s): State<Arc<FakeMp>>, Query(_): Query<BTreeMap<String, String>>| async move {
                    s.lists.fetch_add(1, Ordering::Relaxed);
                    Json(json!({"entries": [
                        {"key": key("5e", "seeded"), "size_bytes": 300},
                        {"key": key("5f", "seeded"), "size_bytes": 400}],
                        "next_page_token": null}))
                },
            ),
        )
        .with_state(Arc::clone(&state));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, state)
}

async fn call(port: u16, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let body = body.map(|b| b.to_string());
    http(loopback(port), method, path, body.as_deref(), &[]).await
}

async fn ok(port: u16, method: &str, path: &str, body: Value) -> Value {
    let (status, v) = call(port, method, path, Some(body)).await;
    assert!(
        (200..300).contains(&status),
        "{method} {path}: {status} {v}"
    );
    v
}

/// `PUT /quota/config` with no default limit: salts without a quota of their own are exempt.
async fn no_default_quota(port: u16) {
    ok(
        port,
        "PUT",
        "/quota/config",
        json!({"default_limit_gb": null}),
    )
    .await;
}

/// Polls `path` until `cond` holds on its JSON (connection errors count as not yet).
async fn until(port: u16, path: &str, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    until_json(loopback(port), path, what, SLOW, cond).await
}

async fn until_count(what: &str, counter: &AtomicU64, above: u64) {
    eventually(what, SLOW, async || counter.load(Ordering::Relaxed) > above).await;
}

/// Everything the routes show of the state.
async fn state_of(port: u16) -> Value {
    let mut out = json!({});
    for path in [
        "/instances",
        "/instances/usage",
        "/quota",
        "/quota/config",
        "/quota/kept",
        "/cache/pins",
        "/instances/mp-1/usage",
    ] {
        let (status, v) = call(port, "GET", path, None).await;
        assert_eq!(status, 200, "{path}: {v}");
        out[path] = v;
    }
    out
}

fn store(hashes: &[&str], salt: &str, size: u64) -> Vec<Value> {
    hashes
        .iter()
        .map(|h| json!({"key": key(h, salt), "size_bytes": size}))
        .collect()
}

fn wire_batch(seq: u64, event: &str, tier: &str, backend: &str, entries: Vec<Value>) -> Value {
    json!({"instance_id": "mp-1", "incarnation": 7, "seq": seq, "event_type": event,
           "tier": tier, "backend": backend, "entries": entries})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_takes_over_with_the_leaders_usage_and_only_the_leader_evicts() {
    let Some((nats, mp, fake, port)) = nats_mp_port().await else {
        return;
    };
    let (mut first, leader, second) =
        leader_and_standby(&nats, "coord", port, ["first", "second"], &[]).await;

    // The first leader started a new cluster: its startup resync lists the first server.
    let mp_reg = |id: Option<&str>| {
        let mut r = json!({"ip": "127.0.0.1", "http_port": mp.port(), "metadata": {"zone": "a"}});
        if let Some(id) = id {
            r["instance_id"] = json!(id);
        }
        r
    };
    ok(port, "POST", "/instances", mp_reg(Some("mp-1"))).await;
    first.wait_for_line("startup resync done").await;
    assert_eq!(fake.lists.load(Ordering::Relaxed), 1);
    let generated = ok(port, "POST", "/instances", mp_reg(None)).await;
    assert!(generated["instance_id"]
        .as_str()
        .is_some_and(|id| id.starts_with("mp-")));
    ok(port, "POST", "/instances", mp_reg(Some("mp-3"))).await;
    let (status, _) = call(port, "DELETE", "/instances/mp-3", None).await;
    assert_eq!(status, 204);
    ok(port, "PUT", "/instances/mp-1/heartbeat", json!({})).await;

    // Quotas: salts without one are exempt; "kept" has room; "hot" is evicted every cycle.
    no_default_quota(port).await;
    ok(port, "PUT", "/quota/kept", json!({"limit_gb": 10})).await;
    ok(port, "PUT", "/quota/hot", json!({"limit_gb": 0})).await;
    // Usage events of both bodies: a capacity declaration, L2 and L1 stores, then a legacy
    // store, lookup and delete (the documented form's shared L2: its delete of "a3" leaves
    // mp-1's private copy in "fs", as copies are per holder).
    let mut declare = wire_batch(1, "config", "l2", "fs", Vec::new());
    declare["capacity_bytes"] = json!(1u64 << 30);
    declare["capacity_revision"] = json!(1);
    let batches = json!({"batches": [
        declare,
        wire_batch(2, "store", "l2", "fs", store(&["a1", "a2", "a3"], "kept", 1000)),
        wire_batch(3, "store", "l1", "dram", store(&["a1", "a2"], "kept", 64)),
        wire_batch(4, "store", "l2", "fs", store(&["b1", "b2"], "hot", 2000)),
    ]});
    let got = ok(port, "POST", "/events", batches).await;
    assert_eq!(got["applied"], 4, "{got}");
    let legacy = json!({"instance_id": "mp-legacy", "seq": 1, "events": [
        {"type": "store", "key": key("c1", "kept"), "bytes": 500},
        {"type": "lookup", "key": key("a1", "kept"), "bytes": 0},
        {"type": "delete", "key": key("a3", "kept"), "bytes": 0}]});
    ok(port, "POST", "/quota/events", legacy).await;
    let tokens: Vec<u32> = (0..512).collect();
    let pin =
        json!({"model_name": "m", "world_size": 1, "token_ids": tokens, "cache_salt": "kept"});
    ok(port, "POST", "/cache/pins", pin).await;

    // The leader dispatches "hot"'s keys; the standby never does.
    until_count("the leader dispatches", &fake.deletes, 0).await;
    first.wait_for_line(DISPATCHED).await;
    // Everything the leader applied is in NATS before it dies.
    until(port, "/coordinator/cluster", "changes replicated", |v| {
        let p = &v["published"];
        p["queued"].as_u64() > Some(0) && p["pending"] == 0 && p["failed"] == 0
    })
    .await;
    let before = state_of(port).await;
    assert_eq!(
        before["/quota/kept"]["usage_gb"]
            .as_f64()
            .map(|g| (g * 1073741824.0).round()),
        Some(3500.0),
        "{before}"
    );
    assert_eq!(before["/cache/pins"]["total"], 2, "{before}");
    assert_eq!(
        before["/instances"]["instances"].as_array().map(Vec::len),
        Some(2),
        "{before}"
    );
    assert!(!second.log().contains(DISPATCHED), "{}", second.log());

    first.kill().await;
    let deletes_at_kill = fake.deletes.load(Ordering::Relaxed);
    let now = until(port, "/coordinator/cluster", "the standby leads", |v| {
        v["role"] == "leader" && v["me"] != leader["me"]
    })
    .await;
    assert!(now["epoch"].as_u64() > leader["epoch"].as_u64(), "{now}");
    assert_eq!(now["followed"]["in_sync"], true, "{now}");
    assert_eq!(now["followed"]["gaps"], 0, "{now}");
    assert_eq!(now["resynced_at_takeover"], false, "{now}");
    assert!(now["last_failover"]["at"].as_f64().is_some(), "{now}");

    // The same membership (registration times and the generated id included), usage per
    // salt, instance and compartment, quotas and pins.
    let after = state_of(port).await;
    assert_eq!(after, before);
    // No resync: the followed state was complete.
    second.wait_for_line("startup resync skipped").await;
    assert_eq!(fake.lists.load(Ordering::Relaxed), 1);
    // It dispatches now, and new events and heartbeats apply to the state it took over.
    until_count("the new leader dispatches", &fake.deletes, deletes_at_kill).await;
    second.wait_for_line(DISPATCHED).await;
    let more =
        json!({"batches": [wire_batch(5, "store", "l2", "fs", store(&["a4"], "kept", 1000))]});
    let got = ok(port, "POST", "/events", more).await;
    assert_eq!(got["applied"], 1, "{got}");
    let (_, kept) = call(port, "GET", "/quota/kept", None).await;
    assert_eq!(
        kept["usage_gb"]
            .as_f64()
            .map(|g| (g * 1073741824.0).round()),
        Some(4500.0),
        "{kept}"
    );
    ok(port, "PUT", "/instances/mp-1/heartbeat", json!({})).await;
    let (_, metrics) = call(port, "GET", "/metrics", None).await;
    let text = metrics.as_str().unwrap_or_default();
    assert!(
        text.contains("kvplane_cluster_leader{service=\"coordinator\"} 1"),
        "{text}"
    );
    let (_, dash) = call(port, "GET", "/api/dashboard", None).await;
    assert_eq!(dash["cluster"]["role"], "leader", "{dash}");
}

/// A leader paused past its lease (SIGSTOP: a GC pause, a partition) dispatches nothing once
/// it runs again, and stops; the standby, which took the lease meanwhile, serves once the
/// port is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_resumes_without_dispatching_and_stops() {
    let Some((nats, mp, fake, port)) = nats_mp_port().await else {
        return;
    };
    let (mut first, _, second) = leader_and_standby(
        &nats,
        "paused",
        port,
        ["paused-first", "paused-second"],
        &[],
    )
    .await;
    let reg = json!({"instance_id": "mp-1", "ip": "127.0.0.1", "http_port": mp.port()});
    ok(port, "POST", "/instances", reg).await;
    no_default_quota(port).await;
    ok(port, "PUT", "/quota/hot", json!({"limit_gb": 0})).await;
    let batches =
        json!({"batches": [wire_batch(1, "store", "l2", "fs", store(&["b1"], "hot", 10))]});
    ok(port, "POST", "/events", batches).await;
    until_count("the leader dispatches", &fake.deletes, 0).await;

    first.signal("STOP");
    let sent = |log: &str| log.matches("status 500").count();
    let sent_before = sent(&first.log());
    // The standby takes the lease; the paused leader still holds the port, so it waits.
    second.wait_for_line("coordinator took the lease").await;
    first.signal("CONT");
    let exit = first.wait_exit(SLOW).await;
    assert!(!exit.success(), "{exit:?}");
    let log = first.log();
    assert!(log.contains("lease was lost"), "{log}");
    // At most the one dispatch already in flight when it was paused completed afterwards.
    assert!(sent(&log) <= sent_before + 1, "{log}");
    // The new leader binds the freed port and dispatches.
    until(port, "/coordinator/cluster", "the standby serves", |v| {
        v["role"] == "leader" && v["followed"]["in_sync"] == true
    })
    .await;
    second.wait_for_line(DISPATCHED).await;
}

/// 64 hex digits: a real chunk hash's length, so each event weighs in the log.
fn long_hash(n: u64) -> String {
    format!("{n:064x}")
}

/// A standby starting after the stream dropped the log's start restores the latest snapshot
/// (published by an earlier standby every 100 records) and reads the log on from it: it is in
/// sync, and once the leader and the earlier standby are killed it takes over with the same
/// membership, usage, quotas and pins, without a resync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_standby_restores_a_snapshot_after_the_log_dropped_its_start() {
    let Some((nats, mp, fake, port)) = nats_mp_port().await else {
        return;
    };
    let cluster = "coordsnap";
    // A 1 MiB log: its first records are dropped once ~1 MiB more follows them.
    let small: &[(&str, &str)] = &[
        ("KVPLANE_COORDINATOR_CLUSTER_MAX_BYTES", "1048576"),
        ("KVPLANE_COORDINATOR_CLUSTER_SNAPSHOT_RECORDS", "100"),
    ];
    let (mut first, leader, mut early) =
        leader_and_standby(&nats, cluster, port, ["snap-first", "snap-early"], small).await;
    let reg = json!({"instance_id": "mp-1", "ip": "127.0.0.1", "http_port": mp.port(),
                     "metadata": {"zone": "a"}});
    ok(port, "POST", "/instances", reg).await;
    first.wait_for_line("startup resync done").await;
    no_default_quota(port).await;
    ok(port, "PUT", "/quota/kept", json!({"limit_gb": 10})).await;
    let tokens: Vec<u32> = (0..512).collect();
    let pin =
        json!({"model_name": "m", "world_size": 1, "token_ids": tokens, "cache_salt": "kept"});
    ok(port, "POST", "/cache/pins", pin).await;
    let mut declare = wire_batch(1, "config", "l2", "fs", Vec::new());
    declare["capacity_bytes"] = json!(1u64 << 30);
    declare["capacity_revision"] = json!(1);
    let l1 = wire_batch(2, "store", "l1", "dram", store(&["a1", "a2"], "kept", 64));
    ok(port, "POST", "/events", json!({"batches": [declare, l1]})).await;

    // Each request: two records (the gate's input, then ~8 KiB of 100 stores).
    let mut seq = 2;
    let mut next = 0u64;
    let mut push = |seq: &mut u64, requests: usize| {
        (0..requests)
            .map(|_| {
                *seq += 1;
                let hashes: Vec<String> = (next..next + 100).map(long_hash).collect();
                next += 100;
                let hashes: Vec<&str> = hashes.iter().map(String::as_str).collect();
                let b = wire_batch(*seq, "store", "l2", "fs", store(&hashes, "kept", 1000));
                json!({"batches": [b]})
            })
            .collect::<Vec<_>>()
    };
    for body in push(&mut seq, 60) {
        ok(port, "POST", "/events", body).await;
    }
    early.wait_for_line("snapshot published").await;
    // An L1 delete after the snapshot: the restored placements must be found by it.
    seq += 1;
    let l1_delete = wire_batch(seq, "delete", "l1", "dram", store(&["a1"], "kept", 0));
    ok(port, "POST", "/events", json!({"batches": [l1_delete]})).await;
    // More records until the stream dropped the log's start (bounded: ~130 requests fill it).
    let client = async_nats::connect(nats.url.as_str()).await.expect("nats");
    let mut stream = async_nats::jetstream::new(client)
        .get_stream(format!("KVPLANE_{cluster}_coordinator"))
        .await
        .expect("the coordinator's log");
    let mut first_seq = 1;
    for _ in 0..40 {
        for body in push(&mut seq, 10) {
            ok(port, "POST", "/events", body).await;
        }
        first_seq = stream
            .info()
            .await
            .expect("stream info")
            .state
            .first_sequence;
        if first_seq > 1 {
            break;
        }
    }
    assert!(first_seq > 1, "the log kept its start");
    until(port, "/coordinator/cluster", "changes replicated", |v| {
        let p = &v["published"];
        p["pending"] == 0 && p["failed"] == 0 && p["dropped"] == 0
    })
    .await;
    let before = state_of(port).await;
    assert!(
        before["/instances/mp-1/usage"].to_string().contains("dram"),
        "{before}"
    );

    // A standby starting now cannot read the log from its start: it restores the snapshot.
    let late = coordinator_with(&nats, cluster, port, "snap-late", small);
    late.wait_for_line("restored a snapshot").await;
    late.wait_for_line("waiting for the lease").await;
    // Only the late standby may take over: kill the early one, then the leader.
    early.kill().await;
    first.kill().await;
    let now = until(
        port,
        "/coordinator/cluster",
        "the late standby leads",
        |v| v["role"] == "leader" && v["me"] != leader["me"],
    )
    .await;
    assert!(now["epoch"].as_u64() > leader["epoch"].as_u64(), "{now}");
    assert_eq!(now["followed"]["in_sync"], true, "{now}\n{}", late.log());
    assert_eq!(now["followed"]["gaps"], 0, "{now}");
    assert_eq!(now["resynced_at_takeover"], false, "{now}");
    assert!(
        now["followed"]["restored_snapshot_at"].as_u64() > Some(0),
        "{now}"
    );
    let after = state_of(port).await;
    assert_eq!(after, before);
    late.wait_for_line("startup resync skipped").await;
    assert_eq!(fake.lists.load(Ordering::Relaxed), 1);
    eprintln!(
        "late standby: the log starts at {first_seq}, the snapshot was at stream sequence {}, \
         {} records applied after it",
        now["followed"]["restored_snapshot_at"], now["followed"]["applied"]
    );
}
