//! What the indexer's in-process measurements share: the streams, prompts and query scope of
//! `benches/indexer.rs` (criterion) and `examples/indexer_ingest.rs` (10M blocks), included
//! by both with `#[path]`.

use kvplane::indexer::index::{LoraNs, QueryScope, StreamSpec};

/// Tokens per block.
pub(crate) const BS: u32 = 16;
/// Blocks per prompt.
pub(crate) const PROMPT: u32 = 128;

/// Stream `i`: a base-model vLLM engine `vllm-{i}` at rank 0.
pub(crate) fn spec(i: u32) -> StreamSpec {
    StreamSpec {
        tenant: "default".into(),
        instance: format!("vllm-{i}"),
        dp_rank: 0,
        model: "m".into(),
        lora: String::new(),
        block_size: BS,
        salt: String::new(),
        shared: false,
    }
}

/// Prompt `p`: [`PROMPT`] blocks of tokens no other prompt shares.
pub(crate) fn prompt(p: u32) -> Vec<u32> {
    (0..BS * PROMPT)
        .map(|t| p.wrapping_mul(1_000_003) ^ t)
        .collect()
}

/// The queries' scope: the streams of [`spec`].
pub(crate) fn scope() -> QueryScope<'static> {
    QueryScope {
        tenant: "default",
        model: "m",
        lora: LoraNs::Name(String::new()),
        block_size: BS,
        salt: "",
        instance: None,
    }
}
