//! Property tests: random operation sequences against a naive model
//! `(worker, location) → set of hashes`, checked after every step — counts, key sets and
//! lookups must agree exactly across tombstones, compactions, re-registrations and syncs.

use super::*;
use crate::protocol::{ChunkHash, KVOpEvent, OpType};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

const INSTANCES: [&str; 2] = ["i0", "i1"];
const LOCATIONS: [&str; 3] = ["L0", "L1", "L2"];
const BATCHES: i64 = 2;

/// Hashes covering both maps and the shared bit patterns (`-1` vs `2^64 - 1`, …).
fn universe() -> Vec<ChunkHash> {
    vec![
        ChunkHash::from_i64(-1),
        ChunkHash::from_u64(u64::MAX),
        ChunkHash::from_i64(i64::MIN),
        ChunkHash::from_u64(1 << 63),
        ChunkHash::from_u64(0),
        ChunkHash::from_u64(1),
        ChunkHash::from_i64(-2),
        ChunkHash::from_u64(u64::MAX - 1),
    ]
}

type WorkerKey = (usize, i64);

#[derive(Clone, Debug)]
enum Op {
    Register(WorkerKey),
    Heartbeat(WorkerKey),
    Deregister(WorkerKey),
    Batch(WorkerKey, usize, Vec<(bool, usize)>),
    SyncStart(WorkerKey, usize, u8),
    SyncBatch(WorkerKey, usize, u8, i64, Vec<usize>),
    SyncEnd(WorkerKey, u8),
    ExpireAll,
    Compact,
}

fn op() -> impl Strategy<Value = Op> {
    let w = (0..INSTANCES.len(), 0..2i64);
    let loc = 0..LOCATIONS.len();
    let key = 0..universe().len();
    prop_oneof![
        2 => w.clone().prop_map(Op::Register),
        1 => w.clone().prop_map(Op::Heartbeat),
        1 => w.clone().prop_map(Op::Deregister),
        8 => (w.clone(), loc.clone(), prop::collection::vec((any::<bool>(), key.clone()), 0..8))
            .prop_map(|(w, l, ops)| Op::Batch(w, l, ops)),
        2 => (w.clone(), loc.clone(), 0..2u8).prop_map(|(w, l, id)| Op::SyncStart(w, l, id)),
        3 => (w.clone(), loc, 0..2u8, -1..=BATCHES, prop::collection::vec(key, 0..6))
            .prop_map(|(w, l, id, b, keys)| Op::SyncBatch(w, l, id, b, keys)),
        2 => (w, 0..2u8).prop_map(|(w, id)| Op::SyncEnd(w, id)),
        1 => Just(Op::ExpireAll),
        1 => Just(Op::Compact),
    ]
}

#[derive(Clone, Debug, PartialEq)]
enum MSync {
    Idle,
    Syncing {
        id: u8,
        received: [bool; BATCHES as usize],
        ended: bool,
    },
    Completed(u8),
    Failed,
}

#[derive(Clone, Debug)]
struct MWorker {
    locs: BTreeMap<usize, BTreeSet<ChunkHash>>,
    sync: MSync,
}

impl MWorker {
    fn new() -> Self {
        MWorker {
            locs: BTreeMap::new(),
            sync: MSync::Idle,
        }
    }
}

fn sync_id(id: u8) -> String {
    format!("sync-{id}")
}

/// Applies `op` to both the index and the model.
fn step(ix: &mut ChunkIndex, model: &mut BTreeMap<WorkerKey, MWorker>, op: &Op, now: f64) {
    let u = universe();
    match op {
        Op::Register(w @ (i, wid)) => {
            ix.register(INSTANCES[*i], *wid, "h", 1, Some("p"), now)
                .unwrap();
            model.insert(*w, MWorker::new());
        }
        Op::Heartbeat(w @ (i, wid)) => {
            ix.heartbeat(INSTANCES[*i], *wid, "h", 1, Some("p"), now)
                .unwrap();
            model.entry(*w).or_insert_with(MWorker::new);
        }
        Op::Deregister(w @ (i, wid)) => {
            assert_eq!(
                ix.deregister(INSTANCES[*i], *wid),
                model.remove(w).is_some()
            );
        }
        Op::Batch(w @ (i, wid), l, ops) => {
            let events: Vec<_> = ops
                .iter()
                .enumerate()
                .map(|(seq, &(is_admit, k))| KVOpEvent {
                    op_type: if is_admit {
                        OpType::Admit
                    } else {
                        OpType::Evict
                    },
                    key: u[k],
                    seq_num: seq as i64,
                })
                .collect();
            let out = ix.apply_batch(INSTANCES[*i], *wid, LOCATIONS[*l], &events, now);
            match model.get_mut(w) {
                None => assert_eq!(out, BatchOutcome::UnknownWorker),
                Some(mw) if matches!(mw.sync, MSync::Syncing { .. }) => {
                    assert_eq!(out, BatchOutcome::DiscardedSyncing)
                }
                Some(mw) => {
                    assert!(matches!(out, BatchOutcome::Applied { .. }));
                    let set = mw.locs.entry(*l).or_default();
                    for &(is_admit, k) in ops {
                        if is_admit {
                            set.insert(u[k]);
                        } else {
                            set.remove(&u[k]);
                        }
                    }
                }
            }
        }
        Op::SyncStart(w @ (i, wid), l, id) => {
            let res = ix.sync_start(
                INSTANCES[*i],
                *wid,
                LOCATIONS[*l],
                &sync_id(*id),
                0,
                BATCHES,
                now,
            );
            match model.get_mut(w) {
                None => assert_eq!(res, Err(SyncError::UnknownWorker)),
                Some(mw) => match mw.sync {
                    MSync::Syncing { id: cur, .. } if cur != *id => assert!(res.is_err()),
                    _ => {
                        assert_eq!(res, Ok(()));
                        mw.sync = MSync::Syncing {
                            id: *id,
                            received: [false; BATCHES as usize],
                            ended: false,
                        };
                        mw.locs.remove(l);
                    }
                },
            }
        }
        Op::SyncBatch(w @ (i, wid), l, id, b, keys) => {
            let hashes: Vec<_> = keys.iter().map(|&k| u[k]).collect();
            let out = ix.sync_batch(
                INSTANCES[*i],
                *wid,
                LOCATIONS[*l],
                &sync_id(*id),
                *b,
                &hashes,
                now,
            );
            let mut expected = SyncBatchOutcome::Rejected;
            if let Some(mw) = model.get_mut(w) {
                if let MSync::Syncing {
                    id: cur,
                    received,
                    ended,
                } = &mut mw.sync
                {
                    if cur == id && (0..BATCHES).contains(b) {
                        received[*b as usize] = true;
                        mw.locs.entry(*l).or_default().extend(hashes);
                        expected = SyncBatchOutcome::Accepted;
                        if *ended && received.iter().all(|&r| r) {
                            mw.sync = MSync::Completed(*id);
                            expected = SyncBatchOutcome::Completed;
                        }
                    }
                }
            }
            assert_eq!(out, expected);
        }
        Op::SyncEnd(w @ (i, wid), id) => {
            let out = ix.sync_end(INSTANCES[*i], *wid, &sync_id(*id), 0, now);
            let expected = match model.get_mut(w).map(|mw| &mut mw.sync) {
                Some(sync @ MSync::Syncing { .. }) => match sync {
                    MSync::Syncing {
                        id: cur,
                        received,
                        ended,
                    } if cur == id => {
                        *ended = true;
                        match received.iter().filter(|r| !**r).count() as u64 {
                            0 => {
                                *sync = MSync::Completed(*id);
                                SyncEndOutcome::Completed
                            }
                            missing => SyncEndOutcome::Incomplete { missing },
                        }
                    }
                    _ => SyncEndOutcome::Rejected,
                },
                Some(MSync::Completed(cur)) if cur == id => SyncEndOutcome::Completed,
                _ => SyncEndOutcome::Rejected,
            };
            assert_eq!(out, expected);
        }
        Op::ExpireAll => {
            let expired = ix.expire_syncs(f64::MAX, 0.0);
            let mut expected = 0;
            for mw in model.values_mut() {
                if matches!(mw.sync, MSync::Syncing { .. }) {
                    mw.sync = MSync::Failed;
                    expected += 1;
                }
            }
            assert_eq!(expired.len(), expected);
        }
        Op::Compact => {
            ix.compact();
            assert_eq!(ix.dead_memberships(), 0);
        }
    }
}

fn check(ix: &ChunkIndex, model: &BTreeMap<WorkerKey, MWorker>) {
    let u = universe();
    let total: usize = model
        .values()
        .flat_map(|w| w.locs.values())
        .map(BTreeSet::len)
        .sum();
    assert_eq!(ix.key_count(), total as u64);
    assert_eq!(ix.worker_count(), model.len());
    assert_eq!(ix.memory_stats().live_memberships, total as u64);
    for (i, inst) in INSTANCES.iter().enumerate() {
        for wid in 0..2 {
            let mw = model.get(&(i, wid));
            assert_eq!(ix.worker(inst, wid).is_some(), mw.is_some());
            for (l, name) in LOCATIONS.iter().enumerate() {
                let want: Vec<_> = mw
                    .and_then(|w| w.locs.get(&l))
                    .map(|s| s.iter().copied().collect())
                    .unwrap_or_default();
                assert_eq!(ix.keys_of(inst, wid, name), want);
            }
            if let (Some(view), Some(mw)) = (ix.worker(inst, wid), mw) {
                let sum: u64 = view.locations.iter().map(|l| l.key_count).sum();
                assert_eq!(view.key_count, sum);
                let state = match mw.sync {
                    MSync::Idle => "idle",
                    MSync::Syncing { .. } => "syncing",
                    MSync::Completed(_) => "completed",
                    MSync::Failed => "failed",
                };
                assert_eq!(view.sync.state, state);
            }
        }
    }
    let holders_of = |k: ChunkHash| -> BTreeSet<(usize, i64, usize)> {
        model
            .iter()
            .flat_map(|(&(i, wid), w)| {
                w.locs
                    .iter()
                    .filter(move |(_, s)| s.contains(&k))
                    .map(move |(&l, _)| (i, wid, l))
            })
            .collect()
    };
    let index_of = |s: &str, names: &[&str]| names.iter().position(|n| *n == s).unwrap();
    for (n, &k) in u.iter().enumerate() {
        let next = u[(n + 1) % u.len()];
        let want_next = holders_of(next);
        let got: BTreeMap<(usize, i64, usize), usize> = ix
            .prefix_holders(&[k, next])
            .into_iter()
            .map(|p| {
                let key = (
                    index_of(p.instance_id, &INSTANCES),
                    p.worker_id,
                    index_of(p.location, &LOCATIONS),
                );
                (key, p.matched)
            })
            .collect();
        let want: BTreeMap<_, _> = holders_of(k)
            .into_iter()
            .map(|h| (h, 1 + usize::from(want_next.contains(&h))))
            .collect();
        assert_eq!(got, want, "prefix holders of {k:?}, {next:?}");
        // P2P from outside the fleet returns a holder with the longest prefix.
        let best = want.values().max().copied();
        assert_eq!(
            ix.p2p_lookup(&[k, next], "outsider", 0)
                .map(|h| h.num_hit_chunks),
            best
        );
    }
    let syncing = model
        .values()
        .filter(|w| matches!(w.sync, MSync::Syncing { .. }))
        .count();
    let completed = model
        .values()
        .filter(|w| matches!(w.sync, MSync::Completed(_)))
        .count();
    let (s, c, _) = ix.sync_counts();
    assert_eq!((s, c), (syncing, completed));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn index_matches_naive_model(
        ops in prop::collection::vec(op(), 1..120),
        compact_min_dead in 0u64..40,
    ) {
        let mut ix = ChunkIndex::with_config(ChunkIndexConfig {
            compact_min_dead,
            ..ChunkIndexConfig::default()
        });
        let mut model = BTreeMap::new();
        for (t, op) in ops.iter().enumerate() {
            step(&mut ix, &mut model, op, t as f64);
            check(&ix, &model);
        }
    }
}
