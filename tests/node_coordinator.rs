//! `kvplane node` and `kvplane coordinator` in one process over 127.0.0.1: the coordinator's
//! startup resync pages the node's `GET /cache/objects` and its usage takes the node's L2 in;
//! its eviction loop deletes from the node through `DELETE /cache/objects`.

mod common;

use common::node::*;
use kvplane::coordinator::{self, CoordinatorConfig};
use kvplane::node::config::{PrefetchPolicy, StorePolicy};
use std::time::Duration;

#[tokio::test]
async fn coordinator_resync_counts_the_nodes_l2_objects() {
    resync_then(None).await;
}

/// No quota for the salt means none allowed (the coordinator's allowlist): its eviction loop
/// sends the node `DELETE /cache/objects` and the objects leave the node.
#[tokio::test]
async fn coordinator_eviction_deletes_from_the_node() {
    resync_then(Some(Duration::from_millis(50))).await;
}

async fn resync_then(eviction: Option<Duration>) {
    let dir = tempdir("coord");
    let node = node_with(|c| {
        c.l2 = Some(l2(
            &dir,
            1 << 30,
            PrefetchPolicy::Default,
            StorePolicy::Default,
        ));
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
    let mut listed = 0;
    for _ in 0..200 {
        listed = node_l2_objects(http).await;
        if listed == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(listed, 3);

    let mut c = CoordinatorConfig::with_defaults("127.0.0.1", 0);
    c.health_check_interval = None;
    c.eviction_check_interval = eviction;
    c.resync = Some(coordinator::resync::ResyncConfig {
        poll_interval: Duration::from_millis(20),
        max_wait: Duration::from_secs(10),
        page_size: 2,
    });
    let server = common::within("coordinator", coordinator::start(c))
        .await
        .expect("coordinator starts");
    let h = server.handle.clone();
    let port = http.port();
    h.fleet(move |f, now, wall| {
        let reg = kvplane::coordinator::fleet::Registration {
            instance_id: Some("node1".into()),
            ip: "127.0.0.1".into(),
            http_port: port,
            metadata: Default::default(),
            p2p_advertised_url: String::new(),
            mq_port: 0,
        };
        f.register(reg, String::new, now, wall).expect("registers");
    })
    .await
    .expect("driver answers");
    let mut seeded = 0;
    for _ in 0..200 {
        seeded = h
            .stats
            .resync_keys
            .load(std::sync::atomic::Ordering::Relaxed);
        if seeded == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        seeded, 3,
        "the resync paged all three objects, two per page"
    );
    let usage = h
        .with(|m, _, _| m.quota_status("").usage_gb)
        .await
        .expect("driver answers");
    assert!(usage > 0.0, "usage took the node's L2 in: {usage}");
    if eviction.is_some() {
        let mut left = usize::MAX;
        for _ in 0..300 {
            left = node_l2_objects(http).await;
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(left, 0, "the coordinator's eviction deleted every object");
        assert!(client.get("m@1@0@00b0@bfloat16").await.is_none());
        let metrics = scrape(&node).await;
        assert!(
            metrics.contains("kvplane_node_coordinator_deleted_total 3"),
            "{metrics}"
        );
    }
    common::within("stop", server.stop()).await;
}

/// Complete L2 objects the node lists (one page of up to 100).
async fn node_l2_objects(http: std::net::SocketAddr) -> usize {
    let (_, page) = common::http::http(http, "GET", "/cache/objects?tier=l2", None, &[]).await;
    page["entries"].as_array().map_or(0, Vec::len)
}
