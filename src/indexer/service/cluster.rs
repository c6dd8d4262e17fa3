//! `--cluster` for the indexer (docs/CLUSTER.md). The ingester publishes every change it
//! applies to its index ([`Change`], as an [`Op`] of its epoch) to the cluster's `indexer`
//! stream, in apply order; a read replica (`--replica`) reads that stream from the start and
//! applies the same ops to its own index through a [`Follower`], answering `/query` and
//! `/query_by_hash` with the lag it reports on `/readyz` and `/metrics`.

use super::metrics::Text;
use super::IndexerState;
use crate::cluster::{self, now_ms, Cluster, PublishStats, ReaderStatus};
use crate::indexer::index::IndexConfig;
use crate::indexer::replica::{Applied, Change, Follower, Op};
use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The service's name in the cluster's stream and subject names.
pub(crate) const SERVICE: &str = "indexer";
/// Ops queued for publishing at most; beyond, an op is dropped (counted) and replicas see
/// the gap.
pub(crate) const OP_QUEUE: usize = 65_536;
/// Ops read but not yet applied by a replica at most.
const APPLY_QUEUE: usize = 1024;

/// What this indexer is in its cluster.
pub(crate) enum Role {
    /// No `--cluster`.
    Standalone,
    /// Ingests from publishers and publishes its changes.
    Ingester(Leader),
    /// Follows an ingester's changes; takes no registrations.
    Replica(Replica),
}

/// The ingester's side of the change log.
pub(crate) struct Leader {
    cluster: Cluster,
    epoch: u64,
    /// The last op's number; only changed under the index's write lock, so ops are numbered
    /// in apply order.
    seq: AtomicU64,
    /// Largest op published whole (the server's `max_payload` when it was joined).
    max_op_bytes: usize,
    tx: mpsc::Sender<Bytes>,
    dropped: AtomicU64,
    stats: Arc<PublishStats>,
}

/// A replica's side of the change log.
pub(crate) struct Replica {
    cluster: Cluster,
    /// Locked after the index's lock, never before.
    follower: Mutex<Follower>,
    status: Arc<ReaderStatus>,
    applied: AtomicU64,
    /// Every delivered message handled (applied, stale or bad): with the reader's delivered
    /// count, whether the applier has caught up with the reader.
    processed: AtomicU64,
    bad_ops: AtomicU64,
}

/// Where a replica stands, as `/readyz` and `/metrics` report it.
struct Progress {
    reading: bool,
    /// Ops in the stream or delivered, not yet applied.
    pending: u64,
    lag_ms: u64,
    in_sync: bool,
    epoch: Option<u64>,
    applied_seq: u64,
    gaps: u64,
}

impl Replica {
    fn progress(&self) -> Progress {
        let (in_sync, (epoch, applied_seq), at_ms, gaps) = {
            let f = self.follower.lock();
            (f.in_sync(), f.position(), f.last_at_ms(), f.gaps())
        };
        let (pending, lag_ms) = self
            .status
            .lag(self.processed.load(Ordering::Relaxed), at_ms);
        Progress {
            reading: self.status.reading.load(Ordering::Relaxed) && self.cluster.connected(),
            pending,
            lag_ms,
            in_sync,
            epoch,
            applied_seq,
            gaps,
        }
    }
}

impl Role {
    /// Joins the cluster as an ingester or a replica, or stays standalone.
    ///
    /// # Errors
    /// When NATS cannot be reached or its stream set up.
    pub(crate) async fn join(
        config: Option<&cluster::ClusterConfig>,
        replica: bool,
        index: IndexConfig,
    ) -> Result<(Role, Option<mpsc::Receiver<Bytes>>), cluster::ClusterError> {
        let Some(config) = config else {
            return Ok((Role::Standalone, None));
        };
        let cluster = Cluster::connect(config.clone()).await?;
        cluster.ensure_stream(SERVICE).await?;
        if replica {
            return Ok((
                Role::Replica(Replica {
                    cluster,
                    follower: Mutex::new(Follower::new(index)),
                    status: Arc::default(),
                    applied: AtomicU64::new(0),
                    processed: AtomicU64::new(0),
                    bad_ops: AtomicU64::new(0),
                }),
                None,
            ));
        }
        let (tx, rx) = mpsc::channel(OP_QUEUE);
        let max_op_bytes = cluster.max_message_bytes();
        Ok((
            Role::Ingester(Leader {
                cluster,
                epoch: rand::random::<u64>() >> 1,
                seq: AtomicU64::new(0),
                max_op_bytes,
                tx,
                dropped: AtomicU64::new(0),
                stats: Arc::default(),
            }),
            Some(rx),
        ))
    }

    /// Whether this indexer follows another and takes no registrations.
    pub(crate) fn is_replica(&self) -> bool {
        matches!(self, Role::Replica(_))
    }

    /// Whether changes must be recorded (cloning events costs only then).
    pub(crate) fn records(&self) -> bool {
        matches!(self, Role::Ingester(_))
    }

    /// Records a change just applied. Call with the index's write lock held (so ops are
    /// numbered in apply order by one writer at a time). An `Apply` whose op would be larger
    /// than NATS takes is split into several, in order.
    pub(crate) fn record(&self, change: Change) {
        let Role::Ingester(l) = self else { return };
        let seq = l.seq.load(Ordering::Relaxed) + 1;
        let op = Op {
            epoch: l.epoch,
            seq,
            at_ms: now_ms(),
            change,
        };
        let bytes = match op.encode() {
            Ok(b) if b.len() <= l.max_op_bytes => Some(b),
            Ok(b) => {
                if let Change::Apply {
                    streams,
                    events,
                    now,
                } = op.change
                {
                    if events.len() > 1 {
                        // Not numbered: the halves take this number and the next.
                        let mut first = events;
                        let second = first.split_off(first.len() / 2);
                        for events in [first, second] {
                            self.record(Change::Apply {
                                streams: streams.clone(),
                                events,
                                now,
                            });
                        }
                        return;
                    }
                }
                tracing::warn!(
                    bytes = b.len(),
                    "an index change too large for NATS was not published"
                );
                None
            }
            Err(_) => None,
        };
        // Numbered even when lost, so replicas see the gap.
        l.seq.store(seq, Ordering::Relaxed);
        let sent = bytes.is_some_and(|b| l.tx.try_send(Bytes::from(b)).is_ok());
        if !sent {
            l.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Starts the tasks of `state`'s role: the ingester's publisher, or the replica's reader and
/// applier.
pub(crate) fn spawn(
    state: &Arc<IndexerState>,
    ops: Option<mpsc::Receiver<Bytes>>,
    cancel: &CancellationToken,
    tasks: &TaskTracker,
) {
    match &state.role {
        Role::Standalone => {}
        Role::Ingester(l) => {
            if let Some(rx) = ops {
                cluster::spawn_publisher(
                    l.cluster.clone(),
                    SERVICE,
                    rx,
                    Arc::clone(&l.stats),
                    cancel.clone(),
                    tasks,
                );
            }
        }
        Role::Replica(r) => {
            let (tx, mut rx) = mpsc::channel(APPLY_QUEUE);
            cluster::spawn_reader(
                r.cluster.clone(),
                SERVICE,
                1,
                tx,
                Arc::clone(&r.status),
                cancel.clone(),
                tasks,
            );
            let st = Arc::clone(state);
            let cancel = cancel.clone();
            tasks.spawn(async move {
                loop {
                    let payload = tokio::select! {
                        () = cancel.cancelled() => return,
                        d = rx.recv() => match d {
                            Some((_, d)) => d,
                            None => return,
                        },
                    };
                    st.follow(&payload);
                }
            });
        }
    }
}

impl IndexerState {
    /// A replica applies one published op.
    fn follow(&self, payload: &[u8]) {
        let Role::Replica(r) = &self.role else { return };
        let Ok(op) = Op::decode(payload) else {
            r.bad_ops.fetch_add(1, Ordering::Relaxed);
            r.processed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let outcome = {
            let mut core = self.core.write();
            r.follower.lock().apply(&mut core.index, &op)
        };
        if outcome != Applied::Stale {
            r.applied.fetch_add(1, Ordering::Relaxed);
            if let Change::Apply { events, .. } = &op.change {
                self.metrics
                    .events_applied
                    .fetch_add(events.len() as u64, Ordering::Relaxed);
            }
        }
        r.processed.fetch_add(1, Ordering::Relaxed);
    }
}

/// `GET /readyz`: whether this indexer answers queries from a complete index, and its lag.
pub(crate) fn readyz(state: &IndexerState) -> (bool, Value) {
    match &state.role {
        Role::Standalone => (true, json!({"ready": true, "role": "standalone"})),
        Role::Ingester(l) => {
            let dropped = l.dropped.load(Ordering::Relaxed);
            let failed = l.stats.failed.load(Ordering::Relaxed);
            (
                true,
                json!({
                    "ready": true,
                    "role": "ingester",
                    "cluster": l.cluster.config().name,
                    "connected": l.cluster.connected(),
                    "epoch": l.epoch,
                    "ops": l.seq.load(Ordering::Relaxed),
                    "ops_unpublished": dropped + failed,
                }),
            )
        }
        Role::Replica(r) => {
            let p = r.progress();
            let ready = p.reading && p.pending == 0 && (p.epoch.is_none() || p.in_sync);
            let reason = if !p.reading {
                "not reading the change stream (NATS unreachable?)"
            } else if p.pending > 0 {
                "catching up"
            } else if p.epoch.is_some() && !p.in_sync {
                "ops of this epoch are missing (a gap); waiting for the next ingester epoch"
            } else {
                "caught up"
            };
            (
                ready,
                json!({
                    "ready": ready,
                    "role": "replica",
                    "cluster": r.cluster.config().name,
                    "reason": reason,
                    "epoch": p.epoch,
                    "applied_seq": p.applied_seq,
                    "pending": p.pending,
                    "lag_ms": p.lag_ms,
                    "in_sync": p.in_sync,
                }),
            )
        }
    }
}

/// The role's metrics.
pub(crate) fn render(state: &IndexerState, out: &mut Text) {
    let role = match &state.role {
        Role::Standalone => "standalone",
        Role::Ingester(_) => "ingester",
        Role::Replica(_) => "replica",
    };
    out.family(
        "kvplane_indexer_cluster_role",
        "gauge",
        "1 for this indexer's role (standalone, ingester, replica).",
    );
    out.sample("kvplane_indexer_cluster_role", &[("role", role)], 1);
    let families: Vec<(&str, &str, &str, u64)> = match &state.role {
        Role::Standalone => Vec::new(),
        Role::Ingester(l) => vec![
            (
                "kvplane_indexer_cluster_ops_published_total",
                "counter",
                "Changes published to the cluster and acknowledged.",
                l.stats.acked.load(Ordering::Relaxed),
            ),
            (
                "kvplane_indexer_cluster_ops_failed_total",
                "counter",
                "Changes NATS did not take (replicas see a gap).",
                l.stats.failed.load(Ordering::Relaxed),
            ),
            (
                "kvplane_indexer_cluster_ops_dropped_total",
                "counter",
                "Changes dropped with the publish queue full (replicas see a gap).",
                l.dropped.load(Ordering::Relaxed),
            ),
        ],
        Role::Replica(r) => {
            let p = r.progress();
            vec![
                (
                    "kvplane_indexer_cluster_ops_applied_total",
                    "counter",
                    "Changes applied from the cluster.",
                    r.applied.load(Ordering::Relaxed),
                ),
                (
                    "kvplane_indexer_cluster_pending_ops",
                    "gauge",
                    "Changes in the stream or delivered, not yet applied.",
                    p.pending,
                ),
                (
                    "kvplane_indexer_cluster_lag_ms",
                    "gauge",
                    "Age of the last applied change while others are pending (0 when caught up).",
                    p.lag_ms,
                ),
                (
                    "kvplane_indexer_cluster_gaps_total",
                    "counter",
                    "Changes found missing in the stream (also on joining an epoch mid-way).",
                    p.gaps,
                ),
                (
                    "kvplane_indexer_cluster_bad_ops_total",
                    "counter",
                    "Stream messages that were not changes (dropped).",
                    r.bad_ops.load(Ordering::Relaxed),
                ),
                (
                    "kvplane_indexer_cluster_in_sync",
                    "gauge",
                    "1 when every change of the current epoch was applied.",
                    u64::from(p.in_sync),
                ),
            ]
        }
    };
    for (name, kind, help, v) in families {
        out.one(name, kind, help, v);
    }
}
