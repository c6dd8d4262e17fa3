//! The engine: the background task that owns the op stream and decides, at every moment,
//! whether ops go to the controller, are held back, or are superseded by a full sync.
//!
//! ```text
//!            failure, full_sync command, queue overflow          failed: backoff,
//!              ┌──────────────────────┐                        re-register first
//!              │                      ▼                      ┌──────────────────┐
//!  Registering ──ok──► Ready ──► ResyncPending ──(random delay)──► Syncing ─────────┘
//!  (ops held)          (ops sent)  (ops held)                   (ops held)
//!                        ▲                                          │
//!                        └──── sync complete: held ops replayed ◄───┘
//! ```
//!
//! * **Ready**: ops are batched per location (`batch_size` or `flush_interval`, whichever
//!   first) and pushed. A PUSH send that fails loses its ops, so the worker schedules a full
//!   sync instead of pretending they arrived.
//! * **ResyncPending**, **Registering**, **Syncing**: ops are held (LMCache's freeze drops
//!   them) and replayed in order once the sync is complete. Replaying ops already in the
//!   sync's snapshot is harmless: the held ops are a suffix of the op stream that starts
//!   before the snapshot, so replaying them onto it yields exactly the key source's state.
//!   Past `max_held_ops` the held ops are dropped (their effects are in the next snapshot,
//!   except for locations the [`KeySource`] does not list) and another sync follows.
//! * A *recovery* registers if needed (with backoff, until the controller answers), then
//!   full-syncs every location. A failed recovery is retried after a backoff, re-registering
//!   first; held ops stay held.
//!
//! All socket work of a recovery happens in one future that owns the [`Uplink`] and runs
//! concurrently with the op loop, which only holds ops meanwhile.

use super::batcher::{Batcher, Op};
use super::full_sync::{self, new_sync_id};
use super::heartbeat::{sleep_until_opt, Event};
use super::keys::KeySource;
use super::state::{add, inc, Ctx, WorkerState};
use super::uplink::Uplink;
use super::WorkerError;
use crate::protocol::{ChunkHash, Msg};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Heartbeat reason meaning the controller had forgotten this worker (it restarted).
const REASON_RE_REGISTERED: &str = "worker_re_registered";

/// Ops taken from the queue in one go before other events get a turn.
const OPS_PER_TURN: usize = 1024;

/// Requests from the handle other than ops.
#[derive(Debug)]
pub(crate) enum Control {
    /// Run a full sync (after the usual random delay).
    FullSync,
    /// Answer once every op queued before has been sent (or superseded by a completed sync).
    Flush(oneshot::Sender<Result<(), WorkerError>>),
    /// Flush, deregister, stop.
    Shutdown(oneshot::Sender<()>),
}

/// What a recovery must do.
#[derive(Clone, Copy, Debug)]
struct Plan {
    register: bool,
    sync: bool,
    /// Sync only if the key source holds anything (first registration).
    sync_if_keys: bool,
}

#[derive(Debug)]
struct RecoveryError {
    reason: String,
    unfinished: Option<String>,
}

type Recovery = Pin<Box<dyn Future<Output = (Uplink, Result<(), RecoveryError>)> + Send>>;

/// Channels and shared pieces the engine is built from.
pub(crate) struct Parts {
    pub ctx: Arc<Ctx>,
    pub keys: Arc<dyn KeySource>,
    pub ops: mpsc::Receiver<Op>,
    pub control: mpsc::UnboundedReceiver<Control>,
    pub events: mpsc::UnboundedReceiver<Event>,
    pub registered: watch::Sender<Option<String>>,
    pub state: watch::Sender<WorkerState>,
    pub cancel: CancellationToken,
}

pub(crate) struct Engine {
    ctx: Arc<Ctx>,
    keys: Arc<dyn KeySource>,
    ops: mpsc::Receiver<Op>,
    control: mpsc::UnboundedReceiver<Control>,
    events: mpsc::UnboundedReceiver<Event>,
    /// The heartbeat endpoint once registered (read by the heartbeat task).
    registered: Arc<watch::Sender<Option<String>>>,
    state: Arc<watch::Sender<WorkerState>>,
    cancel: CancellationToken,
    batcher: Batcher,
    batch_full: bool,
    flush_at: Option<Instant>,
    /// `None` while a recovery owns it.
    uplink: Option<Uplink>,
    recovery: Option<Recovery>,
    recovery_syncs: bool,
    held: Vec<Op>,
    held_overflow: bool,
    needs_register: bool,
    sync_wanted: bool,
    sync_due: Option<Instant>,
    failures: u32,
    flush_waiters: Vec<oneshot::Sender<Result<(), WorkerError>>>,
    unfinished_sync: Option<String>,
}

/// Awaits the running recovery; pending forever when there is none.
async fn recovery_done(slot: &mut Option<Recovery>) -> (Uplink, Result<(), RecoveryError>) {
    match slot {
        Some(recovery) => {
            let outcome = recovery.await;
            *slot = None;
            outcome
        }
        None => std::future::pending().await,
    }
}

fn op_count(msgs: &[Msg]) -> usize {
    msgs.iter()
        .map(|m| match m {
            Msg::BatchedKVOperationMsg(b) => b.operations.len(),
            _ => 0,
        })
        .sum()
}

impl Engine {
    pub(super) fn new(parts: Parts) -> Self {
        let batch_size = parts.ctx.config.batch_size;
        Engine {
            ctx: parts.ctx,
            keys: parts.keys,
            ops: parts.ops,
            control: parts.control,
            events: parts.events,
            registered: Arc::new(parts.registered),
            state: Arc::new(parts.state),
            cancel: parts.cancel,
            batcher: Batcher::new(batch_size),
            batch_full: false,
            flush_at: None,
            uplink: None,
            recovery: None,
            recovery_syncs: false,
            held: Vec::new(),
            held_overflow: false,
            needs_register: true,
            sync_wanted: false,
            sync_due: None,
            failures: 0,
            flush_waiters: Vec::new(),
            unfinished_sync: None,
        }
    }

    /// Runs until shutdown, cancellation, or every handle is dropped.
    pub(super) async fn run(mut self) {
        self.start_recovery();
        loop {
            let flush_at = self.flush_at;
            let sync_due = if self.recovery.is_none() {
                self.sync_due
            } else {
                None
            };
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => break,
                control = self.control.recv() => match control {
                    None => break,
                    Some(Control::Shutdown(done)) => {
                        self.shutdown().await;
                        let _ = done.send(());
                        break;
                    }
                    Some(Control::FullSync) => {
                        tracing::info!("full sync requested by the application");
                        self.schedule_sync();
                    }
                    Some(Control::Flush(reply)) => self.on_flush(reply).await,
                },
                Some(event) = self.events.recv() => self.on_event(event),
                outcome = recovery_done(&mut self.recovery) => self.on_recovered(outcome).await,
                () = sleep_until_opt(sync_due) => self.start_recovery(),
                () = sleep_until_opt(flush_at) => self.flush().await,
                op = self.ops.recv() => match op {
                    None => break,
                    Some(op) => self.on_ops(op).await,
                },
            }
            if self.ctx.overflow.swap(false, Ordering::AcqRel) {
                self.mark_dirty("the operation queue was full");
            }
        }
        self.recovery = None;
        self.cancel.cancel();
        for waiter in self.flush_waiters.drain(..) {
            let _ = waiter.send(Err(WorkerError::Closed));
        }
        self.state.send_replace(WorkerState::Stopped);
    }

    fn set_state(&self, state: WorkerState) {
        self.state.send_replace(state);
    }

    fn superseded(&self, n: usize) {
        add(&self.ctx.stats.ops_superseded, n);
    }

    fn is_registered(&self) -> bool {
        self.registered.borrow().is_some()
    }

    async fn on_ops(&mut self, first: Op) {
        self.on_op(first);
        for _ in 1..OPS_PER_TURN {
            match self.ops.try_recv() {
                Ok(op) => self.on_op(op),
                Err(_) => break,
            }
        }
        if self.batch_full {
            self.flush().await;
        }
    }

    fn holding(&self) -> bool {
        self.recovery.is_some() || self.sync_due.is_some()
    }

    fn on_op(&mut self, op: Op) {
        if self.holding() {
            self.hold(op);
        } else {
            self.batch_full |= self.batcher.push(op);
            if self.flush_at.is_none() {
                self.flush_at = Some(Instant::now() + self.ctx.config.flush_interval);
            }
        }
    }

    /// Holds `op` until the resync completes; past `max_held_ops`, drops every held op and
    /// asks for another sync (their effects are in the key source).
    fn hold(&mut self, op: Op) {
        if self.held_overflow {
            self.superseded(1);
        } else if self.held.len() >= self.ctx.config.max_held_ops {
            tracing::warn!(
                held = self.held.len(),
                "too many ops held during a resync: dropped, another full sync will follow"
            );
            self.superseded(self.held.len() + 1);
            self.held = Vec::new();
            self.held_overflow = true;
            self.sync_wanted = true;
        } else {
            self.held.push(op);
        }
    }

    /// Moves the batcher's unsent ops to the held ones.
    fn hold_pending(&mut self) {
        for op in self.batcher.take_ops() {
            self.hold(op);
        }
        self.flush_at = None;
        self.batch_full = false;
    }

    /// Pushes every pending op. A failed send schedules a full sync.
    async fn flush(&mut self) {
        self.flush_at = None;
        self.batch_full = false;
        if self.recovery.is_some() || self.batcher.pending() == 0 {
            return;
        }
        let c = &self.ctx.config;
        let msgs = self.batcher.drain(&c.instance_id, c.worker_id);
        let ctx = Arc::clone(&self.ctx);
        let uplink = self.uplink.get_or_insert_with(|| Uplink::new(&ctx));
        let result = uplink.push(&ctx, &msgs).await;
        let stats = &ctx.stats;
        match result {
            Ok(()) => {
                add(&stats.ops_sent, op_count(&msgs));
                add(&stats.batches_sent, msgs.len());
            }
            Err((sent, e)) => {
                add(&stats.ops_sent, op_count(&msgs[..sent]));
                add(&stats.batches_sent, sent);
                let lost = op_count(&msgs[sent..]);
                self.superseded(lost);
                inc(&stats.push_failures);
                self.mark_dirty(&format!("{lost} ops could not be sent: {e}"));
            }
        }
    }

    async fn on_flush(&mut self, reply: oneshot::Sender<Result<(), WorkerError>>) {
        for _ in 0..self.ctx.config.queue_capacity {
            match self.ops.try_recv() {
                Ok(op) => self.on_op(op),
                Err(_) => break,
            }
        }
        if !self.holding() {
            self.flush().await;
        }
        if self.holding() {
            // Answered when the resync completes (or fails).
            self.flush_waiters.push(reply);
        } else {
            let _ = reply.send(Ok(()));
        }
    }

    /// Something was lost: resynchronise (after the current recovery, if one runs).
    fn mark_dirty(&mut self, reason: &str) {
        tracing::warn!(
            instance = %self.ctx.config.instance_id, worker = self.ctx.config.worker_id,
            "resynchronising with a full sync: {reason}"
        );
        self.ctx.probe.notify_one();
        self.schedule_sync();
    }

    /// A full sync is wanted: due after the random startup delay, or after the running
    /// recovery.
    fn schedule_sync(&mut self) {
        self.sync_wanted = true;
        if self.recovery.is_some() || self.sync_due.is_some() {
            return;
        }
        let delay = self.ctx.config.full_sync.random_startup_delay();
        self.sync_due = Some(Instant::now() + delay);
        self.hold_pending();
        self.set_state(WorkerState::ResyncPending);
    }

    fn on_event(&mut self, event: Event) {
        let Event::FullSync { reason } = event;
        let forgotten = reason.as_deref() == Some(REASON_RE_REGISTERED);
        if self.recovery.is_none() {
            self.schedule_sync();
        } else if forgotten && self.is_registered() {
            // The controller restarted under the running recovery (and re-registered this
            // worker from the heartbeat): what it does now talks to a controller that knows
            // nothing of it. Start over.
            tracing::warn!("controller re-registered this worker during a resync: restarting it");
            self.recovery = None;
            self.uplink = None;
            self.needs_register = false;
            self.unfinished_sync = None;
            self.schedule_sync();
        } else if !self.recovery_syncs {
            self.sync_wanted = true;
        } else {
            tracing::debug!(?reason, "full sync already in progress: command skipped");
        }
    }

    fn start_recovery(&mut self) {
        let registered = self.is_registered();
        let plan = Plan {
            register: self.needs_register,
            sync: self.sync_wanted || (self.needs_register && registered),
            sync_if_keys: self.needs_register && !registered,
        };
        self.sync_wanted = false;
        self.sync_due = None;
        self.hold_pending();
        if self.held_overflow && plan.sync {
            // Every op dropped so far is in this recovery's snapshot: hold again from here.
            self.held_overflow = false;
        }
        let ctx = Arc::clone(&self.ctx);
        let uplink = self.uplink.take().unwrap_or_else(|| Uplink::new(&ctx));
        self.recovery_syncs = plan.sync || plan.sync_if_keys;
        self.set_state(if plan.register {
            WorkerState::Registering
        } else {
            WorkerState::Syncing
        });
        self.recovery = Some(Box::pin(recover(
            ctx,
            Arc::clone(&self.keys),
            uplink,
            plan,
            Arc::clone(&self.registered),
            Arc::clone(&self.state),
            self.unfinished_sync.take(),
        )));
    }

    async fn on_recovered(&mut self, (uplink, result): (Uplink, Result<(), RecoveryError>)) {
        self.uplink = Some(uplink);
        self.recovery_syncs = false;
        match result {
            Ok(()) => {
                self.failures = 0;
                self.needs_register = false;
                let held = std::mem::take(&mut self.held);
                if std::mem::take(&mut self.held_overflow) {
                    self.superseded(held.len());
                    self.sync_wanted = true;
                } else {
                    if !held.is_empty() {
                        tracing::debug!(ops = held.len(), "replaying ops held during the resync");
                    }
                    for op in held {
                        self.batch_full |= self.batcher.push(op);
                    }
                }
                self.set_state(WorkerState::Ready);
                self.flush().await;
                if self.sync_wanted {
                    self.schedule_sync();
                }
                if self.sync_due.is_none() {
                    for waiter in self.flush_waiters.drain(..) {
                        let _ = waiter.send(Ok(()));
                    }
                }
            }
            Err(e) => {
                self.failures = self.failures.saturating_add(1);
                inc(&self.ctx.stats.full_syncs_failed);
                let delay = self.ctx.config.retry_backoff.delay(self.failures);
                tracing::warn!(
                    instance = %self.ctx.config.instance_id, worker = self.ctx.config.worker_id,
                    failures = self.failures,
                    "resync failed: {}; re-registering and retrying in {delay:?}", e.reason
                );
                self.unfinished_sync = e.unfinished;
                self.needs_register = true;
                self.sync_wanted = true;
                self.sync_due = Some(Instant::now() + delay);
                self.set_state(WorkerState::ResyncPending);
                for waiter in self.flush_waiters.drain(..) {
                    let _ = waiter.send(Err(WorkerError::Resync(e.reason.clone())));
                }
            }
        }
    }

    /// Flushes (unless a resync makes the pending ops moot), deregisters, and returns.
    async fn shutdown(&mut self) {
        if self.holding() {
            // Deregistration removes every key anyway.
            self.recovery = None;
            self.superseded(self.held.len());
            self.held = Vec::new();
        } else {
            for _ in 0..self.ctx.config.queue_capacity {
                match self.ops.try_recv() {
                    Ok(op) => self.on_op(op),
                    Err(_) => break,
                }
            }
            self.flush().await;
        }
        if self.is_registered() {
            let ctx = Arc::clone(&self.ctx);
            let uplink = self.uplink.get_or_insert_with(|| Uplink::new(&ctx));
            match uplink.deregister(&ctx).await {
                Ok(()) => tracing::info!(
                    instance = %ctx.config.instance_id, worker = ctx.config.worker_id,
                    "deregistered"
                ),
                Err(e) => tracing::warn!("DeRegisterMsg not sent: {e}"),
            }
        }
    }
}

/// Runs `f` on the blocking pool (key sources may copy large sets).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, RecoveryError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RecoveryError {
            reason: format!("the key source failed: {e}"),
            unfinished: None,
        })
}

/// One recovery: register (retrying until accepted), then full-sync every location.
async fn recover(
    ctx: Arc<Ctx>,
    keys: Arc<dyn KeySource>,
    mut uplink: Uplink,
    plan: Plan,
    registered: Arc<watch::Sender<Option<String>>>,
    state: Arc<watch::Sender<WorkerState>>,
    mut carry: Option<String>,
) -> (Uplink, Result<(), RecoveryError>) {
    let result = async {
        if plan.register {
            register(&ctx, &mut uplink, &registered).await;
        }
        if !plan.sync && !plan.sync_if_keys {
            return Ok(());
        }
        let source = Arc::clone(&keys);
        let mut locations = blocking(move || source.locations()).await?;
        let mut seen = std::collections::HashSet::new();
        locations.retain(|l| seen.insert(l.clone()));
        let mut snapshots: Vec<(String, Vec<ChunkHash>)> = Vec::with_capacity(locations.len());
        for location in locations {
            let source = Arc::clone(&keys);
            let l = location.clone();
            let snapshot = blocking(move || source.keys(&l)).await?;
            snapshots.push((location, snapshot));
        }
        if !plan.sync && snapshots.iter().all(|(_, k)| k.is_empty()) {
            return Ok(());
        }
        state.send_replace(WorkerState::Syncing);
        let c = &ctx.config;
        for (location, snapshot) in snapshots {
            let sync_id = carry
                .take()
                .unwrap_or_else(|| new_sync_id(&c.instance_id, c.worker_id));
            full_sync::run(&ctx, &mut uplink, &location, &snapshot, sync_id)
                .await
                .map_err(|f| RecoveryError {
                    reason: format!("full sync of {location}: {}", f.reason),
                    unfinished: f.unfinished,
                })?;
        }
        Ok(())
    }
    .await;
    (uplink, result)
}

/// Registers, retrying with backoff until the controller accepts; publishes the heartbeat
/// endpoint.
async fn register(ctx: &Ctx, uplink: &mut Uplink, registered: &watch::Sender<Option<String>>) {
    let c = &ctx.config;
    let mut attempt = 0u32;
    loop {
        match uplink.register(ctx).await {
            Ok(heartbeat) => {
                inc(&ctx.stats.registrations);
                tracing::info!(
                    instance = %c.instance_id, worker = c.worker_id, ip = %ctx.ip, port = ctx.port,
                    heartbeat = %heartbeat, attempts = attempt + 1, "registered with the controller"
                );
                registered.send_replace(Some(heartbeat));
                return;
            }
            Err(e) => {
                attempt = attempt.saturating_add(1);
                let delay = c.retry_backoff.delay(attempt);
                if attempt == 1 || attempt.is_multiple_of(10) {
                    tracing::warn!(
                        instance = %c.instance_id, worker = c.worker_id, attempt,
                        "registration with {} failed: {e}; retrying in {delay:?}", c.controller_reply
                    );
                }
                tokio::time::sleep(delay).await;
            }
        }
    }
}
