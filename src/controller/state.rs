//! The controller's shared state: the index behind one lock, the downlinks, the metrics,
//! the socket loops' live counters and the log of orchestration commands.

use super::downlink::Downlink;
use super::limits::{LimitLog, LogThrottle};
use super::peer_drops::PeerDrops;
use crate::config::ServeConfig;
use crate::index::{Index, IndexConfig};
use crate::metrics::Metrics;
use dashmap::DashMap;
use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// `(instance_id, worker_id)`: how LMCache names a worker.
pub type WorkerKey = (String, i64);

/// A worker's downlink and the registration it belongs to.
#[derive(Clone, Debug)]
pub struct DownlinkEntry {
    /// Bumped at every (re-)registration; a probe only removes the registration it probed.
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

/// Everything the socket loops, the liveness sweep and the HTTP handlers share.
pub struct Shared {
    /// The registry and chunk index. Never held across an `.await`.
    pub index: RwLock<Index>,
    /// One downlink per registered worker.
    pub downlinks: DashMap<WorkerKey, DownlinkEntry>,
    /// Metrics registry.
    pub metrics: Metrics,
    /// Validated configuration.
    pub config: ServeConfig,
    /// Heartbeat ROUTER port, once bound (for `heartbeat_url`).
    pub heartbeat_port: Option<u16>,
    /// Live state of each socket loop (serving, messages in hand, backlog).
    pub sockets: SocketStats,
    /// Orchestration commands and their status (HTTP `/check_finish`).
    pub commands: CommandLog,
    /// Log throttle of the resource limits.
    pub limits: LimitLog,
    /// Log throttle of the warnings a peer can cause once per message: frames the socket
    /// loops drop (bad input, receive errors), sequence gaps, stale full-sync messages,
    /// deregistrations of unknown workers.
    pub drop_log: LogThrottle,
    /// ZMQ peer connections the listening sockets dropped, by socket and reason.
    pub peer_drops: PeerDrops,
    generation: AtomicU64,
}

impl Shared {
    /// Creates the state for a server with this configuration.
    pub fn new(config: ServeConfig, heartbeat_port: Option<u16>) -> Self {
        let index = Index::with_config(IndexConfig {
            sync_completion_threshold: config.full_sync_completion_threshold,
            max_workers: config.max_workers,
            max_keys_per_worker: config.max_keys_per_worker,
            max_batch_ops: config.max_batch_ops,
            ..IndexConfig::default()
        });
        let ports = config.monitor_ports;
        Shared {
            index: RwLock::new(index),
            downlinks: DashMap::new(),
            metrics: Metrics::new(),
            sockets: SocketStats {
                pull: LoopStats::new(ports.pull.is_some()),
                reply: LoopStats::new(ports.reply.is_some()),
                heartbeat: LoopStats::new(ports.heartbeat.is_some()),
            },
            commands: CommandLog::new(COMMAND_LOG_CAPACITY),
            limits: LimitLog::default(),
            drop_log: LogThrottle::default(),
            peer_drops: PeerDrops::new(),
            config,
            heartbeat_port,
            generation: AtomicU64::new(0),
        }
    }

    /// (Re)opens the downlink of a worker at `ip:port`.
    pub fn open_downlink(&self, key: WorkerKey, ip: &str, port: u16) {
        let endpoint = host_port(ip, port);
        let downlink =
            Downlink::spawn(endpoint, self.config.downlink_timeout, self.metrics.clone());
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        self.downlinks.insert(
            key,
            DownlinkEntry {
                generation,
                downlink,
            },
        );
    }

    /// The downlink of a worker, if it is registered.
    pub fn downlink(&self, instance_id: &str, worker_id: i64) -> Option<DownlinkEntry> {
        self.downlinks
            .get(&(instance_id.to_owned(), worker_id))
            .map(|e| e.value().clone())
    }

    /// Closes a worker's downlink (its task ends once in-flight commands finish).
    pub fn close_downlink(&self, instance_id: &str, worker_id: i64) {
        self.downlinks.remove(&(instance_id.to_owned(), worker_id));
    }

    /// Refreshes the gauges that mirror the index.
    pub fn refresh_gauges(&self) {
        let workers = self.index.read().worker_count();
        self.metrics
            .workers
            .set(i64::try_from(workers).unwrap_or(i64::MAX));
    }

    /// Sets LMCache's 13 controller gauges from the index, the message counters and the
    /// socket loops' live state (called when `/metrics` is scraped; one read lock).
    pub fn refresh_lmcache_gauges(&self) {
        let (keys, workers, discontinuities, (syncing, completed, missing), progress) = {
            let index = self.index.read();
            (
                index.key_count(),
                index.worker_count(),
                index.seq_discontinuities(),
                index.sync_counts(),
                index.global_sync_progress(),
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
        m.downlinks.set(count(self.downlinks.len()));
        m.open_fds.set(count(
            std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count()),
        ));
    }
}

/// Live state of one socket loop, updated by the loop and read by `/metrics` and `/readyz`.
///
/// LMCache reads `has_pending` from libzmq's `ZMQ_EVENTS`, which the `zeromq` crate does not
/// expose. Here it is sampled by the loop itself: each time it comes back for the next message
/// it records whether one was already waiting (the receive completed on its first poll) —
/// a backlog — or whether it had to wait.
#[derive(Debug, Default)]
pub struct LoopStats {
    configured: bool,
    serving: AtomicBool,
    active: AtomicI64,
    backlog: AtomicBool,
}

/// Marks a loop as serving until dropped.
#[derive(Debug)]
#[must_use = "the loop is serving only while the guard lives"]
pub struct ServingGuard<'a>(&'a LoopStats);

impl Drop for ServingGuard<'_> {
    fn drop(&mut self) {
        self.0.serving.store(false, Ordering::Relaxed);
    }
}

/// Counts `n` messages as being handled until dropped.
#[derive(Debug)]
#[must_use = "the messages count as active only while the guard lives"]
pub struct ActiveGuard<'a>(&'a LoopStats, i64);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(self.1, Ordering::Relaxed);
    }
}

impl LoopStats {
    /// Stats of a loop that runs when `configured` (its port was given).
    pub fn new(configured: bool) -> Self {
        LoopStats {
            configured,
            ..LoopStats::default()
        }
    }

    /// The loop's port was configured.
    pub fn configured(&self) -> bool {
        self.configured
    }

    /// The loop is running and receiving.
    pub fn serving(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }

    /// Messages (frames, on PULL) received and not yet fully handled.
    pub fn active(&self) -> i64 {
        self.active.load(Ordering::Relaxed)
    }

    /// The last receive found a message already waiting.
    pub fn backlog(&self) -> bool {
        self.backlog.load(Ordering::Relaxed)
    }

    /// Called by the loop when it starts receiving; it stops counting as serving when the
    /// guard drops (loop exit, shutdown).
    pub fn start_serving(&self) -> ServingGuard<'_> {
        self.serving.store(true, Ordering::Relaxed);
        ServingGuard(self)
    }

    /// Counts `n` messages as in hand while the guard lives.
    pub fn handling(&self, n: usize) -> ActiveGuard<'_> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        self.active.fetch_add(n, Ordering::Relaxed);
        ActiveGuard(self, n)
    }

    /// Awaits `receive` (a socket receive), recording whether it was ready at once.
    pub async fn observe<F: Future>(&self, receive: F) -> F::Output {
        let mut receive = std::pin::pin!(receive);
        let mut first = true;
        std::future::poll_fn(|cx| {
            let poll = receive.as_mut().poll(cx);
            if first {
                first = false;
                self.backlog.store(poll.is_ready(), Ordering::Relaxed);
            }
            poll
        })
        .await
    }
}

/// The three socket loops' stats.
#[derive(Debug, Default)]
pub struct SocketStats {
    /// PULL loop.
    pub pull: LoopStats,
    /// Reply ROUTER loop.
    pub reply: LoopStats,
    /// Heartbeat ROUTER loop.
    pub heartbeat: LoopStats,
}

/// How many orchestration commands [`CommandLog`] remembers.
pub const COMMAND_LOG_CAPACITY: usize = 10_000;

/// Where an orchestration command is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandStatus {
    /// Sent to the workers, answers outstanding.
    Pending,
    /// Every worker answered.
    Finished,
    /// A worker failed, timed out, or could not be reached.
    Failed,
}

impl CommandStatus {
    /// `"pending"`, `"finished"` or `"failed"`.
    pub fn as_str(self) -> &'static str {
        match self {
            CommandStatus::Pending => "pending",
            CommandStatus::Finished => "finished",
            CommandStatus::Failed => "failed",
        }
    }
}

/// One orchestration command, as `/check_finish` reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct CommandRecord {
    /// The command (`clear`, `pin`, `compress`, `decompress`, `move`, `health`).
    pub command: &'static str,
    /// The instance it addressed (the source instance for `move`).
    pub instance_id: String,
    /// Status.
    pub status: CommandStatus,
    /// When it was issued (Unix seconds).
    pub created: f64,
    /// When it finished or failed (Unix seconds).
    pub finished: Option<f64>,
    /// The answer returned to the caller, once finished.
    pub result: Option<serde_json::Value>,
    /// Why it failed.
    pub detail: Option<String>,
}

/// The last [`COMMAND_LOG_CAPACITY`] orchestration commands by event id; the oldest is
/// forgotten first, so memory stays bounded however many commands are issued.
#[derive(Debug)]
pub struct CommandLog {
    capacity: usize,
    inner: Mutex<CommandLogInner>,
}

#[derive(Debug, Default)]
struct CommandLogInner {
    records: HashMap<String, CommandRecord>,
    order: VecDeque<String>,
}

impl CommandLog {
    /// An empty log keeping at most `capacity` commands (at least one).
    pub fn new(capacity: usize) -> Self {
        CommandLog {
            capacity: capacity.max(1),
            inner: Mutex::new(CommandLogInner::default()),
        }
    }

    /// Records a new pending command, forgetting the oldest one if the log is full.
    pub fn begin(&self, event_id: &str, command: &'static str, instance_id: &str) {
        let record = CommandRecord {
            command,
            instance_id: instance_id.to_owned(),
            status: CommandStatus::Pending,
            created: unix_now(),
            finished: None,
            result: None,
            detail: None,
        };
        let mut inner = self.inner.lock();
        if inner.records.insert(event_id.to_owned(), record).is_none() {
            inner.order.push_back(event_id.to_owned());
        }
        while inner.order.len() > self.capacity {
            if let Some(old) = inner.order.pop_front() {
                inner.records.remove(&old);
            }
        }
    }

    /// Marks a command finished with the answer given to the caller.
    pub fn finish(&self, event_id: &str, result: serde_json::Value) {
        self.settle(event_id, CommandStatus::Finished, Some(result), None);
    }

    /// Marks a command failed.
    pub fn fail(&self, event_id: &str, detail: String) {
        self.settle(event_id, CommandStatus::Failed, None, Some(detail));
    }

    fn settle(
        &self,
        event_id: &str,
        status: CommandStatus,
        result: Option<serde_json::Value>,
        detail: Option<String>,
    ) {
        if let Some(r) = self.inner.lock().records.get_mut(event_id) {
            r.status = status;
            r.finished = Some(unix_now());
            r.result = result;
            r.detail = detail;
        }
    }

    /// The record of a command, if it is still remembered.
    pub fn get(&self, event_id: &str) -> Option<CommandRecord> {
        self.inner.lock().records.get(event_id).cloned()
    }

    /// Commands remembered.
    pub fn len(&self) -> usize {
        self.inner.lock().order.len()
    }

    /// No command remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `host:port`, with IPv6 hosts in brackets.
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Wall-clock Unix seconds (the unit of LMCache's `registration_time`).
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_log_is_bounded_and_tracks_status() {
        let log = CommandLog::new(3);
        for i in 0..5 {
            log.begin(&format!("ev{i}"), "clear", "inst");
        }
        assert_eq!(log.len(), 3);
        assert!(log.get("ev0").is_none() && log.get("ev1").is_none());
        assert_eq!(
            log.get("ev2").map(|r| r.status),
            Some(CommandStatus::Pending)
        );
        log.finish("ev3", serde_json::json!({"num_tokens": 1}));
        log.fail("ev4", "timeout".into());
        let r = log.get("ev3").expect("kept");
        assert_eq!(r.status, CommandStatus::Finished);
        assert!(r.finished.is_some() && r.result.is_some());
        assert_eq!(
            log.get("ev4").map(|r| r.status),
            Some(CommandStatus::Failed)
        );
        log.fail("unknown", "ignored".into());
        assert_eq!(log.len(), 3);
    }

    #[tokio::test]
    async fn loop_stats_record_backlog_and_active_messages() {
        let stats = LoopStats::new(true);
        assert!(stats.configured() && !stats.serving());
        {
            let _serving = stats.start_serving();
            assert!(stats.serving());
            assert_eq!(stats.observe(async { 1 }).await, 1);
            assert!(stats.backlog(), "ready at once: a message was waiting");
            stats
                .observe(tokio::time::sleep(std::time::Duration::from_millis(5)))
                .await;
            assert!(!stats.backlog(), "had to wait: no backlog");
            let _a = stats.handling(50);
            assert_eq!(stats.active(), 50);
        }
        assert_eq!(stats.active(), 0);
        assert!(!stats.serving());
    }
}
