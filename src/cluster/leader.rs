//! The leader's side of a service's log: [`ChangeLog`] numbers every change the leader
//! applies, in the order it applies them, and queues the records for one publisher, which
//! sends them in order with a window of unacknowledged publishes ([`super::ACK_WINDOW`]).
//!
//! The service calls [`ChangeLog::record`] where it applies the change (under its state lock,
//! or in the one task that owns the state), so records are in apply order. A change is encoded
//! before the log's own lock is taken; only its number and header are written under it. A
//! change larger than NATS takes is cut ([`Replicated::split`]) or, if it cannot be, dropped;
//! a full queue drops the record. Either way the record keeps its number, so followers see the
//! gap; every loss is counted. When the service stops, the publisher sends what is queued
//! (bounded by the cluster's timeout) before it ends.
//!
//! Must not: block the caller on NATS; know what a change means.

use super::record::Body;
use super::replicated::Replicated;
use super::status::{ClusterStatus, LogStats};
use super::takeover::RECORD_OVERHEAD;
use super::{now_ms, Cluster, PublishStats, ACK_WINDOW};
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::future::IntoFuture;
use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Records queued for publishing at most; beyond, one is dropped (counted).
pub const RECORD_QUEUE: usize = 65_536;
/// Bytes of records queued for publishing at most (the same rule).
pub const MAX_QUEUED_BYTES: u64 = 64 << 20;
/// After the service stops, how long its last records may still come.
const STOP_GRACE: Duration = Duration::from_millis(50);

/// The leader's log: numbers and queues every change it applies.
pub struct ChangeLog<S> {
    epoch: u64,
    /// The last record's number; records are numbered and queued under it, so the queue holds
    /// them in number order whoever logs.
    seq: Mutex<u64>,
    max_change_bytes: usize,
    tx: mpsc::Sender<Bytes>,
    stats: Arc<LogStats>,
    _state: PhantomData<fn() -> S>,
}

impl<S> std::fmt::Debug for ChangeLog<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeLog")
            .field("epoch", &self.epoch)
            .field("seq", &*self.seq.lock())
            .finish_non_exhaustive()
    }
}

impl<S: Replicated> ChangeLog<S> {
    /// A log of `epoch` whose last record so far is `last_seq`, publishing through
    /// `cluster` on `tasks` until `stop` (then what is queued is sent) and counting in
    /// `status`.
    pub fn start(
        cluster: &Cluster,
        status: &ClusterStatus,
        epoch: u64,
        last_seq: u64,
        stop: CancellationToken,
        tasks: &TaskTracker,
    ) -> Self {
        let (tx, rx) = mpsc::channel(RECORD_QUEUE);
        spawn_publisher(
            cluster.clone(),
            S::SERVICE,
            rx,
            Arc::clone(&status.published),
            Arc::clone(&status.log),
            stop,
            tasks,
        );
        Self::new(
            epoch,
            last_seq,
            cluster.max_message_bytes().saturating_sub(RECORD_OVERHEAD),
            tx,
            Arc::clone(&status.log),
        )
    }

    /// A log of `epoch` whose last record so far is `last_seq`; records go to `tx`, each
    /// change at most `max_change_bytes` (larger ones are cut).
    pub fn new(
        epoch: u64,
        last_seq: u64,
        max_change_bytes: usize,
        tx: mpsc::Sender<Bytes>,
        stats: Arc<LogStats>,
    ) -> Self {
        ChangeLog {
            epoch,
            seq: Mutex::new(last_seq),
            max_change_bytes,
            tx,
            stats,
            _state: PhantomData,
        }
    }

    /// The epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The last record's number.
    pub fn last_seq(&self) -> u64 {
        *self.seq.lock()
    }

    /// Logs `change`, applied at `now` (the leader's clock, Unix seconds). Call it where the
    /// change is applied (see the module docs). Never blocks on NATS.
    pub fn record(&self, now: f64, change: &S::Change) {
        let body = Body::encode(change);
        if body.len() > self.max_change_bytes {
            if let Some((a, b)) = S::split(change) {
                self.record(now, &a);
                self.record(now, &b);
                return;
            }
        }
        let mut seq = self.seq.lock();
        // A change that is not sent still takes its number: followers must see the gap.
        *seq += 1;
        if body.len() > self.max_change_bytes {
            self.stats.oversize.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                service = S::SERVICE,
                bytes = body.len(),
                "a change is larger than NATS takes: not replicated (followers see a gap)"
            );
            return;
        }
        let bytes = body.frame(self.epoch, *seq, now_ms(), now);
        let len = bytes.len() as u64;
        let held = self.stats.queued_bytes.load(Ordering::Relaxed);
        if held + len > MAX_QUEUED_BYTES || self.tx.try_send(bytes).is_err() {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            self.stats.queued_bytes.fetch_add(len, Ordering::Relaxed);
            self.stats.queued.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Sends `service`'s records from `rx`, in order, with up to [`ACK_WINDOW`] acknowledgements
/// outstanding, until `rx` closes or `stop` — then, after a short grace for the last records,
/// it sends what is queued (within the cluster's timeout) and ends.
fn spawn_publisher(
    cluster: Cluster,
    service: &'static str,
    mut rx: mpsc::Receiver<Bytes>,
    stats: Arc<PublishStats>,
    log: Arc<LogStats>,
    stop: CancellationToken,
    tasks: &TaskTracker,
) {
    let subject = cluster.subject(service);
    tasks.spawn(async move {
        let mut pending = VecDeque::new();
        let taken = |b: &Bytes| {
            log.queued_bytes
                .fetch_sub(b.len() as u64, Ordering::Relaxed);
        };
        loop {
            let payload = tokio::select! {
                p = rx.recv() => match p {
                    Some(p) => p,
                    None => break,
                },
                () = stop.cancelled() => {
                    let drain = async {
                        tokio::time::sleep(STOP_GRACE).await;
                        while let Ok(b) = rx.try_recv() {
                            taken(&b);
                            publish(&cluster, &subject, b, &mut pending, &stats).await;
                        }
                        while !pending.is_empty() {
                            settle_one(&mut pending, &stats, &subject).await;
                        }
                    };
                    let deadline = cluster.config().timeout;
                    if tokio::time::timeout(deadline, drain).await.is_err() {
                        tracing::warn!("cluster: {service} records not all sent at stop");
                    }
                    return;
                }
            };
            taken(&payload);
            publish(&cluster, &subject, payload, &mut pending, &stats).await;
            // Settle acknowledgements: all of them while the queue is empty, else those
            // beyond the window.
            while pending.len() > ACK_WINDOW || (rx.is_empty() && !pending.is_empty()) {
                settle_one(&mut pending, &stats, &subject).await;
            }
        }
        while !pending.is_empty() {
            settle_one(&mut pending, &stats, &subject).await;
        }
    });
}

type Ack = <async_nats::jetstream::context::PublishAckFuture as IntoFuture>::IntoFuture;

async fn publish(
    cluster: &Cluster,
    subject: &str,
    payload: Bytes,
    pending: &mut VecDeque<Ack>,
    stats: &PublishStats,
) {
    match cluster.js.publish(subject.to_owned(), payload).await {
        Ok(ack) => pending.push_back(ack.into_future()),
        Err(e) => {
            stats.failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("cluster publish to {subject} failed: {e}");
        }
    }
}

/// Waits for the oldest acknowledgement.
async fn settle_one(pending: &mut VecDeque<Ack>, stats: &PublishStats, subject: &str) {
    let Some(ack) = pending.pop_front() else {
        return;
    };
    match ack.await {
        Ok(_) => stats.acked.fetch_add(1, Ordering::Relaxed),
        Err(e) => {
            tracing::warn!("cluster publish to {subject} not acknowledged: {e}");
            stats.failed.fetch_add(1, Ordering::Relaxed)
        }
    };
}
