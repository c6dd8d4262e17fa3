//! `kvplane bench` with tiny counts against an in-process kvplane: every scenario runs, every
//! op is applied, every lookup answer is right; then the coordinator and node scenarios of
//! `kvplane bench coordinator` / `kvplane bench node` against an in-process coordinator and node.
//! No timing is asserted.

use crate::support::*;
use clap::Parser;

#[derive(Parser)]
struct Wrapper {
    #[command(flatten)]
    bench: kvplane::bench::BenchArgs,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_runs_every_scenario_with_tiny_counts() {
    let server = server().await;
    let pid = std::process::id().to_string();
    let http = format!("http://{}", server.addrs.http);
    let args = Wrapper::parse_from([
        "bench",
        "--pull",
        &ep(server.addrs.pull),
        "--reply",
        &ep(server.addrs.reply),
        "--http",
        &http,
        "--workers",
        "3",
        "--ops",
        "3000",
        "--lookup-keys",
        "2000",
        "--lookup-hashes",
        "20",
        "--lookup-requests",
        "200",
        "--concurrency",
        "2",
        "--sync-keys",
        "4500",
        "--heartbeat-workers",
        "20",
        "--heartbeat-seconds",
        "1",
        "--scenarios",
        "ingest,lookup,sync,heartbeat,churn",
        "--churn-cycles",
        "300",
        "--churn-lanes",
        "4",
        "--timeout",
        "30",
        "--pid",
        &pid,
    ])
    .bench;
    let report = within("bench run", kvplane::bench::run(&args))
        .await
        .expect("bench succeeds");
    let ingest = report.ingest.as_ref().expect("ingest ran");
    assert_eq!(ingest.ops, 3000);
    assert!(ingest.applied_ops_per_sec > 0.0);
    let lookup = report.lookup.as_ref().expect("lookup ran");
    assert_eq!(lookup.latency.count, 200);
    assert_eq!(
        lookup.wrong_answers, 0,
        "every lookup finds its whole chain"
    );
    let sync = report.full_sync.as_ref().expect("sync ran");
    assert_eq!((sync.keys, sync.batches), (4500, 3));
    let hb = report.heartbeat.as_ref().expect("heartbeat ran");
    assert_eq!(hb.latency.count, 20);
    let churn = report.churn.as_ref().expect("churn ran");
    assert_eq!((churn.cycles, churn.lanes), (300, 4));
    assert!(report.rss.start.is_some() && report.rss.end.is_some());
    assert!(report.summary().contains("ops/s applied"));
    // Everything was deregistered afterwards.
    eventually("bench workers deregistered", STEP, async || {
        server.shared.index().worker_count() == 0
    })
    .await;
    server.stop().await;
}

#[derive(Parser)]
struct CoordinatorWrapper {
    #[command(flatten)]
    bench: kvplane::bench::coordinator::CoordinatorBenchArgs,
}

#[derive(Parser)]
struct NodeWrapper {
    #[command(flatten)]
    bench: kvplane::bench::node::NodeBenchArgs,
}

/// A bound for a whole tiny scenario (two one-second phases plus setup, in a debug build).
const SCENARIO: std::time::Duration = std::time::Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_scenario_applies_every_event_and_cleans_up() {
    let coordinator = kvplane::coordinator::start(
        kvplane::coordinator::CoordinatorConfig::with_defaults("127.0.0.1", 0),
    )
    .await
    .expect("coordinator starts");
    let url = format!("http://{}", coordinator.addr);
    let pid = std::process::id().to_string();
    let args = CoordinatorWrapper::parse_from([
        "bench",
        "--url",
        &url,
        "--servers",
        "20",
        "--seconds",
        "1",
        "--senders",
        "2",
        "--batch",
        "10",
        "--salts",
        "3",
        "--timeout",
        "30",
        "--pid",
        &pid,
    ])
    .bench;
    let report = tokio::time::timeout(SCENARIO, kvplane::bench::coordinator::run(&args))
        .await
        .expect("the scenario finishes")
        .expect("the scenario succeeds");
    // One beat per server per phase, every one answered 200.
    assert_eq!(report.heartbeat_idle.count, 20);
    assert_eq!(report.heartbeat_loaded.count, 20);
    // Whole batches only, and the run only ends once GET /quota shows all of them applied.
    assert!(report.events >= 20, "{report:?}");
    assert_eq!(report.events % 10, 0);
    assert_eq!(
        report.event_request.count as u64 * 10,
        report.events,
        "one request per batch"
    );
    assert!(report.events_per_sec > 0.0 && report.applied_seconds >= report.send_seconds);
    assert!(report.rss.start.is_some() && report.rss.peak.is_some());
    assert!(report.summary().contains("events/s applied"));
    // The simulated servers and the quota were removed afterwards.
    let (status, body) = http(coordinator.addr, "GET", "/instances", None, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(
        body["instances"].as_array().map(Vec::len),
        Some(0),
        "{body}"
    );
    let (_, quotas) = http(coordinator.addr, "GET", "/quota", None, &[]).await;
    let rows = quotas["by_cache_salt"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        rows.iter().all(|r| r["quota_exists"] == false),
        "the bench quotas were deleted: {quotas}"
    );
    coordinator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_scenario_with_event_batches_posts_exactly_that_many() {
    let coordinator = kvplane::coordinator::start(
        kvplane::coordinator::CoordinatorConfig::with_defaults("127.0.0.1", 0),
    )
    .await
    .expect("coordinator starts");
    let url = format!("http://{}", coordinator.addr);
    let args = CoordinatorWrapper::parse_from([
        "bench",
        "--url",
        &url,
        "--servers",
        "4",
        "--seconds",
        "1",
        "--senders",
        "2",
        "--batch",
        "10",
        "--event-batches",
        "3",
        "--timeout",
        "30",
    ])
    .bench;
    let report = tokio::time::timeout(SCENARIO, kvplane::bench::coordinator::run(&args))
        .await
        .expect("the scenario finishes")
        .expect("the scenario succeeds");
    // 2 senders × 3 batches × 10 entries, whatever the phase's seconds allowed.
    assert_eq!(report.events, 60, "{report:?}");
    assert_eq!(report.event_request.count, 6);
    assert_eq!(report.heartbeat_loaded.count, 4);
    let zero = CoordinatorWrapper::try_parse_from(["bench", "--event-batches", "0"])
        .expect("parses")
        .bench;
    let err = kvplane::bench::coordinator::run(&zero)
        .await
        .expect_err("zero batches is refused");
    assert!(err.contains("--event-batches"), "{err}");
    coordinator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_scenario_stores_and_reads_back_every_object() {
    let node = kvplane::node::start(kvplane::node::NodeConfig::ephemeral())
        .await
        .expect("node starts");
    let addr = node.addrs.lm.to_string();
    let pid = std::process::id().to_string();
    let args = NodeWrapper::parse_from([
        "bench",
        "--addr",
        &addr,
        "--clients",
        "2",
        "--sizes",
        "16384,65536",
        "--bytes-per-size",
        "262144",
        "--timeout",
        "30",
        "--pid",
        &pid,
    ])
    .bench;
    let report = tokio::time::timeout(SCENARIO, kvplane::bench::node::run(&args))
        .await
        .expect("the scenario finishes")
        .expect("the scenario succeeds (every GET returned the bytes put)");
    assert_eq!(report.sizes.len(), 2);
    for (s, (size, per_client)) in report.sizes.iter().zip([(16384, 8), (65536, 2)]) {
        assert_eq!((s.size, s.objects_per_client), (size, per_client));
        assert_eq!(s.put.ops, 2 * per_client as u64);
        assert_eq!(s.get.ops, s.put.ops);
        assert_eq!(s.get.bytes, s.put.ops * size as u64);
        assert!(s.put.gb_per_sec > 0.0 && s.get.gb_per_sec > 0.0);
        assert!(s.memory_overhead.is_some());
    }
    let usage = node.usage();
    assert_eq!(usage.l1_objects, 2 * 8 + 2 * 2, "every object PUT is held");
    assert!(usage.l1_bytes >= 2 * 262144);
    assert!(report.summary().contains("GB/s"));
    node.stop().await;

    // The baseline needs no server and stores nothing.
    let args = NodeWrapper::parse_from([
        "bench",
        "--baseline",
        "--clients",
        "2",
        "--sizes",
        "16384",
        "--bytes-per-size",
        "65536",
    ])
    .bench;
    let report = tokio::time::timeout(SCENARIO, kvplane::bench::node::run(&args))
        .await
        .expect("the baseline finishes")
        .expect("the baseline succeeds");
    assert_eq!(report.target, "baseline");
    assert_eq!(report.sizes[0].get.ops, 4);
}
