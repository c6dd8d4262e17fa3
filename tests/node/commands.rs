//! The controller's commands on `kvplane node`, driven through a real `kvplane serve` over
//! 127.0.0.1: `/pin` holds a token prefix's objects through L1 and L2 pressure (L2's pins
//! survive a restart) until the node's `POST /unpin`; `/move` takes them L1 → L2, L2 → L1 and
//! to a second node; `/compress` keeps them compressed while GET still returns the bytes that
//! were PUT (also from L2 after a restart), `/decompress` restores them; `/check_finish`
//! reports every command.

use crate::support::http::http;
use crate::support::node::*;
use crate::support::{eventually, server, STEP};
use kvplane::controller::Server;
use kvplane::node::NodeServer;
use kvplane::protocol::token_hash::chunk_hashes;
use kvplane::protocol::ChunkHash;
use serde_json::{json, Value};
use std::path::Path;

const CPU: &str = "LocalCPUBackend";
const DISK: &str = "LocalDiskBackend";
const CHUNK: usize = 4;

/// Twelve tokens: three chunks of four.
fn tokens() -> Vec<i64> {
    (1..=12).collect()
}

/// The node keys of the chunks of `tokens` for TP rank `rank` of `world`, as an LMCache
/// worker names them (`f"{hash:x}"` of the builtin-hash chain).
fn chunk_keys(tokens: &[i64], world: u32, rank: u32) -> Vec<String> {
    chunk_hashes(tokens, CHUNK, ChunkHash::from_i64(0))
        .into_iter()
        .map(|c| {
            let h = c.hash.as_i128();
            let hex = if h < 0 {
                format!("-{:x}", -h)
            } else {
                format!("{h:x}")
            };
            format!("m@{world}@{rank}@{hex}@bfloat16")
        })
        .collect()
}

/// A node reporting to `server` as `instance` (chunk size 4, L2 under `dir`).
async fn node_at(
    server: &Server,
    instance: &str,
    dir: &Path,
    l1: u64,
    l2_budget: u64,
) -> NodeServer {
    controller_node(server, instance, |c| {
        c.chunk_size = CHUNK;
        c.l1.budget = l1;
        c.l2 = Some(plain_l2(dir, l2_budget));
    })
    .await
}

async fn post(addr: std::net::SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    http(
        addr,
        "POST",
        path,
        Some(&body.to_string()),
        &[("content-type", "application/json")],
    )
    .await
}

/// Runs a controller command, expects 200 and `num_tokens`, and checks `/check_finish`
/// reports it finished with the same answer.
async fn command(server: &Server, path: &str, body: Value, num_tokens: i64) -> Value {
    let (status, answer) = post(server.addrs.http, path, &body).await;
    assert_eq!(status, 200, "{path}: {answer}");
    assert_eq!(answer["num_tokens"], num_tokens, "{path}: {answer}");
    let event_id = answer["event_id"].as_str().expect("event_id").to_owned();
    let (status, finish) = post(
        server.addrs.http,
        "/check_finish",
        &json!({"event_id": event_id}),
    )
    .await;
    assert_eq!(status, 200, "{finish}");
    assert_eq!(finish["status"], "finished", "{finish}");
    assert_eq!(finish["result"]["num_tokens"], num_tokens, "{finish}");
    answer
}

async fn put_all(node: &NodeServer, keys: &[String], len: usize) {
    let mut client = Client::connect(node).await;
    for (i, k) in keys.iter().enumerate() {
        client.put(k, &body(i as u64 + 1, len)).await;
    }
    client.health().await;
    node.flush().await;
}

async fn get(node: &NodeServer, key: &str) -> Option<Vec<u8>> {
    let mut client = Client::connect(node).await;
    client.get(key).await.map(|(_, b)| b)
}

fn filler(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("m@1@0@f{i:04x}@bfloat16")).collect()
}

#[tokio::test]
async fn pins_hold_through_pressure_and_restart_until_released() {
    let server = server().await;
    let dir = tempdir("pin");
    let keys = chunk_keys(&tokens(), 1, 0);
    // L1 and L2 each hold about ten 1000-byte objects.
    let node = node_at(&server, "node-a", &dir, 10_000, 12_000).await;
    put_all(&node, &keys, 1000).await;

    command(
        &server,
        "/pin",
        json!({"instance_id": "node-a", "location": CPU, "tokens": tokens()}),
        12,
    )
    .await;
    // A prefix that stops at the second chunk pins what it names: 8 tokens.
    let mut gap = tokens();
    gap[9] = 999;
    command(
        &server,
        "/pin",
        json!({"instance_id": "node-a", "location": DISK, "tokens": gap}),
        8,
    )
    .await;
    command(
        &server,
        "/pin",
        json!({"instance_id": "node-a", "location": DISK, "tokens": tokens()}),
        12,
    )
    .await;

    // Thirty more objects churn both tiers: the pinned ones stay in each.
    put_all(&node, &filler(30), 1000).await;
    for k in &keys {
        assert!(node.in_l1(k), "{k} pinned in L1");
    }
    let http_addr = node.addrs.http.expect("http");
    let (_, pins) = http(http_addr, "GET", "/pins", None, &[]).await;
    assert_eq!(pins[CPU]["count"], 3, "{pins}");
    assert_eq!(pins[DISK]["count"], 3, "{pins}");
    let metrics = scrape(&node).await;
    assert_eq!(
        sample(&metrics, "kvplane_node_pinned_objects{tier=\"l2\"}"),
        3.0
    );
    assert_eq!(
        sample(
            &metrics,
            "kvplane_node_controller_commands_total{command=\"pin\",outcome=\"ok\"}"
        ),
        3.0
    );
    // The dashboard's feed shows the pins per tier and the commands run.
    let (_, feed) = http(http_addr, "GET", "/api/dashboard", None, &[]).await;
    assert_eq!(
        (&feed["l1"]["pinned"], &feed["l2"]["pinned"]),
        (&json!(3), &json!(3)),
        "{feed}"
    );
    assert!(
        feed["commands"]
            .as_array()
            .is_some_and(|c| c.contains(&json!({"command": "pin", "ok": 3, "error": 0}))),
        "{feed}"
    );

    // L2's pins survive a restart (L1's, memory, do not).
    node.stop().await;
    let node = node_at(&server, "node-a", &dir, 10_000, 12_000).await;
    let http_addr = node.addrs.http.expect("http");
    let (_, pins) = http(http_addr, "GET", "/pins", None, &[]).await;
    assert_eq!(pins[DISK]["count"], 3, "{pins}");
    assert_eq!(pins[CPU]["count"], 0, "{pins}");
    put_all(&node, &filler(30), 1000).await;
    for k in &keys {
        assert_eq!(
            get(&node, k).await.as_deref(),
            Some(&body(keys.iter().position(|x| x == k).unwrap() as u64 + 1, 1000)[..]),
            "{k} served from pinned L2"
        );
    }

    // Released, they are evicted like any other.
    let (status, released) = post(http_addr, "/unpin", &json!({"location": DISK})).await;
    assert_eq!(status, 200, "{released}");
    assert_eq!(released["released"], 3, "{released}");
    let (status, _) = post(http_addr, "/unpin", &json!({"location": "GPU"})).await;
    assert_eq!(status, 400);
    put_all(&node, &filler(60), 1000).await;
    eventually("released objects evicted from L2", STEP, async || {
        node.usage().l2_objects <= 12
    })
    .await;
    let mut client = Client::connect(&node).await;
    let mut left = 0;
    for k in &keys {
        left += usize::from(client.exists(k).await);
    }
    assert_eq!(left, 0, "released objects are evicted like any other");
    node.stop().await;
}

#[tokio::test]
async fn moves_between_tiers_and_to_another_node() {
    let server = server().await;
    let (dir_a, dir_b) = (tempdir("move-a"), tempdir("move-b"));
    let keys = chunk_keys(&tokens(), 1, 0);
    let a = node_at(&server, "node-a", &dir_a, 1 << 20, 1 << 20).await;
    let b = node_at(&server, "node-b", &dir_b, 1 << 20, 1 << 20).await;
    put_all(&a, &keys, 2000).await;

    // Clear L2, then move L1 → L2 without a copy: the objects leave L1 for L2.
    command(
        &server,
        "/clear",
        json!({"instance_id": "node-a", "location": DISK}),
        3 * 8,
    )
    .await;
    assert_eq!(a.usage().l2_objects, 0);
    command(
        &server,
        "/move",
        json!({"old_position": ["node-a", CPU], "new_position": ["node-a", DISK],
               "tokens": tokens(), "should_copy": false}),
        12,
    )
    .await;
    let u = a.usage();
    assert_eq!((u.l1_objects, u.l2_objects), (0, 3), "{u:?}");

    // L2 → L1 with a copy: both tiers hold them.
    command(
        &server,
        "/move",
        json!({"old_position": ["node-a", DISK], "new_position": ["node-a", CPU],
               "tokens": tokens(), "should_copy": true}),
        12,
    )
    .await;
    for k in &keys {
        assert!(a.in_l1(k), "{k} back in L1");
    }
    assert_eq!(a.usage().l2_objects, 3);

    // To node B (its peer_init_url is its lm:// address), without a copy.
    command(
        &server,
        "/move",
        json!({"old_position": ["node-a", CPU], "new_position": ["node-b", CPU],
               "tokens": tokens(), "should_copy": false}),
        12,
    )
    .await;
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(
            get(&b, k).await.as_deref(),
            Some(&body(i as u64 + 1, 2000)[..]),
            "{k} on node B"
        );
        assert!(!a.in_l1(k), "{k} left node A's L1");
    }
    // The controller sees node B hold them.
    b.flush().await;
    b.flush_reports(STEP).await;
    let hashes: Vec<i128> = chunk_hashes(&tokens(), CHUNK, ChunkHash::from_i64(0))
        .iter()
        .map(|c| c.hash.as_i128())
        .collect();
    eventually("node B reported", STEP, async || {
        let held = server.shared.index().keys_of("node-b", 0, CPU);
        hashes
            .iter()
            .all(|h| held.iter().any(|x| x.as_i128() == *h))
    })
    .await;

    // A move the node cannot do fails, and /check_finish says so.
    let (status, failed) = post(
        server.addrs.http,
        "/move",
        &json!({"old_position": ["node-a", DISK], "new_position": ["node-a", DISK],
                "tokens": tokens()}),
    )
    .await;
    assert_eq!(status, 502, "{failed}");
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn compressed_objects_read_back_identical_from_both_tiers() {
    let server = server().await;
    let dir = tempdir("compress");
    let keys = chunk_keys(&tokens(), 1, 0);
    let node = node_at(&server, "node-a", &dir, 1 << 20, 1 << 20).await;
    // Compressible bodies: a repeating 64-byte pattern.
    let data: Vec<Vec<u8>> = (0..3u8)
        .map(|i| (0..64u8).map(|b| b ^ i).cycle().take(8192).collect())
        .collect();
    let mut client = Client::connect(&node).await;
    for (k, d) in keys.iter().zip(&data) {
        client.put(k, d).await;
    }
    client.health().await;
    node.flush().await;
    let before = node.usage();

    let (status, refused) = post(
        server.addrs.http,
        "/compress",
        &json!({"instance_id": "node-a", "method": "cachegen", "location": CPU,
                "tokens": tokens()}),
    )
    .await;
    assert_eq!(status, 502, "unsupported method: {refused}");
    for loc in [CPU, DISK] {
        command(
            &server,
            "/compress",
            json!({"instance_id": "node-a", "method": "lz4", "location": loc,
                   "tokens": tokens()}),
            12,
        )
        .await;
    }
    let after = node.usage();
    assert!(
        after.l1_bytes * 4 < before.l1_bytes && after.l2_bytes * 2 < before.l2_bytes,
        "{before:?} → {after:?}"
    );
    for (k, d) in keys.iter().zip(&data) {
        assert_eq!(get(&node, k).await.as_deref(), Some(&d[..]), "{k} from L1");
    }

    // From L2 after a restart: the file says how its body is encoded.
    node.stop().await;
    let node = node_at(&server, "node-a", &dir, 1 << 20, 1 << 20).await;
    assert!(node.usage().l2_bytes * 2 < before.l2_bytes);
    for (k, d) in keys.iter().zip(&data) {
        assert_eq!(get(&node, k).await.as_deref(), Some(&d[..]), "{k} from L2");
    }

    // Decompress (no tokens: every object of the tier) restores the stored size.
    command(
        &server,
        "/decompress",
        json!({"instance_id": "node-a", "method": "lz4", "location": DISK}),
        3 * 8,
    )
    .await;
    assert_eq!(node.usage().l2_bytes, before.l2_bytes);
    for (k, d) in keys.iter().zip(&data) {
        assert_eq!(
            get(&node, k).await.as_deref(),
            Some(&d[..]),
            "{k} decompressed"
        );
    }
    node.stop().await;
}

/// An engine's worker of TP rank `rank` (instance "engine"), registered.
async fn engine_worker(server: &Server, rank: i64) -> kvplane::worker::WorkerHandle {
    let port = |a: Option<std::net::SocketAddr>| a.expect("zmq socket").port();
    let w = crate::support::worker_config(
        port(server.addrs.pull),
        port(server.addrs.reply),
        "engine",
        rank,
    );
    let handle = crate::support::within(
        "engine worker",
        kvplane::worker::Worker::start(
            w,
            kvplane::worker::NoCommands,
            kvplane::worker::MemoryKeys::new(),
        ),
    )
    .await
    .expect("engine worker starts");
    handle.wait_ready(STEP).await.expect("engine registers");
    handle
}

#[tokio::test]
async fn each_tp_rank_registers_as_its_own_worker() {
    let server = server().await;
    let dir = tempdir("ranks");
    let node = node_at(&server, "node-a", &dir, 1 << 20, 1 << 20).await;
    // Rank 0 holds the chain of 1..=12, rank 1 the chain of 101..=112 (and both the first).
    let other: Vec<i64> = (101..=112).collect();
    let rank0 = chunk_keys(&tokens(), 2, 0);
    let rank1 = chunk_keys(&other, 2, 1);
    let mut all = rank0.clone();
    all.extend(rank1.iter().cloned());
    put_all(&node, &all, 500).await;
    eventually("a worker per rank", STEP, async || {
        node.controller_ranks() == vec![0, 1]
    })
    .await;
    node.controller_ready(STEP).await.expect("both ranks ready");
    node.flush_reports(STEP).await;
    let hashes = |t: &[i64]| -> Vec<ChunkHash> {
        chunk_hashes(t, CHUNK, ChunkHash::from_i64(0))
            .iter()
            .map(|c| c.hash)
            .collect()
    };
    let (h0, h1) = (hashes(&tokens()), hashes(&other));
    eventually("each rank's keys under its worker", STEP, async || {
        let held = |w| server.shared.index().keys_of("node-a", w, CPU);
        held(0).len() == 3 && held(1).len() == 3 && held(1).contains(&h1[0])
    })
    .await;

    // A P2P lookup from each engine rank finds the node (LMCache 0.5.6's controller, which
    // kvplane's follows, ignores the requester's rank; the index above keeps ranks apart).
    let (e0, e1) = (
        engine_worker(&server, 0).await,
        engine_worker(&server, 1).await,
    );
    let lookup = |w: &kvplane::worker::WorkerHandle, h: Vec<ChunkHash>| {
        let w = w.clone();
        async move {
            crate::support::within("p2p lookup", w.p2p_lookup(&h))
                .await
                .expect("answered")
        }
    };
    let hit = lookup(&e1, h1.clone()).await.expect("rank 1 finds rank 1");
    assert_eq!(
        (hit.instance_id.as_str(), hit.num_hit_chunks),
        ("node-a", 3)
    );
    assert_eq!(hit.peer_init_url, node.addrs.lm.to_string());
    let hit = lookup(&e0, h0.clone()).await.expect("rank 0 finds rank 0");
    assert_eq!(hit.num_hit_chunks, 3);

    // Commands go rank by rank: a pin of rank 0's chain pins rank 0's keys only.
    let answer = command(
        &server,
        "/pin",
        json!({"instance_id": "node-a", "location": CPU, "tokens": tokens()}),
        0,
    )
    .await;
    assert_eq!(answer["num_tokens_by_worker"]["0"], 12, "{answer}");
    assert_eq!(answer["num_tokens_by_worker"]["1"], 0, "{answer}");
    let (_, pins) = http(node.addrs.http.expect("http"), "GET", "/pins", None, &[]).await;
    assert_eq!(pins[CPU]["count"], 3, "{pins}");

    for w in [e0, e1] {
        w.shutdown().await.expect("engine stops");
    }
    node.stop().await;
    // A restarted node registers the ranks its recovered L2 names at once.
    let node = node_at(&server, "node-a", &dir, 1 << 20, 1 << 20).await;
    assert_eq!(node.controller_ranks(), vec![0, 1]);
    node.stop().await;
    // Declared ranks register before any key names them.
    let node = controller_node(&server, "node-d", |c| c.tp_ranks = 4).await;
    assert_eq!(node.controller_ranks(), vec![0, 1, 2, 3]);
    node.controller_ready(STEP).await.expect("all four ready");
    node.stop().await;
}
