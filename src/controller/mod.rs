//! The controller's async side: socket loops, per-worker downlinks, the liveness sweep.
//!
//! Owns the tasks and the shared state; decides nothing about the wire format (that is
//! `protocol`) or the bookkeeping (that is `index`), and touches sockets only through
//! `transport`.

pub mod downlink;
pub mod handlers;
pub mod limits;
pub mod liveness;
pub mod loops;
pub mod peer_drops;
pub mod state;

pub use downlink::{Downlink, DownlinkError};
pub use handlers::{handle_push, handle_request, RouterKind};
pub use state::{BoundAddrs, Shared, WorkerKey};
