//! The worker library against a kvplane controller over loopback (ephemeral ports): register,
//! ordered batches, P2P lookups, commands, late controller, controller restart, lost pushes,
//! full syncs on demand, backpressure, shutdown. Every await is bounded.

use crate::support::*;
use kvplane::controller::BoundAddrs;
use kvplane::controller::Server;
use kvplane::protocol::*;
use kvplane::transport::ReqClient;
use kvplane::worker::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const CPU: &str = LOCAL_CPU_BACKEND;
const DISK: &str = "LocalDiskBackend";

/// [`worker_config`] for `instance`/`worker_id` against `addrs`.
fn config(addrs: &BoundAddrs, instance: &str, worker_id: i64) -> WorkerConfig {
    let port = |a: Option<std::net::SocketAddr>| a.expect("socket configured").port();
    worker_config(port(addrs.pull), port(addrs.reply), instance, worker_id)
}

/// Logs to the test's output when `RUST_LOG` is set (e.g. `RUST_LOG=kvplane::worker=debug`).
fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

async fn start(config: WorkerConfig, keys: &MemoryKeys) -> WorkerHandle {
    init_tracing();
    within(
        "worker start",
        Worker::start(config, NoCommands, keys.clone()),
    )
    .await
    .expect("worker starts")
}

async fn ready(worker: &WorkerHandle) {
    within("worker ready", worker.wait_ready(STEP))
        .await
        .expect("worker becomes ready");
}

fn index_keys(server: &Server, instance: &str, worker: i64, location: &str) -> HashSet<ChunkHash> {
    server
        .shared
        .index()
        .keys_of(instance, worker, location)
        .into_iter()
        .collect()
}

/// The controller's key set of every location of `keys` equals `keys`.
fn in_sync(server: &Server, instance: &str, worker: i64, keys: &MemoryKeys) -> bool {
    keys.locations()
        .iter()
        .all(|l| index_keys(server, instance, worker, l) == keys.snapshot(l))
}

#[tokio::test]
async fn registers_with_its_bound_port_and_deregisters_on_shutdown() {
    let server = server().await;
    let mut cfg = config(&server.addrs, "inst-a", 3);
    cfg.peer_init_url = Some("127.0.0.1:7001".into());
    let keys = MemoryKeys::new();
    let worker = start(cfg, &keys).await;
    ready(&worker).await;

    let port = worker.command_addr().port();
    assert_ne!(port, 0);
    assert_eq!(worker.advertised_endpoint(), format!("127.0.0.1:{port}"));
    let view = server
        .shared
        .index()
        .worker("inst-a", 3)
        .expect("registered");
    assert_eq!((view.ip.as_str(), view.port), ("127.0.0.1", port));
    assert_eq!(view.peer_init_url.as_deref(), Some("127.0.0.1:7001"));
    let status = worker.status();
    assert_eq!(
        (status.state, status.registrations),
        (WorkerState::Ready, 1)
    );
    assert_eq!(
        status.full_syncs_started, 0,
        "nothing to sync on a fresh start"
    );

    eventually("heartbeats answered", STEP, async || {
        worker.status().heartbeats_ok >= 2
    })
    .await;

    let clone = worker.clone();
    within("shutdown", worker.shutdown())
        .await
        .expect("graceful shutdown");
    eventually("deregistered", STEP, async || {
        server.shared.index().worker_count() == 0
    })
    .await;
    assert!(matches!(clone.admit(CPU, 1_i64), Err(WorkerError::Closed)));
    assert_eq!(clone.state(), WorkerState::Stopped);
    within("server stop", server.stop()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_ops_keep_their_order_across_batches() {
    let server = server().await;
    let keys = MemoryKeys::new();
    let worker = start(config(&server.addrs, "inst-o", 0), &keys).await;
    ready(&worker).await;

    // Few distinct keys, so the same key is admitted and evicted again and again, often on
    // both sides of a 50-op batch boundary; two locations interleaved.
    let mut rng = StdRng::seed_from_u64(4);
    let mut per_location = [0usize; 2];
    for i in 0..1000 {
        // Ops 49/50, 99/100, … admit then evict one key across a batch boundary.
        let (admit, key) = match i % 50 {
            49 => (true, 1_000),
            0 if i > 0 => (false, 1_000),
            _ => (rng.random_bool(0.6), rng.random_range(-20_i64..20)),
        };
        let location = if key != 1_000 && rng.random_bool(0.2) {
            DISK
        } else {
            CPU
        };
        per_location[usize::from(location == DISK)] += 1;
        apply(&worker, &keys, admit, location, key);
    }
    within("flush", worker.flush()).await.expect("flushed");
    eventually("index equals the model", STEP, async || {
        in_sync(&server, "inst-o", 0, &keys)
    })
    .await;
    let status = worker.status();
    assert_eq!(status.ops_sent, 1000);
    assert_eq!(status.ops_superseded, 0);
    assert!(
        status.batches_sent >= (per_location[0] / 50 + per_location[1] / 50) as u64,
        "{status:?}"
    );
    assert_eq!(
        server.shared.index().seq_discontinuities(),
        0,
        "sequence numbers are consecutive per location"
    );
    let view = server
        .shared
        .index()
        .worker("inst-o", 0)
        .expect("registered");
    for loc in view.locations {
        let n = per_location[usize::from(loc.name == DISK)] as i64;
        assert_eq!(loc.last_seq, Some(n - 1), "{}: seq_num 0..{n}", loc.name);
    }
    within("shutdown", worker.shutdown())
        .await
        .expect("shutdown");
    within("server stop", server.stop()).await;
}

#[tokio::test]
async fn a_second_worker_finds_the_first_by_p2p_lookup() {
    let server = server().await;
    let (ka, kb) = (MemoryKeys::new(), MemoryKeys::new());
    let mut cfg = config(&server.addrs, "inst-a", 0);
    cfg.peer_init_url = Some("127.0.0.1:7001".into());
    let a = start(cfg, &ka).await;
    let b = start(config(&server.addrs, "inst-b", 0), &kb).await;
    ready(&a).await;
    ready(&b).await;

    for key in [11_i64, 12, 13, 14] {
        apply(&a, &ka, true, CPU, key);
    }
    apply(&a, &ka, false, CPU, 14);
    within("flush", a.flush()).await.expect("flushed");
    eventually("a's keys indexed", STEP, async || {
        in_sync(&server, "inst-a", 0, &ka)
    })
    .await;

    let hashes: Vec<ChunkHash> = [11_i64, 12, 13, 14].map(ChunkHash::from).to_vec();
    let hit = within("lookup", b.p2p_lookup(&hashes))
        .await
        .expect("answered");
    assert_eq!(
        hit,
        Some(PeerHit {
            instance_id: "inst-a".into(),
            location: CPU.into(),
            num_hit_chunks: 3,
            peer_init_url: "127.0.0.1:7001".into(),
        })
    );
    let own = within("own lookup", a.p2p_lookup(&hashes)).await;
    assert_eq!(
        own.expect("answered"),
        None,
        "an instance never finds itself"
    );
    let miss = within("miss", b.p2p_lookup(&[ChunkHash::from(99_i64)])).await;
    assert_eq!(miss.expect("answered"), None);
    assert_eq!(
        within("empty", b.p2p_lookup(&[])).await.expect("local"),
        None
    );
    let s = b.status();
    assert_eq!((s.lookups, s.lookup_hits, s.lookup_failures), (2, 1, 0));

    within("shutdown a", a.shutdown()).await.expect("shutdown");
    within("shutdown b", b.shutdown()).await.expect("shutdown");
    within("server stop", server.stop()).await;
}

/// Records every call and answers with recognisable values.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<String>>,
}

impl Recorder {
    fn log(&self, line: String) {
        self.calls.lock().expect("lock").push(line);
    }
    fn calls(&self) -> Vec<String> {
        self.calls.lock().expect("lock").clone()
    }
}

impl CommandHandler for Recorder {
    async fn clear(&self, req: ClearWorkerMsg) -> CommandResult<i64> {
        self.log(format!("clear {} {}", req.worker_event_id, req.location));
        Ok(7)
    }
    async fn pin(&self, req: PinWorkerMsg) -> CommandResult<i64> {
        self.log(format!("pin {} {:?}", req.location, req.tokens));
        Ok(i64::try_from(req.tokens.len()).unwrap_or(0))
    }
    async fn decompress(&self, req: DecompressWorkerMsg) -> CommandResult<i64> {
        self.log(format!("decompress {}", req.method));
        Err(CommandError::new(format!("no method {}", req.method)))
    }
    async fn move_kv(&self, req: MoveWorkerMsg) -> CommandResult<i64> {
        self.log(format!(
            "move {} -> {:?} {:?} copy={:?}",
            req.old_position, req.new_position, req.tokens, req.copy
        ));
        Ok(3)
    }
    async fn health(&self, req: HealthWorkerMsg) -> CommandResult<i64> {
        self.log(format!("health {}", req.worker_event_id));
        Ok(-1)
    }
}

fn error_text(msg: Msg) -> String {
    match msg {
        Msg::ErrorMsg(e) => e.error,
        other => panic!("expected ErrorMsg, got {other:?}"),
    }
}

#[tokio::test]
async fn commands_reach_the_handler_and_its_answers_return() {
    let server = server().await;
    let recorder = Arc::new(Recorder::default());
    let worker = within(
        "start",
        Worker::start(
            config(&server.addrs, "inst-c", 1),
            Arc::clone(&recorder),
            MemoryKeys::new(),
        ),
    )
    .await
    .expect("starts");
    ready(&worker).await;
    let downlink = server
        .shared
        .downlink("inst-c", 1)
        .expect("downlink open")
        .downlink;
    let ask = |msg: Msg| {
        let downlink = downlink.clone();
        async move {
            within("command", downlink.request(msg))
                .await
                .expect("answered")
        }
    };

    let clear = ask(Msg::ClearWorkerMsg(ClearWorkerMsg {
        worker_event_id: "ev1".into(),
        location: CPU.into(),
    }))
    .await;
    assert_eq!(
        clear,
        Msg::ClearWorkerRetMsg(ClearWorkerRetMsg { num_tokens: 7 })
    );
    let pin = ask(Msg::PinWorkerMsg(PinWorkerMsg {
        worker_event_id: "ev2".into(),
        location: CPU.into(),
        tokens: vec![1, 2, 3],
    }))
    .await;
    assert_eq!(pin, Msg::PinWorkerRetMsg(PinWorkerRetMsg { num_tokens: 3 }));
    let moved = ask(Msg::MoveWorkerMsg(MoveWorkerMsg {
        worker_event_id: "ev3".into(),
        old_position: CPU.into(),
        new_position: ("10.0.0.2:7001".into(), CPU.into()),
        tokens: Some(vec![5, 6]),
        copy: Some(false),
    }))
    .await;
    assert_eq!(
        moved,
        Msg::MoveWorkerRetMsg(MoveWorkerRetMsg { num_tokens: 3 })
    );
    let health = ask(Msg::HealthWorkerMsg(HealthWorkerMsg {
        worker_event_id: "ev4".into(),
    }))
    .await;
    assert_eq!(
        health,
        Msg::HealthWorkerRetMsg(HealthWorkerRetMsg { error_code: -1 })
    );
    let compress = ask(Msg::CompressWorkerMsg(CompressWorkerMsg {
        worker_event_id: "ev5".into(),
        method: "cachegen".into(),
        location: CPU.into(),
        tokens: None,
    }))
    .await;
    assert_eq!(error_text(compress), "not implemented: compress");
    let decompress = ask(Msg::DecompressWorkerMsg(DecompressWorkerMsg {
        worker_event_id: "ev6".into(),
        method: "zstd".into(),
        location: CPU.into(),
        tokens: None,
    }))
    .await;
    assert_eq!(error_text(decompress), "no method zstd");
    let finish = ask(Msg::CheckFinishWorkerMsg(CheckFinishWorkerMsg {
        worker_event_id: "ev7".into(),
    }))
    .await;
    assert_eq!(error_text(finish), "not implemented: check_finish");
    assert_eq!(
        recorder.calls(),
        vec![
            "clear ev1 LocalCPUBackend".to_owned(),
            "pin LocalCPUBackend [1, 2, 3]".to_owned(),
            "move LocalCPUBackend -> (\"10.0.0.2:7001\", \"LocalCPUBackend\") Some([5, 6]) copy=Some(false)"
                .to_owned(),
            "health ev4".to_owned(),
            "decompress zstd".to_owned(),
        ]
    );

    // Garbage and non-commands on the REP socket get ErrorMsg; the server keeps serving.
    let mut raw = ReqClient::new(worker.advertised_endpoint(), Duration::from_secs(2));
    for junk in [&b"\xc1\xc1"[..], b"", b"{\"type\": \"Nope\"}"] {
        let reply = within("junk", raw.request(bytes::Bytes::copy_from_slice(junk)))
            .await
            .expect("answered");
        assert!(
            error_text(decode(&reply).expect("decodes")).starts_with("Worker error"),
            "{junk:?}"
        );
    }
    let register = register_msg("x", 0, 1, None);
    let reply = within("wrong kind", raw.request(encode(&register).into()))
        .await
        .expect("answered");
    assert_eq!(
        error_text(decode(&reply).expect("decodes")),
        "Unknown message: RegisterMsg"
    );
    let clear = ask(Msg::ClearWorkerMsg(ClearWorkerMsg {
        worker_event_id: "ev8".into(),
        location: DISK.into(),
    }))
    .await;
    assert_eq!(
        clear,
        Msg::ClearWorkerRetMsg(ClearWorkerRetMsg { num_tokens: 7 })
    );
    assert!(worker.status().commands >= 11);

    within("shutdown", worker.shutdown())
        .await
        .expect("shutdown");
    within("server stop", server.stop()).await;
}

/// Addresses of a controller that is not up yet: ports held (connections refused) until the
/// holds are dropped, right before the controller binds them.
fn unbound_addrs() -> (BoundAddrs, [PortHold; 3]) {
    let (pull, reply, heartbeat) = (hold_port(), hold_port(), hold_port());
    let addrs = BoundAddrs {
        http: loopback(0),
        pull: Some(loopback(pull.1)),
        reply: Some(loopback(reply.1)),
        heartbeat: Some(loopback(heartbeat.1)),
    };
    (addrs, [pull.0, reply.0, heartbeat.0])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_waits_for_a_controller_that_starts_late() {
    let (addrs, holds) = unbound_addrs();
    let keys = MemoryKeys::new();
    let worker = start(config(&addrs, "inst-late", 0), &keys).await;
    for key in 0..20_i64 {
        apply(&worker, &keys, true, CPU, key);
    }
    apply(&worker, &keys, false, CPU, 3);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(worker.state(), WorkerState::Registering);
    assert_eq!(worker.status().registrations, 0);

    drop(holds);
    let server = restart_on(addrs).await;
    ready(&worker).await;
    eventually("held ops applied", STEP, async || {
        in_sync(&server, "inst-late", 0, &keys)
    })
    .await;
    assert_eq!(worker.status().registrations, 1);
    assert_eq!(index_keys(&server, "inst-late", 0, CPU).len(), 19);
    within("shutdown", worker.shutdown())
        .await
        .expect("shutdown");
    within("server stop", server.stop()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_restart_reregisters_and_resyncs_every_worker() {
    let server = server().await;
    let addrs = server.addrs;
    let models = [MemoryKeys::new(), MemoryKeys::new()];
    let mut workers = Vec::new();
    for (wid, keys) in models.iter().enumerate() {
        let wid = i64::try_from(wid).expect("small");
        let w = start(config(&addrs, "inst-r", wid), keys).await;
        ready(&w).await;
        for key in 0..300_i64 {
            apply(&w, keys, true, CPU, key * 10 + wid);
        }
        workers.push(w);
    }
    for (wid, keys) in models.iter().enumerate() {
        let wid = i64::try_from(wid).expect("small");
        eventually("keys indexed", STEP, async || {
            in_sync(&server, "inst-r", wid, keys)
        })
        .await;
    }

    within("server stop", server.stop()).await;
    // While the controller is away: more admits and evicts, some of them lost on the wire.
    for (wid, (w, keys)) in workers.iter().zip(&models).enumerate() {
        let wid = i64::try_from(wid).expect("small");
        for key in 300..350_i64 {
            apply(w, keys, true, CPU, key * 10 + wid);
        }
        for key in 0..20_i64 {
            apply(w, keys, false, CPU, key * 10 + wid);
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let server = restart_on(addrs).await;
    for (wid, (w, keys)) in workers.iter().zip(&models).enumerate() {
        let wid = i64::try_from(wid).expect("small");
        eventually("worker resynced after the restart", SLOW, async || {
            in_sync(&server, "inst-r", wid, keys) && w.state() == WorkerState::Ready
        })
        .await;
        assert_eq!(index_keys(&server, "inst-r", wid, CPU).len(), 330);
        assert!(w.status().full_syncs_completed >= 1, "{:?}", w.status());
    }
    // And the op stream works again.
    apply(&workers[0], &models[0], true, CPU, 777_777);
    eventually("new ops flow", STEP, async || {
        in_sync(&server, "inst-r", 0, &models[0])
    })
    .await;
    for w in workers {
        within("shutdown", w.shutdown()).await.expect("shutdown");
    }
    within("server stop", server.stop()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_heartbeats_lost_pushes_still_lead_to_a_resync() {
    let server = server().await;
    let addrs = server.addrs;
    let mut cfg = config(&addrs, "inst-nh", 0);
    cfg.heartbeat_interval = None;
    let keys = MemoryKeys::new();
    let worker = start(cfg, &keys).await;
    ready(&worker).await;
    for key in 0..50_i64 {
        apply(&worker, &keys, true, CPU, key);
    }
    eventually("indexed", STEP, async || {
        in_sync(&server, "inst-nh", 0, &keys)
    })
    .await;

    within("server stop", server.stop()).await;
    for key in 50..60_i64 {
        apply(&worker, &keys, true, CPU, key);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let server = restart_on(addrs).await;
    // The application keeps working; the worker notices the loss and resynchronises.
    let mut key = 60_i64;
    eventually("resynced, admits going on", SLOW, async || {
        if in_sync(&server, "inst-nh", 0, &keys) && worker.state() == WorkerState::Ready {
            return Ok(());
        }
        apply(&worker, &keys, true, CPU, key);
        key += 1;
        Err(format!("{:?}", worker.status()))
    })
    .await;
    let status = worker.status();
    assert!(
        status.push_failures >= 1 || status.heartbeats_ok >= 1,
        "{status:?}"
    );
    assert!(status.full_syncs_completed >= 1, "{status:?}");
    within("shutdown", worker.shutdown())
        .await
        .expect("shutdown");
    within("server stop", server.stop()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_during_a_full_sync_are_held_and_replayed() {
    let server = server().await;
    let mut cfg = config(&server.addrs, "inst-fs", 0);
    cfg.full_sync.poll_interval = Duration::from_millis(300);
    cfg.full_sync.batch_size = 7;
    let keys = MemoryKeys::new();
    let worker = start(cfg, &keys).await;
    ready(&worker).await;
    for key in 0..100_i64 {
        apply(&worker, &keys, true, CPU, key);
    }
    apply(&worker, &keys, true, DISK, -5);
    eventually("indexed", STEP, async || {
        in_sync(&server, "inst-fs", 0, &keys)
    })
    .await;

    worker.full_sync().expect("scheduled");
    eventually("syncing", STEP, async || {
        worker.state() == WorkerState::Syncing
    })
    .await;
    for key in 50..150_i64 {
        apply(&worker, &keys, key % 3 != 0, CPU, key);
    }
    apply(&worker, &keys, false, DISK, -5);
    assert_eq!(
        worker.state(),
        WorkerState::Syncing,
        "still syncing: ops were held"
    );
    ready(&worker).await;
    eventually("held ops replayed", STEP, async || {
        in_sync(&server, "inst-fs", 0, &keys)
    })
    .await;
    let status = worker.status();
    assert_eq!(
        status.full_syncs_completed, 2,
        "one per location: {status:?}"
    );
    assert_eq!(status.full_syncs_failed, 0);
    within("shutdown", worker.shutdown())
        .await
        .expect("shutdown");
    within("server stop", server.stop()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_fails_fast_and_resyncs() {
    let server = server().await;
    let mut cfg = config(&server.addrs, "inst-q", 0);
    cfg.queue_capacity = 2;
    let keys = MemoryKeys::new();
    let worker = start(cfg, &keys).await;
    ready(&worker).await;

    let (w, k) = (worker.clone(), keys.clone());
    let rejected = within(
        "flood",
        tokio::task::spawn_blocking(move || {
            let mut rejected = 0;
            for key in 0..20_000_i64 {
                k.admit(CPU, key);
                match w.admit(CPU, key) {
                    Ok(()) => {}
                    Err(WorkerError::QueueFull) => rejected += 1,
                    Err(e) => panic!("{e}"),
                }
            }
            rejected
        }),
    )
    .await
    .expect("flood thread");
    assert!(rejected > 0, "a queue of 2 must overflow under a flood");
    eventually("resynced", SLOW, async || {
        in_sync(&server, "inst-q", 0, &keys) && worker.state() == WorkerState::Ready
    })
    .await;
    let status = worker.status();
    assert_eq!(status.ops_rejected, rejected);
    assert!(status.full_syncs_completed >= 1, "{status:?}");
    within("shutdown", worker.shutdown())
        .await
        .expect("shutdown");
    within("server stop", server.stop()).await;
}

#[tokio::test]
async fn shutdown_flushes_pending_ops_before_deregistering() {
    let server = server().await;
    let mut cfg = config(&server.addrs, "inst-s", 0);
    cfg.flush_interval = Duration::from_secs(60);
    cfg.batch_size = 1000;
    let keys = MemoryKeys::new();
    let worker = start(cfg, &keys).await;
    ready(&worker).await;
    let admits = || {
        server
            .shared
            .metrics
            .ops_applied
            .with_label_values(&["admit"])
            .get()
    };
    let before = admits();
    for key in 0..100_i64 {
        apply(&worker, &keys, true, CPU, key);
    }
    within("shutdown", worker.shutdown())
        .await
        .expect("shutdown");
    eventually("flushed then deregistered", STEP, async || {
        admits() == before + 100 && server.shared.index().worker_count() == 0
    })
    .await;
    within("server stop", server.stop()).await;
}
