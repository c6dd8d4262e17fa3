//! The MP coordinator (`kvplane coordinator`): its routes through `oneshot`, the key
//! directory against LMCache 0.5.6's recorded answers, its HTTP limits, and the binary (flags,
//! SIGTERM, checkpoints). One test binary; all modules share `tests/support`.

#[path = "../support/mod.rs"]
mod support;

mod added_routes;
mod api;
mod app;
mod binary;
mod checkpoint;
mod directory;
mod forwarding;
mod limits;
