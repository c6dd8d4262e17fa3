//! Interop with the real LMCache 0.5.6 worker (PyPI `lmcache==0.5.6`, CPU only, stand-in
//! torch; see tests/interop/). Everything stays on 127.0.0.1.

use crate::support::lmcache::worker_pair;
use crate::support::*;
use kvplane::protocol::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;

const CPU: &str = "LocalCPUBackend";

fn is(event: &'static str) -> impl Fn(&Value) -> bool {
    move |e| e["event"] == event
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_lmcache_workers_register_push_lookup_obey_and_resync_after_restart() {
    let server = server().await;
    let (pull, reply) = (ep(server.addrs.pull), ep(server.addrs.reply));
    let (mut a, peer_a, mut b) = worker_pair(&pull, &reply).await;
    let reg = a.wait_for("registered", SLOW, is("registered")).await;
    assert_eq!(reg["heartbeat_url"], json!(ep(server.addrs.heartbeat)));
    b.wait_for("registered", SLOW, is("registered")).await;
    eventually("both registered", SLOW, async || {
        server.shared.index().worker_count() == 2
    })
    .await;

    // Admits through LMCache's own BatchedMessageSender, hashes across the i64 ∪ u64 range.
    let held: Vec<i128> = vec![101, 102, 103, -7, i128::from(u64::MAX)];
    a.call(
        json!({"cmd": "admit", "keys": [101, 102, 103, -7, u64::MAX]}),
        SLOW,
    )
    .await;
    eventually("A's admits applied", SLOW, async || {
        keys(&server, "inst-A", 0) == held.iter().copied().collect()
    })
    .await;

    // B finds A by P2P lookup through the real worker's DEALER path.
    let found = b
        .call(
            json!({"cmd": "lookup", "hashes": [101, 102, 103, 999]}),
            SLOW,
        )
        .await;
    assert_eq!(
        found["layout_info"],
        json!([["inst-A", CPU, 3, peer_a]]),
        "{found}"
    );
    let own = a
        .call(json!({"cmd": "lookup", "hashes": [101]}), SLOW)
        .await;
    assert_eq!(own["layout_info"], json!([["", "", 0, ""]]), "{own}");

    // Downlink commands reach the real worker's REP loop and its answers come back.
    let downlink = server
        .shared
        .downlink("inst-A", 0)
        .expect("downlink")
        .downlink;
    let health = within(
        "health",
        downlink.request(Msg::HealthWorkerMsg(HealthWorkerMsg {
            worker_event_id: "h1".into(),
        })),
    )
    .await;
    assert_eq!(
        health,
        Ok(Msg::HealthWorkerRetMsg(HealthWorkerRetMsg {
            error_code: 0
        }))
    );
    let clear = within(
        "clear",
        downlink.request(Msg::ClearWorkerMsg(ClearWorkerMsg {
            worker_event_id: "c1".into(),
            location: CPU.into(),
        })),
    )
    .await;
    assert_eq!(
        clear,
        Ok(Msg::ClearWorkerRetMsg(ClearWorkerRetMsg { num_tokens: 5 }))
    );
    a.wait_for("engine clear", SLOW, |e| {
        e["event"] == "engine_call" && e["name"] == "clear"
    })
    .await;
    eventually("A's evicts after clear applied", SLOW, async || {
        keys(&server, "inst-A", 0).is_empty()
    })
    .await;

    // kvplane restarts on the same ports; the workers' own heartbeats and full syncs rebuild
    // the index.
    a.call(json!({"cmd": "admit", "keys": [201, 202, 203]}), SLOW)
        .await;
    eventually("new admits applied", SLOW, async || {
        keys(&server, "inst-A", 0).len() == 3
    })
    .await;
    let addrs = server.addrs;
    server.stop().await;
    let server = restart_on(addrs).await;
    let cmd = a
        .wait_new("full_sync command", SLOW, |e| {
            e["event"] == "heartbeat_commands" && e["commands"].to_string().contains("full_sync")
        })
        .await;
    assert!(cmd.to_string().contains("worker_re_registered"), "{cmd}");
    eventually("index rebuilt by A's full sync", SLOW, async || {
        keys(&server, "inst-A", 0) == BTreeSet::from([201, 202, 203])
    })
    .await;
    let done = a
        .wait_for("A's sync finished", SLOW, is("full_sync_finished"))
        .await;
    assert_eq!(done["ok"], json!(true), "{done}");
    eventually("B re-registered too", SLOW, async || {
        server.shared.index().worker_count() == 2
    })
    .await;

    // After the restart, lookups work again.
    let found = b
        .call(json!({"cmd": "lookup", "hashes": [201, 202]}), SLOW)
        .await;
    assert_eq!(
        found["layout_info"],
        json!([["inst-A", CPU, 2, peer_a]]),
        "{found}"
    );

    a.close().await;
    b.close().await;
    eventually("both deregistered", SLOW, async || {
        server.shared.index().worker_count() == 0
    })
    .await;
    server.stop().await;
}
