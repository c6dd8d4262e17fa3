//! The `kvplane coordinator` binary: flags from LMCache's `LMCACHE_MP_COORDINATOR_*` and
//! kvplane's `KVPLANE_COORDINATOR_*` variables, port 0, the listening line, clean exit on
//! SIGTERM; a bad value names its flag; `--cluster` is read from `KVPLANE_CLUSTER*` and checked.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[test]
fn coordinator_reads_both_env_forms_serves_and_stops_on_sigterm() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvplane"));
    cmd.arg("coordinator")
        .env("LMCACHE_MP_COORDINATOR_HOST", "127.0.0.1")
        .env("LMCACHE_MP_COORDINATOR_PORT", "1")
        .env("KVPLANE_COORDINATOR_PORT", "0")
        .env("LMCACHE_MP_COORDINATOR_ENABLE_STARTUP_RESYNC", "False");
    healthz_then_sigterm(cmd);
}

#[test]
fn serve_runs_the_coordinator_in_process_with_coordinator_port() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvplane"));
    cmd.args([
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--coordinator-port",
        "0",
    ])
    .args([
        "--monitor-ports",
        r#"{"pull": 0, "reply": 0, "heartbeat": 0}"#,
    ])
    .env("KVPLANE_COORDINATOR_ENABLE_STARTUP_RESYNC", "0");
    healthz_then_sigterm(cmd);
}

/// Starts `cmd`, finds the coordinator's listening line, checks `/healthz`, stops it.
fn healthz_then_sigterm(mut cmd: Command) {
    let mut child = cmd
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("kvplane starts");
    let stderr = child.stderr.take().expect("stderr piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let addr = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .expect("the listening line is logged within 20 s");
        if let Some(at) = line.find("MP coordinator listening on http://") {
            break line[at + "MP coordinator listening on http://".len()..]
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned();
        }
    };
    assert!(
        addr.starts_with("127.0.0.1:") && !addr.ends_with(":0") && !addr.ends_with(":1"),
        "{addr}"
    );
    let mut stream = std::net::TcpStream::connect(&addr).expect("HTTP port open");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("request");
    let mut body = String::new();
    stream.read_to_string(&mut body).expect("response");
    assert!(
        body.starts_with("HTTP/1.1 200") && body.contains("healthy"),
        "{body}"
    );

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(exit) = child.try_wait().expect("wait") {
            break exit;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("kvplane coordinator did not exit within 10 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "exit status {exit:?}");
}

#[test]
fn a_bad_lmcache_variable_names_the_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvplane"))
        .arg("coordinator")
        .env("LMCACHE_MP_COORDINATOR_TRIGGER_WATERMARK", "0")
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--trigger-watermark"), "{err}");
}

#[test]
fn cluster_flags_are_read_and_checked() {
    // Unreachable NATS: the start fails at once, naming --cluster (no port was bound).
    let out = Command::new(env!("CARGO_BIN_EXE_kvplane"))
        .arg("coordinator")
        .env("KVPLANE_CLUSTER", "nats://127.0.0.1:1")
        .env("KVPLANE_COORDINATOR_PORT", "0")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--cluster: cannot reach NATS"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_kvplane"))
        .args(["coordinator", "--cluster", "nats://127.0.0.1:1"])
        .env("KVPLANE_CLUSTER_LEASE_TTL", "0")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--cluster-lease-ttl"), "{err}");
}
