//! `kvplane coordinator`: the LMCache MP coordinator (fleet membership, per-tenant L2 quotas,
//! usage events, fleet-wide eviction, warm prefetch) in Rust. See docs/COORDINATOR.md.
//!
//! Layout, pure first:
//! - [`keys`] — tracked L2 keys: compact 48-byte slots, per-salt usage and LRU order.
//! - [`fleet`] — registered MP servers, heartbeats, the timeout sweep.
//! - [`events`] — the two usage-event bodies (documented `POST /quota/events`, 0.5.6
//!   `POST /events`) and the per-instance sequence gate.
//! - [`model`] — the whole state as one struct; the eviction decision as a pure function.
//!
//! This module must not touch the controller's state ([`crate::controller`]) or its index.

pub mod events;
pub mod fleet;
pub mod keys;
pub mod model;
