//! `--cluster nats://HOST:PORT` (docs/CLUSTER.md): the one replication core the controller,
//! the coordinator and the indexer share, and every use of the `async-nats` crate. Shared,
//! below every service.
//!
//! A service implements [`Replicated`] (its state: apply a change, dump, restore) and [`Host`]
//! (the lock its state lives under) and nothing else. The core does the rest, the same way for
//! all three: the leader's [`ChangeLog`] (records numbered in apply order, one publisher with
//! its window, losses counted, `leader.rs`), the [`Follower`] (snapshot restore, the log's
//! reader, epochs, gaps, fencing, periodic snapshots, takeover, `follower.rs`), the one leader
//! loop of the services with standbys ([`Candidate`] → [`Elected`]: lease wait, takeover,
//! bind with a throttled log, the [`Fence`] in front of every outbound action, stop on the
//! loss of the lease, `leadership.rs`), one record
//! envelope ([`Record`], `record.rs`), leases with revision fencing (`lease.rs`), snapshots in
//! parts (`snapshot.rs`), the cursor in a log (`log.rs`, pure), and one status document and
//! metric set ([`ClusterStatus`], `status.rs`); besides, compare-and-set entries shared by
//! every process ([`CasBucket`], `cas.rs`: the routers' reservations).
//!
//! Here: connecting with a deadline, one bounded JetStream stream per (cluster, service) —
//! `KVPLANE_<cluster>_<service>`, subject `kvplane.<cluster>.<service>` — and an ordered
//! reader from a given stream sequence with its pending count and lag.
//!
//! Must not: know what a change means; use any service module.

pub mod args;
mod cas;
mod follower;
mod leader;
mod leadership;
mod lease;
mod log;
mod record;
mod replicated;
mod snapshot;
mod status;
mod takeover;

pub use cas::{CasBucket, CasEntry, CasError};
pub use follower::{lead_without_lease, Follower, Leadership};
pub use leader::{ChangeLog, MAX_QUEUED_BYTES, RECORD_QUEUE};
pub use leadership::{
    Candidate, Elected, Fence, Fenced, LeaderService, BIND_RETRY, BIND_WARN_EVERY,
};
pub use lease::{Lease, LeaseBucket, LeaseGuard, RenewError};
pub use log::{Applied, LogCursor, Position};
pub use record::{apply_record, apply_record_with, decode_snapshot, encode_snapshot, Body, Record};
pub use replicated::{Host, Owned, Replicated, Stamp};
pub use status::{ClusterStatus, LogStats, Progress};
pub use takeover::{ReadBack, SnapshotSchedule, MIN_SNAPSHOT_INTERVAL, RECORD_OVERHEAD};

use crate::config::defaults::cluster as d;
use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures_util::StreamExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Publishes not yet acknowledged by the server at most, per publisher.
pub const ACK_WINDOW: usize = 256;

/// Where the cluster is and how much it keeps.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// `nats://host:port` (several, comma-separated, for a NATS cluster).
    pub url: String,
    /// The cluster's name: several kvplane fleets can share one NATS. `[A-Za-z0-9_-]`, 1–64.
    pub name: String,
    /// Most bytes a service's stream keeps (the oldest messages go first).
    pub max_bytes: i64,
    /// Time allowed to connect and to set up the stream.
    pub timeout: Duration,
    /// How long a lease lasts without renewal (the holder renews it every quarter of that).
    pub lease_ttl: Duration,
    /// A follower publishes a snapshot every this many records it applies (0: never).
    pub snapshot_records: u64,
}

impl ClusterConfig {
    /// `url` with the default name and limits.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            name: d::NAME.into(),
            max_bytes: d::MAX_BYTES,
            timeout: Duration::from_secs_f64(d::TIMEOUT_S),
            lease_ttl: Duration::from_secs_f64(d::LEASE_TTL_S),
            snapshot_records: d::SNAPSHOT_RECORDS,
        }
    }
}

/// Why the cluster could not be joined.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The cluster name has characters NATS names cannot hold.
    #[error("--cluster-name {0:?}: use 1-64 of A-Z a-z 0-9 _ -")]
    BadName(String),
    /// NATS did not answer in time or refused.
    #[error("--cluster: cannot reach NATS at {url}: {reason}")]
    Connect {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// JetStream refused the stream (not enabled on the server, or a conflicting config).
    #[error(
        "--cluster: JetStream stream {stream}: {reason} (is JetStream enabled: nats-server -js?)"
    )]
    Stream {
        /// The stream's name.
        stream: String,
        /// Why.
        reason: String,
    },
}

/// A connection to the cluster.
#[derive(Clone, Debug)]
pub struct Cluster {
    config: ClusterConfig,
    js: jetstream::Context,
    client: async_nats::Client,
    /// Connections lost since connecting (however briefly).
    disconnects: Arc<AtomicU64>,
}

impl Cluster {
    /// Connects (bounded by `config.timeout`).
    ///
    /// # Errors
    /// A bad name, or NATS unreachable within the timeout.
    pub async fn connect(config: ClusterConfig) -> Result<Self, ClusterError> {
        let name = &config.name;
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(ClusterError::BadName(name.clone()));
        }
        let disconnects = Arc::new(AtomicU64::new(0));
        let seen = Arc::clone(&disconnects);
        let connect = async_nats::ConnectOptions::new()
            .name(format!("kvplane-{name}"))
            .event_callback(move |event| {
                if matches!(event, async_nats::Event::Disconnected) {
                    seen.fetch_add(1, Ordering::Relaxed);
                }
                tracing::info!("cluster connection: {event}");
                std::future::ready(())
            })
            .connection_timeout(config.timeout)
            .connect(config.url.as_str());
        let client = tokio::time::timeout(config.timeout, connect)
            .await
            .map_err(|_| ClusterError::Connect {
                url: config.url.clone(),
                reason: format!("no answer within {:?}", config.timeout),
            })?
            .map_err(|e| ClusterError::Connect {
                url: config.url.clone(),
                reason: e.to_string(),
            })?;
        let js = jetstream::new(client.clone());
        Ok(Self {
            config,
            js,
            client,
            disconnects,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// Largest message the server takes (its `max_payload`; 1 MiB by default), less room for
    /// headers.
    pub fn max_message_bytes(&self) -> usize {
        let max = self.client.server_info().max_payload;
        if max == 0 { 1 << 20 } else { max }.saturating_sub(4096)
    }

    /// Whether the connection to NATS is up now.
    pub fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// The stream of `service`.
    pub fn stream_name(&self, service: &str) -> String {
        format!("KVPLANE_{}_{service}", self.config.name)
    }

    /// The subject of `service`.
    pub fn subject(&self, service: &str) -> String {
        format!("kvplane.{}.{service}", self.config.name)
    }

    /// Creates `service`'s stream if it is missing.
    ///
    /// # Errors
    /// JetStream disabled, a conflicting stream, or no answer within the timeout.
    pub async fn ensure_stream(&self, service: &str) -> Result<stream::Stream, ClusterError> {
        self.bounded_stream(self.stream_name(service), self.subject(service))
            .await
    }

    /// Creates stream `name` on `subject` if it is missing: file storage, at most
    /// `max_bytes`, the oldest messages dropped first.
    ///
    /// # Errors
    /// JetStream disabled, a conflicting stream, or no answer within the timeout.
    pub(crate) async fn bounded_stream(
        &self,
        name: String,
        subject: String,
    ) -> Result<stream::Stream, ClusterError> {
        let err = |reason: String| ClusterError::Stream {
            stream: name.clone(),
            reason,
        };
        let create = self.js.get_or_create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject],
            max_bytes: self.config.max_bytes,
            discard: stream::DiscardPolicy::Old,
            storage: stream::StorageType::File,
            ..Default::default()
        });
        tokio::time::timeout(self.config.timeout, create)
            .await
            .map_err(|_| err(format!("no answer within {:?}", self.config.timeout)))?
            .map_err(|e| err(e.to_string()))
    }
}

impl Cluster {
    /// Whether `service`'s stream holds no message.
    ///
    /// # Errors
    /// NATS did not answer in time.
    pub async fn stream_is_empty(&self, service: &str) -> Result<bool, ClusterError> {
        let mut stream = self.ensure_stream(service).await?;
        let info = tokio::time::timeout(self.config.timeout, stream.info())
            .await
            .map_err(|_| ClusterError::Stream {
                stream: self.stream_name(service),
                reason: "no answer".into(),
            })?
            .map_err(|e| ClusterError::Stream {
                stream: self.stream_name(service),
                reason: e.to_string(),
            })?;
        Ok(info.state.messages == 0)
    }

    /// Publishes one payload to `service`'s stream and waits for the server to store it.
    ///
    /// # Errors
    /// Not sent, not acknowledged, or no answer within the timeout.
    pub async fn publish_acked(&self, service: &str, payload: Bytes) -> Result<(), String> {
        self.publish_to(self.subject(service), payload)
            .await
            .map(drop)
    }

    /// Publishes `payload` on `subject` and waits for the server to store it; its stream
    /// sequence.
    ///
    /// # Errors
    /// Not sent, not acknowledged, or no answer within the timeout.
    pub(crate) async fn publish_to(&self, subject: String, payload: Bytes) -> Result<u64, String> {
        let send = async {
            self.js
                .publish(subject, payload)
                .await
                .map_err(|e| e.to_string())?
                .await
                .map_err(|e| e.to_string())
        };
        tokio::time::timeout(self.config.timeout, send)
            .await
            .map_err(|_| format!("no answer within {:?}", self.config.timeout))?
            .map(|ack| ack.sequence)
    }
}

/// The wall clock in ms since the Unix epoch: the time stamped on replicated changes, from
/// which followers report their lag.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Counters of one publisher.
#[derive(Debug, Default)]
pub struct PublishStats {
    /// Payloads the server acknowledged.
    pub acked: AtomicU64,
    /// Payloads that failed (not sent, or not acknowledged); each leaves a gap followers see.
    pub failed: AtomicU64,
}

/// State a reader shares with whoever reports on it.
#[derive(Debug, Default)]
pub struct ReaderStatus {
    /// Reading (the consumer is set up and its stream open).
    pub reading: AtomicBool,
    /// Messages behind the last one delivered.
    pub pending: AtomicU64,
    /// Messages delivered.
    pub delivered: AtomicU64,
}

impl ReaderStatus {
    /// How far the follower fed by this reader is behind: `(pending, lag_ms)`. `pending`
    /// counts messages in the stream not yet delivered plus those delivered but not yet
    /// `processed` by the applier; `lag_ms` is the age of the last applied change (stamped
    /// `last_at_ms` by its publisher) while any is pending, else 0.
    pub fn lag(&self, processed: u64, last_at_ms: u64) -> (u64, u64) {
        let unapplied = self
            .delivered
            .load(Ordering::Relaxed)
            .saturating_sub(processed);
        let pending = self.pending.load(Ordering::Relaxed) + unapplied;
        let lag_ms = if pending == 0 || last_at_ms == 0 {
            0
        } else {
            now_ms().saturating_sub(last_at_ms)
        };
        (pending, lag_ms)
    }
}

/// Delivers every message of `service`'s stream from stream sequence `from` (1: the first
/// one kept), in order, as `(stream sequence, payload)` into `tx` (bounded: a slow applier
/// slows the reader, never grows memory), until `cancel`. An error (NATS down, the consumer
/// lost) sets the consumer up again after a pause, from the message after the last one
/// delivered.
pub fn spawn_reader(
    cluster: Cluster,
    service: &str,
    from: u64,
    tx: mpsc::Sender<(u64, Bytes)>,
    status: Arc<ReaderStatus>,
    cancel: CancellationToken,
    tasks: &tokio_util::task::TaskTracker,
) {
    let service = service.to_owned();
    tasks.spawn(async move {
        let mut from = from.max(1);
        loop {
            let result = tokio::select! {
                () = cancel.cancelled() => return,
                r = read(&cluster, &service, from, &tx, &status) => r,
            };
            status.reading.store(false, Ordering::Relaxed);
            match result {
                Ok(next) => from = next,
                Err((next, e)) => {
                    from = next;
                    tracing::warn!("cluster reader of {service}: {e}; retrying");
                }
            }
            if tx.is_closed() {
                return;
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    });
}

/// Reads from stream sequence `from` on; returns where to go on from, with the error if any.
async fn read(
    cluster: &Cluster,
    service: &str,
    from: u64,
    tx: &mpsc::Sender<(u64, Bytes)>,
    status: &ReaderStatus,
) -> Result<u64, (u64, String)> {
    let mut next = from;
    let disconnects = cluster.disconnects.load(Ordering::Relaxed);
    let stream = cluster
        .ensure_stream(service)
        .await
        .map_err(|e| (next, e.to_string()))?;
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            deliver_policy: if from <= 1 {
                consumer::DeliverPolicy::All
            } else {
                consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: from,
                }
            },
            ..Default::default()
        })
        .await
        .map_err(|e| (next, e.to_string()))?;
    // What the stream holds from `from` on counts as pending before the first message
    // arrives: a follower that just restored a snapshot is not caught up until it read them.
    status
        .pending
        .store(consumer.cached_info().num_pending, Ordering::Relaxed);
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| (next, e.to_string()))?;
    status.reading.store(true, Ordering::Relaxed);
    let mut check = tokio::time::interval(Duration::from_millis(250));
    loop {
        // A server restart can lose the consumer without ending this stream: once the
        // connection drops, set a new consumer up from where this one got to.
        let m = tokio::select! {
            m = messages.next() => m,
            _ = check.tick() => {
                if cluster.disconnects.load(Ordering::Relaxed) == disconnects {
                    continue;
                }
                return Err((next, "the connection to NATS was lost".into()));
            }
        };
        let Some(m) = m else { break };
        let m = m.map_err(|e| (next, e.to_string()))?;
        let (stream_seq, pending) = match m.info() {
            Ok(i) => (i.stream_sequence, i.pending),
            Err(e) => return Err((next, e.to_string())),
        };
        status.pending.store(pending, Ordering::Relaxed);
        status.delivered.fetch_add(1, Ordering::Relaxed);
        next = stream_seq + 1;
        if tx.send((stream_seq, m.payload.clone())).await.is_err() {
            return Ok(next);
        }
    }
    Err((next, "the message stream ended".into()))
}

#[cfg(test)]
#[path = "core_tests.rs"]
pub(crate) mod core_tests;

#[cfg(test)]
pub(crate) mod laws;
