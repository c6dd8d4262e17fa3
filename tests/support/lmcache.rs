//! Drives a real LMCache `LMCacheWorker` from Rust: 0.5.6 with the stand-in torch
//! (tests/interop/lmcache_worker.py), or any release with the real torch
//! (tests/interop/lmcache_version_worker.py on the MP-fleet venv, older releases from
//! scripts/setup-lmcache-versions.sh). JSON commands on its stdin, JSON events from its stdout,
//! through the one launcher ([`Launch`]). Loopback only.

use super::eventually;
use super::process::{Launch, Process, Stream};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

/// The interpreter of the project's venv (scripts/setup-python.sh), or `$KVPLANE_PYTHON`.
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("KVPLANE_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(
        venv.exists(),
        "{} is missing: run scripts/setup-python.sh (it installs lmcache==0.5.6 for these tests)",
        venv.display()
    );
    venv
}

/// Where scripts/setup-lmcache-versions.sh installed the older releases (one folder each):
/// `$KVPLANE_LMCACHE_VERSIONS`, else `<repo>/target/lmcache-versions` when built; `None` (with a
/// loud message) when the tests are to be skipped, a panic under CI.
pub fn releases_dir() -> Option<PathBuf> {
    let built = |d: &std::path::Path| d.join(".kvplane-versions-stamp").is_file();
    if let Some(given) = std::env::var_os("KVPLANE_LMCACHE_VERSIONS").map(PathBuf::from) {
        assert!(
            built(&given),
            "KVPLANE_LMCACHE_VERSIONS={} is not built: run scripts/setup-lmcache-versions.sh",
            given.display()
        );
        return Some(given);
    }
    let local = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/lmcache-versions");
    if built(&local) {
        return Some(local);
    }
    let why = "KVPLANE_LMCACHE_VERSIONS is unset and target/lmcache-versions is not built: run \
               scripts/setup-lmcache-versions.sh (scripts/test.sh does)";
    if std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0") {
        panic!("{why}");
    }
    eprintln!("\n!!!!!!!! SKIPPED (not under CI): {why} !!!!!!!!\n");
    None
}

/// One real LMCache worker process.
pub struct LmcacheWorker {
    pub name: String,
    process: Process,
    /// Stdout lines read so far (events are the JSON ones).
    read: usize,
    /// Every event seen so far, in order.
    pub events: Vec<Value>,
}

impl LmcacheWorker {
    /// Starts a worker; `args` are lmcache_worker.py flags.
    pub async fn start(name: &str, args: &[String]) -> Self {
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/lmcache_worker.py");
        let process = Launch::python(&format!("LMCache worker {name}"), python(), script)
            .args(args)
            .stdin()
            .spawn();
        LmcacheWorker {
            name: name.to_owned(),
            process,
            read: 0,
            events: Vec::new(),
        }
    }

    /// Starts a worker of LMCache `release` with the real torch: `venv` is the MP-fleet venv
    /// (its own lmcache is 0.5.6); any other release runs from its folder under `releases`.
    /// `args` are lmcache_version_worker.py flags.
    pub async fn start_release(
        release: &str,
        venv: &std::path::Path,
        releases: &std::path::Path,
        args: &[String],
    ) -> Self {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/interop/lmcache_version_worker.py");
        let name = format!("LMCache {release} worker");
        let mut launch = Launch::python(&name, venv.join("bin/python"), script)
            .args(args)
            .stdin();
        let folder = releases.join(release);
        if folder.is_dir() {
            launch = launch.env("PYTHONPATH", folder);
        } else {
            assert_eq!(release, "0.5.6", "{} is not installed", folder.display());
        }
        LmcacheWorker {
            name,
            process: launch.spawn(),
            read: 0,
            events: Vec::new(),
        }
    }

    /// Sends one command.
    pub async fn send(&mut self, cmd: Value) {
        self.process.write_line(&cmd.to_string()).await;
    }

    /// Waits for the first event (already seen or new) matching `pred`.
    pub async fn wait_for(
        &mut self,
        what: &str,
        limit: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        if let Some(e) = self.events.iter().find(|e| pred(e)) {
            return e.clone();
        }
        self.wait_new(what, limit, pred).await
    }

    /// Waits for a new event matching `pred`.
    pub async fn wait_new(
        &mut self,
        what: &str,
        limit: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let label = format!("{}: {what}", self.name);
        eventually(&label, limit, async || {
            let lines = self.process.lines_from(Stream::Stdout, self.read);
            self.read += lines.len();
            let mut matched = None;
            for line in lines {
                let Ok(event) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if matched.is_none() && pred(&event) {
                    matched = Some(event.clone());
                }
                self.events.push(event);
            }
            if matched.is_some() {
                return Ok(matched);
            }
            if self.process.closed(Stream::Stdout) {
                // Exited: no event will come.
                return Ok(None);
            }
            Err(format!("events: {:?}", self.events))
        })
        .await
        .unwrap_or_else(|| {
            panic!(
                "{}: exited while waiting for {what}; events: {:?}\n{}",
                self.name,
                self.events,
                self.process.tail(40)
            )
        })
    }

    /// Sends a command with an id and waits for its reply event.
    pub async fn call(&mut self, mut cmd: Value, limit: Duration) -> Value {
        let id = format!("c{}", self.events.len());
        cmd["id"] = json!(id);
        self.send(cmd).await;
        self.wait_new("reply", limit, |e| e["id"] == json!(id))
            .await
    }

    /// Waits (at most `limit`) for the process to exit, e.g. after `{"cmd": "crash"}`.
    pub async fn wait_exit(&mut self, limit: Duration) {
        self.process.wait_exit(limit).await;
    }

    /// Deregisters and waits (at most 15 s) for the process to exit; killed otherwise.
    pub async fn close(mut self) {
        self.send(json!({"cmd": "close"})).await;
        let _ = self.process.exit_within(Duration::from_secs(15)).await;
    }
}

/// The two workers the controller tests run against one controller's `pull` / `reply`
/// (`host:port`): "A" (instance `inst-A`, serving peers at the returned `host:port`) and "B"
/// (`inst-B`, no peer address), each with its command socket on a free port. Not waited for:
/// the caller waits for their `registered` events.
pub async fn worker_pair(pull: &str, reply: &str) -> (LmcacheWorker, String, LmcacheWorker) {
    let peer_a = format!("127.0.0.1:{}", super::free_port());
    let a_args = worker_args(pull, reply, "inst-A", super::free_port(), Some(&peer_a));
    let a = LmcacheWorker::start("A", &a_args).await;
    let b_args = worker_args(pull, reply, "inst-B", super::free_port(), None);
    let b = LmcacheWorker::start("B", &b_args).await;
    (a, peer_a, b)
}

/// Flags for a worker pointed at kvplane's sockets.
pub fn worker_args(
    pull: &str,
    reply: &str,
    instance: &str,
    worker_port: u16,
    peer: Option<&str>,
) -> Vec<String> {
    let mut args = vec![
        "--pull".into(),
        pull.into(),
        "--reply".into(),
        reply.into(),
        "--instance-id".into(),
        instance.into(),
        "--worker-id".into(),
        "0".into(),
        "--worker-port".into(),
        worker_port.to_string(),
        "--heartbeat-time".into(),
        "1".into(),
        "--heartbeat-delay".into(),
        "0.5".into(),
        "--full-sync-startup-delay".into(),
        "0.2".into(),
        "--full-sync-poll-interval".into(),
        "0.3".into(),
    ];
    if let Some(p) = peer {
        args.push("--peer-init-url".into());
        args.push(p.into());
    }
    args
}
