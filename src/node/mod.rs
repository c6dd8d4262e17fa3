//! `kvplane node`: a cache server speaking LMCache 0.5.6's `lm://` protocol, with an L1
//! memory tier and an L2 disk tier (docs/NODE.md).
//!
//! - `args` — `kvplane node`'s flags ([`args::NodeArgs`]), validated into [`NodeConfig`].
//! - `codec` — the wire format (186-byte request, 36-byte reply headers). Pure.
//! - `lru` — the eviction policy both tiers share (budget, watermark, ratio, pins). Pure.
//! - `disk` — L2's file format and blocking file operations.
//! - `tiers` — L1 + L2 with the store and prefetch policies; disk work off the async threads.
//! - `server` — the accept loop and the per-connection request loop.
//! - `http` and `metrics` — `/metrics` and `/healthz` on `--http-port`, with the node's own
//!   prometheus registry; `dashboard` — the node's page and its JSON feed on the same port;
//!   `objects` and `prefetch` — the coordinator's object and warm-prefetch routes there.
//! - `report` — admits and evicts per tier to a controller, through `crate::worker`.
//! - `coordinator_link` — registration, heartbeats and L2 usage events to a coordinator.
//!
//! This module owns nothing of the controller's (`crate::controller`, its metrics included)
//! and must not touch it.

mod arena;
pub mod args;
mod buffers;
pub mod codec;
mod commands;
mod compress;
pub mod config;
mod connection;
mod coordinator_link;
mod dashboard;
mod disk;
mod http;
mod lru;
pub mod metrics;
mod objects;
mod openapi;
mod peer;
mod pins;
mod prefetch;
mod report;
mod server;
mod server_threads;
mod tiers;

pub use config::{ConnectionModel, NodeConfig};
pub use coordinator_link::parse_url as parse_coordinator_url;
pub use tiers::{Recovery, TierUsage};

use crate::net::host_port;
use crate::service::{bind_tcp, Running, StartError};
use metrics::NodeMetrics;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long a [`NodeServer`]'s stop waits for connections and L2 writes to finish.
const DRAIN_DEADLINE: Duration = Duration::from_secs(10);

/// The addresses a node bound.
#[derive(Debug, Clone, Copy)]
pub struct NodeAddrs {
    /// The LMCache protocol listener (`lm://` this).
    pub lm: SocketAddr,
    /// The HTTP listener, if any.
    pub http: Option<SocketAddr>,
}

/// A running node's state (its methods reached through [`NodeServer`]'s `Deref`).
pub struct Node {
    /// The bound addresses.
    pub addrs: NodeAddrs,
    /// What L2 recovery found at start.
    pub recovery: Recovery,
    /// The node's metrics.
    pub metrics: Arc<NodeMetrics>,
    tiers: Arc<tiers::Tiers>,
    /// L2 writes, reads and deletes.
    background: TaskTracker,
    /// Reports to the controller, if one is configured.
    reporter: Option<Arc<report::Reporter>>,
}

/// A running node. Its stop stops accepting, closes connections, waits for in-flight L2
/// writes (bounded), then posts the last events to the coordinator and deregisters from it
/// and the controller.
pub type NodeServer = Running<Node>;

impl Node {
    /// What each tier holds now.
    #[must_use]
    pub fn usage(&self) -> TierUsage {
        self.tiers.usage()
    }

    /// Whether `key` is in L1 now.
    #[must_use]
    pub fn in_l1(&self, key: &str) -> bool {
        self.tiers.in_l1(key)
    }

    /// Waits (bounded) until every L2 write and delete started so far has finished.
    pub async fn flush(&self) {
        self.background.close();
        if tokio::time::timeout(DRAIN_DEADLINE, self.background.wait())
            .await
            .is_err()
        {
            tracing::warn!("L2 work did not finish within {DRAIN_DEADLINE:?}");
        }
        self.background.reopen();
    }

    /// The state and counters of TP rank 0's controller worker, if the node reports to a
    /// controller.
    #[must_use]
    pub fn controller_status(&self) -> Option<crate::worker::WorkerStatus> {
        self.reporter
            .as_ref()
            .and_then(|r| r.worker())
            .map(|w| w.status())
    }

    /// Waits (bounded) until every controller worker started so far (one per TP rank) is
    /// registered with nothing held back.
    ///
    /// # Errors
    /// A worker's error after `timeout`; [`crate::worker::WorkerError::Closed`] without a
    /// controller.
    pub async fn controller_ready(
        &self,
        timeout: Duration,
    ) -> Result<(), crate::worker::WorkerError> {
        let Some(r) = &self.reporter else {
            return Err(crate::worker::WorkerError::Closed);
        };
        for (_, w) in r.workers() {
            w.wait_ready(timeout).await?;
        }
        Ok(())
    }

    /// The TP ranks with a controller worker.
    #[must_use]
    pub fn controller_ranks(&self) -> Vec<u32> {
        self.reporter
            .as_ref()
            .map(|r| r.workers().into_iter().map(|(rank, _)| rank).collect())
            .unwrap_or_default()
    }

    /// Sends the controller every report queued so far (bounded by `timeout`).
    pub async fn flush_reports(&self, timeout: Duration) {
        if let Some(r) = &self.reporter {
            for (_, w) in r.workers() {
                let _ = tokio::time::timeout(timeout, w.flush()).await;
            }
        }
    }
}

/// Starts the controller worker of one TP rank: worker id = the rank, commands and full
/// syncs limited to that rank's keys. Rank 0 binds `--controller-command-port`, the others
/// a free port each.
struct RankWorkers {
    config: crate::worker::WorkerConfig,
    tiers: Arc<tiers::Tiers>,
    metrics: Arc<NodeMetrics>,
    commands: Arc<commands::CommandConfig>,
    reporter: Arc<report::Reporter>,
}

impl RankWorkers {
    async fn start(&self, rank: u32) -> Result<(), crate::worker::WorkerError> {
        let mut wc = self.config.clone();
        wc.worker_id = i64::from(rank);
        if rank != 0 {
            wc.command_port = 0;
        }
        let handler = commands::NodeCommands {
            tiers: Arc::clone(&self.tiers),
            metrics: Arc::clone(&self.metrics),
            config: Arc::clone(&self.commands),
            rank: Some(rank),
        };
        let keys = report::ReportedKeys {
            reporter: Arc::clone(&self.reporter),
            rank,
        };
        let worker = crate::worker::Worker::start(wc, handler, keys).await?;
        tracing::info!(rank, "controller worker started for TP rank {rank}");
        self.reporter.attach(rank, worker);
        Ok(())
    }
}

/// `--l1-preallocate`: maps `bytes` and faults them in on a blocking thread, after checking
/// them against the memory the system has available (a preallocation the kernel cannot back
/// would only move the failure to the OOM killer).
async fn preallocate(
    bytes: u64,
    metrics: &NodeMetrics,
) -> Result<Option<arena::Arena>, StartError> {
    if bytes == 0 {
        return Ok(None);
    }
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    if let Some(available) = arena::available_memory() {
        if bytes > available {
            return Err(StartError::Config(format!(
                "--l1-preallocate {:.2} GiB is more than the {:.2} GiB of memory available \
                 (MemAvailable in /proc/meminfo); lower it or --l1-size-gb",
                gib(bytes),
                gib(available)
            )));
        }
    }
    let started = std::time::Instant::now();
    let arena = tokio::task::spawn_blocking(move || arena::Arena::populate(bytes))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
        .map_err(|e| {
            StartError::resource(
                format!("preallocate {:.2} GiB of L1 (--l1-preallocate)", gib(bytes)),
                e,
            )
        })?;
    metrics.l1_preallocated_bytes.set(arena.len() as i64);
    tracing::info!(
        bytes = arena.len(),
        seconds = started.elapsed().as_secs_f64(),
        "L1 preallocated and faulted in"
    );
    Ok(Some(arena))
}

/// Opens the tiers (recovering L2), binds both listeners and starts serving.
///
/// # Errors
/// [`StartError`] if a listener cannot be bound, L2 cannot be opened, the controller worker
/// cannot start or the configuration cannot work.
pub async fn start(config: NodeConfig) -> Result<NodeServer, StartError> {
    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    let background = TaskTracker::new();
    let metrics = Arc::new(NodeMetrics::new());
    if config.coordinator.is_some() && config.http_port.is_none() {
        return Err(StartError::Config(
            "a coordinator calls the node's HTTP port: --coordinator-url needs it".into(),
        ));
    }
    let preallocation = preallocate(config.l1_preallocate, &metrics).await?;
    let mut observers: tiers::Observers = Vec::new();
    let reporter = config.controller.as_ref().map(|_| {
        Arc::new(report::Reporter::new(
            Arc::clone(&metrics),
            config.l2.is_some(),
        ))
    });
    if let Some(r) = &reporter {
        observers.push(Arc::clone(r) as Arc<dyn tiers::TierObserver>);
    }
    let events = config.coordinator.as_ref().map(|c| {
        Arc::new(coordinator_link::EventQueue::new(
            c.max_queued_events,
            Arc::clone(&metrics),
        ))
    });
    if let (Some(q), Some(c)) = (&events, &config.coordinator) {
        // Reporting off: the queue stays empty, the link only registers and heartbeats.
        if c.event_reporting {
            observers.push(Arc::clone(q) as Arc<dyn tiers::TierObserver>);
        }
    }
    let (l1, l2) = (config.l1, config.l2.clone());
    let (m, t) = (Arc::clone(&metrics), background.clone());
    let opened =
        tokio::task::spawn_blocking(move || tiers::Tiers::open(l1, l2.as_ref(), m, t, observers))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    let (tiers, recovery) = opened.map_err(|source| {
        let path = config.l2.as_ref().map(|c| c.path.display().to_string());
        StartError::resource(format!("open L2 at {}", path.unwrap_or_default()), source)
    })?;
    let tiers = Arc::new(tiers);

    let chunks = commands::TokenChunks {
        chunk_size: config.chunk_size,
        none_hash: config.lookup_none_hash,
    };
    let lm_addr = host_port(&config.host, config.port);
    let (listener, lm) = bind_tcp("lm", &lm_addr).await?;
    let http = match config.http_port {
        None => None,
        Some(port) => {
            let addr = host_port(&config.host, port);
            let (l, bound) = bind_tcp("http", &addr).await?;
            let prefetches = Arc::new(prefetch::Prefetches::new(
                config.max_prefetch_jobs,
                config.chunk_size,
            ));
            let app = http::router(
                Arc::clone(&tiers),
                Arc::clone(&metrics),
                prefetches,
                chunks,
                config.http,
                config.auth.clone(),
            );
            let served = crate::web::serve(
                l,
                app,
                config.http,
                crate::web::limits::counting_hook("node", http::refusals(Arc::clone(&metrics))),
                shutdown.clone(),
            );
            tasks.spawn(async move {
                if let Err(e) = served.await {
                    tracing::error!("node HTTP server failed: {e}");
                }
            });
            Some(bound)
        }
    };
    let ctx = Arc::new(connection::ConnContext {
        tiers: Arc::clone(&tiers),
        metrics: Arc::clone(&metrics),
        max_object_bytes: config.max_object_bytes,
        read_timeout: config.read_timeout,
        max_list_bytes: config.max_list_bytes,
        bodies: buffers::BodyPool::new(
            buffers::PoolGauges {
                spare: metrics.body_pool_spare_bytes.clone(),
                preallocated_unused: metrics.l1_preallocated_unused_bytes.clone(),
                sources: metrics.body_buffers.clone(),
            },
            preallocation,
        ),
    });
    tasks.spawn(server::accept_loop(
        listener,
        ctx,
        config.connection_model,
        config.max_connections,
        shutdown.clone(),
        tasks.clone(),
    ));
    let controller_err = |e| StartError::resource("start reporting to the controller", e);
    if let (Some(r), Some(wc)) = (&reporter, &config.controller) {
        let peer_url = match &config.peer_url {
            Some(u) => u.clone(),
            None => {
                let ip = match &wc.advertise_ip {
                    Some(ip) => ip.clone(),
                    None => coordinator_link::route_ip(&wc.controller_reply).await,
                };
                host_port(&ip, lm.port())
            }
        };
        let mut wc = wc.clone();
        wc.peer_init_url = Some(peer_url.clone());
        let ranks = Arc::new(RankWorkers {
            config: wc,
            tiers: Arc::clone(&tiers),
            metrics: Arc::clone(&metrics),
            commands: Arc::new(commands::CommandConfig {
                chunks,
                peer_url,
                peer_timeout: config.read_timeout,
            }),
            reporter: Arc::clone(r),
        });
        // Rank 0 always (the node registers even when empty), then every rank its keys name:
        // those recovered from L2 now, later ones as they arrive.
        for rank in 0..config.tp_ranks.clamp(1, report::MAX_RANKS) {
            r.request(rank);
            ranks.start(rank).await.map_err(controller_err)?;
        }
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for rank in r.on_new_ranks(tx) {
            ranks.start(rank).await.map_err(controller_err)?;
        }
        let stop = shutdown.clone();
        tasks.spawn(async move {
            loop {
                let rank = tokio::select! {
                    () = stop.cancelled() => return,
                    r = rx.recv() => match r { Some(r) => r, None => return },
                };
                if let Err(e) = ranks.start(rank).await {
                    tracing::error!(
                        rank,
                        "cannot start the controller worker of TP rank {rank}: {e}"
                    );
                }
            }
        });
    }
    let link_stop = CancellationToken::new();
    let link = match (&config.coordinator, events, http) {
        (Some(c), Some(events), Some(http)) => {
            let ctx = coordinator_link::LinkContext {
                config: c.clone(),
                events,
                metrics: Arc::clone(&metrics),
                http_port: http.port(),
                capacity: (
                    config.l1.budget,
                    config.l2.as_ref().map(|l| l.eviction.budget),
                ),
            };
            Some(tokio::spawn(coordinator_link::run(ctx, link_stop.clone())))
        }
        _ => None,
    };
    tracing::info!(
        lm = %lm,
        http = ?http,
        recovered = recovery.recovered,
        discarded = recovery.discarded,
        "kvplane node listening"
    );
    let stopping = reporter.clone();
    let mut running = Running::new(
        "node",
        Node {
            addrs: NodeAddrs { lm, http },
            recovery,
            metrics,
            tiers,
            background: background.clone(),
            reporter,
        },
        shutdown,
        tasks,
    )
    .with_addr("lm", lm)
    .also_drains(background)
    .drain_deadline(DRAIN_DEADLINE)
    // The coordinator link stops after the data path, so its last events are posted.
    .after_drain(move || async move {
        link_stop.cancel();
        if let Some(link) = link {
            if tokio::time::timeout(DRAIN_DEADLINE, link).await.is_err() {
                tracing::warn!("the coordinator link did not stop within {DRAIN_DEADLINE:?}");
            }
        }
        if let Some(r) = &stopping {
            for (rank, w) in r.workers() {
                if let Err(e) = w.shutdown().await {
                    tracing::warn!(rank, "controller worker shutdown: {e}");
                }
            }
        }
    });
    if let Some(a) = http {
        running = running.with_addr("http", a);
    }
    Ok(running)
}
