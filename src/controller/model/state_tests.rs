//! Unit tests of the [`ControllerState`] model: no runtime, no sockets, no clock — `now` is a
//! number.

use super::*;
use crate::controller::model::index::ChunkIndexConfig;
use crate::protocol::ChunkHash;
use crate::protocol::{
    DeRegisterMsg, FullSyncStartMsg, HeartbeatMsg, KVAdmitMsg, KVEvictMsg, RegisterMsg,
};

fn fleet() -> ControllerState {
    ControllerState::new(
        ChunkIndex::with_config(ChunkIndexConfig::default()),
        CommandLog::default(),
    )
}

fn ctx(now: f64) -> RequestContext {
    RequestContext {
        now,
        heartbeat_url: Some("127.0.0.1:8082".into()),
    }
}

fn register(inst: &str, wid: i64, port: i64) -> Msg {
    Msg::RegisterMsg(RegisterMsg {
        instance_id: inst.into(),
        worker_id: wid,
        ip: "127.0.0.1".into(),
        port,
        peer_init_url: None,
        distributed_url: None,
    })
}

fn deregister(inst: &str, wid: i64) -> Msg {
    Msg::DeRegisterMsg(DeRegisterMsg {
        instance_id: inst.into(),
        worker_id: wid,
        ip: "127.0.0.1".into(),
        port: 1,
    })
}

fn heartbeat(inst: &str, wid: i64, port: i64) -> Msg {
    Msg::HeartbeatMsg(HeartbeatMsg {
        instance_id: inst.into(),
        worker_id: wid,
        ip: "127.0.0.1".into(),
        port,
        peer_init_url: None,
        distributed_url: None,
    })
}

fn k(inst: &str, wid: i64) -> WorkerKey {
    (inst.to_owned(), wid)
}

/// The downlink effects only (reports dropped).
fn links(fx: Vec<Effect>) -> Vec<Effect> {
    fx.into_iter()
        .filter(|e| !matches!(e, Effect::Report(_)))
        .collect()
}

/// A stand-in for the driver's live tasks: key -> generation, changed by effects exactly as
/// the driver changes its map.
#[derive(Default)]
struct Live(HashMap<WorkerKey, u64>);

impl Live {
    fn perform(&mut self, fx: &[Effect]) {
        for e in fx {
            match e {
                Effect::OpenDownlink {
                    key, generation, ..
                } => {
                    self.0.insert(key.clone(), *generation);
                }
                Effect::CloseDownlink { key, generation } => {
                    if self.0.get(key) == Some(generation) {
                        self.0.remove(key);
                    }
                }
                Effect::Report(_) => {}
            }
        }
    }

    /// Every registered worker has exactly one live downlink, of the model's generation, and
    /// nothing else lives.
    fn agrees_with(&self, fleet: &ControllerState) {
        fleet.check_invariants().expect("model invariant");
        let model: HashMap<WorkerKey, u64> = fleet
            .downlinks()
            .map(|(k, d)| (k.clone(), d.generation))
            .collect();
        assert_eq!(self.0, model, "live downlinks == the model's registry");
    }
}

#[test]
fn register_opens_one_downlink_and_reregistering_keeps_it() {
    let mut f = fleet();
    let (reply, fx) = f.on_request(RouterKind::Reply, register("a", 0, 9000), &ctx(10.0));
    let Msg::RegisterRetMsg(r) = reply else {
        panic!("{reply:?}")
    };
    assert_eq!(
        r.extra_config.get("heartbeat_url").map(String::as_str),
        Some("127.0.0.1:8082")
    );
    assert_eq!(
        links(fx),
        vec![Effect::OpenDownlink {
            key: k("a", 0),
            generation: 1,
            endpoint: "127.0.0.1:9000".into()
        }]
    );
    assert_eq!(
        f.index().worker("a", 0).map(|w| w.registration_time),
        Some(10.0)
    );
    // Same endpoint: the downlink stays.
    let (_, fx) = f.on_request(RouterKind::Reply, register("a", 0, 9000), &ctx(11.0));
    assert!(links(fx).is_empty());
    // New endpoint: a new generation replaces it.
    let (_, fx) = f.on_request(RouterKind::Reply, register("a", 0, 9001), &ctx(12.0));
    assert_eq!(
        links(fx),
        vec![Effect::OpenDownlink {
            key: k("a", 0),
            generation: 2,
            endpoint: "127.0.0.1:9001".into()
        }]
    );
    assert_eq!(f.downlink("a", 0).map(|d| d.generation), Some(2));
}

/// The race of issue 9, at model level: DeRegister (PULL) and Register (ROUTER) of a
/// restarting worker. Each message is one atomic model step; even if the driver performed a
/// step's effects late (the close of the old registration after the open of the new one), the
/// close names its generation and cannot take the new downlink down.
#[test]
fn deregister_then_register_leaves_exactly_the_new_downlink() {
    let mut f = fleet();
    let mut live = Live::default();
    let (_, fx) = f.on_request(RouterKind::Reply, register("a", 0, 9000), &ctx(1.0));
    live.perform(&fx);
    let (res, close) = f.on_push(deregister("a", 0), 2.0);
    assert_eq!(res, Ok(()));
    let (_, open) = f.on_request(RouterKind::Reply, register("a", 0, 9000), &ctx(2.0));
    // The bad order: open of the new registration, then the close of the old one.
    live.perform(&open);
    live.perform(&close);
    live.agrees_with(&f);
    assert_eq!(live.0.get(&k("a", 0)), Some(&2));

    // And the opposite order (register first, then a deregister that arrives late) removes
    // both the worker and its downlink: nothing leaks.
    let (_, fx) = f.on_push(deregister("a", 0), 3.0);
    live.perform(&fx);
    live.agrees_with(&f);
    assert!(live.0.is_empty() && f.index().worker_count() == 0);
}

/// Every interleaving of register / deregister / heartbeat over a few workers keeps one live
/// downlink per registered worker, with effects performed in order or with closes delayed.
#[test]
fn random_interleavings_keep_model_and_live_downlinks_in_agreement() {
    let mut f = fleet();
    let mut live = Live::default();
    let mut delayed: Vec<Effect> = Vec::new();
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    for step in 0..5_000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let wid = (seed % 3) as i64;
        let port = 9000 + ((seed >> 8) % 2) as i64;
        let now = f64::from(step);
        let fx = match (seed >> 16) % 3 {
            0 => {
                f.on_request(RouterKind::Reply, register("i", wid, port), &ctx(now))
                    .1
            }
            1 => f.on_push(deregister("i", wid), now).1,
            _ => {
                f.on_request(RouterKind::Heartbeat, heartbeat("i", wid, port), &ctx(now))
                    .1
            }
        };
        // Closes are sometimes performed one step late, after the next step's opens.
        let (closes, rest): (Vec<Effect>, Vec<Effect>) = fx
            .into_iter()
            .partition(|e| matches!(e, Effect::CloseDownlink { .. }));
        live.perform(&rest);
        live.perform(&std::mem::take(&mut delayed));
        if (seed >> 24).is_multiple_of(2) {
            delayed = closes;
        } else {
            live.perform(&closes);
        }
        f.check_invariants().expect("model invariant");
    }
    live.perform(&delayed);
    live.agrees_with(&f);
}

#[test]
fn heartbeat_of_an_unknown_worker_registers_it_with_a_downlink() {
    let mut f = fleet();
    let (reply, fx) = f.on_request(RouterKind::Heartbeat, heartbeat("a", 3, 7000), &ctx(5.0));
    let Msg::HeartbeatRetMsg(r) = reply else {
        panic!("{reply:?}")
    };
    assert_eq!(r.commands.len(), 1);
    assert_eq!(
        r.commands[0],
        HeartbeatCommand::full_sync(REASON_WORKER_RE_REGISTERED)
    );
    assert_eq!(links(fx).len(), 1);
    assert!(f.downlink("a", 3).is_some());
    // The heartbeat socket takes heartbeats only.
    let (reply, fx) = f.on_request(RouterKind::Heartbeat, register("a", 4, 1), &ctx(5.0));
    assert!(matches!(reply, Msg::ErrorMsg(_)) && fx.is_empty());
}

#[test]
fn probe_removes_only_the_silent_registration_it_probed() {
    let mut f = fleet();
    f.on_request(RouterKind::Reply, register("a", 0, 9000), &ctx(0.0));
    f.on_request(RouterKind::Reply, register("a", 1, 9001), &ctx(0.0));
    let targets = f.stale_workers(100.0, 60.0);
    assert_eq!(targets.len(), 2);
    assert_eq!(targets[0].generation, 1);

    // a/0 re-registered on a new endpoint after the sweep began: its old probe is void.
    f.on_request(RouterKind::Reply, register("a", 0, 9100), &ctx(90.0));
    let (removed, fx) = f.probe_failed(&targets[0], 100.0, 200.0);
    assert!(!removed && fx.is_empty());
    // a/1 spoke meanwhile: still registered.
    f.on_request(RouterKind::Heartbeat, heartbeat("a", 1, 9001), &ctx(95.0));
    let (removed, _) = f.probe_failed(&targets[1], 100.0, 60.0);
    assert!(!removed);
    // Silent and the same registration: removed, and exactly its downlink closed.
    let (removed, fx) = f.probe_failed(&targets[1], 200.0, 60.0);
    assert!(removed);
    assert_eq!(
        links(fx),
        vec![Effect::CloseDownlink {
            key: k("a", 1),
            generation: 2
        }]
    );
    f.check_invariants().expect("invariant");
    assert_eq!(f.index().worker_count(), 1);

    // A probe answered keeps a worker: it counts as seen.
    let t = f.stale_workers(1_000.0, 60.0);
    f.probe_answered(&t[0], 1_000.0);
    assert!(f.stale_workers(1_000.0, 60.0).is_empty());
}

#[test]
fn full_sync_expires_on_the_model_clock() {
    let mut f = fleet();
    f.on_request(RouterKind::Reply, register("a", 0, 9000), &ctx(0.0));
    let start = Msg::FullSyncStartMsg(FullSyncStartMsg {
        instance_id: "a".into(),
        worker_id: 0,
        location: "cpu".into(),
        sync_id: "s1".into(),
        total_keys: 10,
        batch_count: 2,
    });
    let (reply, _) = f.on_request(RouterKind::Reply, start, &ctx(1.0));
    assert!(
        matches!(reply, Msg::FullSyncStartRetMsg(ref r) if r.accepted),
        "{reply:?}"
    );
    assert!(
        f.expire_syncs(100.0, 300.0).is_empty(),
        "99 s of silence < 300 s"
    );
    let fx = f.expire_syncs(302.0, 300.0);
    assert_eq!(
        fx,
        vec![Effect::Report(ModelEvent::SyncExpired { key: k("a", 0) })]
    );
    // The next heartbeat asks the worker to retry.
    let (reply, _) = f.on_request(RouterKind::Heartbeat, heartbeat("a", 0, 9000), &ctx(303.0));
    assert!(
        matches!(reply, Msg::HeartbeatRetMsg(ref r) if r.commands.len() == 1),
        "{reply:?}"
    );
}

#[test]
fn push_messages_report_their_drop_reason() {
    let mut f = fleet();
    let (res, _) = f.on_push(heartbeat("a", 0, 70_000), 0.0);
    assert_eq!(
        res,
        Err(FrameDropReason::Refused),
        "a port out of range is refused"
    );
    let lookup = Msg::BatchedP2PLookupMsg(crate::protocol::BatchedP2PLookupMsg {
        hashes: Vec::new(),
        instance_id: "a".into(),
        worker_id: 0,
    });
    let (res, _) = f.on_push(lookup, 0.0);
    assert_eq!(res, Err(FrameDropReason::WrongSocket));
    assert_eq!(FrameDropReason::WrongSocket.label(), "wrong_socket");
    assert_eq!(FrameDropReason::Refused.label(), "refused");
    assert_eq!(FrameDropReason::StaleSync.label(), "stale_sync");
    assert_eq!(FrameDropReason::TooManyOps.label(), "too_many_ops");
    let (res, fx) = f.on_push(deregister("ghost", 0), 0.0);
    assert_eq!(res, Ok(()));
    assert_eq!(
        fx,
        vec![Effect::Report(ModelEvent::UnknownDeregistration {
            key: k("ghost", 0)
        })]
    );
    f.on_request(RouterKind::Reply, register("a", 0, 9000), &ctx(0.0));
    let admit = Msg::KVAdmitMsg(KVAdmitMsg {
        instance_id: "a".into(),
        worker_id: 0,
        key: ChunkHash::from_i64(7),
        location: "cpu".into(),
        seq_num: 0,
    });
    let (res, _) = f.on_push(admit, 1.0);
    assert_eq!(res, Ok(()));
    assert_eq!(f.index().key_count(), 1);
    // The legacy evict removes what the legacy admit added.
    let evict = Msg::KVEvictMsg(KVEvictMsg {
        instance_id: "a".into(),
        worker_id: 0,
        key: ChunkHash::from_i64(7),
        location: "cpu".into(),
        seq_num: 1,
    });
    let (res, _) = f.on_push(evict, 2.0);
    assert_eq!(res, Ok(()));
    assert_eq!(f.index().key_count(), 0);
}

#[test]
fn p2p_lookup_of_a_decoded_request_answers_as_the_message_does() {
    let mut f = fleet();
    let mut holder = register("holder", 0, 7);
    if let Msg::RegisterMsg(m) = &mut holder {
        m.peer_init_url = Some("127.0.0.1:9".into());
    }
    f.on_request(RouterKind::Reply, holder, &ctx(1.0));
    let ops: Vec<KVOpEvent> = (0..3)
        .map(|i| KVOpEvent {
            op_type: OpType::Admit,
            key: ChunkHash::from_u64(i),
            seq_num: i as i64,
        })
        .collect();
    f.apply_batch("holder", 0, "LocalCPUBackend", &ops, 1.0);
    for hashes in [
        vec![ChunkHash::from_u64(0), ChunkHash::from_u64(1)],
        vec![ChunkHash::from_u64(5)],
        vec![],
    ] {
        let msg = crate::protocol::BatchedP2PLookupMsg {
            hashes: hashes.clone(),
            instance_id: "asker".into(),
            worker_id: 0,
        };
        let (reply, fx) = f.on_read_request(RouterKind::Reply, Msg::BatchedP2PLookupMsg(msg));
        let (direct, event) = f.p2p_lookup(&hashes, "asker", 0);
        assert_eq!(format!("{direct:?}"), format!("{reply:?}"));
        assert_eq!(format!("{:?}", [Effect::Report(event)]), format!("{fx:?}"));
    }
    let (hit, _) = f.p2p_lookup(&[ChunkHash::from_u64(0)], "asker", 0);
    assert!(
        format!("{hit:?}").contains("holder"),
        "the holder is found: {hit:?}"
    );
}

/// The frames a real LMCache 0.3.9 worker pushes, encoded by 0.3.9's own classes
/// (`lmcache/v1/cache_controller/message.py` of the lmcache-0.3.9 cp311 wheel on PyPI, with
/// `msgspec.msgpack.encode`): it pushes its registration and heartbeats (no reply, the peer
/// address named `distributed_url`), then single admits and evicts without `seq_num`.
const LMCACHE_039: [(&str, &str); 5] = [
    ("register", "86a474797065ab52656769737465724d7367ab696e7374616e63655f6964a36f6c64a9776f726b65725f696400a26970a93132372e302e302e31a4706f7274cd1fa4af64697374726962757465645f75726cae3132372e302e302e313a38323030"),
    ("heartbeat", "86a474797065ac4865617274626561744d7367ab696e7374616e63655f6964a36f6c64a9776f726b65725f696400a26970a93132372e302e302e31a4706f7274cd1fa4af64697374726962757465645f75726cae3132372e302e302e313a38323030"),
    ("admit", "85a474797065aa4b5641646d69744d7367ab696e7374616e63655f6964a36f6c64a9776f726b65725f696400a36b6579cd3039a86c6f636174696f6eaf4c6f63616c4350554261636b656e64"),
    ("evict", "85a474797065aa4b5645766963744d7367ab696e7374616e63655f6964a36f6c64a9776f726b65725f696400a36b6579cd3039a86c6f636174696f6eaf4c6f63616c4350554261636b656e64"),
    ("deregister", "85a474797065ad446552656769737465724d7367ab696e7374616e63655f6964a36f6c64a9776f726b65725f696400a26970a93132372e302e302e31a4706f7274cd1fa4"),
];

/// The frame `name` of a recorded generation's `frames`, decoded.
fn recorded(frames: &[(&str, &str)], name: &str) -> Msg {
    let hex = frames.iter().find(|(n, _)| *n == name).expect("frame").1;
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect();
    crate::protocol::decode(&bytes).unwrap_or_else(|e| panic!("recorded frame {name}: {e}"))
}

fn frame_039(name: &str) -> Msg {
    recorded(&LMCACHE_039, name)
}

#[test]
fn a_lmcache_039_worker_registers_heartbeats_admits_and_leaves_over_push() {
    let mut f = fleet();
    let (res, fx) = f.on_push(frame_039("register"), 1.0);
    assert_eq!(res, Ok(()));
    assert!(
        links(fx)
            .iter()
            .any(|e| matches!(e, Effect::OpenDownlink { .. })),
        "its command socket is dialled"
    );
    let w = f.index().worker("old", 0).expect("registered");
    assert_eq!(
        w.peer_init_url.as_deref(),
        Some("127.0.0.1:8200"),
        "distributed_url"
    );
    assert_eq!(w.wire, Wire::Pushed, "told by distributed_url on PULL");
    assert_eq!(f.on_push(frame_039("heartbeat"), 2.0).0, Ok(()));
    assert_eq!(f.on_push(frame_039("admit"), 3.0).0, Ok(()));
    assert_eq!(f.on_push(frame_039("admit"), 3.5).0, Ok(()));
    assert_eq!(f.index().key_count(), 1);
    assert_eq!(
        f.index().seq_discontinuities(),
        0,
        "0.3.9 numbers no op: nothing is a gap"
    );
    let w = f.index().worker("old", 0).expect("registered");
    assert_eq!(w.locations[0].last_seq, None);
    assert_eq!(f.on_push(frame_039("evict"), 4.0).0, Ok(()));
    assert_eq!(f.index().key_count(), 0);
    assert_eq!(f.on_push(frame_039("deregister"), 5.0).0, Ok(()));
    assert!(f.index().worker("old", 0).is_none());
}

/// The frames of LMCache 0.3.11 (the `peer_init_url` generation that still pushes), encoded by
/// 0.3.11's own classes as above: registration, a heartbeat without a peer, a batch of two.
const LMCACHE_0311: [(&str, &str); 3] = [
    ("register", "86a474797065ab52656769737465724d7367ab696e7374616e63655f6964a36d6964a9776f726b65725f696400a26970a93132372e302e302e31a4706f7274cd1fa4ad706565725f696e69745f75726cae3132372e302e302e313a38323030"),
    ("heartbeat", "86a474797065ac4865617274626561744d7367ab696e7374616e63655f6964a36d6964a9776f726b65725f696400a26970a93132372e302e302e31a4706f7274cd1fa4ad706565725f696e69745f75726cc0"),
    ("batch", "85a474797065b5426174636865644b564f7065726174696f6e4d7367ab696e7374616e63655f6964a36d6964a9776f726b65725f696400a86c6f636174696f6eaf4c6f63616c4350554261636b656e64aa6f7065726174696f6e739283a76f705f74797065a561646d6974a36b6579cd3039a77365715f6e756d0083a76f705f74797065a561646d6974a36b6579cd303aa77365715f6e756d01"),
];

fn frame_0311(name: &str) -> Msg {
    recorded(&LMCACHE_0311, name)
}

#[test]
fn each_generation_is_told_by_how_it_registers_and_only_numbered_ops_are_checked() {
    let mut f = fleet();
    assert_eq!(f.on_push(frame_0311("register"), 1.0).0, Ok(()));
    let w = f.index().worker("mid", 0).expect("registered");
    assert_eq!(w.wire, Wire::PushedBatched, "peer_init_url on PULL");
    assert_eq!(w.peer_init_url.as_deref(), Some("127.0.0.1:8200"));
    let Msg::BatchedKVOperationMsg(b) = frame_0311("batch") else {
        panic!("a batch")
    };
    f.apply_batch(&b.instance_id, b.worker_id, &b.location, &b.operations, 2.0);
    let w = f.index().worker("mid", 0).expect("registered");
    assert_eq!(w.locations[0].last_seq, Some(1), "0.3.11 numbers its ops");
    assert_eq!(f.on_push(frame_0311("heartbeat"), 3.0).0, Ok(()));
    assert_eq!(
        f.index().worker("mid", 0).expect("known").wire,
        Wire::PushedBatched
    );

    // The same worker restarted as 0.3.12+: its request registration says so.
    let (reply, _) = f.on_request(RouterKind::Reply, register("mid", 0, 8100), &ctx(4.0));
    assert!(matches!(reply, Msg::RegisterRetMsg(_)), "{reply:?}");
    assert_eq!(
        f.index().worker("mid", 0).expect("known").wire,
        Wire::Requests
    );
}

/// LMCache 0.3.1–0.3.2 named chunks by strings (`KVAdmitMsg.key: str`; this frame was encoded
/// by 0.3.1's own class): kvplane does not speak that wire, and says so per frame without
/// losing anything around it.
#[test]
fn a_string_keyed_admit_of_lmcache_031_is_a_clear_error_and_loses_nothing() {
    let hex = "85a474797065aa4b5641646d69744d7367ab696e7374616e63655f6964a56f6c646572a9776f726b65725f696400a36b6579a461316232a86c6f636174696f6eaf4c6f63616c4350554261636b656e64";
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect();
    let err = crate::protocol::decode(&bytes).expect_err("a string key is refused");
    assert_eq!(err.reason(), "bad_field");
    let text = err.to_string();
    assert!(text.starts_with("invalid KVAdmitMsg"), "{text}");
    let mut f = fleet();
    assert_eq!(f.on_push(frame_039("register"), 1.0).0, Ok(()));
    assert_eq!(f.on_push(frame_039("admit"), 2.0).0, Ok(()));
    assert_eq!(f.index().key_count(), 1, "the frames around it still apply");
}

/// Every cut of every 0.3.9 and 0.3.11 frame is a decode error (never a panic, never a
/// partial message applied).
#[test]
fn every_truncation_of_an_older_generation_frame_is_an_error() {
    for (name, hex) in LMCACHE_039.iter().chain(LMCACHE_0311.iter()) {
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
            .collect();
        for cut in 0..bytes.len() {
            let err = crate::protocol::decode(&bytes[..cut]);
            assert!(err.is_err(), "{name} cut at {cut} decoded: {err:?}");
        }
    }
}
