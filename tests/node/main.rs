//! The cache node (`kvplane node`): the `lm://` protocol, L1/L2, the controller's commands,
//! reports to a controller, the coordinator's routes on it, and its HTTP limits. One test
//! binary; all modules share `tests/support`.

#[path = "../support/mod.rs"]
mod support;

mod commands;
mod coordinator;
mod limits;
mod lm;
mod report;
