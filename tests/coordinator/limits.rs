//! The coordinator's HTTP limits over real sockets on 127.0.0.1: body bytes (announced and
//! streamed), JSON values per body, the connection cap (idle keep-alive connections make room
//! for new ones) and the read timeout. Each refusal is
//! answered with its code, names its flag, and is counted exactly once in `/metrics`.

use crate::support::http::raw_exchange;
use crate::support::http_limits::read_keepalive_response;
use crate::support::{eventually, http, sample, within, STEP};
use kvplane::coordinator::{self, CoordinatorConfig, CoordinatorServer as Coordinator};
use serde_json::Value;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn start(tune: impl FnOnce(&mut CoordinatorConfig)) -> Coordinator {
    let mut c = CoordinatorConfig::with_defaults("127.0.0.1", 0);
    c.health_check_interval = None;
    c.eviction_check_interval = None;
    c.resync = None;
    tune(&mut c);
    within("start", coordinator::start(c))
        .await
        .expect("coordinator starts")
}

async fn metrics(addr: SocketAddr) -> String {
    match http(addr, "GET", "/metrics", None, &[]).await {
        (200, Value::String(text)) => text,
        (status, other) => panic!("/metrics: {status} {other}"),
    }
}

fn refused(text: &str, what: &str) -> f64 {
    sample(text, &format!("kvplane_coordinator_refused_{what}_total"))
}

fn events_body(entries: usize) -> String {
    let entry = r#"{"key": {"chunk_hash_hex": "aa", "model_name": "m", "kv_rank": 0, "object_group_id": 0, "cache_salt": ""}, "size_bytes": 1}"#;
    let entries = vec![entry; entries].join(", ");
    format!(
        r#"{{"batches": [{{"instance_id": "a", "incarnation": 1, "seq": 1, "event_type": "store", "tier": "l2", "backend": "fs", "entries": [{entries}]}}]}}"#
    )
}

#[tokio::test]
async fn oversize_bodies_get_413_and_are_counted_once() {
    let c = start(|c| c.http.max_body_bytes = 4096).await;
    let addr = c.addr;
    // Announced by Content-Length: refused before the body is read.
    let (status, body) = http(addr, "POST", "/events", Some(&events_body(100)), &[]).await;
    assert_eq!(status, 413, "{body}");
    assert!(body["detail"]
        .as_str()
        .unwrap()
        .contains("--max-body-bytes"));
    // Streamed without a length (chunked): cut while read, also 413.
    let chunk = events_body(100);
    let request = format!(
        "POST /events HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n\
         {:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len()
    );
    let answer = raw_exchange(addr, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("--max-body-bytes"), "{answer}");
    // Under the limit: served.
    let (status, body) = http(addr, "POST", "/events", Some(&events_body(2)), &[]).await;
    assert_eq!(status, 200, "{body}");
    let text = metrics(addr).await;
    assert_eq!(refused(&text, "body_bytes"), 2.0, "{text}");
    assert_eq!(refused(&text, "body_items"), 0.0);
    within("stop", c.stop()).await;
}

#[tokio::test]
async fn too_many_values_get_413_naming_the_limit_before_parsing() {
    let c = start(|c| c.http.max_body_items = 100).await;
    let addr = c.addr;
    // 20 entries are ~160 values: refused, whatever the body's schema would say.
    let (status, body) = http(addr, "POST", "/events", Some(&events_body(20)), &[]).await;
    assert_eq!(status, 413, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("--max-body-items") && detail.contains("100"),
        "{detail}"
    );
    // Even a body that is not valid JSON is refused by the count, not parsed.
    let junk = format!("[{}", "1,".repeat(200));
    let (status, _) = http(addr, "POST", "/instances", Some(&junk), &[]).await;
    assert_eq!(status, 413);
    let (status, body) = http(addr, "POST", "/events", Some(&events_body(5)), &[]).await;
    assert_eq!(status, 200, "{body}");
    let text = metrics(addr).await;
    assert_eq!(refused(&text, "body_items"), 2.0, "{text}");
    assert_eq!(refused(&text, "body_bytes"), 0.0, "{text}");
    assert_eq!(
        sample(&text, "kvplane_coordinator_invalid_bodies_total"),
        0.0
    );
    within("stop", c.stop()).await;
}

/// Reads one HTTP/1.1 response with a `content-length` from a kept-alive connection.
async fn read_response(s: &mut TcpStream) -> String {
    read_keepalive_response(s).await.0
}

async fn connect(addr: SocketAddr) -> TcpStream {
    within("connect", TcpStream::connect(addr))
        .await
        .expect("connect")
}

/// One `GET /healthz` on a kept-alive connection, answered 200.
async fn healthz(s: &mut TcpStream, addr: SocketAddr) {
    let get = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    s.write_all(get.as_bytes()).await.expect("write");
    let head = within("answer", read_response(s)).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
}

/// Whether the server closed `s` (EOF or reset), within a bounded wait.
async fn closed_by_server(s: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(STEP, s.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn idle_keep_alive_connections_never_block_a_new_one() {
    const CAP: usize = 4;
    let c = start(|c| c.http.max_connections = CAP).await;
    let addr = c.addr;
    // CAP idle keep-alive connections (as MP servers between heartbeats), oldest first.
    let mut held = Vec::new();
    for _ in 0..CAP {
        let mut s = connect(addr).await;
        healthz(&mut s, addr).await;
        held.push(s);
    }
    // Refresh all but the first: it is now the least recently active.
    for s in &mut held[1..] {
        healthz(s, addr).await;
    }
    // One more: served, by closing the idle connection that was quiet the longest.
    let mut new = connect(addr).await;
    healthz(&mut new, addr).await;
    assert!(closed_by_server(&mut held[0]).await, "oldest idle closed");
    // The others were left alone and still answer on their own connections.
    for s in &mut held[1..] {
        healthz(s, addr).await;
    }
    let text = metrics_on(&mut new, addr).await;
    assert_eq!(
        sample(&text, "kvplane_coordinator_http_idle_closed_total"),
        1.0,
        "{text}"
    );
    assert_eq!(refused(&text, "connections"), 0.0, "{text}");
    drop((held, new));
    within("stop", c.stop()).await;
}

/// `/metrics` over an already open connection (a new one would take a slot).
async fn metrics_on(s: &mut TcpStream, addr: SocketAddr) -> String {
    let get = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    s.write_all(get.as_bytes()).await.expect("write");
    let (_, body) = within("metrics answer", read_keepalive_response(s)).await;
    String::from_utf8(body).expect("utf-8")
}

#[tokio::test]
async fn a_new_connection_waits_only_while_every_slot_is_busy_with_a_request() {
    let c = start(|c| c.http.max_connections = 2).await;
    let addr = c.addr;
    // Both slots mid-request: headers started, not finished.
    let mut busy = Vec::new();
    for _ in 0..2 {
        let mut s = connect(addr).await;
        s.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n").as_bytes())
            .await
            .expect("write");
        busy.push(s);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A third peer is not served while both are busy.
    let mut third = connect(addr).await;
    let get = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    third.write_all(get.as_bytes()).await.expect("write");
    let early = tokio::time::timeout(Duration::from_millis(300), read_response(&mut third)).await;
    assert!(early.is_err(), "served beyond the cap");
    // One request completes: its connection is answered, turns idle and is closed for the
    // waiting one, which is then served.
    busy[0].write_all(b"\r\n").await.expect("write");
    let head = within("busy one answered", read_response(&mut busy[0])).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let head = within("served once a slot turns idle", read_response(&mut third)).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(closed_by_server(&mut busy[0]).await, "the idle one closed");
    let text = metrics_on(&mut third, addr).await;
    assert_eq!(refused(&text, "connections"), 1.0, "{text}");
    assert_eq!(
        sample(&text, "kvplane_coordinator_http_idle_closed_total"),
        1.0,
        "{text}"
    );
    drop((busy, third));
    within("stop", c.stop()).await;
}

#[tokio::test]
async fn a_stalled_body_gets_408_and_is_counted() {
    let c = start(|c| c.http.read_timeout = Duration::from_millis(300)).await;
    let addr = c.addr;
    let answer = raw_exchange(
        addr,
        b"POST /events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"batches\": [",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("--http-read-timeout"), "{answer}");
    // Headers never finished: the server hangs up, counted too.
    let answer = raw_exchange(addr, b"POST /events HTTP/1.1\r\nHost: x\r\n").await;
    assert!(!answer.starts_with("HTTP/1.1 2"), "{answer}");
    let text = eventually("both read timeouts counted", STEP, async || {
        let text = metrics(addr).await;
        (refused(&text, "read_timeout") >= 2.0).then_some(text)
    })
    .await;
    assert_eq!(refused(&text, "read_timeout"), 2.0, "{text}");
    within("stop", c.stop()).await;
}
