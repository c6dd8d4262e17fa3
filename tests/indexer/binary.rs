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

/// A 0.5.6 `POST /events` body of one batch: `op` on `tier` of the chunks of `tokens`.
fn lmcache_batch(seq: u64, op: &str, tier: &str, tokens: &[u32], chunks: usize) -> String {
    let mut prefix: [u8; 32] = {
        let mut h = blake3::Hasher::new();
        h.update(&0i64.to_be_bytes());
        h.update(&0u32.to_be_bytes());
        h.finalize().into()
    };
    let entries: Vec<serde_json::Value> = tokens
        .chunks_exact(256)
        .take(chunks)
        .enumerate()
        .map(|(i, chunk)| {
            let mut h = blake3::Hasher::new();
            h.update(&prefix);
            for t in chunk {
                h.update(&t.to_be_bytes());
            }
            prefix = h.finalize().into();
            let hex: String = prefix.iter().map(|b| format!("{b:02x}")).collect();
            serde_json::json!({
                "key": {"chunk_hash_hex": hex, "model_name": "m", "kv_rank": (1 << 24) | (1 << 8)},
                "size_bytes": 4096, "token_ids": chunk, "token_offset": i * 256,
            })
        })
        .collect();
    serde_json::json!({"batches": [{"instance_id": "mp-1", "incarnation": 1, "seq": seq,
        "event_type": op, "tier": tier, "backend": "dram", "entries": entries}]})
    .to_string()
}

#[tokio::test]
async fn serve_with_both_ports_shows_lmcache_chunks_as_cpu_and_disk_blocks() {
    let mut kv = Launch::kvplane("serve")
        .args(["--host", "127.0.0.1", "--port", "0", "--indexer-port", "0"])
        .args(["--coordinator-port", "0"])
        .args([
            "--monitor-ports",
            r#"{"pull": 0, "reply": 0, "heartbeat": 0}"#,
        ])
        .env("KVPLANE_COORDINATOR_ENABLE_STARTUP_RESYNC", "0")
        .spawn();
    let (indexer, coord) = crate::support::embedded_http(&kv).await;
    let reg = r#"{"endpoint":"tcp://127.0.0.1:9","type":"vLLM","modelname":"m",
        "instance_id":"vllm-a","block_size":16,"dp_rank":0,"lmcache_instance_id":"mp-1"}"#;
    assert_eq!(
        http(indexer, "POST", "/register", Some(reg), &[]).await.0,
        200
    );
    let tokens: Vec<u32> = (0..768).map(|t| t * 3 + 11).collect();
    let query =
        serde_json::json!({"model": "m", "block_size": 16, "token_ids": tokens}).to_string();
    let answer = || async {
        let (status, body) = http(indexer, "POST", "/query", Some(&query), &[]).await;
        assert_eq!(status, 200, "{body}");
        let row = &body["default"]["vllm-a"];
        (
            row["CPU"].as_u64().unwrap(),
            row["DISK"].as_u64().unwrap(),
            row["GPU"].as_u64().unwrap(),
        )
    };
    assert_eq!(answer().await, (0, 0, 0));
    let post = |body: String| async move {
        let (status, got) = http(coord, "POST", "/events", Some(&body), &[]).await;
        assert_eq!(status, 200, "{got}");
    };
    // Three chunks on L1, two of them on L2: CPU 768 tokens, DISK 512.
    post(lmcache_batch(1, "store", "l1", &tokens, 3)).await;
    assert_eq!(answer().await, (768, 0, 0));
    post(lmcache_batch(2, "store", "l2", &tokens, 2)).await;
    assert_eq!(answer().await, (768, 512, 0));
    // The L1 copies are deleted (evicted): the CPU tier leaves the answer at once.
    post(lmcache_batch(3, "delete", "l1", &tokens, 3)).await;
    assert_eq!(answer().await, (0, 512, 0));
    let (_, view) = http(indexer, "GET", "/global_view", None, &[]).await;
    assert_eq!(view["lmcache_counters"]["chunk_stores"], 5, "{view}");
    assert_eq!(view["lmcache_servers"][0]["chunks_l2"], 2, "{view}");
    let (_, dump) = http(indexer, "GET", "/dump", None, &[]).await;
    let pool = dump["streams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["source"] == "lmcache")
        .unwrap_or_else(|| panic!("{dump}"));
    assert_eq!(pool["blocks"].as_array().unwrap().len(), 32, "{dump}");
    kv.stop().await;
}
