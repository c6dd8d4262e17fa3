//! The limits the HTTP layer enforces on what one peer or request can cost, their defaults,
//! and how a refusal is reported to the service's metrics without `web` knowing them: a
//! [`LimitHook`] the service supplies, and a [`LimitHit`] response extension that the metrics
//! layer turns into a call of that hook.

use super::error::ApiError;
use crate::config::defaults;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use std::time::Duration;

/// A limit of the HTTP layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WebLimit {
    /// `--max-body-bytes`: a request got 413.
    BodyBytes,
    /// `--max-body-items`: a request got 413 before its body was parsed.
    BodyItems,
    /// `--max-http-connections`: a connection waited in the accept queue for a free slot.
    Connections,
    /// `--http-read-timeout`: a peer too slow sending its headers or body was cut off.
    ReadTimeout,
}

impl WebLimit {
    /// The `limit` label of `kvplane_limit_hits_total`.
    pub fn label(self) -> &'static str {
        match self {
            WebLimit::BodyBytes => "http_body_bytes",
            WebLimit::BodyItems => "http_body_items",
            WebLimit::Connections => "http_connections",
            WebLimit::ReadTimeout => "http_read_timeout",
        }
    }

    /// The flag that sets it.
    pub fn flag(self) -> &'static str {
        match self {
            WebLimit::BodyBytes => "--max-body-bytes",
            WebLimit::BodyItems => "--max-body-items",
            WebLimit::Connections => "--max-http-connections",
            WebLimit::ReadTimeout => "--http-read-timeout",
        }
    }
}

/// A response extension marking the response as a refusal by a limit; the metrics layer
/// ([`super::metrics_layer`]) reports it to the [`LimitHook`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitHit {
    /// Which limit.
    pub limit: WebLimit,
    /// Its configured value.
    pub value: u64,
}

/// Called once per refusal by a limit, with who hit it; the service counts it
/// (`kvplane_limit_hits_total`) and logs it, throttled.
pub type LimitHook = Arc<dyn Fn(LimitHit, &str) + Send + Sync>;

/// The limits of one HTTP server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
    /// Most JSON values in a request body.
    pub max_body_items: usize,
    /// Most connections served at once; more wait in the kernel's accept queue.
    pub max_connections: usize,
    /// Time allowed to send a request's headers (from when the connection waits for one, so
    /// also the keep-alive idle timeout), and then its body.
    pub read_timeout: Duration,
}

/// The defaults of `kvplane serve` ([`crate::config::defaults`]).
impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_body_bytes: defaults::MAX_BODY_BYTES,
            max_body_items: defaults::MAX_BODY_ITEMS,
            max_connections: defaults::MAX_HTTP_CONNECTIONS,
            read_timeout: Duration::from_secs_f64(defaults::HTTP_READ_TIMEOUT_S),
        }
    }
}

/// Middleware: a request whose `Content-Length` announces more than `max_body_bytes` gets 413
/// before its body is touched, so a client that sent `Expect: 100-continue` (curl does for
/// large bodies) is never asked for it and nothing is read. Bodies without a length are
/// still cut at the limit while read (`axum::extract::DefaultBodyLimit`). Use with
/// `axum::middleware::from_fn_with_state(max_body_bytes, refuse_announced_oversize)`.
pub async fn refuse_announced_oversize(
    State(max_body_bytes): State<usize>,
    request: Request,
    next: Next,
) -> Response {
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match announced {
        Some(n) if n > max_body_bytes as u64 => ApiError::PayloadTooLarge(format!(
            "the body announces {n} bytes; at most {max_body_bytes} are accepted \
             (--max-body-bytes)"
        ))
        .into_response(),
        _ => next.run(request).await,
    }
}
