//! A real LMCache 0.5.6 multi-process fleet on 127.0.0.1 for tests/interop/coordinator_fleet.rs: the
//! `kvplane coordinator` binary, `lmcache server` MP servers each with its own `fs` L2
//! directory, and LMCache's own `lmcache bench server --mode cpu` to store real KV through
//! them. Processes start through the one launcher ([`Launch`]) and are stopped on drop (by
//! SIGTERM first, so MP servers deregister), every wait is bounded, and each port is fresh.
//!
//! The venv is `$KVPLANE_MP_FLEET_VENV` (`scripts/setup-mp-fleet.sh` prints it; `scripts/test.sh`
//! exports it), else `<repo>/.venv-mp` when built. Without one the tests FAIL under CI
//! (`CI=true`) and are skipped with a loud message elsewhere.

use super::free_port;
use super::process::{Launch, Process};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Chunk size of the whole fleet (tokens per key): 256-token requests give 16 keys each.
pub const CHUNK: usize = 16;

/// The venv holding `bin/lmcache`, or `None` (with a loud message) when the tests are to be
/// skipped; panics under CI.
pub fn venv() -> Option<PathBuf> {
    let usable = |v: &Path| v.join("bin/lmcache").is_file();
    if let Some(given) = std::env::var_os("KVPLANE_MP_FLEET_VENV").map(PathBuf::from) {
        assert!(
            usable(&given),
            "KVPLANE_MP_FLEET_VENV={} has no bin/lmcache: run scripts/setup-mp-fleet.sh",
            given.display()
        );
        return Some(given);
    }
    let local = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-mp");
    if usable(&local) {
        return Some(local);
    }
    let why = "KVPLANE_MP_FLEET_VENV is unset and there is no .venv-mp: build the real LMCache \
               0.5.6 fleet venv with scripts/setup-mp-fleet.sh (scripts/test.sh does)";
    if std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0") {
        panic!("{why}");
    }
    eprintln!("\n!!!!!!!! SKIPPED (not under CI): {why} !!!!!!!!\n");
    None
}

/// A process of the fleet: SIGTERM on drop (MP servers deregister), SIGKILL after the grace.
pub type Proc = Process;

/// LMCache's environment for its processes: no usage tracking, no banner, unbuffered.
fn lmcache(name: &str, venv: &Path) -> Launch {
    Launch::new(name, venv.join("bin/lmcache"))
        .env("LMCACHE_TRACK_USAGE", "false")
        .env("DO_NOT_TRACK", "1")
        .env("LMCACHE_DISABLE_BANNER", "1")
        .env("PYTHONUNBUFFERED", "1")
}

/// A `kvplane coordinator` process with short loops on `port` (fixed: the MP servers are
/// told it, and a restart comes back on it), once it listens.
pub async fn coordinator(port: u16, extra: &[&str]) -> Proc {
    let c = Launch::kvplane("coordinator")
        .args(["--host", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .args([
            "--eviction-check-interval",
            "2",
            "--health-check-interval",
            "2",
            // Long enough that a crashed server restarts before it times out (the restart,
            // not the timeout, must retire its old incarnation).
            "--instance-timeout",
            "60",
            "--chunk-size",
        ])
        .arg(CHUNK.to_string())
        .args(extra)
        .stop_on_drop(Duration::from_secs(10))
        .spawn();
    c.wait_for_line("MP coordinator listening on").await;
    c
}

/// One `lmcache server` MP server and where its L2 lives.
pub struct MpServer {
    pub id: String,
    pub rpc_port: u16,
    pub http_port: u16,
    /// Its `fs` L2 `base_path`.
    pub l2: PathBuf,
    pub proc: Proc,
}

impl MpServer {
    /// Starts `id` with an `fs` L2 at `l2` (`shared` as declared in its adapter config),
    /// reporting events to the coordinator on `coordinator_port`.
    pub fn start(
        venv: &Path,
        id: &str,
        l2: &Path,
        shared: bool,
        coordinator_port: u16,
    ) -> MpServer {
        std::fs::create_dir_all(l2).expect("L2 dir");
        let (rpc_port, http_port) = (free_port(), free_port());
        let adapter = serde_json::json!({"type": "fs", "base_path": l2, "shared": shared});
        let proc = lmcache(&format!("MP server {id}"), venv)
            .args([
                "server",
                "--instance-id",
                id,
                "--host",
                "127.0.0.1",
                "--port",
            ])
            .arg(rpc_port.to_string())
            .args(["--chunk-size", &CHUNK.to_string()])
            .args([
                "--l1-size-gb",
                "0.25",
                "--no-l1-use-lazy",
                "--eviction-policy",
                "LRU",
            ])
            .args(["--supported-transfer-mode", "auto", "--l2-adapter"])
            .arg(adapter.to_string())
            .args(["--http-host", "127.0.0.1", "--http-port"])
            .arg(http_port.to_string())
            .arg("--coordinator-url")
            .arg(format!("http://127.0.0.1:{coordinator_port}"))
            .args(["--coordinator-advertise-ip", "127.0.0.1"])
            .args(["--coordinator-heartbeat-interval", "2"])
            .args(["--coordinator-event-reporting"])
            .args(["--coordinator-event-flush-interval", "0.5"])
            .stop_on_drop(Duration::from_secs(15))
            .spawn();
        MpServer {
            id: id.to_owned(),
            rpc_port,
            http_port,
            l2: l2.to_owned(),
            proc,
        }
    }

    /// Stores `requests` × 256 tokens (16 keys each) through LMCache's own bench client,
    /// sequences `start..start + requests` (distinct starts give distinct keys).
    pub async fn drive(&self, venv: &Path, start: usize, requests: usize) {
        let out = lmcache(&format!("lmcache bench on {}", self.id), venv)
            .args(["bench", "server", "--rpc-url"])
            .arg(format!("tcp://127.0.0.1:{}", self.rpc_port))
            .args(["--mode", "cpu", "--transfer-mode", "lmcache_driven"])
            .args(["--kvcache-shape-spec", "(2,64,16,2,64):float16:2"])
            .args(["--num-tokens", "256", "--start"])
            .arg(start.to_string())
            .arg("--end")
            .arg((start + requests).to_string())
            .args(["--interval", "0.05", "--url"])
            .arg(format!("http://127.0.0.1:{}", self.http_port))
            .run(Duration::from_secs(240))
            .await;
        out.assert_success(&format!("lmcache bench on {}", self.id));
    }

    /// Bytes of the `.data` files in its L2 directory.
    pub fn disk_bytes(&self) -> u64 {
        data_bytes(&self.l2)
    }
}

/// Bytes of the `.data` files under `dir`, recursively.
pub fn data_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| {
            let path = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => data_bytes(&path),
                Ok(t) if t.is_file() && path.extension().is_some_and(|x| x == "data") => {
                    e.metadata().map_or(0, |m| m.len())
                }
                _ => 0,
            }
        })
        .sum()
}

/// The names in /dev/shm now.
pub fn shm_names() -> std::collections::BTreeSet<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// `GET path` on the coordinator, 200 expected; `None` while it is not answering.
pub async fn get(addr: SocketAddr, path: &str) -> Option<Value> {
    match super::try_http(addr, "GET", path, None, &[]).await {
        Ok((200, v)) => Some(v),
        _ => None,
    }
}

/// Whether `a` is within `pct` percent of `b` (both 0 counts as equal).
pub fn close(a: u64, b: u64, pct: f64) -> bool {
    let (a, b) = (a as f64, b as f64);
    (a - b).abs() <= b.max(a) * pct / 100.0
}
