//! `kvplane bench` with tiny counts against an in-process kvplane: every scenario runs, every
//! op is applied, every lookup answer is right. No timing is asserted.

mod common;

use clap::Parser;
use common::*;

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
    assert!(report.rss.start.is_some() && report.rss.end.is_some());
    assert!(report.summary().contains("ops/s applied"));
    // Everything was deregistered afterwards.
    eventually("bench workers deregistered", STEP, || {
        server.shared.index().worker_count() == 0
    })
    .await;
    server.stop().await;
}
