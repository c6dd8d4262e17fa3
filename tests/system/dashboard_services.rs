//! The service pages of the dashboard in a real browser: `kvplane indexer`, `kvplane
//! coordinator` and `kvplane node` on 127.0.0.1 (ephemeral ports), each fed live traffic over
//! its real protocol (vLLM KV events over ZMQ, MP-server HTTP calls, `lm://` PUT/GET), each
//! page loaded by Debian's headless Chromium through playwright-core
//! (`tests/browser/services.mjs`). Each run saves `docs/dashboard-<page>.png`.
//!
//! Also checks, without a browser, that each feed carries the server's history and that a
//! state-changing request from a page of another origin is refused while the same request
//! from the service's own page (or a non-browser client) passes.
//!
//! Needs `scripts/setup-browser.sh` (run by `scripts/test.sh`). Set `KVPLANE_SKIP_BROWSER=1`
//! to skip the browser part on a machine without Chromium; `KVPLANE_DASHBOARD_SCREENSHOT_DIR`
//! writes the screenshots elsewhere.

use crate::dashboard::Feed;
use crate::support::node::{node_with, plain_l2, Client};
use crate::support::{http, within};
use bytes::Bytes;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use zeromq::prelude::*;
use zeromq::{PubSocket, ZmqMessage};

/// The whole browser run of one page.
const BROWSER_DEADLINE: Duration = Duration::from_secs(150);
/// Feeders stop by themselves after this long, whatever happens to the test.
const FEED_LIMIT: Duration = Duration::from_secs(200);
/// Server history samples to wait for before opening a page (one every 2 s).
const HISTORY_SAMPLES: usize = 5;

/// Polls `GET /api/dashboard?history=1` until the server kept [`HISTORY_SAMPLES`] samples;
/// returns the last feed.
async fn wait_for_history(addr: SocketAddr) -> Value {
    for _ in 0..40 {
        let (status, feed) = http(addr, "GET", "/api/dashboard?history=1", None, &[]).await;
        assert_eq!(status, 200, "{feed}");
        let rows = feed["history"]["rows"].as_array().map_or(0, Vec::len);
        if rows >= HISTORY_SAMPLES {
            assert_eq!(feed["history"]["interval_s"], 2.0, "{feed}");
            assert_eq!(feed["history"]["columns"][0], "t", "{feed}");
            return feed;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("the server kept no history of {HISTORY_SAMPLES} samples within 20 s");
}

/// A request from a page of another origin is refused (403); the same from the service's own
/// page passes the guard (whatever the route then answers, never 403).
async fn cross_origin_is_refused(addr: SocketAddr, method: &str, path: &str, body: &Value) {
    let body = body.to_string();
    let evil = [
        ("Content-Type", "application/json"),
        ("Origin", "http://evil.example"),
    ];
    let (status, v) = http(addr, method, path, Some(&body), &evil).await;
    assert_eq!(status, 403, "{method} {path} from another origin: {v}");
    let site = [
        ("Content-Type", "text/plain"),
        ("Sec-Fetch-Site", "cross-site"),
    ];
    let (status, v) = http(addr, method, path, Some(&body), &site).await;
    assert_eq!(status, 403, "{method} {path} cross-site: {v}");
    let own = format!("http://{addr}");
    let same = [
        ("Content-Type", "application/json"),
        ("Origin", own.as_str()),
        ("Sec-Fetch-Site", "same-origin"),
    ];
    let (status, v) = http(addr, method, path, Some(&body), &same).await;
    assert_ne!(
        status, 403,
        "{method} {path} from the service's own page: {v}"
    );
}

/// Runs `services.mjs` on `page` of `base`; panics with its output unless it passes.
async fn browser(base: &str, page: &str, expect: Value) -> Value {
    let shot = crate::support::browser::screenshot(&format!("dashboard-{page}.png"));
    let report = crate::support::browser::run(
        "services.mjs",
        &[
            base.into(),
            page.into(),
            shot.clone().into(),
            expect.to_string().into(),
        ],
        BROWSER_DEADLINE,
    )
    .await;
    assert!(shot.exists(), "screenshot saved at {}", shot.display());
    report
}

// ---------------------------------------------------------------------------------------------
// Indexer
// ---------------------------------------------------------------------------------------------

/// vLLM ≥ 0.24 events, encoded as its msgspec structs are (tagged maps, map16 header).
mod vllm {
    use rmp::encode::*;

    /// `[ts, [events], dp_rank]`.
    pub(crate) fn batch(events: &[Vec<u8>]) -> Vec<u8> {
        let mut b = Vec::new();
        let _ = write_array_len(&mut b, 3);
        let _ = write_f64(&mut b, 1.5);
        let _ = write_array_len(&mut b, events.len() as u32);
        for e in events {
            b.extend_from_slice(e);
        }
        let _ = write_uint(&mut b, 0);
        b
    }

    fn hashes(b: &mut Vec<u8>, hs: &[u64]) {
        let _ = write_array_len(b, hs.len() as u32);
        for h in hs {
            let _ = write_uint(b, *h);
        }
    }

    pub(crate) fn stored(hs: &[u64], tokens: &[u32], block_size: u32, medium: &str) -> Vec<u8> {
        let mut b = vec![0xde, 0x00, 0x08];
        let _ = write_str(&mut b, "type");
        let _ = write_str(&mut b, "BlockStored");
        let _ = write_str(&mut b, "block_hashes");
        hashes(&mut b, hs);
        let _ = write_str(&mut b, "parent_block_hash");
        let _ = write_nil(&mut b);
        let _ = write_str(&mut b, "token_ids");
        let _ = write_array_len(&mut b, tokens.len() as u32);
        for t in tokens {
            let _ = write_uint(&mut b, u64::from(*t));
        }
        let _ = write_str(&mut b, "block_size");
        let _ = write_uint(&mut b, u64::from(block_size));
        let _ = write_str(&mut b, "lora_id");
        let _ = write_nil(&mut b);
        let _ = write_str(&mut b, "medium");
        let _ = write_str(&mut b, medium);
        let _ = write_str(&mut b, "lora_name");
        let _ = write_nil(&mut b);
        b
    }

    pub(crate) fn removed(hs: &[u64], medium: &str) -> Vec<u8> {
        let mut b = Vec::new();
        let _ = write_map_len(&mut b, 3);
        let _ = write_str(&mut b, "type");
        let _ = write_str(&mut b, "BlockRemoved");
        let _ = write_str(&mut b, "block_hashes");
        hashes(&mut b, hs);
        let _ = write_str(&mut b, "medium");
        let _ = write_str(&mut b, medium);
        b
    }
}

const TOPIC: &[u8] = b"kv@vllm-0@llama";
const MODEL: &str = "llama-3.1-8b";
const BLOCK: u32 = 4;

/// A vLLM-like publisher: one PUB socket, sequence numbers from 0.
struct Publisher {
    socket: PubSocket,
    next: u64,
}

impl Publisher {
    async fn publish(&mut self, events: &[Vec<u8>]) {
        let seq = self.next;
        self.next += 1;
        let frames = vec![
            Bytes::from_static(TOPIC),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            Bytes::from(vllm::batch(events)),
        ];
        let msg = ZmqMessage::try_from(frames).expect("frames");
        let _ = within("publish", self.socket.send(msg)).await;
    }
}

/// The prompt the query box asks for: four blocks of four tokens, held on GPU.
fn prompt() -> Vec<u32> {
    (1..=16).collect()
}

fn csv(tokens: &[u32]) -> String {
    tokens
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Stores a new chain every 200 ms on GPU or CPU and removes the one before the last, so
/// the ingest chart has a shape and the index stays small.
fn feed_indexer(
    mut publisher: Publisher,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut feed = Feed::new(Duration::from_millis(200), FEED_LIMIT, cancel);
        while let Some(n) = feed.next::<u32>().await {
            let blocks = 1 + (n % 4);
            let base = 100_000 + n * 64;
            let tokens: Vec<u32> = (base..base + blocks * BLOCK).collect();
            let hs: Vec<u64> = (0..u64::from(blocks))
                .map(|i| u64::from(n) * 100 + i)
                .collect();
            let medium = if n.is_multiple_of(3) { "CPU" } else { "GPU" };
            let mut events = vec![
                vllm::stored(&hs, &tokens, BLOCK, medium),
                // The main prompt again (idempotent), so the query always finds it.
                vllm::stored(&[1, 2, 3, 4], &prompt(), BLOCK, "GPU"),
            ];
            if n > 2 {
                let old = n - 2;
                let old_blocks = 1 + (old % 4);
                let old_medium = if old.is_multiple_of(3) { "CPU" } else { "GPU" };
                let old_hs: Vec<u64> = (0..u64::from(old_blocks))
                    .map(|i| u64::from(old) * 100 + i)
                    .collect();
                events.push(vllm::removed(&old_hs, old_medium));
            }
            publisher.publish(&events).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexer_page_shows_publishers_history_and_answers_the_query_box() {
    let indexer = within(
        "indexer starts",
        kvplane::indexer::start(kvplane::indexer::IndexerConfig::default()),
    )
    .await
    .expect("indexer starts");
    let addr = indexer.addr;
    let mut socket = PubSocket::new();
    let ep = within("bind pub", socket.bind("tcp://127.0.0.1:0"))
        .await
        .expect("bind pub");
    let endpoint = ep.to_string();
    let register = json!({"endpoint": endpoint, "type": "vLLM", "modelname": MODEL,
        "tenant_id": "default", "instance_id": "vllm-0", "block_size": BLOCK, "dp_rank": 0});
    cross_origin_is_refused(addr, "POST", "/register", &register).await;
    let (status, v) = http(addr, "POST", "/register", Some(&register.to_string()), &[]).await;
    assert_eq!(status, 200, "{v}");

    // Until the prompt is indexed: every publish repeats it (a subscription still on its way
    // loses the first messages, as a real SUB does).
    let mut publisher = Publisher { socket, next: 0 };
    let query = json!({"model": MODEL, "block_size": BLOCK, "token_ids": prompt()});
    let mut found = false;
    let mut last = Value::Null;
    for _ in 0..100 {
        publisher
            .publish(&[vllm::stored(&[1, 2, 3, 4], &prompt(), BLOCK, "GPU")])
            .await;
        let (status, v) = http(addr, "POST", "/query", Some(&query.to_string()), &[]).await;
        assert_eq!(status, 200, "{v}");
        last = v.clone();
        // Counts are tokens (whole blocks only): 4 blocks of 4.
        if v["default"]["vllm-0"]["longest_matched"] == 16 {
            assert_eq!(v["default"]["vllm-0"]["GPU"], 16, "{v}");
            found = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !found {
        let (_, services) = http(addr, "GET", "/services", None, &[]).await;
        panic!("the prompt was never indexed; last /query: {last}; GET /services: {services}");
    }
    cross_origin_is_refused(addr, "POST", "/query", &query).await;

    let cancel = CancellationToken::new();
    let feeder = feed_indexer(publisher, cancel.clone());
    let feed = wait_for_history(addr).await;
    let p = &feed["publishers"][0];
    assert_eq!(p["endpoint"], endpoint.as_str(), "{feed}");
    assert_eq!(p["connected"], true, "{feed}");
    assert!(p["blocks"]["GPU"].as_u64() >= Some(4), "{feed}");
    assert_eq!(p["services"][0]["instance_id"], "vllm-0", "{feed}");
    assert_eq!(feed["totals"]["publishers"], 1, "{feed}");

    if crate::support::browser::ready() {
        let partial: Vec<u32> = (1..=4).chain(900..912).collect();
        browser(
            &format!("http://{addr}"),
            "indexer",
            json!({
                "title": "KV indexer",
                "endpoint": endpoint,
                "instance": "vllm-0",
                "model": MODEL,
                "block_size": BLOCK,
                "tokens": csv(&prompt()),
                "blocks": 4,
                "partial_tokens": csv(&partial),
                "partial_blocks": 1,
                "min_history_points": 3,
            }),
        )
        .await;
    }
    cancel.cancel();
    let _ = within("feeder stops", feeder).await;
    within("indexer stops", indexer.stop()).await;
}

/// `--cluster`: a read replica's page says it is a replica, caught up, and its query box
/// answers from the followed index (docs/CLUSTER.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexer_replica_page_shows_its_role_and_answers_the_query_box() {
    let Some(nats) = crate::support::nats::Nats::start().await else {
        return;
    };
    let start = kvplane::indexer::start;
    let ingester = within("ingester", start(nats.indexer("dash", false)))
        .await
        .expect("ingester");
    let replica = within("replica", start(nats.indexer("dash", true)))
        .await
        .expect("replica");
    let mut socket = PubSocket::new();
    let ep = within("bind pub", socket.bind("tcp://127.0.0.1:0"))
        .await
        .expect("bind pub");
    let register = json!({"endpoint": ep.to_string(), "type": "vLLM", "modelname": MODEL,
        "tenant_id": "default", "instance_id": "vllm-0", "block_size": BLOCK, "dp_rank": 0});
    let (status, v) = http(
        ingester.addr,
        "POST",
        "/register",
        Some(&register.to_string()),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let mut publisher = Publisher { socket, next: 0 };
    let query = json!({"model": MODEL, "block_size": BLOCK, "token_ids": prompt()});
    let mut last = Value::Null;
    for _ in 0..100 {
        publisher
            .publish(&[vllm::stored(&[1, 2, 3, 4], &prompt(), BLOCK, "GPU")])
            .await;
        let (_, v) = http(
            replica.addr,
            "POST",
            "/query",
            Some(&query.to_string()),
            &[],
        )
        .await;
        last = v.clone();
        if v["default"]["vllm-0"]["GPU"] == 16 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        last["default"]["vllm-0"]["GPU"], 16,
        "never replicated: {last}"
    );
    let (status, feed) = http(replica.addr, "GET", "/api/dashboard", None, &[]).await;
    assert_eq!(status, 200, "{feed}");
    assert_eq!(feed["cluster"]["role"], "replica", "{feed}");
    if crate::support::browser::ready() {
        browser(
            &format!("http://{}", replica.addr),
            "indexer-replica",
            json!({
                "title": "KV indexer",
                "instance": "vllm-0",
                "model": MODEL,
                "block_size": BLOCK,
                "tokens": csv(&prompt()),
                "blocks": 4,
            }),
        )
        .await;
    }
    within("replica stops", replica.stop()).await;
    within("ingester stops", ingester.stop()).await;
}

// ---------------------------------------------------------------------------------------------
// Coordinator (Fleet page)
// ---------------------------------------------------------------------------------------------

/// A stand-in MP server: answers the coordinator's eviction dispatches (`DELETE
/// /cache/objects`) with 200.
async fn mp_server() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let app = axum::Router::new().route(
        "/cache/objects",
        axum::routing::delete(|| async { axum::Json(json!({"deleted": 0})) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, task)
}

fn key(n: u64, salt: &str) -> Value {
    json!({"chunk_hash_hex": format!("{n:016x}"), "model_name": "m", "kv_rank": 16_777_472,
           "object_group_id": 0, "cache_salt": salt})
}

/// Heartbeats every second and posts usage every 250 ms: tenant-a grows towards its 1 GiB
/// quota, tenant-b is past its small quota (so evictions are dispatched), tenant-c has none.
fn feed_coordinator(
    addr: SocketAddr,
    instance: String,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut feed = Feed::new(Duration::from_millis(250), FEED_LIMIT, cancel);
        while let Some(seq) = feed.next::<u64>().await {
            if seq.is_multiple_of(4) {
                let path = format!("/instances/{instance}/heartbeat");
                let _ = http(addr, "PUT", &path, None, &[]).await;
            }
            let events = vec![
                json!({"type": "store", "key": key(seq, "tenant-a"), "bytes": 8u64 << 20}),
                json!({"type": "store", "key": key(1_000_000 + seq, "tenant-b"), "bytes": 256u64 << 10}),
                json!({"type": "store", "key": key(2_000_000 + seq, "tenant-c"), "bytes": 1u64 << 20}),
            ];
            let body = json!({"instance_id": instance, "seq": seq, "events": events});
            let _ = http(addr, "POST", "/quota/events", Some(&body.to_string()), &[]).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_page_shows_servers_and_tenants_against_their_quota_over_time() {
    let mut config = kvplane::coordinator::CoordinatorConfig::with_defaults("127.0.0.1", 0);
    config.eviction_check_interval = Some(Duration::from_secs(1));
    config.resync = None;
    let coordinator = within("coordinator starts", kvplane::coordinator::start(config))
        .await
        .expect("coordinator starts");
    let addr = coordinator.addr;
    let (mp, mp_task) = mp_server().await;

    let reg = json!({"ip": "127.0.0.1", "http_port": mp.port(), "instance_id": "mp-server-0",
                     "metadata": {"model": "llama-3.1-8b", "role": "prefill"}});
    cross_origin_is_refused(addr, "POST", "/instances", &reg).await;
    let (status, v) = http(addr, "POST", "/instances", Some(&reg.to_string()), &[]).await;
    assert_eq!(status, 200, "{v}");
    let instance = v["instance_id"].as_str().expect("id").to_owned();
    let quota = json!({"limit_gb": 1.0});
    cross_origin_is_refused(addr, "PUT", "/quota/tenant-a", &quota).await;
    for (salt, gb) in [("tenant-a", 1.0), ("tenant-b", 0.001)] {
        let body = json!({ "limit_gb": gb }).to_string();
        let (status, v) = http(addr, "PUT", &format!("/quota/{salt}"), Some(&body), &[]).await;
        assert_eq!(status, 200, "{v}");
    }

    let cancel = CancellationToken::new();
    let feeder = feed_coordinator(addr, instance.clone(), cancel.clone());
    let feed = wait_for_history(addr).await;
    assert_eq!(
        feed["servers"][0]["instance_id"],
        instance.as_str(),
        "{feed}"
    );
    let tenants = feed["tenants"].as_array().expect("tenants");
    let a = tenants
        .iter()
        .find(|t| t["cache_salt"] == "tenant-a")
        .expect("tenant-a listed");
    assert_eq!(a["quota_bytes"], 1u64 << 30, "{feed}");
    assert!(a["usage_bytes"].as_u64() > Some(0), "{feed}");
    let columns = feed["history"]["columns"].to_string();
    assert!(
        columns.contains("usage:tenant-a") && columns.contains("quota:tenant-a"),
        "{columns}"
    );

    if crate::support::browser::ready() {
        browser(
            &format!("http://{addr}"),
            "fleet",
            json!({
                "title": "fleet coordinator",
                "instance": instance,
                "tenant": "tenant-a",
                "quota_text": "1 GiB",
                "min_history_points": 3,
            }),
        )
        .await;
    }
    cancel.cancel();
    let _ = within("feeder stops", feeder).await;
    within("coordinator stops", coordinator.stop()).await;
    mp_task.abort();
}

// ---------------------------------------------------------------------------------------------
// Node
// ---------------------------------------------------------------------------------------------

/// PUTs a 256 KiB object every 150 ms (L1 holds 16 of them: it evicts), GETs a recent one
/// (a hit) and an unknown one (a miss).
fn feed_node(lm: SocketAddr, cancel: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let stream = within("connect", tokio::net::TcpStream::connect(lm))
            .await
            .expect("connects");
        let mut client = Client { stream };
        let body = vec![7u8; 256 << 10];
        let mut feed = Feed::new(Duration::from_millis(150), FEED_LIMIT, cancel);
        while let Some(n) = feed.next::<u64>().await {
            client.put(&format!("dash-{n}"), &body).await;
            let _ = client.get(&format!("dash-{}", n.saturating_sub(1))).await;
            if n.is_multiple_of(3) {
                let _ = client.get(&format!("missing-{n}")).await;
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_page_shows_tier_usage_over_time() {
    let dir = crate::support::node::tempdir("dashboard");
    let node = node_with(|c| {
        c.l1.budget = 4 << 20;
        c.l2 = Some(plain_l2(&dir, 16 << 20));
    })
    .await;
    let http_addr = node.addrs.http.expect("http port");
    let cancel = CancellationToken::new();
    let feeder = feed_node(node.addrs.lm, cancel.clone());
    let feed = wait_for_history(http_addr).await;
    assert!(feed["l1"]["bytes"].as_u64() > Some(0), "{feed}");
    assert_eq!(feed["l1"]["capacity_bytes"], 4u64 << 20, "{feed}");
    assert_eq!(feed["l2"]["capacity_bytes"], 16u64 << 20, "{feed}");
    let (status, _) = http(http_addr, "GET", "/metrics", None, &[]).await;
    assert_eq!(status, 200);

    if crate::support::browser::ready() {
        browser(
            &format!("http://{http_addr}"),
            "node",
            json!({"title": "cache node", "min_history_points": 3, "height": 1000}),
        )
        .await;
    }
    cancel.cancel();
    let _ = within("feeder stops", feeder).await;
    within("node stops", node.stop()).await;
    let _ = std::fs::remove_dir_all(&dir);
}
