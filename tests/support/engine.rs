//! An engine stand-in for the router's tests: an axum server on 127.0.0.1 answering as
//! vLLM's OpenAI server does (`/v1/completions`, `/v1/chat/completions` with and without
//! `stream`, `/v1/models`, `/tokenize`, `/health`), with a prefix cache of whole blocks keyed
//! by (LoRA, salt, tokens) that reports its hits in `usage.prompt_tokens_details
//! .cached_tokens` and publishes every block it stores as a vLLM `BlockStored` event over
//! ZMQ ([`super::vllm_pub::Publisher`], with replay). Knobs: a delay before the answer's head,
//! a gate that holds a stream after its first chunk, a stall that stops a stream for good, the
//! Prometheus text its `/metrics` answers (404 until set).

use super::vllm_pub::{mp, Publisher};
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use kvplane::router::tokenize::ModelTokenizer;
use serde_json::{json, Map, Value};
use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, Notify};

/// Knobs a test turns while the engine runs.
#[derive(Default)]
pub struct Knobs {
    /// Milliseconds before the answer's head.
    pub delay_ms: AtomicU64,
    /// Hold a stream after its first chunk until [`Knobs::release`] is notified.
    pub gate: AtomicBool,
    /// Notified to let a gated stream go on.
    pub release: Notify,
    /// Stop a stream after its first chunk, for good (the connection stays open).
    pub stall: AtomicBool,
    /// Requests answered.
    pub served: AtomicU64,
    /// A salt the engine adds to every request without `cache_salt` (a deployment salt the
    /// router is not told about).
    pub salt: std::sync::Mutex<Option<String>>,
    /// What `GET /metrics` answers (`None`: 404, as an engine without metrics).
    pub metrics: std::sync::Mutex<Option<String>>,
}

struct Inner {
    name: String,
    block_size: usize,
    tokenizer: ModelTokenizer,
    cache: Mutex<HashSet<u64>>,
    publisher: Mutex<Publisher>,
    knobs: Arc<Knobs>,
}

/// A running stand-in.
pub struct Engine {
    /// Its OpenAI HTTP address.
    pub addr: SocketAddr,
    /// Its KV-event PUB endpoint.
    pub events: String,
    /// Its replay endpoint.
    pub replay: String,
    /// Its knobs.
    pub knobs: Arc<Knobs>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `n` engines named `e0`, `e1`… on `model_dir` with blocks of `block_size` tokens, started
/// one after the other, and their router specs (each named as its engine).
pub async fn engines(
    model_dir: &Path,
    n: usize,
    block_size: usize,
) -> (Vec<Engine>, Vec<kvplane::router::EngineSpec>) {
    let mut engines = Vec::with_capacity(n);
    for i in 0..n {
        engines.push(Engine::start(&format!("e{i}"), model_dir, block_size).await);
    }
    let specs = engines
        .iter()
        .enumerate()
        .map(|(i, e)| e.spec(&format!("e{i}")))
        .collect();
    (engines, specs)
}

impl Engine {
    /// Starts an engine named `name` tokenizing with `model_dir`'s tokenizer.
    pub async fn start(name: &str, model_dir: &Path, block_size: usize) -> Self {
        let publisher = Publisher::start().await;
        let events = format!("tcp://{}", publisher.pub_addr);
        let replay = format!("tcp://{}", publisher.replay_addr);
        let knobs = Arc::new(Knobs::default());
        let inner = Arc::new(Inner {
            name: name.to_owned(),
            block_size,
            tokenizer: ModelTokenizer::load(model_dir).expect("tokenizer loads"),
            cache: Mutex::new(HashSet::new()),
            publisher: Mutex::new(publisher),
            knobs: Arc::clone(&knobs),
        });
        let app = Router::new()
            .route("/v1/completions", post(completions))
            .route("/v1/chat/completions", post(chat))
            .route("/v1/models", get(models))
            .route("/tokenize", post(tokenize))
            .route("/health", get(|| async { "" }))
            .route("/metrics", get(metrics))
            .with_state(inner);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind engine");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            addr,
            events,
            replay,
            knobs,
            task,
        }
    }

    /// The router's `--engine` value for this engine, named `name`.
    pub fn spec(&self, name: &str) -> kvplane::router::EngineSpec {
        format!(
            "http://{},instance={name},events={},replay={}",
            self.addr, self.events, self.replay
        )
        .parse()
        .expect("engine spec")
    }
}

type St = State<Arc<Inner>>;

fn prompt_tokens(inner: &Inner, body: &Map<String, Value>, chat: bool) -> Vec<u32> {
    if chat {
        return inner.tokenizer.encode_chat(body).expect("chat renders");
    }
    match &body["prompt"] {
        Value::String(s) => inner.tokenizer.encode(s, true).expect("encodes"),
        Value::Array(ids) => ids.iter().map(|t| t.as_u64().unwrap() as u32).collect(),
        other => panic!("prompt {other}"),
    }
}

/// Looks the prompt's blocks up (vLLM never reuses the last token), stores the missing
/// ones and publishes them; returns the cached tokens.
async fn prefill(inner: &Inner, tokens: &[u32], lora: Option<&str>, salt: Option<&str>) -> u64 {
    let bs = inner.block_size;
    let blocks = tokens.len() / bs;
    let reusable = tokens.len().saturating_sub(1) / bs;
    let mut hashes = Vec::with_capacity(blocks);
    let mut parent = 0u64;
    for b in 0..blocks {
        let mut h = DefaultHasher::new();
        (parent, lora, salt, &tokens[b * bs..(b + 1) * bs]).hash(&mut h);
        parent = h.finish();
        hashes.push(parent);
    }
    let mut cache = inner.cache.lock().await;
    let hit = hashes
        .iter()
        .take(reusable)
        .take_while(|h| cache.contains(*h))
        .count();
    let first_new = hashes.iter().take_while(|h| cache.contains(*h)).count();
    if first_new < blocks {
        for h in &hashes[first_new..] {
            cache.insert(*h);
        }
        let event = mp::stored_ns(
            &hashes[first_new..],
            first_new.checked_sub(1).map(|p| hashes[p]),
            &tokens[first_new * bs..blocks * bs],
            bs as u32,
            lora,
            salt,
        );
        inner.publisher.lock().await.publish(&[event]).await;
    }
    (hit * bs) as u64
}

async fn answer(inner: Arc<Inner>, body: Map<String, Value>, chat: bool) -> Response {
    let tokens = prompt_tokens(&inner, &body, chat);
    let model = body["model"].as_str().unwrap_or("m").to_owned();
    let lora = (model != "m").then_some(model.as_str());
    let default_salt = inner.knobs.salt.lock().unwrap().clone();
    let salt = body
        .get("cache_salt")
        .and_then(Value::as_str)
        .or(default_salt.as_deref());
    let cached = prefill(&inner, &tokens, lora, salt).await;
    let delay = inner.knobs.delay_ms.load(Ordering::Relaxed);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    inner.knobs.served.fetch_add(1, Ordering::Relaxed);
    let usage = json!({"prompt_tokens": tokens.len(), "completion_tokens": 3,
                       "total_tokens": tokens.len() + 3,
                       "prompt_tokens_details": {"cached_tokens": cached}});
    let object = if chat {
        "chat.completion"
    } else {
        "text_completion"
    };
    if body.get("stream").and_then(Value::as_bool) != Some(true) {
        let choice = if chat {
            json!({"index": 0, "message": {"role": "assistant", "content": "a b c"}, "finish_reason": "length"})
        } else {
            json!({"index": 0, "text": "a b c", "finish_reason": "length"})
        };
        return Json(
            json!({"id": format!("cmpl-{}", inner.name), "object": object,
                           "model": model, "engine": inner.name,
                           "choices": [choice], "usage": usage}),
        )
        .into_response();
    }
    let include_usage = body
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        == Some(true);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(4);
    tokio::spawn(async move {
        for (i, word) in ["a", " b", " c"].iter().enumerate() {
            let chunk = json!({"id": format!("cmpl-{}", inner.name), "object": object,
                               "model": model, "engine": inner.name,
                               "choices": [{"index": 0, "text": word, "finish_reason": null}],
                               "usage": null});
            if tx.send(Ok(format!("data: {chunk}\n\n"))).await.is_err() {
                return;
            }
            if i == 0 && inner.knobs.stall.load(Ordering::Relaxed) {
                // Hold the connection open, send nothing more (bounded: the test ends).
                tokio::time::sleep(Duration::from_secs(60)).await;
                return;
            }
            if i == 0 && inner.knobs.gate.load(Ordering::Relaxed) {
                inner.knobs.release.notified().await;
            }
        }
        if include_usage {
            let chunk = json!({"id": format!("cmpl-{}", inner.name), "object": object,
                               "model": model, "choices": [], "usage": usage});
            let _ = tx.send(Ok(format!("data: {chunk}\n\n"))).await;
        }
        let _ = tx.send(Ok("data: [DONE]\n\n".into())).await;
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    (
        [("content-type", "text/event-stream")],
        Body::from_stream(stream),
    )
        .into_response()
}

async fn completions(State(inner): St, Json(body): Json<Map<String, Value>>) -> Response {
    answer(inner, body, false).await
}

async fn chat(State(inner): St, Json(body): Json<Map<String, Value>>) -> Response {
    answer(inner, body, true).await
}

async fn metrics(State(inner): St) -> Response {
    match inner.knobs.metrics.lock().unwrap().clone() {
        Some(text) => text.into_response(),
        None => axum::http::StatusCode::NOT_FOUND.into_response(),
    }
}

async fn models(State(inner): St) -> Json<Value> {
    Json(
        json!({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": inner.name}]}),
    )
}

async fn tokenize(State(inner): St, Json(body): Json<Map<String, Value>>) -> Json<Value> {
    let chat = body.contains_key("messages");
    let tokens = prompt_tokens(&inner, &body, chat);
    Json(json!({"count": tokens.len(), "max_model_len": 4096, "tokens": tokens}))
}
