//! `kvplane bench indexer` with tiny counts against an in-process `kvplane indexer`: the
//! pre-encoded vLLM stream is applied in full (the run fails otherwise), every timed `/query`
//! answer shows its prompt on the right instance, and the counts add up. No timing is asserted.

use crate::bench_smoke::{scenario, timed_bench_args};
use crate::support::within;
use kvplane::indexer::{start, IndexerConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexer_scenario_applies_the_stream_and_answers_every_query() {
    let server = within("indexer", start(IndexerConfig::default()))
        .await
        .expect("start");
    let url = format!("http://{}", server.addr);
    let args = timed_bench_args(&[
        "--url",
        &url,
        "--blocks",
        "3000",
        "--instances",
        "3",
        "--block-size",
        "4",
        "--prompt-blocks",
        "20",
        "--blocks-per-event",
        "6",
        "--queries",
        "100",
    ]);
    let report = scenario(kvplane::bench::indexer::run(&args)).await;
    assert_eq!(report.wrong_answers, 0, "{}", report.summary());
    assert_eq!(report.messages, 150, "3000 blocks in prompts of 20");
    assert_eq!(report.blocks, 3000);
    assert_eq!(
        report.events,
        150 * 4,
        "20 blocks in events of 6: 4 events a prompt"
    );
    assert_eq!(report.query.count, 100);
    assert!(report.rss_bytes_per_membership.is_some());
    // Nothing lost: a full queue makes the receiver wait, it drops nothing.
    let [gaps, _replays, _waits] = report.kvplane_gaps_replays_waits.expect("kvplane counters");
    assert_eq!(gaps, 0, "{}", report.summary());
    // The index holds exactly the published blocks plus one probe prompt per instance.
    let (_, services) = crate::support::http(server.addr, "GET", "/services", None, &[]).await;
    let held: u64 = services["services"]
        .as_array()
        .expect("services")
        .iter()
        .map(|s| s["blocks"]["GPU"].as_u64().expect("GPU"))
        .sum();
    assert_eq!(held, 3000 + 3 * 20, "{services}");
    within("stop", server.stop()).await;
}
