//! The follower against an ingester's index fed the same changes: equal answers, a new epoch
//! starts over, a gap is seen and reported, duplicates are ignored, ops survive the codec.

use super::*;
use crate::indexer::events::{Removed, Stored};
use crate::indexer::index::tests::{scope, spec, BS};

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

fn ops(epoch: u64, changes: &[Change]) -> Vec<Op> {
    changes
        .iter()
        .enumerate()
        .map(|(i, c)| Op {
            epoch,
            seq: i as u64 + 1,
            at_ms: 1000 + i as u64,
            change: c.clone(),
        })
        .collect()
}

#[test]
fn a_follower_answers_as_the_ingester_after_every_op() {
    let config = IndexConfig::default();
    let (mut leader, mut ids) = (Index::new(config), Vec::new());
    let mut follower = Follower::new(config);
    let mut replica = Index::new(config);
    let tokens: Vec<u32> = (1..=6 * BS).collect();
    for op in ops(7, &changes()) {
        lead(&mut leader, &mut ids, &op.change);
        // Through the codec, as over the wire.
        let wire = Op::decode(&op.encode().expect("encode")).expect("decode");
        assert_eq!(wire, op);
        let outcome = follower.apply(&mut replica, &wire);
        assert!(matches!(outcome, Applied::InOrder | Applied::NewEpoch));
        assert_eq!(
            replica.query_tokens(&scope(), &tokens),
            leader.query_tokens(&scope(), &tokens),
            "after op {}",
            op.seq
        );
        assert_eq!(replica.memberships(), leader.memberships());
    }
    assert!(follower.in_sync());
    assert_eq!(follower.position(), (Some(7), 7));
    assert_eq!(follower.last_at_ms(), 1006);
    let answer = replica.query_tokens(&scope(), &tokens);
    assert_eq!(answer["a"].gpu, 5 * u64::from(BS), "{answer:?}");
    assert_eq!(answer["b"].disk, 2 * u64::from(BS), "{answer:?}");
}

#[test]
fn duplicates_are_ignored_and_a_gap_is_reported() {
    let mut follower = Follower::new(IndexConfig::default());
    let mut replica = Index::new(IndexConfig::default());
    let all = ops(1, &changes());
    for op in &all[..3] {
        follower.apply(&mut replica, op);
    }
    let before = replica.memberships();
    assert_eq!(follower.apply(&mut replica, &all[2]), Applied::Stale);
    assert_eq!(replica.memberships(), before);
    assert!(follower.in_sync());
    assert_eq!(follower.apply(&mut replica, &all[4]), Applied::AfterGap);
    assert!(!follower.in_sync());
    assert_eq!(follower.gaps(), 1);
}

#[test]
fn a_new_epoch_starts_over_from_an_empty_index() {
    let mut follower = Follower::new(IndexConfig::default());
    let mut replica = Index::new(IndexConfig::default());
    for op in ops(1, &changes()) {
        follower.apply(&mut replica, &op);
    }
    assert!(replica.memberships() > 0);
    let restarted = ops(2, &changes()[..2]);
    assert_eq!(
        follower.apply(&mut replica, &restarted[0]),
        Applied::NewEpoch
    );
    assert_eq!(
        follower.apply(&mut replica, &restarted[1]),
        Applied::InOrder
    );
    assert_eq!(replica.memberships(), 0);
    assert!(follower.in_sync());
    assert_eq!(follower.position(), (Some(2), 2));
    // Joining an epoch mid-way: applied, but not in sync.
    let mut late = Follower::new(IndexConfig::default());
    let mut late_index = Index::new(IndexConfig::default());
    assert_eq!(
        late.apply(&mut late_index, &ops(3, &changes())[3]),
        Applied::NewEpoch
    );
    assert!(!late.in_sync());
}

#[test]
fn a_sliced_ttl_sweep_replicates_slice_by_slice() {
    let config = IndexConfig {
        ttl_secs: Some(10),
        ..IndexConfig::default()
    };
    let (mut leader, mut ids) = (Index::new(config), Vec::new());
    let mut follower = Follower::new(config);
    let mut replica = Index::new(config);
    let mut changes = changes();
    // Stream 0 stored at 1 and 3 (now 20: expired); stream 1 refreshed at 15 (kept).
    changes.push(Change::Apply {
        streams: vec![1],
        events: vec![stored(2, 700, Medium::Disk)],
        now: 15,
    });
    // The sweep in two slices of the arena: two records, then the rest.
    changes.push(Change::ExpireSlice {
        from: 0,
        len: 2,
        now: 20,
    });
    changes.push(Change::ExpireSlice {
        from: 2,
        len: 1 << 20,
        now: 20,
    });
    let mut expired_after_first = None;
    for op in ops(3, &changes) {
        lead(&mut leader, &mut ids, &op.change);
        follower.apply(&mut replica, &op);
        assert_eq!(replica.memberships(), leader.memberships());
        if matches!(op.change, Change::ExpireSlice { from: 0, .. }) {
            expired_after_first = Some(leader.counters().expired);
        }
    }
    assert_eq!(replica.counters().expired, leader.counters().expired);
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
