//! The controller's pure state: what it knows, as plain values changed by plain functions.
//! No I/O, no clock (callers pass `now`), no tokio, no locks — tested without a runtime.
//!
//! * `state` — [`Fleet`]: index, downlink registry, command log; one function per message,
//!   each returning the reply and the [`Effect`]s to perform.
//! * `effects` — those effects, and the reasons a message was dropped or a worker removed.
//! * `command_log` — the `/check_finish` bookkeeping of orchestration commands.
//! * `changes` — the `--cluster` change log: the applied inputs as [`changes::Change`]s and
//!   the [`Fleet`] as the replication core's `Replicated` state.
//! * `index` — the chunk index: registry (instance → worker → location), the reverse index
//!   chunk hash → holders, the sequence check and the full-sync tracker.
//!
//! The driver (`super::driver`) owns one [`Fleet`] under its lock and performs the effects.

pub mod changes;
pub mod command_log;
mod effects;
pub mod index;
mod state;

pub use effects::{DropReason, Effect, Event, RemovalReason, WorkerKey};
pub use state::{DownlinkRecord, Fleet, FleetDump, ProbeTarget, RequestContext, RouterKind};
