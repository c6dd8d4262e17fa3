//! The resource limits over real sockets on 127.0.0.1: each refuses what is over it, counts it
//! in `kvplane_limit_hits_total{limit}`, and leaves everything under it working.

use crate::support::*;
use bytes::Bytes;
use kvplane::protocol::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::Duration;

const CPU: &str = "LocalCPUBackend";

async fn metrics(server: &kvplane::controller::Server) -> String {
    match http(server.addrs.http, "GET", "/metrics", None, &[]).await {
        (200, Value::String(text)) => text,
        (status, other) => panic!("/metrics: {status} {other}"),
    }
}

fn hits(text: &str, limit: &str) -> f64 {
    sample(
        text,
        &format!("kvplane_limit_hits_total{{limit=\"{limit}\"}}"),
    )
}

#[tokio::test]
async fn max_workers_refuses_new_workers_but_not_known_ones() {
    let server = server_with(|c| c.max_workers = 2).await;
    let (_rep, port) = rep().await;
    let mut ws: Vec<TestWorker> = (0..3)
        .map(|i| TestWorker::new(&server, &format!("w{i}"), 0))
        .collect();
    assert!(matches!(
        ws[0].register(port, None).await,
        Msg::RegisterRetMsg(_)
    ));
    assert!(matches!(
        ws[1].register(port, None).await,
        Msg::RegisterRetMsg(_)
    ));
    match ws[2].register(port, None).await {
        Msg::ErrorMsg(e) => assert!(e.error.contains("too many workers"), "{}", e.error),
        other => panic!("{other:?}"),
    }
    // A heartbeat from an unknown worker would register it: refused too.
    let beat = Msg::HeartbeatMsg(HeartbeatMsg {
        instance_id: "w2".into(),
        worker_id: 0,
        ip: "127.0.0.1".into(),
        port: i64::from(port),
        peer_init_url: None,
        distributed_url: None,
    });
    assert!(matches!(ws[2].request(beat).await, Msg::ErrorMsg(_)));
    // Re-registering a known worker is never refused.
    assert!(matches!(
        ws[0].register(port, None).await,
        Msg::RegisterRetMsg(_)
    ));
    assert_eq!(server.shared.index().worker_count(), 2);
    assert_eq!(
        server.shared.downlink_count(),
        2,
        "no downlink for a refused worker"
    );
    assert_eq!(hits(&metrics(&server).await, "workers"), 2.0);
    server.stop().await;
}

#[tokio::test]
async fn max_keys_per_worker_drops_new_admits_and_keeps_evicts() {
    let server = server_with(|c| c.max_keys_per_worker = 5).await;
    let (_rep, port) = rep().await;
    let mut a = TestWorker::new(&server, "a", 0);
    let mut b = TestWorker::new(&server, "b", 0);
    a.register(port, None).await;
    b.register(port, None).await;
    let first = a.batch(CPU, &[(true, 1), (true, 2), (true, 3), (true, 4)]);
    let second = a.batch(
        CPU,
        &[(true, 5), (true, 6), (true, 7), (false, 1), (true, 8)],
    );
    let other = b.batch(CPU, &[(true, 1), (true, 2), (true, 3)]);
    a.push(&[first, second]).await;
    b.push(&[other]).await;
    eventually("batches applied", STEP, async || {
        keys(&server, "b", 0).len() == 3 && keys(&server, "a", 0).len() == 5
    })
    .await;
    // 1..=5 fill the budget; 6 and 7 are refused; evicting 1 makes room for 8.
    assert_eq!(keys(&server, "a", 0), BTreeSet::from([2, 3, 4, 5, 8]));
    let text = metrics(&server).await;
    assert_eq!(sample(&text, "kvplane_keys_refused_total"), 2.0);
    assert_eq!(
        sample(&text, "kvplane_kv_ops_applied_total{op=\"admit\"}"),
        9.0,
        "refused admits are not counted as applied (6 of a's 8, all 3 of b's)"
    );
    assert_eq!(hits(&text, "keys_per_worker"), 1.0);
    assert_eq!(
        sample(&text, "kvplane_kv_seq_discontinuities_total"),
        0.0,
        "refused admits are still received in sequence"
    );
    server.stop().await;
}

#[tokio::test]
async fn max_batch_ops_drops_whole_batches() {
    let server = server_with(|c| c.max_batch_ops = 50).await;
    let (mut a, _rep) = TestWorker::registered(&server, "a", 0, None).await;
    let big: Vec<(bool, i64)> = (0..51).map(|k| (true, k)).collect();
    let ok: Vec<(bool, i64)> = (100..150).map(|k| (true, k)).collect();
    let big = a.batch(CPU, &big);
    let ok = a.batch(CPU, &ok);
    a.push(&[big, ok]).await;
    eventually("the 50-op batch applied", STEP, async || {
        keys(&server, "a", 0).len() == 50
    })
    .await;
    assert_eq!(keys(&server, "a", 0), (100..150).collect());
    let text = metrics(&server).await;
    assert_eq!(hits(&text, "batch_ops"), 1.0);
    assert_eq!(
        sample(
            &text,
            "kvplane_kv_batches_discarded_total{reason=\"too_many_ops\"}"
        ),
        1.0
    );
    server.stop().await;
}

#[tokio::test]
async fn max_frame_bytes_drops_the_frame_and_the_socket_keeps_serving() {
    let max = 4096;
    let server = server_with(|c| c.max_frame_bytes = max).await;
    let (mut a, _rep) = TestWorker::registered(&server, "a", 0, None).await;
    // A frame just over the limit on PULL: the transport hangs up on that connection (or the
    // loop drops the frame); either way it is counted and nothing of it is applied.
    let ops: Vec<(bool, i64)> = (0..400).map(|k| (true, 1_000_000 + k)).collect();
    let big = encode(&a.batch(CPU, &ops));
    assert!(big.len() > max, "{} bytes", big.len());
    let mut hostile = kvplane::transport::PushSender::new(ep(server.addrs.pull));
    let _ = within(
        "push big",
        hostile.send(vec![Bytes::from(big)], Duration::from_secs(2)),
    )
    .await;
    // On the reply ROUTER: an ErrorMsg or a hang-up, never a crash.
    let mut fat =
        kvplane::transport::DealerClient::new(ep(server.addrs.reply), Duration::from_secs(2));
    let _ = within("big request", fat.request(Bytes::from(vec![0x80; max + 1]))).await;
    // Small frames still flow, on fresh connections and on the old one.
    let small = a.batch(CPU, &[(true, 1), (true, 2)]);
    a.push(&[small]).await;
    eventually("small batch applied", STEP, async || {
        keys(&server, "a", 0) == BTreeSet::from([1, 2])
    })
    .await;
    assert!(
        keys(&server, "a", 0).iter().all(|k| *k < 1_000_000),
        "nothing of the oversized batch was applied"
    );
    server.stop().await;
}

/// The PULL loop's own check (behind the transport's, which hangs up on the sender before
/// the frame is read): a frame over the limit is counted and dropped, the next one applied.
#[tokio::test]
async fn the_pull_path_counts_frames_over_the_limit() {
    let mut config = kvplane::config::ServeConfig::ephemeral();
    config.max_frame_bytes = 200;
    let shared = kvplane::controller::Driver::new(config, None);
    shared
        .index_mut_for_tests()
        .register("a", 0, "127.0.0.1", 1, None, 0.0)
        .expect("registered");
    let batch = |keys: std::ops::Range<i64>| {
        Bytes::from(encode(&Msg::BatchedKVOperationMsg(BatchedKVOperationMsg {
            instance_id: "a".into(),
            worker_id: 0,
            location: CPU.into(),
            operations: keys
                .map(|k| KVOpEvent {
                    op_type: OpType::Admit,
                    key: ChunkHash::from_i64(k),
                    seq_num: k,
                })
                .collect(),
        })))
    };
    let (big, small) = (batch(0..40), batch(40..42));
    assert!(big.len() > 200 && small.len() <= 200);
    kvplane::controller::loops::apply_frames(&shared, &[big, small], &mut Vec::new());
    assert_eq!(shared.index().key_count(), 2);
    let m = &shared.metrics;
    assert_eq!(m.limit_hits.with_label_values(&["frame_bytes"]).get(), 1);
    assert_eq!(
        m.frames_dropped
            .with_label_values(&["pull", "too_large"])
            .get(),
        1
    );
}

#[tokio::test]
async fn max_body_bytes_answers_413_and_counts_it() {
    let server = server_with(|c| c.max_body_bytes = 1024).await;
    let addr = server.addrs.http;
    let big = format!("{{\"hashes\": [{}1]}}", "1, ".repeat(400));
    assert!(big.len() > 1024);
    let (status, body) = http(addr, "POST", "/lookup", Some(&big), &[]).await;
    assert_eq!(status, 413, "{body}");
    let (status, _) = http(addr, "POST", "/lookup", Some(r#"{"hashes": [1]}"#), &[]).await;
    assert_eq!(status, 200);
    assert_eq!(hits(&metrics(&server).await, "http_body_bytes"), 1.0);
    server.stop().await;
}

/// `--max-zmq-connections`: a connection to the PULL port beyond the cap is closed at accept,
/// and `/metrics` shows it under `kvplane_peer_disconnects_total{socket,reason}` and
/// `kvplane_limit_hits_total{limit="zmq_connections"}`; the other drop series are there at 0.
#[tokio::test]
async fn zmq_connection_cap_is_counted_in_metrics() {
    use tokio::io::AsyncReadExt;
    let server = server_with(|c| c.max_zmq_connections = 1).await;
    let port = server.addrs.pull.expect("pull port").port();
    let connect = || tokio::net::TcpStream::connect(("127.0.0.1", port));
    let mut held = within("connect", connect()).await.expect("connect");
    let mut greeting = [0u8; 64];
    within("greeting", held.read_exact(&mut greeting))
        .await
        .expect("the controller's greeting");
    let mut extra = within("connect", connect()).await.expect("connect");
    let mut sink = Vec::new();
    let _ = within("hang-up", extra.read_to_end(&mut sink)).await;
    assert!(sink.is_empty(), "the extra connection got a greeting");

    let text = metrics(&server).await;
    let drops = |socket: &str, reason: &str| {
        sample(
            &text,
            &format!("kvplane_peer_disconnects_total{{reason=\"{reason}\",socket=\"{socket}\"}}"),
        )
    };
    assert_eq!(drops("pull", "connection_limit"), 1.0);
    assert_eq!(hits(&text, "zmq_connections"), 1.0);
    assert!(
        text.contains(
            "kvplane_peer_disconnects_total{reason=\"idle_timeout\",socket=\"heartbeat\"} 0"
        ),
        "series missing:\n{text}"
    );
    // A scrape adds only what is new.
    let again = metrics(&server).await;
    assert_eq!(hits(&again, "zmq_connections"), 1.0);
    drop(held);
    server.stop().await;
}

/// `--max-frame-bytes` at the transport: a raw peer on the PULL port announcing a frame over
/// the limit is hung up on, the drop shows in `/metrics` (as a disconnect and a `frame_bytes`
/// limit hit), and the PULL loop goes on applying a real worker's batches.
#[tokio::test]
async fn transport_frame_limit_is_counted_and_the_pull_loop_goes_on() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = server_with(|c| c.max_frame_bytes = 1024).await;
    let (mut a, _rep) = TestWorker::registered(&server, "a", 0, None).await;
    let pull = server.addrs.pull.expect("pull port");
    let mut attack = crate::support::zmtp::zmtp_handshake("PUSH");
    attack.extend_from_slice(&crate::support::zmtp::zmtp_header(2048, false, false));
    let mut peer = within("connect", tokio::net::TcpStream::connect(pull))
        .await
        .expect("connect");
    within("write", peer.write_all(&attack))
        .await
        .expect("write");
    let mut sink = Vec::new();
    let _ = within("hang-up", peer.read_to_end(&mut sink)).await;

    let batch = a.batch(CPU, &[(true, 1), (true, 2)]);
    a.push(&[batch]).await;
    eventually("batch applied", STEP, async || {
        keys(&server, "a", 0).len() == 2
    })
    .await;
    let text = metrics(&server).await;
    assert_eq!(
        sample(
            &text,
            "kvplane_peer_disconnects_total{reason=\"frame_too_large\",socket=\"pull\"}"
        ),
        1.0
    );
    assert_eq!(hits(&text, "frame_bytes"), 1.0);
    assert_eq!(
        sample(
            &text,
            "kvplane_frames_dropped_total{reason=\"transport\",socket=\"pull\"}"
        ),
        0.0,
        "a peer drop is not a socket failure"
    );
    server.stop().await;
}

/// One raw HTTP/1.1 exchange on a fresh connection: `head` (request line and headers, no
/// final blank line) and `body`; returns the status code and the body text.
async fn raw(addr: std::net::SocketAddr, head: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!(
        "{head}\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let answer = within("raw HTTP exchange", async {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(request.as_bytes()).await.expect("write");
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.expect("read");
        String::from_utf8_lossy(&out).into_owned()
    })
    .await;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned());
    (status, body)
}

/// Defect 2 of issue 9 (CSRF): a browser page of another origin cannot change state.
#[tokio::test]
async fn mutating_routes_refuse_what_a_cross_origin_page_could_send() {
    let server = server().await;
    let addr = server.addrs.http;
    let clear = r#"{"instance_id": "inst-a", "location": "LocalCPUBackend"}"#;
    let json = "Content-Type: application/json";
    // A "simple request" needs no preflight: text/plain, a form, or no type at all.
    for head in [
        "POST /clear HTTP/1.1\r\nContent-Type: text/plain",
        "POST /clear HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded",
        "POST /pin HTTP/1.1",
    ] {
        let (status, body) = raw(addr, head, clear).await;
        assert_eq!(status, 415, "{head}: {body}");
        assert!(body.contains("application/json"), "{body}");
    }
    let (status, body) = raw(
        addr,
        &format!("POST /clear HTTP/1.1\r\n{json}\r\nOrigin: http://evil.example"),
        clear,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    // The dashboard (same origin) and non-browser clients (no Origin) pass the guard: the
    // instance is unknown, so the handler itself answers 404.
    for extra in [format!("\r\nOrigin: http://{addr}"), String::new()] {
        let head = format!("POST /clear HTTP/1.1\r\n{json}{extra}");
        let (status, body) = raw(addr, &head, clear).await;
        assert_eq!(status, 404, "{head}: {body}");
        assert!(body.contains("inst-a"), "{body}");
    }
    // Read-only POSTs stay lenient, as in LMCache.
    let (status, body) = raw(
        addr,
        "POST /lookup HTTP/1.1\r\nContent-Type: text/plain",
        r#"{"hashes": [1]}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    server.stop().await;
}

#[tokio::test]
async fn max_body_items_answers_413_before_parsing_and_counts_it() {
    let server = server_with(|c| c.max_body_items = 100).await;
    let addr = server.addrs.http;
    let many = format!("{{\"hashes\": [{}1]}}", "1, ".repeat(150));
    let (status, body) = http(addr, "POST", "/lookup", Some(&many), &[]).await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("--max-body-items")),
        "{body}"
    );
    let few = format!("{{\"hashes\": [{}1]}}", "1, ".repeat(50));
    let (status, _) = http(addr, "POST", "/lookup", Some(&few), &[]).await;
    assert_eq!(status, 200);
    let text = metrics(&server).await;
    assert_eq!(hits(&text, "http_body_items"), 1.0);
    assert_eq!(hits(&text, "http_body_bytes"), 0.0);
    server.stop().await;
}

/// Reads one HTTP/1.1 response with a `content-length` from a kept-alive connection.
async fn read_response(s: &mut tokio::net::TcpStream) -> String {
    crate::support::http_limits::read_keepalive_response(s)
        .await
        .0
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_only_while_every_slot_is_busy() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = server_with(|c| c.max_http_connections = 2).await;
    let addr = server.addrs.http;
    let get = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    let hits = |label: &str| {
        server
            .shared
            .metrics
            .limit_hits
            .with_label_values(&[label])
            .get()
    };
    // Two kept-alive connections, each served once, then idle: a third is admitted by
    // closing the one idle the longest.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = within("connect", tokio::net::TcpStream::connect(addr))
            .await
            .expect("connect");
        s.write_all(get.as_bytes()).await.expect("write");
        let head = within("answer", read_response(&mut s)).await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
        held.push(s);
    }
    let mut third = within("connect", tokio::net::TcpStream::connect(addr))
        .await
        .expect("connect");
    third.write_all(get.as_bytes()).await.expect("write");
    let head = within("served at once", read_response(&mut third)).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let mut rest = Vec::new();
    within(
        "the oldest idle one is closed",
        held[0].read_to_end(&mut rest),
    )
    .await
    .expect("read");
    eventually("the close is counted", STEP, async || {
        hits("http_idle_closed") == 1
    })
    .await;
    // Both slots busy with requests (headers started): a fourth waits for one.
    for s in [&mut held[1], &mut third] {
        s.write_all(b"GET /healthz HTTP/1.1\r\n")
            .await
            .expect("write");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut fourth = within("connect", tokio::net::TcpStream::connect(addr))
        .await
        .expect("connect");
    fourth.write_all(get.as_bytes()).await.expect("write");
    let early = tokio::time::timeout(Duration::from_millis(300), read_response(&mut fourth)).await;
    assert!(early.is_err(), "served beyond the cap");
    eventually("the wait is counted", STEP, async || {
        hits("http_connections") == 1
    })
    .await;
    // One request finishes: answered, then closed for the waiting one, which is served.
    held[1].write_all(b"\r\n").await.expect("write");
    let head = within("answered", read_response(&mut held[1])).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let head = within("answer once a slot turns idle", read_response(&mut fourth)).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert_eq!(hits("http_idle_closed"), 2);
    server.stop().await;
}

#[tokio::test]
async fn slow_clients_are_cut_off_and_counted_idle_ones_are_just_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = server_with(|c| c.http_read_timeout = Duration::from_millis(300)).await;
    let addr = server.addrs.http;
    let hits = || {
        server
            .shared
            .metrics
            .limit_hits
            .with_label_values(&["http_read_timeout"])
            .get()
    };
    // Slowloris: headers started, never finished. The server hangs up.
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"POST /lookup HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("write");
    let mut out = Vec::new();
    within("hang-up", s.read_to_end(&mut out)).await.ok();
    eventually("a headers timeout is counted", STEP, async || hits() == 1).await;
    // Headers complete, body stalled: 408, counted.
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(
        b"POST /lookup HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"hashes\": [",
    )
    .await
    .expect("write");
    let mut out = Vec::new();
    within("408", s.read_to_end(&mut out)).await.ok();
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    eventually("a body timeout is counted", STEP, async || hits() == 2).await;
    // An idle keep-alive connection is closed by the same timer, and not counted.
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let head = within("answer", read_response(&mut s)).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let mut rest = Vec::new();
    within("idle close", s.read_to_end(&mut rest)).await.ok();
    assert!(rest.is_empty());
    assert_eq!(hits(), 2);
    server.stop().await;
}
