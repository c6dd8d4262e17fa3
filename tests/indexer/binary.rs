//! The binary: `kvplane indexer` (flags from `KVPLANE_INDEXER_*`, port 0, address logged,
//! clean exit on SIGTERM) and `kvplane serve --indexer-port`, which runs both services.

use crate::support::http;
use crate::support::process::Launch;

#[tokio::test]
async fn indexer_reads_env_flags_logs_its_port_and_stops_on_sigterm() {
    let mut kv = Launch::kvplane("indexer")
        .env("KVPLANE_INDEXER_HOST", "127.0.0.1")
        .env("KVPLANE_INDEXER_PORT", "0")
        .spawn();
    let addr = kv.listening("kvplane indexer listening").await.addr("http");
    assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");
    assert_eq!(http(addr, "GET", "/healthz", None, &[]).await.0, 200);
    let (_, services) = http(addr, "GET", "/services", None, &[]).await;
    assert!(
        services.to_string().contains("\"hash_seed\":1337"),
        "{services}"
    );
    kv.stop().await;
}

#[tokio::test]
async fn serve_with_indexer_port_runs_both() {
    let mut kv = Launch::kvplane("serve")
        .args(["--host", "127.0.0.1", "--port", "0", "--indexer-port", "0"])
        .args(["--monitor-ports", r#"{"pull": 0}"#])
        .spawn();
    let controller = kv.listening("kvplane controller listening").await;
    let indexer = kv.listening("kvplane indexer listening").await;
    assert_ne!(controller.addr("http"), indexer.addr("http"));
    let (_, openapi) = http(indexer.addr("http"), "GET", "/openapi.json", None, &[]).await;
    assert!(openapi.to_string().contains("/query_by_hash"), "{openapi}");
    kv.stop().await;
}
