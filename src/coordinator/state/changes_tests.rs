//! The change log: the coordinator's state obeys the replication laws
//! (`crate::cluster::laws`) over generated logs and over a curated log of every kind of
//! change; heartbeats keep their age on a follower and a takeover counts everyone as seen;
//! the operator state replaces a follower's own; a snapshot over the limits is refused.

use super::*;
use crate::cluster::laws;
use crate::cluster::{apply_record, Applied, LogCursor};
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

    pub(crate) fn cursor(&self) -> &LogCursor {
        &self.cursor
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

/// The laws over a curated log of every kind of change, which moves the state (not two empty
/// states compared).
#[test]
fn the_laws_hold_over_a_log_of_every_kind_of_change() {
    let mut leader = busy_leader();
    let changes: Vec<Change> = leader.log[1..].iter().map(|r| r.change.clone()).collect();
    laws::obey::<CoordinatorState>(&changes);
    let mut f = Follower::new();
    let mut standby = CoordinatorState::new(Model::new(config()));
    follow(&mut f, &mut standby, &leader.log, T0 + 8.0);
    let a = view(&mut leader.state);
    assert_eq!(a, view(&mut standby));
    // a registered, b timed out, c deregistered, usage, quotas, pins and the resync's key.
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

/// A store after a delete that dropped the last placement of its backend, in one batch, keeps
/// its backend's name: the directory holds the batch's backend while it applies the batch
/// (it freed the name at the delete, and the store then named an empty backend).
#[test]
fn a_store_after_the_delete_of_its_backends_last_placement_names_the_backend() {
    let ops = vec![
        Op::Store(key(1, "u"), 1),
        Op::Delete(key(1, "u")),
        Op::Store(key(0, "t"), 1),
    ];
    let mut s = CoordinatorState::new(Model::new(config()));
    apply_change(
        &mut s,
        Change::Apply {
            batch: batch("a", 1, Tier::L2, ops),
        },
        T0,
        clock(T0).0,
    );
    let found = s.model.directory.lookup(&[key(0, "t"), key(1, "u")]);
    assert_eq!(found[0].placements.len(), 1);
    assert_eq!(found[0].placements[0].backend, "fs");
    assert!(found[1].placements.is_empty());
}

/// The coordinator's state under the replication laws: logs of registrations, heartbeats,
/// removals, admitted and applied event slices of both tiers (capacity declarations among
/// them), quotas, pins, resync seeds, expiries and the operator state, over three instances,
/// two salts and a dozen keys; quotas small enough that the eviction plan has work.
mod generated {
    use super::*;
    use crate::cluster::laws::Subject;
    use proptest::prelude::*;

    const IDS: [&str; 3] = ["a", "b", "c"];
    const SALTS: [&str; 2] = ["t", "u"];

    fn id() -> impl Strategy<Value = String> + Clone {
        (0..IDS.len()).prop_map(|i| IDS[i].to_owned())
    }

    fn salt() -> impl Strategy<Value = String> + Clone {
        (0..SALTS.len()).prop_map(|s| SALTS[s].to_owned())
    }

    fn k() -> impl Strategy<Value = EncodedKey> + Clone {
        (0..12u64, 0..SALTS.len()).prop_map(|(n, s)| key(n, SALTS[s]))
    }

    fn keys() -> impl Strategy<Value = Vec<EncodedKey>> {
        prop::collection::vec(k(), 0..5)
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (k(), 1..200u64).prop_map(|(k, size)| Op::Store(k, size)),
            1 => k().prop_map(Op::Access),
            1 => k().prop_map(Op::Delete),
        ]
    }

    /// One slice of a batch as the leader applies it; a capacity declaration has no ops. Two
    /// inputs the generator leaves out, where the key directory disagrees with itself on the
    /// leader already (so a follower may too): a key stored twice in one batch (the directory
    /// applies a slice of stores in reverse, the sender's order, and the model forwards, so
    /// they keep different sizes, and a follower that applied the slice cut to fit keeps the
    /// model's), and a fleet-shared L1 tier (a shared L1 placement deleted by another
    /// instance leaves the key counted in its first reporter's L1 set, which a restore does
    /// not rebuild).
    fn slice() -> impl Strategy<Value = Batch> {
        let capacity = prop::option::weighted(0.15, (1u64..(1 << 30), 0..3u64));
        let ops = prop::collection::vec(op(), 0..8);
        (
            id(),
            1..3u64,
            0..6u64,
            any::<bool>(),
            any::<bool>(),
            capacity,
            ops,
        )
            .prop_map(|(id, incarnation, seq, l1, shared, capacity, mut ops)| {
                let tier = if l1 { Tier::L1 } else { Tier::L2 };
                let shared = shared && !l1;
                let mut stored = std::collections::HashSet::new();
                ops.retain(|op| !matches!(op, Op::Store(k, _) if !stored.insert(k.clone())));
                let ops = if capacity.is_some() { Vec::new() } else { ops };
                Batch {
                    incarnation,
                    shared,
                    capacity,
                    ..batch(&id, seq, tier, ops)
                }
            })
    }

    /// The operator state as a whole: a scratch model's quotas, default quota and pins.
    fn metadata() -> impl Strategy<Value = Metadata> {
        let quotas = prop::collection::vec((salt(), 0..4u8), 0..3);
        let default = prop::option::of(0..4u8);
        (quotas, default, keys()).prop_map(|(quotas, default, pins)| {
            let mut m = Model::new(config());
            for (salt, kb) in quotas {
                let _ = m.set_quota(&salt, f64::from(kb) * 1e-6);
            }
            let _ = m.set_default_limit(default.map(|kb| f64::from(kb) * 1e-6));
            let _ = m.pins.pin(&pins, 10);
            m.capture_metadata(0.0)
        })
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            3 => (id(), 0..2u16).prop_map(|(id, p)| Change::Register {
                registration: reg(&id, 9000 + p),
            }),
            2 => id().prop_map(|instance_id| Change::Heartbeat { instance_id }),
            1 => id().prop_map(|instance_id| Change::Deregister { instance_id }),
            1 => prop::collection::vec(id(), 0..3)
                .prop_map(|instance_ids| Change::TimedOut { instance_ids }),
            1 => prop::collection::vec(id(), 0..3)
                .prop_map(|instance_ids| Change::Forget { instance_ids }),
            2 => prop::collection::vec(slice(), 1..3).prop_map(|batches| Change::Admit {
                batches: batches.iter().map(Admitted::of).collect(),
            }),
            6 => slice().prop_map(|batch| Change::Apply { batch }),
            1 => prop::option::of(0..4u8).prop_map(|kb| Change::DefaultQuota {
                limit_gb: kb.map(|kb| f64::from(kb) * 1e-6),
            }),
            1 => (salt(), 0..4u8).prop_map(|(cache_salt, kb)| Change::SetQuota {
                cache_salt,
                limit_gb: f64::from(kb) * 1e-6,
            }),
            1 => salt().prop_map(|cache_salt| Change::RemoveQuota { cache_salt }),
            1 => keys().prop_map(|keys| Change::Pin { keys }),
            1 => keys().prop_map(|keys| Change::Unpin { keys }),
            1 => keys().prop_map(|keys| Change::DropPins { keys }),
            1 => (id(), any::<bool>(), prop::collection::vec((k(), 1..100u64), 0..5)).prop_map(
                |(instance_id, shared, entries)| Change::Seed {
                    instance_id,
                    backend: "fs".into(),
                    shared,
                    entries,
                }
            ),
            1 => (0..30u8).prop_map(|s| Change::Expire {
                cutoff: laws::T0 + f64::from(s),
            }),
            1 => (any::<bool>(), metadata()).prop_map(|(replace, doc)| Change::Metadata {
                replace,
                doc,
            }),
        ]
    }

    /// Every key the logs here name (the generated ones and the curated log's).
    fn universe() -> Vec<EncodedKey> {
        let mut all: Vec<EncodedKey> = ["s", "t", "u"]
            .into_iter()
            .flat_map(|salt| (0..32).map(move |n| key(n, salt)))
            .collect();
        all.push(key(100, "s"));
        all
    }

    impl Subject for CoordinatorState {
        fn empty() -> Self {
            CoordinatorState::new(Model::new(config()))
        }

        fn changes() -> BoxedStrategy<Vec<Change>> {
            prop::collection::vec(change(), 0..16).boxed()
        }

        /// The dump, with the key directory compared key by key (its lookup of every key
        /// the logs name, and its stats) rather than as its dump, whose name tables keep
        /// names no key uses any more (a restore drops them) and whose listing order depends
        /// on how a batch of stores was cut: the directory lists each applied slice of stores
        /// in reverse, so a follower that applied a change cut to fit lists those keys in
        /// another order than its leader (a known difference of `GET /directory/keys` after a
        /// failover past a record larger than NATS takes; the content is the same).
        fn compared(&self) -> impl PartialEq + std::fmt::Debug + use<> {
            let mut dump = Replicated::dump(self);
            dump.model.directory = Default::default();
            let directory = &self.model.directory;
            (dump, directory.lookup(&universe()), directory.stats())
        }
    }

    #[test]
    fn the_state_obeys_the_replication_laws() {
        laws::check::<CoordinatorState>(64);
    }
}
