//! Unit tests of the index's configured limits (workers, locations, keys per worker, ops per
//! batch) and of the automatic compaction that reclaims tombstones. Tests only.

use super::*;

#[test]
fn limits() {
    let mut ix = ChunkIndex::with_config(ChunkIndexConfig {
        max_workers: 2,
        max_locations_per_worker: 2,
        ..ChunkIndexConfig::default()
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
    let mut ix = ChunkIndex::with_config(ChunkIndexConfig {
        max_keys_per_worker: 3,
        ..ChunkIndexConfig::default()
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
    let mut ix = ChunkIndex::with_config(ChunkIndexConfig {
        max_batch_ops: 2,
        ..ChunkIndexConfig::default()
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
fn tombstones_are_reclaimed_by_automatic_compaction() {
    let mut ix = ChunkIndex::with_config(ChunkIndexConfig {
        compact_min_dead: 100,
        ..ChunkIndexConfig::default()
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
