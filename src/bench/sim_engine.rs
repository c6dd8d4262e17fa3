//! A simulated vLLM engine for `kvplane bench route` (`kvplane bench sim-engine`, hidden; one
//! child process each): an OpenAI-compatible `/v1/completions` (streamed or not, with
//! `usage.prompt_tokens_details.cached_tokens`), a paged KV pool ([`super::sim_pool`]) whose
//! changes it publishes as vLLM KV events over ZMQ (PUB plus a replay ROUTER, vLLM ≥ 0.26
//! layout), a queue of at most `--max-batch` running requests, one prefill at a time, and a
//! cost model slept in wall time divided by `--speedup`. `POST /sim/match` tells the oracle
//! the true cached prefix. It models nothing of a GPU beyond that (docs/ROUTER.md, "The
//! simulator"); it must not be mistaken for an engine.

use super::indexer_stream::serve_replays;
use super::sim_pool::{admission_batch, block_hashes, cached_tokens, Pool};
use crate::transport::{Publisher, ReplayServer};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};

/// A simulated engine's KV pool and cost model: the flags of `kvplane bench sim-engine`, and
/// of `kvplane bench route`, which passes them on to every engine it starts.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineModel {
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// KV pool size in tokens (whole blocks; LRU beyond).
    #[arg(long, default_value_t = 2_000_000)]
    pub capacity_tokens: usize,
    /// Prefill cost per uncached prompt token, microseconds (150: 6,667 tokens/s).
    #[arg(long, default_value_t = 150.0)]
    pub prefill_us_per_token: f64,
    /// Fixed cost of each prefill (scheduling, the one computed token), milliseconds.
    #[arg(long, default_value_t = 10.0)]
    pub prefill_base_ms: f64,
    /// Decode cost per output token after the first, milliseconds (requests decode in
    /// parallel, up to `--max-batch`).
    #[arg(long, default_value_t = 20.0)]
    pub decode_ms_per_token: f64,
    /// Requests running at once (prefilling or decoding); more wait in a FIFO queue.
    #[arg(long, default_value_t = 32)]
    pub max_batch: usize,
}

/// The flags of one simulated engine: its name and sockets, its model, its clock.
#[derive(Debug, Clone, clap::Args)]
pub struct SimEngineArgs {
    /// Address to bind (HTTP and ZMQ).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Instance name (the event topic is `kv@NAME@sim`).
    #[arg(long, default_value = "sim-0")]
    pub name: String,
    /// The engine's KV pool and costs.
    #[command(flatten)]
    pub model: EngineModel,
    /// Simulated time runs this many times faster than wall time (every cost is slept
    /// divided by it).
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Event batches kept for replay.
    #[arg(long, default_value_t = 16_384)]
    pub replay_ring: usize,
}

/// The engine's shared state.
struct Sim {
    args: SimEngineArgs,
    pool: parking_lot::Mutex<Pool>,
    slots: Arc<Semaphore>,
    prefill: tokio::sync::Mutex<()>,
    events: mpsc::Sender<Vec<u8>>,
    waiting: AtomicU64,
    running: AtomicU64,
    served: AtomicU64,
    cached: AtomicU64,
    prompt: AtomicU64,
}

/// Where a running engine listens.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SimAddrs {
    /// `http://host:port`.
    pub http: String,
    /// KV-event PUB endpoint.
    pub events: String,
    /// Replay ROUTER endpoint.
    pub replay: String,
}

/// The prompt: token ids, or text of `w<id>` words (what [`words`] writes).
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Prompt {
    Ids(Vec<u32>),
    Text(String),
}

#[derive(serde::Deserialize)]
struct CompletionRequest {
    prompt: Prompt,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<Value>,
    #[serde(default)]
    model: Option<String>,
}

/// Token ids as text: one `w<id>` word each (the simulated engines' "tokenizer").
pub fn words(tokens: &[u32]) -> String {
    let mut s = String::with_capacity(tokens.len() * 7);
    for (i, t) in tokens.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        s.push('w');
        s.push_str(&t.to_string());
    }
    s
}

/// The inverse of [`words`]; another word becomes a fixed id from its bytes.
fn unwords(text: &str) -> Vec<u32> {
    text.split_whitespace()
        .map(|w| {
            w.strip_prefix('w')
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| {
                    w.bytes()
                        .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
                })
        })
        .collect()
}

/// Binds, prints [`SimAddrs`] as one JSON line on stdout, and serves until stdin closes (the
/// parent went away) .
///
/// # Errors
/// A bind failure.
pub async fn run(args: SimEngineArgs) -> Result<(), String> {
    if args.model.block_size == 0 || args.speedup <= 0.0 || args.model.max_batch == 0 {
        return Err("--block-size, --speedup and --max-batch must be positive".into());
    }
    let (tx, rx) = mpsc::channel(1024);
    let (events, replay) = start_publisher(&args, rx).await?;
    let capacity = args.model.capacity_tokens / args.model.block_size;
    let sim = Arc::new(Sim {
        pool: parking_lot::Mutex::new(Pool::new(capacity)),
        slots: Arc::new(Semaphore::new(args.model.max_batch)),
        prefill: tokio::sync::Mutex::new(()),
        events: tx,
        waiting: AtomicU64::new(0),
        running: AtomicU64::new(0),
        served: AtomicU64::new(0),
        cached: AtomicU64::new(0),
        prompt: AtomicU64::new(0),
        args: args.clone(),
    });
    let app = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { "" }))
        .route("/tokenize", post(tokenize))
        .route("/sim/match", post(matched))
        .route("/sim/stats", get(stats))
        .with_state(sim);
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), 0))
        .await
        .map_err(|e| format!("bind HTTP: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let addrs = SimAddrs {
        http: format!("http://{addr}"),
        events,
        replay,
    };
    let line = serde_json::to_string(&addrs).map_err(|e| e.to_string())?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}").map_err(|e| e.to_string())?;
        out.flush().map_err(|e| e.to_string())?;
    }
    // The parent holds our stdin: its end (exit, kill) ends this engine.
    let parent_gone = tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    });
    tokio::select! {
        r = axum::serve(listener, app) => r.map_err(|e| format!("serve: {e}")),
        _ = parent_gone => Ok(()),
    }
}

async fn models() -> Json<Value> {
    Json(
        json!({"object": "list", "data": [{"id": "sim", "object": "model", "owned_by": "kvplane"}]}),
    )
}

async fn tokenize(body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let Some(text) = v.get("prompt").and_then(Value::as_str) else {
        return bad("tokenize needs a text prompt");
    };
    let tokens = unwords(text);
    Json(json!({"count": tokens.len(), "tokens": tokens, "max_model_len": 1 << 21})).into_response()
}

/// The oracle's view: how many leading blocks of `hashes` the pool holds now.
async fn matched(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    #[derive(serde::Deserialize)]
    struct Q {
        hashes: Vec<u64>,
    }
    match serde_json::from_slice::<Q>(&body) {
        Ok(q) => Json(json!({"blocks": sim.pool.lock().prefix(&q.hashes)})).into_response(),
        Err(e) => bad(&e.to_string()),
    }
}

async fn stats(State(sim): State<Arc<Sim>>) -> Json<Value> {
    let pool = sim.pool.lock();
    Json(json!({
        "blocks": pool.len(), "evictions": pool.evictions,
        "waiting": sim.waiting.load(Ordering::Relaxed),
        "running": sim.running.load(Ordering::Relaxed),
        "served": sim.served.load(Ordering::Relaxed),
        "prompt_tokens": sim.prompt.load(Ordering::Relaxed),
        "cached_tokens": sim.cached.load(Ordering::Relaxed),
    }))
}

fn bad(message: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"error": {"message": message, "type": "invalid_request_error", "code": 400}})),
    )
        .into_response()
}

fn chunk(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

async fn completions(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    let req: CompletionRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad(&format!("not a completion request: {e}")),
    };
    let tokens = match req.prompt {
        Prompt::Ids(ids) => ids,
        Prompt::Text(t) => unwords(&t),
    };
    if tokens.is_empty() {
        return bad("empty prompt");
    }
    let model = req.model.unwrap_or_else(|| "sim".into());
    let max_tokens = req.max_tokens.unwrap_or(16).max(1);
    let usage_in_stream = req
        .stream_options
        .as_ref()
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if !req.stream {
        let (_, usage) = serve(&sim, tokens, max_tokens, None).await;
        return Json(json!({
            "id": "cmpl-sim", "object": "text_completion", "model": model,
            "choices": [{"index": 0, "text": " w1", "finish_reason": "length"}],
            "usage": usage,
        }))
        .into_response();
    }
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        let (first, usage) = serve(&sim, tokens, max_tokens, Some(tx.clone())).await;
        drop(first);
        let last = json!({"id": "cmpl-sim", "object": "text_completion", "model": model,
            "choices": [{"index": 0, "text": " w2", "finish_reason": "length"}]});
        let _ = tx.send(chunk(&last)).await;
        if usage_in_stream {
            let u = json!({"id": "cmpl-sim", "object": "text_completion", "model": model,
                "choices": [], "usage": usage});
            let _ = tx.send(chunk(&u)).await;
        }
        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// Queues, prefills (one at a time, against the pool) and decodes one request; sends the
/// first token on `first` (a stream) as soon as the prefill ends. Returns the usage.
async fn serve(
    sim: &Sim,
    tokens: Vec<u32>,
    max_tokens: u32,
    first: Option<mpsc::Sender<Bytes>>,
) -> (Option<mpsc::Sender<Bytes>>, Value) {
    let a = &sim.args.model;
    let scale = |ms: f64| Duration::from_secs_f64((ms / 1e3 / sim.args.speedup).max(0.0));
    sim.waiting.fetch_add(1, Ordering::Relaxed);
    let slot = Arc::clone(&sim.slots).acquire_owned().await;
    sim.waiting.fetch_sub(1, Ordering::Relaxed);
    sim.running.fetch_add(1, Ordering::Relaxed);
    let cached = {
        let _prefill = sim.prefill.lock().await;
        let hashes = block_hashes(&tokens, a.block_size);
        let (admission, ts) = (sim.pool.lock().admit(&hashes), unix_seconds());
        if let Some(batch) = admission_batch(&admission, &hashes, &tokens, a.block_size, ts) {
            // The publisher task drains this; a full channel holds the prefill (as a stalled
            // publisher would hold vLLM's scheduler loop) rather than dropping events.
            let _ = sim.events.send(batch).await;
        }
        let cached = cached_tokens(admission.hit_blocks, tokens.len(), a.block_size);
        let uncached = (tokens.len() - cached) as f64;
        tokio::time::sleep(scale(
            a.prefill_base_ms + uncached * a.prefill_us_per_token / 1e3,
        ))
        .await;
        cached
    };
    if let Some(tx) = &first {
        let v = json!({"id": "cmpl-sim", "object": "text_completion",
            "choices": [{"index": 0, "text": " w1", "finish_reason": null}]});
        let _ = tx.send(chunk(&v)).await;
    }
    tokio::time::sleep(scale(f64::from(max_tokens - 1) * a.decode_ms_per_token)).await;
    drop(slot);
    sim.running.fetch_sub(1, Ordering::Relaxed);
    sim.served.fetch_add(1, Ordering::Relaxed);
    sim.cached.fetch_add(cached as u64, Ordering::Relaxed);
    sim.prompt.fetch_add(tokens.len() as u64, Ordering::Relaxed);
    let usage = json!({
        "prompt_tokens": tokens.len(), "completion_tokens": max_tokens,
        "total_tokens": tokens.len() + max_tokens as usize,
        "prompt_tokens_details": {"cached_tokens": cached},
    });
    (first, usage)
}

fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Binds the PUB and replay ROUTER sockets and starts the task that numbers, keeps and
/// publishes each batch from `rx`. Returns both endpoints.
pub(super) async fn start_publisher(
    args: &SimEngineArgs,
    mut rx: mpsc::Receiver<Vec<u8>>,
) -> Result<(String, String), String> {
    let (mut socket, events) = Publisher::bind(&format!("{}:0", args.host))
        .await
        .map_err(|e| format!("bind PUB: {e}"))?;
    let (router, replay) = ReplayServer::bind(&format!("{}:0", args.host))
        .await
        .map_err(|e| format!("bind ROUTER: {e}"))?;
    let (events, replay) = (format!("tcp://{events}"), format!("tcp://{replay}"));
    let topic = Bytes::from(format!("kv@{}@sim", args.name));
    let cap = args.replay_ring.max(1);
    let ring: Arc<parking_lot::Mutex<VecDeque<(u64, Bytes)>>> = Arc::default();
    let served = Arc::clone(&ring);
    tokio::spawn(serve_replays(router, topic.clone(), move |start| {
        served
            .lock()
            .iter()
            .filter(|(s, _)| *s >= start)
            .cloned()
            .collect()
    }));
    tokio::spawn(async move {
        let mut seq = 0u64;
        while let Some(batch) = rx.recv().await {
            let payload = Bytes::from(batch);
            {
                let mut r = ring.lock();
                if r.len() == cap {
                    r.pop_front();
                }
                r.push_back((seq, payload.clone()));
            }
            let frames = vec![
                topic.clone(),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                payload,
            ];
            seq += 1;
            if socket.send(frames).await.is_err() {
                return;
            }
        }
    });
    Ok((events, replay))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip() {
        let t = [5, 70_000, 0];
        assert_eq!(words(&t), "w5 w70000 w0");
        assert_eq!(unwords(&words(&t)), t);
        assert_eq!(unwords("hello hello").len(), 2);
    }
}
