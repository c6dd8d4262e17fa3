//! Access control for the mutating routes: with `--api-token` set, `/clear /pin /compress
//! /decompress /move` need `Authorization: Bearer <token>`; anything else is a 401 with
//! `WWW-Authenticate: Bearer`. Read-only routes — including the read-only POSTs `/lookup`,
//! `/query_instance`, `/query_worker_info`, `/check_finish` and `/health` (a probe that
//! changes nothing on the workers) — stay open, as do the GET routes.

use super::error::ApiError;
use crate::controller::Shared;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The bearer token of an `Authorization` header (scheme case-insensitive), if any.
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let scheme = value.get(..7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    Some(value[7..].trim_ascii())
}

/// Compares two secrets in time that depends only on their lengths, not on where they
/// differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| acc | std::hint::black_box(x ^ y));
    diff == 0
}

/// Middleware: lets the request through when no token is configured or the right one is
/// given; 401 otherwise.
pub async fn require_token(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = &shared.config.api_token else {
        return next.run(request).await;
    };
    match bearer(request.headers()) {
        Some(given) if constant_time_eq(given, token.expose().as_bytes()) => {
            next.run(request).await
        }
        Some(_) => ApiError::Unauthorized { invalid: true }.into_response(),
        None => ApiError::Unauthorized { invalid: false }.into_response(),
    }
}

/// Logs, once at start, whether the mutating routes are protected.
pub fn log_policy(shared: &Shared) {
    if shared.config.api_token.is_some() {
        tracing::info!("mutating HTTP routes (/clear /pin /compress /decompress /move) require the --api-token bearer token");
    } else {
        tracing::warn!(
            "no --api-token set: the mutating HTTP routes (/clear /pin /compress /decompress \
             /move) are open to anyone who can reach the HTTP port"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn bearer_parsing() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer abc "),
        );
        assert_eq!(bearer(&h), Some(&b"abc"[..]));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer abc"),
        );
        assert_eq!(bearer(&h), Some(&b"abc"[..]));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bear"));
        assert_eq!(bearer(&h), None);
    }

    #[test]
    fn constant_time_compare() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(constant_time_eq(b"", b""));
    }
}
