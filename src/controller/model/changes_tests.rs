//! The change log: a follower that applies a leader's records holds the leader's fleet; gaps
//! and a deposed leader's records are seen, not guessed around.

use super::*;
use crate::cluster::{
    apply_record, decode_snapshot, encode_snapshot, Applied, LogCursor, Position,
};
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

    fn at(p: Position) -> Self {
        Follower {
            cursor: LogCursor::at(p),
        }
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

#[test]
fn a_new_leader_continues_the_state_and_fences_the_old_one() {
    let mut first = Leader::new(fleet(), 3, true);
    first.request(register("a", 5000), 2.0);
    first.pull(vec![batch("a", 1..10, &[], 0)], 3.0);

    // The standby follows the first leader, then takes over with a later revision.
    let mut standby = fleet();
    let mut follower = Follower::new();
    follow(&mut follower, &mut standby, &first.log);
    let mut second = Leader::new(standby, 9, false);
    second.pull(vec![batch("a", 10..12, &[1], 9)], 20.0);

    // A paused first leader writes after losing the lease: appended after the takeover.
    let mut log = first.log.clone();
    log.extend(second.log.iter().take(1).cloned());
    first.pull(vec![batch("a", 500..600, &[], 9)], 21.0);
    log.push(first.log.last().unwrap().clone());
    log.extend(second.log.iter().skip(1).cloned());

    let mut other = fleet();
    let mut f2 = Follower::new();
    let applied = follow(&mut f2, &mut other, &log);
    assert_eq!(applied.iter().filter(|a| **a == Applied::Fenced).count(), 1);
    assert_eq!(f2.cursor().fenced(), 1);
    assert!(
        f2.cursor().in_sync(),
        "a takeover that carries the state on is no gap"
    );
    assert_eq!(view(&other), view(&second.fleet));
    assert_eq!(other.index().key_count(), 9 + 2 - 1);
    // The takeover marked the worker seen then: no liveness probe for the failover's silence.
    assert!(other.stale_workers(20.0 + 29.0, 30.0).is_empty());
}

#[test]
fn gaps_and_a_late_start_are_reported_not_in_sync() {
    let mut leader = Leader::new(fleet(), 1, true);
    leader.request(register("a", 5000), 2.0);
    leader.pull(vec![batch("a", 1..10, &[], 0)], 3.0);
    leader.pull(vec![batch("a", 10..20, &[], 9)], 3.0);

    // A record missing in the middle.
    let mut f = Follower::new();
    let mut standby = fleet();
    let mut log = leader.log.clone();
    log.remove(2);
    let applied = follow(&mut f, &mut standby, &log);
    assert_eq!(applied[2], Applied::AfterGap);
    assert!(!f.cursor().in_sync());
    assert_eq!(f.cursor().gaps(), 1);
    // Duplicates are ignored.
    assert_eq!(
        f.apply(&mut standby, &leader.log[3]),
        Applied::Stale,
        "a duplicate changes nothing"
    );

    // Joining after the log's start (the stream dropped its oldest records): not in sync.
    let mut late = Follower::new();
    let mut fl = fleet();
    follow(&mut late, &mut fl, &leader.log[1..]);
    assert!(!late.cursor().in_sync());
    // Nor from a non-fresh takeover: the state before it was never seen.
    let second = Leader::new(fleet(), 2, false);
    let mut f3 = Follower::new();
    follow(&mut f3, &mut fleet(), &second.log);
    assert!(!f3.cursor().in_sync());
}

#[test]
fn records_round_trip_and_garbage_is_an_error() {
    let r = Record {
        epoch: u64::MAX,
        seq: 1,
        at_ms: 2,
        now: 3.5,
        change: Change::Pull {
            frames: vec![ByteBuf::from(vec![0xc1, 0xff])],
        },
    };
    assert_eq!(Record::decode(&r.encode()).unwrap(), r);
    assert!(Record::decode(b"\xc1nope").is_err());
    // A frame that is not a message changes nothing, and the rest of the record applies.
    let mut r = r;
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

#[test]
fn a_snapshot_restores_the_fleet_and_the_log_goes_on_from_it() {
    let mut leader = Leader::new(fleet(), 3, true);
    leader.request(register("a", 5000), 2.0);
    leader.request(register("b", 5002), 2.5);
    leader.pull(vec![batch("a", 1..200, &[7], 0)], 3.0);
    leader.pull(vec![batch("b", 2..50, &[], 0)], 3.0);
    // A worker registered by heartbeat: its downlink generation and order number count too.
    leader.request(heartbeat("c", 5004), 4.0);
    let cut = leader.log.len();
    leader.pull(vec![batch("a", 200..260, &[8, 9], 200)], 5.0);
    leader.request(heartbeat("a", 5000), 6.0);
    leader.request(register("d", 5006), 6.0);

    // A follower up to the cut, snapshotted; a new follower restores it and reads the rest.
    let mut first = fleet();
    let mut f1 = Follower::new();
    follow(&mut f1, &mut first, &leader.log[..cut]);
    f1.cursor.note_stream_seq(cut as u64);
    let bytes = encode_snapshot(&f1.cursor().position(), &Replicated::dump(&first));
    let (position, dump): (Position, ControllerDump) = decode_snapshot(&bytes).expect("decodes");
    assert_eq!(dump, first.dump(), "dump, encode, decode");
    let mut restored = Replicated::restore(&fleet(), dump).expect("fits");
    assert_eq!(view(&restored), view(&first));
    assert_eq!(
        restored.dump(),
        first.dump(),
        "restore gives back the same dump"
    );
    let mut f2 = Follower::at(position);
    assert_eq!(position.stream_seq, cut as u64);
    let applied = follow(&mut f2, &mut restored, &leader.log[cut..]);
    assert!(
        applied.iter().all(|a| *a == Applied::InOrder),
        "{applied:?}"
    );
    assert!(f2.cursor().in_sync());
    assert_eq!(view(&restored), view(&leader.fleet));
    assert_eq!(restored.dump(), leader.fleet.dump());
}
