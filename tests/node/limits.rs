//! The node's HTTP listener (`--http-port`) under the shared limits of `web::serve`, over real
//! sockets on 127.0.0.1: a stalled request is cut off by `--http-read-timeout`, a client beyond
//! `--max-http-connections` waits for a slot, an oversize DELETE body gets 413 before it is
//! read, and each is counted in `kvplane_node_http_limits_hit_total`. And the L1
//! preallocation's limit: bodies come from it until it is used up, and one larger than the
//! memory available is refused at start.

use crate::support::http_limits::*;
use crate::support::node::*;
use kvplane::node::NodeServer;
use std::time::Duration;

const PREFIX: &str = "kvplane_node";
const DELETE: &str =
    "DELETE /cache/objects HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";

async fn counted(node: &NodeServer, limit: &str, n: f64) -> f64 {
    let text = until_hits(|| scrape(node), PREFIX, limit, n).await;
    hits(&text, PREFIX, limit)
}

#[tokio::test]
async fn a_stalled_request_is_cut_off_and_counted() {
    let node = node_with(|c| c.http.read_timeout = Duration::from_millis(300)).await;
    stalled_requests_are_cut_off(node.addrs.http.expect("http"), DELETE).await;
    assert_eq!(counted(&node, "http_read_timeout", 2.0).await, 2.0);
    node.stop().await;
}

#[tokio::test]
async fn an_oversize_delete_gets_413_before_its_body_is_read() {
    let node = node_with(|_| {}).await;
    let max = kvplane::node::config::http_limits(1, Duration::ZERO).max_body_bytes;
    announced_oversize_gets_413(node.addrs.http.expect("http"), DELETE, max).await;
    assert_eq!(counted(&node, "http_body_bytes", 1.0).await, 1.0);
    node.stop().await;
}

#[tokio::test]
async fn a_client_beyond_the_connection_cap_waits_only_while_the_slot_is_busy() {
    let node = node_with(|c| c.http.max_connections = 1).await;
    a_second_client_waits_only_while_the_slot_is_busy(node.addrs.http.expect("http"), "/healthz")
        .await;
    assert_eq!(counted(&node, "http_connections", 1.0).await, 1.0);
    assert!(counted(&node, "http_idle_closed", 1.0).await >= 1.0);
    node.stop().await;
}

/// `--l1-preallocate`: bodies are carved from the memory faulted in at start until it is
/// used up, then mapped on their own; every byte comes back as stored. A preallocation the
/// system cannot back is refused at start, naming the flag.
#[tokio::test]
async fn preallocated_l1_serves_bodies_until_used_up_and_oversize_is_refused() {
    let node = node_with(|c| c.l1_preallocate = 3 << 20).await;
    let text = scrape(&node).await;
    assert_eq!(
        sample(&text, "kvplane_node_l1_preallocated_bytes"),
        f64::from(3 << 20)
    );
    let mut c = Client::connect(&node).await;
    for i in 0..4u64 {
        c.put(&format!("p{i}"), &body(i, 1 << 20)).await;
    }
    for i in 0..4u64 {
        let (_, got) = c.get(&format!("p{i}")).await.expect("stored");
        assert!(got == body(i, 1 << 20), "p{i} intact");
    }
    let text = scrape(&node).await;
    let source = |s: &str| {
        sample(
            &text,
            &format!(r#"kvplane_node_body_buffers_total{{source="{s}"}}"#),
        )
    };
    assert_eq!((source("preallocated"), source("mapped")), (3.0, 1.0));
    assert_eq!(
        sample(&text, "kvplane_node_l1_preallocated_unused_bytes"),
        0.0
    );
    node.stop().await;

    let refused = kvplane::node::start({
        let mut c = kvplane::node::config::NodeConfig::ephemeral();
        c.l1.budget = 1 << 60;
        c.l1_preallocate = 1 << 59;
        c
    })
    .await
    .err()
    .expect("more than the machine has is refused")
    .to_string();
    assert!(refused.contains("--l1-preallocate"), "{refused}");
}
