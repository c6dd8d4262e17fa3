//! State shared by the worker's tasks and its handles: the fixed identity, the counters, and
//! the public [`WorkerStatus`] / [`WorkerState`] views of them.

use super::config::WorkerConfig;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::sync::Notify;

/// What the worker is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerState {
    /// Registering with the controller (retrying with backoff until it answers); ops are held.
    Registering,
    /// Registered; ops flow to the controller as they come.
    Ready,
    /// A full sync is due (after its random startup delay or a retry backoff); ops are held
    /// and replayed when it completes.
    ResyncPending,
    /// A full sync is running; ops are held and replayed when it completes.
    Syncing,
    /// Shut down.
    Stopped,
}

/// Counters since start, plus the current [`WorkerState`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerStatus {
    /// What the worker is doing now.
    pub state: WorkerState,
    /// Successful registrations (the first and every re-registration).
    pub registrations: u64,
    /// Admits and evicts accepted by the handle.
    pub ops_queued: u64,
    /// Ops sent to the controller.
    pub ops_sent: u64,
    /// Ops dropped because a full sync covers them: an undeliverable batch, held ops past
    /// `max_held_ops`, held ops dropped at shutdown.
    pub ops_superseded: u64,
    /// Ops refused by the handle because the queue was full.
    pub ops_rejected: u64,
    /// `BatchedKVOperationMsg`s sent.
    pub batches_sent: u64,
    /// PUSH sends that failed (each made the worker resynchronise).
    pub push_failures: u64,
    /// Full syncs started (one per location synced).
    pub full_syncs_started: u64,
    /// Full syncs the controller reported complete.
    pub full_syncs_completed: u64,
    /// Resyncs that failed (each is retried after a backoff, re-registering first).
    pub full_syncs_failed: u64,
    /// Heartbeats answered (periodic ones and probes).
    pub heartbeats_ok: u64,
    /// Heartbeats that got no answer.
    pub heartbeats_failed: u64,
    /// P2P lookups answered (hit or miss).
    pub lookups: u64,
    /// Lookups that found a peer.
    pub lookup_hits: u64,
    /// Lookups that failed (timeout, transport, controller error).
    pub lookup_failures: u64,
    /// Controller commands answered.
    pub commands: u64,
}

/// Atomic counters behind [`WorkerStatus`].
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub registrations: AtomicU64,
    pub ops_queued: AtomicU64,
    pub ops_sent: AtomicU64,
    pub ops_superseded: AtomicU64,
    pub ops_rejected: AtomicU64,
    pub batches_sent: AtomicU64,
    pub push_failures: AtomicU64,
    pub full_syncs_started: AtomicU64,
    pub full_syncs_completed: AtomicU64,
    pub full_syncs_failed: AtomicU64,
    pub heartbeats_ok: AtomicU64,
    pub heartbeats_failed: AtomicU64,
    pub lookups: AtomicU64,
    pub lookup_hits: AtomicU64,
    pub lookup_failures: AtomicU64,
    pub commands: AtomicU64,
}

/// Adds `n` to a counter.
pub(crate) fn add(counter: &AtomicU64, n: usize) {
    counter.fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// Adds one to a counter.
pub(crate) fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Stats {
    /// A snapshot with `state`.
    pub(super) fn status(&self, state: WorkerState) -> WorkerStatus {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WorkerStatus {
            state,
            registrations: get(&self.registrations),
            ops_queued: get(&self.ops_queued),
            ops_sent: get(&self.ops_sent),
            ops_superseded: get(&self.ops_superseded),
            ops_rejected: get(&self.ops_rejected),
            batches_sent: get(&self.batches_sent),
            push_failures: get(&self.push_failures),
            full_syncs_started: get(&self.full_syncs_started),
            full_syncs_completed: get(&self.full_syncs_completed),
            full_syncs_failed: get(&self.full_syncs_failed),
            heartbeats_ok: get(&self.heartbeats_ok),
            heartbeats_failed: get(&self.heartbeats_failed),
            lookups: get(&self.lookups),
            lookup_hits: get(&self.lookup_hits),
            lookup_failures: get(&self.lookup_failures),
            commands: get(&self.commands),
        }
    }
}

/// The worker's fixed facts and shared signals.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub config: WorkerConfig,
    /// The ip registered for the command socket.
    pub ip: String,
    /// The command socket's bound port.
    pub port: u16,
    pub stats: Stats,
    /// Something failed that may mean the controller restarted: heartbeat now.
    pub probe: Notify,
    /// The handle could not queue an op: the engine must resynchronise.
    pub overflow: AtomicBool,
}
