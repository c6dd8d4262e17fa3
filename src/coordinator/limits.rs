//! The coordinator's HTTP limits: what a refusal by each of them looks like and where it is
//! counted. The limits themselves are enforced by the shared plumbing — [`crate::web::serve`]
//! (connection cap, read timeouts), `web::stack` (its announced-oversize check) and axum's
//! `DefaultBodyLimit` (body bytes) — and by [`JsonBody`] here (JSON values per body, counted
//! with `web::schema::too_many_values` before anything is parsed).
//!
//! Every refusal is counted exactly once, in [`Refused`], through [`refusals`]: a 413 by
//! the HTTP stack's metrics layer (by the limit the response names, else as a body-bytes
//! refusal), a connection wait or a read timeout by `web::limits::counting_hook`, which
//! `web::serve` calls.

use super::api_state::ApiState;
use crate::web::error::ApiError;
use crate::web::limits::{RefusalCounter, WebLimit};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Requests refused by each limit.
#[derive(Debug, Default)]
pub struct Refused {
    /// Event requests over `max_events_per_request`.
    pub events_per_request: AtomicU64,
    /// Registrations over the instance limit.
    pub instances: AtomicU64,
    /// Bodies that failed validation (422).
    pub invalid_bodies: AtomicU64,
    /// Bodies over `--max-body-bytes` (413).
    pub body_bytes: AtomicU64,
    /// Bodies over `--max-body-items` JSON values (413).
    pub body_items: AtomicU64,
    /// Connections that waited for a slot at `--max-http-connections` (every slot busy).
    pub connections: AtomicU64,
    /// Idle keep-alive connections closed at `--max-http-connections` to admit a new one.
    pub idle_closed: AtomicU64,
    /// Peers cut off by `--http-read-timeout`.
    pub read_timeout: AtomicU64,
}

impl Refused {
    /// Counts one refusal by `limit`.
    pub fn count(&self, limit: WebLimit) {
        let counter = match limit {
            WebLimit::BodyBytes => &self.body_bytes,
            WebLimit::BodyItems => &self.body_items,
            WebLimit::Connections => &self.connections,
            WebLimit::IdleClosed => &self.idle_closed,
            WebLimit::ReadTimeout => &self.read_timeout,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counts a refusal of the coordinator's HTTP server in [`Refused`] (through
/// `web::limits::counting_hook` for connection waits and read timeouts, and
/// the HTTP stack for 413s).
pub fn refusals(state: &Arc<ApiState>) -> RefusalCounter {
    let state = Arc::clone(state);
    Arc::new(move |limit: WebLimit| state.refused.count(limit))
}

/// The same counting as [`refusals`], as the HTTP stack's limit hook, for a state still being
/// built (a refusal after the state is gone counts nowhere).
pub fn hook_of(state: std::sync::Weak<ApiState>) -> crate::web::limits::LimitHook {
    let count: RefusalCounter = Arc::new(move |limit: WebLimit| {
        if let Some(state) = state.upgrade() {
            state.refused.count(limit);
        }
    });
    crate::web::limits::counting_hook("coordinator", count)
}

/// Extractor: the raw request body, refused with 413 past `--max-body-bytes` or when it holds
/// more than `--max-body-items` JSON values, 408 when the peer is too slow sending it.
#[derive(Debug)]
pub struct JsonBody(pub Bytes);

impl FromRequest<Arc<ApiState>> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<ApiState>) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e: BytesRejection| {
                if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::PayloadTooLarge(format!(
                        "the body is larger than {} bytes (--max-body-bytes)",
                        state.http.max_body_bytes
                    ))
                } else if crate::web::serve::is_read_timeout(&e) {
                    ApiError::RequestTimeout
                } else {
                    ApiError::BadRequest(format!("cannot read the body: {}", e.body_text()))
                }
            })?;
        let max = state.http.max_body_items;
        if crate::web::schema::too_many_values(&bytes, max) {
            return Err(ApiError::TooManyItems { max });
        }
        Ok(JsonBody(bytes))
    }
}
