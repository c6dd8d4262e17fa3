//! The node's HTTP listener (`--http-port`) under the shared limits of `web::serve`, over real
//! sockets on 127.0.0.1: a stalled request is cut off by `--http-read-timeout`, a client beyond
//! `--max-http-connections` waits for a slot, an oversize DELETE body gets 413 before it is
//! read, and each is counted in `kvplane_node_http_limits_hit_total`.

mod common;

use common::http::raw_exchange;
use common::node::*;
use common::{sample, within};
use kvplane::node::Node;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn hits(text: &str, limit: &str) -> f64 {
    sample(
        text,
        &format!("kvplane_node_http_limits_hit_total{{limit=\"{limit}\"}}"),
    )
}

/// Polls `/metrics` (bounded) until `limit` was hit `n` times; returns the last scrape.
async fn until_hits(node: &Node, limit: &str, n: f64) -> String {
    let mut text = String::new();
    for _ in 0..100 {
        text = scrape(node).await;
        if hits(&text, limit) >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    text
}

#[tokio::test]
async fn a_stalled_request_is_cut_off_and_counted() {
    let node = node_with(|c| c.http.read_timeout = Duration::from_millis(300)).await;
    let addr = node.addrs.http.expect("http");
    let answer = raw_exchange(
        addr,
        b"DELETE /cache/objects HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"keys\": [",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("--http-read-timeout"), "{answer}");
    // Headers never finished: hung up on, counted too.
    let answer = raw_exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n").await;
    assert!(!answer.starts_with("HTTP/1.1 2"), "{answer}");
    let text = until_hits(&node, "http_read_timeout", 2.0).await;
    assert_eq!(hits(&text, "http_read_timeout"), 2.0, "{text}");
    node.stop().await;
}

#[tokio::test]
async fn an_oversize_delete_gets_413_before_its_body_is_read() {
    let node = node_with(|_| {}).await;
    let addr = node.addrs.http.expect("http");
    let request = format!(
        "DELETE /cache/objects HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        kvplane::node::config::http_limits(1, Duration::ZERO).max_body_bytes + 1
    );
    let answer = raw_exchange(addr, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let text = until_hits(&node, "http_body_bytes", 1.0).await;
    assert_eq!(hits(&text, "http_body_bytes"), 1.0, "{text}");
    node.stop().await;
}

#[tokio::test]
async fn a_client_beyond_the_connection_cap_waits_for_a_slot() {
    let node = node_with(|c| c.http.max_connections = 1).await;
    let addr = node.addrs.http.expect("http");
    let get = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut held = within("connect", TcpStream::connect(addr))
        .await
        .expect("connect");
    held.write_all(get).await.expect("write");
    let mut first = [0u8; 12];
    within("first answer", held.read_exact(&mut first))
        .await
        .expect("read");
    assert_eq!(&first, b"HTTP/1.1 200");
    // A second client is queued by the kernel but not served while the slot is held.
    let mut second = within("connect", TcpStream::connect(addr))
        .await
        .expect("connect");
    second.write_all(get).await.expect("write");
    let mut head = [0u8; 12];
    let early =
        tokio::time::timeout(Duration::from_millis(300), second.read_exact(&mut head)).await;
    assert!(early.is_err(), "served beyond the cap");
    drop(held);
    within("served once the slot is free", second.read_exact(&mut head))
        .await
        .expect("read");
    assert_eq!(&head, b"HTTP/1.1 200");
    drop(second);
    let text = until_hits(&node, "http_connections", 1.0).await;
    assert!(hits(&text, "http_connections") >= 1.0, "{text}");
    node.stop().await;
}
