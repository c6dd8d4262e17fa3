//! kvplane against the real systems it replaces or serves: LMCache workers (0.5.6, and one per
//! older controller wire), controller,
//! MP-server client and fleet, LMCache's `lm://` connector, and vLLM's KV-event publisher. The
//! Python side lives beside these modules (`tests/interop/*.py`, requirements files). One test
//! binary; all modules share `tests/support`.

#[path = "../support/mod.rs"]
mod support;

mod controller;
mod coordinator;
mod coordinator_fleet;
mod indexer_central;
mod indexer_vllm;
mod lmcache_tiers;
mod node;
mod node_ranks;
mod versions;
mod worker;
