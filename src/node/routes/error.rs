//! Every refusal of the node's own making on its HTTP routes, with its status and reason in
//! one place: a [`ServiceError`], so handlers use `?` and the body is the one error shape of
//! [`crate::web::error`]. Bodies that cannot be read or parsed are refused before, by
//! [`crate::web::json`].

use crate::web::json::ServiceError;
use axum::http::StatusCode;

/// A request the node refuses.
#[derive(Debug)]
pub(crate) enum NodeError {
    /// 400: a query string that does not parse (axum's text).
    Query(String),
    /// 413: a list in the body over the route's limit.
    TooLarge(String),
    /// 422: a value the route does not take.
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

impl ServiceError for NodeError {
    fn status(&self) -> StatusCode {
        match self {
            NodeError::Query(_) | NodeError::Unsupported(_) => StatusCode::BAD_REQUEST,
            NodeError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            NodeError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            NodeError::NoL2 | NodeError::PrefetchesBusy => StatusCode::SERVICE_UNAVAILABLE,
            NodeError::UnknownPrefetch(_) => StatusCode::NOT_FOUND,
            NodeError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn reason(&self) -> &'static str {
        match self {
            NodeError::Query(_) | NodeError::Unsupported(_) => "bad_request",
            NodeError::TooLarge(_) => "too_large",
            NodeError::Invalid(_) => "invalid_value",
            NodeError::NoL2 | NodeError::PrefetchesBusy => "unavailable",
            NodeError::UnknownPrefetch(_) => "not_found",
            NodeError::Internal(_) => "internal",
        }
    }
}

impl std::fmt::Display for NodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeError::Query(m)
            | NodeError::TooLarge(m)
            | NodeError::Invalid(m)
            | NodeError::Unsupported(m)
            | NodeError::Internal(m) => f.write_str(m),
            NodeError::NoL2 => f.write_str("no L2 configured (tier includes l2)"),
            NodeError::PrefetchesBusy => {
                f.write_str("too many warm prefetches running; retry later")
            }
            NodeError::UnknownPrefetch(id) => write!(
                f,
                "unknown prefetch request_id={id:?} (never submitted, or forgotten)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::web::error::ApiError;

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
            let detail = e.to_string();
            let api = ApiError::from(e);
            assert_eq!(api.status().as_u16(), status);
            assert_eq!(api.reason(), reason);
            assert_eq!(api.detail(), detail);
        }
    }
}
