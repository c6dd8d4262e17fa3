//! One index over engines and LMCache tiers, against a REAL LMCache 0.5.6 MP server (CPU-only,
//! the real torch; `scripts/setup-mp-fleet.sh`): `kvplane serve --indexer-port --coordinator-port`
//! with an engine instance registered at the indexer with `lmcache_instance_id`, the MP server
//! reporting to the embedded coordinator, and LMCache's own `lmcache bench server` storing
//! through it. Its chunks show in `/query` as CPU blocks of the instance, then DISK blocks as
//! they reach its `fs` L2, exactly as the coordinator's key directory holds them; when the
//! coordinator evicts L2 (a quota), they leave DISK.

use crate::support::mp_fleet::{self, MpServer, CHUNK};
use crate::support::process::Launch;
use crate::support::{eventually, free_port, http};
use serde_json::json;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);
/// LMCache's rolling BLAKE3 chunk hashes of `tokens`, lowercase hex.
fn chunk_hashes(tokens: &[u32]) -> Vec<String> {
    let mut prefix: [u8; 32] = {
        let mut h = blake3::Hasher::new();
        h.update(&0i64.to_be_bytes());
        h.update(&0u32.to_be_bytes());
        h.finalize().into()
    };
    tokens
        .chunks_exact(CHUNK)
        .map(|c| {
            let mut h = blake3::Hasher::new();
            h.update(&prefix);
            for t in c {
                h.update(&t.to_be_bytes());
            }
            prefix = h.finalize().into();
            prefix.iter().map(|b| format!("{b:02x}")).collect()
        })
        .collect()
}

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
    let (indexer, coord) = crate::support::embedded_http(&kv).await;
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

    // `(CPU, DISK)` tokens of vllm-a for bench sequence `seq`, as the indexer answers.
    let indexed = |seq: u32| async move {
        let q = json!({"model": "m", "block_size": 16, "token_ids": bench_tokens(seq)});
        let (status, body) = http(indexer, "POST", "/query", Some(&q.to_string()), &[]).await;
        assert_eq!(status, 200, "{body}");
        let row = &body["default"]["vllm-a"];
        (
            row["CPU"].as_u64().unwrap_or(0),
            row["DISK"].as_u64().unwrap_or(0),
        )
    };
    // The same from what the coordinator's key directory holds: the run of the sequence's
    // chunks, from its first, with a placement on each tier.
    let directory = || async move {
        let (_, keys) = http(coord, "GET", "/directory/keys", None, &[]).await;
        let mut tiers: std::collections::HashMap<String, (bool, bool)> = Default::default();
        for k in keys["keys"].as_array().cloned().unwrap_or_default() {
            let hex = k["key"]["chunk_hash_hex"].as_str().unwrap_or("").to_owned();
            let on = |t: &str| {
                k["placements"]
                    .as_array()
                    .is_some_and(|p| p.iter().any(|p| p["tier"] == t))
            };
            tiers.insert(hex, (on("l1"), on("l2")));
        }
        (1000..1004u32)
            .map(|seq| {
                let (mut cpu, mut disk, mut cpu_on, mut disk_on) = (0, 0, true, true);
                for hex in chunk_hashes(&bench_tokens(seq)) {
                    let (l1, l2) = tiers.get(&hex).copied().unwrap_or_default();
                    cpu_on &= l1;
                    disk_on &= l2;
                    cpu += if cpu_on { CHUNK as u64 } else { 0 };
                    disk += if disk_on { CHUNK as u64 } else { 0 };
                }
                (cpu, disk)
            })
            .collect::<Vec<_>>()
    };
    let agree = |what: &'static str, check: fn(&[(u64, u64)]) -> bool| async move {
        eventually(what, WAIT, || async {
            let want = directory().await;
            let mut got = Vec::new();
            for seq in 1000..1004 {
                got.push(indexed(seq).await);
            }
            if got == want && check(&got) {
                Ok(got)
            } else {
                Err(format!("indexed {got:?}, directory {want:?}"))
            }
        })
        .await
    };
    // Every chunk the directory holds on L1 (L2) shows as CPU (DISK) blocks, and most
    // sequences are whole on both tiers.
    let stored = agree(
        "the index agrees with the directory after the stores",
        |got| got.iter().filter(|t| **t == (256, 256)).count() >= 2,
    )
    .await;
    eprintln!("after the stores: {stored:?}");
    // A sequence never stored matches nothing.
    assert_eq!(indexed(999).await, (0, 0));

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
    let evicted = agree("the evicted chunks leave DISK", |got| {
        got.iter().all(|t| t.1 < 256)
    })
    .await;
    eprintln!("after the eviction: {evicted:?}");
    let (_, view) = http(indexer, "GET", "/global_view", None, &[]).await;
    eprintln!("counters: {}", view["lmcache_counters"]);
    assert!(
        view["lmcache_counters"]["chunk_removals"].as_u64() > Some(0),
        "{view}"
    );
    assert_eq!(view["lmcache_counters"]["orphans"], 0, "{view}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
