//! `kvplane router` (issue 23, docs/ROUTER.md): an OpenAI-compatible front in front of N
//! vLLM or SGLang engines that sends each request to the engine holding the most of its
//! prompt's KV cache, weighed against the load it tracks.
//!
//! The service's anatomy (docs/ARCHITECTURE.md), as every service's:
//! - this file: starting it ([`start`], [`start_beside`], `--doctor`), the server type;
//! - [`config`]: its flags and their validated form, [`RouterConfig`];
//! - `model/`: the pure state — the decision (`score`), predicted against delivered cached
//!   tokens (`accounting`), one engine's shared reservations (`slots`), the sessions'
//!   engines (`sessions`), which registrations become engines (`discovery`), an engine's
//!   Prometheus text read (`scrape`); no I/O, no clock;
//! - the driver: `serve.rs` (starting the parts: the tokenizer, the engines' publishers in the
//!   index, the HTTP stack, the loops), `state.rs` (`RouterState`: the engines and their load,
//!   the in-process index, the tokenizer, the decision and its reservation), [`tokenize`]
//!   (tokenizer.json and the chat template), [`upstream`] (engine calls with timeouts),
//!   [`doctor`] (the hash-parity probe), `discovery.rs`, `scrape.rs` and `health.rs` (the
//!   loops reading the registrations, the engines' metrics and their health);
//! - `cluster.rs`: `--cluster`, the reservations the replicas share;
//! - `routes/`: the one route table, one file per resource (the OpenAI routes, the probes,
//!   `/router/*`);
//! - `metrics.rs`: its metric families.
//!
//! The index is the indexer's own ([`crate::indexer`]), run in process and fed by
//! the engines' KV events.

mod cluster;
pub mod config;
mod discovery;
pub mod doctor;
mod health;
mod metrics;
pub(crate) mod model;
mod routes;
mod scrape;
mod serve;
pub(crate) mod state;
pub mod tokenize;
pub mod upstream;

use crate::indexer::IndexerConfig;
use crate::service::{Running, StartError};
use state::RouterState;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub use config::{EngineSpec, RouterArgs, RouterConfig};
pub use model::score::Weights;

/// The running router's state.
pub struct Router {
    /// The bound HTTP address.
    pub addr: SocketAddr,
    /// The in-process indexer's HTTP address.
    pub indexer_addr: SocketAddr,
    /// The shared state.
    pub state: Arc<RouterState>,
}

/// A running router (`server.addr`, `server.state` through `Deref`); stopping it stops the
/// in-process indexer after the router's own tasks.
pub type RouterServer = Running<Router>;

/// Starts the in-process indexer (on 127.0.0.1, `--indexer-port`), then the router over its
/// index ([`start_beside`]); stopping the router stops that indexer after the router's own
/// tasks.
///
/// # Errors
/// [`StartError`]: a port cannot be bound, the model directory cannot be loaded, an
/// engine's publisher cannot be registered.
pub async fn start(config: RouterConfig) -> Result<RouterServer, StartError> {
    let index = crate::indexer::index::IndexConfig {
        seed: config.hash_seed,
        ..Default::default()
    };
    let indexer = crate::indexer::start(IndexerConfig {
        host: "127.0.0.1".into(),
        port: config.indexer_port,
        index,
        ..IndexerConfig::default()
    })
    .await?;
    match serve::launch(config, Arc::clone(&indexer.state), indexer.addr).await {
        Ok(router) => Ok(router.after_drain(move || indexer.stop())),
        Err(e) => {
            indexer.stop().await;
            Err(e)
        }
    }
}

/// Starts the router over an indexer that runs beside it in this process (`kvplane serve
/// --router-port` with `--indexer-port`), at `index_addr`: the router asks its index directly,
/// registers `--engine`'s publishers there, and hashes with its seed. Stopping the router
/// leaves the indexer running.
///
/// # Errors
/// As [`start`].
pub async fn start_beside(
    mut config: RouterConfig,
    index: Arc<crate::indexer::IndexerState>,
    index_addr: SocketAddr,
) -> Result<RouterServer, StartError> {
    config.hash_seed = index.hash_seed();
    serve::launch(config, index, index_addr).await
}

/// `--doctor`: starts the router's parts (bound as configured), waits for the engines'
/// publishers to connect (at most `wait`), probes every engine, stops.
///
/// # Errors
/// [`StartError`] as [`start`].
pub async fn doctor(
    config: RouterConfig,
    wait: Duration,
) -> Result<Vec<doctor::Verdict>, StartError> {
    Ok(doctor::at_start(start(config).await?, wait).await)
}
