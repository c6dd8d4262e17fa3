//! `--checkpoint-path` through the real binary: a coordinator stopped with SIGTERM (the last
//! checkpoint is written at the clean stop) and started again knows its tracked keys, usage,
//! placements, token ids, blend index and event cursors before any server stores again; one
//! killed with SIGKILL comes back with its last periodic checkpoint; a damaged file is
//! logged and ignored (it starts cold). Real processes, real sockets, real files.

use crate::support::http::http;
use crate::support::process::{Launch, Process};
use crate::support::{eventually, STEP};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// A `kvplane coordinator` with blend lookups, no eviction loop and `args`, once it listens.
async fn start(args: &[&str]) -> (Process, SocketAddr) {
    let c = Launch::kvplane("coordinator")
        .args(["--host", "127.0.0.1", "--port", "0", "--chunk-size", "16"])
        .args(["--eviction-check-interval", "0", "--enable-blend-lookup"])
        .args(args)
        .env("KVPLANE_COORDINATOR_ENABLE_STARTUP_RESYNC", "0")
        .spawn();
    let addr = c
        .listening("MP coordinator listening on")
        .await
        .addr("http");
    (c, addr)
}

fn recorded_events() -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/conformance/lmcache-0.5.6-coordinator/directory_exchanges.json");
    let all: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    all.into_iter()
        .take_while(|x| x["path"] == "/events")
        .map(|x| x["body"].clone())
        .collect()
}

/// Everything a restart must keep, as the routes show it.
async fn state(addr: SocketAddr) -> Value {
    let mut out = serde_json::Map::new();
    for path in [
        "/directory/keys",
        "/directory/stats",
        "/quota",
        "/instances/usage",
    ] {
        let (status, body) = http(addr, "GET", path, None, &[]).await;
        assert_eq!(status, 200, "{path}");
        out.insert(path.into(), body);
    }
    let blend = json!({"tokens_b64": "", "model_name": "m"});
    let (_, b) = http(
        addr,
        "POST",
        "/directory/blend-lookup",
        Some(&blend.to_string()),
        &[],
    )
    .await;
    out.insert("blend".into(), b);
    Value::Object(out)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvplane-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn a_restarted_coordinator_knows_what_it_knew() {
    let dir = scratch("restart");
    let ckpt = dir.join("coordinator.ckpt");
    let path = ckpt.to_str().unwrap().to_owned();
    let args = ["--checkpoint-path", &path, "--checkpoint-interval", "0"];

    let (mut c, addr) = start(&args).await;
    assert!(c.logged("no checkpoint at"));
    for body in recorded_events() {
        let (status, _) = http(addr, "POST", "/events", Some(&body.to_string()), &[]).await;
        assert_eq!(status, 200);
    }
    let (s, _) = http(
        addr,
        "PUT",
        "/quota/user-a",
        Some(r#"{"limit_gb": 1}"#),
        &[],
    )
    .await;
    assert_eq!(s, 200);
    let before = state(addr).await;
    assert_eq!(before["/directory/stats"]["num_keys"], 6);
    assert!(before["/quota"]["total_gb"].as_f64().unwrap() > 0.0);
    c.stop().await;
    assert!(ckpt.exists(), "written at the clean stop");

    let (mut c, addr) = start(&args).await;
    assert!(c.logged("restored the checkpoint"));
    assert_eq!(state(addr).await, before, "nothing re-stored, nothing lost");
    // The event cursors came back: mp-a's last batch is a duplicate, the next one applies.
    let last = recorded_events()[3]["batches"][4].clone();
    let again = json!({ "batches": [last] });
    let (_, r) = http(addr, "POST", "/events", Some(&again.to_string()), &[]).await;
    assert_eq!(r, json!({"applied": 0, "duplicates": 1, "stale": 0}));
    let (_, metrics) = http(addr, "GET", "/metrics", None, &[]).await;
    let metrics = metrics.as_str().unwrap().to_owned();
    assert!(
        metrics.lines().any(
            |l| l.starts_with("kvplane_coordinator_checkpoint_restored_keys ")
                && !l.ends_with(" 0")
        ),
        "{metrics}"
    );
    c.stop().await;

    // A damaged file: logged, ignored, started cold.
    let mut bytes = std::fs::read(&ckpt).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 0xff;
    std::fs::write(&ckpt, &bytes).unwrap();
    let (mut c, addr) = start(&args).await;
    assert!(c.logged("ignoring the checkpoint"), "{}", c.log());
    let (_, st) = http(addr, "GET", "/directory/stats", None, &[]).await;
    assert_eq!(st["num_keys"], 0);
    c.stop().await;
    // An LMCache checkpoint (its magic) is named as such, and ignored.
    std::fs::write(&ckpt, b"LMCKPT\0\0\x01\0\0\0\x80").unwrap();
    let (mut c, _) = start(&args).await;
    assert!(c.logged("an LMCache coordinator checkpoint"));
    c.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_killed_coordinator_comes_back_with_its_last_periodic_checkpoint() {
    let dir = scratch("periodic");
    let ckpt = dir.join("c.ckpt");
    let path = ckpt.to_str().unwrap().to_owned();
    let args = ["--checkpoint-path", &path, "--checkpoint-interval", "0.2"];
    let (mut c, addr) = start(&args).await;
    for body in recorded_events() {
        http(addr, "POST", "/events", Some(&body.to_string()), &[]).await;
    }
    let before = state(addr).await;
    let written = || async {
        let (_, m) = http(addr, "GET", "/metrics", None, &[]).await;
        m.as_str()
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("kvplane_coordinator_checkpoints_written_total "))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // Two more writes: the second one was captured after the events.
    let n0 = written().await;
    eventually("two more periodic checkpoints", STEP, async || {
        written().await >= n0 + 2
    })
    .await;
    c.kill().await;
    let (mut c, addr) = start(&args).await;
    assert_eq!(state(addr).await, before);
    c.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
}
