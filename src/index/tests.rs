//! Unit tests of the index facade: registration, batches, full sync, lookups and views.

use super::*;
use crate::protocol::{ChunkHash, KVOpEvent, OpType};

const CPU: &str = "LocalCPUBackend";
const DISK: &str = "LocalDiskBackend";

fn h(v: i64) -> ChunkHash {
    ChunkHash::from_i64(v)
}

fn hs(vs: &[i64]) -> Vec<ChunkHash> {
    vs.iter().copied().map(h).collect()
}

fn admit(v: i64, seq: i64) -> KVOpEvent {
    KVOpEvent {
        op_type: OpType::Admit,
        key: h(v),
        seq_num: seq,
    }
}

fn evict(v: i64, seq: i64) -> KVOpEvent {
    KVOpEvent {
        op_type: OpType::Evict,
        key: h(v),
        seq_num: seq,
    }
}

/// Registers `(inst, wid)` with a peer url derived from both.
fn reg(ix: &mut Index, inst: &str, wid: i64) {
    let url = format!("{inst}:{wid}");
    let out = ix.register(inst, wid, "10.0.0.1", 9000, Some(&url), 1.0);
    assert_eq!(out, Ok(RegisterOutcome::New));
}

/// Admits `keys` to `(inst, wid, loc)` in one batch with fresh sequence numbers.
fn put(ix: &mut Index, inst: &str, wid: i64, loc: &str, keys: &[i64]) {
    let start = ix
        .worker(inst, wid)
        .and_then(|w| w.locations.iter().find(|l| l.name == loc)?.last_seq)
        .map_or(0, |s| s + 1);
    let ops: Vec<_> = (start..).zip(keys).map(|(seq, &k)| admit(k, seq)).collect();
    assert!(matches!(
        ix.apply_batch(inst, wid, loc, &ops, 2.0),
        BatchOutcome::Applied { gaps: 0, .. }
    ));
}

#[test]
fn reregistration_clears_keys_trackers_and_sync_state() {
    let mut ix = Index::new();
    reg(&mut ix, "a", 0);
    put(&mut ix, "a", 0, CPU, &[1, 2, 3]);
    put(&mut ix, "a", 0, DISK, &[4]);
    ix.sync_start("a", 0, CPU, "s1", 3, 2, 3.0).unwrap();
    assert_eq!(ix.key_count(), 1);

    let out = ix.register("a", 0, "10.0.0.1", 9000, Some("a:0"), 5.0);
    assert_eq!(
        out,
        Ok(RegisterOutcome::ReRegistered {
            endpoint_changed: false
        })
    );
    assert_eq!(ix.key_count(), 0);
    let w = ix.worker("a", 0).unwrap();
    assert!(w.locations.is_empty());
    assert_eq!(w.sync.state, "idle");
    assert_eq!(w.registration_time, 1.0);
    assert_eq!(w.last_seen, 5.0);
    // A new sync id is accepted at once (LMCache would stay stuck on "s1", bug §7.3) and
    // incremental batches flow again with a fresh tracker.
    ix.sync_start("a", 0, CPU, "s2", 0, 0, 6.0).unwrap();
    assert_eq!(ix.sync_end("a", 0, "s2", 0, 6.0), SyncEndOutcome::Completed);
    assert!(matches!(
        ix.apply_batch("a", 0, CPU, &[admit(9, 500)], 7.0),
        BatchOutcome::Applied { gaps: 0, .. }
    ));
    assert_eq!(ix.keys_of("a", 0, CPU), hs(&[9]));

    let out = ix.register("a", 0, "10.0.0.2", 9000, None, 8.0);
    assert_eq!(
        out,
        Ok(RegisterOutcome::ReRegistered {
            endpoint_changed: true
        })
    );
    let w = ix.worker("a", 0).unwrap();
    assert_eq!((w.ip.as_str(), w.peer_init_url), ("10.0.0.2", None));
}

#[test]
fn deregistration_removes_keys_from_lookups_and_drops_empty_instance() {
    let mut ix = Index::new();
    reg(&mut ix, "a", 0);
    reg(&mut ix, "a", 1);
    reg(&mut ix, "b", 0);
    put(&mut ix, "a", 0, CPU, &[1, 2]);
    put(&mut ix, "a", 1, CPU, &[1, 2]);
    assert_eq!(ix.p2p_lookup(&hs(&[1, 2]), "b", 0).unwrap().worker_id, 0);

    assert!(ix.deregister("a", 0));
    assert!(!ix.deregister("a", 0));
    assert_eq!(ix.key_count(), 2);
    let hit = ix.p2p_lookup(&hs(&[1, 2]), "b", 0).unwrap();
    assert_eq!((hit.worker_id, hit.num_hit_chunks), (1, 2));
    assert_eq!(ix.instance_count(), 2);

    assert!(ix.deregister("a", 1));
    assert_eq!(ix.instance_count(), 1);
    assert_eq!(ix.key_count(), 0);
    assert_eq!(ix.p2p_lookup(&hs(&[1]), "b", 0), None);
    assert!(ix.prefix_holders(&hs(&[1])).is_empty());
    assert!(ix.instance_workers("a").is_none());
}

#[test]
fn batch_ops_apply_in_order() {
    let mut ix = Index::new();
    reg(&mut ix, "a", 0);
    let out = ix.apply_batch(
        "a",
        0,
        CPU,
        &[
            admit(1, 0),
            evict(1, 1),
            admit(2, 2),
            admit(2, 3),
            evict(3, 4),
        ],
        2.0,
    );
    assert_eq!(
        out,
        BatchOutcome::Applied {
            admits: 3,
            evicts: 2,
            keys_added: 2,
            keys_removed: 1,
            gaps: 0,
            refused: 0,
        }
    );
    assert_eq!(ix.keys_of("a", 0, CPU), hs(&[2]));
    assert_eq!(ix.key_count(), 1);
}

#[test]
fn sequence_gaps_are_counted_but_ops_applied() {
    let mut ix = Index::new();
    reg(&mut ix, "a", 0);
    ix.apply_batch("a", 0, CPU, &[admit(1, 0), admit(2, 1)], 2.0);
    // Gap of 4 (1 → 6), then a regression (7 → 3): two gaps in one batch.
    let out = ix.apply_batch("a", 0, CPU, &[admit(3, 6), admit(4, 7), admit(5, 3)], 2.0);
    assert!(matches!(out, BatchOutcome::Applied { gaps: 2, .. }));
    assert_eq!(ix.keys_of("a", 0, CPU), hs(&[1, 2, 3, 4, 5]));
    assert_eq!((ix.seq_discontinuities(), ix.seq_gap_ops()), (1, 2));
    // Trackers are per location: the first op of a new location is never a gap.
    let out = ix.apply_batch("a", 0, DISK, &[admit(1, 100)], 2.0);
    assert!(matches!(out, BatchOutcome::Applied { gaps: 0, .. }));
    // The tracker continues from the last op (3).
    let out = ix.apply_batch("a", 0, CPU, &[admit(6, 4)], 2.0);
    assert!(matches!(out, BatchOutcome::Applied { gaps: 0, .. }));
    assert_eq!(ix.seq_discontinuities(), 1);
    // No overflow at the edge of i64.
    ix.apply_batch("a", 0, DISK, &[admit(2, i64::MAX), admit(3, i64::MIN)], 2.0);
    assert_eq!(ix.seq_discontinuities(), 2);
}

#[test]
fn unknown_workers_and_syncing_workers_drop_batches() {
    let mut ix = Index::new();
    assert_eq!(
        ix.apply_batch("x", 0, CPU, &[admit(1, 0)], 1.0),
        BatchOutcome::UnknownWorker
    );
    reg(&mut ix, "a", 0);
    put(&mut ix, "a", 0, DISK, &[7]);
    ix.sync_start("a", 0, CPU, "s", 1, 1, 2.0).unwrap();
    // Discarded for every location while syncing.
    for loc in [CPU, DISK] {
        assert_eq!(
            ix.apply_batch("a", 0, loc, &[admit(1, 1)], 3.0),
            BatchOutcome::DiscardedSyncing
        );
    }
    assert_eq!(ix.keys_of("a", 0, DISK), hs(&[7]));
    assert!(ix.keys_of("a", 0, CPU).is_empty());
    assert_eq!(ix.worker("a", 0).unwrap().last_seen, 3.0);
}

#[test]
fn full_sync_with_a_missing_batch_completes_only_when_it_arrives() {
    let mut ix = Index::new();
    reg(&mut ix, "a", 0);
    reg(&mut ix, "b", 0);
    put(&mut ix, "a", 0, CPU, &[100, 101]);
    put(&mut ix, "a", 0, DISK, &[200]);

    ix.sync_start("a", 0, CPU, "s", 4, 2, 2.0).unwrap();
    assert_eq!(ix.keys_of("a", 0, CPU), vec![]);
    assert_eq!(ix.worker("a", 0).unwrap().locations[0].last_seq, None);
    assert_eq!(ix.keys_of("a", 0, DISK), hs(&[200]));
    assert_eq!(
        ix.sync_batch("a", 0, CPU, "s", 1, &hs(&[3, 4]), 3.0),
        SyncBatchOutcome::Accepted
    );
    assert_eq!(ix.sync_counts(), (1, 0, 1));

    let st = ix.sync_status("a", 0, "s");
    assert_eq!(
        st,
        SyncStatus {
            is_complete: false,
            global_progress: 0.5,
            can_exit_freeze: false,
            missing_batches: vec![0],
        }
    );
    // End with a batch missing: recorded, not completed (LMCache bug §7.4).
    assert_eq!(
        ix.sync_end("a", 0, "s", 4, 4.0),
        SyncEndOutcome::Incomplete { missing: 1 }
    );
    let st = ix.sync_status("a", 0, "s");
    assert!(!st.is_complete && !st.can_exit_freeze);
    assert_eq!(st.missing_batches, vec![0]);
    let view = ix.worker("a", 0).unwrap().sync;
    assert_eq!((view.state, view.end_total_keys), ("syncing", Some(4)));

    // A duplicate of a received batch is not double counted.
    assert_eq!(
        ix.sync_batch("a", 0, CPU, "s", 1, &hs(&[3, 4]), 4.5),
        SyncBatchOutcome::Accepted
    );
    assert_eq!(ix.worker("a", 0).unwrap().sync.received_keys, 2);
    // Out of range and wrong sync id are rejected.
    assert_eq!(
        ix.sync_batch("a", 0, CPU, "s", 2, &hs(&[9]), 5.0),
        SyncBatchOutcome::Rejected
    );
    assert_eq!(
        ix.sync_batch("a", 0, CPU, "s", -1, &hs(&[9]), 5.0),
        SyncBatchOutcome::Rejected
    );
    assert_eq!(
        ix.sync_batch("a", 0, CPU, "other", 0, &hs(&[9]), 5.0),
        SyncBatchOutcome::Rejected
    );
    // The missing batch completes the sync.
    assert_eq!(
        ix.sync_batch("a", 0, CPU, "s", 0, &hs(&[1, 2]), 5.0),
        SyncBatchOutcome::Completed
    );
    let st = ix.sync_status("a", 0, "s");
    assert_eq!(
        st,
        SyncStatus {
            is_complete: true,
            global_progress: 1.0,
            can_exit_freeze: true,
            missing_batches: vec![],
        }
    );
    assert_eq!(ix.keys_of("a", 0, CPU), hs(&[1, 2, 3, 4]));
    assert_eq!(ix.keys_of("a", 0, DISK), hs(&[200]));
    assert_eq!(ix.key_count(), 5);
    assert_eq!(ix.sync_counts(), (0, 1, 0));
    // Late batches are dropped; a repeated end is acknowledged.
    assert_eq!(
        ix.sync_batch("a", 0, CPU, "s", 0, &hs(&[9]), 6.0),
        SyncBatchOutcome::Rejected
    );
    assert_eq!(ix.sync_end("a", 0, "s", 4, 6.0), SyncEndOutcome::Completed);
    // Incremental batches flow again.
    put(&mut ix, "a", 0, CPU, &[5]);
    assert_eq!(ix.keys_of("a", 0, CPU), hs(&[1, 2, 3, 4, 5]));
}

#[test]
fn sync_start_rejections() {
    let mut ix = Index::new();
    let lmcache_text =
        "Failed to start sync: worker already syncing with different sync_id or worker not found";
    let err = ix.sync_start("a", 0, CPU, "s", 0, 1, 1.0).unwrap_err();
    assert_eq!(err, SyncError::UnknownWorker);
    assert_eq!(err.to_string(), lmcache_text);

    reg(&mut ix, "a", 0);
    ix.sync_start("a", 0, CPU, "s", 2, 1, 1.0).unwrap();
    let err = ix.sync_start("a", 0, CPU, "t", 0, 1, 1.0).unwrap_err();
    assert_eq!(err.to_string(), lmcache_text);
    assert_eq!(ix.sync_end("a", 0, "t", 0, 1.0), SyncEndOutcome::Rejected);
    // Same sync id restarts: received set and location keys cleared.
    ix.sync_batch("a", 0, CPU, "s", 0, &hs(&[1]), 2.0);
    ix.sync_start("a", 0, CPU, "s", 2, 1, 3.0).unwrap();
    assert!(ix.keys_of("a", 0, CPU).is_empty());
    assert_eq!(ix.sync_status("a", 0, "s").missing_batches, vec![0]);

    for bad in [-1, MAX_SYNC_BATCH_COUNT + 1] {
        assert_eq!(
            ix.sync_start("a", 0, CPU, "s", 0, bad, 4.0),
            Err(SyncError::BatchCount(bad))
        );
    }
    assert_eq!(ix.worker("a", 0).unwrap().sync.expected_batches, 1);
}

#[test]
fn expired_sync_fails_and_heartbeat_asks_for_retry() {
    let mut ix = Index::new();
    reg(&mut ix, "a", 0);
    reg(&mut ix, "a", 1);
    ix.sync_start("a", 0, CPU, "s", 2, 2, 10.0).unwrap();
    ix.sync_start("a", 1, CPU, "t", 2, 2, 10.0).unwrap();
    ix.sync_batch("a", 1, CPU, "t", 0, &hs(&[1]), 50.0);
    assert!(ix.expire_syncs(40.0, 30.0).is_empty());
    assert_eq!(ix.expire_syncs(41.0, 30.0), vec![("a".to_string(), 0)]);
    let view = ix.worker("a", 0).unwrap().sync;
    assert_eq!(
        (view.state, view.failure),
        ("failed", Some(FAILURE_TIMEOUT))
    );
    assert_eq!(
        ix.sync_status("a", 0, "s").missing_batches,
        Vec::<i64>::new()
    );
    assert_eq!(ix.global_sync_progress(), 0.0);

    let out = ix.heartbeat("a", 0, "10.0.0.1", 9000, Some("a:0"), 60.0);
    assert_eq!(
        out,
        Ok(HeartbeatOutcome::Known {
            full_sync: Some(REASON_SYNC_FAILED_RETRY),
            endpoint_changed: false
        })
    );
    // Batches are accepted again while failed; a new sync clears the partial location.
    put(&mut ix, "a", 0, DISK, &[5]);
    ix.sync_start("a", 0, CPU, "s2", 0, 0, 61.0).unwrap();
    let out = ix.heartbeat("a", 0, "10.0.0.1", 9000, Some("a:0"), 62.0);
    assert_eq!(out.unwrap().full_sync_reason(), None);
}

#[test]
fn heartbeats() {
    let mut ix = Index::new();
    let out = ix.heartbeat("a", 3, "10.0.0.1", 9000, None, 5.0).unwrap();
    assert_eq!(out, HeartbeatOutcome::ReRegistered);
    assert_eq!(out.full_sync_reason(), Some(REASON_WORKER_RE_REGISTERED));
    let w = ix.worker("a", 3).unwrap();
    assert_eq!((w.registration_time, w.last_heartbeat_time), (5.0, 5.0));

    // A fresh controller never asks registered workers for a `controller_restart` sync.
    let out = ix.heartbeat("a", 3, "10.0.0.1", 9000, None, 6.0).unwrap();
    assert_eq!(
        out,
        HeartbeatOutcome::Known {
            full_sync: None,
            endpoint_changed: false
        }
    );
    let out = ix
        .heartbeat("a", 3, "10.0.0.9", 9001, Some("p"), 7.0)
        .unwrap();
    assert_eq!(
        out,
        HeartbeatOutcome::Known {
            full_sync: None,
            endpoint_changed: true
        }
    );
    let w = ix.worker("a", 3).unwrap();
    assert_eq!((w.registration_time, w.last_heartbeat_time), (5.0, 7.0));
    assert_eq!(
        (w.ip.as_str(), w.port, w.peer_init_url.as_deref()),
        ("10.0.0.9", 9001, Some("p"))
    );
}

#[test]
fn liveness() {
    let mut ix = Index::new();
    reg(&mut ix, "a", 0);
    reg(&mut ix, "b", 0);
    ix.apply_batch("b", 0, CPU, &[], 50.0);
    let stale = ix.stale_workers(100.0, 60.0);
    assert_eq!(
        stale,
        vec![WorkerAddr {
            instance_id: "a".into(),
            worker_id: 0,
            ip: "10.0.0.1".into(),
            port: 9000
        }]
    );
    assert!(ix.touch("a", 0, 90.0));
    assert!(!ix.touch("zz", 0, 90.0));
    // last_seen never goes backwards.
    assert!(ix.touch("b", 0, 10.0));
    assert_eq!(ix.stale_workers(100.0, 60.0), vec![]);
    assert_eq!(ix.stale_workers(111.0, 60.0).len(), 1);
}

#[test]
fn p2p_excludes_own_instance_and_prefers_longest_prefix() {
    let mut ix = Index::new();
    reg(&mut ix, "x", 0);
    reg(&mut ix, "y", 0);
    reg(&mut ix, "z", 0);
    put(&mut ix, "x", 0, CPU, &[10, 20]);
    put(&mut ix, "y", 0, CPU, &[10, 20, 30]);
    put(&mut ix, "z", 0, CPU, &[10]);
    let q = hs(&[10, 20, 30, 40]);
    let hit = ix.p2p_lookup(&q, "z", 0).unwrap();
    assert_eq!(
        hit,
        P2PHit {
            instance_id: "y",
            worker_id: 0,
            location: CPU,
            num_hit_chunks: 3,
            peer_init_url: "y:0"
        }
    );
    // The requester's own instance is never returned, even with the longest prefix.
    let hit = ix.p2p_lookup(&q, "y", 0).unwrap();
    assert_eq!((hit.instance_id, hit.num_hit_chunks), ("x", 2));
    assert_eq!(ix.p2p_lookup(&hs(&[30]), "y", 0), None);
    assert_eq!(ix.p2p_lookup(&[], "z", 0), None);
    assert_eq!(ix.p2p_lookup(&hs(&[99]), "z", 0), None);
    // An unknown requester instance excludes nothing.
    assert_eq!(ix.p2p_lookup(&q, "new", 0).unwrap().instance_id, "y");
}

#[test]
fn p2p_tie_prefers_same_rank_then_registration_order() {
    let mut ix = Index::new();
    for inst in ["x", "y"] {
        for wid in 0..4 {
            reg(&mut ix, inst, wid);
            put(&mut ix, inst, wid, CPU, &[1, 2]);
        }
    }
    for rank in 0..4 {
        let hit = ix.p2p_lookup(&hs(&[1, 2]), "req", rank).unwrap();
        assert_eq!((hit.instance_id, hit.worker_id), ("x", rank));
        assert_eq!(hit.peer_init_url, format!("x:{rank}"));
        let hit = ix.p2p_lookup(&hs(&[1, 2]), "x", rank).unwrap();
        assert_eq!((hit.instance_id, hit.worker_id), ("y", rank));
    }
    // No same-rank holder: first in registration order.
    let hit = ix.p2p_lookup(&hs(&[1]), "req", 7).unwrap();
    assert_eq!((hit.instance_id, hit.worker_id), ("x", 0));
    // A longer prefix beats the same rank.
    put(&mut ix, "y", 2, DISK, &[1, 2, 3]);
    let hit = ix.p2p_lookup(&hs(&[1, 2, 3]), "req", 0).unwrap();
    assert_eq!(
        (
            hit.instance_id,
            hit.worker_id,
            hit.location,
            hit.num_hit_chunks
        ),
        ("y", 2, DISK, 3)
    );
}

#[test]
fn p2p_skips_holders_without_peer_url() {
    let mut ix = Index::new();
    ix.register("x", 0, "10.0.0.1", 9000, None, 1.0).unwrap();
    reg(&mut ix, "y", 0);
    put(&mut ix, "x", 0, CPU, &[1, 2, 3]);
    put(&mut ix, "y", 0, CPU, &[1]);
    let hit = ix.p2p_lookup(&hs(&[1, 2, 3]), "req", 0).unwrap();
    assert_eq!((hit.instance_id, hit.num_hit_chunks), ("y", 1));
    ix.deregister("y", 0);
    assert_eq!(ix.p2p_lookup(&hs(&[1]), "req", 0), None);
    // prefix_holders does not filter on the peer url.
    let all = ix.prefix_holders(&hs(&[1, 2, 3]));
    assert_eq!(all.len(), 1);
    assert_eq!((all[0].matched, all[0].peer_init_url), (3, None));
}

#[test]
fn negative_and_u64_hashes_with_the_same_bits_are_distinct() {
    let mut ix = Index::new();
    reg(&mut ix, "x", 0);
    let neg = ChunkHash::from_i64(-16);
    let big = ChunkHash::from_u64(u64::MAX - 15);
    let ops = [KVOpEvent {
        op_type: OpType::Admit,
        key: neg,
        seq_num: 0,
    }];
    ix.apply_batch("x", 0, CPU, &ops, 1.0);
    assert!(ix.p2p_lookup(&[neg], "req", 0).is_some());
    assert_eq!(ix.p2p_lookup(&[big], "req", 0), None);
    assert_eq!(
        ix.p2p_lookup(&[neg, big], "req", 0).unwrap().num_hit_chunks,
        1
    );
    let ops = [KVOpEvent {
        op_type: OpType::Evict,
        key: big,
        seq_num: 1,
    }];
    ix.apply_batch("x", 0, CPU, &ops, 1.0);
    assert_eq!(ix.keys_of("x", 0, CPU), vec![neg]);
}

#[test]
fn prefix_holders_reports_every_holder_in_registration_order() {
    let mut ix = Index::new();
    reg(&mut ix, "x", 0);
    reg(&mut ix, "x", 1);
    reg(&mut ix, "y", 0);
    put(&mut ix, "y", 0, CPU, &[1, 2, 3]);
    put(&mut ix, "x", 1, DISK, &[1]);
    put(&mut ix, "x", 1, CPU, &[1, 2]);
    put(&mut ix, "x", 0, CPU, &[2, 3]);
    let got: Vec<_> = ix
        .prefix_holders(&hs(&[1, 2, 3, 4]))
        .into_iter()
        .map(|p| (p.instance_id, p.worker_id, p.location, p.matched))
        .collect();
    assert_eq!(
        got,
        vec![("x", 1, DISK, 1), ("x", 1, CPU, 2), ("y", 0, CPU, 3)]
    );
    assert!(ix.prefix_holders(&[]).is_empty());
}

#[test]
fn views_and_counts() {
    let mut ix = Index::new();
    reg(&mut ix, "b", 0);
    reg(&mut ix, "a", 0);
    reg(&mut ix, "a", 1);
    ix.register("c", 0, "10.0.0.7", 1, None, 1.0).unwrap();
    put(&mut ix, "a", 0, CPU, &[1, 2]);
    put(&mut ix, "a", 1, CPU, &[1, 2]);
    put(&mut ix, "a", 1, DISK, &[3]);
    assert_eq!(
        (ix.worker_count(), ix.instance_count(), ix.key_count()),
        (4, 3, 5)
    );
    assert_eq!(
        ix.instances(),
        vec![
            InstanceSummary {
                instance_id: "b".into(),
                key_count: 0,
                worker_count: 1
            },
            InstanceSummary {
                instance_id: "a".into(),
                key_count: 5,
                worker_count: 2
            },
            InstanceSummary {
                instance_id: "c".into(),
                key_count: 0,
                worker_count: 1
            },
        ]
    );
    let order: Vec<_> = ix
        .workers()
        .iter()
        .map(|w| (w.instance_id.clone(), w.worker_id))
        .collect();
    assert_eq!(
        order,
        vec![
            ("b".into(), 0),
            ("a".into(), 0),
            ("a".into(), 1),
            ("c".into(), 0)
        ]
    );
    let w = ix.worker("a", 1).unwrap();
    assert_eq!(w.key_count, 3);
    assert_eq!(
        w.locations,
        vec![
            LocationView {
                name: CPU.into(),
                key_count: 2,
                last_seq: Some(1)
            },
            LocationView {
                name: DISK.into(),
                key_count: 1,
                last_seq: Some(0)
            },
        ]
    );
    assert_eq!(ix.instance_workers("a").map(|v| v.len()), Some(2));
    assert_eq!(ix.instance_by_ip("10.0.0.1"), Some("b"));
    assert_eq!(ix.instance_by_ip("10.0.0.7"), Some("c"));
    assert_eq!(ix.instance_by_ip("10.9.9.9"), None);
    assert!(ix.worker("a", 9).is_none());
    assert!(ix.keys_of("a", 0, "nope").is_empty());
    let stats = ix.memory_stats();
    assert_eq!(stats.live_memberships, 5);
    assert_eq!(stats.map_entries, 3);
    assert!(stats.bytes_per_membership > 0.0);
}

#[test]
fn global_progress_gates_freeze_exit() {
    let mut ix = Index::new();
    for wid in 0..5 {
        reg(&mut ix, "a", wid);
    }
    ix.sync_start("a", 0, CPU, "s0", 0, 0, 1.0).unwrap();
    ix.sync_start("a", 1, CPU, "s1", 0, 1, 1.0).unwrap();
    assert_eq!(ix.sync_end("a", 0, "s0", 0, 1.0), SyncEndOutcome::Completed);
    // 4 of 5 settled = 0.8 ≥ 0.8.
    let st = ix.sync_status("a", 0, "s0");
    assert!(st.is_complete && st.can_exit_freeze);
    assert_eq!(st.global_progress, 0.8);
    assert!(!ix.sync_status("a", 0, "other").is_complete);
    ix.sync_start("a", 2, CPU, "s2", 0, 1, 1.0).unwrap();
    let st = ix.sync_status("a", 0, "s0");
    assert!(st.is_complete && !st.can_exit_freeze);

    let mut ix = Index::with_config(IndexConfig {
        sync_completion_threshold: 0.0,
        ..IndexConfig::default()
    });
    assert_eq!(ix.global_sync_progress(), 1.0);
    reg(&mut ix, "a", 0);
    ix.sync_start("a", 0, CPU, "s", 0, 1, 1.0).unwrap();
    // Not complete: a worker with missing batches never exits freeze.
    ix.sync_end("a", 0, "s", 0, 1.0);
    assert!(!ix.sync_status("a", 0, "s").can_exit_freeze);
}

#[test]
fn limits() {
    let mut ix = Index::with_config(IndexConfig {
        max_workers: 2,
        max_locations_per_worker: 2,
        ..IndexConfig::default()
    });
    reg(&mut ix, "a", 0);
    reg(&mut ix, "b", 0);
    assert_eq!(
        ix.register("c", 0, "h", 1, None, 1.0),
        Err(IndexError::TooManyWorkers { limit: 2 })
    );
    assert_eq!(
        ix.heartbeat("c", 0, "h", 1, None, 1.0),
        Err(IndexError::TooManyWorkers { limit: 2 })
    );
    assert_eq!(ix.instance_count(), 2);
    // Re-registration of a known worker is never refused.
    assert!(ix.register("a", 0, "h", 1, None, 1.0).is_ok());

    put(&mut ix, "a", 0, "l1", &[1]);
    put(&mut ix, "a", 0, "l2", &[1]);
    assert_eq!(
        ix.apply_batch("a", 0, "l3", &[admit(1, 0)], 1.0),
        BatchOutcome::TooManyLocations
    );
    ix.sync_start("a", 0, "l3", "s", 1, 1, 1.0).unwrap();
    assert_eq!(
        ix.sync_batch("a", 0, "l3", "s", 0, &hs(&[1]), 1.0),
        SyncBatchOutcome::Rejected
    );
    assert_eq!(ix.key_count(), 2);
}

#[test]
fn keys_per_worker_limit_refuses_new_admits_only() {
    let mut ix = Index::with_config(IndexConfig {
        max_keys_per_worker: 3,
        ..IndexConfig::default()
    });
    reg(&mut ix, "a", 0);
    reg(&mut ix, "b", 0);
    // Two locations share the worker's budget of 3.
    put(&mut ix, "a", 0, CPU, &[1, 2]);
    let out = ix.apply_batch(
        "a",
        0,
        "LocalDiskBackend",
        &[admit(3, 2), admit(4, 3), admit(1, 4), admit(5, 5)],
        2.0,
    );
    assert_eq!(
        out,
        BatchOutcome::Applied {
            admits: 4,
            evicts: 0,
            keys_added: 1,
            keys_removed: 0,
            gaps: 0,
            refused: 3,
        }
    );
    assert_eq!(ix.keys_of("a", 0, "LocalDiskBackend"), hs(&[3]));
    assert_eq!(ix.keys_refused(), 3);
    // Re-admitting a held key is not refused; an evict makes room again.
    let out = ix.apply_batch("a", 0, CPU, &[admit(1, 2), evict(2, 3), admit(9, 4)], 3.0);
    assert!(matches!(
        out,
        BatchOutcome::Applied {
            refused: 0,
            keys_added: 1,
            keys_removed: 1,
            gaps: 0,
            ..
        }
    ));
    assert_eq!(ix.keys_of("a", 0, CPU), hs(&[1, 9]));
    // Other workers have their own budget.
    put(&mut ix, "b", 0, CPU, &[1, 2, 3]);
    assert_eq!(ix.keys_of("b", 0, CPU), hs(&[1, 2, 3]));
    // Full-sync keys obey the same limit, and the batch still counts as received.
    ix.sync_start("a", 0, CPU, "s", 5, 1, 4.0).unwrap();
    assert_eq!(
        ix.sync_batch("a", 0, CPU, "s", 0, &hs(&[10, 11, 12, 13, 14]), 4.0),
        SyncBatchOutcome::Accepted
    );
    assert_eq!(ix.keys_of("a", 0, CPU), hs(&[10, 11]));
    assert_eq!(ix.keys_refused(), 6);
    assert_eq!(ix.sync_end("a", 0, "s", 5, 4.0), SyncEndOutcome::Completed);
    assert_eq!(ix.key_count(), 3 + 3);
}

#[test]
fn batches_over_the_ops_limit_are_refused_whole() {
    let mut ix = Index::with_config(IndexConfig {
        max_batch_ops: 2,
        ..IndexConfig::default()
    });
    reg(&mut ix, "a", 0);
    let three = [admit(1, 0), admit(2, 1), admit(3, 2)];
    assert_eq!(
        ix.apply_batch("a", 0, CPU, &three, 1.0),
        BatchOutcome::TooLarge
    );
    assert_eq!(
        ix.apply_batch("nobody", 0, CPU, &three, 1.0),
        BatchOutcome::TooLarge,
        "refused before any lookup"
    );
    assert_eq!(ix.key_count(), 0);
    assert!(matches!(
        ix.apply_batch("a", 0, CPU, &three[..2], 1.0),
        BatchOutcome::Applied { admits: 2, .. }
    ));
    // A full-sync batch over the limit stays missing: the sync cannot complete with it.
    ix.sync_start("a", 0, CPU, "s", 3, 1, 2.0).unwrap();
    assert_eq!(
        ix.sync_batch("a", 0, CPU, "s", 0, &hs(&[1, 2, 3]), 2.0),
        SyncBatchOutcome::TooLarge
    );
    assert!(matches!(
        ix.sync_end("a", 0, "s", 3, 2.0),
        SyncEndOutcome::Incomplete { .. }
    ));
    assert_eq!(ix.sync_status("a", 0, "s").missing_batches, vec![0]);
    assert_eq!(ix.key_count(), 0);
}

#[test]
fn status_lists_at_most_the_first_missing_batches() {
    let mut ix = Index::new();
    reg(&mut ix, "a", 0);
    ix.sync_start("a", 0, CPU, "s", 0, MAX_SYNC_BATCH_COUNT, 1.0)
        .unwrap();
    for b in [0, 1, 5] {
        ix.sync_batch("a", 0, CPU, "s", b, &[], 1.0);
    }
    let missing = ix.sync_status("a", 0, "s").missing_batches;
    assert_eq!(missing.len(), MAX_REPORTED_MISSING);
    assert_eq!(&missing[..4], &[2, 3, 4, 6]);
    // Near the end of a nearly complete sync, the last ones are found past full words.
    let mut ix = Index::new();
    reg(&mut ix, "a", 0);
    ix.sync_start("a", 0, CPU, "s", 0, 200, 1.0).unwrap();
    for b in (0..200).filter(|b| *b != 130 && *b != 199) {
        ix.sync_batch("a", 0, CPU, "s", b, &[], 1.0);
    }
    assert_eq!(ix.sync_status("a", 0, "s").missing_batches, vec![130, 199]);
}

#[test]
fn tombstones_are_reclaimed_by_automatic_compaction() {
    let mut ix = Index::with_config(IndexConfig {
        compact_min_dead: 100,
        ..IndexConfig::default()
    });
    reg(&mut ix, "a", 0);
    reg(&mut ix, "b", 0);
    let keys: Vec<i64> = (0..300).collect();
    put(&mut ix, "a", 0, CPU, &keys);
    put(&mut ix, "b", 0, CPU, &keys[..50]);
    // 300 dead of 350: compaction runs on the spot.
    ix.register("a", 0, "10.0.0.1", 9000, Some("a:0"), 2.0)
        .unwrap();
    assert_eq!((ix.compactions(), ix.dead_memberships()), (1, 0));
    assert_eq!(ix.memory_stats().map_entries, 50);
    assert_eq!(ix.key_count(), 50);
    // Below the minimum: tombstones wait, yet counts and lookups are already exact.
    put(&mut ix, "a", 0, CPU, &keys[..60]);
    ix.deregister("a", 0);
    assert_eq!((ix.compactions(), ix.dead_memberships()), (1, 60));
    assert_eq!(ix.key_count(), 50);
    assert_eq!(ix.prefix_holders(&hs(&[55])), vec![]);
    assert_eq!(ix.prefix_holders(&hs(&[5])).len(), 1);
    assert_eq!(ix.compact(), 60);
    assert_eq!(ix.memory_stats().map_entries, 50);
}

/// Full-sync bookkeeping follows the batches received, not the count announced, and the
/// out-of-order ranges share one budget (review §2.1.5).
#[test]
fn full_sync_bookkeeping_is_bounded_by_what_arrived() {
    let mut ix = Index::with_config(IndexConfig {
        max_sync_ranges: 2,
        max_sync_ranges_per_worker: 100,
        ..IndexConfig::default()
    });
    let max = MAX_SYNC_BATCH_COUNT;
    for w in ["a", "b"] {
        reg(&mut ix, w, 0);
        ix.sync_start(w, 0, CPU, "s", 0, max, 1.0).unwrap();
    }
    // Announcing 10^7 batches costs no range; batches in order use each sync's free range.
    for b in 0..50 {
        let outcome = ix.sync_batch("b", 0, CPU, "s", b, &hs(&[1_000 + b]), 2.0);
        assert_eq!(outcome, SyncBatchOutcome::Accepted);
    }
    assert_eq!(ix.sync_ranges_used(), 0);

    // "a" sends out of order: 0, 2, 4 take two extra ranges, the budget; 6 is refused.
    for b in [0, 2, 4] {
        let outcome = ix.sync_batch("a", 0, CPU, "s", b, &hs(&[b]), 2.0);
        assert_eq!(outcome, SyncBatchOutcome::Accepted);
    }
    assert_eq!(ix.sync_ranges_used(), 2);
    assert_eq!(
        ix.sync_batch("a", 0, CPU, "s", 6, &hs(&[6]), 3.0),
        SyncBatchOutcome::OverBudget
    );
    // Refused: not recorded, keys not admitted, still reported missing.
    assert_eq!(ix.keys_of("a", 0, CPU), hs(&[0, 2, 4]));
    let missing = ix.sync_status("a", 0, "s").missing_batches;
    assert_eq!(&missing[..5], &[1, 3, 5, 6, 7]);
    assert_eq!(ix.worker("a", 0).unwrap().sync.received_batches, 3);
    // "b" in order is unaffected by the spent budget; its own out-of-order batch is not.
    assert_eq!(
        ix.sync_batch("b", 0, CPU, "s", 50, &hs(&[1_050]), 3.0),
        SyncBatchOutcome::Accepted
    );
    assert_eq!(
        ix.sync_batch("b", 0, CPU, "s", 60, &hs(&[1_060]), 3.0),
        SyncBatchOutcome::OverBudget
    );
    // A batch that joins two ranges gives one back, and the refused batch then fits.
    assert_eq!(
        ix.sync_batch("a", 0, CPU, "s", 1, &hs(&[1]), 4.0),
        SyncBatchOutcome::Accepted
    );
    assert_eq!(ix.sync_ranges_used(), 1);
    assert_eq!(
        ix.sync_batch("b", 0, CPU, "s", 60, &hs(&[1_060]), 4.0),
        SyncBatchOutcome::Accepted
    );
    assert_eq!(ix.sync_ranges_used(), 2);

    // An end with batches missing stays open; its ranges are kept.
    assert!(matches!(
        ix.sync_end("a", 0, "s", 5, 5.0),
        SyncEndOutcome::Incomplete { .. }
    ));
    assert_eq!(ix.sync_ranges_used(), 2);
    // Every way a sync ends returns its ranges: expiry ("b")…
    assert_eq!(ix.expire_syncs(100.0, 10.0).len(), 2);
    assert_eq!(ix.sync_ranges_used(), 0);
    // …a restart, a deregistration, and completion.
    ix.sync_start("a", 0, CPU, "t", 0, 8, 101.0).unwrap();
    for b in [0, 2, 4] {
        ix.sync_batch("a", 0, CPU, "t", b, &[], 101.0);
    }
    assert_eq!(ix.sync_ranges_used(), 2);
    ix.sync_start("a", 0, CPU, "t", 0, 8, 102.0).unwrap();
    assert_eq!(ix.sync_ranges_used(), 0);
    for b in [0, 2] {
        ix.sync_batch("a", 0, CPU, "t", b, &[], 102.0);
    }
    assert_eq!(ix.sync_ranges_used(), 1);
    assert!(ix.deregister("a", 0));
    assert_eq!(ix.sync_ranges_used(), 0);
    reg(&mut ix, "a", 0);
    ix.sync_start("a", 0, CPU, "u", 0, 3, 103.0).unwrap();
    for b in [2, 0] {
        ix.sync_batch("a", 0, CPU, "u", b, &[], 103.0);
    }
    assert_eq!(ix.sync_ranges_used(), 1);
    assert_eq!(
        ix.sync_end("a", 0, "u", 0, 103.0),
        SyncEndOutcome::Incomplete { missing: 1 }
    );
    assert_eq!(
        ix.sync_batch("a", 0, CPU, "u", 1, &[], 104.0),
        SyncBatchOutcome::Completed
    );
    assert_eq!(ix.sync_ranges_used(), 0);
}

/// Many syncing workers announcing the largest count and sending in order hold no budget:
/// honest workers are never refused, however many there are.
#[test]
fn many_in_order_syncs_take_no_budget() {
    let mut ix = Index::with_config(IndexConfig {
        max_sync_ranges: 0,
        ..IndexConfig::default()
    });
    for w in 0..1_000 {
        reg(&mut ix, "i", w);
        ix.sync_start("i", w, CPU, "s", 0, MAX_SYNC_BATCH_COUNT, 1.0)
            .unwrap();
        for b in 0..3 {
            let outcome = ix.sync_batch("i", w, CPU, "s", b, &hs(&[w * 10 + b]), 1.0);
            assert_eq!(outcome, SyncBatchOutcome::Accepted);
        }
    }
    assert_eq!(ix.sync_ranges_used(), 0);
    assert_eq!(
        ix.sync_counts(),
        (1_000, 0, 1_000 * (MAX_SYNC_BATCH_COUNT as u64 - 3))
    );
}

#[test]
fn is_stale_answers_for_one_worker_without_a_scan() {
    let mut ix = Index::new();
    reg(&mut ix, "a", 0);
    reg(&mut ix, "a", 1);
    assert!(!ix.is_stale("a", 0, 50.0, 60.0), "seen at 1.0, 49 s ago");
    assert!(ix.is_stale("a", 0, 62.0, 60.0), "61 s silent");
    assert!(ix.touch("a", 1, 30.0));
    assert!(ix.is_stale("a", 0, 62.0, 60.0) && !ix.is_stale("a", 1, 62.0, 60.0));
    assert!(
        !ix.is_stale("a", 9, 1e9, 60.0),
        "unknown worker is not stale"
    );
    assert!(ix.deregister("a", 0));
    assert!(
        !ix.is_stale("a", 0, 1e9, 60.0),
        "removed worker is not stale"
    );
}
