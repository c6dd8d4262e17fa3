//! Every refusal of the node's HTTP routes, with its status in one place: handlers return
//! `Result<_, NodeError>` and use `?`; the body is the one error shape of
//! [`crate::web::error`] (its reason follows from the status, as `ApiError::of_status` says).

use crate::web::error::ApiError;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// A request the node refuses.
#[derive(Debug)]
pub(crate) enum NodeError {
    /// 400: a query string that does not parse (axum's text).
    Query(String),
    /// The body could not be read: 408 when the client was too slow sending it (counted by
    /// `web::serve`'s limit hook), else the rejection's own status.
    Unreadable(BytesRejection),
    /// 413: a body, or a list in it, over the route's limit.
    TooLarge(String),
    /// 422: a body that does not parse, or a value the route does not take.
    Invalid(String),
    /// 400: a request the schema allows but the node cannot serve (a tier pair, a model or
    /// salt it cannot key, an unknown location, too many token ids).
    Unsupported(String),
    /// 503: the request names L2 and the node has none.
    NoL2,
    /// 503: every warm prefetch slot holds a running job.
    PrefetchesBusy,
    /// 404: a warm prefetch never submitted, or forgotten (the id).
    UnknownPrefetch(String),
    /// 500: the change could not be recorded (the pin file).
    Internal(String),
}

impl NodeError {
    /// The status code.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            NodeError::Query(_) | NodeError::Unsupported(_) => StatusCode::BAD_REQUEST,
            NodeError::Unreadable(e) if crate::web::serve::is_read_timeout(e) => {
                StatusCode::REQUEST_TIMEOUT
            }
            NodeError::Unreadable(e) => e.status(),
            NodeError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            NodeError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            NodeError::NoL2 | NodeError::PrefetchesBusy => StatusCode::SERVICE_UNAVAILABLE,
            NodeError::UnknownPrefetch(_) => StatusCode::NOT_FOUND,
            NodeError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// What went wrong, for the body's `detail`.
    pub(crate) fn message(&self) -> String {
        match self {
            NodeError::Query(m)
            | NodeError::TooLarge(m)
            | NodeError::Invalid(m)
            | NodeError::Unsupported(m)
            | NodeError::Internal(m) => m.clone(),
            NodeError::Unreadable(e) if crate::web::serve::is_read_timeout(e) => {
                "the request body was not received within --http-read-timeout".into()
            }
            NodeError::Unreadable(e) => e.body_text(),
            NodeError::NoL2 => "no L2 configured (tier includes l2)".into(),
            NodeError::PrefetchesBusy => "too many warm prefetches running; retry later".into(),
            NodeError::UnknownPrefetch(id) => {
                format!("unknown prefetch request_id={id:?} (never submitted, or forgotten)")
            }
        }
    }
}

impl From<NodeError> for ApiError {
    fn from(e: NodeError) -> Self {
        ApiError::of_status(e.status(), e.message())
    }
}

impl IntoResponse for NodeError {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_keeps_the_status_and_reason_it_had() {
        for (e, status, reason) in [
            (NodeError::Query("q".into()), 400, "bad_request"),
            (NodeError::Unsupported("u".into()), 400, "bad_request"),
            (NodeError::TooLarge("t".into()), 413, "too_large"),
            (NodeError::Invalid("i".into()), 422, "invalid_value"),
            (NodeError::NoL2, 503, "unavailable"),
            (NodeError::PrefetchesBusy, 503, "unavailable"),
            (NodeError::UnknownPrefetch("x".into()), 404, "not_found"),
            (NodeError::Internal("e".into()), 500, "internal"),
        ] {
            assert_eq!(e.status().as_u16(), status, "{e:?}");
            let api = ApiError::from(e);
            assert_eq!(api.status().as_u16(), status);
            assert_eq!(api.reason(), reason);
        }
    }
}
