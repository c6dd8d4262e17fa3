//! The router-facing KV indexer (`kvplane indexer`, issue 10, docs/INDEXER.md): which engine
//! instance holds the longest prefix of a prompt, on which tier and which data-parallel rank.
//!
//! The face: its configuration ([`IndexerConfig`]), [`start`] and the running [`Indexer`].
//! Inside, the service anatomy every service follows (docs/ARCHITECTURE.md):
//!
//! * `config` — the flags ([`IndexerArgs`]) validated into [`IndexerConfig`]; `embedded` for
//!   `kvplane serve --indexer-port`.
//! * `model/` — the pure model: hashing, event decoding, frames, the prefix index over its
//!   record arena, the replay state machine, the LMCache tiers' mapping, the `--cluster`
//!   change log. No I/O and no clock there: time is passed in.
//! * `state` — the owner, [`IndexerState`]: the index and the registry behind their locks,
//!   registrations. Its tasks: `publisher` (one receiver + applier per publisher), `central`
//!   (the `--bind` sockets), `backends` (who reads a Mooncake backend's events),
//!   `tier_pools` (the LMCache MP servers' tiers as pool streams).
//! * `api` — the JSON contract of the HTTP API (bodies validated into typed requests).
//! * `routes/` — the HTTP routes, one file per resource.
//! * `metrics`, `cluster` (`--cluster`: the ingester's change log, a replica's follower).
//!
//! Sockets live in [`crate::transport`]; nothing here touches the `zeromq` crate.

pub(crate) mod api;
mod backends;
mod central;
mod cluster;
mod config;
mod metrics;
pub(crate) mod model;
mod publisher;
mod routes;
mod state;
mod tier_pools;

pub use api::{EngineType, Registration, Unregistration};
pub use central::CentralConfig;
pub use config::{embedded, IndexerArgs, IndexerConfig};
pub use metrics::IndexerMetrics;
pub use model::{events, hash, index, replica, tiers};
pub use state::{IndexerState, PublisherStatus, RegistryError};

use crate::service::{bind_host, Running, StartError};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The running indexer's state.
pub struct Indexer {
    /// The bound HTTP address.
    pub addr: SocketAddr,
    /// The `--bind` SUB sockets' addresses, in flag order.
    pub binds: Vec<SocketAddr>,
    /// The shared state.
    pub state: Arc<IndexerState>,
}

/// A running indexer (`server.addr`, `server.state` through `Deref`).
pub type IndexerServer = Running<Indexer>;

/// Binds the HTTP port, registers the configured publishers and starts serving.
///
/// # Errors
/// [`StartError`] when the port cannot be bound, the publishers file is invalid or
/// `--cluster` cannot be joined.
pub async fn start(config: IndexerConfig) -> Result<IndexerServer, StartError> {
    // Message bursts and table rebuilds free big blocks: hand them back, not keep them.
    crate::memory::return_freed_promptly();
    let initial = match &config.publishers {
        Some(path) => api::publishers_file(path)?,
        None => Vec::new(),
    };
    let (listener, bound) = bind_host("http", &config.host, config.port).await?;
    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    let role = cluster::Role::join(config.cluster.as_ref(), config.replica, &shutdown, &tasks)
        .await
        .map_err(|e| StartError::Cluster(e.to_string()))?;
    let state = Arc::new(IndexerState::new(
        config,
        role,
        tasks.clone(),
        shutdown.clone(),
    ));
    cluster::follow(&state, &shutdown, &tasks)
        .await
        .map_err(|e| StartError::Cluster(e.to_string()))?;
    let binds = match central::start(&state).await {
        Ok(b) => b,
        Err(e) => {
            shutdown.cancel();
            return Err(e);
        }
    };
    if state.role.is_replica() && !initial.is_empty() {
        tracing::warn!("--publishers ignored: a replica follows the ingester's registrations");
    }
    for reg in initial.into_iter().filter(|_| !state.role.is_replica()) {
        let key = reg.key();
        if let Err(e) = state.register(reg) {
            tracing::warn!(%key, "publisher from the file not registered: {e}");
        }
    }
    if !state.role.is_replica() {
        state.spawn_sweep();
    }
    let app = routes::router(Arc::clone(&state));
    let served = crate::web::serve(
        listener,
        app,
        state.config.http_limits(),
        crate::web::limits::counting_hook("indexer", routes::refusals(&state)),
        shutdown.clone(),
    );
    tasks.spawn(async move {
        if let Err(e) = served.await {
            tracing::error!("indexer HTTP server failed: {e}");
        }
    });
    tracing::info!(http = %bound, "kvplane indexer listening");
    let mut running = Running::new(
        "indexer",
        Indexer {
            addr: bound,
            binds: binds.clone(),
            state,
        },
        shutdown,
        tasks,
    )
    .with_addr("http", bound);
    for b in binds {
        running = running.with_addr("zmq", b);
    }
    Ok(running)
}
