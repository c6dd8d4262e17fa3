//! The KV indexer (`kvplane indexer`): vLLM-format KV events over real ZMQ sockets to query
//! answers, its HTTP limits, and the binary. One test binary; all modules share
//! `tests/support`.

#[path = "../support/mod.rs"]
mod support;

mod binary;
mod events;
mod limits;
mod mooncake;
