//! The controller's pure state: what it knows, as plain values changed by plain functions.
//! No I/O, no clock (callers pass `now`), no tokio, no locks — tested without a runtime.
//!
//! * `state` — [`ControllerState`]: index, downlink registry, command log; one function per
//!   message, each returning the reply and the [`Effect`]s to perform.
//! * `effects` — those effects, and the reasons a message was dropped or a worker removed.
//! * `command_log` — the `/check_finish` bookkeeping of orchestration commands.
//! * `changes` — the `--cluster` change log: the applied inputs as [`changes::Change`]s and
//!   the [`ControllerState`] as the replication core's `Replicated` state.
//! * `index` — the chunk index: registry (instance → worker → location), the reverse index
//!   chunk hash → holders, the sequence check and the full-sync tracker.
//!
//! The driver (`super::driver`) owns one [`ControllerState`] under its lock and performs the
//! effects.

pub(crate) mod changes;
pub(crate) mod command_log;
mod effects;
pub mod index;
mod state;

pub use effects::{Effect, FrameDropReason, ModelEvent, RemovalReason, WorkerKey};
pub use state::{
    ControllerDump, ControllerState, DownlinkRecord, ProbeTarget, RequestContext, RouterKind,
};
