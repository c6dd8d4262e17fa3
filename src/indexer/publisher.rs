//! One task pair per publisher endpoint: a receiver that moves messages from the SUB socket
//! into a bounded queue, and an applier that runs the sequence state machine, replays over
//! DEALER, decodes and applies. A publisher that stalls only stalls its own tasks.
//!
//! When the queue is full (by messages or by bytes) the receiver waits and stops reading the
//! socket: the burst stays in the kernel's socket buffers and in the publisher's own send
//! queue (vLLM's PUB holds up to 100,000 messages, its high-water mark), not in kvplane, and
//! arrives in order once the applier catches up. Only what the publisher itself drops past
//! its high-water mark shows up as a gap, which a replay repairs. So a flood costs the
//! flooding publisher's own latency, never kvplane's memory or another publisher's queue.
//!
//! A publisher that connects to a bound socket (`--bind`, [`super::central`]) has no receiver
//! of its own: the bound socket's task hands its messages to the same applier through
//! [`ApplierQueue::offer`], which never waits (the socket is shared, so one publisher's full queue must
//! not stall the others): a message that finds the queue full is dropped and counted, and the
//! gap it leaves is replayed like any other.
//!
//! Events reach the index through [`IndexerState::apply_where`] (and restarts through
//! `clear_where`): every stream the publisher feeds, or those a filter picks.

use super::{IndexerState, PublisherStatus};
use crate::indexer::model::events::decode_batch;
use crate::indexer::model::events::KvEvent;
use crate::indexer::model::frames::{self, ReplayReply};
use crate::indexer::model::index::{Index, StreamId};
use crate::indexer::model::mooncake::EventOrder;
use crate::indexer::model::replica::{Change, Core};
use crate::indexer::model::seq::{SeqConfig, SeqStep, SeqTracker};
use crate::transport::{ReplayClient, Subscriber, SubscriberEvent, TransportLimits};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

/// What the receiver hands the applier.
enum Inbound {
    Connected,
    Disconnected,
    Live(Vec<Bytes>),
}

/// Everything a publisher's tasks need.
pub(crate) struct PublisherTask {
    pub(crate) id: u32,
    pub(crate) endpoint: String,
    pub(crate) replay_endpoint: Option<String>,
    pub(crate) seq: SeqConfig,
    pub(crate) status: Arc<PublisherStatus>,
    pub(crate) cancel: CancellationToken,
}

/// The live queue's byte budget: a message takes its size in permits (at most the whole
/// budget, so that one larger than it still passes, alone) until the applier takes it.
#[derive(Clone)]
struct Budget {
    room: Arc<Semaphore>,
    max: usize,
}

impl Budget {
    fn new(max_bytes: usize) -> Self {
        let max = max_bytes.clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
        Self {
            room: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    fn permits(&self, frames: &[Bytes]) -> u32 {
        size(frames).clamp(1, self.max) as u32
    }

    /// Gives back a dequeued message's bytes.
    fn release(&self, frames: &[Bytes], status: &PublisherStatus) {
        status
            .queued_bytes
            .fetch_sub(size(frames), Ordering::AcqRel);
        self.room.add_permits(self.permits(frames) as usize);
    }
}

/// The way into a publisher's applier: its queue and the queue's byte budget.
#[derive(Clone)]
pub(crate) struct ApplierQueue {
    tx: mpsc::Sender<Inbound>,
    budget: Budget,
    status: Arc<PublisherStatus>,
}

/// What became of a message offered to an [`ApplierQueue`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Offer {
    /// Queued for the applier.
    Queued,
    /// The queue was full (by messages or bytes): dropped and counted.
    Dropped,
    /// The applier is gone (unregistered, or taken over by a registration).
    Closed,
}

impl ApplierQueue {
    /// Tells the applier a publisher appeared (as a SUB connection coming up does): it
    /// replays from the first number when it can. False when the applier is gone.
    pub(crate) fn offer_connected(&self) -> bool {
        self.status.connected.store(true, Ordering::Relaxed);
        self.status.connects.fetch_add(1, Ordering::Relaxed);
        match self.tx.try_send(Inbound::Connected) {
            Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => true,
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Whether the applier is gone.
    pub(crate) fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Queues a live message without waiting; a full queue drops it (counted in
    /// `queue_full` and `dropped`; the sequence gap it leaves is replayed).
    pub(crate) fn offer(&self, frames: Vec<Bytes>) -> Offer {
        if self.tx.is_closed() {
            return Offer::Closed;
        }
        let dropped = || {
            self.status.queue_full.fetch_add(1, Ordering::Relaxed);
            self.status.dropped.fetch_add(1, Ordering::Relaxed);
            Offer::Dropped
        };
        let n = self.budget.permits(&frames);
        let Ok(permit) = self.budget.room.try_acquire_many(n) else {
            return dropped();
        };
        let bytes = size(&frames);
        match self.tx.try_send(Inbound::Live(frames)) {
            Ok(()) => {
                permit.forget();
                self.status.queued_bytes.fetch_add(bytes, Ordering::AcqRel);
                Offer::Queued
            }
            Err(mpsc::error::TrySendError::Full(_)) => dropped(),
            Err(mpsc::error::TrySendError::Closed(_)) => Offer::Closed,
        }
    }
}

/// Spawns the applier, and with `subscribe` the receiver that connects to the publisher's
/// endpoint, on the state's task tracker. Returns the applier's feed and the receiver's own
/// cancellation (a child of the task's: a registration that learns the publisher connects to
/// a bound socket stops the receiver and keeps the applier).
pub(crate) fn spawn(
    state: &Arc<IndexerState>,
    task: PublisherTask,
    subscribe: bool,
) -> (ApplierQueue, CancellationToken) {
    let (tx, rx) = mpsc::channel(state.config.queue_capacity.max(1));
    let budget = Budget::new(state.config.max_queued_bytes);
    let receiver = task.cancel.child_token();
    let feed = ApplierQueue {
        tx: tx.clone(),
        budget: budget.clone(),
        status: Arc::clone(&task.status),
    };
    if subscribe {
        let limits = TransportLimits::with_max_frame_bytes(state.config.max_frame_bytes);
        state.tasks.spawn(receive(
            task.endpoint.clone(),
            limits,
            budget.clone(),
            tx,
            Arc::clone(&task.status),
            receiver.clone(),
        ));
    }
    state
        .tasks
        .spawn(apply_loop(Arc::clone(state), task, rx, budget));
    (feed, receiver)
}

fn size(frames: &[Bytes]) -> usize {
    frames.iter().map(Bytes::len).sum()
}

async fn receive(
    endpoint: String,
    limits: TransportLimits,
    budget: Budget,
    tx: mpsc::Sender<Inbound>,
    status: Arc<PublisherStatus>,
    cancel: CancellationToken,
) {
    let connected = tokio::select! {
        () = cancel.cancelled() => return,
        s = Subscriber::connect(&endpoint, &limits) => s,
    };
    let mut sub = match connected {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(%endpoint, "cannot subscribe: {e}");
            *status.error.lock() = Some(e.to_string());
            return;
        }
    };
    loop {
        let event = tokio::select! {
            () = cancel.cancelled() => return,
            e = sub.next() => e,
        };
        let inbound = match event {
            Ok(SubscriberEvent::Message(frames)) => Inbound::Live(frames),
            Ok(SubscriberEvent::Connected) => {
                status.connected.store(true, Ordering::Relaxed);
                status.connects.fetch_add(1, Ordering::Relaxed);
                Inbound::Connected
            }
            Ok(SubscriberEvent::Disconnected) => {
                status.connected.store(false, Ordering::Relaxed);
                Inbound::Disconnected
            }
            Err(e) => {
                tracing::warn!(%endpoint, "subscriber failed: {e}");
                *status.error.lock() = Some(e.to_string());
                return;
            }
        };
        // A live message that finds the queue full, by bytes or by slots, is counted once.
        let mut waited = false;
        if let Inbound::Live(frames) = &inbound {
            // Wait for byte room (the socket is not read meanwhile: the publisher holds the
            // rest).
            let n = budget.permits(frames);
            let permit = match budget.room.try_acquire_many(n) {
                Ok(p) => p,
                Err(_) => {
                    status.queue_full.fetch_add(1, Ordering::Relaxed);
                    waited = true;
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        p = budget.room.acquire_many(n) => match p { Ok(p) => p, Err(_) => return },
                    }
                }
            };
            permit.forget();
            status
                .queued_bytes
                .fetch_add(size(frames), Ordering::AcqRel);
        }
        // And for a slot in the queue: connection changes must not be lost either.
        let sent = match tx.try_send(inbound) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => return,
            Err(mpsc::error::TrySendError::Full(inbound)) => {
                if matches!(inbound, Inbound::Live(_)) && !waited {
                    status.queue_full.fetch_add(1, Ordering::Relaxed);
                }
                tokio::select! {
                    () = cancel.cancelled() => return,
                    r = tx.send(inbound) => r,
                }
            }
        };
        if sent.is_err() {
            return;
        }
    }
}

struct Applier {
    state: Arc<IndexerState>,
    task: PublisherTask,
    tracker: SeqTracker<Bytes>,
    replay: Option<ReplayClient>,
    rx: mpsc::Receiver<Inbound>,
    budget: Budget,
    /// Message bytes applied since the queue was last empty with a heap trim done.
    burst: usize,
    /// The `event_id` order of each backend of its standardized events.
    order: EventOrder,
}

async fn apply_loop(
    state: Arc<IndexerState>,
    task: PublisherTask,
    rx: mpsc::Receiver<Inbound>,
    budget: Budget,
) {
    let mut a = Applier {
        tracker: SeqTracker::new(task.seq),
        replay: task.replay_endpoint.clone().map(ReplayClient::new),
        state,
        task,
        rx,
        budget,
        burst: 0,
        order: EventOrder::default(),
    };
    loop {
        // After a burst, once the queue is empty: give the freed message memory back to the
        // system (retried every interval while idle, as trims are rate-limited process-wide).
        if a.burst >= crate::memory::MIN_BURST_BYTES
            && a.task.status.queued_bytes.load(Ordering::Acquire) == 0
            && crate::memory::after_burst(a.burst)
        {
            a.burst = 0;
        }
        let retry = std::time::Duration::from_millis(crate::memory::MIN_INTERVAL_MS);
        let inbound = tokio::select! {
            () = a.task.cancel.cancelled() => return,
            m = a.rx.recv() => match m { Some(m) => m, None => return },
            () = tokio::time::sleep(retry), if a.burst >= crate::memory::MIN_BURST_BYTES => continue,
        };
        a.dequeued(&inbound);
        let steps = match inbound {
            Inbound::Connected => a.tracker.on_connect(),
            Inbound::Disconnected => Vec::new(),
            Inbound::Live(frames) => match a.live(&frames) {
                Some((seq, payload)) => a.tracker.on_live(seq, payload),
                None => Vec::new(),
            },
        };
        if !a.run(steps).await {
            return;
        }
        a.publish_status();
    }
}

impl Applier {
    /// Releases a dequeued message's bytes from the queue's budget.
    fn dequeued(&mut self, inbound: &Inbound) {
        if let Inbound::Live(frames) = inbound {
            self.budget.release(frames, &self.task.status);
            self.burst = self.burst.saturating_add(size(frames));
        }
    }

    fn live(&self, frames: &[Bytes]) -> Option<(u64, Bytes)> {
        match frames::split(frames) {
            Ok(x) => Some(x),
            Err(e) => {
                self.state.metrics.frame_dropped(e.reason());
                None
            }
        }
    }

    fn publish_status(&self) {
        let st = &self.task.status;
        st.last_seq
            .store(self.tracker.last().unwrap_or(u64::MAX), Ordering::Relaxed);
        st.replaying
            .store(self.tracker.replaying(), Ordering::Relaxed);
        *st.seq.lock() = self.tracker.counters();
    }

    /// Carries out steps (and the steps they lead to); false when cancelled.
    async fn run(&mut self, steps: Vec<SeqStep<Bytes>>) -> bool {
        let mut queue: VecDeque<SeqStep<Bytes>> = steps.into();
        while let Some(step) = queue.pop_front() {
            match step {
                SeqStep::Apply(_, payload) => self.apply(&payload),
                SeqStep::Clear => self.state.clear_where(self.task.id, |_, _| true, &[]),
                SeqStep::Replay(from) => {
                    self.publish_status();
                    match self.replay(from).await {
                        Some(more) => queue.extend(more),
                        None => return false,
                    }
                }
            }
        }
        true
    }

    fn apply(&mut self, payload: &[u8]) {
        match decode_batch(payload) {
            Ok(batch) => {
                for (_, e) in &batch.rejected {
                    self.state.metrics.event_rejected(e.reason());
                }
                if batch.envelopes.iter().all(Option::is_none) {
                    self.state
                        .apply_where(self.task.id, |_, _| true, &[], &batch.events);
                } else {
                    self.state
                        .apply_standard(self.task.id, &mut self.order, batch);
                    *self.task.status.backends.lock() = self.order.backends();
                }
            }
            Err(e) => self.state.metrics.frame_dropped(e.reason()),
        }
    }

    /// One replay attempt from `from`; returns the steps that follow (None: cancelled).
    async fn replay(&mut self, from: u64) -> Option<Vec<SeqStep<Bytes>>> {
        let timeout = self.state.config.replay_timeout;
        let Some(client) = self.replay.as_mut() else {
            return Some(self.tracker.on_replay_failed());
        };
        let sent = tokio::select! {
            () = self.task.cancel.cancelled() => return None,
            r = client.request(from, timeout) => r,
        };
        if let Err(e) = sent {
            tracing::debug!(endpoint = client.endpoint(), "replay request failed: {e}");
            client.reset();
            return self.failed().await;
        }
        let mut replies = 0usize;
        let max_replies = self.task.seq.max_buffered.saturating_mul(2).max(1);
        let mut deadline = tokio::time::Instant::now() + timeout;
        loop {
            let Some(client) = self.replay.as_mut() else {
                return Some(Vec::new());
            };
            tokio::select! {
                () = self.task.cancel.cancelled() => return None,
                () = tokio::time::sleep_until(deadline) => {
                    client.reset();
                    return self.failed().await;
                }
                reply = client.recv() => {
                    let frames = match reply {
                        Ok(f) => f,
                        Err(_) => return self.failed().await,
                    };
                    deadline = tokio::time::Instant::now() + timeout;
                    replies += 1;
                    match frames::replay_reply(&frames) {
                        Ok(ReplayReply::End) => return Some(self.tracker.on_replay_end()),
                        Ok(ReplayReply::Batch(seq, payload)) => {
                            self.tracker.on_replay(seq, payload);
                        }
                        Err(e) => self.state.metrics.frame_dropped(e.reason()),
                    }
                    if replies > max_replies {
                        client.reset();
                        return self.failed().await;
                    }
                }
                live = self.rx.recv() => match live {
                    Some(Inbound::Live(frames)) => {
                        self.budget.release(&frames, &self.task.status);
                        if let Some((seq, payload)) = self.live(&frames) {
                            // Buffered by the tracker while the replay runs.
                            let steps = self.tracker.on_live(seq, payload);
                            debug_assert!(steps.is_empty());
                        }
                    }
                    Some(_) => {}
                    None => return None,
                },
            }
        }
    }

    /// A failed attempt: back off a little, then the tracker decides (retry or clear).
    async fn failed(&mut self) -> Option<Vec<SeqStep<Bytes>>> {
        tokio::select! {
            () = self.task.cancel.cancelled() => return None,
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        Some(self.tracker.on_replay_failed())
    }
}

/// How a publisher's events reach the index: every stream it feeds, or those a filter picks
/// (a Mooncake backend's readers, [`super::backends`]), plus streams fed across publishers.
impl IndexerState {
    /// Applies events from publisher `id` to the streams it feeds and `extra` that `keep`
    /// selects; returns how many streams that was.
    pub(super) fn apply_where(
        &self,
        id: u32,
        keep: impl Fn(&Index, StreamId) -> bool,
        extra: &[StreamId],
        events: &[KvEvent],
    ) -> usize {
        let now = self.now_secs();
        let mut core = self.core.write();
        let Core { index, routes, .. } = &mut *core;
        let own = routes.get(&id).map_or(&[][..], Vec::as_slice);
        let streams: Vec<StreamId> = own
            .iter()
            .chain(extra)
            .copied()
            .filter(|s| keep(index, *s))
            .collect();
        if streams.is_empty() {
            return 0;
        }
        for ev in events {
            for s in &streams {
                index.apply(*s, ev, now);
            }
        }
        if self.role.records() {
            self.role.record(Change::Apply {
                streams: streams.iter().map(|s| s.0).collect(),
                events: events.to_vec(),
                now,
            });
        }
        drop(core);
        self.metrics
            .events_applied
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        streams.len()
    }

    /// Drops every block of the streams publisher `id` feeds and `extra` that `keep` selects
    /// (a restart: of the publisher, or of one backend it carries).
    pub(super) fn clear_where(
        &self,
        id: u32,
        keep: impl Fn(&Index, StreamId) -> bool,
        extra: &[StreamId],
    ) {
        let mut core = self.core.write();
        let Core { index, routes, .. } = &mut *core;
        let own = routes.get(&id).map_or(&[][..], Vec::as_slice);
        let chosen: Vec<StreamId> = own
            .iter()
            .chain(extra)
            .copied()
            .filter(|s| keep(index, *s))
            .collect();
        for s in chosen {
            index.clear_stream(s, None);
            self.role.record(Change::ClearStream {
                stream: s.0,
                tier: None,
            });
        }
    }
}
