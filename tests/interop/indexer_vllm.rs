//! vLLM's real KV-event publisher (`ZmqEventPublisher` from the vLLM wheel, run without a GPU
//! through `scripts/vllm-publisher/`) feeding a real `kvplane indexer`.
//!
//! Needs the publisher environments listed in `KVPLANE_VLLM_PUBLISHERS` (colon-separated
//! directories, printed by `scripts/setup-vllm-publishers.sh`, which builds them);
//! `scripts/test.sh` sets it, `scripts/vllm-publisher.sh` builds them and runs only this test.
//! Without the variable the test FAILS with these instructions, unless `KVPLANE_SKIP_VLLM=1`
//! says on purpose that it is skipped.
//!
//! For each version: the publisher sends its batches before kvplane subscribes (recovered by
//! replay), engine hashes are vLLM's sha256_cbor (so blocks must be recomputed from tokens), a
//! removal and then `AllBlocksCleared` change the answers, and a second publisher process on
//! the same ports is detected as a restart.

use crate::support::process::{Launch, Process};
use crate::support::{eventually, free_port, http, within, SLOW, STEP};
use kvplane::indexer::{start, IndexerConfig};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Starts `pub_demo.py` and waits until it has published its three batches.
async fn publisher(dir: &Path, pub_port: u16, replay_port: u16, linger: &str) -> Process {
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/vllm-publisher");
    let engine = Launch::python(
        "vLLM's publisher",
        dir.join("venv/bin/python"),
        tools.join("pub_demo.py"),
    )
    // vLLM's PUB binds only when the endpoint has `*`; we connect to it on 127.0.0.1.
    .args(["--endpoint", &format!("tcp://*:{pub_port}")])
    .args(["--replay", &format!("tcp://127.0.0.1:{replay_port}")])
    .args([
        "--topic",
        "kv@pod1@m",
        "--block-size",
        "4",
        "--hash",
        "vllm-int",
    ])
    .args(["--linger", linger])
    .env("PYTHONPATH", dir.join("shim"))
    .spawn();
    engine.wait_for_line("published 3 batches").await;
    engine
}

async fn post(addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    http(addr, "POST", path, Some(&body.to_string()), &[]).await
}

async fn until_row(addr: SocketAddr, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let query = json!({"model": "m", "block_size": 4, "token_ids": (1..=16).collect::<Vec<u32>>()});
    eventually(what, SLOW, async || {
        let (_, body) = post(addr, "/query", query.clone()).await;
        let row = body["default"]["vllm-1"].clone();
        if check(&row) {
            Ok(row)
        } else {
            Err(body)
        }
    })
    .await
}

async fn one_version(dir: &Path) {
    let (pub_port, replay_port) = (free_port(), free_port());
    let server = within("indexer", start(IndexerConfig::default()))
        .await
        .expect("start");
    let addr = server.addr;
    let first = publisher(dir, pub_port, replay_port, "4").await;
    // Registered after the events were sent: only the replay recovers them.
    let reg = json!({"endpoint": format!("tcp://127.0.0.1:{pub_port}"),
        "replay_endpoint": format!("tcp://127.0.0.1:{replay_port}"), "type": "vLLM",
        "modelname": "m", "instance_id": "vllm-1", "block_size": 4, "dp_rank": 0});
    assert_eq!(post(addr, "/register", reg).await.0, 200);
    let row = until_row(addr, "replayed stores and removal", |r| {
        r["GPU"] == json!(12)
    })
    .await;
    assert_eq!(
        row,
        json!({"longest_matched": 12, "GPU": 12, "CPU": 0, "DISK": 0, "DP": {"0": 12}})
    );
    // After its linger the publisher clears everything and exits.
    until_row(addr, "AllBlocksCleared", |r| r["GPU"] == json!(0)).await;
    let mut first = first;
    let _ = first.exit_within(STEP).await;
    // A new engine process on the same ports: a restart, detected and applied.
    let _second = publisher(dir, pub_port, replay_port, "30").await;
    until_row(addr, "events of the restarted publisher", |r| {
        r["GPU"] == json!(12)
    })
    .await;
    let (_, services) = http(addr, "GET", "/services", None, &[]).await;
    let conn = &services["services"][0]["connection"];
    assert!(conn["restarts"].as_u64() >= Some(1), "{services}");
    assert!(conn["replays"].as_u64() >= Some(2), "{services}");
    within("stop", server.stop()).await;
}

/// The publisher environments of `KVPLANE_VLLM_PUBLISHERS`, checked; `None` when
/// `KVPLANE_SKIP_VLLM=1` says on purpose that the test is skipped.
pub(crate) fn publisher_dirs() -> Option<Vec<PathBuf>> {
    let list = match std::env::var("KVPLANE_VLLM_PUBLISHERS") {
        Ok(list) => list,
        Err(_) if std::env::var("KVPLANE_SKIP_VLLM").as_deref() == Ok("1") => {
            eprintln!("KVPLANE_SKIP_VLLM=1: the real vLLM publisher test is skipped");
            return None;
        }
        Err(_) => panic!(
            "KVPLANE_VLLM_PUBLISHERS is not set, so vLLM's real publisher cannot run. Build the \
             environments and run with: \
             KVPLANE_VLLM_PUBLISHERS=\"$(bash scripts/setup-vllm-publishers.sh)\" cargo test \
             --test interop indexer_vllm:: (scripts/vllm-publisher.sh does both; scripts/test.sh sets it), \
             or set KVPLANE_SKIP_VLLM=1 to skip this test on purpose"
        ),
    };
    let dirs: Vec<PathBuf> = list
        .split(':')
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .collect();
    assert!(
        !dirs.is_empty(),
        "KVPLANE_VLLM_PUBLISHERS lists no directory"
    );
    for dir in &dirs {
        assert!(
            dir.join("venv/bin/python").is_file() && dir.join("shim/vllm").is_dir(),
            "{} is not a publisher environment (rebuild with scripts/setup-vllm-publishers.sh)",
            dir.display()
        );
    }
    Some(dirs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_vllm_publishers_feed_the_indexer() {
    let Some(dirs) = publisher_dirs() else {
        return;
    };
    for dir in &dirs {
        eprintln!("vLLM publisher in {}", dir.display());
        one_version(dir).await;
    }
}

/// `--cluster` (issue 13's replica test): vLLM's real publisher (the newest version listed)
/// feeds one ingester; two read replicas on a real nats-server answer `/query` exactly as the
/// ingester, through the replayed stores, the removal and the clear, and say they are caught
/// up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_vllm_publisher_feeds_two_read_replicas() {
    use crate::support::nats::Nats;
    let Some(dirs) = publisher_dirs() else {
        return;
    };
    let Some(nats) = Nats::start().await else {
        return;
    };
    let dir = dirs.last().expect("a publisher environment");
    let config = |replica| nats.indexer("vllm", replica);
    let ingester = within("ingester", start(config(false)))
        .await
        .expect("ingester");
    let mut replicas = Vec::new();
    for _ in 0..2 {
        replicas.push(
            within("replica", start(config(true)))
                .await
                .expect("replica"),
        );
    }
    let (pub_port, replay_port) = (free_port(), free_port());
    let mut engine = publisher(dir, pub_port, replay_port, "4").await;
    let reg = json!({"endpoint": format!("tcp://127.0.0.1:{pub_port}"),
        "replay_endpoint": format!("tcp://127.0.0.1:{replay_port}"), "type": "vLLM",
        "modelname": "m", "instance_id": "vllm-1", "block_size": 4, "dp_rank": 0});
    assert_eq!(post(ingester.addr, "/register", reg).await.0, 200);
    let lead = until_row(
        ingester.addr,
        "ingester: replayed stores and removal",
        |r| r["GPU"] == json!(12),
    )
    .await;
    for r in &replicas {
        let row = until_row(r.addr, "replica: the ingester's answer", |row| *row == lead).await;
        assert_eq!(row, lead);
    }
    // The publisher clears everything after its linger; the replicas follow.
    until_row(ingester.addr, "ingester: AllBlocksCleared", |r| {
        r["GPU"] == json!(0)
    })
    .await;
    for r in &replicas {
        until_row(r.addr, "replica: AllBlocksCleared", |r| {
            r["GPU"] == json!(0)
        })
        .await;
        let (status, ready) = http(r.addr, "GET", "/readyz", None, &[]).await;
        assert_eq!(status, 200, "{ready}");
        assert_eq!(ready["in_sync"], json!(true), "{ready}");
    }
    let _ = engine.exit_within(STEP).await;
    for r in replicas {
        within("stop", r.stop()).await;
    }
    within("stop", ingester.stop()).await;
}
