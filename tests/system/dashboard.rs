//! The dashboard in a real browser: kvplane on 127.0.0.1 (ephemeral ports) with simulated
//! workers over real ZMQ sockets, loaded by Debian's headless Chromium through playwright-core
//! (`tests/browser/dashboard.mjs`), which checks the totals, the workers, the charts and one
//! action through the form, and saves `docs/dashboard.png`.
//!
//! Needs `scripts/setup-browser.sh` (run by `scripts/test.sh`). Set `KVPLANE_SKIP_BROWSER=1`
//! to skip it on a machine without Chromium; `KVPLANE_DASHBOARD_SCREENSHOT=path` writes the
//! screenshot elsewhere.

use crate::support::browser;
use crate::support::*;
use bytes::Bytes;
use kvplane::protocol::*;
use kvplane::transport::{DealerClient, RepServer};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const CPU: &str = "LocalCPUBackend";
const DISK: &str = "LocalDiskBackend";
/// The whole browser run (Chromium start, page checks, one action, screenshot).
const BROWSER_DEADLINE: Duration = Duration::from_secs(180);
/// The background feeder stops by itself after this long, whatever happens to the test.
const FEED_LIMIT: Duration = Duration::from_secs(240);

/// The simulated fleet: (instance, ranks, serves P2P peers).
const FLEET: [(&str, i64, bool); 3] = [
    ("llama-8b-0", 2, true),
    ("llama-8b-1", 2, true),
    ("qwen-32b-0", 2, false),
];

struct Sim {
    workers: Vec<TestWorker>,
    reps: Vec<(String, i64, RepServer)>,
    ports: Vec<u16>,
}

fn heartbeat(instance: &str, worker_id: i64, port: u16, peer: Option<String>) -> Msg {
    Msg::HeartbeatMsg(HeartbeatMsg {
        instance_id: instance.into(),
        worker_id,
        ip: "127.0.0.1".into(),
        port: i64::from(port),
        peer_init_url: peer,
        distributed_url: None,
    })
}

fn peer_url(port: u16) -> String {
    format!("127.0.0.1:{}", port.wrapping_add(1000))
}

/// Registers the fleet over ZMQ and gives it keys, a full sync in progress, one completed.
async fn build_fleet(server: &kvplane::controller::Server) -> Sim {
    let mut sim = Sim {
        workers: Vec::new(),
        reps: Vec::new(),
        ports: Vec::new(),
    };
    for (instance, ranks, peers) in FLEET {
        for rank in 0..ranks {
            let (rep, port) = rep().await;
            let mut w = TestWorker::new(server, instance, rank);
            let peer = peers.then(|| peer_url(port));
            match w.register(port, peer.as_deref()).await {
                Msg::RegisterRetMsg(_) => {}
                other => panic!("registration refused: {other:?}"),
            }
            sim.reps.push((instance.to_owned(), rank, rep));
            sim.ports.push(port);
            sim.workers.push(w);
        }
    }
    // Keys: every worker has CPU keys, the llama ranks also disk keys.
    for (i, w) in sim.workers.iter_mut().enumerate() {
        let base = i as i64 * 100_000;
        let n = 600 + 137 * i as i64;
        let ops: Vec<(bool, i64)> = (0..n).map(|k| (true, base + k)).collect();
        for chunk in ops.chunks(200) {
            let batch = w.batch(CPU, chunk);
            w.push(&[batch]).await;
        }
        if w.instance_id.starts_with("llama") {
            let ops: Vec<(bool, i64)> = (0..n * 3).map(|k| (true, base + 50_000 + k)).collect();
            for chunk in ops.chunks(500) {
                let batch = w.batch(DISK, chunk);
                w.push(&[batch]).await;
            }
        }
    }
    // qwen-32b-0 rank 1: a full sync, 7 of 12 batches in. Rank 0: a completed one.
    for (rank, batches, sent) in [(1_i64, 12_i64, 7_i64), (0, 3, 3)] {
        let w = &mut sim.workers[4 + rank as usize];
        let sync_id = format!("sync-{rank}-{:x}", 0x5eed_u32 + rank as u32);
        let start = Msg::FullSyncStartMsg(FullSyncStartMsg {
            instance_id: w.instance_id.clone(),
            worker_id: w.worker_id,
            location: CPU.into(),
            sync_id: sync_id.clone(),
            total_keys: batches * 400,
            batch_count: batches,
        });
        match w.request(start).await {
            Msg::FullSyncStartRetMsg(r) => assert!(r.accepted, "{:?}", r.error_msg),
            other => panic!("{other:?}"),
        }
        for batch_id in 0..sent {
            let keys = (0..400)
                .map(|k| ChunkHash::from_i64(9_000_000 + rank * 100_000 + batch_id * 400 + k))
                .collect();
            let msg = Msg::FullSyncBatchMsg(FullSyncBatchMsg {
                instance_id: w.instance_id.clone(),
                worker_id: w.worker_id,
                location: CPU.into(),
                sync_id: sync_id.clone(),
                batch_id,
                keys,
            });
            w.push(&[msg]).await;
        }
        if sent == batches {
            let end = Msg::FullSyncEndMsg(FullSyncEndMsg {
                instance_id: w.instance_id.clone(),
                worker_id: w.worker_id,
                location: CPU.into(),
                sync_id,
                actual_total_keys: batches * 400,
            });
            w.push(&[end]).await;
        }
    }
    sim
}

/// Answers every downlink command of one worker: health 0, and plausible token counts.
fn serve_commands(
    mut rep: RepServer,
    health_probes: Arc<AtomicUsize>,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let bytes = tokio::select! {
                () = cancel.cancelled() => return,
                r = rep.recv() => match r { Ok(b) => b, Err(_) => continue },
            };
            let reply = match decode(&bytes) {
                Ok(Msg::HealthWorkerMsg(_)) => {
                    health_probes.fetch_add(1, Ordering::Relaxed);
                    Msg::HealthWorkerRetMsg(HealthWorkerRetMsg { error_code: 0 })
                }
                Ok(Msg::ClearWorkerMsg(_)) => {
                    Msg::ClearWorkerRetMsg(ClearWorkerRetMsg { num_tokens: 0 })
                }
                Ok(Msg::PinWorkerMsg(m)) => Msg::PinWorkerRetMsg(PinWorkerRetMsg {
                    num_tokens: m.tokens.len() as i64,
                }),
                Ok(Msg::MoveWorkerMsg(_)) => {
                    Msg::MoveWorkerRetMsg(MoveWorkerRetMsg { num_tokens: 0 })
                }
                _ => Msg::ErrorMsg(ErrorMsg {
                    error: "unsupported in this test".into(),
                }),
            };
            let sent = tokio::time::timeout(STEP, rep.reply(Bytes::from(encode(&reply)))).await;
            if !matches!(sent, Ok(Ok(()))) {
                continue;
            }
        }
    })
}

/// The clock of a task feeding a dashboard: ticks every `period` until `limit` has passed
/// since it started or `cancel` fires, and counts them.
pub(crate) struct Feed {
    started: tokio::time::Instant,
    limit: Duration,
    tick: tokio::time::Interval,
    cancel: CancellationToken,
    ticks: u32,
}

impl Feed {
    pub(crate) fn new(period: Duration, limit: Duration, cancel: CancellationToken) -> Self {
        Feed {
            started: tokio::time::Instant::now(),
            limit,
            tick: tokio::time::interval(period),
            cancel,
            ticks: 0,
        }
    }

    /// Missed ticks (a slow round) are not made up for.
    pub(crate) fn delay_missed_ticks(&mut self) {
        self.tick
            .set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    }

    /// Waits for the next tick: its number (from 1), or `None` once the feed is over.
    pub(crate) async fn next<T: From<u32>>(&mut self) -> Option<T> {
        if self.started.elapsed() >= self.limit {
            return None;
        }
        tokio::select! {
            () = self.cancel.cancelled() => None,
            _ = self.tick.tick() => {
                self.ticks += 1;
                Some(T::from(self.ticks))
            }
        }
    }
}

/// Keeps the fleet alive and busy until cancelled (or [`FEED_LIMIT`]): admits and evicts every
/// 100 ms, about 20 P2P lookups a second (hits and misses), heartbeats every second except from one
/// worker. Returns the ingest task (the heartbeat task ends with it, on the same token).
fn feed(
    server: &kvplane::controller::Server,
    mut workers: Vec<TestWorker>,
    ports: Vec<u16>,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    // Every worker but llama-8b-1 rank 1 heartbeats once a second, from its own task so the
    // ingest ticks stay regular (the silent one shows its registration age, labelled so).
    let mut heartbeats = DealerClient::new(ep(server.addrs.heartbeat), Duration::from_secs(5));
    let beats: Vec<Msg> = workers
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3)
        .map(|(i, w)| {
            let peer = w
                .instance_id
                .starts_with("llama")
                .then(|| peer_url(ports[i]));
            heartbeat(&w.instance_id, w.worker_id, ports[i], peer)
        })
        .collect();
    let beat_cancel = cancel.clone();
    tokio::spawn(async move {
        let mut feed = Feed::new(Duration::from_secs(1), FEED_LIMIT, beat_cancel);
        while feed.next::<u32>().await.is_some() {
            for msg in &beats {
                let bytes = Bytes::from(encode(msg));
                let _ = tokio::time::timeout(STEP, heartbeats.request(bytes)).await;
            }
        }
    });
    tokio::spawn(async move {
        let mut feed = Feed::new(Duration::from_millis(100), FEED_LIMIT, cancel);
        feed.delay_missed_ticks();
        while let Some(n) = feed.next::<i64>().await {
            // A wave: the ingest rate rises and falls so the chart has a shape.
            let wave = (30.0 + 25.0 * ((n as f64) / 25.0).sin()).max(1.0) as i64;
            for (i, w) in workers.iter_mut().enumerate().take(4) {
                let base = 1_000_000 + i as i64 * 1_000_000 + n * 100;
                let mut ops: Vec<(bool, i64)> = (0..wave).map(|k| (true, base + k)).collect();
                ops.extend((0..wave / 4).map(|k| (false, base - 100 + k)));
                let batch = w.batch(CPU, &ops);
                let frame = vec![Bytes::from(encode(&batch))];
                let _ =
                    tokio::time::timeout(STEP, w.push.send(frame, Duration::from_secs(2))).await;
            }
            // Zero to four P2P lookups a tick (a slower wave) from llama-8b-1: prefixes held by
            // its peer llama-8b-0 rank 0 (hits), except one in four (unknown hashes: misses).
            let lookups = 2 + (2.0 * ((n as f64) / 37.0).cos()).round() as i64;
            for k in 0..lookups {
                let m = 4 * n + k;
                let who = &mut workers[2 + (m as usize % 2)];
                let hashes = if (n + k) % 4 == 0 {
                    vec![ChunkHash::from_i64(-1 - m)]
                } else {
                    (0..1 + m % 4).map(ChunkHash::from_i64).collect()
                };
                let msg = Msg::BatchedP2PLookupMsg(BatchedP2PLookupMsg {
                    hashes,
                    instance_id: who.instance_id.clone(),
                    worker_id: who.worker_id,
                });
                let _ =
                    tokio::time::timeout(STEP, who.dealer.request(Bytes::from(encode(&msg)))).await;
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_shows_the_fleet_live_and_runs_an_action() {
    if !browser::ready() {
        return;
    }
    // The status rule the feed serves: active while the last contact is younger than the
    // worker timeout (300 s), warning up to 300 + 60 s (the probe's time), then inactive.
    let server = server_with(|c| c.downlink_timeout = Duration::from_secs(60)).await;
    let mut sim = build_fleet(&server).await;

    // Two workers as the liveness sweep would find them: one silent for 310 s (warning,
    // never heartbeated), one whose last heartbeat is 7 minutes old (inactive). They exist
    // only in the index (no command channel), which is all the dashboard reads. llama-8b-1
    // rank 1 never heartbeats either, but sends ops: it is active.
    {
        let now = server.shared.now();
        let mut index = server.shared.index_mut_for_tests();
        index
            .register("llama-8b-2", 0, "127.0.0.1", 1, None, now - 310.0)
            .expect("register");
        index
            .register("llama-8b-2", 1, "127.0.0.1", 2, None, now - 900.0)
            .expect("register");
        index
            .heartbeat("llama-8b-2", 1, "127.0.0.1", 2, None, now - 420.0)
            .expect("heartbeat");
    }
    let expected_workers = 8;
    eventually("fleet indexed", STEP, async || {
        let ix = server.shared.index();
        ix.worker_count() == expected_workers && ix.key_count() > 10_000
    })
    .await;

    let cancel = CancellationToken::new();
    let probes = Arc::new(AtomicUsize::new(0));
    let servers: Vec<_> = sim
        .reps
        .drain(..)
        .map(|(_, _, rep)| serve_commands(rep, Arc::clone(&probes), cancel.clone()))
        .collect();
    let feeder = feed(
        &server,
        std::mem::take(&mut sim.workers),
        sim.ports.clone(),
        cancel.clone(),
    );

    // The server samples its counters every 2 s: wait for a few samples, so that the page
    // must draw them on its first poll (it cannot have made that many points itself).
    let mut samples = 0;
    for _ in 0..20 {
        let (status, feed) = http(
            server.addrs.http,
            "GET",
            "/api/dashboard?limit=0&history=1",
            None,
            &[],
        )
        .await;
        assert_eq!(status, 200, "{feed}");
        samples = feed["history"]["rows"].as_array().map_or(0, Vec::len);
        if samples >= 7 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        samples >= 7,
        "the server keeps a history ({samples} samples)"
    );

    let base = format!("http://127.0.0.1:{}", server.addrs.http.port());
    let shot = std::env::var_os("KVPLANE_DASHBOARD_SCREENSHOT")
        .map_or_else(|| browser::repo().join("docs/dashboard.png"), PathBuf::from);
    if let Some(dir) = shot.parent() {
        std::fs::create_dir_all(dir).expect("screenshot folder");
    }
    let expect = serde_json::json!({
        "workers": expected_workers,
        "instances": 4,
        "action_instance": "llama-8b-0",
        "action_workers": 2,
        "filter": "qwen",
        "filter_rows": 2,
        "select": ["llama-8b-0", 0],
        "silent_active": ["llama-8b-1", 1],
        "min_history_points": 5,
    });
    // Panics unless the script's report says ok.
    browser::run(
        "dashboard.mjs",
        &[
            base.clone().into(),
            shot.clone().into(),
            expect.to_string().into(),
        ],
        BROWSER_DEADLINE,
    )
    .await;
    cancel.cancel();
    assert!(
        probes.load(Ordering::Relaxed) >= 2,
        "the /health action reached both workers of the instance"
    );
    assert!(shot.exists(), "screenshot saved at {}", shot.display());

    for task in servers {
        let _ = within("command server stops", task).await;
    }
    let _ = within("feeder stops", feeder).await;
    within("server stops", server.stop()).await;
}
