//! Unit tests of the index's full sync: batches received out of order or missing, start and
//! end rejections, expiry and the retry heartbeat, the global progress that gates the freeze
//! exit, the missing-batch list, and the bookkeeping bounded by what arrived. Tests only.

use super::*;

#[test]
fn full_sync_with_a_missing_batch_completes_only_when_it_arrives() {
    let mut ix = ChunkIndex::new();
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
    let mut ix = ChunkIndex::new();
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
    let mut ix = ChunkIndex::new();
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
fn global_progress_gates_freeze_exit() {
    let mut ix = ChunkIndex::new();
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

    let mut ix = ChunkIndex::with_config(ChunkIndexConfig {
        sync_completion_threshold: 0.0,
        ..ChunkIndexConfig::default()
    });
    assert_eq!(ix.global_sync_progress(), 1.0);
    reg(&mut ix, "a", 0);
    ix.sync_start("a", 0, CPU, "s", 0, 1, 1.0).unwrap();
    // Not complete: a worker with missing batches never exits freeze.
    ix.sync_end("a", 0, "s", 0, 1.0);
    assert!(!ix.sync_status("a", 0, "s").can_exit_freeze);
}

#[test]
fn status_lists_at_most_the_first_missing_batches() {
    let mut ix = ChunkIndex::new();
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
    let mut ix = ChunkIndex::new();
    reg(&mut ix, "a", 0);
    ix.sync_start("a", 0, CPU, "s", 0, 200, 1.0).unwrap();
    for b in (0..200).filter(|b| *b != 130 && *b != 199) {
        ix.sync_batch("a", 0, CPU, "s", b, &[], 1.0);
    }
    assert_eq!(ix.sync_status("a", 0, "s").missing_batches, vec![130, 199]);
}

/// Full-sync bookkeeping follows the batches received, not the count announced, and the
/// out-of-order ranges share one budget (review §2.1.5).
#[test]
fn full_sync_bookkeeping_is_bounded_by_what_arrived() {
    let mut ix = ChunkIndex::with_config(ChunkIndexConfig {
        max_sync_ranges: 2,
        max_sync_ranges_per_worker: 100,
        ..ChunkIndexConfig::default()
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
    let mut ix = ChunkIndex::with_config(ChunkIndexConfig {
        max_sync_ranges: 0,
        ..ChunkIndexConfig::default()
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
