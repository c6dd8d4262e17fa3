//! The controller: its state as a plain model, the driver that owns it, and the async side
//! (socket loops, per-worker downlinks, the liveness sweep).
//!
//! * `model` — [`Fleet`]: index, downlink registry, command log; one function per message,
//!   each returning the reply and the [`Effect`]s to perform (declared in `effects`). No I/O,
//!   clock or tokio.
//! * `driver` — [`Shared`]: one lock over the model and the live downlink tasks; applies a
//!   message and performs its effects atomically.
//! * `report` — metrics and log lines for what the model reports.
//! * `clock` — [`Clock`], the one source of time (tokio's, so tests can pause it).
//! * `config` — `kvplane serve`'s flags and LMCache's controller configuration forms.
//! * `serve` — starting it: bind the sockets, spawn the loops, return the
//!   [`crate::service::Running`] handle; `--cluster`'s standby, leader and replica.
//! * `loops`, `downlink`, `liveness` — the tasks; `socket_stats` — their live counters;
//!   `limits` — counting and throttled logging of resource-limit hits; `command_log` —
//!   `/check_finish` bookkeeping.
//!
//! Decides nothing about the wire format (that is `protocol`) or the bookkeeping (that is
//! `index`), and touches sockets only through `transport`.

pub mod clock;
pub mod cluster;
pub mod config;
pub mod downlink;
pub mod driver;
pub mod limits;
pub mod liveness;
pub mod loops;
pub mod metrics;
pub mod model;
pub mod peer_drops;
mod report;
pub mod socket_stats;

pub use clock::Clock;
pub use downlink::{Downlink, DownlinkError};
pub use driver::{BoundAddrs, DownlinkEntry, Shared};
pub use model::{DropReason, Effect, Event, Fleet, RouterKind, WorkerKey};
pub mod routes;
pub mod serve;

pub use serve::{
    run_leader, run_replica, serve_shared, standby, start, start_with_clock, Controller,
    Leadership, Server,
};
