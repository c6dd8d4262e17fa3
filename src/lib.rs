//! # kvplane
//!
//! A control plane for distributed LLM KV caches, wire-compatible with the LMCache 0.5.6
//! controller: a real LMCache worker pointed at `kvplane serve` works unchanged.
//!
//! ## Layout
//!
//! Read the modules in this order; dependencies point one way, down this list:
//!
//! - [`protocol`] — the 51 LMCache message types, msgspec-identical encoding, tolerant
//!   decoding, [`protocol::ChunkHash`] (the whole `i64 ∪ u64` range). Pure.
//! - [`transport`] — the only code that touches the `zeromq` crate: PULL, ROUTER and REQ
//!   wrappers with timeouts, fresh sockets after failures.
//! - [`controller`] — the controller's state as a plain model (`ControllerState`: index, downlink
//!   registry, command log; one function per message returning the effects to perform), its
//!   driver (`Driver`: one lock over the model and the live downlink tasks), its HTTP routes,
//!   the async tasks (the PULL loop, the two ROUTER loops, one downlink per worker, the
//!   liveness sweep) and `controller::serve`, which starts it (`kvplane serve`, with
//!   `--cluster` as standby, leader or read replica).
//! - [`service`] — the skeleton every service stands on: the `Running` handle `start()`
//!   returns, the one `StartError`, the runner `main` runs every subcommand with, and the
//!   configuration layers (flag, `KVPLANE_<SERVICE>_<FLAG>`, the replaced system's
//!   variables, `--config` file, default). Knows no service.
//! - [`web`] — HTTP plumbing shared by every service (errors, body schemas, auth, the CSRF
//!   guard, request metrics, static assets, the server loop and its limits). Knows no service.
//! - [`coordinator`] — `kvplane coordinator`, the LMCache MP coordinator (fleet membership,
//!   quotas, usage events, eviction, warm prefetch): a pure model driven by one task, its
//!   axum routes and its calls to MP servers (see docs/COORDINATOR.md).
//! - [`config`] — every default, the validated `ServeConfig` and the value parsers the
//!   services' flags share (each service's clap flags live in its own module).
//! - [`bench`] — `kvplane bench`, a load generator for any LMCache-compatible controller
//!   (protocol + transport only).
//! - [`indexer`] — `kvplane indexer`, the router-facing KV indexer (docs/INDEXER.md): a pure
//!   model (standard XXH3 hashing, vLLM/SGLang/Mooncake event decoding, the prefix index,
//!   replay state machine) in `indexer::model`, its owner, tasks and routes around it.
//! - [`node`] — `kvplane node`, a cache node speaking LMCache 0.5.6's `lm://` server
//!   protocol with L1 memory and L2 disk tiers (see docs/NODE.md).
//! - [`router`] — `kvplane router`, the cache-aware OpenAI-compatible router in front of
//!   vLLM/SGLang engines (see docs/ROUTER.md); it runs the indexer's index in process.
//! - [`worker`] — the library workers link to join a kvplane or LMCache controller
//!   (protocol + transport only; see docs/WORKER.md).
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
