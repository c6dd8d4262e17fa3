//! The change log: a follower that applies a leader's records holds the leader's fleet and
//! key model; gaps, duplicates and a deposed leader's records are seen, not guessed around;
//! a cut change applies as the whole.

use super::*;
use crate::cluster::{
    apply_record, decode_snapshot, encode_snapshot, Applied, Body, LogCursor, Position,
};
use crate::coordinator::model::events::Op;
use crate::coordinator::model::fleet::Instances;
use crate::coordinator::model::ModelConfig;
use serde_json::{json, Value};
use std::sync::OnceLock;

/// A record of the coordinator's log.
type Record = crate::cluster::Record<Change>;

/// Unix seconds of the tests' first record.
const T0: f64 = 1_700_000_000.0;

pub(crate) fn config() -> ModelConfig {
    ModelConfig {
        max_instances: 8,
        max_tracked_keys: 1_000,
        max_quotas: 8,
        eviction_ratio: 0.5,
        trigger_watermark: 1.0,
    }
}

/// One instant for `T0`, so the tests' clock maps wall seconds to instants exactly.
fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(|| Instant::now() + Duration::from_secs(3600))
}

/// This process's clock at wall-clock `now` (seconds after `T0`).
fn clock(now: f64) -> (Instant, f64) {
    (base() + Duration::from_secs_f64(now - T0), now)
}

pub(crate) fn key(n: u64, salt: &str) -> EncodedKey {
    EncodedKey {
        chunk_hash_hex: format!("{n:04x}"),
        model_name: "m".into(),
        kv_rank: 16_777_472,
        object_group_id: 0,
        cache_salt: salt.into(),
    }
}

pub(crate) fn reg(id: &str, port: u16) -> Registration {
    Registration {
        instance_id: Some(id.into()),
        ip: "127.0.0.1".into(),
        http_port: port,
        metadata: [("role".to_owned(), id.to_owned())].into(),
        p2p_advertised_url: String::new(),
        mq_port: 0,
    }
}

pub(crate) fn batch(id: &str, seq: u64, tier: Tier, ops: Vec<Op>) -> Batch {
    Batch {
        instance_id: id.into(),
        incarnation: 3,
        seq,
        tier,
        backend: if tier == Tier::L1 { "dram" } else { "fs" }.into(),
        shared: false,
        capacity: None,
        ops,
        tokens: Vec::new(),
    }
}

pub(crate) fn stores(salt: &str, range: std::ops::Range<u64>, size: u64) -> Vec<Op> {
    range.map(|n| Op::Store(key(n, salt), size)).collect()
}

/// What the fleet holds, as the routes show it (heartbeat instants aside).
pub(crate) fn fleet_view(f: &Instances) -> Value {
    json!({
        "instances": f.iter().collect::<Vec<_>>(),
        "timed_out": f.timed_out,
        "refused": f.refused,
    })
}

/// What the key model holds, as the routes show it, and the eviction plan it would make
/// (which depends on every key's recency).
pub(crate) fn model_view(m: &mut Model, registered: Vec<String>) -> Value {
    let mut meta = serde_json::to_value(m.capture_metadata(0.0)).unwrap_or_default();
    meta["saved_at"] = Value::Null;
    let counters = m.counters.clone();
    json!({
        "usage": m.fleet_usage(registered),
        "quotas": m.quota_list(),
        "default": m.default_limit_gb(),
        "metadata": meta,
        "tracked": m.tracked_keys(),
        "counters": counters,
        "plan": m.plan_evictions(),
    })
}

pub(crate) fn view(s: &mut CoordinatorState) -> Value {
    let ids = s.fleet.iter().map(|i| i.instance_id.clone()).collect();
    json!({"fleet": fleet_view(&s.fleet), "model": model_view(&mut s.model, ids)})
}

/// A follower's place in the log, applying records as the replication core does.
#[derive(Default)]
pub(crate) struct Follower {
    cursor: LogCursor,
}

impl Follower {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn at(p: Position) -> Self {
        Follower {
            cursor: LogCursor::at(p),
        }
    }

    pub(crate) fn cursor(&self) -> &LogCursor {
        &self.cursor
    }

    pub(crate) fn note_stream_seq(&mut self, seq: u64) {
        self.cursor.note_stream_seq(seq);
    }

    pub(crate) fn apply(
        &mut self,
        s: &mut CoordinatorState,
        r: Record,
        local: (Instant, f64),
    ) -> Applied {
        apply_record(&mut self.cursor, s, r, local)
    }
}

/// A leader: applies each change to its state as the owners do, and logs it.
struct Leader {
    state: CoordinatorState,
    epoch: u64,
    seq: u64,
    log: Vec<Record>,
}

impl Leader {
    fn new(state: CoordinatorState, epoch: u64, fresh: bool, now: f64) -> Self {
        let mut l = Leader {
            state,
            epoch,
            seq: 0,
            log: Vec::new(),
        };
        l.record(
            now,
            Change::Takeover {
                holder: format!("leader-{epoch}"),
                fresh,
            },
        );
        l
    }

    fn record(&mut self, now: f64, change: Change) {
        apply_change(&mut self.state, change.clone(), now, clock(now).0);
        self.seq += 1;
        self.log.push(Record {
            epoch: self.epoch,
            seq: self.seq,
            at_ms: (now * 1e3) as u64,
            now,
            change,
        });
    }
}

/// Every record through its bytes, applied at `now`.
fn follow(f: &mut Follower, s: &mut CoordinatorState, log: &[Record], now: f64) -> Vec<Applied> {
    log.iter()
        .map(|r| {
            let r = Record::decode(&r.encode()).expect("decodes");
            f.apply(s, r, clock(now))
        })
        .collect()
}

/// A leader's log of every kind of change.
fn busy_leader() -> Leader {
    let mut l = Leader::new(CoordinatorState::new(Model::new(config())), 5, true, T0);
    for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
        l.record(
            T0 + 1.0 + i as f64,
            Change::Register {
                registration: reg(id, 9000 + i as u16),
            },
        );
    }
    let batches = vec![
        batch("a", 1, Tier::L2, stores("t", 0..20, 100)),
        batch("a", 2, Tier::L1, stores("t", 0..5, 10)),
        batch("b", 7, Tier::L2, stores("u", 0..10, 50)),
        batch("b", 7, Tier::L2, stores("u", 0..1, 50)), // a duplicate
    ];
    l.record(
        T0 + 5.0,
        Change::Admit {
            batches: batches.iter().map(Admitted::of).collect(),
        },
    );
    for b in batches.into_iter().take(3) {
        let mut b = b;
        if b.ops.iter().all(|o| matches!(o, Op::Store(..))) {
            b.ops.reverse();
        }
        l.record(T0 + 5.0, Change::Apply { batch: b });
    }
    let mut access = batch("a", 3, Tier::L2, vec![Op::Access(key(3, "t"))]);
    access.ops.push(Op::Delete(key(4, "t")));
    l.record(
        T0 + 6.0,
        Change::Admit {
            batches: vec![Admitted::of(&access)],
        },
    );
    l.record(T0 + 6.0, Change::Apply { batch: access });
    let mut declare = batch("b", 8, Tier::L2, Vec::new());
    declare.capacity = Some((1 << 30, 1));
    l.record(
        T0 + 6.5,
        Change::Admit {
            batches: vec![Admitted::of(&declare)],
        },
    );
    l.record(T0 + 6.5, Change::Apply { batch: declare });
    for change in [
        Change::Heartbeat {
            instance_id: "a".into(),
        },
        Change::SetQuota {
            cache_salt: "t".into(),
            limit_gb: 1e-6,
        },
        Change::SetQuota {
            cache_salt: "gone".into(),
            limit_gb: 2.0,
        },
        Change::RemoveQuota {
            cache_salt: "gone".into(),
        },
        Change::DefaultQuota {
            limit_gb: Some(5.0),
        },
        Change::Pin {
            keys: vec![key(1, "t"), key(2, "t")],
        },
        Change::Pin {
            keys: vec![key(1, "t")],
        },
        Change::Unpin {
            keys: vec![key(2, "t")],
        },
        Change::DropPins {
            keys: vec![key(9, "t")],
        },
        Change::Seed {
            instance_id: "a".into(),
            backend: "fs".into(),
            shared: false,
            entries: vec![(key(100, "s"), 7), (key(3, "t"), 999)],
        },
        Change::Deregister {
            instance_id: "c".into(),
        },
        Change::Forget {
            instance_ids: vec!["c".into()],
        },
        Change::TimedOut {
            instance_ids: vec!["b".into()],
        },
        Change::Forget {
            instance_ids: vec!["b".into()],
        },
    ] {
        l.record(T0 + 7.0, change);
    }
    l
}

#[test]
fn records_frame_as_they_encode_and_decode_back() {
    for change in busy_leader().log.into_iter().map(|r| r.change) {
        let r = Record {
            epoch: 1 << 40,
            seq: 300,
            at_ms: 1_700_000_000_123,
            now: T0 + 0.25,
            change,
        };
        let framed = Body::encode(&r.change).frame(r.epoch, r.seq, r.at_ms, r.now);
        assert_eq!(framed, r.encode(), "{:?}", r.change);
        assert_eq!(Record::decode(&framed).unwrap(), r);
    }
    assert!(Record::decode(b"\x93\x01").is_err());
}

#[test]
fn a_follower_holds_the_leaders_state_through_every_kind_of_change() {
    let mut leader = busy_leader();
    let mut f = Follower::new();
    let mut standby = CoordinatorState::new(Model::new(config()));
    let applied = follow(&mut f, &mut standby, &leader.log, T0 + 8.0);
    assert_eq!(applied[0], Applied::NewEpoch);
    assert!(applied[1..].iter().all(|a| *a == Applied::InOrder));
    assert!(f.cursor().in_sync());
    assert_eq!(f.cursor().epoch_seq(), (Some(5), leader.seq));
    let (a, b) = (view(&mut leader.state), view(&mut standby));
    assert_eq!(a, b);
    // The log moved the state: a registered, b timed out, c deregistered, usage, quotas,
    // pins and the resync's key are all there (not an empty state compared to another).
    assert_eq!(a["fleet"]["instances"].as_array().map(Vec::len), Some(1));
    assert_eq!(a["fleet"]["timed_out"], 1);
    assert_eq!(a["model"]["tracked"], 30);
    assert_eq!(a["model"]["default"], 5.0);
    assert_eq!(a["model"]["metadata"]["pins"][0]["pin_count"], 2);
    assert_eq!(
        a["fleet"]["instances"][0]["registration_time"],
        json!(T0 + 1.0)
    );
    assert!(a["model"]["plan"].as_array().is_some_and(|p| !p.is_empty()));
}

#[test]
fn a_new_leader_carries_the_state_on_and_a_deposed_one_is_fenced() {
    let mut first = busy_leader();
    let mut f = Follower::new();
    let mut standby = CoordinatorState::new(Model::new(config()));
    follow(&mut f, &mut standby, &first.log, T0 + 8.0);
    // The first leader logs one more change after losing its lease (epoch 5).
    first.record(
        T0 + 9.0,
        Change::SetQuota {
            cache_salt: "late".into(),
            limit_gb: 1.0,
        },
    );
    // The standby's own takeover (epoch 9) reaches the log before that late write.
    let state = std::mem::replace(&mut standby, CoordinatorState::new(Model::new(config())));
    let mut second = Leader::new(state, 9, false, T0 + 9.0);
    let mut other = CoordinatorState::new(Model::new(config()));
    let mut g = Follower::new();
    follow(
        &mut g,
        &mut other,
        &first.log[..first.log.len() - 1],
        T0 + 9.0,
    );
    assert_eq!(
        follow(&mut g, &mut other, &second.log, T0 + 9.5),
        [Applied::NewEpoch]
    );
    let late = first.log.last().cloned().unwrap();
    assert_eq!(
        follow(&mut g, &mut other, &[late], T0 + 9.6),
        [Applied::Fenced]
    );
    assert_eq!(g.cursor().fenced(), 1);
    assert!(g.cursor().in_sync());
    second.record(
        T0 + 10.0,
        Change::Register {
            registration: reg("d", 9100),
        },
    );
    follow(&mut g, &mut other, &second.log[1..], T0 + 10.0);
    assert_eq!(view(&mut second.state), view(&mut other));
    assert!(
        !other.model.quota_status("late").quota_exists,
        "the deposed leader's write changed nothing"
    );
}

#[test]
fn gaps_duplicates_and_a_late_start_are_reported() {
    let leader = busy_leader();
    let log = &leader.log;
    // A duplicate is ignored; a missing record is a gap (applied, not in sync).
    let mut f = Follower::new();
    let mut s = CoordinatorState::new(Model::new(config()));
    follow(&mut f, &mut s, &log[..3], T0 + 8.0);
    assert_eq!(
        follow(&mut f, &mut s, &log[2..3], T0 + 8.0),
        [Applied::Stale]
    );
    assert_eq!(
        follow(&mut f, &mut s, &log[4..5], T0 + 8.0),
        [Applied::AfterGap]
    );
    assert!(!f.cursor().in_sync());
    assert_eq!(f.cursor().gaps(), 1);
    // A follower that starts after the stream dropped its first records is not in sync,
    // nor is one whose first record is a takeover over an older log.
    let mut late = Follower::new();
    follow(
        &mut late,
        &mut CoordinatorState::new(Model::new(config())),
        &log[3..],
        T0 + 8.0,
    );
    assert!(!late.cursor().in_sync());
    let next = Leader::new(
        CoordinatorState::new(Model::new(config())),
        6,
        false,
        T0 + 8.0,
    );
    let mut joined = Follower::new();
    follow(
        &mut joined,
        &mut CoordinatorState::new(Model::new(config())),
        &next.log,
        T0 + 8.0,
    );
    assert!(!joined.cursor().in_sync());
}

#[test]
fn heartbeats_keep_their_age_and_a_takeover_counts_everyone_as_seen() {
    let timeout = Duration::from_secs(30);
    let mut l = Leader::new(CoordinatorState::new(Model::new(config())), 2, true, T0);
    l.record(
        T0,
        Change::Register {
            registration: reg("quiet", 1),
        },
    );
    l.record(
        T0,
        Change::Register {
            registration: reg("chatty", 2),
        },
    );
    l.record(
        T0 + 50.0,
        Change::Heartbeat {
            instance_id: "chatty".into(),
        },
    );
    // Read 60 s later: "quiet" has been silent 60 s, "chatty" 10 s.
    let mut f = Follower::new();
    let mut s = CoordinatorState::new(Model::new(config()));
    follow(&mut f, &mut s, &l.log, T0 + 60.0);
    assert_eq!(s.fleet.expired(clock(T0 + 60.0).0, timeout), ["quiet"]);
    assert_eq!(
        leader_instant(T0 + 50.0, clock(T0 + 60.0)),
        clock(T0 + 50.0).0
    );
    assert_eq!(
        leader_instant(T0 + 70.0, clock(T0 + 60.0)),
        clock(T0 + 60.0).0
    );
    // A new leader takes over at T0 + 61: nobody is removed for the failover's silence.
    let mut next = Leader::new(s, 3, false, T0 + 61.0);
    assert!(next
        .state
        .fleet
        .expired(clock(T0 + 61.0 + 29.0).0, timeout)
        .is_empty());
    follow(
        &mut f,
        &mut CoordinatorState::new(Model::new(config())),
        &next.log,
        T0 + 61.0,
    );
    assert_eq!(
        view(&mut next.state)["fleet"]["instances"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
}

#[test]
fn a_cut_change_applies_as_the_whole() {
    let mut applied_l1 = batch("a", 1, Tier::L1, stores("t", 0..9, 10));
    applied_l1.ops.push(Op::Delete(key(2, "t")));
    let metadata = {
        let mut m = Model::new(config());
        m.set_quota("x", 1.0).unwrap();
        m.set_quota("y", 2.0).unwrap();
        m.set_default_limit(None).unwrap();
        m.pins
            .pin(&[key(1, "x"), key(2, "x"), key(3, "x")], 10)
            .unwrap();
        m.pins.pin(&[key(2, "x")], 10).unwrap();
        m.capture_metadata(0.0)
    };
    let wholes = [
        Change::Apply {
            batch: batch("a", 1, Tier::L2, stores("t", 0..9, 10)),
        },
        Change::Apply { batch: applied_l1 },
        Change::Seed {
            instance_id: "a".into(),
            backend: "s3".into(),
            shared: true,
            entries: (0..7).map(|n| (key(n, "s"), n + 1)).collect(),
        },
        Change::Pin {
            keys: vec![key(1, "t"), key(1, "t"), key(5, "t")],
        },
        Change::Metadata {
            replace: true,
            doc: metadata.clone(),
        },
        Change::Metadata {
            replace: true,
            doc: Metadata {
                pins: Vec::new(),
                ..metadata
            },
        },
    ];
    for whole in wholes {
        // A standby that had other operator state and keys before.
        let before = |s: &mut CoordinatorState| {
            s.model.set_quota("old", 3.0).unwrap();
            s.model.pins.pin(&[key(8, "old")], 10).unwrap();
            s.model
                .ingest([batch("z", 1, Tier::L2, stores("t", 3..5, 1))]);
        };
        let mut one = CoordinatorState::new(Model::new(config()));
        let mut parts = CoordinatorState::new(Model::new(config()));
        before(&mut one);
        before(&mut parts);
        apply_change(&mut one, whole.clone(), T0, clock(T0).0);
        // Cut down to single items, in order.
        let mut queue = vec![whole.clone()];
        let mut n = 0;
        while let Some(c) = queue.pop() {
            match c.split() {
                Some((a, b)) => {
                    queue.push(b);
                    queue.push(a);
                }
                None => {
                    n += 1;
                    apply_change(&mut parts, c, T0, clock(T0).0);
                }
            }
        }
        assert!(n > 1, "{whole:?} was not cut");
        assert_eq!(view(&mut one), view(&mut parts), "{whole:?}");
    }
    assert!(Change::Heartbeat {
        instance_id: "a".into()
    }
    .split()
    .is_none());
}

#[test]
fn the_operator_state_replaces_a_followers_own() {
    // A standby loaded an old --metadata-path file; the leader's whole state replaces it.
    let mut standby = CoordinatorState::new(Model::new(config()));
    standby.model.set_quota("stale", 1.0).unwrap();
    standby.model.pins.pin(&[key(7, "stale")], 10).unwrap();
    let mut leader = CoordinatorState::new(Model::new(config()));
    leader.model.set_quota("t", 4.0).unwrap();
    leader.model.set_default_limit(None).unwrap();
    leader.model.pins.pin(&[key(1, "t")], 10).unwrap();
    let doc = leader.model.capture_metadata(T0);
    apply_change(
        &mut standby,
        Change::Metadata { replace: true, doc },
        T0,
        clock(T0).0,
    );
    assert_eq!(view(&mut standby), view(&mut leader));
}

/// A follower's state dumped mid-log, through its bytes, restored elsewhere: the same state
/// (the same dump again), and the rest of the log applied on top gives the leader's state,
/// LRU order (the eviction plan) and L1 placements (a delete finds its fingerprint) included.
#[test]
fn a_snapshot_restores_the_state_and_the_log_goes_on_from_it() {
    let mut leader = busy_leader();
    let mid = leader.log.len() / 2;
    let mut f = Follower::new();
    let mut standby = CoordinatorState::new(Model::new(config()));
    follow(&mut f, &mut standby, &leader.log[..mid], T0 + 8.0);
    f.note_stream_seq(mid as u64);
    let bytes = encode_snapshot(&f.cursor().position(), &Replicated::dump(&standby));
    let (position, dump): (Position, StateDump) = decode_snapshot(&bytes).expect("decodes");
    assert_eq!(dump, Replicated::dump(&standby));
    assert_eq!(position.stream_seq, mid as u64);
    assert_eq!((position.epoch, position.seq), f.cursor().epoch_seq());
    let empty = CoordinatorState::new(Model::new(config()));
    let mut restored = Replicated::restore(&empty, dump).expect("fits");
    // The same state: the same bytes when dumped again (a view would plan evictions, which
    // counts; the dump holds every field the views show).
    assert_eq!(
        encode_snapshot(&position, &Replicated::dump(&restored)),
        bytes
    );
    assert_eq!(restored.fleet.len(), standby.fleet.len());
    assert_eq!(restored.model.tracked_keys(), standby.model.tracked_keys());
    // The log goes on from the snapshot's position, and more records come.
    let mut g = Follower::at(position);
    assert!(g.cursor().in_sync());
    let mut l1_delete = batch("a", 20, Tier::L1, vec![Op::Delete(key(1, "t"))]);
    l1_delete.ops.push(Op::Delete(key(2, "t")));
    let l2 = batch(
        "a",
        21,
        Tier::L2,
        vec![Op::Access(key(0, "t")), Op::Delete(key(5, "t"))],
    );
    for change in [
        Change::Register {
            registration: reg("d", 9100),
        },
        Change::Admit {
            batches: vec![Admitted::of(&l1_delete), Admitted::of(&l2)],
        },
        Change::Apply { batch: l1_delete },
        Change::Apply { batch: l2 },
        Change::Pin {
            keys: vec![key(7, "t")],
        },
    ] {
        leader.record(T0 + 9.0, change);
    }
    let applied = follow(&mut g, &mut restored, &leader.log[mid..], T0 + 10.0);
    assert!(
        applied.iter().all(|a| *a == Applied::InOrder),
        "{applied:?}"
    );
    assert_eq!(g.cursor().epoch_seq(), (Some(5), leader.seq));
    let (a, b) = (view(&mut leader.state), view(&mut restored));
    assert_eq!(a, b);
    // The restored state was not empty: it held keys, L1 bytes and instances.
    assert_eq!(a["model"]["tracked"], 29);
    assert!(a["fleet"]["instances"]
        .as_array()
        .is_some_and(|i| i.len() == 2));
    assert!(a["model"]["plan"].as_array().is_some_and(|p| !p.is_empty()));
}

/// A snapshot a process's limits cannot hold is refused, not cut.
#[test]
fn a_snapshot_over_the_limits_is_refused() {
    let leader = busy_leader();
    let dump = Replicated::dump(&leader.state);
    let small = CoordinatorState::new(Model::new(ModelConfig {
        max_tracked_keys: 5,
        ..config()
    }));
    assert!(Replicated::restore(&small, dump).is_err());
}
