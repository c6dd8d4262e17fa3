//! The driver of the controller's state: one lock over the [`ControllerState`] model and the
//! live downlink tasks, so that applying a message and performing its effects is one atomic
//! step.
//!
//! Owns: the [`ControllerState`] (index, downlink registry, command log) and the downlink task
//! handles, both inside one `RwLock` — nothing else holds controller state. Effects are performed while
//! the write lock is held: opening a downlink only spawns a task on the server's
//! [`TaskTracker`] and closing one drops a channel sender, neither blocks. The lock is never
//! held across an `.await`. Metrics and log lines ([`ModelEvent`]s) are emitted after the lock is
//! released (`report.rs`).
//!
//! Must not: decode frames (the socket loops do), decide what a message means (the model
//! does), read the system clock (time comes from the [`Clock`] it was given).

use super::clock::Clock;
use super::downlink::Downlink;
use super::limits::{LimitLog, LogThrottle};
use super::metrics::Metrics;
use super::model::changes::Change;
use super::model::command_log::{CommandLog, CommandRecord};
use super::model::{
    ControllerState, Effect, FrameDropReason, ModelEvent, ProbeTarget, RequestContext, RouterKind,
    WorkerKey,
};
use super::peer_drops::PeerDrops;
use super::report::ReportSinks;
use super::socket_stats::{SocketLoopStats, SocketStats};
use crate::cluster::{ChangeLog, ClusterStatus, Host};
use crate::config::ServeConfig;
use crate::controller::model::index::{BatchOutcome, ChunkIndex, ChunkIndexConfig};
use crate::net::{host_port, route_source};
use crate::protocol::{encode, ChunkHash, KVOpEvent, Msg};
use parking_lot::{
    MappedRwLockReadGuard, MappedRwLockWriteGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
use serde_bytes::ByteBuf;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A worker's live downlink and the registration (generation) it belongs to.
#[derive(Clone, Debug)]
pub struct DownlinkEntry {
    /// Bumped at every (re)opening; a probe only removes the registration it probed.
    pub generation: u64,
    /// The command channel.
    pub downlink: Downlink,
}

/// Addresses the server actually bound (port 0 resolved).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoundAddrs {
    /// HTTP API.
    pub http: SocketAddr,
    /// PULL socket, if configured.
    pub pull: Option<SocketAddr>,
    /// Reply ROUTER, if configured.
    pub reply: Option<SocketAddr>,
    /// Heartbeat ROUTER, if configured.
    pub heartbeat: Option<SocketAddr>,
}

/// The model and the tasks that embody its downlinks, always changed together.
#[derive(Debug)]
struct World {
    fleet: ControllerState,
    live: HashMap<WorkerKey, DownlinkEntry>,
}

/// The controller's state and its driver: what the socket loops, the liveness sweep and the
/// HTTP routes share. Reads go through [`Driver::index`] / [`Driver::read`]; every change goes
/// through a method here that applies it to the model and performs its effects atomically.
pub struct Driver {
    world: RwLock<World>,
    /// Metrics registry.
    pub metrics: Metrics,
    /// Validated configuration.
    pub config: ServeConfig,
    /// Heartbeat ROUTER port, once bound (for `heartbeat_url`).
    heartbeat_port: std::sync::OnceLock<u16>,
    /// The change log this controller publishes as the cluster's leader (`--cluster`; set
    /// at takeover).
    changes: std::sync::OnceLock<Arc<ChangeLog<ControllerState>>>,
    /// Its place in the cluster (`--cluster`).
    cluster: std::sync::OnceLock<Arc<ClusterStatus>>,
    /// Live state of each socket loop (serving, messages in hand, backlog).
    pub sockets: SocketStats,
    /// Log throttle of the resource limits.
    pub limits: LimitLog,
    /// Log throttle of the warnings a peer can cause once per message: frames the socket
    /// loops drop (bad input, receive errors), sequence gaps, stale full-sync messages,
    /// deregistrations of unknown workers.
    pub drop_log: LogThrottle,
    /// ZMQ peer connections the listening sockets dropped, by socket and reason.
    pub peer_drops: PeerDrops,
    clock: Clock,
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Driver {
    /// The state of a server with this configuration, on the system clock, with its own task
    /// tracker and shutdown token.
    pub fn new(config: ServeConfig, heartbeat_port: Option<u16>) -> Self {
        Self::with_clock(config, heartbeat_port, Clock::system())
    }

    /// Like [`Driver::new`], reading time from `clock`.
    pub fn with_clock(config: ServeConfig, heartbeat_port: Option<u16>, clock: Clock) -> Self {
        let index = ChunkIndex::with_config(index_config(&config));
        let ports = config.monitor_ports;
        Driver {
            world: RwLock::new(World {
                fleet: ControllerState::new(index, CommandLog::default()),
                live: HashMap::new(),
            }),
            metrics: Metrics::new(),
            sockets: SocketStats {
                pull: SocketLoopStats::new(ports.pull.is_some()),
                reply: SocketLoopStats::new(ports.reply.is_some()),
                heartbeat: SocketLoopStats::new(ports.heartbeat.is_some()),
            },
            limits: LimitLog::default(),
            drop_log: LogThrottle::default(),
            peer_drops: PeerDrops::new(),
            config,
            heartbeat_port: heartbeat_port
                .map(std::sync::OnceLock::from)
                .unwrap_or_default(),
            changes: std::sync::OnceLock::new(),
            cluster: std::sync::OnceLock::new(),
            clock,
            tasks: TaskTracker::new(),
            shutdown: CancellationToken::new(),
        }
    }

    /// The clock every controller time comes from.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Now, in Unix seconds, from [`Driver::clock`].
    pub fn now(&self) -> f64 {
        self.clock.now()
    }

    /// The tracker every controller task (loops, downlinks, commands) is spawned on.
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// The token that stops every controller task.
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// A read view of the index. Never hold it across an `.await`; it blocks every change.
    pub fn index(&self) -> MappedRwLockReadGuard<'_, ChunkIndex> {
        RwLockReadGuard::map(self.world.read(), |w| w.fleet.index())
    }

    /// Runs `f` on the whole model under the read lock (index, downlink registry, command
    /// log). Keep `f` short: it blocks every change.
    pub fn read<R>(&self, f: impl FnOnce(&ControllerState) -> R) -> R {
        f(&self.world.read().fleet)
    }

    /// The live downlink of a worker, if it is registered.
    pub fn downlink(&self, instance_id: &str, worker_id: i64) -> Option<DownlinkEntry> {
        self.world
            .read()
            .live
            .get(&(instance_id.to_owned(), worker_id))
            .cloned()
    }

    /// Live downlink tasks.
    pub fn downlink_count(&self) -> usize {
        self.world.read().live.len()
    }

    /// The record of an orchestration command, if it is still remembered.
    pub fn command(&self, event_id: &str) -> Option<CommandRecord> {
        self.world.read().fleet.commands().get(event_id).cloned()
    }

    /// Records a new pending orchestration command.
    pub fn begin_command(&self, event_id: &str, command: &'static str, instance_id: &str) {
        let now = self.now();
        self.world
            .write()
            .fleet
            .commands_mut()
            .begin(event_id, command, instance_id, now);
    }

    /// Marks a command finished with the answer given to the caller.
    pub fn finish_command(&self, event_id: &str, result: serde_json::Value) {
        let now = self.now();
        self.world
            .write()
            .fleet
            .commands_mut()
            .finish(event_id, result, now);
    }

    /// Marks a command failed.
    pub fn fail_command(&self, event_id: &str, detail: String) {
        let now = self.now();
        self.world
            .write()
            .fleet
            .commands_mut()
            .fail(event_id, detail, now);
    }

    /// Answers one request from a ROUTER socket. Always returns exactly one reply.
    pub fn handle_request(&self, kind: RouterKind, msg: Msg) -> Msg {
        self.handle_request_frame(kind, msg, None)
    }

    /// [`Driver::handle_request`] of a message decoded from `frame`: the change log takes the
    /// frame as received instead of encoding the message again.
    pub fn handle_request_frame(&self, kind: RouterKind, msg: Msg, frame: Option<&[u8]>) -> Msg {
        self.metrics.requests.with_label_values(&[msg.tag()]).inc();
        let started = Instant::now();
        let lookup = matches!(msg, Msg::BatchedP2PLookupMsg(_));
        let (reply, fx) = if ControllerState::is_read_request(kind, &msg) {
            self.world.read().fleet.on_read_request(kind, msg)
        } else {
            let heartbeat_url = match &msg {
                Msg::RegisterMsg(m) if kind == RouterKind::Reply => self.heartbeat_url(&m.ip),
                _ => None,
            };
            let ctx = RequestContext {
                now: self.now(),
                heartbeat_url,
            };
            let frame = self.log_frame(&msg, frame);
            let mut world = self.world.write();
            let (reply, fx) = world.fleet.on_request(kind, msg, &ctx);
            if let Some(frame) = frame {
                self.record(ctx.now, || Change::Request {
                    heartbeat: kind == RouterKind::Heartbeat,
                    frame,
                });
            }
            let events = self.perform(&mut world, fx);
            drop(world);
            (reply, events)
        };
        if lookup {
            self.metrics
                .p2p_lookup_seconds
                .observe(started.elapsed().as_secs_f64());
        }
        self.report_all(fx);
        reply
    }

    /// Answers a `BatchedP2PLookupMsg` that the reply loop decoded in place
    /// (`protocol::decode_lookup`): the same reply, metrics and read lock as
    /// [`Driver::handle_request`] of that message, without building it.
    pub fn p2p_lookup(&self, hashes: &[ChunkHash], instance_id: &str, worker_id: i64) -> Msg {
        self.metrics
            .requests
            .with_label_values(&["BatchedP2PLookupMsg"])
            .inc();
        let started = Instant::now();
        let (reply, event) = self
            .world
            .read()
            .fleet
            .p2p_lookup(hashes, instance_id, worker_id);
        self.metrics
            .p2p_lookup_seconds
            .observe(started.elapsed().as_secs_f64());
        super::report::report(&self.reporter(), event);
        reply
    }

    /// Applies one message from the PULL socket. Returns the drop reason if it had no effect.
    ///
    /// # Errors
    /// The [`FrameDropReason`] of a message that changed nothing.
    pub fn handle_push(&self, msg: Msg) -> Result<(), FrameDropReason> {
        self.handle_push_frame(msg, None)
    }

    /// [`Driver::handle_push`] of a message decoded from `frame` (see
    /// [`Driver::handle_request_frame`]).
    ///
    /// # Errors
    /// The [`FrameDropReason`] of a message that changed nothing.
    pub fn handle_push_frame(&self, msg: Msg, frame: Option<&[u8]>) -> Result<(), FrameDropReason> {
        let now = self.now();
        let frame = self.log_frame(&msg, frame);
        let mut world = self.world.write();
        let (result, fx) = world.fleet.on_push(msg, now);
        if let Some(frame) = frame {
            self.record(now, || Change::Pull {
                frames: vec![frame],
            });
        }
        let events = self.perform(&mut world, fx);
        drop(world);
        self.report_all(events);
        result
    }

    /// Holds the write lock for a run of admit/evict batches (the PULL hot path): one lock for
    /// a whole multipart.
    pub fn batch_writer(&self) -> BatchWriter<'_> {
        BatchWriter {
            world: self.world.write(),
            now: self.now(),
            log: self.changes.get().map(|l| &**l),
            frames: Vec::new(),
        }
    }

    /// Marks stalled full syncs failed and returns the silent workers to probe.
    pub fn begin_sweep(&self) -> Vec<ProbeTarget> {
        let now = self.now();
        let timeout = self.config.worker_timeout.as_secs_f64();
        let sync_timeout = self.config.full_sync_timeout.as_secs_f64();
        let mut world = self.world.write();
        let fx = world.fleet.expire_syncs(now, sync_timeout);
        if !fx.is_empty() {
            self.record(now, || Change::ExpireSyncs {
                timeout_s: sync_timeout,
            });
        }
        let stale = world.fleet.stale_workers(now, timeout);
        let events = self.perform(&mut world, fx);
        drop(world);
        self.report_all(events);
        stale
    }

    /// A probe was answered: the worker counts as seen now.
    pub fn probe_answered(&self, target: &ProbeTarget) {
        let now = self.now();
        let mut world = self.world.write();
        world.fleet.probe_answered(target, now);
        self.record(now, || Change::ProbeAnswered {
            key: target.key.clone(),
            generation: target.generation,
        });
    }

    /// A probe failed: removes the worker if it is still the registration probed and still
    /// silent. Returns whether it was removed.
    pub fn probe_failed(&self, target: &ProbeTarget) -> bool {
        let now = self.now();
        let timeout = self.config.worker_timeout.as_secs_f64();
        let mut world = self.world.write();
        let (removed, fx) = world.fleet.probe_failed(target, now, timeout);
        if removed {
            self.record(now, || Change::ProbeFailed {
                key: target.key.clone(),
                generation: target.generation,
                timeout_s: timeout,
            });
        }
        let events = self.perform(&mut world, fx);
        drop(world);
        self.report_all(events);
        removed
    }

    /// Performs the downlink effects under the write lock; returns the reports for after it.
    fn perform(&self, world: &mut World, fx: Vec<Effect>) -> Vec<Effect> {
        let mut reports = Vec::new();
        for effect in fx {
            match effect {
                Effect::OpenDownlink {
                    key,
                    generation,
                    endpoint,
                } => {
                    let downlink = Downlink::spawn(
                        endpoint,
                        self.config.downlink_timeout,
                        self.metrics.clone(),
                        &self.tasks,
                        self.shutdown.clone(),
                    )
                    .with_fence(self.cluster().and_then(|c| c.fence()).cloned());
                    // Replacing an older entry drops its sender: that task ends.
                    world.live.insert(
                        key,
                        DownlinkEntry {
                            generation,
                            downlink,
                        },
                    );
                }
                Effect::CloseDownlink { key, generation } => {
                    if world
                        .live
                        .get(&key)
                        .is_some_and(|e| e.generation == generation)
                    {
                        world.live.remove(&key);
                    }
                }
                report @ Effect::Report(_) => reports.push(report),
            }
        }
        reports
    }

    fn report_all(&self, fx: Vec<Effect>) {
        let mut removed = false;
        for effect in fx {
            if let Effect::Report(event) = effect {
                removed |= matches!(
                    event,
                    ModelEvent::WorkerRemoved { .. }
                        | ModelEvent::WorkerRegistered { .. }
                        | ModelEvent::RegisteredByHeartbeat { .. }
                );
                super::report::report(&self.reporter(), event);
            }
        }
        if removed {
            self.refresh_gauges();
        }
    }

    /// What the reports of events use: metrics, throttles, limits.
    pub(crate) fn reporter(&self) -> ReportSinks<'_> {
        ReportSinks {
            metrics: &self.metrics,
            config: &self.config,
            limits: &self.limits,
            drop_log: &self.drop_log,
        }
    }

    /// Joins a cluster (`--cluster`): `status` is reported on `/metrics` and
    /// `/controller/cluster` from now on. The first one set stays.
    pub fn set_cluster(&self, status: Arc<ClusterStatus>) {
        let _ = self.cluster.set(status);
    }

    /// Its place in the cluster, if it is in one.
    pub fn cluster(&self) -> Option<&Arc<ClusterStatus>> {
        self.cluster.get()
    }

    /// Becomes the leader: every change is logged in `log` from now on, and the downlinks
    /// the followed fleet records are opened. `in_sync`: the followed fleet held every change
    /// since a fresh start; if not, its index may miss admits or evicts, so every worker
    /// resynchronises, as after a blank restart (and the log says so to the followers).
    pub fn lead(&self, log: Arc<ChangeLog<ControllerState>>, in_sync: bool) {
        let mut world = self.world.write();
        let _ = self.changes.set(log);
        if !in_sync {
            world.fleet.request_resync_all();
            self.record(self.now(), || Change::ResyncAll);
            if let Some(c) = self.cluster.get() {
                c.resynced();
            }
            tracing::warn!("took over without the whole change log: every worker will full-sync");
        }
        let fx = world.fleet.reopen_downlinks();
        let events = self.perform(&mut world, fx);
        drop(world);
        self.report_all(events);
        self.refresh_gauges();
    }

    /// Logs a change the caller applied under the write lock it still holds.
    fn record(&self, now: f64, change: impl FnOnce() -> Change) {
        if let Some(log) = self.changes.get() {
            log.record(now, &change());
        }
    }

    /// The frame to log for `msg` when changes are being logged: `received` as it came, else
    /// `msg` encoded.
    fn log_frame(&self, msg: &Msg, received: Option<&[u8]>) -> Option<ByteBuf> {
        self.changes.get()?;
        Some(ByteBuf::from(
            received.map_or_else(|| encode(msg), <[u8]>::to_vec),
        ))
    }

    /// Records the heartbeat ROUTER port once bound (the first one set stays).
    pub fn set_heartbeat_port(&self, port: u16) {
        let _ = self.heartbeat_port.set(port);
    }

    /// The `heartbeat_url` a worker at `worker_ip` can reach: `--advertise-host`, else the
    /// bind host, else (bind host is a wildcard) the local address of the route to the
    /// worker — `127.0.0.1` for a worker on loopback. Computing the route sends no packet.
    pub fn heartbeat_url(&self, worker_ip: &str) -> Option<String> {
        let port = *self.heartbeat_port.get()?;
        let cfg = &self.config;
        let host = match &cfg.advertise_host {
            Some(h) => h.clone(),
            None if !matches!(cfg.host.as_str(), "0.0.0.0" | "*" | "" | "::" | "[::]") => {
                cfg.host.clone()
            }
            None => worker_ip
                .parse::<IpAddr>()
                .ok()
                .and_then(route_source)
                .map_or_else(|| "127.0.0.1".to_owned(), |ip| ip.to_string()),
        };
        Some(host_port(&host, port))
    }

    /// Refreshes the gauges that mirror the index.
    pub fn refresh_gauges(&self) {
        let workers = self.index().worker_count();
        self.metrics
            .workers
            .set(i64::try_from(workers).unwrap_or(i64::MAX));
    }

    /// Sets LMCache's 13 controller gauges from the index, the message counters and the
    /// socket loops' live state (called when `/metrics` is scraped; one read lock).
    pub fn refresh_lmcache_gauges(&self) {
        let (keys, workers, discontinuities, (syncing, completed, missing), progress, links) = {
            let world = self.world.read();
            let index = world.fleet.index();
            (
                index.key_count(),
                index.worker_count(),
                index.seq_discontinuities(),
                index.sync_counts(),
                index.global_sync_progress(),
                world.live.len(),
            )
        };
        let m = &self.metrics;
        m.workers.set(i64::try_from(workers).unwrap_or(i64::MAX));
        let frames = |socket: &str| m.frames_received.with_label_values(&[socket]).get() as f64;
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        let s = &self.sockets;
        let g = &m.lmcache;
        g.kv_pool_keys_count.set(keys as f64);
        g.registered_workers_count.set(workers as f64);
        g.pull_socket_message_count.set(frames("pull"));
        g.reply_socket_message_count
            .set(frames("reply") + frames("heartbeat"));
        g.pull_socket_has_pending.set(flag(s.pull.backlog()));
        g.reply_socket_has_pending
            .set(flag(s.reply.backlog() || s.heartbeat.backlog()));
        g.pull_socket_active_requests.set(s.pull.active() as f64);
        g.reply_socket_active_requests
            .set((s.reply.active() + s.heartbeat.active()) as f64);
        g.kv_op_seq_discontinuity_count.set(discontinuities as f64);
        g.full_sync_workers_syncing.set(syncing as f64);
        g.full_sync_workers_completed.set(completed as f64);
        g.full_sync_global_progress.set(progress);
        g.full_sync_missing_batches_total.set(missing as f64);
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            m.tasks.set(count(rt.metrics().num_alive_tasks()));
        }
        m.downlinks.set(count(links));
        m.open_fds.set(count(
            std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count()),
        ));
    }

    /// The index itself, write-locked, bypassing the model: for tests
    /// that stage index contents (backdated workers, keys) directly. Workers registered this
    /// way have no downlink, so [`Driver::check_consistency`] fails after it.
    #[doc(hidden)]
    pub fn index_mut_for_tests(&self) -> MappedRwLockWriteGuard<'_, ChunkIndex> {
        RwLockWriteGuard::map(self.world.write(), |w| w.fleet.index_mut())
    }

    /// Checks that the model and the live tasks agree: every registered worker has exactly
    /// one live downlink, of the generation the model records, and no other downlink lives.
    /// For tests and fuzzing.
    ///
    /// # Errors
    /// A description of the first disagreement.
    #[doc(hidden)]
    pub fn check_consistency(&self) -> Result<(), String> {
        let world = self.world.read();
        world.fleet.check_invariants()?;
        for (key, record) in world.fleet.downlinks() {
            match world.live.get(key) {
                Some(e) if e.generation == record.generation => {}
                Some(e) => {
                    return Err(format!(
                        "{key:?}: live downlink of generation {}, model has {}",
                        e.generation, record.generation
                    ))
                }
                None => return Err(format!("{key:?}: no live downlink")),
            }
        }
        if world.live.len() != world.fleet.downlinks().count() {
            return Err(format!(
                "{} live downlinks for {} records",
                world.live.len(),
                world.fleet.downlinks().count()
            ));
        }
        Ok(())
    }
}

/// The fleet, followed or led, lives under the world's lock: a record is applied, and a
/// snapshot dumped, as one step under it.
impl Host for Driver {
    type State = ControllerState;

    fn write<R>(&self, f: impl FnOnce(&mut ControllerState) -> R) -> Option<R> {
        Some(f(&mut self.world.write().fleet))
    }

    fn read<R>(&self, f: impl FnOnce(&ControllerState) -> R) -> Option<R> {
        Some(f(&self.world.read().fleet))
    }

    fn now(&self) -> f64 {
        Driver::now(self)
    }
}

/// The index's limits from the controller's configuration.
fn index_config(config: &ServeConfig) -> ChunkIndexConfig {
    ChunkIndexConfig {
        sync_completion_threshold: config.full_sync_completion_threshold,
        max_workers: config.max_workers,
        max_keys_per_worker: config.max_keys_per_worker,
        max_batch_ops: config.max_batch_ops,
        ..ChunkIndexConfig::default()
    }
}

/// The write lock held over a run of admit/evict batches (see [`Driver::batch_writer`]).
#[must_use = "the lock is held only while the writer lives"]
pub struct BatchWriter<'a> {
    world: RwLockWriteGuard<'a, World>,
    now: f64,
    log: Option<&'a ChangeLog<ControllerState>>,
    /// The frames applied, for the change log (only when logging).
    frames: Vec<ByteBuf>,
}

impl Drop for BatchWriter<'_> {
    fn drop(&mut self) {
        // Logged before the lock is released (the guard drops after this body).
        if let Some(log) = self.log {
            if !self.frames.is_empty() {
                log.record(
                    self.now,
                    &Change::Pull {
                        frames: std::mem::take(&mut self.frames),
                    },
                );
            }
        }
    }
}

impl BatchWriter<'_> {
    /// Applies one admit/evict batch, `frame` as received; the caller counts the outcome.
    pub fn apply_batch(
        &mut self,
        frame: &[u8],
        instance_id: &str,
        worker_id: i64,
        location: &str,
        ops: &[KVOpEvent],
    ) -> BatchOutcome {
        if self.log.is_some() {
            self.frames.push(ByteBuf::from(frame.to_vec()));
        }
        self.world
            .fleet
            .apply_batch(instance_id, worker_id, location, ops, self.now)
    }
}
