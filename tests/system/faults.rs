//! Fault injection, loopback only, every wait bounded; each test checks that nothing a worker
//! told the controller is lost (or, for a dead worker, that exactly its state is gone):
//!
//! * a worker killed without deregistering is probed and removed; its chunks vanish;
//! * kvplane killed with SIGKILL and restarted: kvplane and real LMCache 0.5.6 workers
//!   re-register and full-sync, and the index equals their key sets again;
//! * a worker that stops answering its downlink: HTTP commands to it are 504 in time, others 200.
//!
//! The flood, hostile-peer and churn tests are in `faults_abuse.rs`, with the helpers here:
//! HTTP reads, metrics, in-process workers, and the real binary as a child on free loopback
//! ports with `KVPLANE_*` variables, for the tests that need the process boundary (SIGKILL,
//! fd/task counts).

use crate::support::lmcache::{worker_args, LmcacheWorker};
use crate::support::process::Process;
use crate::support::*;
use kvplane::controller::liveness::{sweep, SweepStats};
use kvplane::protocol::*;
use kvplane::worker::{
    MemoryKeys, NoCommands, Worker, WorkerConfig, WorkerHandle, WorkerState, LOCAL_CPU_BACKEND,
};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub(crate) const CPU: &str = LOCAL_CPU_BACKEND;

pub(crate) fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

// ---------------------------------------------------------------------------------------------
// Helpers: HTTP reads, metrics, workers.
// ---------------------------------------------------------------------------------------------

pub(crate) async fn get(addr: SocketAddr, path: &str) -> (u16, Value) {
    http(addr, "GET", path, None, &[]).await
}

pub(crate) async fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    http(addr, "POST", path, Some(&body.to_string()), &[]).await
}

/// `/metrics` as text.
pub(crate) async fn metrics_text(addr: SocketAddr) -> String {
    match get(addr, "/metrics").await {
        (200, Value::String(s)) => s,
        (status, other) => panic!("/metrics: {status} {other}"),
    }
}

/// Sum of every sample of metric `name` whose labels contain all of `labels`
/// (`key="value"` strings).
pub(crate) fn metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric_name, label_part) = match series.split_once('{') {
                Some((n, rest)) => (n, rest),
                None => (series, ""),
            };
            (metric_name == name && labels.iter().all(|want| label_part.contains(want)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// Every worker row of `GET /controller/workers`, by (instance, worker id).
pub(crate) async fn workers(addr: SocketAddr) -> BTreeMap<(String, i64), Value> {
    let (status, body) = get(addr, "/controller/workers").await;
    assert_eq!(status, 200, "{body}");
    body["workers"]
        .as_array()
        .expect("workers list")
        .iter()
        .map(|w| {
            let key = (
                w["instance_id"].as_str().expect("instance").to_owned(),
                w["worker_id"].as_i64().expect("worker id"),
            );
            (key, w.clone())
        })
        .collect()
}

/// Whether the controller's key set of `(instance, worker, location)` is exactly `keys`, read
/// over HTTP: the worker's location count equals `keys.len()` and `POST /lookup` with `keys`
/// as hashes credits that holder with all of them.
pub(crate) async fn index_equals(
    addr: SocketAddr,
    instance: &str,
    worker: i64,
    location: &str,
    keys: &BTreeSet<i128>,
) -> bool {
    let rows = workers(addr).await;
    let Some(row) = rows.get(&(instance.to_owned(), worker)) else {
        return false;
    };
    let count = row["locations"]
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["name"] == location))
        .and_then(|l| l["key_count"].as_u64())
        .unwrap_or(0);
    if count != keys.len() as u64 {
        return false;
    }
    if keys.is_empty() {
        return true;
    }
    let hashes: Vec<Value> = keys.iter().map(|k| hash_json(*k)).collect();
    let (status, body) = post(addr, "/lookup", &json!({ "hashes": hashes })).await;
    assert_eq!(status, 200, "{body}");
    body["holders"].as_array().is_some_and(|hs| {
        hs.iter().any(|h| {
            h["instance_id"] == instance
                && h["worker_id"] == worker
                && h["location"] == location
                && h["matched_chunks"].as_u64() == Some(keys.len() as u64)
        })
    })
}

/// A chunk hash as JSON (u64 above i64::MAX and negative i64 both exact).
pub(crate) fn hash_json(k: i128) -> Value {
    match (i64::try_from(k), u64::try_from(k)) {
        (Ok(v), _) => json!(v),
        (_, Ok(v)) => json!(v),
        _ => panic!("{k} is not a chunk hash"),
    }
}

pub(crate) async fn start_worker(config: WorkerConfig, keys: &MemoryKeys) -> WorkerHandle {
    let w = within(
        "worker start",
        Worker::start(config, NoCommands, keys.clone()),
    )
    .await
    .expect("worker starts");
    within("worker ready", w.wait_ready(STEP))
        .await
        .expect("worker ready");
    w
}

/// [`crate::support::apply`] at the CPU location.
pub(crate) fn apply(worker: &WorkerHandle, keys: &MemoryKeys, admit: bool, key: i64) {
    crate::support::apply(worker, keys, admit, CPU, key);
}

pub(crate) fn model(keys: &MemoryKeys) -> BTreeSet<i128> {
    keys.snapshot(CPU)
        .into_iter()
        .map(|k| k.as_i128())
        .collect()
}

/// The keys a real LMCache worker holds in its LocalCPUBackend (its `state` command).
pub(crate) async fn lmcache_held(w: &mut LmcacheWorker) -> BTreeSet<i128> {
    let state = w.call(json!({"cmd": "state"}), SLOW).await;
    state["held"][CPU]
        .as_array()
        .map(|ks| {
            ks.iter()
                .map(|k| {
                    k.as_i64()
                        .map(i128::from)
                        .or_else(|| k.as_u64().map(i128::from))
                        .expect("integer key")
                })
                .collect()
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// The real binary as a child process.
// ---------------------------------------------------------------------------------------------

/// `kvplane serve` as a child process, killed when dropped.
pub(crate) struct Kvplane {
    process: Process,
    ports: ServePorts,
}

impl Kvplane {
    /// Starts the binary on `ports` (no health-check sweeps) and waits until `/readyz` is 200.
    /// Retries (bounded) while a previous instance's ports are released.
    pub(crate) async fn start(ports: ServePorts) -> Self {
        let env = [("KVPLANE_SERVE_HEALTH_CHECK_INTERVAL", "-1")];
        let process = ports.serve(&env).await;
        Kvplane { process, ports }
    }

    /// [`init_tracing`], then [`Kvplane::start`] on free ports: the ports, the process and its
    /// HTTP address.
    pub(crate) async fn on_free_ports() -> (ServePorts, Self, SocketAddr) {
        init_tracing();
        let ports = ServePorts::free();
        let kv = Kvplane::start(ports).await;
        let addr = kv.http();
        (ports, kv, addr)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub(crate) fn http(&self) -> SocketAddr {
        self.ports.http_addr()
    }

    /// SIGKILL, then reap.
    pub(crate) async fn kill9(mut self) {
        self.process.kill().await;
    }

    /// Open file descriptors of the process.
    pub(crate) fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .expect("/proc/<pid>/fd readable")
    }

    /// Tokio tasks alive in the process (`kvplane_tasks`).
    pub(crate) async fn tasks(&self) -> f64 {
        metric(&metrics_text(self.http()).await, "kvplane_tasks", &[])
    }
}

// ---------------------------------------------------------------------------------------------
// 1. A worker killed without deregistering.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_is_probed_removed_and_its_chunks_vanish() {
    init_tracing();
    // The sweeps are run by the test, on the server's clock, which it skips past the
    // timeout: no sleeping, and no assertion on how long anything took.
    let timeout = Duration::from_secs(60);
    let server = server_with(|c| {
        c.health_check_interval = None;
        c.worker_timeout = timeout;
        c.downlink_timeout = Duration::from_millis(500);
    })
    .await;
    let addr = server.addrs.http;
    let (pull, reply) = (
        server.addrs.pull.expect("pull").port(),
        server.addrs.reply.expect("reply").port(),
    );

    // A: a real LMCache worker (heartbeats every second), crashed later.
    let peer_a = format!("127.0.0.1:{}", free_port());
    let mut a = LmcacheWorker::start(
        "A",
        &worker_args(
            &ep(server.addrs.pull),
            &ep(server.addrs.reply),
            "inst-a",
            free_port(),
            Some(&peer_a),
        ),
    )
    .await;
    a.wait_for("registered", SLOW, |e| e["event"] == "registered")
        .await;
    a.call(json!({"cmd": "admit", "keys": [11, 12, 13]}), SLOW)
        .await;
    // B: a kvplane worker with heartbeats. C: one without (LMCache's default), alive: it must
    // survive the sweep thanks to the probe.
    let (kb, kc) = (MemoryKeys::new(), MemoryKeys::new());
    let b = start_worker(worker_config(pull, reply, "inst-b", 0), &kb).await;
    let mut c_config = worker_config(pull, reply, "inst-c", 0);
    c_config.heartbeat_interval = None;
    c_config.peer_init_url = Some("127.0.0.1:7003".into());
    let c = start_worker(c_config, &kc).await;
    // D: a bare test worker whose command socket is dropped ("killed").
    let (rep_d, port_d) = rep().await;
    let mut d = TestWorker::new(&server, "inst-d", 0);
    d.register(port_d, Some("127.0.0.1:1")).await;
    let batch = d.batch(CPU, &[(true, 41), (true, 42)]);
    d.push(&[batch]).await;
    for k in [21, 22, 23] {
        apply(&b, &kb, true, k);
    }
    for k in [31, 32] {
        apply(&c, &kc, true, k);
    }
    let expect = |keys: &[i128]| keys.iter().copied().collect::<BTreeSet<i128>>();
    for (inst, keys) in [
        ("inst-a", expect(&[11, 12, 13])),
        ("inst-b", expect(&[21, 22, 23])),
        ("inst-c", expect(&[31, 32])),
        ("inst-d", expect(&[41, 42])),
    ] {
        eventually(&format!("{inst} indexed"), SLOW, || {
            let keys = keys.clone();
            async move { index_equals(addr, inst, 0, CPU, &keys).await }
        })
        .await;
    }

    // Kill A (the process exits, no DeRegisterMsg) and D (its REP socket goes away), D right
    // after a last heartbeat.
    let beat = Msg::HeartbeatMsg(HeartbeatMsg {
        instance_id: "inst-d".into(),
        worker_id: 0,
        ip: "127.0.0.1".into(),
        port: i64::from(port_d),
        peer_init_url: Some("127.0.0.1:1".into()),
        distributed_url: None,
    });
    assert!(matches!(d.request(beat).await, Msg::HeartbeatRetMsg(_)));
    a.send(json!({"cmd": "crash"})).await;
    a.wait_exit(SLOW).await;
    drop(rep_d);
    // Not reaped before the timeout: nobody is even probed.
    let shared = &server.shared;
    let stats = within("sweep", sweep(shared)).await;
    assert_eq!(
        stats,
        SweepStats::default(),
        "nobody probed before the timeout"
    );
    assert_eq!(
        workers(addr).await.len(),
        4,
        "nobody removed before the timeout"
    );

    // Past it, every worker that did not heartbeat since is probed: the dead ones go.
    shared.clock().skip(timeout + Duration::from_secs(1));
    let stats = within("sweep", sweep(shared)).await;
    assert_eq!(stats.removed, 2, "{stats:?}");
    assert_eq!(
        stats.answered,
        stats.stale - 2,
        "the live ones answered: {stats:?}"
    );
    let rows = workers(addr).await;
    assert_eq!(
        rows.keys().cloned().collect::<Vec<_>>(),
        vec![("inst-b".to_owned(), 0), ("inst-c".to_owned(), 0)],
        "the live workers (with and without heartbeats) stay"
    );
    let text = metrics_text(addr).await;
    assert_eq!(
        metric(
            &text,
            "kvplane_workers_removed_total",
            &[r#"reason="probe_failed""#]
        ),
        2.0
    );

    // Their chunks vanish from lookups; the others' are intact and found.
    let (_, body) = post(addr, "/lookup", &json!({"hashes": [11, 12, 13]})).await;
    assert_eq!(body["holders"], json!([]), "{body}");
    let (_, body) = post(addr, "/lookup", &json!({"hashes": [41, 42]})).await;
    assert_eq!(body["holders"], json!([]), "{body}");
    assert!(index_equals(addr, "inst-b", 0, CPU, &expect(&[21, 22, 23])).await);
    assert!(index_equals(addr, "inst-c", 0, CPU, &expect(&[31, 32])).await);
    let hit = within("p2p lookup", b.p2p_lookup(&[31_i64.into(), 32_i64.into()]))
        .await
        .expect("lookup answered");
    assert_eq!(hit.map(|h| h.num_hit_chunks), Some(2), "B still finds C");
    let (_, stats) = get(addr, "/controller/key-stats").await;
    assert_eq!(stats["total_key_count"], 5, "{stats}");

    within("b shutdown", b.shutdown()).await.expect("shutdown");
    within("c shutdown", c.shutdown()).await.expect("shutdown");
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 2. kvplane killed with SIGKILL and restarted.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_kvplane_is_rebuilt_by_every_workers_full_sync() {
    let (ports, kv, addr) = Kvplane::on_free_ports().await;

    let models = [MemoryKeys::new(), MemoryKeys::new()];
    let mut kws = Vec::new();
    for (wid, keys) in models.iter().enumerate() {
        let wid = i64::try_from(wid).expect("small");
        let w = start_worker(worker_config(ports.pull, ports.reply, "inst-kv", wid), keys).await;
        for key in 0..300_i64 {
            apply(&w, keys, true, key * 10 + wid);
        }
        kws.push(w);
    }
    let (pull, reply) = (
        format!("127.0.0.1:{}", ports.pull),
        format!("127.0.0.1:{}", ports.reply),
    );
    let peer = format!("127.0.0.1:{}", free_port());
    let mut lm = LmcacheWorker::start(
        "LM",
        &worker_args(&pull, &reply, "inst-lm", free_port(), Some(&peer)),
    )
    .await;
    lm.wait_for("registered", SLOW, |e| e["event"] == "registered")
        .await;
    lm.call(
        json!({"cmd": "admit", "keys": [101, 102, 103, -7, u64::MAX]}),
        SLOW,
    )
    .await;

    let check_all = |models: Vec<BTreeSet<i128>>, lm_keys: BTreeSet<i128>| async move {
        for (wid, keys) in models.iter().enumerate() {
            if !index_equals(addr, "inst-kv", wid as i64, CPU, keys).await {
                return false;
            }
        }
        index_equals(addr, "inst-lm", 0, CPU, &lm_keys).await && workers(addr).await.len() == 3
    };
    let lm_keys = lmcache_held(&mut lm).await;
    assert_eq!(lm_keys.len(), 5);
    eventually("everything indexed", SLOW, || {
        check_all(models.iter().map(model).collect(), lm_keys.clone())
    })
    .await;

    kv.kill9().await;
    // While kvplane is dead: more ops, lost on the wire or queued by libzmq.
    for (wid, (w, keys)) in kws.iter().zip(&models).enumerate() {
        let wid = i64::try_from(wid).expect("small");
        for key in 300..350_i64 {
            apply(w, keys, true, key * 10 + wid);
        }
        for key in 0..20_i64 {
            apply(w, keys, false, key * 10 + wid);
        }
    }
    lm.call(json!({"cmd": "admit", "keys": [104, 105]}), SLOW)
        .await;
    lm.call(json!({"cmd": "evict", "keys": [101]}), SLOW).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let kv = Kvplane::start(ports).await;
    assert_eq!(kv.http(), addr);
    let lm_keys = lmcache_held(&mut lm).await;
    assert_eq!(lm_keys.len(), 6, "{lm_keys:?}");
    eventually("index rebuilt from every worker's full sync", SLOW, || {
        check_all(models.iter().map(model).collect(), lm_keys.clone())
    })
    .await;
    // The index can be complete before each worker's next status poll tells it so: wait for
    // the workers to see their own sync complete.
    eventually(
        "every kvplane worker saw its full sync complete",
        SLOW,
        || {
            let ready = kws
                .iter()
                .all(|w| w.state() == WorkerState::Ready && w.status().full_syncs_completed >= 1);
            async move { ready }
        },
    )
    .await;
    let (_, stats) = get(addr, "/controller/key-stats").await;
    assert_eq!(stats["total_key_count"], 330 + 330 + 6, "{stats}");

    // And the op streams flow again.
    apply(&kws[0], &models[0], true, 777_777);
    lm.call(json!({"cmd": "admit", "keys": [106]}), SLOW).await;
    let lm_keys = lmcache_held(&mut lm).await;
    eventually("new ops applied", SLOW, || {
        check_all(models.iter().map(model).collect(), lm_keys.clone())
    })
    .await;

    for w in kws {
        within("shutdown", w.shutdown()).await.expect("shutdown");
    }
    lm.close().await;
    eventually("all deregistered", SLOW, || async {
        workers(addr).await.is_empty()
    })
    .await;
    kv.kill9().await;
}

// ---------------------------------------------------------------------------------------------
// 3. A worker that stops answering its downlink.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_downlink_gives_504_in_time_while_other_workers_answer() {
    init_tracing();
    // Long enough that B's answer, however slow the machine, comes while A's command waits.
    let downlink_timeout = Duration::from_secs(3);
    let server = server_with(|c| c.downlink_timeout = downlink_timeout).await;
    let addr = server.addrs.http;
    let answering = Arc::new(AtomicBool::new(true));
    let flag = Arc::clone(&answering);
    let answer = move |m: &Msg| -> Option<Msg> {
        let reply = match m {
            Msg::ClearWorkerMsg(_) => Msg::ClearWorkerRetMsg(ClearWorkerRetMsg { num_tokens: 7 }),
            Msg::HealthWorkerMsg(_) => {
                Msg::HealthWorkerRetMsg(HealthWorkerRetMsg { error_code: 0 })
            }
            _ => Msg::ErrorMsg(ErrorMsg {
                error: "unexpected".into(),
            }),
        };
        Some(reply)
    };
    let answer_a = answer;
    let fake_a =
        FakeWorker::start(move |m| flag.load(Ordering::SeqCst).then(|| answer_a(m))?).await;
    let fake_b = FakeWorker::start(answer).await;
    let mut a = TestWorker::new(&server, "inst-a", 0);
    let mut b = TestWorker::new(&server, "inst-b", 0);
    a.register(fake_a.port, None).await;
    b.register(fake_b.port, None).await;
    let clear = |inst: &str| json!({"instance_id": inst, "location": CPU});

    // While A answers, both succeed.
    assert_eq!(post(addr, "/clear", &clear("inst-a")).await.0, 200);
    assert_eq!(post(addr, "/clear", &clear("inst-b")).await.0, 200);

    // A stops answering (its socket stays open).
    answering.store(false, Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    let slow = tokio::spawn(async move { post(addr, "/clear", &clear("inst-a")).await });
    let health =
        tokio::spawn(async move { post(addr, "/health", &json!({"instance_id": "inst-a"})).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Commands to B are not held up meanwhile: answered while A's command still waits for its
    // timeout (held up behind A, B would answer only after A's 504).
    let (status, body) = post(
        addr,
        "/clear",
        &json!({"instance_id": "inst-b", "location": CPU}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        !slow.is_finished(),
        "B was answered only after A's command ended"
    );
    let (_, body_b) = post(addr, "/health", &json!({"instance_id": "inst-b"})).await;
    assert_eq!(body_b["error_codes"], json!({"0": 0}));

    let (status, body) = within("A's clear", slow).await.expect("task");
    assert_eq!(status, 504, "{body}");
    // Never before the timeout; how soon after it is not a test's question.
    assert!(
        started.elapsed() >= downlink_timeout,
        "504 before the timeout"
    );
    assert_eq!(body["workers"][0]["instance_id"], "inst-a", "{body}");
    assert_eq!(body["workers"][0]["error"], "timeout", "{body}");
    let (status, body) = within("A's health", health).await.expect("task");
    assert_eq!(status, 504, "{body}");
    assert_eq!(body["error_codes"], json!({"0": -1004}), "{body}");

    // A answers again: its downlink recovers (a fresh socket after the timeout).
    answering.store(true, Ordering::SeqCst);
    let (status, body) = post(
        addr,
        "/clear",
        &json!({"instance_id": "inst-a", "location": CPU}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let text = metrics_text(addr).await;
    assert!(
        metric(
            &text,
            "kvplane_downlink_requests_total",
            &[r#"outcome="timeout""#]
        ) >= 2.0,
        "timeouts counted"
    );
    drop((fake_a, fake_b));
    server.stop().await;
}
