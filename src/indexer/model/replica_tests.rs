//! A replica against an ingester's index fed the same changes: the replica's state obeys the
//! replication laws (`crate::cluster::laws`: the codec, gaps, duplicates, fencing, snapshots
//! restoring the very index with its arena positions); the ingester's own path gives the same
//! answers after every op; a new epoch starts over from an empty index; a sliced TTL sweep
//! replicates slice by slice; a snapshot over the limits is refused.

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

/// The replica's state under the replication laws: logs of streams added and removed, stored,
/// removed and cleared blocks of every tier, cleared streams and TTL sweeps (whole and in
/// slices), the ingester's clock going forward, on a 10 s TTL.
mod laws {
    use super::*;
    use crate::cluster::laws::{check, obey, Subject};
    use proptest::prelude::*;

    const STREAMS: u32 = 3;

    fn medium() -> impl Strategy<Value = Medium> + Clone {
        prop_oneof![Just(Medium::Gpu), Just(Medium::Cpu), Just(Medium::Disk)]
    }

    fn event() -> impl Strategy<Value = KvEvent> {
        prop_oneof![
            3 => (1..5u32, 0..12u64, medium())
                .prop_map(|(blocks, base, medium)| stored(blocks, 100 + base, medium)),
            2 => (prop::collection::vec(100..116u64, 1..4), medium()).prop_map(
                |(hashes, medium)| KvEvent::Removed(Removed {
                    hashes,
                    medium,
                    group: None,
                })
            ),
            1 => prop::option::of(medium()).prop_map(KvEvent::Cleared),
        ]
    }

    /// A change; an `Apply`'s or a sweep's `now` is set by its place in the log.
    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            2 => (0..STREAMS, 0..2usize).prop_map(|(stream, i)| Change::AddStream {
                stream,
                spec: spec(["a", "b"][i], stream),
            }),
            1 => (0..STREAMS).prop_map(|stream| Change::RemoveStream { stream }),
            6 => (
                prop::collection::vec(0..STREAMS, 1..3),
                prop::collection::vec(event(), 1..4),
            )
                .prop_map(|(streams, events)| Change::Apply {
                    streams,
                    events,
                    now: 0,
                }),
            1 => (0..STREAMS, prop::option::of(medium()))
                .prop_map(|(stream, tier)| Change::ClearStream { stream, tier }),
            1 => Just(Change::Expire { now: 0 }),
            1 => (0..8u64, 1..8u64).prop_map(|(from, len)| Change::ExpireSlice {
                from,
                len,
                now: 0,
            }),
        ]
    }

    /// Change `i` happens at `3 i` seconds.
    fn timed(mut changes: Vec<Change>) -> Vec<Change> {
        for (i, c) in changes.iter_mut().enumerate() {
            let at = 3 * u32::try_from(i).unwrap_or(u32::MAX / 4);
            match c {
                Change::Apply { now, .. }
                | Change::Expire { now }
                | Change::ExpireSlice { now, .. } => *now = at,
                _ => {}
            }
        }
        changes
    }

    impl Subject for Core {
        fn empty() -> Self {
            Core::new(ttl_10s())
        }

        fn changes() -> BoxedStrategy<Vec<Change>> {
            prop::collection::vec(change(), 0..16)
                .prop_map(timed)
                .boxed()
        }
    }

    #[test]
    fn the_replica_obeys_the_replication_laws() {
        obey::<Core>(&changes());
        obey::<Core>(&swept(stored(3, 800, Medium::Gpu), 3));
        check::<Core>(64);
    }
}
