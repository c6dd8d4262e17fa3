//! The limits the HTTP layer enforces on what one peer or request can cost, their defaults,
//! and how a refusal is reported to the service's metrics without `web` knowing them: a
//! [`LimitHook`] the service supplies, and a [`LimitHit`] response extension that the metrics
//! layer turns into a call of that hook.

use crate::config::defaults;
use std::sync::Arc;
use std::time::Duration;

/// A limit of the HTTP layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WebLimit {
    /// `--max-body-bytes`: a request got 413.
    BodyBytes,
    /// `--max-body-items`: a request got 413 before its body was parsed.
    BodyItems,
    /// `--max-http-connections`: every slot was busy with a request, so a new connection
    /// waited for one.
    Connections,
    /// `--max-http-connections`: an idle keep-alive connection was closed to admit a new one.
    IdleClosed,
    /// `--http-read-timeout`: a peer too slow sending its headers or body was cut off.
    ReadTimeout,
    /// `--tls-cert`: a TLS handshake failed (a plaintext client, a refused or missing client
    /// certificate, or none within `--http-read-timeout`); the connection was closed.
    TlsHandshake,
}

impl WebLimit {
    /// The `limit` label of `kvplane_limit_hits_total`.
    pub fn label(self) -> &'static str {
        match self {
            WebLimit::BodyBytes => "http_body_bytes",
            WebLimit::BodyItems => "http_body_items",
            WebLimit::Connections => "http_connections",
            WebLimit::IdleClosed => "http_idle_closed",
            WebLimit::ReadTimeout => "http_read_timeout",
            WebLimit::TlsHandshake => "http_tls_handshake",
        }
    }

    /// The flag that sets it.
    pub fn flag(self) -> &'static str {
        match self {
            WebLimit::BodyBytes => "--max-body-bytes",
            WebLimit::BodyItems => "--max-body-items",
            WebLimit::Connections | WebLimit::IdleClosed => "--max-http-connections",
            WebLimit::ReadTimeout => "--http-read-timeout",
            WebLimit::TlsHandshake => "--tls-cert",
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
    /// Most connections served at once; at the cap a new one closes the least recently active
    /// idle one, or waits for a slot when every one is busy with a request.
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

/// Counts one refusal, by the limit it names (a service's own counters).
pub type RefusalCounter = Arc<dyn Fn(WebLimit) + Send + Sync>;

/// The [`LimitHook`] of a service that counts through `count`: a connection wait or a read
/// timeout is counted and logged at debug (a peer can trigger it at will, so it must not
/// flood the log).
pub fn counting_hook(service: &'static str, count: RefusalCounter) -> LimitHook {
    Arc::new(move |hit: LimitHit, detail: &str| {
        count(hit.limit);
        tracing::debug!(
            limit = hit.limit.label(),
            value = hit.value,
            "{service} HTTP limit {} hit: {detail}",
            hit.limit.flag()
        );
    })
}

/// The error a request body yields when the peer is too slow sending it.
#[derive(Debug, thiserror::Error)]
#[error("request body not received within the read timeout")]
pub struct ReadTimedOut;

/// Whether `error` (a body extractor's rejection) comes from [`ReadTimedOut`].
pub fn is_read_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = next {
        if e.is::<ReadTimedOut>() {
            return true;
        }
        next = e.source();
    }
    false
}
