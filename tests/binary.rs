//! The `kvplane serve` binary: flags from `KVPLANE_*` environment variables, port 0 on every
//! socket, bound addresses logged, clean exit on SIGTERM.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[test]
fn serve_reads_env_flags_logs_addresses_and_stops_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvplane"))
        .arg("serve")
        .env("KVPLANE_HOST", "127.0.0.1")
        .env("KVPLANE_PORT", "0")
        .env(
            "KVPLANE_MONITOR_PORTS",
            r#"{"pull": 0, "reply": 0, "heartbeat": 0}"#,
        )
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
    let line = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .expect("the listening line is logged within 20 s");
        if line.contains("kvplane controller listening") {
            break line;
        }
    };
    let field = |name: &str| -> String {
        let start = line
            .find(&format!("{name}="))
            .unwrap_or_else(|| panic!("{name} in {line}"));
        line[start + name.len() + 1..]
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    let http = field("http");
    assert!(
        http.starts_with("127.0.0.1:") && !http.ends_with(":0"),
        "{line}"
    );
    for socket in ["pull", "reply", "heartbeat"] {
        let v = field(socket);
        assert!(
            v.starts_with("Some(127.0.0.1:") && !v.contains(":0)"),
            "{socket}: {line}"
        );
    }

    let addr = http.parse().expect("HTTP address");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (status, body) = runtime.block_on(common::http(addr, "GET", "/healthz", None, &[]));
    assert_eq!(
        (status, &body["status"]),
        (200, &serde_json::json!("ok")),
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
            panic!("kvplane did not exit within 10 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "exit status {exit:?}");
}

#[test]
fn bad_flags_fail_with_a_message_naming_the_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvplane"))
        .args(["serve", "--monitor-ports", "not json"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--monitor-ports"), "{err}");
}
