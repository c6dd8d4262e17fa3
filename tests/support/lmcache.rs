//! Drives a real LMCache 0.5.6 `LMCacheWorker` (tests/interop/lmcache_worker.py) from Rust:
//! JSON commands on its stdin, JSON events from its stdout. Loopback only.

use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

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

/// One real LMCache worker process.
pub struct LmcacheWorker {
    pub name: String,
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    /// Every event seen so far, in order.
    pub events: Vec<Value>,
}

impl LmcacheWorker {
    /// Starts a worker; `args` are lmcache_worker.py flags.
    pub async fn start(name: &str, args: &[String]) -> Self {
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/lmcache_worker.py");
        let mut child = Command::new(python())
            .arg(script)
            .args(args)
            .env("LMCACHE_TRACK_USAGE", "false")
            .env("DO_NOT_TRACK", "1")
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("python starts");
        let stdin = child.stdin.take().expect("stdin");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        LmcacheWorker {
            name: name.to_owned(),
            child,
            stdin,
            lines,
            events: Vec::new(),
        }
    }

    /// Sends one command.
    pub async fn send(&mut self, cmd: Value) {
        let mut line = cmd.to_string();
        line.push('\n');
        tokio::time::timeout(
            Duration::from_secs(5),
            self.stdin.write_all(line.as_bytes()),
        )
        .await
        .expect("stdin write in time")
        .expect("stdin write");
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
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = tokio::time::timeout(left, self.lines.next_line())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{}: no {what} within {limit:?}; events: {:?}",
                        self.name, self.events
                    )
                })
                .expect("stdout read")
                .unwrap_or_else(|| {
                    panic!(
                        "{}: exited while waiting for {what}; events: {:?}",
                        self.name, self.events
                    )
                });
            let Ok(event) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            self.events.push(event.clone());
            if pred(&event) {
                return event;
            }
        }
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
        tokio::time::timeout(limit, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("{}: still running after {limit:?}", self.name))
            .expect("wait for the worker process");
    }

    /// Deregisters and waits for the process to exit.
    pub async fn close(mut self) {
        self.send(json!({"cmd": "close"})).await;
        let _ = tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await;
    }
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
