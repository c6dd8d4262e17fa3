//! The `kvplane coordinator` binary: flags from LMCache's `LMCACHE_MP_COORDINATOR_*` and
//! kvplane's `KVPLANE_COORDINATOR_*` variables, port 0, the listening line, clean exit on
//! SIGTERM; a bad value names its flag; `--cluster` is read from `KVPLANE_COORDINATOR_CLUSTER*` (and the deprecated `KVPLANE_CLUSTER*`) and checked.

use crate::support::process::Launch;
use crate::support::{http, STEP};

#[tokio::test]
async fn coordinator_reads_both_env_forms_serves_and_stops_on_sigterm() {
    let kv = Launch::kvplane("coordinator")
        .env("LMCACHE_MP_COORDINATOR_HOST", "127.0.0.1")
        .env("LMCACHE_MP_COORDINATOR_PORT", "1")
        .env("KVPLANE_COORDINATOR_PORT", "0")
        .env("LMCACHE_MP_COORDINATOR_ENABLE_STARTUP_RESYNC", "False");
    healthz_then_sigterm(kv).await;
}

#[tokio::test]
async fn serve_runs_the_coordinator_in_process_with_coordinator_port() {
    let kv = Launch::kvplane("serve")
        .args([
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
    healthz_then_sigterm(kv).await;
}

/// Starts `kv`, finds the coordinator's listening line, checks `/healthz`, stops it.
async fn healthz_then_sigterm(kv: Launch) {
    let mut kv = kv.spawn();
    let addr = kv
        .listening("MP coordinator listening on")
        .await
        .addr("http");
    assert!(
        addr.ip().is_loopback() && ![0, 1].contains(&addr.port()),
        "{addr}"
    );
    let (status, body) = http(addr, "GET", "/healthz", None, &[]).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.to_string().contains("healthy"), "{body}");
    kv.stop().await;
}

#[tokio::test]
async fn a_bad_lmcache_variable_names_the_flag() {
    let out = Launch::kvplane("coordinator")
        .env("LMCACHE_MP_COORDINATOR_TRIGGER_WATERMARK", "0")
        .run(STEP)
        .await;
    assert!(!out.status.success());
    assert!(out.stderr.contains("--trigger-watermark"), "{}", out.stderr);
}

#[tokio::test]
async fn cluster_flags_are_read_and_checked() {
    // Unreachable NATS: the start fails at once, naming --cluster (no port was bound).
    let out = Launch::kvplane("coordinator")
        .env("KVPLANE_COORDINATOR_CLUSTER", "nats://127.0.0.1:1")
        .env("KVPLANE_COORDINATOR_PORT", "0")
        .run(STEP)
        .await;
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("--cluster: cannot reach NATS"),
        "{}",
        out.stderr
    );
    let out = Launch::kvplane("coordinator")
        .args(["--cluster", "nats://127.0.0.1:1"])
        // The old shared name still counts (deprecated).
        .env("KVPLANE_CLUSTER_LEASE_TTL", "0")
        .run(STEP)
        .await;
    assert!(!out.status.success());
    assert!(out.stderr.contains("--cluster-lease-ttl"), "{}", out.stderr);
}
