//! The whole system and its plumbing: the `kvplane serve` binary, the architecture rule,
//! resource limits, fault injection, the dashboards in a real browser, `kvplane bench` smoke
//! runs, and the transport's learning and limit tests. One test binary; all modules share
//! `tests/support`.

#[path = "../support/mod.rs"]
mod support;

mod architecture;
mod auth;
mod bench_indexer;
mod bench_smoke;
mod binary;
mod dashboard;
mod dashboard_services;
mod faults;
mod resource_limits;
mod transport;
mod transport_limits;
