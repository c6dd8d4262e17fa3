//! `kvplane node`: a cache server speaking LMCache 0.5.6's `lm://` protocol, with an L1
//! memory tier and an L2 disk tier (docs/NODE.md). The service anatomy of
//! docs/ARCHITECTURE.md:
//!
//! - `config/` — the flags (`NodeArgs`, `args.rs`; LMCache's `--l2-adapter` JSON in
//!   `l2_adapter.rs`), validated into [`NodeConfig`].
//! - `model/` — the pure parts: the `lm://` wire format (`codec`: 186-byte request, 36-byte
//!   reply headers), the eviction policy both tiers share (`lru`), the `compress` command's
//!   codecs (`compress`), LMCache key names and token hashing (`keys`), the warm prefetch
//!   job table (`prefetches`).
//! - `tiers/` — the owner: L1 + L2 with the store and prefetch policies (`TieredStore`),
//!   L2's disk work off the async threads (`l2`, on `disk`'s file format), scans and deletes
//!   over both tiers' keys (`keys`), the controller's commands (`ops`).
//! - `lm/` — the `lm://` listener: the accept loop, the per-connection loop (`connection`) on
//!   a task or a thread of its own (`threads`), object bodies in page-exact mappings
//!   (`buffers`) over the L1 preallocation (`arena`).
//! - `controller_link/` — the node as a controller's LMCache worker, one per TP rank: what
//!   each tier holds (`report`), the controller's commands (`commands`), `/move`'s PUTs to
//!   another node (`peer`).
//! - `coordinator_link.rs` — registration, heartbeats and cache events to a coordinator.
//! - `routes/` — the HTTP listener (`--http-port`): the coordinator's objects and warm
//!   prefetch, the controller's pins, the dashboard, `/openapi.json`; every refusal's status
//!   in `error.rs`.
//! - `metrics.rs` — the node's own prometheus registry.
//!
//! This module owns nothing of the controller's (`crate::controller`, its metrics included)
//! and must not touch it.

pub mod config;
mod controller_link;
mod coordinator_link;
mod lm;
mod metrics;
pub mod model;
mod routes;
mod tiers;

pub use config::{ConnectionModel, NodeConfig};
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
    tiers: Arc<tiers::TieredStore>,
    /// L2 writes, reads and deletes.
    background: TaskTracker,
    /// Reports to the controller, if one is configured.
    reporter: Option<Arc<controller_link::report::ControllerReporter>>,
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
    let preallocation = lm::preallocate(config.l1_preallocate, &metrics).await?;
    let mut observers: tiers::Observers = Vec::new();
    let reporter = config.controller.as_ref().map(|_| {
        Arc::new(controller_link::report::ControllerReporter::new(
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
    let (tiers, recovery) =
        tiers::TieredStore::start(&config, Arc::clone(&metrics), background.clone(), observers)
            .await?;

    let chunks = model::keys::TokenChunks {
        chunk_size: config.chunk_size,
        none_hash: config.lookup_none_hash,
    };
    let lm_addr = host_port(&config.host, config.port);
    let (listener, lm) = bind_tcp("lm", &lm_addr).await?;
    let http = match config.http_port {
        None => None,
        Some(port) => {
            let (listener, bound) = bind_tcp("http", &host_port(&config.host, port)).await?;
            let app = routes::router(&config, Arc::clone(&tiers), Arc::clone(&metrics), chunks);
            routes::serve(listener, app, &config, &metrics, &shutdown, &tasks);
            Some(bound)
        }
    };
    lm::serve(
        listener,
        &config,
        Arc::clone(&tiers),
        Arc::clone(&metrics),
        preallocation,
        &shutdown,
        &tasks,
    );
    if let (Some(r), Some(wc)) = (&reporter, &config.controller) {
        let ranks = controller_link::RankWorkers::new(
            wc,
            &config,
            lm.port(),
            Arc::clone(&tiers),
            Arc::clone(&metrics),
            chunks,
            Arc::clone(r),
        )
        .await;
        ranks.start_all(config.tp_ranks, &shutdown, &tasks).await?;
    }
    let link = match (&config.coordinator, events, http) {
        (Some(c), Some(events), Some(http)) => Some(coordinator_link::CoordinatorLink::spawn(
            &config,
            c,
            events,
            Arc::clone(&metrics),
            http.port(),
        )),
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
        if let Some(link) = link {
            link.stop(DRAIN_DEADLINE).await;
        }
        if let Some(r) = &stopping {
            controller_link::stop(r).await;
        }
    });
    if let Some(a) = http {
        running = running.with_addr("http", a);
    }
    Ok(running)
}
