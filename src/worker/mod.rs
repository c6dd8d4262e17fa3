//! The worker library: what an inference engine or cache node links to join a kvplane — or
//! an LMCache 0.5.6 controller — as an LMCache worker would (protocol spec §2, §3.1–§3.6).
//!
//! It depends on [`protocol`](crate::protocol) and [`transport`](crate::transport) only,
//! never on the controller side. Read `docs/WORKER.md` for the guide; in short:
//!
//! ```no_run
//! use kvplane::worker::{MemoryKeys, NoCommands, Worker, WorkerConfig, LOCAL_CPU_BACKEND};
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), kvplane::worker::WorkerError> {
//! let mut config = WorkerConfig::new("vllm-0", 0, "127.0.0.1:8300", "127.0.0.1:8400");
//! config.heartbeat_interval = Some(Duration::from_secs(10));
//! let keys = MemoryKeys::new();
//! let worker = Worker::start(config, NoCommands, keys.clone()).await?;
//!
//! keys.admit(LOCAL_CPU_BACKEND, 42_i64); // the truth first,
//! worker.admit(LOCAL_CPU_BACKEND, 42_i64)?; // then the report (never blocks)
//! let hit = worker.p2p_lookup(&[42_i64.into()]).await?;
//! worker.shutdown().await?;
//! # let _ = hit; Ok(()) }
//! ```
//!
//! Modules, one job each:
//! * `config` — [`WorkerConfig`], [`FullSyncConfig`], [`Backoff`] (LMCache's defaults);
//! * `handler` — [`CommandHandler`], the application's answers to controller commands;
//! * `keys` — [`KeySource`], what the worker holds, and [`MemoryKeys`];
//! * `handle` — [`Worker::start`] and [`WorkerHandle`];
//! * `engine` — the background task: batching, holding, resync decisions;
//! * `batcher` — per-location batches and sequence numbers (pure);
//! * `full_sync` — one full sync, as LMCache's `FullSyncSender`;
//! * `heartbeat` — heartbeats and probes, and the `full_sync` commands they bring back;
//! * `commands` — the REP command server;
//! * `uplink` — message-level requests on the transport's sockets;
//! * `state` — counters and [`WorkerStatus`].

mod batcher;
mod commands;
mod config;
mod engine;
mod full_sync;
mod handle;
mod handler;
mod heartbeat;
mod keys;
mod state;
mod uplink;

pub use config::{Backoff, FullSyncConfig, WorkerConfig};
pub use handle::{PeerHit, Worker, WorkerHandle};
pub use handler::{CommandError, CommandHandler, CommandResult, NoCommands};
pub use keys::{KeySource, MemoryKeys, LOCAL_CPU_BACKEND};
pub use state::{WorkerState, WorkerStatus};

use crate::protocol::DecodeError;
use crate::transport::TransportError;
use std::time::Duration;
use thiserror::Error;

/// Everything the worker library can fail with.
#[derive(Debug, Error)]
pub enum WorkerError {
    /// The configuration is invalid.
    #[error("invalid worker configuration: {0}")]
    Config(String),
    /// The command socket could not be bound.
    #[error("cannot bind the command socket on {addr}: {source}")]
    Bind {
        /// The address tried.
        addr: String,
        /// The transport error.
        source: TransportError,
    },
    /// The controller did not answer in time.
    #[error("no answer from the controller within {0:?}")]
    Timeout(Duration),
    /// The connection to the controller failed.
    #[error("controller connection failed: {0}")]
    Transport(#[source] TransportError),
    /// The controller answered with `ErrorMsg`.
    #[error("controller error: {0}")]
    Controller(String),
    /// The controller answered with a message of the wrong type (its tag).
    #[error("unexpected reply from the controller: {0}")]
    UnexpectedReply(String),
    /// The controller's reply could not be decoded.
    #[error("undecodable reply from the controller: {0}")]
    Decode(#[from] DecodeError),
    /// The op queue is full; the op was dropped and a full sync will resynchronise.
    #[error("worker queue full: op dropped, a full sync will resynchronise")]
    QueueFull,
    /// The resync a call waited for failed (it is retried after a backoff).
    #[error("resync failed: {0}")]
    Resync(String),
    /// The worker has shut down.
    #[error("the worker has shut down")]
    Closed,
}

/// The Rust code blocks of `docs/WORKER.md`, compiled by `cargo test --doc` so that the guide
/// cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../docs/WORKER.md")]
pub struct WorkerGuide;
