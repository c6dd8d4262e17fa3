//! A replica against an ingester's index fed the same changes: equal answers, a new epoch
//! starts over, a gap is seen and reported, duplicates are ignored, records survive the codec;
//! a snapshot restores the very index (arena positions included) and the log goes on from it.

use super::*;
use crate::cluster::{apply_record, Applied, LogCursor};
use crate::indexer::model::events::{Removed, Stored};
use crate::indexer::model::index::tests::{scope, spec, BS};
use std::time::Instant;

fn stored(blocks: u32, base: u64, medium: Medium) -> KvEvent {
    KvEvent::Stored(Stored {
        hashes: (0..blocks).map(|i| base + u64::from(i)).collect(),
        tokens: (1..=blocks * BS).collect(),
        block_size: BS,
        medium,
        ..Stored::default()
    })
}

/// Applies `change` to `index` as the ingester does, keeping the ingester's ids.
fn lead(index: &mut Index, ids: &mut Vec<StreamId>, change: &Change) {
    match change {
        Change::Start { .. } => {}
        Change::AddStream { spec, .. } => {
            ids.push(index.add_stream(spec.clone()).expect("a stream"))
        }
        Change::RemoveStream { stream } => index.remove_stream(ids[*stream as usize]),
        Change::Apply {
            streams,
            events,
            now,
        } => {
            for ev in events {
                for s in streams {
                    index.apply(ids[*s as usize], ev, *now);
                }
            }
        }
        Change::ClearStream { stream, tier } => index.clear_stream(ids[*stream as usize], *tier),
        Change::Expire { now } => {
            index.expire(*now);
        }
        Change::ExpireSlice { from, len, now } => {
            index.expire_slice(*from as usize, *len as usize, *now);
        }
    }
}

fn changes() -> Vec<Change> {
    vec![
        Change::AddStream {
            stream: 0,
            spec: spec("a", 0),
        },
        Change::AddStream {
            stream: 1,
            spec: spec("b", 0),
        },
        Change::Apply {
            streams: vec![0],
            events: vec![stored(6, 100, Medium::Gpu), stored(3, 100, Medium::Cpu)],
            now: 1,
        },
        Change::Apply {
            streams: vec![1],
            events: vec![stored(4, 900, Medium::Gpu)],
            now: 2,
        },
        Change::Apply {
            streams: vec![0],
            events: vec![KvEvent::Removed(Removed {
                hashes: vec![105],
                medium: Medium::Gpu,
                group: None,
            })],
            now: 3,
        },
        Change::ClearStream {
            stream: 1,
            tier: Some(Medium::Gpu),
        },
        Change::Apply {
            streams: vec![1],
            events: vec![stored(2, 700, Medium::Disk)],
            now: 4,
        },
    ]
}

fn ops(epoch: u64, changes: &[Change]) -> Vec<Record> {
    changes
        .iter()
        .enumerate()
        .map(|(i, c)| Record {
            epoch,
            seq: i as u64 + 1,
            at_ms: 1000 + i as u64,
            now: 0.0,
            change: c.clone(),
        })
        .collect()
}

/// A replica's index and its place in the log, applying records as the replication core does.
struct Follower {
    cursor: LogCursor,
    core: Core,
}

impl Follower {
    fn new(config: IndexConfig) -> Self {
        Follower {
            cursor: LogCursor::default(),
            core: Core::new(config),
        }
    }

    fn apply(&mut self, r: &Record) -> Applied {
        let local = (Instant::now(), 0.0);
        apply_record(&mut self.cursor, &mut self.core, r.clone(), local)
    }

    fn index(&self) -> &Index {
        &self.core.index
    }
}

#[test]
fn a_follower_answers_as_the_ingester_after_every_op() {
    let config = IndexConfig::default();
    let (mut leader, mut ids) = (Index::new(config), Vec::new());
    let mut follower = Follower::new(config);
    let tokens: Vec<u32> = (1..=6 * BS).collect();
    for op in ops(7, &changes()) {
        lead(&mut leader, &mut ids, &op.change);
        // Through the codec, as over the wire.
        let wire = Record::decode(&op.encode()).expect("decode");
        assert_eq!(wire, op);
        let outcome = follower.apply(&wire);
        assert!(matches!(outcome, Applied::InOrder | Applied::NewEpoch));
        assert_eq!(
            follower.index().query_tokens(&scope(), &tokens),
            leader.query_tokens(&scope(), &tokens),
            "after op {}",
            op.seq
        );
        assert_eq!(follower.index().memberships(), leader.memberships());
    }
    assert!(follower.cursor.in_sync());
    assert_eq!(follower.cursor.epoch_seq(), (Some(7), 7));
    assert_eq!(follower.cursor.last_at_ms(), 1006);
    assert_eq!(
        follower.index().dump(),
        leader.dump(),
        "the very same index"
    );
    let answer = follower.index().query_tokens(&scope(), &tokens);
    assert_eq!(answer["a"].gpu, 5 * u64::from(BS), "{answer:?}");
    assert_eq!(answer["b"].disk, 2 * u64::from(BS), "{answer:?}");
}

#[test]
fn duplicates_are_ignored_and_a_gap_is_reported() {
    let mut follower = Follower::new(IndexConfig::default());
    let all = ops(1, &changes());
    for op in &all[..3] {
        follower.apply(op);
    }
    let before = follower.index().memberships();
    assert_eq!(follower.apply(&all[2]), Applied::Stale);
    assert_eq!(follower.index().memberships(), before);
    assert!(follower.cursor.in_sync());
    assert_eq!(follower.apply(&all[4]), Applied::AfterGap);
    assert!(!follower.cursor.in_sync());
    assert_eq!(follower.cursor.gaps(), 1);
}

#[test]
fn a_new_epoch_starts_over_from_an_empty_index() {
    let mut follower = Follower::new(IndexConfig::default());
    for op in ops(1, &changes()) {
        follower.apply(&op);
    }
    assert!(follower.index().memberships() > 0);
    let restarted = ops(2, &changes()[..2]);
    assert_eq!(follower.apply(&restarted[0]), Applied::NewEpoch);
    assert_eq!(follower.apply(&restarted[1]), Applied::InOrder);
    assert_eq!(follower.index().memberships(), 0);
    assert!(follower.cursor.in_sync());
    assert_eq!(follower.cursor.epoch_seq(), (Some(2), 2));
    // A deposed ingester (an older epoch) writing on changes nothing.
    assert_eq!(follower.apply(&ops(1, &changes())[4]), Applied::Fenced);
    // Joining an epoch mid-way: applied, but not in sync.
    let mut late = Follower::new(IndexConfig::default());
    assert_eq!(late.apply(&ops(3, &changes())[3]), Applied::NewEpoch);
    assert!(!late.cursor.in_sync());
}

fn ttl_10s() -> IndexConfig {
    IndexConfig {
        ttl_secs: Some(10),
        ..IndexConfig::default()
    }
}

/// [`changes`], then `refresh` stored on stream 1 at 15 s, then the TTL sweep at 20 s in two
/// slices of the arena: the first `cut` records, then the rest.
fn swept(refresh: KvEvent, cut: u64) -> Vec<Change> {
    let mut changes = changes();
    changes.push(Change::Apply {
        streams: vec![1],
        events: vec![refresh],
        now: 15,
    });
    for (from, len) in [(0, cut), (cut, 1 << 20)] {
        changes.push(Change::ExpireSlice { from, len, now: 20 });
    }
    changes
}

#[test]
fn a_sliced_ttl_sweep_replicates_slice_by_slice() {
    let config = ttl_10s();
    let (mut leader, mut ids) = (Index::new(config), Vec::new());
    let mut follower = Follower::new(config);
    // Stream 0 stored at 1 and 3 (now 20: expired); stream 1 refreshed at 15 (kept); the
    // sweep in two slices of the arena: two records, then the rest.
    let changes = swept(stored(2, 700, Medium::Disk), 2);
    let mut expired_after_first = None;
    for op in ops(3, &changes) {
        lead(&mut leader, &mut ids, &op.change);
        follower.apply(&op);
        assert_eq!(follower.index().memberships(), leader.memberships());
        if matches!(op.change, Change::ExpireSlice { from: 0, .. }) {
            expired_after_first = Some(leader.counters().expired);
        }
    }
    assert_eq!(
        follower.index().counters().expired,
        leader.counters().expired
    );
    let first = expired_after_first.expect("the first slice ran");
    assert!(
        first > 0 && first < leader.counters().expired,
        "the first slice dropped part: {first} of {}",
        leader.counters().expired
    );
    assert_eq!(
        leader.stream_stats(ids[0]).map(|s| s.engine_hashes),
        Some(0),
        "stream 0 swept"
    );
    assert!(
        leader
            .stream_stats(ids[1])
            .is_some_and(|s| s.engine_hashes > 0),
        "stream 1 kept (stored again at 15)"
    );
}

/// A replica's index dumped mid-log, through its bytes, restored elsewhere: the very same
/// index (the same dump again), and the rest of the log applied on top gives the ingester's
/// index, arena positions included (a sliced sweep after the restore drops what it drops on
/// the ingester).
#[test]
fn a_snapshot_restores_the_index_and_the_log_goes_on_from_it() {
    let config = ttl_10s();
    let (mut leader, mut ids) = (Index::new(config), Vec::new());
    let log = ops(4, &swept(stored(3, 800, Medium::Gpu), 3));
    let mid = 4;
    let mut first = Follower::new(config);
    for op in &log {
        lead(&mut leader, &mut ids, &op.change);
    }
    for op in &log[..mid] {
        first.apply(op);
    }
    let bytes =
        crate::cluster::encode_snapshot(&first.cursor.position(), &Replicated::dump(&first.core));
    let (position, dump): (crate::cluster::Position, CoreDump) =
        crate::cluster::decode_snapshot(&bytes).expect("decodes");
    let mut restored = Follower {
        cursor: LogCursor::at(position),
        core: Replicated::restore(&Core::new(config), dump).expect("fits"),
    };
    assert_eq!(
        crate::cluster::encode_snapshot(&position, &Replicated::dump(&restored.core)),
        bytes,
        "the same index again"
    );
    for op in &log[mid..] {
        assert_eq!(restored.apply(op), Applied::InOrder);
    }
    assert!(restored.cursor.in_sync());
    assert_eq!(restored.index().dump(), leader.dump());
    assert!(leader.counters().expired > 0, "the sweep dropped something");
    let tokens: Vec<u32> = (1..=6 * BS).collect();
    assert_eq!(
        restored.index().query_tokens(&scope(), &tokens),
        leader.query_tokens(&scope(), &tokens)
    );
    // The ingester's stream ids still map after the restore: a removal reaches the stream.
    let gone = Record {
        epoch: 4,
        seq: log.len() as u64 + 1,
        at_ms: 0,
        now: 0.0,
        change: Change::RemoveStream { stream: 1 },
    };
    restored.apply(&gone);
    lead(&mut leader, &mut ids, &gone.change);
    assert_eq!(restored.index().dump(), leader.dump());
}

/// A snapshot this replica's configuration cannot hold, or that is not an index, is refused.
#[test]
fn a_snapshot_over_the_limits_or_of_another_ttl_or_broken_is_refused() {
    let mut f = Follower::new(IndexConfig::default());
    for op in ops(1, &changes()) {
        f.apply(&op);
    }
    let dump = Replicated::dump(&f.core);
    let small = Core::new(IndexConfig {
        max_memberships: 2,
        ..IndexConfig::default()
    });
    assert!(Replicated::restore(&small, dump.clone()).is_err());
    let other_ttl = Core::new(IndexConfig {
        ttl_secs: Some(100_000),
        ..IndexConfig::default()
    });
    assert!(Replicated::restore(&other_ttl, dump.clone()).is_err());
}
