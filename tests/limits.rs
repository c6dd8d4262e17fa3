//! The resource limits over real sockets on 127.0.0.1: each refuses what is over it, counts it
//! in `kvplane_limit_hits_total{limit}`, and leaves everything under it working.

mod common;
mod http_support;

use bytes::Bytes;
use common::*;
use http_support::http;
use kvplane::protocol::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::Duration;

const CPU: &str = "LocalCPUBackend";

async fn metrics(server: &kvplane::Server) -> String {
    match http(server.addrs.http, "GET", "/metrics", None, &[]).await {
        (200, Value::String(text)) => text,
        (status, other) => panic!("/metrics: {status} {other}"),
    }
}

fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

fn hits(text: &str, limit: &str) -> f64 {
    sample(
        text,
        &format!("kvplane_limit_hits_total{{limit=\"{limit}\"}}"),
    )
}

fn keys(server: &kvplane::Server, instance: &str) -> BTreeSet<i64> {
    server
        .shared
        .index()
        .keys_of(instance, 0, CPU)
        .into_iter()
        .map(|k| i64::try_from(k.as_i128()).expect("small"))
        .collect()
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
    eventually("batches applied", STEP, || {
        keys(&server, "b").len() == 3 && keys(&server, "a").len() == 5
    })
    .await;
    // 1..=5 fill the budget; 6 and 7 are refused; evicting 1 makes room for 8.
    assert_eq!(keys(&server, "a"), BTreeSet::from([2, 3, 4, 5, 8]));
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
    let (_rep, port) = rep().await;
    let mut a = TestWorker::new(&server, "a", 0);
    a.register(port, None).await;
    let big: Vec<(bool, i64)> = (0..51).map(|k| (true, k)).collect();
    let ok: Vec<(bool, i64)> = (100..150).map(|k| (true, k)).collect();
    let big = a.batch(CPU, &big);
    let ok = a.batch(CPU, &ok);
    a.push(&[big, ok]).await;
    eventually("the 50-op batch applied", STEP, || {
        keys(&server, "a").len() == 50
    })
    .await;
    assert_eq!(keys(&server, "a"), (100..150).collect());
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
    let (_rep, port) = rep().await;
    let mut a = TestWorker::new(&server, "a", 0);
    a.register(port, None).await;
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
    eventually("small batch applied", STEP, || {
        keys(&server, "a") == BTreeSet::from([1, 2])
    })
    .await;
    assert!(
        keys(&server, "a").iter().all(|k| *k < 1_000_000),
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
    let shared = kvplane::controller::Shared::new(config, None);
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
