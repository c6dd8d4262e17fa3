//! The leader's side without NATS: the owners log every write through the change log into a
//! channel, and a follower fed those bytes holds the leader's state; a lapsed lease refuses
//! dispatches. (A change cut to fit applies as the whole: the replication laws,
//! `changes_tests.rs`.)

use super::*;
use crate::cluster::core_tests::drain;
use crate::cluster::{Lease, LogStats, Record};
use crate::coordinator::model::events::Op;
use crate::coordinator::model::events::Tier;
use crate::coordinator::model::Model;
use crate::coordinator::state::changes::tests::{
    batch, config, fleet_view, key, model_view, reg, stores, Follower,
};
use crate::coordinator::state::changes::Change;
use crate::coordinator::state::driver::{self, wall_now, Timing};
use crate::coordinator::state::logged::ChangeLog;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::time::Instant;
use tokio::sync::mpsc;

fn recorder() -> (Dispatcher, Arc<AtomicU64>) {
    let calls = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&calls);
    let d: Dispatcher = Arc::new(move |_| {
        seen.fetch_add(1, Ordering::Relaxed);
        Box::pin(async { Ok(()) })
    });
    (d, calls)
}

fn takeover(epoch: u64) -> Record<Change> {
    Record {
        epoch,
        seq: 1,
        at_ms: 0,
        now: wall_now(),
        change: Change::Takeover {
            holder: "test".into(),
            fresh: true,
        },
    }
}

#[tokio::test(start_paused = true)]
async fn a_standby_fed_the_leaders_log_holds_the_same_state() {
    let (tx, mut rx) = mpsc::channel(4096);
    let stats = Arc::new(LogStats::default());
    let log = Arc::new(ChangeLog::new(7, 1, 1 << 20, tx, Arc::clone(&stats)));
    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    let (dispatcher, _) = recorder();
    let timing = Timing {
        instance_timeout: Duration::from_secs(30),
        health_check_interval: Some(Duration::from_secs(10)),
        eviction_check_interval: None,
    };
    let h = driver::spawn_replica(
        CoordinatorState::new(Model::new(config())),
        Some(log),
        None,
        timing,
        dispatcher,
        shutdown.clone(),
        &tasks,
    );
    for (id, port) in [("a", 1), ("b", 2), ("quiet", 3)] {
        h.register(reg(id, port), String::new)
            .await
            .unwrap()
            .unwrap();
    }
    let mut anonymous = reg("", 4);
    anonymous.instance_id = None;
    let (generated, _) = h
        .register(anonymous, || "mp-generated".into())
        .await
        .unwrap()
        .unwrap();
    // Events of both tiers, a capacity declaration, a duplicate, an access and a delete; a
    // budget of 8 events leaves slices for later jobs.
    let mut declare = batch("b", 1, Tier::L1, Vec::new());
    declare.capacity = Some((1 << 20, 1));
    let batches = vec![
        batch("a", 1, Tier::L2, stores("t", 0..30, 100)),
        batch("a", 2, Tier::L1, stores("t", 0..4, 10)),
        declare,
        batch("b", 2, Tier::L2, stores("u", 0..6, 70)),
        batch("b", 2, Tier::L2, stores("u", 0..1, 70)),
    ];
    let (got, rest) = h.admit(batches, 8).await.unwrap();
    assert_eq!((got.applied, got.duplicates), (4, 1));
    assert!(!rest.is_empty());
    for b in rest {
        h.apply_slice(b).await.unwrap();
    }
    let touch = batch(
        "a",
        3,
        Tier::L2,
        vec![Op::Access(key(2, "t")), Op::Delete(key(5, "t"))],
    );
    let (_, rest) = h.admit(vec![touch], 8).await.unwrap();
    assert!(rest.is_empty());
    assert!(h.heartbeat("a".into()).await.unwrap());
    assert!(!h.heartbeat("nobody".into()).await.unwrap());
    h.set_quota("t".into(), 1e-6).await.unwrap().unwrap();
    h.set_quota("x".into(), 1.0).await.unwrap().unwrap();
    assert!(h.remove_quota("x".into()).await.unwrap());
    assert!(!h.remove_quota("x".into()).await.unwrap());
    h.set_default_limit(None).await.unwrap().unwrap();
    h.pin(vec![key(1, "t"), key(3, "t")], 10)
        .await
        .unwrap()
        .unwrap();
    assert!(h.pin(vec![key(9, "t"); 20], 1).await.unwrap().is_err());
    h.unpin(vec![key(3, "t")]).await.unwrap();
    h.drop_pins(vec![key(1, "u")]).await.unwrap();
    assert_eq!(
        h.seed(
            "a".into(),
            "fs".into(),
            false,
            vec![(key(40, "s"), 5), (key(2, "t"), 1)]
        )
        .await
        .unwrap(),
        1
    );
    h.deregister("b".into()).await.unwrap();
    h.log_metadata().await.unwrap();
    // "quiet" never heartbeats: the sweep at 40 s removes it (a, heartbeating, stays).
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(10)).await;
        h.heartbeat("a".into()).await.unwrap();
        h.heartbeat(generated.clone()).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    let leader_fleet = h.fleet(|f, _, _| fleet_view(f)).await.unwrap();
    assert_eq!(leader_fleet["timed_out"], 1);
    let ids: Vec<String> = h
        .fleet(|f, _, _| f.iter().map(|i| i.instance_id.clone()).collect())
        .await
        .unwrap();
    // The view plans evictions, which needs the model itself: the leader's, through its dump.
    let dump = h.with(|m, _, _| m.dump()).await.unwrap();
    let mut leader_state = Model::restore(config(), dump).expect("fits");
    let leader_model = model_view(&mut leader_state, ids.clone());

    let records = drain(&mut rx);
    assert_eq!(records[0].seq, 2);
    assert!(records.windows(2).all(|w| w[1].seq == w[0].seq + 1));
    assert!(records.iter().all(|r| r.epoch == 7));
    assert_eq!(stats.queued.load(Ordering::Relaxed), records.len() as u64);
    let mut f = Follower::new();
    let mut standby = CoordinatorState::new(Model::new(config()));
    let local = (Instant::now(), wall_now());
    f.apply(&mut standby, takeover(7), local);
    for r in records {
        f.apply(&mut standby, r, local);
    }
    assert!(f.cursor().in_sync());
    assert_eq!(f.cursor().gaps(), 0);
    assert_eq!(fleet_view(&standby.fleet), leader_fleet);
    assert_eq!(model_view(&mut standby.model, ids), leader_model);
    // Not two empty states: the log carried registrations, keys, quotas and pins.
    assert_eq!(leader_fleet["instances"].as_array().map(Vec::len), Some(2));
    assert_eq!(leader_model["tracked"], 36);
    assert_eq!(leader_model["default"], json!(null));
    assert_eq!(
        leader_model["metadata"]["pins"].as_array().map(Vec::len),
        Some(1)
    );
    shutdown.cancel();
}

#[tokio::test]
async fn a_lapsed_lease_refuses_dispatches() {
    let lease = Lease {
        key: "coordinator".into(),
        holder: "me".into(),
        revision: 4,
        epoch: 4,
        renewed: Instant::now(),
    };
    let guard = Arc::new(LeaseGuard::new(&lease, Duration::from_millis(200)));
    let refused = Arc::new(AtomicU64::new(0));
    let (inner, calls) = recorder();
    let d = fenced(inner, Arc::clone(&guard), Arc::clone(&refused));
    let dispatch = || crate::coordinator::model::Dispatch {
        instance_id: "a".into(),
        ip: "127.0.0.1".into(),
        http_port: 1,
        adapter: Some("fs".into()),
        keys: vec![key(1, "t")],
    };
    assert!(guard.held());
    assert!(d(dispatch()).await.is_ok());
    // Paused past the TTL without a renewal: refused.
    std::thread::sleep(Duration::from_millis(250));
    assert!(!guard.held());
    assert!(d(dispatch()).await.is_err());
    assert_eq!(
        (
            calls.load(Ordering::Relaxed),
            refused.load(Ordering::Relaxed)
        ),
        (1, 1)
    );
    // Renewed: held again; revoked: refused at once.
    guard.renewed(&Lease {
        renewed: Instant::now(),
        ..lease
    });
    assert!(guard.held());
    assert!(d(dispatch()).await.is_ok());
    guard.revoke();
    assert!(d(dispatch()).await.is_err());
    assert_eq!(calls.load(Ordering::Relaxed), 2);
}
