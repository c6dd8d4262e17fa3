//! The Mooncake standard envelope (issue 24) through a real `kvplane indexer` process and real
//! ZMQ sockets: a stream with `event_id` gaps, an id going backwards, a backend restart, an
//! unknown backend, another tenant and a malformed field, and one store (`backend_id`
//! `pool-a`) shared by two instances.
//!
//! The publisher is not Mooncake's own: its PyPI wheels (`mooncake-transfer-engine*`
//! 0.3.13.post1) build the master without `MOONCAKE_ENABLE_KV_EVENTS`, so their publisher is a
//! no-op stub (docs/INDEXER.md, "Mooncake envelope"). Its frames are built exactly as
//! `mooncake-store/src/kv_event/kv_event_publisher.cpp` (kvcache-ai/Mooncake `main`@3b5a594)
//! packs them, field for field, in `tests/support/mooncake_pub.rs`. One socket carries two
//! backends, as a relay merging two masters would; each numbers its own events from 1.

use crate::support::mooncake_pub::{event_map, MasterPublisher, ObjectEvent};
use crate::support::process::Launch;
use crate::support::{eventually, free_port, http, sample, SLOW};
use kvplane::indexer::hash::{seq_hashes, DEFAULT_SEED};
use serde_json::{json, Value};
use std::net::SocketAddr;

async fn post(addr: SocketAddr, path: &str, body: Value) -> Value {
    let (status, got) = http(addr, "POST", path, Some(&body.to_string()), &[]).await;
    assert_eq!(status, 200, "{path} {body}: {got}");
    got
}

/// Each instance's (longest_matched, CPU, DISK) once they equal `want`.
async fn until_rows(addr: SocketAddr, what: &str, want: &[(&str, [u64; 3])]) {
    let query = json!({"model": "m", "block_size": 4, "token_ids": (1..=16).collect::<Vec<u32>>()});
    eventually(what, SLOW, async || {
        let body = post(addr, "/query", query.clone()).await;
        let rows = &body["default"];
        let got: Vec<[u64; 3]> = want
            .iter()
            .map(|(i, _)| {
                let r = &rows[*i];
                [&r["longest_matched"], &r["CPU"], &r["DISK"]].map(|v| v.as_u64().unwrap_or(99))
            })
            .collect();
        let expected: Vec<[u64; 3]> = want.iter().map(|(_, w)| *w).collect();
        if got == expected {
            Ok(())
        } else {
            Err(format!("{got:?} (want {expected:?}): {rows}"))
        }
    })
    .await;
}

async fn metrics(addr: SocketAddr) -> String {
    crate::support::http::raw_exchange(addr, b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").await
}

fn backends(services: &Value, instance: &str) -> Value {
    services["services"]
        .as_array()
        .and_then(|l| l.iter().find(|s| s["instance_id"] == json!(instance)))
        .map_or(Value::Null, |s| s["connection"]["backends"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_store_counts_for_its_instances_in_event_id_order() {
    let mut kv = Launch::kvplane("indexer")
        .args(["--host", "127.0.0.1", "--port", "0"])
        .spawn();
    let addr = kv.listening("kvplane indexer listening").await.addr("http");
    let mut master = MasterPublisher::bind().await;
    let endpoint = format!("tcp://{}", master.addr);
    let reg = |instance: &str, kind: &str, endpoint: &str, backend: Value| {
        json!({"endpoint": endpoint, "type": kind, "modelname": "m", "instance_id": instance,
            "block_size": 4, "dp_rank": 0, "backend_id": backend})
    };
    // The master's endpoint is registered once (its stream is not a row: no engine has that
    // instance id), naming the backends it carries. engine-a and engine-b read pool-a,
    // engine-c reads pool-b, engine-d reads no store.
    post(
        addr,
        "/register",
        reg(
            "mooncake-master",
            "Mooncake",
            &endpoint,
            json!(["pool-a", "pool-b"]),
        ),
    )
    .await;
    for (engine, reads) in [
        ("engine-a", json!("pool-a")),
        ("engine-b", json!(["pool-a"])),
        ("engine-c", json!("pool-b")),
        ("engine-d", Value::Null),
    ] {
        let own = format!("tcp://127.0.0.1:{}", free_port());
        post(addr, "/register", reg(engine, "vLLM", &own, reads)).await;
    }
    eventually("the indexer subscribes to the master", SLOW, async || {
        let (_, s) = http(addr, "GET", "/services", None, &[]).await;
        let up = s["services"].as_array().is_some_and(|l| {
            l.iter().any(|s| {
                s["instance_id"] == "mooncake-master" && s["connection"]["connected"] == true
            })
        });
        up.then_some(()).ok_or(s)
    })
    .await;
    // PUB/SUB: the subscription reaches the PUB socket shortly after the connection.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;

    let h = seq_hashes(&(1..=16).collect::<Vec<u32>>(), 4, DEFAULT_SEED);
    let ev = |id: u64, stored: bool, backend: &'static str, medium: &'static str, hash: u64| {
        ObjectEvent {
            id,
            stored,
            backend,
            tenant: "default",
            medium,
            hash,
        }
    };
    // pool-a's ids 1 and 2, then 4 and 5 (3 never comes in order: a gap, passed over);
    // pool-b's own id 1.
    master
        .publish(&[
            ev(1, true, "pool-a", "cpu", h[0]),
            ev(2, true, "pool-a", "cpu", h[1]),
            ev(1, true, "pool-b", "disk", h[0]),
        ])
        .await;
    master
        .publish(&[
            ev(4, true, "pool-a", "cpu", h[2]),
            ev(5, true, "pool-a", "cpu", h[3]),
        ])
        .await;
    until_rows(
        addr,
        "pool-a's four blocks for engine-a and engine-b, pool-b's one for engine-c only",
        &[
            ("engine-a", [16, 16, 0]),
            ("engine-b", [16, 16, 0]),
            ("engine-c", [4, 0, 4]),
            ("engine-d", [0, 0, 0]),
        ],
    )
    .await;

    let (_, dump) = http(addr, "GET", "/dump", None, &[]).await;
    let stores: Vec<(&Value, usize)> = dump["streams"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["source"] == "mooncake")
        .map(|s| (&s["key"], s["blocks"].as_array().map_or(0, Vec::len)))
        .collect();
    let key = |i: &str| json!(format!("{i}|default|0"));
    assert_eq!(
        stores,
        vec![
            (&key("engine-a"), 4),
            (&key("engine-b"), 4),
            (&key("engine-c"), 1)
        ],
        "{dump}"
    );

    // Id 3 arrives late (going backwards: dropped, or it would remove a live block); a
    // backend nobody registered, and pool-a for a tenant nobody reads it for, reach no one.
    let mut other_tenant = ev(6, true, "pool-a", "cpu", h[0]);
    other_tenant.tenant = "tenant-2";
    master
        .publish(&[
            ev(3, false, "pool-a", "cpu", h[0]),
            ev(1, true, "pool-x", "cpu", h[0]),
            other_tenant,
        ])
        .await;
    let text = eventually("the drops are counted", SLOW, async || {
        let text = metrics(addr).await;
        let tenant = sample(
            &text,
            r#"kvplane_indexer_mooncake_dropped_total{reason="tenant"}"#,
        );
        (tenant == 1.0).then_some(text.clone()).ok_or(text)
    })
    .await;
    let unknown = r#"kvplane_indexer_mooncake_dropped_total{reason="unknown_backend"}"#;
    assert_eq!(sample(&text, unknown), 1.0, "{text}");
    let series = |name: &str, backend: &str| {
        format!(
            r#"kvplane_indexer_backend_{name}_total{{endpoint="{endpoint}",backend="{backend}"}}"#
        )
    };
    assert_eq!(sample(&text, &series("gaps", "pool-a")), 1.0, "{text}");
    assert_eq!(
        sample(&text, &series("duplicates", "pool-a")),
        1.0,
        "{text}"
    );
    assert_eq!(sample(&text, &series("gaps", "pool-b")), 0.0, "{text}");
    until_rows(
        addr,
        "nothing changed",
        &[("engine-a", [16, 16, 0]), ("engine-c", [4, 0, 4])],
    )
    .await;
    let (_, services) = http(addr, "GET", "/services", None, &[]).await;
    let b = backends(&services, "mooncake-master");
    assert_eq!(b["pool-a"]["last_event_id"], 6, "{services}");
    assert_eq!(b["pool-a"]["gaps"], 1, "{services}");
    assert_eq!(b["pool-b"]["last_event_id"], 1, "{services}");

    // pool-a restarts (its ids start again at 1): its blocks leave engine-a and engine-b
    // before the new store applies; pool-b's stay. A malformed event beside it is refused
    // alone.
    let mut bad = Vec::new();
    rmp::encode::write_map_len(&mut bad, 3).unwrap();
    for (k, v) in [("event_id", 2), ("backend_id", 7)] {
        rmp::encode::write_str(&mut bad, k).unwrap();
        rmp::encode::write_uint(&mut bad, v).unwrap();
    }
    rmp::encode::write_str(&mut bad, "event_type").unwrap();
    rmp::encode::write_str(&mut bad, "stored").unwrap();
    master
        .publish_maps(&[event_map(&ev(1, true, "pool-a", "cpu", h[0])), bad])
        .await;
    until_rows(
        addr,
        "pool-a restarted with one block",
        &[
            ("engine-a", [4, 4, 0]),
            ("engine-b", [4, 4, 0]),
            ("engine-c", [4, 0, 4]),
        ],
    )
    .await;
    master.publish(&[ev(2, false, "pool-a", "cpu", h[0])]).await;
    until_rows(
        addr,
        "the master's removal reaches both readers",
        &[
            ("engine-a", [0, 0, 0]),
            ("engine-b", [0, 0, 0]),
            ("engine-c", [4, 0, 4]),
        ],
    )
    .await;
    let text = metrics(addr).await;
    assert_eq!(sample(&text, &series("restarts", "pool-a")), 1.0, "{text}");
    let rejected = r#"kvplane_indexer_events_rejected_total{reason="bad_field"}"#;
    assert_eq!(sample(&text, rejected), 1.0, "{text}");
    kv.stop().await;
}
