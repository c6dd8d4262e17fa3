//! Driver-level tests of the sweep on paused tokio time: liveness and full-sync timeouts are
//! crossed with `tokio::time::advance`, never by sleeping; probe concurrency is counted.

use super::*;
use crate::config::ServeConfig;
use crate::controller::RouterKind;
use crate::protocol::{FullSyncStartMsg, HeartbeatMsg, RegisterMsg};
use std::sync::atomic::{AtomicUsize, Ordering};

const TIMEOUT: Duration = Duration::from_secs(60);

fn shared(max_probes: usize) -> Arc<Driver> {
    let mut config = ServeConfig::ephemeral();
    config.worker_timeout = TIMEOUT;
    config.full_sync_timeout = Duration::from_secs(120);
    config.max_concurrent_probes = max_probes;
    Arc::new(Driver::new(config, None))
}

fn register(shared: &Driver, inst: &str, wid: i64, port: u16) {
    let reply = shared.handle_request(
        RouterKind::Reply,
        Msg::RegisterMsg(RegisterMsg {
            instance_id: inst.into(),
            worker_id: wid,
            ip: "127.0.0.1".into(),
            port: i64::from(port),
            peer_init_url: None,
            distributed_url: None,
        }),
    );
    assert!(matches!(reply, Msg::RegisterRetMsg(_)), "{reply:?}");
}

fn heartbeat(shared: &Driver, inst: &str, wid: i64) -> Msg {
    shared.handle_request(
        RouterKind::Heartbeat,
        Msg::HeartbeatMsg(HeartbeatMsg {
            instance_id: inst.into(),
            worker_id: wid,
            ip: "127.0.0.1".into(),
            port: 1,
            peer_init_url: None,
            distributed_url: None,
        }),
    )
}

/// A probe that never answers, counting how many run at once.
#[derive(Default)]
struct Counter {
    now: AtomicUsize,
    max: AtomicUsize,
    total: AtomicUsize,
}

fn failing_probe(
    counter: &Arc<Counter>,
) -> impl Fn(Arc<Driver>, ProbeTarget) -> std::pin::Pin<Box<dyn Future<Output = ProbeResult> + Send>>
{
    let counter = Arc::clone(counter);
    move |_, _| {
        let counter = Arc::clone(&counter);
        Box::pin(async move {
            let n = counter.now.fetch_add(1, Ordering::SeqCst) + 1;
            counter.max.fetch_max(n, Ordering::SeqCst);
            counter.total.fetch_add(1, Ordering::SeqCst);
            // Stays in flight across a timer, so the others get their chance to start.
            tokio::time::sleep(Duration::from_millis(10)).await;
            counter.now.fetch_sub(1, Ordering::SeqCst);
            ProbeResult::Failed("no answer".into())
        })
    }
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_stale_workers_are_swept_with_bounded_probes() {
    const WORKERS: usize = 10_000;
    const LIMIT: usize = 64;
    let shared = shared(LIMIT);
    for i in 0..WORKERS {
        register(&shared, &format!("inst-{}", i / 8), (i % 8) as i64, 1);
    }
    assert_eq!(shared.downlink_count(), WORKERS);
    tokio::time::advance(TIMEOUT + Duration::from_secs(1)).await;

    let counter = Arc::new(Counter::default());
    let stats = sweep_with(&shared, failing_probe(&counter)).await;
    assert_eq!(stats.stale, WORKERS);
    assert_eq!(stats.removed, WORKERS);
    assert_eq!(
        counter.total.load(Ordering::SeqCst),
        WORKERS,
        "each probed once"
    );
    let max = counter.max.load(Ordering::SeqCst);
    assert_eq!(
        max, LIMIT,
        "at most --max-concurrent-probes in flight, and that many used"
    );
    assert_eq!(shared.metrics.probes_in_flight.get(), 0);
    assert_eq!(
        shared.metrics.probes.with_label_values(&["removed"]).get(),
        WORKERS as u64
    );
    assert_eq!(shared.index().worker_count(), 0);
    assert_eq!(shared.downlink_count(), 0, "no downlink leaked");
    shared.check_consistency().expect("consistent");
}

#[tokio::test(start_paused = true)]
async fn a_worker_is_probed_only_after_the_timeout_and_kept_if_it_spoke() {
    let shared = shared(4);
    register(&shared, "a", 0, 1);
    register(&shared, "a", 1, 1);
    let counter = Arc::new(Counter::default());

    tokio::time::advance(TIMEOUT - Duration::from_secs(1)).await;
    let stats = sweep_with(&shared, failing_probe(&counter)).await;
    assert_eq!(
        stats,
        SweepStats::default(),
        "nobody is stale before the timeout"
    );

    // a/1 heartbeats; a/0 stays silent past the timeout.
    assert!(matches!(
        heartbeat(&shared, "a", 1),
        Msg::HeartbeatRetMsg(_)
    ));
    tokio::time::advance(Duration::from_secs(2)).await;
    let stats = sweep_with(&shared, failing_probe(&counter)).await;
    assert_eq!((stats.stale, stats.removed), (1, 1));
    assert!(shared.index().worker("a", 0).is_none());
    assert!(shared.index().worker("a", 1).is_some());

    // A probe that answers keeps a silent worker, and counts as contact.
    tokio::time::advance(TIMEOUT + Duration::from_secs(1)).await;
    let stats = sweep_with(&shared, |_, _| async { ProbeResult::Answered }).await;
    assert_eq!((stats.stale, stats.answered, stats.removed), (1, 1, 0));
    let stats = sweep_with(&shared, failing_probe(&counter)).await;
    assert_eq!(stats.stale, 0, "the answer reset its silence");
    shared.check_consistency().expect("consistent");
}

#[tokio::test(start_paused = true)]
async fn a_stalled_full_sync_expires_on_paused_time() {
    let shared = shared(4);
    register(&shared, "a", 0, 1);
    let start = Msg::FullSyncStartMsg(FullSyncStartMsg {
        instance_id: "a".into(),
        worker_id: 0,
        location: "cpu".into(),
        sync_id: "s".into(),
        total_keys: 4,
        batch_count: 2,
    });
    assert!(matches!(
        shared.handle_request(RouterKind::Reply, start),
        Msg::FullSyncStartRetMsg(r) if r.accepted
    ));
    let retry = |m: Msg| match m {
        Msg::HeartbeatRetMsg(r) => !r.commands.is_empty(),
        other => panic!("{other:?}"),
    };
    tokio::time::advance(Duration::from_secs(119)).await;
    shared.begin_sweep();
    assert!(!retry(heartbeat(&shared, "a", 0)), "not expired at 119 s");
    tokio::time::advance(Duration::from_secs(2)).await;
    shared.begin_sweep();
    assert!(
        retry(heartbeat(&shared, "a", 0)),
        "expired after 120 s of silence"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_of_an_old_registration_leaves_the_new_one_and_its_downlink() {
    let shared = shared(4);
    register(&shared, "a", 0, 1);
    tokio::time::advance(TIMEOUT + Duration::from_secs(1)).await;
    // The sweep picks generation 1; the worker restarts on a new port before the probe ends.
    let old = shared.begin_sweep();
    assert_eq!(old.len(), 1);
    register(&shared, "a", 0, 2);
    let new_generation = shared.downlink("a", 0).map(|e| e.generation);
    assert_ne!(new_generation, Some(old[0].generation));
    tokio::time::advance(TIMEOUT + Duration::from_secs(1)).await;
    assert!(
        !shared.probe_failed(&old[0]),
        "stale and silent, but not the probed registration"
    );
    assert_eq!(
        shared.downlink("a", 0).map(|e| e.generation),
        new_generation
    );
    shared.check_consistency().expect("consistent");
}
