//! The indexer's read replicas on the replication core: a replica started after the log
//! dropped its start restores the latest snapshot an earlier replica published, and answers
//! as the ingester, in sync, having applied only the records after the snapshot.

use crate::support::nats::Nats;
use crate::support::vllm_pub::{mp, Publisher};
use crate::support::{eventually, http, within, SLOW};
use kvplane::indexer::{start, IndexerConfig};
use serde_json::{json, Value};
use std::net::SocketAddr;

/// Blocks per stored event, events per publisher message, tokens per block: one record of
/// ~14 KiB in the log, ~3.5 KiB of the index in a snapshot (so that a snapshot fits the 1 MiB
/// its side stream keeps while the log drops its start).
const BLOCKS: u32 = 16;
const EVENTS: u32 = 10;
const BS: u32 = 16;

/// The cluster's indexer, its log bounded to 1 MiB and a snapshot every 100 records.
fn config(nats: &Nats, replica: bool) -> IndexerConfig {
    let mut c = nats.indexer("isnap", replica);
    if let Some(cl) = c.cluster.as_mut() {
        cl.max_bytes = 1 << 20;
        cl.snapshot_records = 100;
    }
    c
}

async fn get(addr: SocketAddr, path: &str) -> Value {
    http(addr, "GET", path, None, &[]).await.1
}

/// Polls `path` until `check` accepts it.
async fn until(addr: SocketAddr, path: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    eventually(what, SLOW, async || {
        let v = get(addr, path).await;
        if check(&v) {
            Ok(v)
        } else {
            Err(v.to_string())
        }
    })
    .await
}

/// One publisher message of `EVENTS` chains of `BLOCKS` blocks, all new.
fn message(n: u32) -> Vec<Vec<u8>> {
    (0..EVENTS)
        .map(|e| {
            let chain = n * EVENTS + e;
            let base = 1_000_000 + chain * BLOCKS * BS;
            let toks: Vec<u32> = (base..base + BLOCKS * BS).collect();
            let hs: Vec<u64> = (0..u64::from(BLOCKS))
                .map(|b| u64::from(chain) << 20 | b)
                .collect();
            mp::stored_map(&hs, None, &toks, BS, "GPU")
        })
        .collect()
}

fn memberships(metrics: &str) -> f64 {
    crate::support::sample(metrics, "kvplane_indexer_memberships")
}

async fn metrics(addr: SocketAddr) -> String {
    crate::support::http::raw_exchange(addr, b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_replica_restores_a_snapshot_after_the_log_dropped_its_start() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let ingester = within("ingester", start(config(&nats, false)))
        .await
        .expect("ingester");
    let early = within("early replica", start(config(&nats, true)))
        .await
        .expect("early replica");
    let mut p = Publisher::start().await;
    let reg = json!({"endpoint": format!("tcp://{}", p.pub_addr),
        "replay_endpoint": format!("tcp://{}", p.replay_addr), "type": "vLLM",
        "modelname": "m", "tenant_id": "default", "instance_id": "vllm-1",
        "block_size": BS, "dp_rank": 0});
    let (status, body) = http(
        ingester.addr,
        "POST",
        "/register",
        Some(&reg.to_string()),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // The subscription is up once a first message arrives whole.
    let per_message = f64::from(EVENTS * BLOCKS);
    let mut sent = 0u32;
    eventually("the ingester subscribed", SLOW, async || {
        p.publish(&message(sent)).await;
        sent += 1;
        memberships(&metrics(ingester.addr).await) >= per_message
    })
    .await;
    for n in sent..sent + 110 {
        p.publish(&message(n)).await;
    }
    sent += 110;
    let snap = until(
        early.addr,
        "/indexer/cluster",
        "the early replica snapshots",
        |v| v["followed"]["snapshots_published"].as_u64() >= Some(1),
    )
    .await;
    assert_eq!(snap["followed"]["in_sync"], true, "{snap}");
    for n in sent..sent + 30 {
        p.publish(&message(n)).await;
    }
    sent += 30;
    let want = f64::from(sent) * per_message;
    eventually("the ingester applied all", SLOW, async || {
        let held = memberships(&metrics(ingester.addr).await);
        if held == want {
            Ok(())
        } else {
            Err(format!("{held} of {want}"))
        }
    })
    .await;

    // A replica starting now cannot read the log from its start any more: it restores the
    // snapshot and reads on from there, in sync, holding what the ingester holds.
    let late = within("late replica", start(config(&nats, true)))
        .await
        .expect("late replica");
    let ready = until(late.addr, "/readyz", "the late replica is ready", |v| {
        v["ready"] == true
    })
    .await;
    assert_eq!(ready["in_sync"], true, "{ready}");
    assert!(ready["restored_snapshot_at"].as_u64() > Some(0), "{ready}");
    let status = get(late.addr, "/indexer/cluster").await;
    assert_eq!(status["service"], "indexer", "{status}");
    assert_eq!(status["role"], "replica", "{status}");
    assert_eq!(status["followed"]["gaps"], 0, "{status}");
    assert!(
        status["followed"]["applied"].as_u64() < Some(60),
        "it applied only the records after the snapshot: {status}"
    );
    assert_eq!(memberships(&metrics(late.addr).await), want);
    let tokens: Vec<u32> = (1_000_000..1_000_000 + BLOCKS * BS).collect();
    let query = json!({"model": "m", "block_size": BS, "token_ids": tokens}).to_string();
    let answer = |addr| {
        let q = query.clone();
        async move { http(addr, "POST", "/query", Some(&q), &[]).await.1 }
    };
    let (at_lead, at_late) = (answer(ingester.addr).await, answer(late.addr).await);
    assert_eq!(at_late, at_lead);
    assert_eq!(
        at_lead["default"]["vllm-1"]["GPU"],
        BLOCKS * BS,
        "{at_lead}"
    );
    // Without the snapshot it could not be in sync: the log no longer starts at record 1.
    let client = async_nats::connect(nats.url.as_str()).await.expect("nats");
    let mut log = async_nats::jetstream::new(client)
        .get_stream("KVPLANE_isnap_indexer")
        .await
        .expect("the indexer's log");
    let first = log.info().await.expect("stream info").state.first_sequence;
    assert!(first > 1, "the log kept its start (first sequence {first})");
    for s in [late, early, ingester] {
        within("stop", s.stop()).await;
    }
}
