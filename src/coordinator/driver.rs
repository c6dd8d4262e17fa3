//! The one task that owns the [`Model`]: it runs requests from the HTTP handlers (closures
//! sent over a bounded channel) one at a time, the health sweep every
//! `--health-check-interval` and the eviction cycle every `--eviction-check-interval`.
//!
//! Effects leave the owner: eviction dispatches are spawned through a [`Dispatcher`] (the
//! outbound HTTP call in production, a recorder in tests), each with its own timeout, so a
//! slow MP server never blocks the API. While a cycle's dispatches are in flight the next
//! cycle is skipped (counted), which bounds outbound work to one cycle.

use super::model::{Dispatch, Model};
use super::outbound;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Requests queued for the owner before handlers wait.
pub const QUEUE: usize = 1024;

type Job = Box<dyn FnOnce(&mut Model, std::time::Instant, f64) + Send>;

/// Performs one eviction dispatch; `Err` carries why it failed.
pub type Dispatcher =
    Arc<dyn Fn(Dispatch) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// Outcomes of the background work, read by the metrics.
#[derive(Debug, Default)]
pub struct LoopStats {
    /// Eviction cycles run.
    pub eviction_cycles: AtomicU64,
    /// Cycles skipped because the previous dispatches were still in flight.
    pub eviction_cycles_skipped: AtomicU64,
    /// Dispatches that succeeded.
    pub dispatches_ok: AtomicU64,
    /// Dispatches that failed (transport, timeout or non-2xx).
    pub dispatches_failed: AtomicU64,
    /// Dispatches in flight now.
    pub dispatches_in_flight: AtomicUsize,
    /// Health sweeps run.
    pub sweeps: AtomicU64,
    /// Startup-resync pages read.
    pub resync_pages: AtomicU64,
    /// Keys seeded by the startup resync.
    pub resync_keys: AtomicU64,
    /// Startup resyncs that ended early (no server, an error).
    pub resync_failed: AtomicU64,
}

/// The owner has stopped (shutdown).
#[derive(Debug, thiserror::Error)]
#[error("the coordinator is shutting down")]
pub struct Stopped;

/// A cheap handle to the owner task.
#[derive(Clone)]
pub struct Handle {
    tx: mpsc::Sender<Job>,
    /// Background outcomes.
    pub stats: Arc<LoopStats>,
}

impl Handle {
    /// Runs `f` on the model (with monotonic and wall-clock now) and returns its result.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn with<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Model, std::time::Instant, f64) -> R + Send + 'static,
    ) -> Result<R, Stopped> {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |m, now, wall| {
            let _ = tx.send(f(m, now, wall));
        });
        self.tx.send(job).await.map_err(|_| Stopped)?;
        rx.await.map_err(|_| Stopped)
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

/// Spawns the owner task on `tasks`.
pub fn spawn(
    model: Model,
    timing: Timing,
    dispatcher: Dispatcher,
    shutdown: CancellationToken,
    tasks: &TaskTracker,
) -> Handle {
    let (tx, rx) = mpsc::channel(QUEUE);
    let stats = Arc::new(LoopStats::default());
    let handle = Handle {
        tx,
        stats: Arc::clone(&stats),
    };
    let spawner = tasks.clone();
    tasks.spawn(owner(
        model, rx, timing, dispatcher, stats, shutdown, spawner,
    ));
    handle
}

fn wall_now() -> f64 {
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

async fn owner(
    mut model: Model,
    mut rx: mpsc::Receiver<Job>,
    timing: Timing,
    dispatcher: Dispatcher,
    stats: Arc<LoopStats>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) {
    let mut sweep = interval(timing.health_check_interval);
    let mut evict = interval(timing.eviction_check_interval);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            job = rx.recv() => match job {
                Some(job) => job(&mut model, Instant::now().into_std(), wall_now()),
                None => break,
            },
            () = tick_or_never(&mut sweep) => {
                stats.sweeps.fetch_add(1, Ordering::Relaxed);
                let gone = model.sweep(Instant::now().into_std(), timing.instance_timeout);
                for id in gone {
                    tracing::info!(instance_id = %id, "instance timed out; removed");
                }
            }
            () = tick_or_never(&mut evict) => {
                if stats.dispatches_in_flight.load(Ordering::Acquire) > 0 {
                    stats.eviction_cycles_skipped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                stats.eviction_cycles.fetch_add(1, Ordering::Relaxed);
                for d in model.plan_evictions(rand::random()) {
                    stats.dispatches_in_flight.fetch_add(1, Ordering::AcqRel);
                    let (stats, dispatcher) = (Arc::clone(&stats), Arc::clone(&dispatcher));
                    tasks.spawn(async move {
                        let (target, n) = (d.instance_id.clone(), d.keys.len());
                        match dispatcher(d).await {
                            Ok(()) => stats.dispatches_ok.fetch_add(1, Ordering::Relaxed),
                            Err(e) => {
                                tracing::warn!(instance_id = %target, keys = n, "eviction dispatch failed: {e}");
                                stats.dispatches_failed.fetch_add(1, Ordering::Relaxed)
                            }
                        };
                        stats.dispatches_in_flight.fetch_sub(1, Ordering::AcqRel);
                    });
                }
            }
        }
    }
}

/// The production dispatcher: `DELETE http://ip:port/cache/objects {"keys": [...]}` with
/// `timeout`; any 2xx is success.
pub fn http_dispatcher(timeout: Duration) -> Dispatcher {
    Arc::new(move |d: Dispatch| {
        Box::pin(async move {
            let body = serde_json::to_vec(&serde_json::json!({ "keys": d.keys }))
                .map_err(|e| e.to_string())?;
            let reply = outbound::call(
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
    use crate::coordinator::events::{Batch, Op, Tier};
    use crate::coordinator::fleet::Registration;
    use crate::coordinator::keys::EncodedKey;
    use crate::coordinator::model::ModelConfig;

    fn model() -> Model {
        Model::new(ModelConfig {
            max_instances: 8,
            max_tracked_keys: 100,
            max_quotas: 8,
            eviction_ratio: 0.5,
            trigger_watermark: 1.0,
        })
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

    #[tokio::test(start_paused = true)]
    async fn eviction_cycles_dispatch_and_skip_while_in_flight() {
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let (dispatcher, mut seen) = recorder();
        let timing = Timing {
            instance_timeout: Duration::from_secs(30),
            health_check_interval: None,
            eviction_check_interval: Some(Duration::from_secs(5)),
        };
        let h = spawn(model(), timing, dispatcher, shutdown.clone(), &tasks);
        h.with(|m, now, wall| {
            m.register(reg("s1"), String::new, now, wall).unwrap();
            m.ingest([stores(4)]);
        })
        .await
        .unwrap();
        // Nothing before the first period.
        tokio::time::sleep(Duration::from_millis(4_900)).await;
        assert!(seen.try_recv().is_err());
        let (d, done) = tokio::time::timeout(Duration::from_secs(1), seen.recv())
            .await
            .unwrap()
            .unwrap();
        // No quota for "t": every key goes.
        assert_eq!((d.instance_id.as_str(), d.keys.len()), ("s1", 4));
        // Two more periods (at 10 s and 15 s) with the dispatch unreleased: both skipped.
        tokio::time::sleep(Duration::from_secs(12)).await;
        assert!(seen.try_recv().is_err());
        assert_eq!(h.stats.eviction_cycles_skipped.load(Ordering::Relaxed), 2);
        done.send(()).unwrap();
        // Usage never came back down (no delete events): the next cycle re-plans (at least once).
        let (again, done2) = tokio::time::timeout(Duration::from_secs(6), seen.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(again.keys.len(), 4);
        drop(done2);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(h.stats.dispatches_ok.load(Ordering::Relaxed), 1);
        assert_eq!(h.stats.dispatches_failed.load(Ordering::Relaxed), 1);
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
        let count = |h: Handle| async move { h.with(|m, _, _| m.fleet().len()).await.unwrap() };
        h.with(|m, now, wall| {
            m.register(reg("quiet"), String::new, now, wall).unwrap();
            m.register(reg("chatty"), String::new, now, wall).unwrap();
        })
        .await
        .unwrap();
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_secs(10)).await;
            h.with(|m, now, _| m.heartbeat("chatty", now))
                .await
                .unwrap();
        }
        // 40 s: "quiet" was last seen at 0, removed by the sweep at 40 (> 30 s silent).
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(count(h.clone()).await, 1);
        assert!(h.stats.sweeps.load(Ordering::Relaxed) >= 4);
        shutdown.cancel();
    }
}
