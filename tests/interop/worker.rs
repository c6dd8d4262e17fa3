//! The kvplane worker library against the REAL LMCache 0.5.6 controller
//! (`python -m lmcache.v1.api_server` through tests/interop/run_lmcache_controller.py, CPU
//! only, stand-in torch). Loopback only; the Python process is killed on drop.
//!
//! Checks: registration (and LMCache's start-up full sync, which it asks of every worker on its
//! first heartbeat), admits visible in `GET /controller/key-stats`, a P2P lookup from a second
//! kvplane worker finding the first, `POST /clear` and `POST /health` reaching the worker's
//! handler through LMCache's REQ socket, and a controller restart rebuilt by a full sync.

use crate::support::lmcache::python;
use crate::support::process::{Launch, Process};
use crate::support::{eventually, free_port, SLOW};
use kvplane::protocol::{ChunkHash, ClearWorkerMsg, HealthWorkerMsg};
use kvplane::worker::*;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const CPU: &str = LOCAL_CPU_BACKEND;

/// [`crate::support::http`] to `127.0.0.1:port` with an optional JSON body.
async fn http(port: u16, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let body = body.map(Value::to_string);
    crate::support::http(
        crate::support::loopback(port),
        method,
        path,
        body.as_deref(),
        &[],
    )
    .await
}

/// Is anything answering HTTP on `port` yet?
async fn http_up(port: u16) -> bool {
    let probe = crate::support::try_http(
        crate::support::loopback(port),
        "GET",
        "/controller/key-stats",
        None,
        &[],
    );
    matches!(
        tokio::time::timeout(Duration::from_secs(2), probe).await,
        Ok(Ok((200, _)))
    )
}

/// The real LMCache controller on fixed loopback ports.
struct LmcacheController {
    process: Process,
    http: u16,
    pull: u16,
    reply: u16,
    heartbeat: u16,
}

impl LmcacheController {
    async fn start() -> Self {
        let (http, pull, reply, heartbeat) = (free_port(), free_port(), free_port(), free_port());
        Self::start_on(http, pull, reply, heartbeat).await
    }

    async fn start_on(http: u16, pull: u16, reply: u16, heartbeat: u16) -> Self {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/interop/run_lmcache_controller.py");
        let ports = json!({"pull": pull, "reply": reply, "heartbeat": heartbeat}).to_string();
        let mut process = Launch::python("the LMCache controller", python(), script)
            .args(["--host", "127.0.0.1", "--port", &http.to_string()])
            .args(["--monitor-ports", &ports])
            .spawn();
        eventually("the LMCache controller answers HTTP", SLOW, async || {
            if let Some(status) = process.try_exit() {
                panic!(
                    "LMCache controller exited ({status}):\n{}",
                    process.tail(40)
                );
            }
            http_up(http).await
        })
        .await;
        eprintln!(
            "real LMCache 0.5.6 controller up (http {http}, pull {pull}, reply {reply}, heartbeat {heartbeat})"
        );
        LmcacheController {
            process,
            http,
            pull,
            reply,
            heartbeat,
        }
    }

    async fn stop(mut self) {
        self.process.kill().await;
    }

    /// `key_count` of `instance` in `/controller/key-stats`.
    async fn keys_of(&self, instance: &str) -> Option<u64> {
        let (status, stats) = http(self.http, "GET", "/controller/key-stats", None).await;
        assert_eq!(status, 200, "{stats}");
        stats["instances"]
            .as_array()?
            .iter()
            .find(|i| i["instance_id"] == instance)
            .and_then(|i| i["key_count"].as_u64())
    }

    /// Polls until `instance` has `n` keys.
    async fn wait_keys(&self, instance: &str, n: u64) {
        let what = format!("{n} keys of {instance} in LMCache");
        eventually(&what, SLOW, async || {
            let got = self.keys_of(instance).await;
            if got == Some(n) {
                Ok(())
            } else {
                Err(format!("{got:?}; its log:\n{}", self.process.tail(40)))
            }
        })
        .await;
    }
}

/// Records the commands LMCache sends.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<String>>,
}

impl CommandHandler for Recorder {
    async fn clear(&self, req: ClearWorkerMsg) -> CommandResult<i64> {
        self.calls
            .lock()
            .expect("lock")
            .push(format!("clear {}", req.location));
        Ok(7)
    }
    async fn health(&self, req: HealthWorkerMsg) -> CommandResult<i64> {
        self.calls
            .lock()
            .expect("lock")
            .push(format!("health {}", req.worker_event_id));
        Ok(0)
    }
}

fn config(c: &LmcacheController, instance: &str, peer: Option<String>) -> WorkerConfig {
    let mut cfg = WorkerConfig::new(
        instance,
        0,
        format!("127.0.0.1:{}", c.pull),
        format!("127.0.0.1:{}", c.reply),
    );
    cfg.command_host = "127.0.0.1".into();
    cfg.peer_init_url = peer;
    cfg.heartbeat_interval = Some(Duration::from_millis(500));
    cfg.heartbeat_delay = Duration::from_millis(300);
    cfg.request_timeout = Duration::from_secs(3);
    cfg.retry_backoff = Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(1),
    };
    cfg.full_sync.startup_delay = Duration::from_millis(200);
    cfg.full_sync.poll_interval = Duration::from_millis(300);
    cfg.full_sync.retry_delay = Duration::from_millis(300);
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kvplane_workers_work_with_the_real_lmcache_controller() {
    // Worker logs in the test output with e.g. RUST_LOG=kvplane::worker=info.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let controller = LmcacheController::start().await;
    let peer_a = format!("127.0.0.1:{}", free_port());
    let recorder = Arc::new(Recorder::default());
    let (keys_a, keys_b) = (MemoryKeys::new(), MemoryKeys::new());
    let a = tokio::time::timeout(
        SLOW,
        Worker::start(
            config(&controller, "inst-A", Some(peer_a.clone())),
            Arc::clone(&recorder),
            keys_a.clone(),
        ),
    )
    .await
    .expect("start in time")
    .expect("worker A starts");
    let b = tokio::time::timeout(
        SLOW,
        Worker::start(config(&controller, "inst-B", None), NoCommands, keys_b),
    )
    .await
    .expect("start in time")
    .expect("worker B starts");

    // Registration, then LMCache's start-up full sync (need_full_sync_all) on the first beat.
    for w in [&a, &b] {
        tokio::time::timeout(SLOW, w.wait_ready(SLOW))
            .await
            .expect("bounded")
            .expect("registered");
        eventually("LMCache's start-up full sync done", SLOW, async || {
            let s = w.status();
            s.full_syncs_completed >= 1 && s.state == WorkerState::Ready
        })
        .await;
    }
    eprintln!("A after start-up sync: {:?}", a.status());
    let (status, workers) = http(
        controller.http,
        "GET",
        "/controller/workers?instance_id=inst-A",
        None,
    )
    .await;
    assert_eq!(status, 200, "{workers}");
    let info = &workers["workers"][0];
    assert_eq!(info["ip"], "127.0.0.1", "{workers}");
    assert_eq!(info["port"], json!(a.command_addr().port()), "{workers}");
    assert_eq!(info["peer_init_url"], json!(peer_a), "{workers}");

    // Admits show up in LMCache's key stats (hashes across i64 ∪ u64).
    let held: Vec<ChunkHash> = vec![
        101_i64.into(),
        102_i64.into(),
        103_i64.into(),
        (-7_i64).into(),
        u64::MAX.into(),
    ];
    for &h in &held {
        keys_a.admit(CPU, h);
        a.admit(CPU, h).expect("queued");
    }
    controller.wait_keys("inst-A", 5).await;
    let (_, stats) = http(controller.http, "GET", "/controller/key-stats", None).await;
    eprintln!("LMCache /controller/key-stats: {stats}");

    // B finds A's prefix through LMCache's P2P lookup.
    let probe: Vec<ChunkHash> = vec![
        101_i64.into(),
        102_i64.into(),
        103_i64.into(),
        999_i64.into(),
    ];
    let hit = tokio::time::timeout(SLOW, b.p2p_lookup(&probe))
        .await
        .expect("bounded")
        .expect("answered");
    eprintln!("B's P2P lookup of [101, 102, 103, 999]: {hit:?}");
    assert_eq!(
        hit,
        Some(PeerHit {
            instance_id: "inst-A".into(),
            location: CPU.into(),
            num_hit_chunks: 3,
            peer_init_url: peer_a.clone(),
        })
    );
    let own = tokio::time::timeout(SLOW, a.p2p_lookup(&probe[..1]))
        .await
        .expect("bounded")
        .expect("answered");
    assert_eq!(own, None, "LMCache skips the requester's own instance");

    // LMCache's HTTP API reaches A's handler through its REQ socket.
    let (status, body) = http(
        controller.http,
        "POST",
        "/clear",
        Some(&json!({"instance_id": "inst-A", "location": CPU})),
    )
    .await;
    eprintln!("POST /clear -> {status} {body}");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["num_tokens"], 7, "{body}");
    let (status, body) = http(
        controller.http,
        "POST",
        "/health",
        Some(&json!({"instance_id": "inst-A"})),
    )
    .await;
    eprintln!("POST /health -> {status} {body}");
    assert_eq!(
        (status, &body["error_codes"]),
        (200, &json!({"0": 0})),
        "{body}"
    );
    let calls = recorder.calls.lock().expect("lock").clone();
    assert_eq!(
        calls.first().map(String::as_str),
        Some("clear LocalCPUBackend")
    );
    assert!(
        calls.get(1).is_some_and(|c| c.starts_with("health ")),
        "{calls:?}"
    );

    // Restart LMCache on the same ports: it knows nothing; the heartbeat re-registers A and
    // the full sync it asks for rebuilds A's keys.
    let (http_port, pull, reply, heartbeat) = (
        controller.http,
        controller.pull,
        controller.reply,
        controller.heartbeat,
    );
    controller.stop().await;
    let controller = LmcacheController::start_on(http_port, pull, reply, heartbeat).await;
    controller.wait_keys("inst-A", 5).await;
    eventually("A's resync complete", SLOW, async || {
        let s = a.status();
        s.full_syncs_completed >= 2 && s.state == WorkerState::Ready
    })
    .await;
    eprintln!("A after the LMCache restart: {:?}", a.status());
    controller.wait_keys("inst-A", 5).await;

    for w in [a, b] {
        tokio::time::timeout(SLOW, w.shutdown())
            .await
            .expect("bounded")
            .expect("shutdown");
    }
    eventually("A deregistered", SLOW, async || {
        controller.keys_of("inst-A").await.is_none()
    })
    .await;
    controller.stop().await;
}
