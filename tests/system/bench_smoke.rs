//! `kvplane bench` with tiny counts against an in-process kvplane: every scenario runs, every
//! op is applied, every lookup answer is right; then the coordinator and node scenarios of
//! `kvplane bench coordinator` / `kvplane bench node` against an in-process coordinator and node.
//! No timing is asserted. The parsing of a scenario's flags and its bounded run are shared
//! with `bench_indexer.rs`.

use crate::support::*;
use clap::{Args, Parser};
use std::future::Future;

/// The flags of one `kvplane bench` scenario, parsed as the CLI parses them.
#[derive(Parser)]
struct Bench<A: Args> {
    #[command(flatten)]
    args: A,
}

/// Parses `kvplane bench` `flags` into a scenario's arguments.
pub(crate) fn bench_args<A: Args>(flags: &[&str]) -> A {
    Bench::<A>::parse_from(std::iter::once("bench").chain(flags.iter().copied())).args
}

/// [`bench_args`] with `--timeout 30` and this process's `--pid` (the run samples its memory).
pub(crate) fn timed_bench_args<A: Args>(flags: &[&str]) -> A {
    let pid = std::process::id().to_string();
    bench_args(&[flags, &["--timeout", "30", "--pid", &pid]].concat())
}

/// A bound for a whole tiny scenario (two one-second phases plus setup, in a debug build).
const SCENARIO: std::time::Duration = std::time::Duration::from_secs(60);

/// Awaits a scenario's run, bounded by [`SCENARIO`]; the test fails unless it succeeds.
pub(crate) async fn scenario<R>(run: impl Future<Output = Result<R, String>>) -> R {
    tokio::time::timeout(SCENARIO, run)
        .await
        .expect("the scenario finishes")
        .unwrap_or_else(|e| panic!("the scenario fails: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_runs_every_scenario_with_tiny_counts() {
    let server = server().await;
    let http = format!("http://{}", server.addrs.http);
    let args = timed_bench_args(&[
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
    ]);
    let report = scenario(kvplane::bench::run(&args)).await;
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

/// The coordinator scenario's load flags: `servers` MP servers at `url`, one-second phases,
/// two senders of batches of 10.
fn load<'a>(url: &'a str, servers: &'a str) -> [&'a str; 10] {
    [
        "--url",
        url,
        "--servers",
        servers,
        "--seconds",
        "1",
        "--senders",
        "2",
        "--batch",
        "10",
    ]
}

/// An in-process coordinator with the defaults, and its base URL.
async fn coordinator_at_url() -> (kvplane::coordinator::CoordinatorServer, String) {
    let config = kvplane::coordinator::CoordinatorConfig::with_defaults("127.0.0.1", 0);
    let coordinator = within("coordinator", kvplane::coordinator::start(config))
        .await
        .expect("coordinator starts");
    let url = format!("http://{}", coordinator.addr);
    (coordinator, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_scenario_applies_every_event_and_cleans_up() {
    let (coordinator, url) = coordinator_at_url().await;
    let args = timed_bench_args(&[&load(&url, "20")[..], &["--salts", "3"]].concat());
    let report = scenario(kvplane::bench::coordinator::run(&args)).await;
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
    let (coordinator, url) = coordinator_at_url().await;
    let args = bench_args(
        &[
            &load(&url, "4")[..],
            &["--event-batches", "3", "--timeout", "30"],
        ]
        .concat(),
    );
    let report = scenario(kvplane::bench::coordinator::run(&args)).await;
    // 2 senders × 3 batches × 10 entries, whatever the phase's seconds allowed.
    assert_eq!(report.events, 60, "{report:?}");
    assert_eq!(report.event_request.count, 6);
    assert_eq!(report.heartbeat_loaded.count, 4);
    let zero = bench_args(&["--event-batches", "0"]);
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
    let args = timed_bench_args(&[
        "--addr",
        &addr,
        "--clients",
        "2",
        "--sizes",
        "16384,65536",
        "--bytes-per-size",
        "262144",
    ]);
    let report = scenario(kvplane::bench::node::run(&args)).await;
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
    let args = bench_args(&[
        "--baseline",
        "--clients",
        "2",
        "--sizes",
        "16384",
        "--bytes-per-size",
        "65536",
    ]);
    let report = scenario(kvplane::bench::node::run(&args)).await;
    assert_eq!(report.target, "baseline");
    assert_eq!(report.sizes[0].get.ops, 4);
}
