//! The controller's world as a plain value: the index, the downlink registry and the command
//! log, changed only through methods that take `now` and return the reply together with the
//! [`Effect`]s to perform.
//!
//! No I/O, no clock, no tokio here: the driver (`controller::driver`) owns a
//! [`ControllerState`] and the live downlink tasks under one lock and performs the effects;
//! tests drive a [`ControllerState`] directly, without a runtime. Because the registry of downlinks changes in the same call as
//! the index, a registered worker always has exactly one downlink of its current generation,
//! whatever order its messages arrive in.

use super::command_log::CommandLog;
use super::effects::{Effect, FrameDropReason, ModelEvent, RemovalReason, WorkerKey};
use super::index::{
    BatchOutcome, ChunkIndex, HeartbeatOutcome, IndexError, RegisterOutcome, SyncBatchOutcome,
    SyncEndOutcome, REASON_WORKER_RE_REGISTERED,
};
use crate::net::host_port;
use crate::protocol::{
    BatchedKVOperationMsg, BatchedP2PLookupRetMsg, ChunkHash, ErrorMsg, FullSyncStartRetMsg,
    FullSyncStatusRetMsg, HeartbeatCommand, HeartbeatRetMsg, KVOpEvent, Msg, OpType,
    RegisterRetMsg, Wire,
};
use std::collections::HashMap;

/// Which ROUTER socket a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouterKind {
    /// The reply socket: registration, lookups, full-sync start/status (and heartbeats).
    Reply,
    /// The dedicated heartbeat socket: heartbeats only, as in LMCache.
    Heartbeat,
}

impl RouterKind {
    /// Metric label of the socket.
    pub fn label(self) -> &'static str {
        match self {
            RouterKind::Reply => "reply",
            RouterKind::Heartbeat => "heartbeat",
        }
    }
}

/// A worker's downlink as the model knows it: which registration it belongs to and where it
/// dials. The task behind it belongs to the driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DownlinkRecord {
    /// Bumped at every (re)opening; a probe or a close only touches the generation it names.
    pub generation: u64,
    /// `host:port` the downlink dials.
    pub endpoint: String,
}

/// A silent worker the liveness sweep should probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeTarget {
    /// The worker.
    pub key: WorkerKey,
    /// The downlink generation probed: only this registration may be removed by the result.
    pub generation: u64,
    /// Where its downlink dials.
    pub endpoint: String,
}

/// What a request handler needs besides the message: the time, and the `heartbeat_url` to
/// hand a registering worker (computed by the driver: it may ask the kernel for a route).
#[derive(Clone, Debug, Default)]
pub struct RequestContext {
    /// Now, in Unix seconds.
    pub now: f64,
    /// The `heartbeat_url` for `RegisterRetMsg`, if there is a heartbeat socket.
    pub heartbeat_url: Option<String>,
}

/// The fleet as a value, for `--cluster` snapshots (see [`ChunkIndex::dump`] for what the index
/// keeps). The command log is soft state and not in it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ControllerDump {
    index: super::index::ChunkIndexDump,
    downlinks: Vec<(WorkerKey, u64, String)>,
    next_generation: u64,
}

impl ControllerDump {
    /// Memberships in the dumped index.
    pub fn memberships(&self) -> u64 {
        self.index.memberships()
    }
}

/// The controller's state: index, downlink registry, command log. See the module docs.
#[derive(Debug)]
pub struct ControllerState {
    index: ChunkIndex,
    downlinks: HashMap<WorkerKey, DownlinkRecord>,
    next_generation: u64,
    commands: CommandLog,
}

fn error(text: impl Into<String>) -> Msg {
    Msg::ErrorMsg(ErrorMsg { error: text.into() })
}

fn port_of(port: i64) -> Result<u16, String> {
    u16::try_from(port).map_err(|_| format!("port {port} is out of range"))
}

/// A legacy single-op message (`KVAdmitMsg`, `KVEvictMsg`) as the batch of one it stands
/// for; any other message as it is. LMCache 0.5.6 decodes and ignores them; applying them
/// is what their sender meant (Mooncake's JSON integration sends them).
fn as_batch(msg: Msg) -> Msg {
    let (op_type, instance_id, worker_id, location, key, seq_num) = match msg {
        Msg::KVAdmitMsg(m) => (
            OpType::Admit,
            m.instance_id,
            m.worker_id,
            m.location,
            m.key,
            m.seq_num,
        ),
        Msg::KVEvictMsg(m) => (
            OpType::Evict,
            m.instance_id,
            m.worker_id,
            m.location,
            m.key,
            m.seq_num,
        ),
        other => return other,
    };
    Msg::BatchedKVOperationMsg(BatchedKVOperationMsg {
        instance_id,
        worker_id,
        location,
        operations: vec![KVOpEvent {
            op_type,
            key,
            seq_num,
        }],
    })
}

/// The `ErrorMsg` answering a registration or heartbeat (`what`) the index refused, reported.
fn refused(key: WorkerKey, what: &'static str, e: IndexError, fx: &mut Vec<Effect>) -> Msg {
    let reply = error(format!("{what} refused: {e}"));
    fx.push(Effect::Report(ModelEvent::WorkerRefused {
        key,
        what,
        error: e,
    }));
    reply
}

fn key(instance_id: &str, worker_id: i64) -> WorkerKey {
    (instance_id.to_owned(), worker_id)
}

impl ControllerState {
    /// A fleet with no worker, over `index`, logging commands in `commands`.
    pub fn new(index: ChunkIndex, commands: CommandLog) -> Self {
        ControllerState {
            index,
            downlinks: HashMap::new(),
            next_generation: 0,
            commands,
        }
    }

    /// The whole fleet as a value (a snapshot).
    pub fn dump(&self) -> ControllerDump {
        let mut downlinks: Vec<_> = self
            .downlinks
            .iter()
            .map(|(k, d)| (k.clone(), d.generation, d.endpoint.clone()))
            .collect();
        downlinks.sort();
        ControllerDump {
            index: self.index.dump(),
            downlinks,
            next_generation: self.next_generation,
        }
    }

    /// A fleet holding what `dump` holds, with an index made with `config` and an empty
    /// command log.
    ///
    /// # Errors
    /// When `config`'s limits cannot hold the dump.
    pub fn restore(
        config: super::index::ChunkIndexConfig,
        dump: &ControllerDump,
    ) -> Result<Self, super::index::IndexError> {
        let mut fleet = ControllerState::new(
            ChunkIndex::restore(config, &dump.index)?,
            CommandLog::default(),
        );
        fleet.next_generation = dump.next_generation;
        for (key, generation, endpoint) in &dump.downlinks {
            fleet.downlinks.insert(
                key.clone(),
                DownlinkRecord {
                    generation: *generation,
                    endpoint: endpoint.clone(),
                },
            );
        }
        Ok(fleet)
    }

    /// The registry and chunk index (read-only: it changes through messages).
    pub fn index(&self) -> &ChunkIndex {
        &self.index
    }

    /// The index itself, bypassing the messages (see `Driver::with_index_mut`).
    #[doc(hidden)]
    pub fn index_mut(&mut self) -> &mut ChunkIndex {
        &mut self.index
    }

    /// The downlink record of a worker.
    pub fn downlink(&self, instance_id: &str, worker_id: i64) -> Option<&DownlinkRecord> {
        self.downlinks.get(&key(instance_id, worker_id))
    }

    /// Every downlink record.
    pub fn downlinks(&self) -> impl Iterator<Item = (&WorkerKey, &DownlinkRecord)> {
        self.downlinks.iter()
    }

    /// The orchestration command log.
    pub fn commands(&self) -> &CommandLog {
        &self.commands
    }

    /// The orchestration command log, to record commands in.
    pub fn commands_mut(&mut self) -> &mut CommandLog {
        &mut self.commands
    }

    /// Answers one request from a ROUTER socket: exactly one reply, and the effects.
    pub fn on_request(
        &mut self,
        kind: RouterKind,
        msg: Msg,
        ctx: &RequestContext,
    ) -> (Msg, Vec<Effect>) {
        let mut fx = Vec::new();
        if kind == RouterKind::Heartbeat && !matches!(msg, Msg::HeartbeatMsg(_)) {
            let reply = error(format!("Expected HeartbeatMsg, got {}", msg.tag()));
            return (reply, fx);
        }
        let reply = match msg {
            Msg::RegisterMsg(m) => self.on_register(&m, ctx, Wire::Requests, &mut fx),
            Msg::HeartbeatMsg(m) => self.on_heartbeat(&m, ctx.now, Wire::Requests, &mut fx),
            Msg::BatchedP2PLookupMsg(m) => self.on_p2p_lookup(&m, &mut fx),
            Msg::FullSyncStartMsg(m) => self.on_sync_start(m, ctx.now, &mut fx),
            Msg::FullSyncStatusMsg(m) => self.on_sync_status(m),
            other => error(format!(
                "Unsupported request type {} on the {} socket",
                other.tag(),
                kind.label()
            )),
        };
        (reply, fx)
    }

    /// Whether `msg` on `kind` only reads the fleet (P2P lookup, full-sync status), so the
    /// driver may answer it with [`ControllerState::on_read_request`] under a read lock.
    pub fn is_read_request(kind: RouterKind, msg: &Msg) -> bool {
        kind == RouterKind::Reply
            && matches!(msg, Msg::BatchedP2PLookupMsg(_) | Msg::FullSyncStatusMsg(_))
    }

    /// Answers a request for which [`ControllerState::is_read_request`] holds; any other gets an
    /// `ErrorMsg` (use [`ControllerState::on_request`]).
    pub fn on_read_request(&self, kind: RouterKind, msg: Msg) -> (Msg, Vec<Effect>) {
        let mut fx = Vec::new();
        let reply = match msg {
            Msg::BatchedP2PLookupMsg(m) if kind == RouterKind::Reply => {
                self.on_p2p_lookup(&m, &mut fx)
            }
            Msg::FullSyncStatusMsg(m) if kind == RouterKind::Reply => self.on_sync_status(m),
            other => error(format!(
                "{} changes the fleet: not a read request",
                other.tag()
            )),
        };
        (reply, fx)
    }

    /// Applies one message from the PULL socket. The result is the drop reason if it had no
    /// effect.
    pub fn on_push(&mut self, msg: Msg, now: f64) -> (Result<(), FrameDropReason>, Vec<Effect>) {
        let mut fx = Vec::new();
        let result = match as_batch(msg) {
            Msg::BatchedKVOperationMsg(m) => {
                self.on_ops(
                    &m.instance_id,
                    m.worker_id,
                    &m.location,
                    &m.operations,
                    now,
                    &mut fx,
                );
                Ok(())
            }
            Msg::FullSyncBatchMsg(m) => self.on_sync_batch(&m, now, &mut fx),
            Msg::FullSyncEndMsg(m) => self.on_sync_end(&m, now, &mut fx),
            Msg::DeRegisterMsg(m) => {
                self.on_deregister(&m.instance_id, m.worker_id, &mut fx);
                Ok(())
            }
            // LMCache ≤ 0.3.11 pushes its registration and heartbeats and reads no reply (it
            // has no `RegisterRetMsg`, no heartbeat commands and no full sync): applied as
            // the requests are, in its own generation, and nothing is answered.
            Msg::RegisterMsg(m) => {
                let ctx = RequestContext {
                    now,
                    heartbeat_url: None,
                };
                match self.on_register(&m, &ctx, m.pushed_wire(), &mut fx) {
                    Msg::ErrorMsg(_) => Err(FrameDropReason::Refused),
                    _ => Ok(()),
                }
            }
            Msg::HeartbeatMsg(m) => match self.on_heartbeat(&m, now, m.pushed_wire(), &mut fx) {
                Msg::ErrorMsg(_) => Err(FrameDropReason::Refused),
                _ => Ok(()),
            },
            _ => Err(FrameDropReason::WrongSocket),
        };
        (result, fx)
    }

    /// The hot path: one admit/evict batch, its outcome for the driver to count (no effects:
    /// batches never change downlinks).
    pub fn apply_batch(
        &mut self,
        instance_id: &str,
        worker_id: i64,
        location: &str,
        ops: &[KVOpEvent],
        now: f64,
    ) -> BatchOutcome {
        self.index
            .apply_batch(instance_id, worker_id, location, ops, now)
    }

    /// Marks full syncs silent for `timeout_s` failed (the worker's next heartbeat asks it to
    /// retry).
    pub fn expire_syncs(&mut self, now: f64, timeout_s: f64) -> Vec<Effect> {
        self.index
            .expire_syncs(now, timeout_s)
            .into_iter()
            .map(|key| Effect::Report(ModelEvent::SyncExpired { key }))
            .collect()
    }

    /// Workers silent for more than `timeout_s`, with the downlink generation to probe.
    pub fn stale_workers(&self, now: f64, timeout_s: f64) -> Vec<ProbeTarget> {
        self.index
            .stale_workers(now, timeout_s)
            .into_iter()
            .filter_map(|w| {
                let key = (w.instance_id, w.worker_id);
                let record = self.downlinks.get(&key)?;
                Some(ProbeTarget {
                    generation: record.generation,
                    endpoint: record.endpoint.clone(),
                    key,
                })
            })
            .collect()
    }

    /// A probe got an answer: the worker is alive as of `now`.
    pub fn probe_answered(&mut self, target: &ProbeTarget, now: f64) {
        self.index.touch(&target.key.0, target.key.1, now);
    }

    /// A probe got no answer: removes the worker if it is still the registration probed and
    /// still silent (O(1): [`ChunkIndex::is_stale`]). Returns whether it was removed, and the
    /// effects.
    pub fn probe_failed(
        &mut self,
        target: &ProbeTarget,
        now: f64,
        timeout_s: f64,
    ) -> (bool, Vec<Effect>) {
        let (instance_id, worker_id) = (&target.key.0, target.key.1);
        let same = self
            .downlinks
            .get(&target.key)
            .is_some_and(|d| d.generation == target.generation);
        if !same || !self.index.is_stale(instance_id, worker_id, now, timeout_s) {
            return (false, Vec::new());
        }
        let mut fx = Vec::new();
        self.index.deregister(instance_id, worker_id);
        self.close_downlink(&target.key, &mut fx);
        fx.push(Effect::Report(ModelEvent::WorkerRemoved {
            key: target.key.clone(),
            reason: RemovalReason::ProbeFailed,
        }));
        (true, fx)
    }

    /// Marks every worker seen at `now` (see [`ChunkIndex::touch_all`]).
    pub fn touch_all(&mut self, now: f64) {
        self.index.touch_all(now);
    }

    /// Asks every worker for a full sync at its next heartbeat
    /// ([`REASON_TAKEOVER_INCOMPLETE`](super::index::REASON_TAKEOVER_INCOMPLETE)).
    pub fn request_resync_all(&mut self) {
        self.index
            .request_resync_all(super::index::REASON_TAKEOVER_INCOMPLETE);
    }

    /// Every downlink as an effect to open: a standby taking over starts the tasks of the
    /// downlinks its fleet records.
    pub fn reopen_downlinks(&self) -> Vec<Effect> {
        self.downlinks
            .iter()
            .map(|(key, d)| Effect::OpenDownlink {
                key: key.clone(),
                generation: d.generation,
                endpoint: d.endpoint.clone(),
            })
            .collect()
    }

    fn open_downlink(&mut self, key: WorkerKey, ip: &str, port: u16, fx: &mut Vec<Effect>) {
        self.next_generation += 1;
        let generation = self.next_generation;
        let endpoint = host_port(ip, port);
        self.downlinks.insert(
            key.clone(),
            DownlinkRecord {
                generation,
                endpoint: endpoint.clone(),
            },
        );
        fx.push(Effect::OpenDownlink {
            key,
            generation,
            endpoint,
        });
    }

    fn close_downlink(&mut self, key: &WorkerKey, fx: &mut Vec<Effect>) {
        if let Some(record) = self.downlinks.remove(key) {
            fx.push(Effect::CloseDownlink {
                key: key.clone(),
                generation: record.generation,
            });
        }
    }

    fn on_register(
        &mut self,
        m: &crate::protocol::RegisterMsg,
        ctx: &RequestContext,
        wire: Wire,
        fx: &mut Vec<Effect>,
    ) -> Msg {
        let port = match port_of(m.port) {
            Ok(p) => p,
            Err(e) => return error(e),
        };
        let k = key(&m.instance_id, m.worker_id);
        let outcome = self.index.register(
            &m.instance_id,
            m.worker_id,
            &m.ip,
            port,
            m.peer_url(),
            ctx.now,
        );
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => return refused(k, "registration", e, fx),
        };
        self.index.set_wire(&m.instance_id, m.worker_id, wire);
        let (reopen, again) = match outcome {
            RegisterOutcome::New => (true, false),
            RegisterOutcome::ReRegistered { endpoint_changed } => {
                (endpoint_changed || !self.downlinks.contains_key(&k), true)
            }
        };
        if reopen {
            self.open_downlink(k.clone(), &m.ip, port, fx);
        }
        fx.push(Effect::Report(ModelEvent::WorkerRegistered {
            key: k,
            endpoint: host_port(&m.ip, port),
            again,
        }));
        let mut extra_config = indexmap::IndexMap::new();
        if let Some(url) = &ctx.heartbeat_url {
            extra_config.insert("heartbeat_url".to_owned(), url.clone());
        }
        Msg::RegisterRetMsg(RegisterRetMsg { extra_config })
    }

    fn on_heartbeat(
        &mut self,
        m: &crate::protocol::HeartbeatMsg,
        now: f64,
        wire: Wire,
        fx: &mut Vec<Effect>,
    ) -> Msg {
        let port = match port_of(m.port) {
            Ok(p) => p,
            Err(e) => return error(e),
        };
        let k = key(&m.instance_id, m.worker_id);
        let outcome =
            self.index
                .heartbeat(&m.instance_id, m.worker_id, &m.ip, port, m.peer_url(), now);
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => return refused(k, "heartbeat", e, fx),
        };
        self.index.set_wire(&m.instance_id, m.worker_id, wire);
        let commands = match outcome {
            HeartbeatOutcome::ReRegistered => {
                self.open_downlink(k.clone(), &m.ip, port, fx);
                fx.push(Effect::Report(ModelEvent::RegisteredByHeartbeat { key: k }));
                vec![HeartbeatCommand::full_sync(REASON_WORKER_RE_REGISTERED)]
            }
            HeartbeatOutcome::Known {
                full_sync,
                endpoint_changed,
            } => {
                if endpoint_changed || !self.downlinks.contains_key(&k) {
                    self.open_downlink(k, &m.ip, port, fx);
                }
                full_sync
                    .map(HeartbeatCommand::full_sync)
                    .into_iter()
                    .collect()
            }
        };
        Msg::HeartbeatRetMsg(HeartbeatRetMsg { commands })
    }

    fn on_p2p_lookup(&self, m: &crate::protocol::BatchedP2PLookupMsg, fx: &mut Vec<Effect>) -> Msg {
        let (reply, event) = self.p2p_lookup(&m.hashes, &m.instance_id, m.worker_id);
        fx.push(Effect::Report(event));
        reply
    }

    /// Answers a P2P lookup of `hashes` from a requester (a read: nothing changes); the event
    /// says whether it was a hit. [`ControllerState::on_read_request`] of a
    /// `BatchedP2PLookupMsg`, for a request decoded in place (`protocol::decode_lookup`).
    pub fn p2p_lookup(
        &self,
        hashes: &[ChunkHash],
        instance_id: &str,
        worker_id: i64,
    ) -> (Msg, ModelEvent) {
        let hit = self.index.p2p_lookup(hashes, instance_id, worker_id);
        let event = ModelEvent::P2pLookup { hit: hit.is_some() };
        let entry = match hit {
            Some(hit) => (
                hit.instance_id.to_owned(),
                hit.location.to_owned(),
                i64::try_from(hit.num_hit_chunks).unwrap_or(i64::MAX),
                hit.peer_init_url.to_owned(),
            ),
            None => (String::new(), String::new(), 0, String::new()),
        };
        let reply = Msg::BatchedP2PLookupRetMsg(BatchedP2PLookupRetMsg {
            layout_info: vec![entry],
        });
        (reply, event)
    }

    fn on_sync_start(
        &mut self,
        m: crate::protocol::FullSyncStartMsg,
        now: f64,
        fx: &mut Vec<Effect>,
    ) -> Msg {
        let result = self.index.sync_start(
            &m.instance_id,
            m.worker_id,
            &m.location,
            &m.sync_id,
            m.total_keys,
            m.batch_count,
            now,
        );
        let error_msg = result.err().map(|e| e.to_string());
        fx.push(Effect::Report(ModelEvent::SyncStarted {
            key: key(&m.instance_id, m.worker_id),
            sync_id: m.sync_id.clone(),
            error: error_msg.clone(),
        }));
        Msg::FullSyncStartRetMsg(FullSyncStartRetMsg {
            sync_id: m.sync_id,
            accepted: error_msg.is_none(),
            error_msg,
        })
    }

    fn on_sync_status(&self, m: crate::protocol::FullSyncStatusMsg) -> Msg {
        let s = self
            .index
            .sync_status(&m.instance_id, m.worker_id, &m.sync_id);
        Msg::FullSyncStatusRetMsg(FullSyncStatusRetMsg {
            sync_id: m.sync_id,
            is_complete: s.is_complete,
            global_progress: s.global_progress,
            can_exit_freeze: s.can_exit_freeze,
            missing_batches: s.missing_batches,
        })
    }

    fn on_ops(
        &mut self,
        instance_id: &str,
        worker_id: i64,
        location: &str,
        ops: &[KVOpEvent],
        now: f64,
        fx: &mut Vec<Effect>,
    ) {
        let outcome = self.apply_batch(instance_id, worker_id, location, ops, now);
        fx.push(Effect::Report(ModelEvent::Batch {
            key: key(instance_id, worker_id),
            location: location.to_owned(),
            outcome,
        }));
    }

    fn on_sync_batch(
        &mut self,
        m: &crate::protocol::FullSyncBatchMsg,
        now: f64,
        fx: &mut Vec<Effect>,
    ) -> Result<(), FrameDropReason> {
        let before = self.index.keys_refused();
        let outcome = self.index.sync_batch(
            &m.instance_id,
            m.worker_id,
            &m.location,
            &m.sync_id,
            m.batch_id,
            &m.keys,
            now,
        );
        let refused = self.index.keys_refused().saturating_sub(before);
        let k = key(&m.instance_id, m.worker_id);
        if refused > 0 {
            fx.push(Effect::Report(ModelEvent::KeysRefused {
                key: k.clone(),
                location: m.location.clone(),
                count: refused,
            }));
        }
        match outcome {
            SyncBatchOutcome::Accepted => Ok(()),
            SyncBatchOutcome::Completed => {
                fx.push(Effect::Report(ModelEvent::SyncCompleted {
                    key: k,
                    sync_id: m.sync_id.clone(),
                    by_batch: true,
                }));
                Ok(())
            }
            SyncBatchOutcome::Rejected => {
                fx.push(Effect::Report(ModelEvent::StaleSyncBatch {
                    key: k,
                    sync_id: m.sync_id.clone(),
                    batch: m.batch_id,
                }));
                Err(FrameDropReason::StaleSync)
            }
            SyncBatchOutcome::TooLarge => {
                fx.push(Effect::Report(ModelEvent::SyncBatchTooLarge {
                    key: k,
                    keys: m.keys.len(),
                }));
                Err(FrameDropReason::TooManyOps)
            }
            SyncBatchOutcome::OverBudget => {
                fx.push(Effect::Report(ModelEvent::SyncRangesRefused {
                    key: k,
                    batch: m.batch_id,
                    limit: self.index.config().max_sync_ranges,
                }));
                Err(FrameDropReason::SyncRanges)
            }
        }
    }

    fn on_sync_end(
        &mut self,
        m: &crate::protocol::FullSyncEndMsg,
        now: f64,
        fx: &mut Vec<Effect>,
    ) -> Result<(), FrameDropReason> {
        let outcome = self.index.sync_end(
            &m.instance_id,
            m.worker_id,
            &m.sync_id,
            m.actual_total_keys,
            now,
        );
        let k = key(&m.instance_id, m.worker_id);
        let sync_id = m.sync_id.clone();
        match outcome {
            SyncEndOutcome::Completed => {
                fx.push(Effect::Report(ModelEvent::SyncCompleted {
                    key: k,
                    sync_id,
                    by_batch: false,
                }));
                Ok(())
            }
            SyncEndOutcome::Incomplete { missing } => {
                fx.push(Effect::Report(ModelEvent::SyncIncomplete {
                    key: k,
                    sync_id,
                    missing,
                }));
                Ok(())
            }
            SyncEndOutcome::Rejected => Err(FrameDropReason::StaleSync),
        }
    }

    fn on_deregister(&mut self, instance_id: &str, worker_id: i64, fx: &mut Vec<Effect>) {
        let k = key(instance_id, worker_id);
        if self.index.deregister(instance_id, worker_id) {
            self.close_downlink(&k, fx);
            fx.push(Effect::Report(ModelEvent::WorkerRemoved {
                key: k,
                reason: RemovalReason::Deregistered,
            }));
        } else {
            fx.push(Effect::Report(ModelEvent::UnknownDeregistration { key: k }));
        }
    }

    /// Checks the model's invariant: every registered worker has exactly one downlink record,
    /// and no record belongs to an unregistered worker. For tests and fuzzing.
    ///
    /// # Errors
    /// A description of the first disagreement.
    pub fn check_invariants(&self) -> Result<(), String> {
        let workers = self.index.workers();
        for w in &workers {
            if !self
                .downlinks
                .contains_key(&key(&w.instance_id, w.worker_id))
            {
                return Err(format!(
                    "worker {}/{} has no downlink",
                    w.instance_id, w.worker_id
                ));
            }
        }
        if workers.len() != self.downlinks.len() {
            return Err(format!(
                "{} workers but {} downlinks",
                workers.len(),
                self.downlinks.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
