//! A node holding two TP ranks, registered with kvplane's controller, against LMCache 0.5.6's
//! own classes: its `LMCServerConnector` (tests/interop/lmcache_node_client.py) stores and
//! reads the objects, and two real `LMCacheWorker`s of one engine (ranks 0 and 1,
//! tests/interop/lmcache_worker.py) make the P2P lookups.
//!
//! A lookup's answer (`BatchedP2PLookupRetMsg`) names instance, location, hit count and
//! `peer_init_url`, not the worker: every rank of a node shares its `lm://` address. So the
//! ranks keep their chunks in different tiers (rank 0 in L2 only, rank 1 in L1 only) and the
//! location in each answer shows which of the node's workers the controller paired the
//! requester with. A controller that ignored the requester's rank (LMCache 0.5.6's, spec
//! §3.6) would answer both ranks with the same worker's location.

use crate::support::lmcache::{python, worker_args, LmcacheWorker};
use crate::support::node::*;
use crate::support::process::Launch;
use crate::support::*;
use serde_json::{json, Value};
use std::path::PathBuf;

const CPU: &str = "LocalCPUBackend";
const DISK: &str = "LocalDiskBackend";
/// One chain of three chunks, held by both ranks.
const CHAIN: [u64; 3] = [0x1a1, 0x1a2, 0x1a3];
const LEN: usize = 4096;

fn key(rank: u64, hash: u64) -> String {
    format!("ranks@2@{rank}@{hash:x}@bfloat16")
}

/// `[key, seed, len]` of every chunk of `rank`: the ranks' bodies differ.
fn objects(rank: u64) -> Vec<Value> {
    CHAIN
        .iter()
        .map(|&h| json!([key(rank, h), rank * 1000 + h, LEN]))
        .collect()
}

/// Runs LMCache's connector on `spec` against `lm`; asserts every check passed.
async fn connector(lm: &str, spec: &Value) {
    let (host, port) = lm.rsplit_once(':').expect("host:port");
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/lmcache_node_client.py");
    let out = Launch::python("lmcache connector", python(), script)
        .arg(host)
        .arg(port)
        .arg(spec.to_string())
        .run(SLOW)
        .await;
    out.assert_success("LMCache connector");
    let checks: Vec<Value> = out
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        !checks.is_empty() && checks.iter().all(|c| c["ok"] == true),
        "{}",
        out.stdout
    );
}

/// An engine's worker of `rank` (a real `LMCacheWorker`), registered.
async fn engine(server: &kvplane::controller::Server, rank: u64) -> LmcacheWorker {
    let (pull, reply) = (ep(server.addrs.pull), ep(server.addrs.reply));
    let mut args = worker_args(&pull, &reply, "engine", free_port(), None);
    let at = args.iter().position(|a| a == "--worker-id").expect("flag") + 1;
    args[at] = rank.to_string();
    let mut w = LmcacheWorker::start(&format!("engine rank {rank}"), &args).await;
    w.wait_for("registered", SLOW, |e| e["event"] == "registered")
        .await;
    w
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lmcache_workers_find_the_node_rank_of_their_own_rank() {
    let server = server().await;
    let dir = tempdir("interop-ranks");
    let node = controller_node(&server, "node-r", |c| {
        c.tp_ranks = 2;
        c.l2 = Some(plain_l2(&dir, 1 << 30));
    })
    .await;
    let lm = node.addrs.lm.to_string();
    let (ours0, ours1) = (objects(0), objects(1));
    let mut all = ours0.clone();
    all.extend(ours1.iter().cloned());
    connector(&lm, &json!({ "put": all })).await;

    // Every chunk of both ranks in both tiers, each rank under its own worker.
    let held = |w: i64, loc: &str| server.shared.index().keys_of("node-r", w, loc).len();
    eventually("both ranks' chunks in L1 and L2", SLOW, async || {
        node.flush_reports(STEP).await;
        [held(0, CPU), held(0, DISK), held(1, CPU), held(1, DISK)] == [3, 3, 3, 3]
    })
    .await;
    // Rank 0 keeps its chunks in L2 only, rank 1 in L1 only.
    let http_addr = node.addrs.http.expect("http");
    let raw = |objs: &[Value]| objs.iter().map(|o| o[0].clone()).collect::<Vec<_>>();
    for (objs, tier) in [(&ours0, "l1"), (&ours1, "l2")] {
        let body = json!({"keys": raw(objs), "tier": tier}).to_string();
        let (status, answer) = http(http_addr, "DELETE", "/cache/objects", Some(&body), &[]).await;
        assert_eq!((status, &answer["deleted"]), (200, &json!(3)), "{answer}");
    }
    eventually("the deletes reached the controller", SLOW, async || {
        node.flush_reports(STEP).await;
        [held(0, CPU), held(0, DISK), held(1, CPU), held(1, DISK)] == [0, 3, 3, 0]
    })
    .await;

    let hashes: Vec<u64> = CHAIN.to_vec();
    for (rank, location) in [(0, DISK), (1, CPU)] {
        let mut w = engine(&server, rank).await;
        let found = w
            .call(json!({"cmd": "lookup", "hashes": hashes}), SLOW)
            .await;
        assert_eq!(
            found["layout_info"],
            json!([["node-r", location, 3, lm]]),
            "engine rank {rank} is paired with the node's rank {rank}: {found}"
        );
        // What the engine's rank then reads from that peer: its own rank's chunks.
        let url = found["layout_info"][0][3]
            .as_str()
            .expect("peer url")
            .to_owned();
        connector(&url, &json!({ "get": objects(rank) })).await;
        w.close().await;
    }
    node.stop().await;
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
