//! The controller (`kvplane serve`, the LMCache controller): its state as a plain model, the
//! driver that owns it, and the async side (socket loops, per-worker downlinks, the liveness
//! sweep). Laid out as every service is (docs/ARCHITECTURE.md, "One service anatomy"):
//!
//! * `config` — `kvplane serve`'s flags and LMCache's controller configuration forms.
//! * `model/` — the pure state, no I/O, no clock, no tokio: [`ControllerState`] (the chunk
//!   index, the downlink registry, the command log; one function per message, each returning
//!   the reply and the [`Effect`]s to perform), its effects, the `/check_finish` command log,
//!   the `--cluster` change log and the chunk index itself (`model::index`).
//! * `driver` — [`Driver`], the owner: one lock over the model and the live downlink tasks;
//!   applies a message and performs its effects atomically. `report` — the metrics and log
//!   lines of what the model reports; `clock` — [`Clock`], the one source of time (tokio's,
//!   so tests can pause it).
//! * The tasks: `loops` (the PULL and ROUTER sockets), `downlink` (one per worker),
//!   `liveness` (the probe-then-remove sweep); `socket_stats` — their live counters;
//!   `limits` — counting and throttled logging of resource-limit hits; `peer_drops` — the
//!   transport's dropped peers.
//! * `routes/` — the HTTP routes, one file per resource, the dashboard and its history.
//! * `metrics` — every metric name and help text of the controller.
//! * `serve` — starting it: bind the sockets, spawn the loops, return the
//!   [`crate::service::Running`] handle; `--cluster`'s standby, leader and replica, with
//!   `cluster` (the standby on the replication core).
//!
//! Decides nothing about the wire format (that is `protocol`) and touches sockets only
//! through `transport`.

mod clock;
pub mod cluster;
pub mod config;
mod downlink;
mod driver;
mod limits;
pub mod liveness;
pub mod loops;
mod metrics;
pub mod model;
mod peer_drops;
mod report;
pub mod routes;
mod serve;
mod socket_stats;

pub use clock::Clock;
pub use downlink::{Downlink, DownlinkError};
pub use driver::{BoundAddrs, DownlinkEntry, Driver};
pub use model::{ControllerState, Effect, FrameDropReason, ModelEvent, RouterKind, WorkerKey};

pub use serve::{
    run_leader, run_replica, serve_shared, standby, start, start_with_clock, Controller,
    Leadership, Server,
};
