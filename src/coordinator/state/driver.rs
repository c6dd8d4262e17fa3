//! The two owner tasks. The **key owner** owns the [`Model`] (event gate, tracked keys,
//! quotas, pins): it runs requests from the HTTP handlers (closures sent over a bounded
//! channel) one at a time and the eviction cycle every `--eviction-check-interval`. The
//! **fleet owner** owns the [`Instances`] (registrations, heartbeats) and runs the health sweep
//! every `--health-check-interval`. A heartbeat therefore never waits behind event ingest:
//! its job takes microseconds on a task of its own, whatever the key owner is doing. The key
//! owner also yields to the runtime every `YIELD_EVERY` (16) jobs and after any job of
//! `YIELD_AFTER` (200 µs) or more, and a large event request reaches it as several jobs
//! ([`crate::coordinator::model::SLICE_OPS`] events each), so its other callers wait for a slice, not a
//! whole request.
//!
//! The owners talk through jobs too: the sweep's departed instances are sent to the key
//! owner to forget their event cursors, and an eviction cycle's victims are sent to the
//! servers holding them, at the addresses the fleet owner has. Effects leave the owners: eviction dispatches are spawned
//! through a [`Dispatcher`] (the outbound HTTP call in production, a recorder in tests), each
//! with its own timeout, so a slow MP server never blocks the API. While a cycle's
//! dispatches are in flight the next cycle is skipped (counted), which bounds outbound work
//! to one cycle.
//!
//! The owners hold their state as `Keys` and `Members` (`super::logged`): a read job gets
//! `&Model` or `&Instances`; a change is one of their logged methods, sent as a job by a
//! [`Handle`] write method (`super::writes`) or run by the owner's own loop (the sweep, the
//! expiry of departed servers), so on a cluster's leader every change is logged in the job
//! that applies it, and the dispatcher refuses while the lease may have lapsed.
//! [`spawn_replica`] starts the owners on a standby's followed state.

use super::changes::CoordinatorState;
use super::checkpoint::CheckpointDoc;
use super::logged::{self, ChangeLog, Keys, Members};
use super::outbound;
use crate::coordinator::model::fleet::Instances;
use crate::coordinator::model::metadata::Metadata;
use crate::coordinator::model::{dispatches, Dispatch, Model, Victims};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Requests queued for an owner before handlers wait.
pub const QUEUE: usize = 1024;
/// The key owner yields to the runtime after this many jobs in a row…
const YIELD_EVERY: u32 = 16;
/// …or after any job that ran this long.
const YIELD_AFTER: Duration = Duration::from_micros(200);

/// One job on an owner's state (a read gets `&Model` / `&Instances` out of it).
type Job<S> = Box<dyn FnOnce(&mut S, std::time::Instant, f64) + Send>;

/// Performs one eviction dispatch; `Err` carries why it failed.
pub type Dispatcher =
    Arc<dyn Fn(Dispatch) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// Outcomes of the background work, read by the metrics.
#[derive(Debug, Default)]
pub struct BackgroundStats {
    /// Eviction cycles run.
    pub eviction_cycles: AtomicU64,
    /// Cycles skipped because the previous dispatches were still in flight.
    pub eviction_cycles_skipped: AtomicU64,
    /// Cycles with victims but no registered instance to send them to.
    pub eviction_no_instance: AtomicU64,
    /// Dispatches that succeeded.
    pub dispatches_ok: AtomicU64,
    /// Dispatches that failed (transport, timeout or non-2xx).
    pub dispatches_failed: AtomicU64,
    /// Dispatches in flight now (a cycle's address lookup counts as one).
    pub dispatches_in_flight: AtomicUsize,
    /// Health sweeps run.
    pub sweeps: AtomicU64,
    /// Startup-resync pages read.
    pub resync_pages: AtomicU64,
    /// Keys seeded by the startup resync.
    pub resync_keys: AtomicU64,
    /// Startup resyncs that ended early (no server, an error).
    pub resync_failed: AtomicU64,
    /// Longest single job (or eviction plan) run by the key owner, in microseconds.
    pub key_owner_longest_job_us: AtomicU64,
    /// Longest single job run by the fleet owner, in microseconds.
    pub fleet_owner_longest_job_us: AtomicU64,
}

/// Records how long an owner's step took (real time, also under a paused test clock).
fn record_longest(slot: &AtomicU64, started: std::time::Instant) {
    let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    slot.fetch_max(us, Ordering::Relaxed);
}

/// Runs one job on an owner's `state` (its clocks read now) and records its time in
/// `longest`; returns when it started.
fn run_job<S>(job: Job<S>, state: &mut S, longest: &AtomicU64) -> std::time::Instant {
    let started = std::time::Instant::now();
    job(state, Instant::now().into_std(), wall_now());
    record_longest(longest, started);
    started
}

/// The owner has stopped (shutdown).
#[derive(Debug, thiserror::Error)]
#[error("the coordinator is shutting down")]
pub struct Stopped;

/// A cheap handle to both owner tasks.
#[derive(Clone)]
pub struct Handle {
    keys: mpsc::Sender<Job<Keys>>,
    fleet: mpsc::Sender<Job<Members>>,
    /// Background outcomes.
    pub stats: Arc<BackgroundStats>,
}

async fn call<S: 'static, R: Send + 'static>(
    tx: &mpsc::Sender<Job<S>>,
    f: impl FnOnce(&mut S, std::time::Instant, f64) -> R + Send + 'static,
) -> Result<R, Stopped> {
    let (reply, rx) = oneshot::channel();
    let job: Job<S> = Box::new(move |s, now, wall| {
        let _ = reply.send(f(s, now, wall));
    });
    tx.send(job).await.map_err(|_| Stopped)?;
    rx.await.map_err(|_| Stopped)
}

impl Handle {
    /// Runs `f` on the key model (with monotonic and wall-clock now) and returns its result.
    /// A read: changes are `Keys`' logged methods (`super::writes`).
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn with<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Model, std::time::Instant, f64) -> R + Send + 'static,
    ) -> Result<R, Stopped> {
        self.change_keys(move |k, now, wall| f(k.model(), now, wall))
            .await
    }

    /// Runs `f` on the fleet (with monotonic and wall-clock now) and returns its result. A
    /// read: changes are `Members`' logged methods (`super::writes`).
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn fleet<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Instances, std::time::Instant, f64) -> R + Send + 'static,
    ) -> Result<R, Stopped> {
        self.change_fleet(move |m, now, wall| f(m.fleet(), now, wall))
            .await
    }

    /// Runs `f` on the key owner's [`Keys`]: a change through one of its logged methods.
    pub(super) async fn change_keys<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Keys, std::time::Instant, f64) -> R + Send + 'static,
    ) -> Result<R, Stopped> {
        call(&self.keys, f).await
    }

    /// Runs `f` on the fleet owner's [`Members`]: a change through one of its logged methods.
    pub(super) async fn change_fleet<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Members, std::time::Instant, f64) -> R + Send + 'static,
    ) -> Result<R, Stopped> {
        call(&self.fleet, f).await
    }

    /// The operator state (quotas, default quota, pins) now, for the metadata file; `None`
    /// after shutdown.
    pub async fn metadata(&self) -> Option<Metadata> {
        self.with(|m, _, wall| m.capture_metadata(wall)).await.ok()
    }

    /// The whole key model now, for a checkpoint; `None` after shutdown.
    pub async fn checkpoint_doc(&self) -> Option<CheckpointDoc> {
        self.with(|m, _, wall| CheckpointDoc {
            saved_at: wall,
            model: m.dump(),
        })
        .await
        .ok()
    }
}

/// Intervals of the background work (`None` disables it).
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Seconds of silence before an instance is removed.
    pub instance_timeout: Duration,
    /// Between sweeps.
    pub health_check_interval: Option<Duration>,
    /// Between eviction cycles.
    pub eviction_check_interval: Option<Duration>,
}

/// Spawns both owner tasks on `tasks`, around an empty fleet of at most `max_instances`.
pub fn spawn(
    model: Model,
    timing: Timing,
    dispatcher: Dispatcher,
    shutdown: CancellationToken,
    tasks: &TaskTracker,
) -> Handle {
    spawn_replica(
        CoordinatorState::new(model),
        None,
        None,
        timing,
        dispatcher,
        shutdown,
        tasks,
    )
}

/// Spawns both owner tasks on `tasks` around `state` (a standby's, at takeover); with `log`,
/// every change they apply is logged in it, the whole operator state first.
pub fn spawn_replica(
    state: CoordinatorState,
    log: Option<Arc<ChangeLog>>,
    tap: Option<super::tap::Tap>,
    timing: Timing,
    dispatcher: Dispatcher,
    shutdown: CancellationToken,
    tasks: &TaskTracker,
) -> Handle {
    let (keys_tx, keys_rx) = mpsc::channel(QUEUE);
    let (fleet_tx, fleet_rx) = mpsc::channel(QUEUE);
    let (keys, members) = logged::split(state, log, wall_now());
    let keys = keys.with_tap(tap);
    let handle = Handle {
        keys: keys_tx,
        fleet: fleet_tx,
        stats: Arc::new(BackgroundStats::default()),
    };
    tasks.spawn(key_owner(
        keys,
        keys_rx,
        timing,
        dispatcher,
        handle.clone(),
        shutdown.clone(),
        tasks.clone(),
    ));
    tasks.spawn(fleet_owner(
        members,
        fleet_rx,
        timing,
        handle.clone(),
        shutdown,
        tasks.clone(),
    ));
    handle
}

/// This process's wall clock, Unix seconds.
pub(crate) fn wall_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

async fn tick_or_never(interval: &mut Option<tokio::time::Interval>) {
    match interval {
        Some(i) => {
            i.tick().await;
        }
        None => std::future::pending().await,
    }
}

fn interval(period: Option<Duration>) -> Option<tokio::time::Interval> {
    period.map(|p| {
        // The first tick is one period away (LMCache's loops sleep first).
        let mut i = tokio::time::interval_at(Instant::now() + p, p);
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    })
}

async fn key_owner(
    mut keys: Keys,
    mut rx: mpsc::Receiver<Job<Keys>>,
    timing: Timing,
    dispatcher: Dispatcher,
    handle: Handle,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) {
    let stats = Arc::clone(&handle.stats);
    let mut evict = interval(timing.eviction_check_interval);
    let mut since_yield = 0u32;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            job = rx.recv() => match job {
                Some(job) => {
                    let started = run_job(job, &mut keys, &stats.key_owner_longest_job_us);
                    // Let the tasks the replies woke (and anything else queued on this
                    // worker) run: after a long job, and at least every YIELD_EVERY jobs.
                    since_yield += 1;
                    if since_yield >= YIELD_EVERY || started.elapsed() >= YIELD_AFTER {
                        since_yield = 0;
                        tokio::task::yield_now().await;
                    }
                }
                None => break,
            },
            () = tick_or_never(&mut evict) => {
                if stats.dispatches_in_flight.load(Ordering::Acquire) > 0 {
                    stats.eviction_cycles_skipped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                stats.eviction_cycles.fetch_add(1, Ordering::Relaxed);
                let started = std::time::Instant::now();
                // Servers gone longer than the grace: their private L2 copies are dropped.
                let wall = wall_now();
                let cutoff = wall - crate::config::defaults::coordinator::DEPARTED_L2_TTL_S;
                let gone = keys.expire_departed(cutoff, wall);
                if !gone.is_empty() {
                    tracing::info!(instances = ?gone, "dropped the L2 copies of servers gone for good");
                }
                let victims = keys.plan_evictions();
                record_longest(&stats.key_owner_longest_job_us, started);
                if victims.is_empty() {
                    continue;
                }
                stats.dispatches_in_flight.fetch_add(1, Ordering::AcqRel);
                tasks.spawn(send_victims(victims, handle.clone(), Arc::clone(&dispatcher), tasks.clone()));
            }
        }
    }
}

/// Sends a cycle's victims to the servers holding them (addresses from the fleet owner), one
/// spawned dispatch per call; a failed one's keys may be planned again at once. Holds one
/// in-flight count until the dispatches are spawned.
async fn send_victims(
    victims: Vec<Victims>,
    handle: Handle,
    dispatcher: Dispatcher,
    tasks: TaskTracker,
) {
    let stats = Arc::clone(&handle.stats);
    let ids: Vec<String> = victims.iter().map(|v| v.instance_id.clone()).collect();
    let found = handle
        .fleet(move |f, _, _| {
            ids.iter()
                .filter_map(|id| f.get(id).cloned())
                .map(|i| (i.instance_id.clone(), i))
                .collect::<std::collections::HashMap<_, _>>()
        })
        .await;
    if let Ok(found) = found {
        let (calls, unknown) = dispatches(victims, |id| found.get(id).cloned());
        if !unknown.is_empty() {
            // Held by servers not registered now: planned again after the in-flight cycles.
            stats.eviction_no_instance.fetch_add(1, Ordering::Relaxed);
        }
        for d in calls {
            stats.dispatches_in_flight.fetch_add(1, Ordering::AcqRel);
            let (stats, dispatcher, h) =
                (Arc::clone(&stats), Arc::clone(&dispatcher), handle.clone());
            tasks.spawn(async move {
                let (target, n) = (d.instance_id.clone(), d.keys.len());
                let keys = d.keys.clone();
                match dispatcher(d).await {
                    Ok(()) => {
                        stats.dispatches_ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        tracing::warn!(instance_id = %target, keys = n, "eviction dispatch failed: {e}");
                        stats.dispatches_failed.fetch_add(1, Ordering::Relaxed);
                        let _ = h.release(keys).await;
                    }
                }
                stats.dispatches_in_flight.fetch_sub(1, Ordering::AcqRel);
            });
        }
    }
    stats.dispatches_in_flight.fetch_sub(1, Ordering::AcqRel);
}

async fn fleet_owner(
    mut members: Members,
    mut rx: mpsc::Receiver<Job<Members>>,
    timing: Timing,
    handle: Handle,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) {
    let mut sweep = interval(timing.health_check_interval);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            job = rx.recv() => match job {
                Some(job) => {
                    run_job(job, &mut members, &handle.stats.fleet_owner_longest_job_us);
                }
                None => break,
            },
            () = tick_or_never(&mut sweep) => {
                handle.stats.sweeps.fetch_add(1, Ordering::Relaxed);
                let gone = members.sweep(Instant::now().into_std(), timing.instance_timeout, wall_now());
                if gone.is_empty() {
                    continue;
                }
                for id in &gone {
                    tracing::info!(instance_id = %id, "instance timed out; removed");
                }
                // Not awaited here: the fleet owner never waits for the key owner.
                let h = handle.clone();
                tasks.spawn(async move { h.forget_instances(gone).await });
            }
        }
    }
}

/// The production dispatcher: `DELETE http://ip:port/cache/objects {"keys": [...], "tier":
/// "l2", "adapter": ...}` with `timeout` (no `adapter` for the primary one); a 2xx is
/// success unless its body says `"ok": false` (an adapter error on a 0.5.6 server).
pub fn http_dispatcher(timeout: Duration) -> Dispatcher {
    Arc::new(move |d: Dispatch| {
        Box::pin(async move {
            let mut body = serde_json::json!({ "keys": d.keys, "tier": "l2" });
            if let Some(adapter) = &d.adapter {
                body["adapter"] = serde_json::json!(adapter);
            }
            let body = serde_json::to_vec(&body).map_err(|e| e.to_string())?;
            let reply = outbound::MP
                .call(
                    &d.ip,
                    d.http_port,
                    "DELETE",
                    "/cache/objects",
                    Some(&body),
                    timeout,
                )
                .await
                .map_err(|e| e.to_string())?;
            if (200..300).contains(&reply.status) {
                let said: serde_json::Value =
                    serde_json::from_slice(&reply.body).unwrap_or_default();
                if said["ok"] == serde_json::json!(false) {
                    return Err(format!("not deleted: {}", said["error"]));
                }
                Ok(())
            } else {
                Err(format!("status {}", reply.status))
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::model::events::{Batch, Op, Tier};
    use crate::coordinator::model::fleet::Registration;
    use crate::coordinator::model::keys::EncodedKey;
    use crate::coordinator::model::ModelConfig;

    /// With the seed's allowlist: a salt without a quota may hold nothing.
    fn model() -> Model {
        let mut m = Model::new(ModelConfig {
            max_instances: 8,
            max_tracked_keys: 100,
            max_quotas: 8,
            eviction_ratio: 0.5,
            trigger_watermark: 1.0,
        });
        m.set_default_limit(Some(0.0)).unwrap();
        m
    }

    fn reg(id: &str) -> Registration {
        Registration {
            instance_id: Some(id.into()),
            ip: "127.0.0.1".into(),
            http_port: 1,
            metadata: Default::default(),
            p2p_advertised_url: String::new(),
            mq_port: 0,
        }
    }

    fn stores(n: u64) -> Batch {
        Batch {
            instance_id: "a".into(),
            incarnation: 0,
            seq: 1,
            tier: Tier::L2,
            backend: "fs".into(),
            shared: false,
            capacity: None,
            tokens: Vec::new(),
            ops: (0..n)
                .map(|i| {
                    Op::Store(
                        EncodedKey {
                            chunk_hash_hex: format!("{i:02x}"),
                            model_name: "m".into(),
                            kv_rank: 0,
                            object_group_id: 0,
                            cache_salt: "t".into(),
                        },
                        10,
                    )
                })
                .collect(),
        }
    }

    /// A dispatcher that records each dispatch and completes only when released.
    fn recorder() -> (
        Dispatcher,
        mpsc::UnboundedReceiver<(Dispatch, oneshot::Sender<()>)>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let d: Dispatcher = Arc::new(move |d| {
            let tx = tx.clone();
            Box::pin(async move {
                let (done, wait) = oneshot::channel();
                tx.send((d, done)).map_err(|_| "closed".to_string())?;
                wait.await.map_err(|_| "dropped".to_string())
            })
        });
        (d, rx)
    }

    /// Eviction every 5 s, no health sweep.
    fn evicting() -> Timing {
        Timing {
            instance_timeout: Duration::from_secs(30),
            health_check_interval: None,
            eviction_check_interval: Some(Duration::from_secs(5)),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn eviction_cycles_dispatch_and_skip_while_in_flight() {
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let (dispatcher, mut seen) = recorder();
        let h = spawn(model(), evicting(), dispatcher, shutdown.clone(), &tasks);
        // "a" holds the copies (its events stored them): the victims go to it.
        h.register(reg("a"), String::new).await.unwrap().unwrap();
        h.admit(vec![stores(4)], usize::MAX).await.unwrap();
        // Nothing before the first period.
        tokio::time::sleep(Duration::from_millis(4_900)).await;
        assert!(seen.try_recv().is_err());
        let (d, done) = tokio::time::timeout(Duration::from_secs(1), seen.recv())
            .await
            .unwrap()
            .unwrap();
        // No quota for "t" and the allowlist on: every key goes.
        assert_eq!((d.instance_id.as_str(), d.keys.len()), ("a", 4));
        assert_eq!(d.adapter.as_deref(), Some("fs"));
        // Two more periods (at 10 s and 15 s) with the dispatch unreleased: both skipped.
        tokio::time::sleep(Duration::from_secs(12)).await;
        assert!(seen.try_recv().is_err());
        assert_eq!(h.stats.eviction_cycles_skipped.load(Ordering::Relaxed), 2);
        done.send(()).unwrap();
        // Usage never came back down (no delete events): once the keys' in-flight cycles
        // (planned at the cycle of 5 s; 20 s and 25 s pass them over) are over, the cycle of
        // 30 s plans them again (at least once).
        tokio::time::sleep(Duration::from_secs(12)).await;
        assert!(seen.try_recv().is_err());
        let (again, done2) = tokio::time::timeout(Duration::from_secs(2), seen.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(again.keys.len(), 4);
        // A failed dispatch releases its keys: the very next cycle (35 s) plans them again.
        drop(done2);
        let (third, done3) = tokio::time::timeout(Duration::from_secs(6), seen.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(third.keys.len(), 4);
        drop(done3);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(h.stats.dispatches_ok.load(Ordering::Relaxed), 1);
        assert_eq!(h.stats.dispatches_failed.load(Ordering::Relaxed), 2);
        shutdown.cancel();
        tasks.close();
        tokio::time::timeout(Duration::from_secs(5), tasks.wait())
            .await
            .unwrap();
        assert!(h.with(|_, _, _| ()).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn the_sweep_removes_silent_instances_on_its_interval() {
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let (dispatcher, _seen) = recorder();
        let timing = Timing {
            instance_timeout: Duration::from_secs(30),
            health_check_interval: Some(Duration::from_secs(10)),
            eviction_check_interval: None,
        };
        let h = spawn(model(), timing, dispatcher, shutdown.clone(), &tasks);
        let count = |h: Handle| async move { h.fleet(|f, _, _| f.len()).await.unwrap() };
        for id in ["a", "chatty"] {
            h.register(reg(id), String::new).await.unwrap().unwrap();
        }
        // "a" (which will stay quiet) has sent events: its cursor is at seq 1.
        h.admit(vec![stores(1)], usize::MAX).await.unwrap();
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_secs(10)).await;
            h.heartbeat("chatty".into()).await.unwrap();
        }
        // 40 s: "a" was last seen at 0, removed by the sweep at 40 (> 30 s silent).
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(count(h.clone()).await, 1);
        assert!(h.stats.sweeps.load(Ordering::Relaxed) >= 4);
        // Its cursor was forgotten: seq 1 applies again instead of being a duplicate.
        let (again, _) = h.admit(vec![stores(1)], usize::MAX).await.unwrap();
        assert_eq!(again.applied, 1);
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn victims_without_an_instance_are_counted_not_sent() {
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let (dispatcher, mut seen) = recorder();
        let h = spawn(model(), evicting(), dispatcher, shutdown.clone(), &tasks);
        h.admit(vec![stores(3)], usize::MAX).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5_100)).await;
        assert_eq!(h.stats.eviction_no_instance.load(Ordering::Relaxed), 1);
        assert_eq!(h.stats.dispatches_in_flight.load(Ordering::Relaxed), 0);
        assert!(seen.try_recv().is_err());
        shutdown.cancel();
    }

    /// The fleet owner answers while the key owner is stuck in a job (here: blocked until the
    /// test releases it, so the heartbeat's answer cannot come from the key owner).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn heartbeats_do_not_wait_for_the_key_owner() {
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let (dispatcher, _seen) = recorder();
        let timing = Timing {
            instance_timeout: Duration::from_secs(30),
            health_check_interval: None,
            eviction_check_interval: None,
        };
        let h = spawn(model(), timing, dispatcher, shutdown.clone(), &tasks);
        h.register(reg("s1"), String::new).await.unwrap().unwrap();
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (entered, is_in) = oneshot::channel::<()>();
        let busy = h.clone();
        let blocked = tokio::spawn(async move {
            busy.with(move |_, _, _| {
                let _ = entered.send(());
                let _ = held.recv_timeout(Duration::from_secs(30));
            })
            .await
        });
        is_in.await.unwrap();
        let known = tokio::time::timeout(Duration::from_secs(10), h.heartbeat("s1".into()))
            .await
            .expect("the heartbeat waited for the key owner")
            .unwrap();
        assert!(known);
        release.send(()).unwrap();
        blocked.await.unwrap().unwrap();
        shutdown.cancel();
    }
}
