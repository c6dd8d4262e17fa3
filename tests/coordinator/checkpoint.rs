//! `--checkpoint-path` through the real binary: a coordinator stopped with SIGTERM (the last
//! checkpoint is written at the clean stop) and started again knows its tracked keys, usage,
//! placements, token ids, blend index and event cursors before any server stores again; one
//! killed with SIGKILL comes back with its last periodic checkpoint; a damaged file is
//! logged and ignored (it starts cold). Real processes, real sockets, real files.

use crate::support::http::http;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

struct Proc {
    child: Child,
    addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

fn start(args: &[&str]) -> Proc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvplane"))
        .arg("coordinator")
        .args(["--host", "127.0.0.1", "--port", "0", "--chunk-size", "16"])
        .args(["--eviction-check-interval", "0", "--enable-blend-lookup"])
        .args(args)
        .env("KVPLANE_COORDINATOR_ENABLE_STARTUP_RESYNC", "0")
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("kvplane starts");
    let stderr = child.stderr.take().expect("stderr piped");
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    let sink = Arc::clone(&log);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line.clone());
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let marker = "MP coordinator listening on http://";
    let addr = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(left).expect("listening within 20 s");
        if let Some(at) = line.find(marker) {
            let a = line[at + marker.len()..].split_whitespace().next().unwrap();
            break a.parse().expect("an address");
        }
    };
    Proc { child, addr, log }
}

impl Proc {
    fn logged(&self, text: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(text))
    }

    fn signal(mut self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(ok.success());
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(exit) = self.child.try_wait().expect("wait") {
                if sig == "-TERM" {
                    assert!(exit.success(), "{exit:?}");
                }
                return;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("no exit within 15 s of {sig}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
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

    let c = start(&args);
    assert!(c.logged("no checkpoint at"));
    for body in recorded_events() {
        let (status, _) = http(c.addr, "POST", "/events", Some(&body.to_string()), &[]).await;
        assert_eq!(status, 200);
    }
    let (s, _) = http(
        c.addr,
        "PUT",
        "/quota/user-a",
        Some(r#"{"limit_gb": 1}"#),
        &[],
    )
    .await;
    assert_eq!(s, 200);
    let before = state(c.addr).await;
    assert_eq!(before["/directory/stats"]["num_keys"], 6);
    assert!(before["/quota"]["total_gb"].as_f64().unwrap() > 0.0);
    c.signal("-TERM");
    assert!(ckpt.exists(), "written at the clean stop");

    let c = start(&args);
    assert!(c.logged("restored the checkpoint"));
    assert_eq!(
        state(c.addr).await,
        before,
        "nothing re-stored, nothing lost"
    );
    // The event cursors came back: mp-a's last batch is a duplicate, the next one applies.
    let last = recorded_events()[3]["batches"][4].clone();
    let again = json!({ "batches": [last] });
    let (_, r) = http(c.addr, "POST", "/events", Some(&again.to_string()), &[]).await;
    assert_eq!(r, json!({"applied": 0, "duplicates": 1, "stale": 0}));
    let (_, metrics) = http(c.addr, "GET", "/metrics", None, &[]).await;
    let metrics = metrics.as_str().unwrap().to_owned();
    assert!(
        metrics.lines().any(
            |l| l.starts_with("kvplane_coordinator_checkpoint_restored_keys ")
                && !l.ends_with(" 0")
        ),
        "{metrics}"
    );
    c.signal("-TERM");

    // A damaged file: logged, ignored, started cold.
    let mut bytes = std::fs::read(&ckpt).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 0xff;
    std::fs::write(&ckpt, &bytes).unwrap();
    let c = start(&args);
    assert!(
        c.logged("ignoring the checkpoint"),
        "{:?}",
        c.log.lock().unwrap()
    );
    let (_, st) = http(c.addr, "GET", "/directory/stats", None, &[]).await;
    assert_eq!(st["num_keys"], 0);
    c.signal("-TERM");
    // An LMCache checkpoint (its magic) is named as such, and ignored.
    std::fs::write(&ckpt, b"LMCKPT\0\0\x01\0\0\0\x80").unwrap();
    let c = start(&args);
    assert!(c.logged("an LMCache coordinator checkpoint"));
    c.signal("-TERM");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_killed_coordinator_comes_back_with_its_last_periodic_checkpoint() {
    let dir = scratch("periodic");
    let ckpt = dir.join("c.ckpt");
    let path = ckpt.to_str().unwrap().to_owned();
    let args = ["--checkpoint-path", &path, "--checkpoint-interval", "0.2"];
    let c = start(&args);
    for body in recorded_events() {
        http(c.addr, "POST", "/events", Some(&body.to_string()), &[]).await;
    }
    let before = state(c.addr).await;
    let written = || async {
        let (_, m) = http(c.addr, "GET", "/metrics", None, &[]).await;
        m.as_str()
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("kvplane_coordinator_checkpoints_written_total "))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // Two more writes: the second one was captured after the events.
    let n0 = written().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if written().await >= n0 + 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no periodic checkpoint within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.signal("-KILL");
    let c = start(&args);
    assert_eq!(state(c.addr).await, before);
    c.signal("-TERM");
    std::fs::remove_dir_all(&dir).unwrap();
}
