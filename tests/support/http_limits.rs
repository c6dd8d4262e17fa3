//! Checks of the shared HTTP limits (`web::serve`: connection cap, read timeout; announced
//! oversize bodies) on any service's HTTP port, over raw sockets on 127.0.0.1, and a bounded
//! poll of a service's `http_limits_hit_total{limit}` counter.

use super::http::raw_exchange;
use super::{eventually, sample, within, STEP};
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads one HTTP/1.1 response with a `content-length` from a kept-alive connection: its
/// head (lower-cased) and its body.
pub async fn read_keepalive_response(s: &mut TcpStream) -> (String, Vec<u8>) {
    let mut out = Vec::new();
    let mut byte = [0u8; 1];
    while !out.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).await.expect("read"), 1, "connection open");
        out.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&out).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("content-length");
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.expect("body");
    (head, body)
}

/// `{prefix}_http_limits_hit_total{limit="…"}` in `text`.
pub fn hits(text: &str, prefix: &str, limit: &str) -> f64 {
    sample(
        text,
        &format!("{prefix}_http_limits_hit_total{{limit=\"{limit}\"}}"),
    )
}

/// Scrapes until `limit` was hit `n` times (bounded by [`STEP`]); that scrape.
pub async fn until_hits<F: Future<Output = String>>(
    mut scrape: impl FnMut() -> F,
    prefix: &str,
    limit: &str,
    n: f64,
) -> String {
    let what = format!("{n} hits of {limit}");
    eventually(&what, STEP, async || {
        let text = scrape().await;
        if hits(&text, prefix, limit) >= n {
            Ok(text)
        } else {
            Err(text)
        }
    })
    .await
}

/// A request whose body stalls gets 408 naming `--http-read-timeout`; one whose headers never
/// finish is hung up on. Both count as `http_read_timeout` (the caller checks the counter).
/// `head` is a request head announcing a 100-byte body, of which a few bytes are sent.
pub async fn stalled_requests_are_cut_off(addr: SocketAddr, head: &str) {
    let request = format!("{head}Content-Length: 100\r\n\r\n{{\"x\": [");
    let answer = raw_exchange(addr, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("--http-read-timeout"), "{answer}");
    let answer = raw_exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n").await;
    assert!(!answer.starts_with("HTTP/1.1 2"), "{answer}");
}

/// A body announced one byte over `max` gets 413 before it is sent.
pub async fn announced_oversize_gets_413(addr: SocketAddr, head: &str, max: usize) {
    let request = format!(
        "{head}Content-Length: {}\r\nConnection: close\r\n\r\n",
        max + 1
    );
    let answer = raw_exchange(addr, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
}

/// At a cap of one connection: while the slot is busy with a request (headers started, not
/// finished) a second client waits; once that request is answered its now idle keep-alive
/// connection is closed to admit the second, which is served. `GET path` must answer 200.
/// The caller checks one `http_connections` and one `http_idle_closed` hit.
pub async fn a_second_client_waits_only_while_the_slot_is_busy(addr: SocketAddr, path: &str) {
    let get = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut held = within("connect", TcpStream::connect(addr))
        .await
        .expect("connect");
    let (start, end) = get.split_at(get.len() - 2);
    held.write_all(start.as_bytes()).await.expect("write");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut second = within("connect", TcpStream::connect(addr))
        .await
        .expect("connect");
    second.write_all(get.as_bytes()).await.expect("write");
    let mut head = [0u8; 12];
    let early =
        tokio::time::timeout(Duration::from_millis(300), second.read_exact(&mut head)).await;
    assert!(early.is_err(), "served beyond the cap");
    held.write_all(end.as_bytes()).await.expect("write");
    within("first answer", held.read_exact(&mut head))
        .await
        .expect("read");
    assert_eq!(&head, b"HTTP/1.1 200");
    within(
        "served once the first is idle",
        second.read_exact(&mut head),
    )
    .await
    .expect("read");
    assert_eq!(&head, b"HTTP/1.1 200");
    let mut rest = Vec::new();
    within("the idle one is closed", held.read_to_end(&mut rest))
        .await
        .expect("read");
}
