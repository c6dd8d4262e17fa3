//! Request metrics: every HTTP request counted by method, *matched route* (the route
//! template such as `/controller/workers`, never the raw path, so label cardinality stays
//! bounded; `unmatched` for the 404 fallback) and status code, and timed. Refusals by a limit
//! (a response carrying a [`LimitHit`], or any 413) are reported to the service's
//! [`LimitHook`].
//!
//! Knows no service: the metric handles come in as the middleware's state, [`HttpMetrics`].

use super::exposition::Exposition;
use super::limits::{LimitHit, LimitHook, WebLimit};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use prometheus::core::Collector;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts};
use std::sync::Arc;
use std::time::Instant;

/// What the layer records into.
#[derive(Clone)]
pub struct HttpMetrics {
    /// Requests by `method`, `route` and `status`.
    pub requests: IntCounterVec,
    /// Handling time, seconds, by `method` and `route`.
    pub seconds: HistogramVec,
    /// `--max-body-bytes`, reported with a 413 that carries no [`LimitHit`] of its own.
    pub max_body_bytes: usize,
    /// Where refusals by a limit go.
    pub on_limit: LimitHook,
}

impl HttpMetrics {
    /// Request metrics of their own, `<prefix>http_requests_total{method,route,status}` and
    /// `<prefix>http_request_seconds{method,route}`, for a service that writes them into its
    /// `/metrics` with [`HttpMetrics::write_to`] (the controller registers the same two in its
    /// registry instead).
    pub fn standalone(prefix: &str, max_body_bytes: usize, on_limit: LimitHook) -> Self {
        let requests = IntCounterVec::new(
            Opts::new(
                format!("{prefix}http_requests_total"),
                "HTTP requests, by method, matched route and status code.",
            ),
            &["method", "route", "status"],
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        let seconds = HistogramVec::new(
            HistogramOpts::new(
                format!("{prefix}http_request_seconds"),
                "HTTP request handling time, by method and matched route.",
            )
            .buckets(prometheus::exponential_buckets(1e-5, 4.0, 12).unwrap_or_default()),
            &["method", "route"],
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        HttpMetrics {
            requests,
            seconds,
            max_body_bytes,
            on_limit,
        }
    }

    /// Appends the two families to a `/metrics` document (nothing before the first request).
    pub fn write_to(&self, out: &mut Exposition) {
        let mut families = self.requests.collect();
        families.extend(self.seconds.collect());
        out.encoded(&families);
    }
}

/// The method label: the standard methods by name, anything else `other`.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "other",
    }
}

/// Middleware: counts and times the request. Use with
/// `axum::middleware::from_fn_with_state(Arc<HttpMetrics>, track)`.
pub async fn track(State(m): State<Arc<HttpMetrics>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_label(request.method());
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let response = next.run(request).await;
    let hit = response
        .extensions()
        .get::<LimitHit>()
        .copied()
        .or_else(|| {
            (response.status() == StatusCode::PAYLOAD_TOO_LARGE).then_some(LimitHit {
                limit: WebLimit::BodyBytes,
                value: m.max_body_bytes as u64,
            })
        });
    if let Some(hit) = hit {
        (m.on_limit)(hit, &format!("{method} {route} got {}", response.status()));
    }
    m.requests
        .with_label_values(&[method, &route, response.status().as_str()])
        .inc();
    m.seconds
        .with_label_values(&[method, &route])
        .observe(started.elapsed().as_secs_f64());
    response
}
