//! Request metrics: every HTTP request counted by method, *matched route* (the route
//! template such as `/controller/workers`, never the raw path, so label cardinality stays
//! bounded; `unmatched` for the 404 fallback) and status code, and timed.

use crate::controller::limits::Limit;
use crate::controller::Shared;
use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;
use std::time::Instant;

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

/// Middleware: counts and times the request.
pub async fn track(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_label(request.method());
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let response = next.run(request).await;
    let m = &shared.metrics;
    if response.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        let limit = shared.config.max_body_bytes as u64;
        shared.limits.hit(m, Limit::HttpBodyBytes, limit, &|| {
            format!("{method} {route} got 413")
        });
    }
    m.http_requests
        .with_label_values(&[method, &route, response.status().as_str()])
        .inc();
    m.http_request_seconds
        .with_label_values(&[method, &route])
        .observe(started.elapsed().as_secs_f64());
    response
}
