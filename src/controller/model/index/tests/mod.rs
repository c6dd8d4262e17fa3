//! Unit tests of the index facade: registration, batches, heartbeats and liveness here, with
//! the helpers every topic shares; full sync in `tests_sync.rs`, lookups and views in
//! `tests_lookup.rs`, the configured limits and compaction in `tests_limits.rs`. Tests only:
//! nothing here is built outside `cfg(test)`.

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
fn reg(ix: &mut ChunkIndex, inst: &str, wid: i64) {
    let url = format!("{inst}:{wid}");
    let out = ix.register(inst, wid, "10.0.0.1", 9000, Some(&url), 1.0);
    assert_eq!(out, Ok(RegisterOutcome::New));
}

/// Admits `keys` to `(inst, wid, loc)` in one batch with fresh sequence numbers.
fn put(ix: &mut ChunkIndex, inst: &str, wid: i64, loc: &str, keys: &[i64]) {
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

mod sync;

mod lookup;

mod limits;

#[test]
fn reregistration_clears_keys_trackers_and_sync_state() {
    let mut ix = ChunkIndex::new();
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
    let mut ix = ChunkIndex::new();
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
    let mut ix = ChunkIndex::new();
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
    let mut ix = ChunkIndex::new();
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
    let mut ix = ChunkIndex::new();
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
fn heartbeats() {
    let mut ix = ChunkIndex::new();
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
    let mut ix = ChunkIndex::new();
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
fn is_stale_answers_for_one_worker_without_a_scan() {
    let mut ix = ChunkIndex::new();
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
