//! The OpenAI-compatible front: `POST /v1/completions` and `POST /v1/chat/completions`
//! (tokenize, decide, send to the chosen engine, pass its answer on and account its
//! `usage`) and `GET /v1/models`. Errors in OpenAI's shape (OpenAI clients read it).

use super::St;
use crate::router::model::sessions::MAX_SESSION_ID;
use crate::router::state::{Decision, NoRoute, RequestKind, Reservation, RouterState};
use crate::router::upstream::{self, Failure, StreamObserver};
use crate::web::access::Access;
use crate::web::error::{ApiError, Refusal};
use crate::web::openapi::Operation;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// The OpenAI routes.
pub(super) fn routes() -> Router<Arc<RouterState>> {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
}

/// The OpenAI routes: reads (`--api-token-reads`), answering errors in OpenAI's shape.
pub(super) fn operations() -> Vec<Operation> {
    let completion = json!({"type": "object", "required": ["prompt"],
        "properties": {"model": {"type": "string"}, "prompt": {}, "stream": {"type": "boolean"},
                       "max_tokens": {"type": "integer"}}});
    let chat = json!({"type": "object", "required": ["messages"],
        "properties": {"model": {"type": "string"}, "stream": {"type": "boolean"},
            "messages": {"type": "array", "items": {"type": "object",
                "required": ["role", "content"],
                "properties": {"role": {"type": "string"}, "content": {}}}}}});
    // OpenAI's error body, which the OpenAI routes answer in (OpenAI clients read it).
    let openai_error = json!({"type": "object", "required": ["error"], "properties": {
        "error": {"type": "object", "required": ["message", "type"], "properties": {
            "message": {"type": "string"}, "type": {"type": "string"},
            "param": {"nullable": true}, "code": {"nullable": true}}}}});
    let proxied: &[(u16, &'static str)] = &[
        (200, "The engine's answer (SSE when streaming)"),
        (
            429,
            "Every engine up has all its slots held (Retry-After: 1)",
        ),
        (
            502,
            "No engine took it, or its answer was unreadable or too large",
        ),
        (503, "No engine is up"),
        (504, "No answer within --response-timeout"),
    ];
    vec![
        Operation::new(
            Method::POST,
            "/v1/completions",
            Access::Read,
            "OpenAI completions, routed by KV prefix",
        )
        .body(completion)
        .answers(proxied)
        .error_body(openai_error.clone()),
        Operation::new(
            Method::POST,
            "/v1/chat/completions",
            Access::Read,
            "OpenAI chat completions, routed by KV prefix",
        )
        .body(chat)
        .answers(proxied)
        .error_body(openai_error.clone()),
        Operation::new(
            Method::GET,
            "/v1/models",
            Access::Read,
            "The engines' models",
        )
        .answers(&[(200, "The models"), (503, "No engine is up")])
        .error_body(openai_error),
    ]
}

/// An error of the OpenAI routes: the one error type, in OpenAI's shape (`kind` its type).
fn error(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Response {
    ApiError::from(Refusal::new(status, kind, message)).openai_response()
}

async fn completions(State(st): St, headers: HeaderMap, body: Bytes) -> Response {
    proxy(st, RequestKind::Completion, headers, body).await
}

async fn chat(State(st): St, headers: HeaderMap, body: Bytes) -> Response {
    proxy(st, RequestKind::Chat, headers, body).await
}

fn status_class(s: StatusCode) -> &'static str {
    match s.as_u16() {
        200..=299 => "2xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// Tokenize, decide, then send to the engines in the decided order until one takes the
/// request (only a refused connection moves on: anything later could have started work).
async fn proxy(
    st: Arc<RouterState>,
    kind: RequestKind,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = match kind {
        RequestKind::Completion => "/v1/completions",
        RequestKind::Chat => "/v1/chat/completions",
    };
    let parsed: Map<String, Value> = match serde_json::from_slice(&body) {
        Ok(Value::Object(m)) => m,
        Ok(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "the body must be a JSON object",
            )
        }
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                format!("invalid JSON: {e}"),
            )
        }
    };
    let started = std::time::Instant::now();
    let tokens = st.tokens(kind, &parsed).await;
    // A request naming a model other than the served one names a LoRA adapter (vLLM serves
    // adapters under their own names): its blocks live in that adapter's namespace.
    let lora = parsed
        .get("model")
        .and_then(Value::as_str)
        .filter(|m| *m != st.config.model)
        .unwrap_or("");
    let salt = parsed
        .get("cache_salt")
        .and_then(Value::as_str)
        .unwrap_or("");
    let draw = if st.config.weights.temperature > 0.0 {
        rand::random::<f64>()
    } else {
        0.0
    };
    let (matched, decision) = st.query(tokens.as_deref(), lora, salt);
    let session = session_id(&headers, &parsed);
    if session.is_none() && (headers.contains_key(SESSION_HEADER) || parsed.contains_key("user")) {
        st.metrics
            .limits_hit
            .with_label_values(&["session_id"])
            .inc();
    }
    let prompt_len = tokens.as_ref().map_or(0, |t| t.len() as u64);
    let source = if st.tokenizer.is_some() {
        "local"
    } else {
        "engine"
    };
    let stream = parsed.get("stream").and_then(Value::as_bool) == Some(true);
    // A stream reports its usage only when asked: ask on the client's behalf (so every
    // answer is accounted) and take the usage-only event out of what the client sees.
    let mut parsed = parsed;
    let strip_usage = stream && ask_for_usage(&mut parsed);
    let body = if strip_usage {
        Bytes::from(serde_json::to_vec(&parsed).unwrap_or_else(|_| body.to_vec()))
    } else {
        body
    };
    // Engines whose connect failed: the next route skips them.
    let mut skip = Vec::new();
    loop {
        let routed = st
            .route(
                &decision,
                &matched,
                prompt_len,
                draw,
                &skip,
                session.as_deref(),
            )
            .await;
        if skip.is_empty() {
            st.metrics
                .decision_seconds
                .with_label_values(&[source])
                .observe(started.elapsed().as_secs_f64());
        }
        let (i, mut reservation) = match routed {
            Ok(r) => r,
            Err(NoRoute::NoneUp) => break,
            Err(refusal) => {
                let (limit, message) = if refusal == NoRoute::Full {
                    ("engine_slots", "every engine's slots are held; retry")
                } else {
                    (
                        "route_attempts",
                        "other router replicas took every engine chosen; retry",
                    )
                };
                st.metrics.limits_hit.with_label_values(&[limit]).inc();
                st.metrics
                    .requests
                    .with_label_values(&["none", "4xx"])
                    .inc();
                let mut resp = error(StatusCode::TOO_MANY_REQUESTS, limit, message);
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
                return resp;
            }
        };
        let engine = Arc::clone(reservation.engine());
        let name = engine.spec.instance.clone();
        let mut req = hyper::Request::post(format!("{}{path}", engine.spec.url));
        for h in [header::CONTENT_TYPE, header::AUTHORIZATION, header::ACCEPT] {
            if let Some(v) = headers.get(&h) {
                req = req.header(h, v);
            }
        }
        if !headers.contains_key(header::CONTENT_TYPE) {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        let Ok(req) = req.body(Body::from(body.clone())) else {
            return error(StatusCode::BAD_GATEWAY, "router_error", "bad engine URL");
        };
        match upstream::send(&st.client, req, st.config.response_timeout).await {
            Ok(resp) => {
                reservation.answered();
                return answer(&st, i, decision, reservation, resp, stream, strip_usage).await;
            }
            Err(f) => {
                st.metrics
                    .engine_errors
                    .with_label_values(&[&name, f.label()])
                    .inc();
                if engine.set_up(false) {
                    tracing::warn!(engine = %name, "engine failed ({}); not routed to until it answers a health probe", f.label());
                }
                skip.push(i);
                if f != Failure::Connect {
                    st.metrics.requests.with_label_values(&[&name, "5xx"]).inc();
                    let status = if f == Failure::Timeout {
                        StatusCode::GATEWAY_TIMEOUT
                    } else {
                        StatusCode::BAD_GATEWAY
                    };
                    return error(
                        status,
                        "engine_error",
                        format!("engine {name}: {}", f.label()),
                    );
                }
            }
        }
    }
    st.metrics
        .requests
        .with_label_values(&["none", "5xx"])
        .inc();
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "no_engine",
        "no engine is up",
    )
}

/// The header naming a request's session (before the body's `user`).
const SESSION_HEADER: &str = "x-session-id";

/// The request's session: the `x-session-id` header, else the body's `user` (OpenAI's end-user
/// id); `None` without one, or when it is empty or longer than
/// [`MAX_SESSION_ID`].
fn session_id(headers: &HeaderMap, body: &Map<String, Value>) -> Option<String> {
    let id = match headers.get(SESSION_HEADER) {
        Some(h) => h.to_str().ok()?.to_owned(),
        None => body.get("user")?.as_str()?.to_owned(),
    };
    (!id.is_empty() && id.len() <= MAX_SESSION_ID).then_some(id)
}

/// Sets `stream_options.include_usage` unless the request set it; whether it did.
fn ask_for_usage(body: &mut Map<String, Value>) -> bool {
    let options = body
        .entry("stream_options")
        .or_insert_with(|| Value::Object(Map::new()));
    if options.is_null() {
        *options = Value::Object(Map::new());
    }
    let Some(options) = options.as_object_mut() else {
        return false;
    };
    if options.get("include_usage").and_then(Value::as_bool) == Some(true) {
        return false;
    }
    options.insert("include_usage".into(), Value::Bool(true));
    true
}

/// Passes the engine's answer on: an event stream chunk by chunk, anything else read whole
/// (bounded) so its `usage` can be accounted.
async fn answer(
    st: &Arc<RouterState>,
    engine: usize,
    decision: Decision,
    reservation: Reservation,
    resp: hyper::Response<hyper::body::Incoming>,
    stream: bool,
    strip_usage: bool,
) -> Response {
    let name = reservation.engine().spec.instance.clone();
    let status = resp.status();
    st.metrics
        .requests
        .with_label_values(&[&name, status_class(status)])
        .inc();
    let content_type = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .cloned()
        .unwrap_or(HeaderValue::from_static("application/json"));
    let sse = content_type
        .to_str()
        .is_ok_and(|c| c.starts_with("text/event-stream"));
    let body = resp.into_body();
    if stream || sse {
        let observer = Observer {
            st: Arc::clone(st),
            engine,
            decision,
            pending: Vec::new(),
            raw: false,
            strip_usage,
            usage: None,
            reservation,
        };
        let body = upstream::pass_through(body, observer, st.config.stream_idle_timeout);
        return (status, [(header::CONTENT_TYPE, content_type)], body).into_response();
    }
    match upstream::read_body(
        body,
        st.config.max_response_bytes,
        st.config.stream_idle_timeout,
    )
    .await
    {
        Ok(bytes) => {
            drop(reservation);
            if status.is_success() {
                if let Some(usage) = serde_json::from_slice::<Value>(&bytes)
                    .ok()
                    .and_then(|mut v| v.get_mut("usage").map(Value::take))
                {
                    st.account(engine, &decision, &usage);
                }
            }
            (status, [(header::CONTENT_TYPE, content_type)], bytes).into_response()
        }
        Err(f) => {
            st.metrics
                .engine_errors
                .with_label_values(&[&name, f.label()])
                .inc();
            if f == Failure::TooLarge {
                st.metrics
                    .limits_hit
                    .with_label_values(&["max_response_bytes"])
                    .inc();
            }
            error(
                StatusCode::BAD_GATEWAY,
                "engine_error",
                format!("engine {name}: body {}", f.label()),
            )
        }
    }
}

/// The longest SSE event the observer holds back to read (a longer one passes unread, and
/// so does the rest of that stream).
const MAX_SSE_EVENT: usize = 1 << 20;

/// Passes a stream on event by event (`\n\n`-separated, as vLLM and SGLang write them),
/// reading the event that carries `usage` (vLLM sends it last when the request asks
/// `stream_options.include_usage`). When the router asked for it on the client's behalf
/// (`strip_usage`), that usage-only event (`choices: []`) is not passed on. Releases the
/// reservation at the end.
struct Observer {
    st: Arc<RouterState>,
    engine: usize,
    decision: Decision,
    pending: Vec<u8>,
    /// An event outgrew [`MAX_SSE_EVENT`]: pass everything on unread.
    raw: bool,
    strip_usage: bool,
    usage: Option<Value>,
    reservation: Reservation,
}

impl Observer {
    /// Reads one whole event; whether it goes to the client.
    fn event(&mut self, event: &[u8]) -> bool {
        let Some(data) = event
            .split(|b| *b == b'\n')
            .find_map(|l| l.strip_prefix(b"data:"))
        else {
            return true;
        };
        if !data.windows(7).any(|w| w == b"\"usage\"") {
            return true;
        }
        let Ok(mut v) = serde_json::from_slice::<Value>(data.trim_ascii()) else {
            return true;
        };
        let Some(u) = v.get_mut("usage").map(Value::take).filter(|u| !u.is_null()) else {
            return true;
        };
        self.usage = Some(u);
        let usage_only = v
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty);
        !(self.strip_usage && usage_only)
    }
}

impl StreamObserver for Observer {
    fn chunk(&mut self, data: Bytes) -> Bytes {
        if self.raw {
            return data;
        }
        self.pending.extend_from_slice(&data);
        let Some(end) = self.pending.windows(2).rposition(|w| w == b"\n\n") else {
            if self.pending.len() > MAX_SSE_EVENT {
                self.raw = true;
                self.st
                    .metrics
                    .limits_hit
                    .with_label_values(&["sse_event"])
                    .inc();
                return Bytes::from(std::mem::take(&mut self.pending));
            }
            return Bytes::new();
        };
        let rest = self.pending.split_off(end + 2);
        let whole = std::mem::replace(&mut self.pending, rest);
        let mut out = Vec::with_capacity(whole.len());
        let mut start = 0;
        while let Some(at) = whole[start..].windows(2).position(|w| w == b"\n\n") {
            let event = &whole[start..start + at + 2];
            if self.event(event) {
                out.extend_from_slice(event);
            }
            start += at + 2;
        }
        Bytes::from(out)
    }

    fn finish(&mut self) -> Bytes {
        let tail = std::mem::take(&mut self.pending);
        if !self.raw && !tail.is_empty() {
            // A last event without its blank line: read it, and pass it on.
            self.event(&tail);
        }
        Bytes::from(tail)
    }

    fn end(&mut self, result: Result<(), Failure>) {
        let name = &self.reservation.engine().spec.instance;
        if let Err(f) = result {
            self.st
                .metrics
                .engine_errors
                .with_label_values(&[name, f.label()])
                .inc();
            return;
        }
        match self.usage.take() {
            Some(u) => self.st.account(self.engine, &self.decision, &u),
            None => self
                .st
                .metrics
                .usage_missing
                .with_label_values(&[name])
                .inc(),
        }
    }
}

/// The first engine up that answers `/v1/models`.
async fn models(State(st): St) -> Response {
    for engine in st.engines().iter().filter(|e| e.is_up()) {
        let Ok(req) =
            hyper::Request::get(format!("{}/v1/models", engine.spec.url)).body(Body::empty())
        else {
            continue;
        };
        let Ok(resp) = upstream::send(&st.client, req, st.config.connect_timeout * 2).await else {
            continue;
        };
        let status = resp.status();
        if let Ok(bytes) = upstream::read_body(
            resp.into_body(),
            st.config.max_response_bytes,
            st.config.connect_timeout * 2,
        )
        .await
        {
            return (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response();
        }
    }
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "no_engine",
        "no engine is up",
    )
}
