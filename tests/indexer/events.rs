//! `kvplane indexer` end to end over real sockets on 127.0.0.1: a test publisher in Rust (a
//! PUB socket and a replay ROUTER speaking vLLM's framing, events encoded byte for byte as
//! vLLM's msgspec structs) feeding a real indexer, checked through its HTTP API.

use crate::support::{eventually, http, within, SLOW, STEP};
use bytes::Bytes;
use kvplane::indexer::{start, IndexerConfig, IndexerServer};
use serde_json::{json, Value};
use std::net::SocketAddr;

use crate::support::vllm_pub::{mp, Publisher, TOPIC};

async fn indexer() -> IndexerServer {
    within("indexer starts", start(IndexerConfig::default()))
        .await
        .expect("start")
}

async fn post(addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    http(addr, "POST", path, Some(&body.to_string()), &[]).await
}

fn register_body(p: &Publisher, instance: &str) -> Value {
    json!({"endpoint": format!("tcp://{}", p.pub_addr),
           "replay_endpoint": format!("tcp://{}", p.replay_addr),
           "type": "vLLM", "modelname": "m", "lora_name": null, "tenant_id": "default",
           "instance_id": instance, "block_size": 4, "dp_rank": 0, "additionalsalt": ""})
}

fn query_body(n_tokens: u32) -> Value {
    json!({"model": "m", "block_size": 4, "token_ids": (1..=n_tokens).collect::<Vec<_>>()})
}

/// Polls `/query` until `check` accepts the answer for instance `inst`.
async fn until_query(
    addr: SocketAddr,
    n_tokens: u32,
    inst: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    eventually(what, STEP, async || {
        let (status, body) = post(addr, "/query", query_body(n_tokens)).await;
        assert_eq!(status, 200, "{body}");
        let row = body["default"][inst].clone();
        if check(&row) {
            Ok(row)
        } else {
            Err(body)
        }
    })
    .await
}

async fn until_connected(addr: SocketAddr) {
    eventually("connected", STEP, async || {
        let (_, body) = http(addr, "GET", "/services", None, &[]).await;
        let c = &body["services"][0]["connection"];
        if c["connected"] == json!(true)
            && c["replaying"] == json!(false)
            && c["replays"].as_u64() >= Some(1)
        {
            Ok(())
        } else {
            Err(body)
        }
    })
    .await;
}

#[tokio::test]
async fn vllm_events_become_query_answers_with_replay_gaps_and_unregister() {
    let server = indexer().await;
    let addr = server.addr;
    let mut p = Publisher::start().await;
    // Published before anyone subscribes: only a replay can recover it.
    let toks: Vec<u32> = (1..=12).collect();
    p.publish(&[mp::stored_map(&[101, 102], None, &toks[..8], 4, "GPU")])
        .await;

    let (status, body) = post(addr, "/register", register_body(&p, "vllm-1")).await;
    assert_eq!(
        (status, body["instance_id"].clone()),
        (200, json!("vllm-1")),
        "{body}"
    );
    let row = until_query(addr, 12, "vllm-1", "replayed store", |r| {
        r["longest_matched"] == json!(8)
    })
    .await;
    assert_eq!(
        row,
        json!({"longest_matched": 8, "GPU": 8, "CPU": 0, "DISK": 0, "DP": {"0": 8}})
    );
    until_connected(addr).await;

    // Live, legacy positional layout: block 2 chained to engine hash 102; then a CPU copy of
    // block 0 through a token-less store, and the GPU eviction of block 1.
    p.publish(&[mp::stored_legacy(&[103], Some(102), &toks[8..], 4, "GPU")])
        .await;
    until_query(addr, 12, "vllm-1", "live store", |r| r["GPU"] == json!(12)).await;
    p.publish(&[
        mp::stored_map(&[101], None, &[], 0, "CPU"),
        mp::removed_map(&[102], "GPU"),
    ])
    .await;
    let row = until_query(addr, 12, "vllm-1", "removal", |r| r["GPU"] == json!(4)).await;
    assert_eq!(
        row,
        json!({"longest_matched": 4, "GPU": 4, "CPU": 4, "DISK": 0, "DP": {"0": 4}})
    );

    // A lost live message (a clear) is found by the gap and recovered by replay, in order.
    p.publish_opt(&[mp::cleared_legacy()], false).await;
    p.publish(&[mp::stored_map(&[201], None, &toks[..4], 4, "DISK")])
        .await;
    let row = until_query(addr, 12, "vllm-1", "gap replay", |r| {
        r["DISK"] == json!(4) && r["GPU"] == json!(0)
    })
    .await;
    assert_eq!(row["CPU"], json!(4), "the clear covers the GPU tier only");
    let (_, services) = http(addr, "GET", "/services", None, &[]).await;
    let conn = &services["services"][0]["connection"];
    assert_eq!(conn["gaps"], json!(1), "{services}");
    assert_eq!(conn["last_seq"], json!(4));

    // A malformed message is counted and dropped; the stream goes on.
    p.send_raw(vec![
        Bytes::from_static(TOPIC),
        Bytes::from_static(b"short"),
    ])
    .await;
    p.send_raw(vec![
        Bytes::from_static(TOPIC),
        Bytes::copy_from_slice(&5u64.to_be_bytes()),
        Bytes::from_static(&[0xc1]),
    ])
    .await;
    eventually("both drops counted", STEP, async || {
        let (_, text) = http(addr, "GET", "/metrics", None, &[]).await;
        let text = text.as_str().unwrap_or_default().to_owned();
        if text.contains("kvplane_indexer_frames_dropped_total{reason=\"bad_seq\"} 1")
            && text.contains("kvplane_indexer_frames_dropped_total{reason=\"malformed\"} 1")
        {
            Ok(())
        } else {
            Err(text)
        }
    })
    .await;

    // Unregister removes every membership of the stream.
    let (status, body) = post(
        addr,
        "/unregister",
        json!({"type":"vLLM","modelname":"m",
        "lora_name":"","tenant_id":"default","instance_id":"vllm-1","block_size":4,"dp_rank":0}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["removed_instances"], json!(["vllm-1|default|0"]));
    assert_eq!(post(addr, "/query", query_body(12)).await.1, json!({}));
    assert_eq!(server.state.metrics.frames_dropped("bad_seq"), 1);
    let (_, text) = http(addr, "GET", "/metrics", None, &[]).await;
    assert!(
        text.as_str()
            .unwrap_or_default()
            .contains("kvplane_indexer_memberships 0\n"),
        "{text}"
    );
    within("stop", server.stop()).await;
}

#[tokio::test]
async fn http_errors_follow_the_spec_table() {
    let server = indexer().await;
    let addr = server.addr;
    let p = Publisher::start().await;
    assert_eq!(post(addr, "/register", register_body(&p, "a")).await.0, 200);
    assert_eq!(
        post(addr, "/register", register_body(&p, "a")).await.0,
        200,
        "identical: idempotent"
    );
    let mut other = register_body(&p, "a");
    other["block_size"] = json!(8);
    let (status, body) = post(addr, "/register", other).await;
    assert_eq!(
        (status, body["reason"].clone()),
        (409, json!("conflict")),
        "{body}"
    );

    let (status, body) = http(addr, "POST", "/register", Some("{not json"), &[]).await;
    assert_eq!(
        (status, body["reason"].clone()),
        (400, json!("invalid_json"))
    );
    let mut bad = register_body(&p, "b");
    bad["dp_rank"] = json!("zero");
    let (status, body) = post(addr, "/register", bad).await;
    assert_eq!(
        (status, body["field"].clone()),
        (400, json!("dp_rank")),
        "{body}"
    );
    let (status, body) = post(
        addr,
        "/unregister",
        json!({"instance_id": "nope", "dp_rank": 0}),
    )
    .await;
    assert_eq!((status, body["reason"].clone()), (404, json!("not_found")));
    let (status, body) = http(addr, "GET", "/query", None, &[]).await;
    assert_eq!(
        (status, body["reason"].clone()),
        (405, json!("method_not_allowed"))
    );
    let (status, body) = post(
        addr,
        "/query",
        json!({"model":"m","block_size":4,"token_ids":[1],"lora_name":"x","lora_id":1}),
    )
    .await;
    assert_eq!((status, body["field"].clone()), (400, json!("lora_id")));
    // Zero rows for a registered instance with no hits; {} for an unknown tenant.
    let (_, body) = post(
        addr,
        "/query_by_hash",
        json!({"model":"m","block_size":4,"block_hash":["0x10", -1]}),
    )
    .await;
    assert_eq!(
        body,
        json!({"default": {"a": {"longest_matched":0,"GPU":0,"CPU":0,"DISK":0,"DP":{"0":0}}}})
    );
    let (_, body) = post(
        addr,
        "/query",
        json!({"model":"m","block_size":4,"token_ids":[1,2,3,4],"tenant_id":"t2"}),
    )
    .await;
    assert_eq!(body, json!({}));
    let (status, doc) = http(addr, "GET", "/openapi.json", None, &[]).await;
    assert_eq!(status, 200);
    assert!(doc["paths"]["/query_by_hash"]["post"].is_object());
    assert_eq!(http(addr, "GET", "/healthz", None, &[]).await.0, 200);
    within("stop", server.stop()).await;
}

#[tokio::test]
async fn a_publisher_restart_clears_its_stream() {
    let server = indexer().await;
    let addr = server.addr;
    let mut p = Publisher::start().await;
    assert_eq!(post(addr, "/register", register_body(&p, "r")).await.0, 200);
    until_connected(addr).await;
    let toks: Vec<u32> = (1..=8).collect();
    for _ in 0..3 {
        p.publish(&[mp::stored_map(&[1, 2], None, &toks, 4, "GPU")])
            .await;
    }
    until_query(addr, 8, "r", "stored", |r| r["GPU"] == json!(8)).await;
    // The engine restarts: its sequence starts again at 0 and its cache is empty; it stores
    // one block.
    p.next = 0;
    p.ring.lock().await.clear();
    p.publish(&[mp::stored_map(&[9], None, &toks[..4], 4, "GPU")])
        .await;
    until_query(addr, 8, "r", "restart", |r| r["GPU"] == json!(4)).await;
    let (_, services) = http(addr, "GET", "/services", None, &[]).await;
    assert_eq!(
        services["services"][0]["connection"]["restarts"],
        json!(1),
        "{services}"
    );
    assert_eq!(
        services["services"][0]["blocks"]["GPU"],
        json!(1),
        "{services}"
    );
    within("stop", server.stop()).await;
}

#[tokio::test]
async fn a_flooding_or_stalled_publisher_does_not_block_the_others() {
    let server = within(
        "indexer starts",
        start(IndexerConfig {
            queue_capacity: 8,
            ..IndexerConfig::default()
        }),
    )
    .await
    .expect("start");
    let addr = server.addr;
    // A stalled publisher: nothing listens on its port, so its subscriber never connects.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("probe");
    let dead = closed.local_addr().expect("addr");
    drop(closed);
    let stalled = json!({"endpoint": format!("tcp://{dead}"), "type": "vLLM", "modelname": "m",
        "instance_id": "stalled", "block_size": 4, "dp_rank": 0});
    assert_eq!(post(addr, "/register", stalled).await.0, 200);
    let mut flood = Publisher::start().await;
    let mut quiet = Publisher::start().await;
    assert_eq!(
        post(addr, "/register", register_body(&flood, "flood"))
            .await
            .0,
        200
    );
    assert_eq!(
        post(addr, "/register", register_body(&quiet, "quiet"))
            .await
            .0,
        200
    );
    eventually("both publishers connected", STEP, async || {
        let (_, body) = http(addr, "GET", "/services", None, &[]).await;
        let up = body["services"].as_array().map_or(0, |l| {
            l.iter()
                .filter(|s| {
                    s["connection"]["connected"] == json!(true)
                        && s["connection"]["replaying"] == json!(false)
                })
                .count()
        });
        if up == 2 {
            Ok(())
        } else {
            Err(body)
        }
    })
    .await;
    // The flood: many batches of 64 blocks, far more than the 8-message queue holds.
    let toks: Vec<u32> = (0..256).collect();
    let big = mp::stored_map(&(0..64).collect::<Vec<u64>>(), None, &toks, 4, "GPU");
    for _ in 0..2000 {
        flood.publish(std::slice::from_ref(&big)).await;
    }
    quiet
        .publish(&[mp::stored_map(&[7], None, &[1, 2, 3, 4], 4, "GPU")])
        .await;
    until_query(addr, 4, "quiet", "quiet publisher applied", |r| {
        r["GPU"] == json!(4)
    })
    .await;
    // The flood waited for room in its 8-message queue (the publisher held the rest) and
    // lost nothing: every message applied, no gap, no replay needed.
    let last = flood.next - 1;
    let (body, flood_row) = eventually("the flood applied in full", SLOW, async || {
        let (_, body) = http(addr, "GET", "/services", None, &[]).await;
        let flood_row = body["services"].as_array().and_then(|l| {
            l.iter()
                .find(|s| s["instance_id"] == json!("flood"))
                .cloned()
        });
        let last_seq = flood_row
            .as_ref()
            .and_then(|r| r["connection"]["last_seq"].as_u64());
        if last_seq == Some(last) {
            Ok((body, flood_row))
        } else {
            Err(body)
        }
    })
    .await;
    let conn = |k: &str| {
        flood_row
            .as_ref()
            .and_then(|r| r["connection"][k].as_u64())
            .unwrap_or(0)
    };
    assert!(conn("queue_full") > 0, "the queue never filled: {body}");
    assert_eq!(conn("gaps"), 0, "{body}");
    assert!(
        conn("queued_bytes") <= IndexerConfig::default().max_queued_bytes as u64,
        "{body}"
    );
    within("stop", server.stop()).await;
}

#[tokio::test]
async fn registrations_are_bounded() {
    let server = within(
        "indexer starts",
        start(IndexerConfig {
            max_services: 1,
            ..IndexerConfig::default()
        }),
    )
    .await
    .expect("start");
    let addr = server.addr;
    let p = Publisher::start().await;
    assert_eq!(
        post(addr, "/register", register_body(&p, "one")).await.0,
        200
    );
    let (status, body) = post(addr, "/register", register_body(&p, "two")).await;
    assert_eq!(
        (status, body["reason"].clone()),
        (400, json!("out_of_range")),
        "{body}"
    );
    let (_, services) = http(addr, "GET", "/services", None, &[]).await;
    assert_eq!(services["count"], json!(1));
    within("stop", server.stop()).await;
}

/// `GET /metrics` as text.
async fn raw_metrics(addr: SocketAddr) -> (u16, String) {
    let text =
        crate::support::http::raw_exchange(addr, b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").await;
    let status = if text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200") {
        200
    } else {
        0
    };
    (status, text)
}

/// Polls `/readyz` until its readiness is `ready`; returns the last body.
async fn until_ready(addr: SocketAddr, ready: bool, what: &str) -> Value {
    eventually(what, SLOW, async || {
        let (status, body) = http(addr, "GET", "/readyz", None, &[]).await;
        if (status == 200) == ready && body["ready"] == json!(ready) {
            Ok(body)
        } else {
            Err(format!("/readyz {status} {body}"))
        }
    })
    .await
}

/// `--cluster`: an ingester and two read replicas on a real nats-server. The replicas answer
/// as the ingester after stores, a removal and an unregister, refuse registrations, say they
/// are not ready while NATS is down and ready again after, and start over when the ingester
/// restarts (a new epoch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_read_replicas_follow_the_ingester_through_nats() {
    use crate::support::nats::Nats;
    let Some(mut nats) = Nats::start().await else {
        return;
    };
    let ingester = within("ingester", start(nats.indexer("t1", false)))
        .await
        .expect("ingester");
    let mut replicas = Vec::new();
    for _ in 0..2 {
        replicas.push(
            within("replica", start(nats.indexer("t1", true)))
                .await
                .expect("replica"),
        );
    }
    let mut p = Publisher::start().await;
    let toks: Vec<u32> = (1..=12).collect();
    p.publish(&[mp::stored_map(&[101, 102, 103], None, &toks, 4, "GPU")])
        .await;
    let (status, _) = post(ingester.addr, "/register", register_body(&p, "vllm-1")).await;
    assert_eq!(status, 200);
    let lead = until_query(ingester.addr, 12, "vllm-1", "ingested", |r| {
        r["GPU"] == json!(12)
    })
    .await;
    for r in &replicas {
        let row = until_query(r.addr, 12, "vllm-1", "replicated", |row| *row == lead).await;
        assert_eq!(row, lead);
        let ready = until_ready(r.addr, true, "caught up").await;
        assert_eq!(ready["role"], json!("replica"), "{ready}");
        assert_eq!(ready["pending"], json!(0), "{ready}");
        let (status, body) = post(r.addr, "/register", register_body(&p, "vllm-2")).await;
        assert_eq!(status, 409, "{body}");
    }
    let (_, ready) = http(ingester.addr, "GET", "/readyz", None, &[]).await;
    assert_eq!(ready["role"], json!("ingester"), "{ready}");

    // One publisher message whose change is larger than NATS takes (1 MiB): split into
    // several ops, in order, with no gap.
    let big: Vec<Vec<u8>> = (0..1500u32)
        .map(|e| {
            let toks: Vec<u32> = (0..256).map(|t| 1_000_000 + e * 256 + t).collect();
            let hs: Vec<u64> = (0..64)
                .map(|b| 10_000_000 + u64::from(e) * 64 + b)
                .collect();
            mp::stored_map(&hs, None, &toks, 4, "CPU")
        })
        .collect();
    p.publish(&big).await;
    let memberships = |addr| async move {
        let (_, text) = raw_metrics(addr).await;
        crate::support::sample(&text, "kvplane_indexer_memberships")
    };
    let want = 3.0 + 1500.0 * 64.0;
    for addr in std::iter::once(ingester.addr).chain(replicas.iter().map(|r| r.addr)) {
        eventually("every membership replicated", SLOW, async || {
            let got = memberships(addr).await;
            if got == want {
                Ok(())
            } else {
                Err(got)
            }
        })
        .await;
    }
    for r in &replicas {
        let ready = until_ready(r.addr, true, "after the split change").await;
        assert_eq!(ready["in_sync"], json!(true), "{ready}");
    }

    p.publish(&[mp::removed_map(&[102], "GPU")]).await;
    for r in &replicas {
        until_query(r.addr, 12, "vllm-1", "removal replicated", |row| {
            row["GPU"] == json!(4)
        })
        .await;
    }

    // NATS down: the replicas say so; back up: they read again and are ready.
    nats.kill().await;
    until_ready(replicas[0].addr, false, "NATS down").await;
    nats.restart().await;
    for r in &replicas {
        until_ready(r.addr, true, "NATS back").await;
    }

    // Unregister on the ingester: the replicas drop the stream too.
    let (status, _) = post(
        ingester.addr,
        "/unregister",
        json!({"instance_id": "vllm-1", "tenant_id": "default"}),
    )
    .await;
    assert_eq!(status, 200);
    for r in &replicas {
        eventually("unregister replicated", STEP, async || {
            let (_, body) = post(r.addr, "/query", query_body(12)).await;
            if body == json!({}) {
                return Ok(());
            }
            let (_, lead) = http(ingester.addr, "GET", "/readyz", None, &[]).await;
            let (_, follow) = http(r.addr, "GET", "/readyz", None, &[]).await;
            Err(format!("{body}; ingester {lead}; replica {follow}"))
        })
        .await;
    }

    // A new ingester (empty index, new epoch): the replicas start over from it.
    within("stop", ingester.stop()).await;
    let ingester = within("ingester again", start(nats.indexer("t1", false)))
        .await
        .expect("ingester");
    let mut q = Publisher::start().await;
    q.publish(&[mp::stored_map(&[7], None, &toks[..4], 4, "CPU")])
        .await;
    let (status, _) = post(ingester.addr, "/register", register_body(&q, "vllm-3")).await;
    assert_eq!(status, 200);
    let lead = until_query(ingester.addr, 12, "vllm-3", "new epoch", |r| {
        r["CPU"] == json!(4)
    })
    .await;
    for r in replicas {
        until_query(r.addr, 12, "vllm-3", "new epoch replicated", |row| {
            *row == lead
        })
        .await;
        let ready = until_ready(r.addr, true, "new epoch").await;
        assert_eq!(ready["in_sync"], json!(true), "{ready}");
        within("stop", r.stop()).await;
    }
    within("stop", ingester.stop()).await;
}
