//! `kvplane node` reporting to a real `kvplane serve` controller over 127.0.0.1 (ephemeral
//! ports): objects PUT over `lm://` show in the controller's index and `/lookup` under
//! `LocalCPUBackend` (L1) and `LocalDiskBackend` (L2); deletes and L1 evictions take them
//! out; a restarted node re-reports what it recovered from L2; reports go in batches.

use crate::support::http::http;
use crate::support::node::*;
use crate::support::{eventually, server, worker_config, STEP};
use kvplane::controller::Server;
use kvplane::node::config::{PrefetchPolicy, StorePolicy};
use kvplane::node::NodeServer;
use serde_json::json;
use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

const CPU: &str = "LocalCPUBackend";
const DISK: &str = "LocalDiskBackend";

fn held(server: &Server, instance: &str, location: &str) -> HashSet<u64> {
    server
        .shared
        .index()
        .keys_of(instance, 0, location)
        .into_iter()
        .map(|h| u64::try_from(h.as_i128()).expect("positive test hashes"))
        .collect()
}

fn set(hashes: &[u64]) -> HashSet<u64> {
    hashes.iter().copied().collect()
}

async fn reporting_node(
    server: &Server,
    instance: &str,
    dir: &Path,
    l1_budget: u64,
    tweak: impl FnOnce(&mut kvplane::worker::WorkerConfig),
) -> NodeServer {
    controller_node(server, instance, |c| {
        c.l1.budget = l1_budget;
        c.l2 = Some(plain_l2(dir, 1 << 30));
        if let Some(w) = c.controller.as_mut() {
            tweak(w);
        }
    })
    .await
}

fn key(hash: u64) -> String {
    format!("m@1@0@{hash:x}@bfloat16")
}

#[tokio::test]
async fn the_controller_sees_what_each_tier_holds() {
    let server = server().await;
    let dir = tempdir("report");
    // L1 holds about three 1000-byte objects before its watermark evicts.
    let node = reporting_node(&server, "node-a", &dir, 4000, |_| {}).await;
    let mut client = Client::connect(&node).await;
    for h in [0xa1, 0xa2, 0xa3] {
        client.put(&key(h), &body(h, 1000)).await;
    }
    client.health().await;
    node.flush().await;
    node.flush_reports(STEP).await;
    eventually("L1 and L2 reported", STEP, async || {
        held(&server, "node-a", CPU) == set(&[0xa1, 0xa2, 0xa3])
            && held(&server, "node-a", DISK) == set(&[0xa1, 0xa2, 0xa3])
    })
    .await;

    // `/lookup` by chunk hashes finds the node.
    let (status, found) = http(
        server.addrs.http,
        "POST",
        "/lookup",
        Some(&json!({"hashes": [0xa1, 0xa2, 0xa3]}).to_string()),
        &[("content-type", "application/json")],
    )
    .await;
    assert_eq!(status, 200, "{found}");
    let holders = found["holders"].as_array().expect("holders");
    assert!(
        holders
            .iter()
            .any(|h| h["instance_id"] == "node-a" && h["matched_chunks"] == 3),
        "{found}"
    );

    // A fourth object pushes L1 over its watermark: the least recently used leaves L1 (and
    // the controller's LocalCPUBackend) but stays on disk.
    client.put(&key(0xa4), &body(4, 1000)).await;
    client.health().await;
    node.flush().await;
    node.flush_reports(STEP).await;
    eventually("L1 eviction reported", STEP, async || {
        let cpu = held(&server, "node-a", CPU);
        !cpu.contains(&0xa1)
            && cpu.contains(&0xa4)
            && held(&server, "node-a", DISK) == set(&[0xa1, 0xa2, 0xa3, 0xa4])
    })
    .await;

    // The coordinator's delete route (`tier: all`) removes an object from both tiers, and
    // from the index.
    let http_addr = node.addrs.http.expect("http");
    let (status, _) = http(
        http_addr,
        "DELETE",
        "/cache/objects",
        Some(&json!({"keys": [key(0xa2)], "tier": "all"}).to_string()),
        &[("content-type", "application/json")],
    )
    .await;
    assert_eq!(status, 200);
    node.flush_reports(STEP).await;
    eventually("delete reported", STEP, async || {
        !held(&server, "node-a", CPU).contains(&0xa2)
            && held(&server, "node-a", DISK) == set(&[0xa1, 0xa3, 0xa4])
    })
    .await;
    let status = node.controller_status().expect("reporting");
    assert_eq!(status.ops_rejected, 0);

    // Stopping deregisters: the controller forgets the node's keys.
    drop(client);
    node.stop().await;
    eventually("deregistered", STEP, async || {
        held(&server, "node-a", DISK).is_empty()
    })
    .await;

    // A node restarted on the same L2 reports what it recovered (a full sync at its first
    // registration), and L1 starts empty.
    let node = reporting_node(&server, "node-a", &dir, 4000, |_| {}).await;
    assert_eq!(node.recovery.recovered, 3);
    eventually("recovered L2 re-reported", STEP, async || {
        held(&server, "node-a", DISK) == set(&[0xa1, 0xa3, 0xa4])
            && held(&server, "node-a", CPU).is_empty()
    })
    .await;
    node.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn reports_are_batched_under_load() {
    let server = server().await;
    let dir = tempdir("report-batch");
    // A flush interval far beyond the test: only full batches (and the explicit flush) send.
    let node = reporting_node(&server, "node-b", &dir, 64 << 20, |w| {
        w.flush_interval = Duration::from_secs(3600);
        w.batch_size = 50;
    })
    .await;
    let mut client = Client::connect(&node).await;
    let n: u64 = 400;
    for h in 1..=n {
        client.put(&key(h), &body(h, 64)).await;
    }
    client.health().await;
    node.flush().await;
    node.flush_reports(STEP).await;
    let all: HashSet<u64> = (1..=n).collect();
    eventually("every admit reported", STEP, async || {
        held(&server, "node-b", CPU) == all && held(&server, "node-b", DISK) == all
    })
    .await;
    let s = node.controller_status().expect("reporting");
    let ops = 2 * n;
    assert!(s.ops_sent >= ops, "{s:?}");
    // 800 ops in batches of up to 50 per location: 16 full messages, plus the partial ones
    // other flushes (the explicit one, heartbeat probes) cut.
    assert!(
        s.batches_sent <= ops / 25,
        "one message per 50 ops, not per object: {s:?}"
    );
    assert_eq!(s.ops_rejected, 0);
    let metrics = scrape(&node).await;
    assert!(
        metrics.contains(r#"kvplane_node_reports_total{outcome="queued",sink="controller"} 800"#),
        "{metrics}"
    );
    node.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// No controller listening: the worker keeps retrying its registration in the background,
/// the node serves as usual, and it stops within its bounds.
#[tokio::test]
async fn an_absent_controller_never_blocks_the_data_path() {
    let (_pull_hold, pull) = crate::support::hold_port();
    let (_reply_hold, reply) = crate::support::hold_port();
    let node = node_with(|c| {
        c.controller = Some(worker_config(pull, reply, "node-x", 0));
    })
    .await;
    let mut client = Client::connect(&node).await;
    for h in 1..=20u64 {
        let data = body(h, 2048);
        client.put(&key(h), &data).await;
        let (_, got) = client.get(&key(h)).await.expect("hit");
        assert_eq!(got, data);
    }
    let status = node.controller_status().expect("reporting");
    assert_eq!(status.state, kvplane::worker::WorkerState::Registering);
    assert_eq!(status.ops_rejected, 0);
    drop(client);
    crate::support::within("node stop", node.stop()).await;
}

/// L2's own LRU eviction is reported: the controller's `LocalDiskBackend` set always ends
/// equal to what the node lists on L2, after more objects than L2 holds.
#[tokio::test]
async fn l2_evictions_are_reported() {
    let server = server().await;
    let dir = tempdir("report-l2");
    let port = |a: Option<std::net::SocketAddr>| a.expect("zmq socket").port();
    let w = worker_config(
        port(server.addrs.pull),
        port(server.addrs.reply),
        "node-e",
        0,
    );
    let node = node_with(|c| {
        // About four 1000-byte files fit L2 (file = body + 56-byte header + key).
        let mut l2c = l2(&dir, 4400, PrefetchPolicy::Default, StorePolicy::Default);
        l2c.eviction.trigger_watermark = 0.9;
        c.l2 = Some(l2c);
        c.controller = Some(w);
    })
    .await;
    node.controller_ready(STEP).await.expect("registers");
    let mut client = Client::connect(&node).await;
    for h in 1..=8u64 {
        client.put(&key(h), &body(h, 1000)).await;
        client.health().await;
        node.flush().await;
    }
    node.flush_reports(STEP).await;
    let http_addr = node.addrs.http.expect("http");
    let (_, page) = http(
        http_addr,
        "GET",
        "/cache/objects?tier=l2&page_size=100",
        None,
        &[],
    )
    .await;
    let on_l2: HashSet<u64> = page["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            u64::from_str_radix(e["key"]["chunk_hash_hex"].as_str().expect("hex"), 16).expect("hex")
        })
        .collect();
    assert!(
        !on_l2.is_empty() && on_l2.len() < 8,
        "L2 evicted some: {on_l2:?}"
    );
    eventually("L2 evictions reported", STEP, async || {
        held(&server, "node-e", DISK) == on_l2
    })
    .await;
    drop(client);
    node.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `POST /clear` on the controller for `LocalCPUBackend` / `LocalDiskBackend`.
async fn clear(server: &Server, instance: &str, location: &str) -> (u16, serde_json::Value) {
    http(
        server.addrs.http,
        "POST",
        "/clear",
        Some(&json!({"instance_id": instance, "location": location}).to_string()),
        &[("content-type", "application/json")],
    )
    .await
}

#[tokio::test]
async fn the_controllers_clear_empties_one_tier_and_counts_its_tokens() {
    let server = server().await;
    let dir = tempdir("clear");
    let node = reporting_node(&server, "node-c", &dir, 1 << 20, |_| {}).await;
    let mut client = Client::connect(&node).await;
    for h in [0xc1, 0xc2, 0xc3] {
        client.put(&key(h), &body(h, 1000)).await;
    }
    client.health().await;
    node.flush().await;
    node.flush_reports(STEP).await;
    eventually("both tiers reported", STEP, async || {
        held(&server, "node-c", CPU) == set(&[0xc1, 0xc2, 0xc3])
            && held(&server, "node-c", DISK) == set(&[0xc1, 0xc2, 0xc3])
    })
    .await;

    // L1 only: each object's shape (KV_2LTD, [2, 4, 8, 16]) holds 8 tokens.
    let (status, reply) = clear(&server, "node-c", CPU).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["num_tokens"], 24, "{reply}");
    node.flush_reports(STEP).await;
    eventually("L1 clear reported", STEP, async || {
        held(&server, "node-c", CPU).is_empty()
            && held(&server, "node-c", DISK) == set(&[0xc1, 0xc2, 0xc3])
    })
    .await;
    assert!(
        client.get(&key(0xc1)).await.is_some(),
        "still served from L2"
    );

    // A location the node does not have is a failed command, and changes nothing.
    let (status, reply) = clear(&server, "node-c", "GPU").await;
    assert_ne!(status, 200, "{reply}");
    assert!(reply.to_string().contains("unknown location"), "{reply}");
    assert!(client.exists(&key(0xc2)).await);

    // After a restart the tokens of recovered L2 objects come from their file headers.
    drop(client);
    node.stop().await;
    let node = reporting_node(&server, "node-c", &dir, 1 << 20, |_| {}).await;
    assert_eq!(node.recovery.recovered, 3);
    eventually("recovered L2 re-reported", STEP, async || {
        held(&server, "node-c", DISK) == set(&[0xc1, 0xc2, 0xc3])
    })
    .await;
    let (status, reply) = clear(&server, "node-c", DISK).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["num_tokens"], 24, "{reply}");
    node.flush_reports(STEP).await;
    eventually("L2 clear reported", STEP, async || {
        held(&server, "node-c", DISK).is_empty()
    })
    .await;
    let mut client = Client::connect(&node).await;
    assert!(
        client.get(&key(0xc3)).await.is_none(),
        "gone from both tiers"
    );
    node.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
