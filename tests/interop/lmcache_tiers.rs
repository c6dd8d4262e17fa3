//! One index over engines and LMCache tiers, against a REAL LMCache 0.5.6 MP server (CPU-only,
//! the real torch; `scripts/setup-mp-fleet.sh`): `kvplane serve --indexer-port --coordinator-port`
//! with an engine instance registered at the indexer with `lmcache_instance_id`, the MP server
//! reporting to the embedded coordinator, and LMCache's own `lmcache bench server` storing
//! through it. Its chunks show in `/query` as CPU blocks of the instance, then DISK blocks as
//! they reach its `fs` L2; when the coordinator evicts L2 (a quota), they leave DISK.

use crate::support::mp_fleet::{self, MpServer, CHUNK};
use crate::support::process::Launch;
use crate::support::{eventually, free_port, http};
use serde_json::json;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);
/// `lmcache bench server`'s token ids of sequence `seq`: `(seq, 9906 × 255)` (256 tokens).
fn bench_tokens(seq: u32) -> Vec<u32> {
    std::iter::once(seq)
        .chain(std::iter::repeat_n(9906, 255))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_mp_servers_chunks_are_cpu_then_disk_blocks_and_leave_on_eviction() {
    let Some(venv) = mp_fleet::venv() else {
        return;
    };
    let coord_port = free_port();
    let kv = Launch::kvplane("serve")
        .args(["--host", "127.0.0.1", "--port", "0", "--indexer-port", "0"])
        .arg("--coordinator-port")
        .arg(coord_port.to_string())
        .args([
            "--monitor-ports",
            r#"{"pull": 0, "reply": 0, "heartbeat": 0}"#,
        ])
        .env("KVPLANE_COORDINATOR_ENABLE_STARTUP_RESYNC", "0")
        .env("KVPLANE_COORDINATOR_EVICTION_CHECK_INTERVAL", "2")
        .env("KVPLANE_COORDINATOR_CHUNK_SIZE", CHUNK.to_string())
        .stop_on_drop(Duration::from_secs(10))
        .spawn();
    let indexer = kv.listening("kvplane indexer listening").await.addr("http");
    let coord = kv
        .listening("MP coordinator listening on")
        .await
        .addr("http");
    let reg = json!({"endpoint": "tcp://127.0.0.1:9", "type": "vLLM", "modelname": "m",
        "instance_id": "vllm-a", "block_size": 16, "dp_rank": 0, "lmcache_instance_id": "mp-a"});
    let (status, body) = http(indexer, "POST", "/register", Some(&reg.to_string()), &[]).await;
    assert_eq!(status, 200, "{body}");

    let dir =
        std::env::temp_dir().join(format!("kvplane-tiers-{}-{coord_port}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let server = MpServer::start(&venv, "mp-a", &dir.join("l2"), false, coord_port);
    eventually("mp-a registered with the coordinator", WAIT, || async {
        let (_, list) = http(coord, "GET", "/instances", None, &[]).await;
        if list.to_string().contains("mp-a") {
            Ok(())
        } else {
            Err(list.to_string())
        }
    })
    .await;
    server.drive(&venv, 1000, 4).await;

    // `(CPU, DISK)` tokens of vllm-a for bench sequence `seq`.
    let tiers = |seq: u32| async move {
        let q = json!({"model": "m", "block_size": 16, "token_ids": bench_tokens(seq)});
        let (status, body) = http(indexer, "POST", "/query", Some(&q.to_string()), &[]).await;
        assert_eq!(status, 200, "{body}");
        let row = &body["default"]["vllm-a"];
        (
            row["CPU"].as_u64().unwrap_or(0),
            row["DISK"].as_u64().unwrap_or(0),
        )
    };
    let (_, view) = http(indexer, "GET", "/global_view", None, &[]).await;
    eprintln!("after the stores: {}", view["lmcache_counters"]);
    for seq in 1000..1004 {
        eventually(&format!("sequence {seq} on CPU and DISK"), WAIT, || async {
            match tiers(seq).await {
                (256, 256) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }
    // A sequence never stored matches nothing.
    assert_eq!(tiers(999).await, (0, 0));

    // A quota far below usage: the coordinator evicts L2, the server deletes, DISK empties.
    let (status, body) = http(
        coord,
        "PUT",
        "/quota/_default",
        Some(r#"{"limit_gb": 1e-9}"#),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    eventually("the evicted chunks leave DISK", WAIT, || async {
        let mut on_disk = Vec::new();
        for seq in 1000..1004 {
            on_disk.push(tiers(seq).await.1);
        }
        if on_disk.iter().all(|d| *d < 256) {
            Ok(())
        } else {
            Err(format!("{on_disk:?}"))
        }
    })
    .await;
    let (_, view) = http(indexer, "GET", "/global_view", None, &[]).await;
    eprintln!("after the eviction: {}", view["lmcache_counters"]);
    assert!(
        view["lmcache_counters"]["chunk_removals"].as_u64() > Some(0),
        "{view}"
    );
    assert_eq!(view["lmcache_counters"]["orphans"], 0, "{view}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
