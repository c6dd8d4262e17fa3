//! The whole system and its plumbing: the `kvplane serve` binary, the architecture rule,
//! resource limits, fault injection, the dashboards in a real browser, `kvplane bench` smoke
//! runs, every service's `/metrics` through a real text-format parser, and the transport's
//! learning and limit tests. One test binary; all modules share
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
mod faults_abuse;
mod metrics_format;
mod resource_limits;
mod transport;
mod transport_limits;
