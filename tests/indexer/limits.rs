//! The indexer's HTTP API under the shared limits of `web::serve`, over real sockets on
//! 127.0.0.1: a stalled request is cut off by `--http-read-timeout` (408), a client beyond
//! `--max-http-connections` waits for a slot, a body over `--max-body-bytes` gets 413 before it
//! is read, and each is counted in `kvplane_indexer_http_limits_hit_total`.

use crate::support::http::raw_exchange;
use crate::support::http_limits::*;
use crate::support::within;
use kvplane::indexer::{start, IndexerConfig, IndexerServer};
use std::time::Duration;

const PREFIX: &str = "kvplane_indexer";
const QUERY: &str = "POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";

async fn indexer(tune: impl FnOnce(&mut IndexerConfig)) -> IndexerServer {
    let mut config = IndexerConfig::default();
    tune(&mut config);
    within("indexer start", start(config))
        .await
        .expect("indexer starts")
}

async fn counted(server: &IndexerServer, limit: &str, n: f64) -> f64 {
    let addr = server.addr;
    let scrape = || raw_exchange(addr, b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n");
    let text = until_hits(scrape, PREFIX, limit, n).await;
    hits(&text, PREFIX, limit)
}

#[tokio::test]
async fn a_stalled_request_is_cut_off_and_counted() {
    let server = indexer(|c| c.http_read_timeout = Duration::from_millis(300)).await;
    stalled_requests_are_cut_off(server.addr, QUERY).await;
    assert_eq!(counted(&server, "http_read_timeout", 2.0).await, 2.0);
    server.stop().await;
}

#[tokio::test]
async fn an_oversize_body_gets_413_before_it_is_read() {
    let server = indexer(|c| c.max_body_bytes = 1024).await;
    announced_oversize_gets_413(server.addr, QUERY, 1024).await;
    assert_eq!(counted(&server, "http_body_bytes", 1.0).await, 1.0);
    server.stop().await;
}

#[tokio::test]
async fn a_client_beyond_the_connection_cap_waits_only_while_the_slot_is_busy() {
    let server = indexer(|c| c.max_http_connections = 1).await;
    a_second_client_waits_only_while_the_slot_is_busy(server.addr, "/healthz").await;
    assert_eq!(counted(&server, "http_connections", 1.0).await, 1.0);
    assert!(counted(&server, "http_idle_closed", 1.0).await >= 1.0);
    server.stop().await;
}

/// `--host` takes an IPv6 literal as it is written (the bind brackets it); skipped where the
/// machine has no IPv6 loopback.
#[tokio::test]
async fn binds_an_ipv6_literal() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("skipped: no IPv6 loopback here");
        return;
    }
    let server = indexer(|c| c.host = "::1".into()).await;
    assert!(server.addr.is_ipv6(), "{}", server.addr);
    let reply = raw_exchange(server.addr, b"GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n").await;
    assert!(reply.starts_with("HTTP/1.0 200"), "{reply}");
    server.stop().await;
}
