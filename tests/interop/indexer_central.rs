//! The central topology (issue 24, part 1) with vLLM's real publishers (0.23 and 0.33, the
//! environments of `KVPLANE_VLLM_PUBLISHERS`; see `indexer_vllm.rs`): the indexer binds one
//! SUB socket (`--bind`), and four `ZmqEventPublisher` processes, configured as llm-d's pods
//! are (a concrete host in `endpoint`, so vLLM connects its PUB instead of binding, and the
//! topic `kv@<address>@<model>`), connect to it.
//!
//! Checked: the topics make four distinct instances (two registered on first sight, one
//! adopting an explicit `/register`, one registered before the indexer ran); stores, the
//! removal and `AllBlocksCleared` reach `/query`; a publisher that published its history
//! before the indexer bound has it replayed through its registered replay endpoint (the
//! fourth block indexes only as a child of the replayed three); a second process on the same
//! topic is detected as a restart. One publisher names its medium `NPU`: its blocks are kept
//! and reported under that name, never as GPU.

use crate::indexer_vllm::publisher_dirs;
use crate::support::process::{Launch, Process};
use crate::support::{eventually, free_port, http, within, SLOW, STEP};
use kvplane::indexer::CentralConfig;
use kvplane::indexer::{start, IndexerConfig};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;

/// Starts `pub_demo.py` connecting to `sub_port` with `topic`, replay ROUTER on
/// `replay_port`.
fn launch(dir: &Path, sub_port: u16, replay_port: u16, topic: &str, extra: &[&str]) -> Process {
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/vllm-publisher");
    Launch::python(
        "vLLM's publisher",
        dir.join("venv/bin/python"),
        tools.join("pub_demo.py"),
    )
    // A concrete host: vLLM connects its PUB to the indexer's bound SUB socket.
    .args(["--endpoint", &format!("tcp://127.0.0.1:{sub_port}")])
    .args(["--replay", &format!("tcp://127.0.0.1:{replay_port}")])
    .args(["--topic", topic, "--block-size", "4", "--hash", "vllm-int"])
    .args(extra.iter().copied())
    .env("PYTHONPATH", dir.join("shim"))
    .spawn()
}

async fn post(addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    http(addr, "POST", path, Some(&body.to_string()), &[]).await
}

/// Waits until every instance's row passes `check`; returns the rows.
async fn until_rows(addr: SocketAddr, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let query = json!({"model": "m", "block_size": 4, "token_ids": (1..=16).collect::<Vec<u32>>()});
    eventually(what, SLOW, async || {
        let (_, body) = post(addr, "/query", query.clone()).await;
        if check(&body["default"]) {
            Ok(body["default"].clone())
        } else {
            Err(body)
        }
    })
    .await
}

fn connection<'a>(services: &'a Value, instance: &str) -> &'a Value {
    services["services"]
        .as_array()
        .and_then(|l| l.iter().find(|s| s["instance_id"] == json!(instance)))
        .map_or(&Value::Null, |s| &s["connection"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_vllm_publishers_connect_to_one_bound_socket() {
    let Some(dirs) = publisher_dirs() else {
        return;
    };
    let (old, new) = (&dirs[0], dirs.last().expect("a publisher environment"));
    let sub_port = free_port();
    let replays: Vec<u16> = (0..4).map(|_| free_port()).collect();
    // The fourth publisher runs before the indexer binds: its three batches go nowhere, and
    // a fourth (a child of the third block) follows a few seconds later.
    let late = launch(
        new,
        sub_port,
        replays[3],
        "kv@10.0.0.4:8000@m",
        &["--linger", "60", "--extra-after", "6"],
    );
    late.wait_for_line("published 3 batches").await;
    let config = IndexerConfig {
        central: CentralConfig {
            binds: vec![format!("tcp://127.0.0.1:{sub_port}")],
            block_size: 4,
            ..CentralConfig::default()
        },
        ..IndexerConfig::default()
    };
    let server = within("indexer", start(config)).await.expect("start");
    let addr = server.addr;
    assert_eq!(server.binds.len(), 1);
    // Explicit registrations: one for a publisher not yet started, one for the late one
    // (with the replay endpoint that recovers its history).
    for (i, instance) in [(2usize, "vllm-3"), (3, "vllm-4")] {
        let reg = json!({"endpoint": format!("tcp://10.0.0.{}:8000", i + 1),
            "replay_endpoint": format!("tcp://127.0.0.1:{}", replays[i]), "type": "vLLM",
            "modelname": "m", "instance_id": instance, "block_size": 4, "dp_rank": 0});
        assert_eq!(post(addr, "/register", reg).await.0, 200);
    }
    let mut engines = Vec::new();
    for (i, replay) in replays.iter().take(3).enumerate() {
        let dir = if i % 2 == 0 { old } else { new };
        let topic = format!("kv@10.0.0.{}:8000@m", i + 1);
        let medium = if i == 1 { "NPU" } else { "GPU" };
        engines.push(launch(
            dir,
            sub_port,
            *replay,
            &topic,
            &["--linger", "8", "--medium", medium],
        ));
    }
    for e in &engines {
        e.wait_for_line("published 3 batches").await;
    }
    // Three blocks stored, the fourth removed: 12 tokens on each GPU; the late publisher's
    // fourth block only through its replayed history.
    let rows = until_rows(addr, "four instances by topic", |rows| {
        ["10.0.0.1:8000", "vllm-3"]
            .iter()
            .all(|i| rows[i]["GPU"] == json!(12))
            && rows["10.0.0.2:8000"]["NPU"] == json!(12)
            && rows["vllm-4"]["GPU"] == json!(16)
    })
    .await;
    assert_eq!(rows.as_object().map(|o| o.len()), Some(4), "{rows}");
    assert_eq!(
        rows["10.0.0.2:8000"],
        json!({"longest_matched": 12, "GPU": 0, "CPU": 0, "DISK": 0, "NPU": 12, "DP": {"0": 12}})
    );
    let (_, services) = http(addr, "GET", "/services", None, &[]).await;
    let late_conn = connection(&services, "vllm-4");
    assert!(late_conn["replays"].as_u64() >= Some(1), "{services}");
    assert_eq!(late_conn["bound"], json!(true), "{services}");
    assert_eq!(late_conn["last_seq"], json!(3), "{services}");
    // After their linger the three clear their GPU tier (AllBlocksCleared names no other
    // medium) and exit: the NPU blocks stay.
    let rows = until_rows(addr, "AllBlocksCleared", |rows| {
        ["10.0.0.1:8000", "vllm-3"]
            .iter()
            .all(|i| rows[i]["GPU"] == json!(0))
    })
    .await;
    assert_eq!(rows["10.0.0.2:8000"]["NPU"], json!(12), "{rows}");
    for e in &mut engines {
        let _ = e.exit_within(STEP).await;
    }
    // A new process on the first topic numbers from 0 again: a restart, applied.
    let again = launch(
        old,
        sub_port,
        replays[0],
        "kv@10.0.0.1:8000@m",
        &["--linger", "30"],
    );
    again.wait_for_line("published 3 batches").await;
    until_rows(addr, "the restarted publisher's events", |rows| {
        rows["10.0.0.1:8000"]["GPU"] == json!(12)
    })
    .await;
    let (_, services) = http(addr, "GET", "/services", None, &[]).await;
    let first = connection(&services, "10.0.0.1:8000");
    assert!(first["restarts"].as_u64() >= Some(1), "{services}");
    let (_, metrics) = http(addr, "GET", "/metrics", None, &[]).await;
    let text = metrics.as_str().unwrap_or_default().to_owned();
    assert!(
        text.contains("kvplane_indexer_topic_refused_total{reason=\"no_match\"} 0"),
        "{text}"
    );
    drop((again, late));
    within("stop", server.stop()).await;
}
