//! The binary: `kvplane indexer` (flags from `KVPLANE_INDEXER_*`, port 0, address logged,
//! clean exit on SIGTERM) and `kvplane serve --indexer-port`, which runs both services.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Waits for a log line containing each of `needles`; returns the `http=` address of each.
fn logged_addrs(child: &mut Child, needles: &[&str]) -> Vec<String> {
    let stderr = child.stderr.take().expect("stderr piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Keep draining after the test stops listening: a closed pipe would make the
        // child's next log line fail.
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut found: Vec<Option<String>> = vec![None; needles.len()];
    while found.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(left).expect("listening lines within 20 s");
        for (i, needle) in needles.iter().enumerate() {
            if line.contains(needle) {
                let start = line.find("http=").expect("http= field") + 5;
                found[i] = line[start..].split_whitespace().next().map(str::to_owned);
            }
        }
    }
    found.into_iter().flatten().collect()
}

fn get(addr: &str, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).expect("HTTP port open");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).expect("request");
    let mut body = String::new();
    stream.read_to_string(&mut body).expect("response");
    body
}

fn terminate(mut child: Child) {
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
fn indexer_reads_env_flags_logs_its_port_and_stops_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvplane"))
        .arg("indexer")
        .env("KVPLANE_INDEXER_HOST", "127.0.0.1")
        .env("KVPLANE_INDEXER_PORT", "0")
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("kvplane starts");
    let addrs = logged_addrs(&mut child, &["kvplane indexer listening"]);
    assert!(
        addrs[0].starts_with("127.0.0.1:") && !addrs[0].ends_with(":0"),
        "{addrs:?}"
    );
    assert!(get(&addrs[0], "/healthz").starts_with("HTTP/1.1 200"));
    let services = get(&addrs[0], "/services");
    assert!(services.contains("\"hash_seed\":1337"), "{services}");
    terminate(child);
}

#[test]
fn serve_with_indexer_port_runs_both() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvplane"))
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--indexer-port",
            "0",
        ])
        .args(["--monitor-ports", r#"{"pull": 0}"#])
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("kvplane starts");
    let addrs = logged_addrs(
        &mut child,
        &["kvplane controller listening", "kvplane indexer listening"],
    );
    assert_ne!(addrs[0], addrs[1]);
    let openapi = get(&addrs[1], "/openapi.json");
    assert!(openapi.contains("/query_by_hash"), "{openapi}");
    terminate(child);
}
