//! `kvplane coordinator`: the LMCache MP coordinator (fleet membership, per-tenant L2 quotas,
//! usage events, fleet-wide eviction, warm prefetch, startup resync) in Rust. See
//! docs/COORDINATOR.md.
//!
//! The service's anatomy (docs/ARCHITECTURE.md, "One service anatomy"):
//! - this file — the face: [`CoordinatorConfig`], [`start`], the server type.
//! - [`config`] — the validated configuration and its defaults; [`config::args`] the flags
//!   and their layers (also read for the coordinator `kvplane serve --coordinator-port` runs).
//! - [`model`] — the pure state: keys, holders, fleet, events, usage, pins, the key
//!   directory, the eviction decision. No I/O, no clock (`now` is passed in).
//! - [`state`] — the owners: two tasks holding the model ([`state::driver`]), changed only
//!   through logged methods; the metadata and checkpoint files, the change log and snapshots
//!   of `--cluster`, the startup resync, calls to MP servers; `serve` starts them.
//! - [`routes`] — the axum routes, one file per resource, their access policy and
//!   `/openapi.json`.
//! - `metrics.rs` — `GET /metrics` text, every series under `kvplane_coordinator_`.
//! - [`cluster`] — `--cluster` (docs/CLUSTER.md): follow the log as a standby, take the
//!   lease, serve the followed state as the only dispatcher.
//!
//! [`start`] binds (port 0 works) and returns a [`CoordinatorServer`] with the bound address;
//! [`cluster::run`] serves as a cluster's leader, after following it as a standby. This
//! module must not touch the controller's state ([`crate::controller`]) or its index.

pub mod cluster;
pub mod config;
mod metrics;
pub mod model;
pub mod routes;
pub mod state;

pub use config::{CoordinatorConfig, Features};
// What `cluster::run` composes: the same start as [`start`], around a followed state.
pub(crate) use state::{bind, initial_model, serve, Leading};

use crate::service::{Running, StartError};
use state::api_state::ApiState;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The running coordinator's state.
pub struct Coordinator {
    /// The bound HTTP address.
    pub addr: SocketAddr,
    /// The model's owner, for tests and embedding.
    pub handle: state::driver::Handle,
}

/// A running coordinator (`c.addr`, `c.handle` through `Deref`). Its stop stops the HTTP
/// server first and, with `--checkpoint-path`, writes a last checkpoint before the rest.
pub type CoordinatorServer = Running<Coordinator>;

/// Binds the HTTP port and starts the owner task and the server.
///
/// # Errors
/// [`StartError::Bind`] if the port cannot be bound.
pub async fn start(config: CoordinatorConfig) -> Result<CoordinatorServer, StartError> {
    let bound = bind(&config).await?;
    let state = state::changes::CoordinatorState::new(initial_model(&config));
    Ok(serve(
        config,
        bound,
        state,
        None,
        CancellationToken::new(),
        TaskTracker::new(),
    ))
}

/// The routes' shared state for `config` around an owner handle (a standalone coordinator's;
/// for [`routes::router`] in process).
pub fn api_state(config: &CoordinatorConfig, handle: state::driver::Handle) -> Arc<ApiState> {
    ApiState::new(config, handle, None)
}
