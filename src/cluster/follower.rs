//! The follower's side of a service's log, the same for every service: restore the latest
//! snapshot, read the log from the message after it, apply each record to the service's state
//! under the service's own lock ([`Host`]) through its place in the log ([`LogCursor`]:
//! epochs, gaps, fencing), publish a snapshot every `snapshot_records` records while in sync,
//! and — a standby — take the lease over: announce the new epoch, read the log back to it, stop
//! following and start the leader's [`ChangeLog`] (the leader loop around the takeover is
//! `leadership.rs`).
//!
//! Must not: hold the service's lock across an `.await` (records are applied in one
//! synchronous step each; dumps run off the async workers); know what a record means.

use super::leader::ChangeLog;
use super::log::LogCursor;
use super::record::{apply_record_with, decode_snapshot, encode_snapshot, Record};
use super::replicated::{Host, Replicated};
use super::status::ClusterStatus;
use super::takeover::{ReadBack, SnapshotSchedule};
use super::{now_ms, spawn_reader, Cluster, ClusterConfig, ClusterError, Lease, LeaseBucket};
use bytes::Bytes;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Records read but not yet applied at most.
const APPLY_QUEUE: usize = 1024;

type Change<H> = <<H as Host>::State as Replicated>::Change;
type Dump<H> = <<H as Host>::State as Replicated>::Dump;

/// The wall clock, Unix seconds.
fn wall() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A process following its service's log into `H`'s state.
pub struct Follower<H: Host> {
    cluster: Cluster,
    bucket: LeaseBucket,
    host: Arc<H>,
    status: Arc<ClusterStatus>,
    reading: CancellationToken,
    stop: CancellationToken,
    tasks: TaskTracker,
}

/// What a standby holds once it took the lease.
pub struct Leadership<S> {
    /// The lease.
    pub lease: Lease,
    /// Where its own changes go.
    pub log: Arc<ChangeLog<S>>,
    /// Whether the stream was empty at the takeover (nothing followed: a new cluster).
    pub fresh: bool,
    /// Whether the followed state held every change since a fresh start.
    pub in_sync: bool,
    /// When the lease was taken.
    pub taken: Instant,
}

impl<S> Leadership<S> {
    /// Whether the state may lack what the service's clients hold, so the service relearns
    /// it: a new cluster, or a follower that missed records.
    pub fn needs_resync(&self) -> bool {
        self.fresh || !self.in_sync
    }

    /// Milliseconds since the lease was taken.
    pub fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.taken.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

impl<H: Host> Follower<H> {
    /// Joins the cluster of `config` as a follower of `host`'s state (a read `replica` never
    /// takes the lease): connects, sets up the stream and the lease bucket, restores the
    /// latest snapshot, and follows the log on `tasks` until `stop` (or a takeover).
    ///
    /// # Errors
    /// When NATS cannot be reached or JetStream set up.
    pub async fn join(
        config: ClusterConfig,
        host: Arc<H>,
        replica: bool,
        stop: &CancellationToken,
        tasks: &TaskTracker,
    ) -> Result<Self, ClusterError> {
        let service = H::State::SERVICE;
        let cluster = Cluster::connect(config).await?;
        cluster.ensure_stream(service).await?;
        let bucket = cluster.lease_bucket().await?;
        let status = Arc::new(ClusterStatus::new(service, &cluster, replica));
        let from = restore_snapshot(&cluster, &*host, &status).await;
        let reading = stop.child_token();
        let (tx, rx) = mpsc::channel::<(u64, Bytes)>(APPLY_QUEUE);
        spawn_reader(
            cluster.clone(),
            service,
            from,
            tx,
            Arc::clone(&status.reader),
            reading.clone(),
            tasks,
        );
        tasks.spawn(apply_loop(
            cluster.clone(),
            Arc::clone(&host),
            Arc::clone(&status),
            rx,
            tasks.clone(),
        ));
        tracing::info!(
            cluster = %status.name,
            me = %status.me,
            "{service} {}: following the cluster's log{}",
            if replica { "replica" } else { "standby" },
            if replica { "" } else { ", waiting for the lease" }
        );
        Ok(Follower {
            cluster,
            bucket,
            host,
            status,
            reading,
            stop: stop.clone(),
            tasks: tasks.clone(),
        })
    }

    /// Where this process stands.
    pub fn status(&self) -> &Arc<ClusterStatus> {
        &self.status
    }

    /// The lease bucket.
    pub fn bucket(&self) -> &LeaseBucket {
        &self.bucket
    }

    /// Waits for the lease, then takes over: publishes the takeover record of the lease's
    /// epoch, reads the log until it is applied (so the state holds everything the old leader
    /// published), stops following and starts the leader's log. A takeover that fails (NATS
    /// gone, the lease lost meanwhile) releases the lease and waits again. `None` once
    /// `cancel`.
    pub(super) async fn take_over(
        &self,
        cancel: &CancellationToken,
    ) -> Option<Leadership<H::State>> {
        let st = &self.status;
        let (lease, fresh, taken) = loop {
            let mut lease = self
                .bucket
                .acquire(H::State::SERVICE, &st.me, cancel, |h| {
                    st.set_lease_holder(h.map(|(who, _)| who));
                })
                .await?;
            let taken = Instant::now();
            st.set_lease_holder(Some(st.me.clone()));
            match self.announce(&mut lease).await {
                Ok(fresh) => break (lease, fresh, taken),
                Err(e) => {
                    // Back to following; another standby (or this one, later) takes over.
                    tracing::warn!("takeover abandoned, lease released: {e}");
                    self.bucket.release(&lease).await;
                    st.set_lease_holder(None);
                }
            }
        };
        // Every record up to the takeover is applied: stop following, start publishing.
        self.reading.cancel();
        let (in_sync, followed) = {
            let c = st.cursor.lock();
            (c.in_sync(), c.epoch_seq())
        };
        let log = Arc::new(ChangeLog::start(
            &self.cluster,
            st,
            lease.epoch,
            1,
            self.stop.clone(),
            &self.tasks,
        ));
        st.lead(lease.epoch);
        tracing::info!(
            epoch = lease.epoch,
            ?followed,
            in_sync,
            fresh,
            "{} took the lease",
            H::State::SERVICE
        );
        Some(Leadership {
            lease,
            log,
            fresh,
            in_sync,
            taken,
        })
    }

    /// Publishes the takeover record and reads the log back to it (see
    /// [`Cluster::announce_takeover`]); whether the stream was empty before.
    async fn announce(&self, lease: &mut Lease) -> Result<bool, String> {
        let epoch = lease.epoch;
        let st = &self.status;
        let record = |fresh| {
            Record {
                epoch,
                seq: 1,
                at_ms: now_ms(),
                now: self.host.now(),
                change: H::State::takeover(st.me.clone(), fresh),
            }
            .encode()
        };
        let read_back = || ReadBack {
            done: st.cursor.lock().epoch_seq() >= (Some(epoch), 1),
            handled: st.processed.load(Ordering::Relaxed),
        };
        self.cluster
            .announce_takeover(H::State::SERVICE, &self.bucket, lease, record, read_back)
            .await
    }
}

/// Restores the latest snapshot into `host`'s state if there is a usable one; returns the
/// stream sequence to read the log from.
async fn restore_snapshot<H: Host>(cluster: &Cluster, host: &H, st: &ClusterStatus) -> u64 {
    let service = H::State::SERVICE;
    let data = match cluster.load_snapshot(service).await {
        Ok(Some(d)) => d,
        Ok(None) => return 1,
        Err(e) => {
            tracing::warn!("cluster: no snapshot read ({e}); following the log from its start");
            return 1;
        }
    };
    let (p, dump) = match decode_snapshot::<Dump<H>>(&data) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cluster: the {service} snapshot did not decode ({e}); not used");
            return 1;
        }
    };
    let restored = host.write(|state| {
        let restored = state.restore(dump)?;
        *state = restored;
        // Under the state's lock, as a record would be: position and state match.
        *st.cursor.lock() = LogCursor::at(p);
        Ok::<(), String>(())
    });
    match restored {
        Some(Ok(())) => {
            st.restored_at.store(p.stream_seq, Ordering::Relaxed);
            tracing::info!(
                epoch = ?p.epoch,
                seq = p.seq,
                in_sync = p.in_sync,
                bytes = data.len(),
                "cluster: restored a snapshot; following the log from stream sequence {}",
                p.stream_seq + 1
            );
            p.stream_seq + 1
        }
        Some(Err(e)) => {
            tracing::warn!("cluster: the snapshot does not fit this {service}'s limits ({e})");
            1
        }
        None => 1,
    }
}

/// Applies one log message, read at `stream_seq`, to `host`'s state.
fn apply_one<H: Host>(host: &H, st: &ClusterStatus, stream_seq: u64, bytes: &[u8]) {
    match Record::<Change<H>>::decode(bytes) {
        Ok(r) => {
            let local = (Instant::now(), wall());
            let outcome = host.write(|state| {
                let mut cursor = st.cursor.lock();
                cursor.note_stream_seq(stream_seq);
                apply_record_with(&mut cursor, state, r, local, |c| host.applying(c))
            });
            match outcome {
                Some(o) if o.applies() => {
                    st.applied.fetch_add(1, Ordering::Relaxed);
                }
                Some(_) => {}
                // Taken over: the record is past the takeover's and not applied.
                None => st.cursor.lock().note_stream_seq(stream_seq),
            }
        }
        Err(e) => {
            st.cursor.lock().note_stream_seq(stream_seq);
            st.bad_records.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "cluster: a {} change record did not decode: {e}",
                H::State::SERVICE
            );
        }
    }
    st.processed.fetch_add(1, Ordering::Relaxed);
}

/// Applies what the reader delivers, and every `snapshot_records` records (at most every
/// [`super::MIN_SNAPSHOT_INTERVAL`], only in sync and while not leading) publishes a snapshot
/// of the followed state.
async fn apply_loop<H: Host>(
    cluster: Cluster,
    host: Arc<H>,
    st: Arc<ClusterStatus>,
    mut rx: mpsc::Receiver<(u64, Bytes)>,
    tasks: TaskTracker,
) {
    let mut schedule = SnapshotSchedule::new(cluster.config().snapshot_records);
    while let Some((stream_seq, bytes)) = rx.recv().await {
        apply_one(&*host, &st, stream_seq, &bytes);
        if !schedule.handled(st.in_sync(), st.is_leader()) {
            continue;
        }
        let (h, s) = (Arc::clone(&host), Arc::clone(&st));
        // The dump holds the state's lock (records wait; the loop too; readers go on where
        // the lock is a read lock).
        let dumped = tokio::task::spawn_blocking(move || {
            h.read(|state| {
                let position = s.cursor.lock().position();
                encode_snapshot(&position, &state.dump())
            })
        });
        let Ok(Some(data)) = dumped.await else {
            continue;
        };
        let (cluster, st) = (cluster.clone(), Arc::clone(&st));
        tasks.spawn(async move {
            let service = H::State::SERVICE;
            match cluster.publish_snapshot(service, &data).await {
                Ok(()) => {
                    st.snapshots.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(bytes = data.len(), "cluster: {service} snapshot published");
                }
                Err(e) => {
                    st.snapshots_failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("cluster: {service} snapshot not published: {e}");
                }
            }
        });
    }
}

/// Starts a leader that takes no lease (the indexer's ingester, the only one of its cluster by
/// configuration): its epoch is a fresh stamp of the lease bucket — later than every epoch
/// before it, so followers fence the records of an earlier one — and its first record is
/// [`Replicated::takeover`] of a fresh state.
///
/// # Errors
/// When NATS cannot be reached or JetStream set up.
pub async fn lead_without_lease<S: Replicated>(
    config: ClusterConfig,
    now: f64,
    stop: &CancellationToken,
    tasks: &TaskTracker,
) -> Result<(Arc<ChangeLog<S>>, Arc<ClusterStatus>), ClusterError> {
    let cluster = Cluster::connect(config).await?;
    cluster.ensure_stream(S::SERVICE).await?;
    let bucket = cluster.lease_bucket().await?;
    let status = Arc::new(ClusterStatus::new(S::SERVICE, &cluster, false));
    let epoch = bucket
        .stamp(S::SERVICE, &status.me)
        .await
        .map_err(|reason| ClusterError::Stream {
            stream: cluster.stream_name(S::SERVICE),
            reason,
        })?;
    let log = ChangeLog::<S>::start(&cluster, &status, epoch, 0, stop.clone(), tasks);
    log.record(now, &S::takeover(status.me.clone(), true));
    status.lead(epoch);
    tracing::info!(
        cluster = %status.name,
        me = %status.me,
        epoch,
        "{}: leading the cluster's log",
        S::SERVICE
    );
    Ok((Arc::new(log), status))
}
