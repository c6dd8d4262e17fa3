//! The router (`kvplane router`) end to end against engine stand-ins. One test binary; it
//! shares `tests/support` with the others.

#[path = "../support/mod.rs"]
mod support;

mod discovery;
mod load;
mod replicas;
mod routing;
mod sessions;
mod simulator;
mod split;
