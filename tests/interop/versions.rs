//! Real LMCache workers of every controller-wire generation against ONE `kvplane serve` (the
//! binary, as a child process) at once: 0.3.9 (registration and heartbeats pushed with `distributed_url`, one admit per
//! message, no reply to registration), 0.3.11 (`peer_init_url`, batched ops, still pushed),
//! 0.4.7 and 0.5.6 (REQ-REP registration with `RegisterRetMsg`, heartbeat commands, full sync).
//! Each is the unmodified `LMCacheWorker` of its wheel on the real torch 2.15.0 CPU wheel
//! (tests/interop/lmcache_version_worker.py; scripts/setup-lmcache-versions.sh installs the
//! older wheels beside the MP-fleet venv); only the engine behind each worker is fake.
//!
//! Checks: every worker registers and admits, and `/controller/workers` names its generation;
//! each finds the next version's keys by P2P lookup;
//! `POST /clear` reaches each one's REP socket and its evicts empty its keys; after a kvplane
//! SIGKILL and restart of the binary on the same ports every worker is back, the ones with full sync rebuilt by it, and
//! lookups across versions work again. Loopback only; every wait is bounded.

use crate::support::lmcache::{releases_dir, LmcacheWorker};
use crate::support::mp_fleet;
use crate::support::process::Process;
use crate::support::*;
use serde_json::{json, Value};

const CPU: &str = "LocalCPUBackend";

/// The releases run together, one per wire generation, with the generation
/// `/controller/workers` names and whether it has full sync.
const RELEASES: [(&str, &str, bool); 4] = [
    ("0.3.9", "0.3.3-0.3.9", false),
    ("0.3.11", "0.3.10-0.3.11", false),
    ("0.4.7", "0.3.12-0.5.6", true),
    ("0.5.6", "0.3.12-0.5.6", true),
];

struct Member {
    release: &'static str,
    protocol: &'static str,
    instance: String,
    peer: String,
    full_sync: bool,
    worker: LmcacheWorker,
}

fn keys_for(i: usize, round: i64) -> Vec<i64> {
    let base = 1_000 * (i as i64 + 1) + 100 * round;
    vec![base + 1, base + 2, base + 3]
}

/// `kvplane serve` as a child process on fixed loopback ports, killed when dropped.
struct Serve {
    process: Process,
    ports: ServePorts,
}

impl Serve {
    /// Starts the binary on `ports` and waits until `/readyz` is 200, retrying (bounded) while
    /// a previous instance's ports are released.
    async fn start(ports: ServePorts) -> Self {
        let process = ports.serve(&[]).await;
        Serve { process, ports }
    }

    /// `GET /controller/workers` rows.
    async fn workers(&self) -> Vec<Value> {
        let (status, list) = http(
            self.ports.http_addr(),
            "GET",
            "/controller/workers",
            None,
            &[],
        )
        .await;
        assert_eq!(status, 200, "{list}");
        list["workers"].as_array().cloned().unwrap_or_default()
    }

    /// The row of `instance`'s worker 0, if registered.
    async fn row(&self, instance: &str) -> Option<Value> {
        let rows = self.workers().await;
        rows.into_iter()
            .find(|r| r["instance_id"] == json!(instance))
    }

    /// Keys the controller holds for `instance` (its one worker).
    async fn key_count(&self, instance: &str) -> Option<u64> {
        self.row(instance)
            .await
            .and_then(|r| r["key_count"].as_u64())
    }

    /// A series of `/metrics`.
    async fn metric(&self, series: &str) -> f64 {
        let (status, text) = http(self.ports.http_addr(), "GET", "/metrics", None, &[]).await;
        assert_eq!(status, 200);
        let text = text.as_str().unwrap_or_default();
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{series} "))),
            "{series} is not in /metrics"
        );
        sample(text, series)
    }
}

/// Each member's row in `GET /controller/workers` names its wire generation.
async fn generations_shown(serve: &Serve, members: &[Member]) {
    for m in members {
        let row = serve
            .row(&m.instance)
            .await
            .unwrap_or_else(|| panic!("{} not listed", m.release));
        assert_eq!(row["protocol"], json!(m.protocol), "{}: {row}", m.release);
        assert_eq!(row["peer_init_url"], json!(m.peer), "{}: {row}", m.release);
    }
}

/// Each member looks up the next member's `round` keys and must find them at that member.
async fn lookups_across_versions(members: &mut [Member], round: i64) {
    let n = members.len();
    for i in 0..n {
        let next = (i + 1) % n;
        let (inst, peer) = (members[next].instance.clone(), members[next].peer.clone());
        let mut hashes = keys_for(next, round);
        hashes.push(999_999);
        let found = members[i]
            .worker
            .call(json!({"cmd": "lookup", "hashes": hashes}), SLOW)
            .await;
        assert_eq!(
            found["layout_info"],
            json!([[inst, CPU, 3, peer]]),
            "{} looking up {}'s keys: {found}",
            members[i].release,
            members[next].release
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lmcache_workers_of_every_wire_generation_share_one_controller() {
    let (Some(venv), Some(releases)) = (mp_fleet::venv(), releases_dir()) else {
        return;
    };
    let ports = ServePorts::free();
    let serve = Serve::start(ports).await;
    let (pull, reply) = (
        format!("127.0.0.1:{}", ports.pull),
        format!("127.0.0.1:{}", ports.reply),
    );
    let mut members = Vec::new();
    for (release, protocol, full_sync) in RELEASES {
        let instance = format!("inst-{release}");
        let peer = format!("127.0.0.1:{}", free_port());
        let args: Vec<String> = [
            "--pull",
            &pull,
            "--reply",
            &reply,
            "--instance-id",
            &instance,
            "--worker-port",
            &free_port().to_string(),
            "--peer-init-url",
            &peer,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let worker = LmcacheWorker::start_release(release, &venv, &releases, &args).await;
        members.push(Member {
            release,
            protocol,
            instance,
            peer,
            full_sync,
            worker,
        });
    }
    for m in &mut members {
        let ready = m
            .worker
            .wait_for("ready", SLOW, |e| e["event"] == "ready")
            .await;
        assert_eq!(ready["version"], json!(m.release), "{ready}");
        if m.full_sync {
            // The REQ-REP generation waits for its RegisterRetMsg.
            m.worker
                .wait_for("registered", SLOW, |e| e["event"] == "registered")
                .await;
        }
    }
    eventually("every generation registered", SLOW, async || {
        serve.workers().await.len() == RELEASES.len()
    })
    .await;

    // Admits, each as its version sends them.
    admit_all(&serve, &mut members, 0).await;
    generations_shown(&serve, &members).await;
    assert_eq!(
        serve.metric("kvplane_kv_seq_discontinuities_total").await,
        0.0,
        "0.3.9 numbers no op, the others number theirs in order"
    );
    lookups_across_versions(&mut members, 0).await;

    // POST /clear reaches each worker's REP socket; its evicts empty the index.
    for m in &mut members {
        let body = json!({"instance_id": m.instance, "location": CPU}).to_string();
        let (status, answer) = http(ports.http_addr(), "POST", "/clear", Some(&body), &[]).await;
        assert_eq!(status, 200, "{}: {answer}", m.release);
        assert_eq!(answer["num_tokens"], json!(3), "{}: {answer}", m.release);
        m.worker
            .wait_for("engine clear", SLOW, |e| {
                e["event"] == "engine_call" && e["name"] == "clear"
            })
            .await;
        eventually(
            &format!("{}'s evicts after clear", m.release),
            SLOW,
            async || serve.key_count(&m.instance).await == Some(0),
        )
        .await;
    }

    // New admits, then kvplane is killed and restarted on the same ports.
    admit_all(&serve, &mut members, 1).await;
    let mut process = serve.process;
    process.kill().await;
    let serve = Serve::start(ports).await;
    eventually(
        "every generation back after the restart",
        SLOW,
        async || serve.workers().await.len() == RELEASES.len(),
    )
    .await;
    for (i, m) in members.iter_mut().enumerate() {
        if m.full_sync {
            // Registered again by its heartbeat, told to sync, and rebuilt by the sync.
            let cmd = m
                .worker
                .wait_new("full_sync command", SLOW, |e| {
                    e["event"] == "heartbeat_commands"
                        && e["commands"].to_string().contains("full_sync")
                })
                .await;
            assert!(cmd.to_string().contains("worker_re_registered"), "{cmd}");
        } else {
            // No full sync on this wire: the worker is registered again by its pushed
            // heartbeat and re-admits what it holds, as its own engine would on its next store.
            m.worker
                .call(json!({"cmd": "admit", "keys": keys_for(i, 1)}), SLOW)
                .await;
        }
        eventually(
            &format!("{}'s keys after the restart", m.release),
            SLOW,
            async || serve.key_count(&m.instance).await == Some(3),
        )
        .await;
    }
    generations_shown(&serve, &members).await;
    lookups_across_versions(&mut members, 1).await;

    for m in members {
        m.worker.close().await;
    }
    eventually("every generation deregistered", SLOW, async || {
        serve.workers().await.is_empty()
    })
    .await;
}

/// Every member admits its `round` keys; the controller then holds exactly three for each.
async fn admit_all(serve: &Serve, members: &mut [Member], round: i64) {
    for (i, m) in members.iter_mut().enumerate() {
        m.worker
            .call(json!({"cmd": "admit", "keys": keys_for(i, round)}), SLOW)
            .await;
    }
    for m in members.iter() {
        eventually(&format!("{}'s admits", m.release), SLOW, async || {
            serve.key_count(&m.instance).await == Some(3)
        })
        .await;
    }
}
