//! The coordinator's HTTP limits: what a refusal by each of them looks like and where it is
//! counted. The limits themselves are enforced by the shared plumbing — [`crate::web::serve`]
//! (connection cap, read timeouts), `web::stack` (its announced-oversize check) and axum's
//! `DefaultBodyLimit` (body bytes) — and by [`JsonBody`] here (JSON values per body, counted
//! with `web::schema::too_many_values` before anything is parsed).
//!
//! Every refusal is counted exactly once, in [`crate::coordinator::state::api_state::RefusalCounts`], through [`refusals`]: a 413 by
//! the HTTP stack's metrics layer (by the limit the response names, else as a body-bytes
//! refusal), a connection wait or a read timeout by `web::limits::counting_hook`, which
//! `web::serve` calls.

use crate::coordinator::state::api_state::ApiState;
use crate::web::error::ApiError;
use crate::web::limits::{RefusalCounter, WebLimit};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use std::sync::Arc;

/// Counts a refusal of the coordinator's HTTP server in [`crate::coordinator::state::api_state::RefusalCounts`] (through
/// `web::limits::counting_hook` for connection waits and read timeouts, and
/// the HTTP stack for 413s).
pub(crate) fn refusals(state: &Arc<ApiState>) -> RefusalCounter {
    let state = Arc::clone(state);
    Arc::new(move |limit: WebLimit| state.refused.count(limit))
}

/// The same counting as [`refusals`], as the HTTP stack's limit hook, for a state still being
/// built (a refusal after the state is gone counts nowhere).
pub(crate) fn hook_of(state: std::sync::Weak<ApiState>) -> crate::web::limits::LimitHook {
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
pub(crate) struct JsonBody(pub Bytes);

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
