//! The change log: the fleet obeys the replication laws (`crate::cluster::laws`) over logs of
//! every kind of change; the leader's own path (a request, a PULL multipart, the liveness
//! sweep) logs the change that replays it; a takeover counts every worker as seen, a resync
//! record asks every worker for one full sync, and a frame that is not a message changes
//! nothing.

use super::*;
use crate::cluster::{apply_record, Applied, LogCursor};
use crate::controller::model::command_log::CommandLog;
use crate::controller::model::index::{ChunkIndex, ChunkIndexConfig};
use crate::protocol::{
    encode, BatchedKVOperationMsg, DeRegisterMsg, FullSyncEndMsg, HeartbeatMsg, Msg, OpType,
    RegisterMsg,
};

/// A record of the controller's log.
type Record = crate::cluster::Record<Change>;

fn fleet() -> ControllerState {
    ControllerState::new(
        ChunkIndex::with_config(ChunkIndexConfig::default()),
        CommandLog::default(),
    )
}

fn register(inst: &str, port: i64) -> Msg {
    Msg::RegisterMsg(RegisterMsg {
        instance_id: inst.into(),
        worker_id: 0,
        ip: "127.0.0.1".into(),
        port,
        peer_init_url: Some(format!("127.0.0.1:{}", port + 1)),
        distributed_url: None,
    })
}

fn heartbeat(inst: &str, port: i64) -> Msg {
    Msg::HeartbeatMsg(HeartbeatMsg {
        instance_id: inst.into(),
        worker_id: 0,
        ip: "127.0.0.1".into(),
        port,
        peer_init_url: None,
        distributed_url: None,
    })
}

fn batch(inst: &str, admits: std::ops::Range<u64>, evicts: &[u64], seq0: i64) -> Msg {
    let mut operations: Vec<KVOpEvent> = admits
        .map(|k| KVOpEvent {
            op_type: OpType::Admit,
            key: k.into(),
            seq_num: 0,
        })
        .collect();
    operations.extend(evicts.iter().map(|&k| KVOpEvent {
        op_type: OpType::Evict,
        key: k.into(),
        seq_num: 0,
    }));
    for (i, op) in operations.iter_mut().enumerate() {
        op.seq_num = seq0 + i64::try_from(i).unwrap();
    }
    Msg::BatchedKVOperationMsg(BatchedKVOperationMsg {
        instance_id: inst.into(),
        worker_id: 0,
        location: "LocalCPUBackend".into(),
        operations,
    })
}

/// A follower's place in the log, applying records as the replication core does.
#[derive(Default)]
struct Follower {
    cursor: LogCursor,
}

impl Follower {
    fn new() -> Self {
        Self::default()
    }

    fn cursor(&self) -> &LogCursor {
        &self.cursor
    }

    fn apply(&mut self, fleet: &mut ControllerState, r: &Record) -> Applied {
        let local = (std::time::Instant::now(), 0.0);
        apply_record(&mut self.cursor, fleet, r.clone(), local)
    }
}

/// A leader: applies each input to its fleet and logs it as the driver does.
struct Leader {
    fleet: ControllerState,
    epoch: u64,
    seq: u64,
    log: Vec<Record>,
}

impl Leader {
    fn new(fleet: ControllerState, epoch: u64, fresh: bool) -> Self {
        let mut l = Leader {
            fleet,
            epoch,
            seq: 0,
            log: Vec::new(),
        };
        l.fleet.touch_all(1.0);
        l.record(
            1.0,
            Change::Takeover {
                holder: format!("leader-{epoch}"),
                fresh,
            },
        );
        l
    }

    fn record(&mut self, now: f64, change: Change) {
        self.seq += 1;
        self.log.push(Record {
            epoch: self.epoch,
            seq: self.seq,
            at_ms: 1000 * self.seq,
            now,
            change,
        });
    }

    fn request(&mut self, msg: Msg, now: f64) {
        let frame = ByteBuf::from(encode(&msg));
        let ctx = RequestContext {
            now,
            heartbeat_url: None,
        };
        let _ = self.fleet.on_request(RouterKind::Reply, msg, &ctx);
        self.record(
            now,
            Change::Request {
                heartbeat: false,
                frame,
            },
        );
    }

    fn pull(&mut self, msgs: Vec<Msg>, now: f64) {
        let frames = msgs.iter().map(|m| ByteBuf::from(encode(m))).collect();
        for m in msgs {
            let _ = self.fleet.on_push(m, now);
        }
        self.record(now, Change::Pull { frames });
    }
}

/// What a router or an operator can see of a fleet.
fn view(f: &ControllerState) -> String {
    let ix = f.index();
    let mut downlinks: Vec<_> = f.downlinks().map(|(k, d)| (k.clone(), d.clone())).collect();
    downlinks.sort_by(|a, b| a.0.cmp(&b.0));
    let keys = ix.keys_of("a", 0, "LocalCPUBackend");
    let hit = ix
        .p2p_lookup(&[1u64.into(), 2u64.into(), 3u64.into()], "b", 0)
        .map(|h| (h.instance_id.to_owned(), h.num_hit_chunks));
    format!(
        "{:?} {} {:?} {:?} {:?} {}",
        ix.workers(),
        ix.key_count(),
        downlinks,
        keys,
        hit,
        ix.seq_discontinuities()
    )
}

fn follow(follower: &mut Follower, fleet: &mut ControllerState, log: &[Record]) -> Vec<Applied> {
    log.iter()
        .map(|r| {
            let bytes = r.encode();
            follower.apply(fleet, &Record::decode(&bytes).expect("decodes"))
        })
        .collect()
}

#[test]
fn a_follower_holds_the_leaders_fleet_through_every_kind_of_change() {
    let mut leader = Leader::new(fleet(), 7, true);
    leader.request(register("a", 5000), 2.0);
    leader.request(register("b", 5002), 2.0);
    leader.pull(vec![batch("a", 1..100, &[], 0)], 3.0);
    leader.pull(
        vec![
            batch("a", 100..120, &[5, 6], 99),
            batch("b", 50..60, &[], 0),
        ],
        3.5,
    );
    leader.request(heartbeat("a", 5000), 4.0);
    // An unknown worker heartbeats: registered by heartbeat (a full sync asked of it).
    leader.request(heartbeat("c", 5004), 4.0);
    leader.pull(
        vec![Msg::DeRegisterMsg(DeRegisterMsg {
            instance_id: "b".into(),
            worker_id: 0,
            ip: "127.0.0.1".into(),
            port: 5002,
        })],
        5.0,
    );
    // A sync end for a sync that never started: rejected alike on both sides.
    leader.pull(
        vec![Msg::FullSyncEndMsg(FullSyncEndMsg {
            instance_id: "a".into(),
            worker_id: 0,
            location: "LocalCPUBackend".into(),
            sync_id: "nope".into(),
            actual_total_keys: 3,
        })],
        5.0,
    );
    let generation = leader.fleet.downlink("a", 0).unwrap().generation;
    leader.fleet.probe_answered(
        &ProbeTarget {
            key: ("a".into(), 0),
            generation,
            endpoint: String::new(),
        },
        9.0,
    );
    leader.record(
        9.0,
        Change::ProbeAnswered {
            key: ("a".into(), 0),
            generation,
        },
    );
    let c_gen = leader.fleet.downlink("c", 0).unwrap().generation;
    let c = ProbeTarget {
        key: ("c".into(), 0),
        generation: c_gen,
        endpoint: String::new(),
    };
    assert!(leader.fleet.probe_failed(&c, 40.0, 30.0).0);
    leader.record(
        40.0,
        Change::ProbeFailed {
            key: ("c".into(), 0),
            generation: c_gen,
            timeout_s: 30.0,
        },
    );

    let mut standby = fleet();
    let mut follower = Follower::new();
    let applied = follow(&mut follower, &mut standby, &leader.log);
    assert_eq!(applied[0], Applied::NewEpoch);
    assert!(applied[1..].iter().all(|a| *a == Applied::InOrder));
    assert!(follower.cursor().in_sync());
    assert_eq!(follower.cursor().epoch_seq(), (Some(7), leader.seq));
    assert_eq!(view(&standby), view(&leader.fleet));
    assert_eq!(standby.index().key_count(), 99 - 2 + 20);
}

/// The takeover marks every worker seen at its `now`: no liveness probe for the silence of a
/// failover.
#[test]
fn a_takeover_counts_every_worker_as_seen() {
    let mut first = Leader::new(fleet(), 3, true);
    first.request(register("a", 5000), 2.0);
    first.pull(vec![batch("a", 1..10, &[], 0)], 3.0);
    let mut standby = fleet();
    follow(&mut Follower::new(), &mut standby, &first.log);
    assert_eq!(standby.stale_workers(40.0 + 29.0, 30.0).len(), 1);
    // The standby takes over at 40 s.
    let mut second = Leader {
        fleet: standby,
        epoch: 9,
        seq: 0,
        log: Vec::new(),
    };
    second.fleet.touch_all(40.0);
    let takeover = Change::Takeover {
        holder: "second".into(),
        fresh: false,
    };
    second.record(40.0, takeover);
    let mut other = fleet();
    let mut log = first.log.clone();
    log.extend(second.log.iter().cloned());
    follow(&mut Follower::new(), &mut other, &log);
    assert_eq!(view(&other), view(&second.fleet));
    assert!(other.stale_workers(40.0 + 29.0, 30.0).is_empty());
}

#[test]
fn garbage_is_no_record_and_a_frame_that_is_no_message_changes_nothing() {
    assert!(Record::decode(b"\xc1nope").is_err());
    // A frame that is not a message changes nothing, and the rest of the record applies.
    let mut r = Record {
        epoch: 1,
        seq: 1,
        at_ms: 2,
        now: 3.5,
        change: Change::ResyncAll,
    };
    r.change = Change::Pull {
        frames: vec![
            ByteBuf::from(vec![0xc1, 0xff]),
            ByteBuf::from(encode(&batch("a", 1..3, &[], 0))),
        ],
    };
    let mut leader = Leader::new(fleet(), 1, true);
    leader.request(register("a", 5000), 2.0);
    let mut f = Follower::new();
    let mut fl = fleet();
    follow(&mut f, &mut fl, &leader.log);
    r.epoch = 1;
    r.seq = leader.seq + 1;
    assert_eq!(f.apply(&mut fl, &r), Applied::InOrder);
    assert_eq!(fl.index().key_count(), 2);
}

#[test]
fn a_resync_record_asks_every_worker_for_one_full_sync_at_its_next_heartbeat() {
    let mut leader = Leader::new(fleet(), 5, false);
    leader.request(register("a", 5000), 2.0);
    leader.request(register("b", 5002), 2.0);
    leader.fleet.request_resync_all();
    leader.record(3.0, Change::ResyncAll);
    let mut standby = fleet();
    follow(&mut Follower::new(), &mut standby, &leader.log);
    for f in [&mut leader.fleet, &mut standby] {
        let ctx = RequestContext {
            now: 4.0,
            heartbeat_url: None,
        };
        let asked = |reply: Msg| match reply {
            Msg::HeartbeatRetMsg(r) => r.commands.len(),
            other => panic!("{other:?}"),
        };
        let (reply, _) = f.on_request(RouterKind::Reply, heartbeat("a", 5000), &ctx);
        assert_eq!(asked(reply), 1, "the first heartbeat carries the full sync");
        let (reply, _) = f.on_request(RouterKind::Reply, heartbeat("a", 5000), &ctx);
        assert_eq!(asked(reply), 0, "once");
    }
}

/// The fleet under the replication laws: logs of requests, PULL multiparts (batches, full
/// syncs, deregistrations, a frame that is no message) and the liveness sweep's outcomes, over
/// two instances of two workers each.
mod laws {
    use super::*;
    use crate::cluster::laws::{check, Subject};
    use crate::protocol::{FullSyncBatchMsg, FullSyncStartMsg};
    use proptest::prelude::*;

    const INSTANCES: [&str; 2] = ["a", "b"];
    const LOCATIONS: [&str; 2] = ["LocalCPUBackend", "LocalDiskBackend"];
    const KEYS: u64 = 16;

    fn worker() -> impl Strategy<Value = WorkerKey> + Clone {
        (0..INSTANCES.len(), 0..2i64).prop_map(|(i, w)| (INSTANCES[i].to_owned(), w))
    }

    fn location() -> impl Strategy<Value = String> + Clone {
        (0..LOCATIONS.len()).prop_map(|l| LOCATIONS[l].to_owned())
    }

    fn sync_id(n: u8) -> String {
        format!("sync-{n}")
    }

    fn frame(msg: &Msg) -> ByteBuf {
        ByteBuf::from(encode(msg))
    }

    /// A ROUTER request that may change the fleet.
    fn request() -> impl Strategy<Value = Msg> {
        prop_oneof![
            2 => (worker(), 0..2i64).prop_map(|((i, w), p)| Msg::RegisterMsg(RegisterMsg {
                instance_id: i,
                worker_id: w,
                ip: "127.0.0.1".into(),
                port: 5000 + 4 * w + p,
                peer_init_url: Some(format!("127.0.0.1:{}", 6000 + w)),
                distributed_url: None,
            })),
            2 => (worker(), 0..2i64).prop_map(|((i, w), p)| Msg::HeartbeatMsg(HeartbeatMsg {
                instance_id: i,
                worker_id: w,
                ip: "127.0.0.1".into(),
                port: 5000 + 4 * w + p,
                peer_init_url: None,
                distributed_url: None,
            })),
            1 => (worker(), location(), 0..2u8, 0..8i64, 1..3i64).prop_map(
                |((i, w), location, id, total_keys, batch_count)| {
                    Msg::FullSyncStartMsg(FullSyncStartMsg {
                        instance_id: i,
                        worker_id: w,
                        location,
                        sync_id: sync_id(id),
                        total_keys,
                        batch_count,
                    })
                }
            ),
        ]
    }

    /// One frame of a PULL multipart.
    fn pushed() -> impl Strategy<Value = ByteBuf> {
        let ops = prop::collection::vec((any::<bool>(), 0..KEYS), 0..8);
        prop_oneof![
            6 => (worker(), location(), ops, 0..24i64).prop_map(|((i, w), location, ops, seq0)| {
                let operations = ops
                    .into_iter()
                    .zip(seq0..)
                    .map(|((admit, k), seq_num)| KVOpEvent {
                        op_type: if admit { OpType::Admit } else { OpType::Evict },
                        key: k.into(),
                        seq_num,
                    })
                    .collect();
                frame(&Msg::BatchedKVOperationMsg(BatchedKVOperationMsg {
                    instance_id: i,
                    worker_id: w,
                    location,
                    operations,
                }))
            }),
            1 => worker().prop_map(|(i, w)| frame(&Msg::DeRegisterMsg(DeRegisterMsg {
                instance_id: i,
                worker_id: w,
                ip: "127.0.0.1".into(),
                port: 5000 + 4 * w,
            }))),
            2 => (worker(), location(), 0..2u8, -1..3i64, prop::collection::vec(0..KEYS, 0..6))
                .prop_map(|((i, w), location, id, batch_id, keys)| {
                    frame(&Msg::FullSyncBatchMsg(FullSyncBatchMsg {
                        instance_id: i,
                        worker_id: w,
                        location,
                        sync_id: sync_id(id),
                        batch_id,
                        keys: keys.into_iter().map(Into::into).collect(),
                    }))
                }),
            1 => (worker(), location(), 0..2u8, 0..8i64).prop_map(
                |((i, w), location, id, actual_total_keys)| {
                    frame(&Msg::FullSyncEndMsg(FullSyncEndMsg {
                        instance_id: i,
                        worker_id: w,
                        location,
                        sync_id: sync_id(id),
                        actual_total_keys,
                    }))
                }
            ),
            1 => Just(ByteBuf::from(vec![0xc1, 0xff])),
        ]
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            4 => prop::collection::vec(pushed(), 1..4).prop_map(|frames| Change::Pull { frames }),
            4 => (any::<bool>(), request()).prop_map(|(heartbeat, m)| Change::Request {
                heartbeat,
                frame: frame(&m),
            }),
            1 => (0..3u8).prop_map(|t| Change::ExpireSyncs {
                timeout_s: f64::from(t) * 10.0,
            }),
            1 => (worker(), 0..4u64)
                .prop_map(|(key, generation)| Change::ProbeAnswered { key, generation }),
            1 => (worker(), 0..4u64, 0..3u8).prop_map(|(key, generation, t)| {
                Change::ProbeFailed {
                    key,
                    generation,
                    timeout_s: f64::from(t) * 10.0,
                }
            }),
            1 => Just(Change::ResyncAll),
        ]
    }

    impl Subject for ControllerState {
        fn empty() -> Self {
            fleet()
        }

        fn changes() -> BoxedStrategy<Vec<Change>> {
            prop::collection::vec(change(), 0..16).boxed()
        }

        /// Not while a worker's full sync is in progress or completed: a dump drops it by
        /// design (`crate::index::snapshot`: a restored worker is idle, its sync's next
        /// batches are refused and it retries).
        fn whole_in_dump(&self) -> bool {
            let (syncing, completed, _) = self.index().sync_counts();
            syncing == 0 && completed == 0
        }
    }

    #[test]
    fn the_fleet_obeys_the_replication_laws() {
        check::<ControllerState>(64);
    }
}
