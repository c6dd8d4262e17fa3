//! [`Worker::start`] and the [`WorkerHandle`] the application keeps: admits and evicts
//! (non-blocking), P2P lookups, full-sync trigger, status, shutdown.

use super::batcher::Op;
use super::config::WorkerConfig;
use super::engine::{Control, Engine, Parts};
use super::handler::CommandHandler;
use super::keys::KeySource;
use super::state::{inc, Ctx, Stats, WorkerState, WorkerStatus};
use super::uplink::{route_ip, LookupPool};
use super::{commands, heartbeat, WorkerError};
use crate::net::host_port;
use crate::protocol::{BatchedP2PLookupMsg, ChunkHash, Msg, OpType};
use crate::transport::RepServer;
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

/// Where a P2P lookup found the longest prefix: another instance's worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerHit {
    /// The instance holding the prefix.
    pub instance_id: String,
    /// Its location (backend) holding it, e.g. `LocalCPUBackend`.
    pub location: String,
    /// How many leading hashes of the request it holds (≥ 1).
    pub num_hit_chunks: usize,
    /// Where to fetch the KV from (that worker's `peer_init_url`).
    pub peer_init_url: String,
}

/// Entry point of the worker library.
#[derive(Debug)]
pub struct Worker;

impl Worker {
    /// Binds the command socket, then starts the worker in the background and returns its
    /// handle at once. Registration runs in the background and is retried with backoff until
    /// the controller answers (ops queued meanwhile are held and sent after it); see
    /// [`WorkerHandle::wait_ready`]. If `keys` holds anything at the first registration, a
    /// full sync follows it.
    ///
    /// Must be called within a tokio runtime (multi-threaded or not); the worker's tasks live
    /// on it.
    ///
    /// # Errors
    /// [`WorkerError::Config`] if `config` is invalid, [`WorkerError::Bind`] if the command
    /// socket cannot be bound.
    pub async fn start<H: CommandHandler, K: KeySource>(
        config: WorkerConfig,
        handler: H,
        keys: K,
    ) -> Result<WorkerHandle, WorkerError> {
        config.validate()?;
        let bind = host_port(&config.command_host, config.command_port);
        let (rep, command_addr) = RepServer::bind(&bind)
            .await
            .map_err(|source| WorkerError::Bind { addr: bind, source })?;
        let ip = match &config.advertise_ip {
            Some(ip) => ip.clone(),
            None => route_ip(&config.controller_reply, config.request_timeout).await,
        };
        let lookups = LookupPool::new(
            config.controller_reply.clone(),
            config.request_timeout,
            config.max_concurrent_lookups,
        );
        let queue_capacity = config.queue_capacity;
        let ctx = Arc::new(Ctx {
            config,
            ip,
            port: command_addr.port(),
            stats: Stats::default(),
            probe: Notify::new(),
            overflow: AtomicBool::new(false),
        });
        let cancel = CancellationToken::new();
        let (ops_tx, ops_rx) = mpsc::channel(queue_capacity);
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let (registered_tx, registered_rx) = watch::channel(None);
        let (state_tx, state_rx) = watch::channel(WorkerState::Registering);
        let engine = Engine::new(Parts {
            ctx: Arc::clone(&ctx),
            keys: Arc::new(keys),
            ops: ops_rx,
            control: control_rx,
            events: events_rx,
            registered: registered_tx,
            state: state_tx,
            cancel: cancel.clone(),
        });
        let tasks = vec![
            tokio::spawn(commands::serve(
                Arc::clone(&ctx),
                rep,
                Arc::new(handler),
                cancel.clone(),
            )),
            tokio::spawn(heartbeat::run(
                Arc::clone(&ctx),
                registered_rx,
                events_tx,
                cancel.clone(),
            )),
            tokio::spawn(engine.run()),
        ];
        tracing::info!(
            instance = %ctx.config.instance_id, worker = ctx.config.worker_id,
            command = %command_addr, advertised = %format!("{}:{}", ctx.ip, ctx.port),
            "kvplane worker started"
        );
        Ok(WorkerHandle {
            inner: Arc::new(Inner {
                ctx,
                ops: ops_tx,
                control: control_tx,
                state: state_rx,
                lookups,
                command_addr,
                tasks: Mutex::new(tasks),
                cancel: cancel.clone(),
                _stop_on_drop: cancel.drop_guard(),
            }),
        })
    }
}

struct Inner {
    ctx: Arc<Ctx>,
    ops: mpsc::Sender<Op>,
    control: mpsc::UnboundedSender<Control>,
    state: watch::Receiver<WorkerState>,
    lookups: LookupPool,
    command_addr: SocketAddr,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    cancel: CancellationToken,
    /// Stops every task when the last handle goes away without `shutdown`.
    _stop_on_drop: DropGuard,
}

/// The application's handle on a running worker. Cheap to clone; every clone drives the same
/// worker, from any thread. When the last clone is dropped without
/// [`shutdown`](Self::shutdown), the worker stops without deregistering.
#[derive(Clone)]
pub struct WorkerHandle {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for WorkerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerHandle")
            .field("instance_id", &self.inner.ctx.config.instance_id)
            .field("worker_id", &self.inner.ctx.config.worker_id)
            .field("state", &self.state())
            .finish()
    }
}

impl WorkerHandle {
    fn op(&self, kind: OpType, location: &str, key: ChunkHash) -> Result<(), WorkerError> {
        let op = Op {
            kind,
            location: location.to_owned(),
            key,
        };
        let stats = &self.inner.ctx.stats;
        match self.inner.ops.try_send(op) {
            Ok(()) => {
                inc(&stats.ops_queued);
                Ok(())
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                inc(&stats.ops_rejected);
                self.inner.ctx.overflow.store(true, Ordering::Release);
                Err(WorkerError::QueueFull)
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(WorkerError::Closed),
        }
    }

    /// Reports that `location` now holds `hash`. Never blocks: the op is queued for the
    /// background task, which batches it with the others of the same location (in order,
    /// with LMCache's sequence numbers).
    ///
    /// Update your [`KeySource`] first (see its module docs): ops may be superseded by a full
    /// sync, which reads it.
    ///
    /// # Errors
    /// [`WorkerError::QueueFull`] if `queue_capacity` ops are waiting: the op is dropped and
    /// the worker resynchronises with a full sync. [`WorkerError::Closed`] after shutdown.
    pub fn admit(&self, location: &str, hash: impl Into<ChunkHash>) -> Result<(), WorkerError> {
        self.op(OpType::Admit, location, hash.into())
    }

    /// Reports that `location` no longer holds `hash`. As [`admit`](Self::admit).
    ///
    /// # Errors
    /// As for [`admit`](Self::admit).
    pub fn evict(&self, location: &str, hash: impl Into<ChunkHash>) -> Result<(), WorkerError> {
        self.op(OpType::Evict, location, hash.into())
    }

    /// Asks the controller which other instance holds the longest prefix of `hashes` (chunk
    /// hashes in prefix order). `Ok(None)` is a miss (also for an empty request, answered
    /// locally). Bounded by `request_timeout`, waiting for a free connection included.
    ///
    /// # Errors
    /// [`WorkerError::Timeout`] or [`WorkerError::Transport`] if the controller did not
    /// answer (the worker then probes it with a heartbeat, to notice a restart),
    /// [`WorkerError::Controller`] if it answered `ErrorMsg`,
    /// [`WorkerError::UnexpectedReply`] / [`WorkerError::Decode`] for a reply of the wrong
    /// kind, [`WorkerError::Closed`] after shutdown.
    pub async fn p2p_lookup(&self, hashes: &[ChunkHash]) -> Result<Option<PeerHit>, WorkerError> {
        if hashes.is_empty() {
            return Ok(None);
        }
        if self.inner.cancel.is_cancelled() {
            return Err(WorkerError::Closed);
        }
        let ctx = &self.inner.ctx;
        let msg = Msg::BatchedP2PLookupMsg(BatchedP2PLookupMsg {
            hashes: hashes.to_vec(),
            instance_id: ctx.config.instance_id.clone(),
            worker_id: ctx.config.worker_id,
        });
        let reply = match self.inner.lookups.call(&msg).await {
            Ok(reply) => reply,
            Err(e) => {
                inc(&ctx.stats.lookup_failures);
                if matches!(e, WorkerError::Timeout(_) | WorkerError::Transport(_)) {
                    ctx.probe.notify_one();
                }
                return Err(e);
            }
        };
        match reply {
            Msg::BatchedP2PLookupRetMsg(r) => {
                inc(&ctx.stats.lookups);
                let hit = r.layout_info.into_iter().next().and_then(
                    |(instance_id, location, n, peer_init_url)| {
                        let num_hit_chunks = usize::try_from(n).ok().filter(|n| *n > 0)?;
                        (!instance_id.is_empty()).then_some(PeerHit {
                            instance_id,
                            location,
                            num_hit_chunks,
                            peer_init_url,
                        })
                    },
                );
                if hit.is_some() {
                    inc(&ctx.stats.lookup_hits);
                }
                Ok(hit)
            }
            other => {
                inc(&ctx.stats.lookup_failures);
                Err(WorkerError::UnexpectedReply(other.tag().to_owned()))
            }
        }
    }

    /// Schedules a full sync of every location of the key source (after the random startup
    /// delay, as when the controller asks for one). Returns at once.
    ///
    /// # Errors
    /// [`WorkerError::Closed`] after shutdown.
    pub fn full_sync(&self) -> Result<(), WorkerError> {
        self.inner
            .control
            .send(Control::FullSync)
            .map_err(|_| WorkerError::Closed)
    }

    /// Sends every op queued so far now, without waiting for the flush interval. Resolves
    /// when they are handed to the socket, or — if a resync is pending or running — when
    /// that resync has completed (which may take as long as the controller is away: wrap the
    /// call in a timeout if that matters).
    ///
    /// # Errors
    /// [`WorkerError::Resync`] if the resync the flush waited for failed (another follows),
    /// [`WorkerError::Closed`] after shutdown.
    pub async fn flush(&self) -> Result<(), WorkerError> {
        let (tx, rx) = oneshot::channel();
        self.inner
            .control
            .send(Control::Flush(tx))
            .map_err(|_| WorkerError::Closed)?;
        rx.await.map_err(|_| WorkerError::Closed)?
    }

    /// What the worker is doing now.
    pub fn state(&self) -> WorkerState {
        *self.inner.state.borrow()
    }

    /// The current state and every counter.
    pub fn status(&self) -> WorkerStatus {
        self.inner.ctx.stats.status(self.state())
    }

    /// Waits until the worker is [`WorkerState::Ready`]: registered, no resync pending or
    /// running.
    ///
    /// # Errors
    /// [`WorkerError::Timeout`] after `timeout`, [`WorkerError::Closed`] if the worker stopped.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), WorkerError> {
        let mut state = self.inner.state.clone();
        let wait = async move {
            state
                .wait_for(|s| matches!(s, WorkerState::Ready | WorkerState::Stopped))
                .await
                .map(|s| *s)
        };
        match tokio::time::timeout(timeout, wait).await {
            Err(_) => Err(WorkerError::Timeout(timeout)),
            Ok(Ok(WorkerState::Ready)) => Ok(()),
            Ok(_) => Err(WorkerError::Closed),
        }
    }

    /// The address the command socket is bound to (`0.0.0.0:<port>` with the default
    /// `command_host`); its port is the one registered.
    pub fn command_addr(&self) -> SocketAddr {
        self.inner.command_addr
    }

    /// `ip:port` registered with the controller, which it connects to for commands.
    pub fn advertised_endpoint(&self) -> String {
        host_port(&self.inner.ctx.ip, self.inner.ctx.port)
    }

    /// The configuration the worker runs with.
    pub fn config(&self) -> &WorkerConfig {
        &self.inner.ctx.config
    }

    /// Flushes queued ops (unless a resync makes them moot), pushes `DeRegisterMsg` if the
    /// worker ever registered, and stops every task and socket, all within
    /// `shutdown_timeout`. Other clones of the handle then get [`WorkerError::Closed`].
    ///
    /// # Errors
    /// [`WorkerError::Timeout`] if the graceful part overran `shutdown_timeout`; the worker is
    /// stopped anyway.
    pub async fn shutdown(self) -> Result<(), WorkerError> {
        let inner = &self.inner;
        let timeout = inner.ctx.config.shutdown_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let (tx, rx) = oneshot::channel();
        let graceful = match inner.control.send(Control::Shutdown(tx)) {
            Ok(()) => tokio::time::timeout_at(deadline, rx).await.is_ok(),
            Err(_) => true,
        };
        inner.cancel.cancel();
        let tasks = std::mem::take(&mut *inner.tasks.lock());
        for mut task in tasks {
            let grace = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .max(Duration::from_millis(100));
            if tokio::time::timeout(grace, &mut task).await.is_err() {
                task.abort();
            }
        }
        if graceful {
            Ok(())
        } else {
            Err(WorkerError::Timeout(timeout))
        }
    }
}
