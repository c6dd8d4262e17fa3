//! `kvplane node` and `kvplane coordinator` in one process over 127.0.0.1: the coordinator's
//! startup resync pages the node's `GET /cache/objects` and its usage takes the node's L2 in;
//! its eviction loop deletes from the node through `DELETE /cache/objects`.

use crate::support::node::*;
use crate::support::{eventually, STEP};
use kvplane::coordinator::{self, CoordinatorConfig};
use kvplane::node::config::{CoordinatorLinkConfig, NodeConfig, PrefetchPolicy, StorePolicy};
use kvplane::node::NodeServer;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// An in-process coordinator with no health sweep, no eviction loop and no resync; `tweak`
/// changes the rest.
async fn quiet_coordinator(
    tweak: impl FnOnce(&mut CoordinatorConfig),
) -> coordinator::CoordinatorServer {
    let mut c = CoordinatorConfig::with_defaults("127.0.0.1", 0);
    c.health_check_interval = None;
    c.eviction_check_interval = None;
    c.resync = None;
    tweak(&mut c);
    crate::support::within("coordinator", coordinator::start(c))
        .await
        .expect("coordinator starts")
}

/// A node with an L2 under `dir` (`skip_l1`: objects live on L2 only once written, so every
/// GET reads L2) linked to the coordinator at `coord` as `id`, heartbeats every 50 ms, events
/// every 20 ms, `chunk` tokens per chunk.
async fn skip_l1_linked_node(
    coord: std::net::SocketAddr,
    id: &str,
    dir: &std::path::Path,
    chunk: usize,
) -> kvplane::node::NodeServer {
    linked_node(coord.port(), id, dir, StorePolicy::SkipL1, |n| {
        n.chunk_size = chunk;
    })
    .await
}

/// A link to the coordinator on `port` as `id`: heartbeats every 50 ms, events every 20 ms.
fn fast_link(port: u16, id: &str) -> CoordinatorLinkConfig {
    let mut link = CoordinatorLinkConfig::new("127.0.0.1", port, id);
    link.heartbeat_interval = Duration::from_millis(50);
    link.event_flush_interval = Duration::from_millis(20);
    link
}

/// A node with a 1 GiB L2 under `dir` (`store` policy) and a [`fast_link`] to the coordinator
/// on `port` as `id`; `tweak` changes the rest.
async fn linked_node(
    port: u16,
    id: &str,
    dir: &std::path::Path,
    store: StorePolicy,
    tweak: impl FnOnce(&mut NodeConfig),
) -> NodeServer {
    node_with(|n| {
        n.l2 = Some(l2(dir, 1 << 30, PrefetchPolicy::Default, store));
        n.coordinator = Some(fast_link(port, id));
        tweak(n);
    })
    .await
}

#[tokio::test]
async fn coordinator_resync_counts_the_nodes_l2_objects() {
    resync_then(None).await;
}

/// With `--default-quota-gb 0` (the seed's allowlist), no quota for the salt means none
/// allowed: the coordinator's eviction loop
/// sends the node `DELETE /cache/objects` and the objects leave the node.
#[tokio::test]
async fn coordinator_eviction_deletes_from_the_node() {
    resync_then(Some(Duration::from_millis(50))).await;
}

async fn resync_then(eviction: Option<Duration>) {
    let dir = tempdir("coord");
    let node = node_with(|c| {
        c.l2 = Some(plain_l2(&dir, 1 << 30));
    })
    .await;
    let mut client = Client::connect(&node).await;
    for i in 0..3 {
        client
            .put(&format!("m@1@0@{:04x}@bfloat16", 0xb0 + i), &body(i, 1000))
            .await;
    }
    // Wait (bounded) until the three L2 files are complete: the listing shows complete ones.
    let http = node.addrs.http.expect("http");
    eventually("three objects listed on L2", STEP, async || {
        node_l2_objects(http).await == 3
    })
    .await;

    let mut c = CoordinatorConfig::with_defaults("127.0.0.1", 0);
    c.health_check_interval = None;
    c.eviction_check_interval = eviction;
    c.default_quota_gb = eviction.map(|_| 0.0);
    c.resync = Some(coordinator::state::resync::ResyncConfig {
        poll_interval: Duration::from_millis(20),
        max_wait: Duration::from_secs(10),
        page_size: 2,
    });
    let server = crate::support::within("coordinator", coordinator::start(c))
        .await
        .expect("coordinator starts");
    let h = server.handle.clone();
    let port = http.port();
    let reg = kvplane::coordinator::model::fleet::Registration {
        instance_id: Some("node1".into()),
        ip: "127.0.0.1".into(),
        http_port: port,
        metadata: Default::default(),
        p2p_advertised_url: String::new(),
        mq_port: 0,
    };
    h.register(reg, String::new)
        .await
        .expect("driver answers")
        .expect("registers");
    eventually(
        "the resync paged all three objects, two per page",
        STEP,
        async || {
            let seeded = h.stats.resync_keys.load(Ordering::Relaxed);
            (seeded == 3).then_some(()).ok_or(format!("{seeded} keys"))
        },
    )
    .await;
    let usage = h
        .with(|m, _, _| m.quota_status("").usage_gb)
        .await
        .expect("driver answers");
    assert!(usage > 0.0, "usage took the node's L2 in: {usage}");
    if eviction.is_some() {
        eventually(
            "the coordinator's eviction deleted every object",
            STEP,
            async || node_l2_objects(http).await == 0,
        )
        .await;
        // The eviction's delete names no tier, so it is 0.5.6's default, L2: quotas count
        // L2 bytes, and L1's copy stays under the node's own L1 LRU.
        assert!(client.get("m@1@0@00b0@bfloat16").await.is_some());
        let metrics = scrape(&node).await;
        assert!(
            metrics.contains("kvplane_node_coordinator_deleted_total 3"),
            "{metrics}"
        );
    }
    crate::support::within("stop", server.stop()).await;
}

/// Complete L2 objects the node lists (one page of up to 100).
async fn node_l2_objects(http: std::net::SocketAddr) -> usize {
    let (_, page) =
        crate::support::http::http(http, "GET", "/cache/objects?tier=l2", None, &[]).await;
    page["entries"].as_array().map_or(0, Vec::len)
}

/// A node with `--coordinator-url` against an in-process coordinator: it registers (and
/// shows in `GET /instances`), its L2 stores and deletes move `GET /quota` usage through
/// `POST /events`, a forgotten node registers again on its heartbeat's 404, and it
/// deregisters when it stops.
#[tokio::test]
async fn node_registers_heartbeats_and_reports_usage() {
    let server = quiet_coordinator(|_| {}).await;
    let coord = server.addr;
    let dir = tempdir("link");
    let node = linked_node(coord.port(), "node-c", &dir, StorePolicy::Default, |_| {}).await;
    let node_http = node.addrs.http.expect("http");

    let instances = || async {
        let (_, v) = crate::support::http::http(coord, "GET", "/instances", None, &[]).await;
        v["instances"].as_array().cloned().unwrap_or_default()
    };
    let listed = eventually("the node registered", STEP, async || {
        let listed = instances().await;
        (!listed.is_empty()).then_some(listed)
    })
    .await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["instance_id"], "node-c");
    assert_eq!(listed[0]["ip"], "127.0.0.1");
    assert_eq!(listed[0]["http_port"], node_http.port());

    let usage = || async {
        let (_, v) = crate::support::http::http(coord, "GET", "/quota/_default", None, &[]).await;
        v["usage_gb"].as_f64().unwrap_or(-1.0)
    };
    let mut client = Client::connect(&node).await;
    for i in 0..4u64 {
        client
            .put(&format!("m@1@0@{:04x}@bfloat16", 0xc0 + i), &body(i, 4096))
            .await;
    }
    client.health().await;
    node.flush().await;
    let gib = f64::from(1u32 << 30);
    // File bytes: body + 56-byte header + the 19-byte key.
    let want = 4.0 * (4096.0 + 56.0 + 19.0) / gib;
    eventually("usage of the 4 files", STEP, async || {
        let seen = usage().await;
        if (seen - want).abs() < 1e-12 {
            Ok(())
        } else {
            Err(format!("usage {seen} GiB, want {want}"))
        }
    })
    .await;

    // L1 stores are events too: the coordinator counts them per instance (0.5.6's
    // `/instances/{id}/usage`), body bytes in `l1`/`dram`, file bytes in `l2`/`fs`.
    let used = |tier: &'static str| async move {
        let (_, v) =
            crate::support::http::http(coord, "GET", "/instances/node-c/usage", None, &[]).await;
        v["modules"]
            .as_array()
            .and_then(|m| m.iter().find(|r| r["tier"] == tier))
            .and_then(|r| r["used_bytes"].as_u64())
    };
    eventually("L1 bytes of the four objects", STEP, async || {
        used("l1").await == Some(4 * 4096)
    })
    .await;
    assert_eq!(used("l2").await, Some(4 * (4096 + 56 + 19)));

    // A delete on the node is a delete event: usage drops by one file.
    let (status, _) = crate::support::http::http(
        node_http,
        "DELETE",
        "/cache/objects",
        Some(r#"{"keys":["m@1@0@00c0@bfloat16"],"tier":"all"}"#),
        &[("content-type", "application/json")],
    )
    .await;
    assert_eq!(status, 200);
    eventually("usage after the delete", STEP, async || {
        let seen = usage().await;
        if (seen - want * 0.75).abs() < 1e-12 {
            Ok(())
        } else {
            Err(format!("usage {seen} GiB, want {}", want * 0.75))
        }
    })
    .await;
    eventually("the delete left L1 too", STEP, async || {
        used("l1").await == Some(3 * 4096)
    })
    .await;

    // Forgotten by the coordinator (as after its restart): the next heartbeat gets 404 and
    // the node registers again.
    let (status, _) =
        crate::support::http::http(coord, "DELETE", "/instances/node-c", None, &[]).await;
    assert_eq!(status, 204);
    eventually(
        "the node registered again after a heartbeat 404",
        STEP,
        async || instances().await.len() == 1,
    )
    .await;
    let metrics = scrape(&node).await;
    assert!(
        metrics.contains(
            r#"kvplane_node_coordinator_calls_total{call="heartbeat",outcome="not_found"} 1"#
        ),
        "{metrics}"
    );
    assert!(
        !metrics.contains(r#"call="events",outcome="error""#),
        "{metrics}"
    );

    // Stopping deregisters.
    drop(client);
    crate::support::within("node stop", node.stop()).await;
    assert!(instances().await.is_empty(), "deregistered on stop");
    crate::support::within("stop", server.stop()).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Warm prefetch through a real coordinator: `POST /cache/prefetches` on the coordinator
/// reaches the node (registered by `--coordinator-url`), which hashes the tokens as the
/// coordinator does, loads the chunks it holds from L2 into L1, and reports `found_keys` of
/// `total_keys` on the relayed poll.
#[tokio::test]
async fn warm_prefetch_through_the_coordinator_loads_l2_into_l1() {
    const CHUNK: usize = 16;
    let server = quiet_coordinator(|c| c.chunk_size = CHUNK).await;
    let coord = server.addr;
    let dir = tempdir("prefetch");
    let node = skip_l1_linked_node(coord, "node-p", &dir, CHUNK).await;
    let tokens: Vec<u32> = (0..(3 * CHUNK as u32)).map(|t| t * 7 + 1).collect();
    let (keys, chunks) =
        coordinator::model::pins::resolve("m", 1, &tokens, "", CHUNK).expect("resolves");
    assert_eq!(chunks, 3);
    let node_keys: Vec<String> = keys
        .iter()
        .map(|k| format!("m@1@0@{}@bfloat16", k.chunk_hash_hex))
        .collect();
    // The node holds the first two chunks, not the third.
    let mut client = Client::connect(&node).await;
    for (i, k) in node_keys[..2].iter().enumerate() {
        client.put(k, &body(i as u64, 2048)).await;
    }
    // PUT has no reply: a HEALTH after it on the same connection means both were read.
    client.health().await;
    node.flush().await;
    assert!(node_keys[..2].iter().all(|k| !node.in_l1(k)), "on L2 only");

    let post = |body: serde_json::Value| async move {
        crate::support::http::http(
            coord,
            "POST",
            "/cache/prefetches",
            Some(&body.to_string()),
            &[("content-type", "application/json")],
        )
        .await
    };
    // Registration is asynchronous: retry while the coordinator does not know the node yet.
    let submit = serde_json::json!({
        "instance_id": "node-p", "model_name": "m", "world_size": 1, "token_ids": tokens,
    });
    let (status, reply) = eventually("the prefetch accepted (no 404)", STEP, async || {
        let (status, reply) = post(submit.clone()).await;
        (status != 404).then_some((status, reply))
    })
    .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["status"], "submitted");
    assert_eq!(reply["chunks"], 3);
    let rid = reply["request_id"].as_str().expect("request id").to_owned();
    let path = format!("/cache/prefetches/node-p/{rid}");
    let done = eventually("the prefetch completed", STEP, async || {
        let (status, v) = crate::support::http::http(coord, "GET", &path, None, &[]).await;
        assert_eq!(status, 200, "{v}");
        if v["status"] == "completed" {
            return Some(v);
        }
        assert_eq!(v["status"], "pending");
        None
    })
    .await;
    assert_eq!(done["found_keys"], 2, "{done}");
    assert_eq!(done["total_keys"], 3, "{done}");
    assert!(
        node_keys[..2].iter().all(|k| node.in_l1(k)),
        "warmed into L1"
    );
    // Still pollable (0.5.6 forgets a job at its first completed poll).
    let (status, again) = crate::support::http::http(coord, "GET", &path, None, &[]).await;
    assert_eq!((status, &again["found_keys"]), (200, &serde_json::json!(2)));

    // Under one chunk is a noop at the coordinator; an unknown request is the node's 404,
    // relayed; a bad body is the node's 422.
    let (status, noop) = post(serde_json::json!({
        "instance_id": "node-p", "model_name": "m", "world_size": 1, "token_ids": [1, 2],
    }))
    .await;
    assert_eq!((status, &noop["status"]), (200, &serde_json::json!("noop")));
    let (status, _) =
        crate::support::http::http(coord, "GET", "/cache/prefetches/node-p/abc123", None, &[])
            .await;
    assert_eq!(status, 404);
    let node_http = node.addrs.http.expect("http");
    for bad in [
        r#"{"model_name":"m","world_size":0,"token_ids":[]}"#,
        r#"{"model_name":"m","token_ids":[]}"#,
        r#"{"model_name":"m","world_size":1,"token_ids":[-1]}"#,
    ] {
        let (status, _) = crate::support::http::http(
            node_http,
            "POST",
            "/cache/prefetches",
            Some(bad),
            &[("content-type", "application/json")],
        )
        .await;
        assert_eq!(status, 422, "{bad}");
    }
    let (status, _) = crate::support::http::http(
        node_http,
        "POST",
        "/cache/prefetches",
        Some(r#"{"model_name":"m@x","world_size":1,"token_ids":[]}"#),
        &[("content-type", "application/json")],
    )
    .await;
    assert_eq!(status, 400);
    let metrics = scrape(&node).await;
    assert!(
        metrics.contains(r#"kvplane_node_prefetched_keys_total{where="l2"} 2"#),
        "{metrics}"
    );
    drop(client);
    crate::support::within("node stop", node.stop()).await;
    crate::support::within("stop", server.stop()).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A node restarted with `--coordinator-url` posts what it recovered from L2 as stores, so a
/// coordinator that never saw those objects stored counts them.
#[tokio::test]
async fn recovered_l2_objects_are_posted_as_stores() {
    let dir = tempdir("link-recover");
    let l2cfg = || l2(&dir, 1 << 30, PrefetchPolicy::Default, StorePolicy::Default);
    // First run: no coordinator.
    let node = node_with(|n| n.l2 = Some(l2cfg())).await;
    let mut client = Client::connect(&node).await;
    for i in 0..3u64 {
        client
            .put(&format!("m@1@0@{:04x}@bfloat16", 0xd0 + i), &body(i, 1000))
            .await;
    }
    client.health().await;
    node.flush().await;
    drop(client);
    node.stop().await;

    let server = quiet_coordinator(|_| {}).await;
    let node = node_with(|n| {
        n.l2 = Some(l2cfg());
        n.coordinator = Some(fast_link(server.addr.port(), "node-r"));
    })
    .await;
    assert_eq!(node.recovery.recovered, 3);
    let want = 3.0 * (1000.0 + 56.0 + 19.0) / f64::from(1u32 << 30);
    eventually("the recovered objects' usage reported", STEP, async || {
        let (_, v) =
            crate::support::http::http(server.addr, "GET", "/quota/_default", None, &[]).await;
        let seen = v["usage_gb"].as_f64().unwrap_or(-1.0);
        if (seen - want).abs() < 1e-12 {
            Ok(())
        } else {
            Err(format!("usage {seen}, want {want}"))
        }
    })
    .await;
    crate::support::within("node stop", node.stop()).await;
    crate::support::within("stop", server.stop()).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A coordinator that accepts connections but never answers: the node serves PUT and GET
/// as usual (calls time out on their own task, counted), and stops within its bounds.
#[tokio::test]
async fn a_silent_coordinator_never_blocks_the_data_path() {
    // Bound and listening, never accepted: connects succeed, replies never come.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = silent.local_addr().expect("addr").port();
    let dir = tempdir("link-silent");
    let node = linked_node(port, "node-s", &dir, StorePolicy::Default, |n| {
        n.coordinator.as_mut().expect("linked").timeout = Duration::from_millis(100);
    })
    .await;
    let mut client = Client::connect(&node).await;
    for i in 0..20u64 {
        let key = format!("m@1@0@{:04x}@bfloat16", 0xe0 + i);
        let data = body(i, 4096);
        client.put(&key, &data).await;
        let (_, got) = client.get(&key).await.expect("hit");
        assert_eq!(got, data);
    }
    let failed = r#"kvplane_node_coordinator_calls_total{call="register",outcome="error"}"#;
    eventually(
        "registration attempts time out and are counted",
        STEP,
        async || crate::support::sample(&scrape(&node).await, failed) >= 1.0,
    )
    .await;
    drop(client);
    crate::support::within("node stop", node.stop()).await;
    drop(silent);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A coordinator with a quota on the node's salt evicts its least recently *read* keys first:
/// the node posts its L2 reads as access events, which move a key up the salt's LRU.
#[tokio::test]
async fn quota_eviction_takes_the_least_recently_read_keys_first() {
    let server =
        quiet_coordinator(|c| c.eviction_check_interval = Some(Duration::from_millis(50))).await;
    let coord = server.addr;
    let dir = tempdir("lru-read");
    let node = skip_l1_linked_node(coord, "node-r", &dir, 256).await;
    let key = |i: u64| format!("m@1@0@{:04x}@bfloat16", 0xd0 + i);
    let file = 4096.0 + 56.0 + 19.0;
    let gib = f64::from(1u32 << 30);
    let usage = || async {
        let (_, v) = crate::support::http::http(coord, "GET", "/quota/_default", None, &[]).await;
        v["usage_gb"].as_f64().unwrap_or(-1.0)
    };
    let wait_usage = |files: f64| async move {
        eventually("usage of the files", STEP, async || {
            let seen = usage().await;
            if (seen - files * file / gib).abs() < 1e-12 {
                Ok(())
            } else {
                Err(format!("usage {seen} GiB, want {files} files"))
            }
        })
        .await;
    };
    let mut client = Client::connect(&node).await;
    // Stored oldest first: 0..6.
    for i in 0..6 {
        client.put(&key(i), &body(i, 4096)).await;
    }
    client.health().await;
    node.flush().await;
    wait_usage(6.0).await;
    // Read 0, 1, 2: now the least recently used are 3, 4, 5.
    for i in 0..3 {
        assert!(client.get(&key(i)).await.is_some(), "{}", key(i));
    }
    // A later store: once the coordinator counts it, the reads before it were applied.
    client.put(&key(6), &body(6, 4096)).await;
    client.health().await;
    node.flush().await;
    wait_usage(7.0).await;

    // A quota of five objects: the eviction loop deletes from the LRU end.
    let limit = 5.0 * file / gib;
    let (status, v) = crate::support::http::http(
        coord,
        "PUT",
        "/quota/_default",
        Some(&serde_json::json!({"limit_gb": limit}).to_string()),
        &[("content-type", "application/json")],
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let gone = eventually("evicted under the quota", STEP, async || {
        let mut gone = Vec::new();
        for i in 0..7 {
            if !client.exists(&key(i)).await {
                gone.push(i);
            }
        }
        if gone.len() >= 2 && usage().await < limit {
            Ok(gone)
        } else {
            Err(format!("gone: {gone:?}"))
        }
    })
    .await;
    // The unread keys go first; the most recently read and the newest stay.
    for i in 3..6 {
        assert!(
            gone.contains(&i),
            "unread {} evicted first: gone {gone:?}",
            key(i)
        );
    }
    for i in [2, 6] {
        assert!(!gone.contains(&i), "{} stays: gone {gone:?}", key(i));
    }
    node.stop().await;
    crate::support::within("stop", server.stop()).await;
}

/// Keys tagged with LMCache's `cache_salt` tag carry that salt: a salted warm prefetch finds
/// them (and not the same chunks without the salt), and their L2 usage counts under the salt.
#[tokio::test]
async fn salted_keys_are_prefetched_and_counted_under_their_salt() {
    const CHUNK: usize = 16;
    let server = quiet_coordinator(|c| c.chunk_size = CHUNK).await;
    let coord = server.addr;
    let dir = tempdir("salt");
    let node = skip_l1_linked_node(coord, "node-s", &dir, CHUNK).await;
    let tokens: Vec<u32> = (0..(2 * CHUNK as u32)).map(|t| t * 3 + 5).collect();
    let (keys, _) =
        coordinator::model::pins::resolve("m", 1, &tokens, "tenant-a", CHUNK).expect("resolves");
    let mut client = Client::connect(&node).await;
    // Chunk 0 under the salt, chunk 1 without it.
    let salted = format!(
        "m@1@0@{}@bfloat16@cache_salt%tenant-a",
        keys[0].chunk_hash_hex
    );
    let plain = format!("m@1@0@{}@bfloat16", keys[1].chunk_hash_hex);
    client.put(&salted, &body(1, 2048)).await;
    client.put(&plain, &body(2, 2048)).await;
    client.health().await;
    node.flush().await;
    let http = node.addrs.http.expect("http");
    let submit = serde_json::json!({
        "model_name": "m", "world_size": 1, "token_ids": tokens, "cache_salt": "tenant-a",
    });
    let (status, reply) = crate::support::http::http(
        http,
        "POST",
        "/cache/prefetches",
        Some(&submit.to_string()),
        &[("content-type", "application/json")],
    )
    .await;
    assert_eq!(status, 202, "{reply}");
    let id = reply["request_id"].as_str().expect("id").to_owned();
    let path = format!("/cache/prefetches/{id}");
    let done = eventually("the prefetch completed", STEP, async || {
        let (_, v) = crate::support::http::http(http, "GET", &path, None, &[]).await;
        (v["status"] == "completed").then_some(v)
    })
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        (done["found_keys"].as_u64(), done["total_keys"].as_u64()),
        (Some(1), Some(2)),
        "{done}"
    );
    assert!(node.in_l1(&salted), "the salted chunk was loaded");
    assert!(!node.in_l1(&plain), "the unsalted one is another tenant's");
    // Its L2 file counts under the salt's quota.
    eventually("tenant-a's usage counts the salted key", STEP, async || {
        let (_, v) = crate::support::http::http(coord, "GET", "/quota/tenant-a", None, &[]).await;
        v["usage_gb"].as_f64().unwrap_or(0.0) > 0.0
    })
    .await;
    node.stop().await;
    crate::support::within("stop", server.stop()).await;
}
