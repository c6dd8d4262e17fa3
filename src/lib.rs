//! # kvplane
//!
//! A control plane for distributed LLM KV caches, wire-compatible with the LMCache 0.5.6
//! controller: a real LMCache worker pointed at `kvplane serve` works unchanged.
//!
//! ## Layout
//!
//! In floor order, from the ground up: each module uses only modules above it in this list
//! (`tests/system/architecture.rs` checks the edges), and no service uses another except the
//! router, which embeds the indexer's index.
//!
//! The ground — wire types, sockets, configuration (the worker library needs only these):
//! - [`protocol`] — LMCache's 51 controller messages, msgspec-identical encoding, tolerant decoding.
//! - [`transport`] — every use of the `zeromq` crate: the sockets with their timeouts and limits.
//! - `net` — `host_port` and the local address of the route to a peer.
//! - [`config`] — every default, and the value parsers the services' flags share.
//!
//! The skeleton every service stands on (knows no service):
//! - [`memory`] — handing freed heap memory back after a burst.
//! - [`service`] — the `Running` handle `start()` returns, the one `StartError`, the runner,
//!   the flag / `KVPLANE_<SERVICE>_*` / replaced system's variables / `--config` layers, the binds.
//! - [`web`] — the HTTP stack: one route table per service (`web::route`), one body
//!   extractor (`web::json`), errors, access and tokens, TLS, limits, metrics, assets, client.
//! - [`cluster`] — `--cluster` on NATS JetStream: the replication core, the one leader loop,
//!   leases and fencing, the replication laws every replicated state is tested against.
//!
//! The clients of the services:
//! - [`worker`] — the library LMCache-compatible workers link (protocol and transport only).
//!
//! The five services, each with one anatomy (docs/ARCHITECTURE.md: `mod.rs`, `config`,
//! `model/`, the driver, `routes/`, `metrics.rs`, `cluster.rs` where replicated):
//! - [`controller`] — `kvplane serve`, the LMCache 0.5.6 cache controller (its chunk index in
//!   `controller::model::index`).
//! - [`coordinator`] — `kvplane coordinator`, the LMCache MP coordinator.
//! - [`indexer`] — `kvplane indexer`, KV events in, prefix-hit queries out.
//! - [`node`] — `kvplane node`, LMCache's `lm://` cache server with memory and disk tiers.
//! - [`router`] — `kvplane router`, the cache-aware OpenAI-compatible router.
//!
//! On top:
//! - [`bench`] — `kvplane bench`, the load generators and the router's fleet simulator.
//!
//! Every service's `start(config)` binds its sockets and returns a [`service::Running`]
//! handle (bound addresses by name, the service's state, `stop()`; dropped, it cancels);
//! port 0 works everywhere. The binary hands its services to [`service::runner`].

// Below everything: wire types, sockets, configuration. The worker library needs only these.
pub mod config;
#[cfg(feature = "worker")]
mod net;
pub mod protocol;
pub mod transport;
#[cfg(feature = "worker")]
pub mod worker;

// The server side (feature `server`, on by default).
#[cfg(feature = "server")]
pub mod bench;
#[cfg(feature = "server")]
pub mod cluster;
#[cfg(feature = "server")]
pub mod controller;
#[cfg(feature = "server")]
pub mod coordinator;
#[cfg(feature = "server")]
pub mod indexer;
#[cfg(feature = "server")]
pub mod memory;
#[cfg(feature = "server")]
pub mod node;
#[cfg(feature = "server")]
pub mod router;
#[cfg(feature = "server")]
pub mod service;
#[cfg(feature = "server")]
pub mod web;
