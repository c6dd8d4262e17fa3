//! The hash-parity doctor (`kvplane router --doctor`, `POST /router/doctor`): sends each
//! engine a probe prompt of known token ids, waits for the blocks it publishes to reach the
//! index under the router's own key (block size, model, LoRA, salt), then sends it again and
//! checks that the engine reuses what the index attributes to it. A mismatch names its cause.
//!
//! The causes are read from the index's counters around the probe, so the doctor is exact on
//! an idle fleet (at start); under traffic other engines' events can blur them.

use super::state::{RouterState, TrackedEngine};
use super::upstream;
use crate::indexer::index::{Counters, LoraNs, QueryScope};
use axum::body::Body;
use serde_json::{json, Value};
use std::time::Duration;

/// Whole blocks in a probe prompt.
const PROBE_BLOCKS: usize = 4;

/// One engine's verdict.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Verdict {
    /// The engine's instance.
    pub instance: String,
    /// `ok`, or the cause: `unreachable`, `no_events`, `block_size`, `namespace`, `orphans`,
    /// `tokens`, `no_reuse`, `no_cached_tokens`.
    pub status: &'static str,
    /// What was seen, and what to check.
    pub detail: String,
}

impl Verdict {
    fn new(instance: &str, status: &'static str, detail: impl Into<String>) -> Self {
        Self {
            instance: instance.to_owned(),
            status,
            detail: detail.into(),
        }
    }

    /// Whether the engine and the router agree.
    pub fn ok(&self) -> bool {
        self.status == "ok"
    }
}

/// A probe prompt unique to this run and engine: token ids in `[1000, 1000 + span)`.
fn probe_tokens(block_size: usize, span: u32) -> Vec<u32> {
    let n = PROBE_BLOCKS * block_size + 1;
    (0..n)
        .map(|_| 1000 + rand::random_range(0..span.max(1)))
        .collect()
}

async fn complete(st: &RouterState, url: &str, tokens: &[u32]) -> Result<Value, String> {
    let body = json!({"model": st.config.model, "prompt": tokens, "max_tokens": 1,
                      "temperature": 0});
    let req = hyper::Request::post(format!("{url}/v1/completions"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .map_err(|e| e.to_string())?;
    let deadline = st.config.connect_timeout * 15;
    let resp = upstream::send(&st.client, req, deadline)
        .await
        .map_err(|f| format!("the probe failed: {}", f.label()))?;
    let status = resp.status();
    let bytes = upstream::read_body(resp.into_body(), 1 << 20, deadline)
        .await
        .map_err(|f| format!("the probe's answer failed: {}", f.label()))?;
    if !status.is_success() {
        return Err(format!(
            "the probe got {status}: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| format!("the probe's answer is not JSON: {e}"))
}

fn matched(st: &RouterState, instance: &str, tokens: &[u32]) -> u64 {
    st.indexer
        .query_tokens(
            &QueryScope {
                tenant: &st.config.tenant,
                model: &st.config.model,
                lora: LoraNs::Name(String::new()),
                block_size: st.config.block_size,
                salt: "",
                instance: Some(instance),
            },
            tokens,
        )
        .get(instance)
        .map_or(0, |m| m.longest_matched)
}

/// Why the probe's blocks did not reach the router's key, from the counters' change.
fn cause(
    before: Counters,
    after: Counters,
    connected: Option<bool>,
    bs: u32,
) -> (&'static str, String) {
    if after.shape_mismatch > before.shape_mismatch {
        return (
            "block_size",
            format!(
                "the engine published blocks whose size is not --block-size {bs}: start the \
                 engine with --block-size {bs} or the router with the engine's"
            ),
        );
    }
    if after.stored > before.stored {
        return (
            "namespace",
            "the engine's blocks arrived under another key: a deployment salt or cache_salt \
             the router does not use, a LoRA name, or another model name than --model"
                .into(),
        );
    }
    if after.orphans > before.orphans {
        return (
            "orphans",
            "the engine's blocks name parents the index never saw (events were lost): check \
             the replay endpoint"
                .into(),
        );
    }
    if after.opaque > before.opaque {
        return (
            "namespace",
            "the engine's blocks carry multimodal or embedding keys, which tokens cannot identify"
                .into(),
        );
    }
    let link = match connected {
        Some(true) => "its publisher is connected",
        Some(false) => "its publisher is NOT connected (check the events endpoint)",
        None => "no events endpoint is configured for it",
    };
    (
        "no_events",
        format!(
            "no block of the probe reached the index ({link}): check that the engine runs with \
             --kv-events-config enable_kv_cache_events and prefix caching"
        ),
    )
}

/// Probes `engine` (waiting at most `wait` for its events).
pub async fn probe(st: &RouterState, engine: &TrackedEngine, wait: Duration) -> Verdict {
    let name = &engine.spec.instance;
    let bs = st.config.block_size;
    let span = st
        .tokenizer
        .as_ref()
        .map_or(1000, |t| t.vocab_size().saturating_sub(1000).min(20_000));
    let tokens = probe_tokens(bs as usize, span);
    let want = (PROBE_BLOCKS as u64) * u64::from(bs);
    let before = st.indexer.index_counters();
    let first = match complete(st, &engine.spec.url, &tokens).await {
        Ok(v) => v,
        Err(e) => return Verdict::new(name, "unreachable", e),
    };
    if let Some(n) = first["usage"]["prompt_tokens"].as_u64() {
        if n != tokens.len() as u64 {
            return Verdict::new(
                name,
                "tokens",
                format!(
                    "the engine counted {n} prompt tokens for {} token ids: it does not take \
                     token ids as given",
                    tokens.len()
                ),
            );
        }
    }
    let start = tokio::time::Instant::now();
    while matched(st, name, &tokens) < want {
        if start.elapsed() >= wait {
            let connected = engine
                .spec
                .events
                .as_deref()
                .and_then(|e| st.indexer.publisher_connected(e));
            let (status, detail) = cause(before, st.indexer.index_counters(), connected, bs);
            return Verdict::new(name, status, detail);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = match complete(st, &engine.spec.url, &tokens).await {
        Ok(v) => v,
        Err(e) => return Verdict::new(name, "unreachable", e),
    };
    match second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() {
        None => Verdict::new(
            name,
            "no_cached_tokens",
            "the index agrees with the engine's blocks, but the engine does not report \
             usage.prompt_tokens_details.cached_tokens (vLLM: --enable-prompt-tokens-details): \
             predicted against delivered cannot be accounted",
        ),
        Some(c) if c < want => Verdict::new(
            name,
            "no_reuse",
            format!(
                "the index holds {want} tokens of the probe for this engine, and the engine \
                 reused {c} of them (prefix caching off, or blocks evicted at once)"
            ),
        ),
        Some(_) => Verdict::new(
            name,
            "ok",
            format!("{PROBE_BLOCKS} blocks of {bs} tokens published, indexed and reused"),
        ),
    }
}

/// Probes every engine, one after another (the counters are the index's, shared).
pub async fn run(st: &RouterState, wait: Duration) -> Vec<Verdict> {
    let engines = st.engines();
    let mut out = Vec::with_capacity(engines.len());
    for engine in engines.iter() {
        out.push(probe(st, engine, wait).await);
    }
    out
}
