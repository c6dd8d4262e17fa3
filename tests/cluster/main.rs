//! `--cluster` over a real `nats-server`: the controller's and the coordinator's hot
//! standby taking over from a SIGKILLed leader, and every service's followers restoring a
//! snapshot after the log dropped its start. One test binary; all modules share
//! `tests/support`.

#[path = "../support/mod.rs"]
mod support;

mod controller;
mod coordinator;
mod indexer;
