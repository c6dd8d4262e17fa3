//! `kvplane node` against real clients and real crashes: LMCache 0.5.6's own
//! `LMCServerConnector` (tests/interop/lmcache_node_client.py, on the stand-in torch) does
//! PUT, GET, EXIST and HEALTH; and the `kvplane` binary is SIGKILLed in the middle of a
//! stream of PUTs, after which every object served from its L2 is intact.

use crate::support::node::*;
use crate::support::process::Launch;
use crate::support::{eventually, SLOW};
use std::path::PathBuf;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lmcache_lm_connector_round_trips_identical_bytes() {
    let node = node_with(|_| {}).await;
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/lmcache_node_client.py");
    let out = Launch::python("lmcache client", python(), script)
        .arg("127.0.0.1")
        .arg(node.addrs.lm.port().to_string())
        .run(SLOW)
        .await;
    out.assert_success("LMCache client");
    let stdout = &out.stdout;
    let checks: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let gets = checks
        .iter()
        .filter(|c| c["check"] == "get" && c["ok"] == true)
        .count();
    assert_eq!(gets, 4, "{stdout}");
    assert!(checks.iter().all(|c| c["ok"] == true), "{stdout}");
    let text = scrape(&node).await;
    assert_eq!(requests(&text, "put", "ok"), 4.0);
    assert_eq!(requests(&text, "health", "ok"), 1.0);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_writes_leaves_only_intact_objects() {
    let dir = tempdir("sigkill");
    let mut child = Launch::kvplane("node")
        .args(["--host", "127.0.0.1", "--port", "0", "--no-http"])
        .arg("--l2-path")
        .arg(&dir)
        .spawn();
    let lm = child.listening("kvplane node listening").await.addr("lm");

    let stream = within("connect", tokio::net::TcpStream::connect(lm))
        .await
        .expect("connect");
    let mut c = Client { stream };
    let n = 300u64;
    let size = |i: u64| 20_000 + (i as usize % 13) * 7_000;
    for i in 0..n / 2 {
        c.put(&format!("k{i}"), &body(i, size(i))).await;
    }
    // Half the objects acknowledged (an EXIST answered after them), then more PUTs in flight
    // when the process dies.
    assert!(c.exists(&format!("k{}", n / 2 - 1)).await);
    for i in n / 2..n {
        c.put(&format!("k{i}"), &body(i, size(i))).await;
    }
    child.kill().await;

    let node = node_with(|cfg| {
        cfg.l2 = Some(plain_l2(&dir, 1 << 30));
    })
    .await;
    eprintln!("recovery after SIGKILL: {:?} of {n} PUTs", node.recovery);
    assert!(node.recovery.recovered > 0, "{:?}", node.recovery);
    let mut c = Client::connect(&node).await;
    let mut served = 0;
    for i in 0..n {
        if let Some((r, got)) = c.get(&format!("k{i}")).await {
            assert!(got == body(i, size(i)), "k{i} is intact");
            assert_eq!(r.meta, META);
            served += 1;
        }
    }
    assert_eq!(
        served, node.recovery.recovered,
        "everything recovered is served, intact"
    );
    let text = scrape(&node).await;
    assert_eq!(
        sample(
            &text,
            r#"kvplane_node_l2_discarded_total{reason="bad_checksum"}"#
        ),
        0.0
    );
    node.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `kvplane` binary configured through the environment twins (`KVPLANE_COORDINATOR_URL`,
/// `KVPLANE_INSTANCE_ID`, …) registers with a coordinator, and deregisters on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_joins_a_coordinator_and_leaves_on_sigterm() {
    use kvplane::coordinator::{self, CoordinatorConfig};
    let mut c = CoordinatorConfig::with_defaults("127.0.0.1", 0);
    c.health_check_interval = None;
    c.eviction_check_interval = None;
    c.resync = None;
    let server = within("coordinator", coordinator::start(c))
        .await
        .expect("coordinator starts");
    let coord = server.addr;
    let mut child = Launch::kvplane("node")
        .args(["--host", "127.0.0.1", "--port", "0", "--http-port", "0"])
        .env("KVPLANE_COORDINATOR_URL", format!("http://{coord}"))
        .env("KVPLANE_INSTANCE_ID", "node-bin")
        .env("KVPLANE_COORDINATOR_HEARTBEAT_INTERVAL", "0.1")
        .spawn();
    let listed = || async {
        let (_, v) = crate::support::http::http(coord, "GET", "/instances", None, &[]).await;
        v["instances"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|i| i["instance_id"].to_string())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    let ids = eventually("the node registered", STEP, async || {
        let ids = listed().await;
        (!ids.is_empty()).then_some(ids)
    })
    .await;
    assert_eq!(ids, vec!["\"node-bin\"".to_owned()]);
    child.stop().await;
    assert!(listed().await.is_empty(), "deregistered on SIGTERM");
    within("stop", server.stop()).await;
}
