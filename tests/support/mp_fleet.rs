//! A real LMCache 0.5.6 multi-process fleet on 127.0.0.1 for tests/interop/coordinator_fleet.rs: the
//! `kvplane coordinator` binary, `lmcache server` MP servers each with its own `fs` L2
//! directory, and LMCache's own `lmcache bench server --mode cpu` to store real KV through
//! them. Processes are stopped on drop (MP servers by SIGTERM first, so they deregister), every
//! wait is bounded, and each port is fresh.
//!
//! The venv is `$KVPLANE_MP_FLEET_VENV` (`scripts/setup-mp-fleet.sh` prints it; `scripts/test.sh`
//! exports it), else `<repo>/.venv-mp` when built. Without one the tests FAIL under CI
//! (`CI=true`) and are skipped with a loud message elsewhere.

use super::free_port;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// A child process killed on drop, its output in `log`.
pub struct Proc {
    pub name: String,
    child: Option<Child>,
    pub log: PathBuf,
}

impl Proc {
    fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> Proc {
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("{name} starts: {e}"));
        Proc {
            name: name.to_owned(),
            child: Some(child),
            log,
        }
    }

    /// SIGTERM, then SIGKILL when it has not exited within `grace`.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// SIGKILL at once (a crash).
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The last `n` lines of its log.
    pub fn tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

fn lmcache_env(cmd: &mut Command) {
    cmd.env("LMCACHE_TRACK_USAGE", "false")
        .env("DO_NOT_TRACK", "1")
        .env("LMCACHE_DISABLE_BANNER", "1")
        .env("PYTHONUNBUFFERED", "1");
}

/// A `kvplane coordinator` process with short loops.
pub fn coordinator(dir: &Path, port: u16, extra: &[&str]) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvplane"));
    cmd.args(["coordinator", "--host", "127.0.0.1", "--port"])
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
        .env("RUST_LOG", "info");
    Proc::spawn(
        "coordinator",
        cmd,
        dir.join(format!("coordinator-{port}.log")),
    )
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
        dir: &Path,
        id: &str,
        l2: &Path,
        shared: bool,
        coordinator_port: u16,
    ) -> MpServer {
        std::fs::create_dir_all(l2).expect("L2 dir");
        let (rpc_port, http_port) = (free_port(), free_port());
        let adapter = serde_json::json!({"type": "fs", "base_path": l2, "shared": shared});
        let mut cmd = Command::new(venv.join("bin/lmcache"));
        cmd.args([
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
        .args(["--coordinator-event-flush-interval", "0.5"]);
        lmcache_env(&mut cmd);
        let log = dir.join(format!("{id}-{http_port}.log"));
        MpServer {
            id: id.to_owned(),
            rpc_port,
            http_port,
            l2: l2.to_owned(),
            proc: Proc::spawn(id, cmd, log),
        }
    }

    /// Stores `requests` × 256 tokens (16 keys each) through LMCache's own bench client,
    /// sequences `start..start + requests` (distinct starts give distinct keys).
    pub async fn drive(&self, venv: &Path, dir: &Path, start: usize, requests: usize) {
        let mut cmd = tokio::process::Command::new(venv.join("bin/lmcache"));
        cmd.args(["bench", "server", "--rpc-url"])
            .arg(format!("tcp://127.0.0.1:{}", self.rpc_port))
            .args(["--mode", "cpu", "--transfer-mode", "lmcache_driven"])
            .args(["--kvcache-shape-spec", "(2,64,16,2,64):float16:2"])
            .args(["--num-tokens", "256", "--start"])
            .arg(start.to_string())
            .arg("--end")
            .arg((start + requests).to_string())
            .args(["--interval", "0.05", "--url"])
            .arg(format!("http://127.0.0.1:{}", self.http_port))
            .env("LMCACHE_TRACK_USAGE", "false")
            .env("DO_NOT_TRACK", "1")
            .env("LMCACHE_DISABLE_BANNER", "1")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let log = dir.join(format!("bench-{}-{start}.log", self.id));
        let out = std::fs::File::create(&log).expect("log");
        cmd.stdout(out.try_clone().expect("log")).stderr(out);
        let status = tokio::time::timeout(Duration::from_secs(240), cmd.status())
            .await
            .unwrap_or_else(|_| panic!("lmcache bench on {} within 240 s", self.id))
            .expect("lmcache bench runs");
        assert!(
            status.success(),
            "lmcache bench on {}: {status}\n{}",
            self.id,
            std::fs::read_to_string(&log).unwrap_or_default()
        );
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

/// Polls `check` every 500 ms until it returns `Some`, failing after `limit` with `what` and
/// the last value `show` gave.
pub async fn until<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + limit;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) => assert!(
                Instant::now() < deadline,
                "timed out after {limit:?}: {what}; last: {last}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Whether `a` is within `pct` percent of `b` (both 0 counts as equal).
pub fn close(a: u64, b: u64, pct: f64) -> bool {
    let (a, b) = (a as f64, b as f64);
    (a - b).abs() <= b.max(a) * pct / 100.0
}
