//! The one error type of kvplane's HTTP services, [`ApiError`], and how each variant maps to
//! a status code and a JSON body. Every error answer of every route goes through it.
//!
//! Bodies follow FastAPI, which LMCache's controller runs on, so LMCache clients parse them
//! unchanged: `{"detail": "<text>"}` for every error, and for a bad request body the
//! pydantic list `{"detail": [{"type", "loc", "msg", "input"}]}` with `loc` naming the field
//! (at most [`MAX_REPORTED_ERRORS`] of them; `omitted_errors` counts the rest). Errors about
//! workers add `event_id` and a `workers` list naming each failed worker.
//!
//! Owns no state and knows no service: how a service's own failures (e.g. the controller's
//! downlink errors) become a [`WorkerFailure`] is that service's business.

use super::limits::{LimitHit, WebLimit};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::{json, Map, Value};

/// One element of a `loc` path: a field name or a list index.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum LocPart {
    /// A field, or the first element `"body"` / `"query"`.
    Key(String),
    /// An index into a list.
    Index(usize),
}

impl From<&str> for LocPart {
    fn from(s: &str) -> Self {
        LocPart::Key(s.to_owned())
    }
}

impl From<usize> for LocPart {
    fn from(i: usize) -> Self {
        LocPart::Index(i)
    }
}

/// One validation error, as pydantic reports it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FieldError {
    /// Pydantic's error type (`missing`, `string_type`, `int_type`, `json_invalid`, …).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Where: `["body", "location"]`, `["body", "tokens", 3]`, `["query", "worker_id"]`.
    pub loc: Vec<LocPart>,
    /// What is wrong, in pydantic's words.
    pub msg: String,
    /// The offending input (the whole object for a missing field, as pydantic does).
    pub input: Value,
    /// Extra context (pydantic's `ctx`), when there is some.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ctx: Option<Value>,
}

impl FieldError {
    /// An error at `loc`.
    pub fn new(
        kind: &'static str,
        loc: Vec<LocPart>,
        msg: impl Into<String>,
        input: Value,
    ) -> Self {
        FieldError {
            kind,
            loc,
            msg: msg.into(),
            input,
            ctx: None,
        }
    }

    /// Adds pydantic's `ctx`.
    pub fn with_ctx(mut self, ctx: Value) -> Self {
        self.ctx = Some(ctx);
        self
    }
}

/// Why one worker did not give a usable answer to a command.
#[derive(Clone, Debug, PartialEq)]
pub enum FailureKind {
    /// No answer within `--downlink-timeout`.
    Timeout,
    /// Too many commands already queued for that worker.
    Busy,
    /// The connection failed, or the worker was removed while the command waited.
    Unreachable,
    /// The worker answered `ErrorMsg`.
    ErrorReply,
    /// The worker answered with another message type than the command's reply.
    UnexpectedReply,
    /// The worker's answer could not be decoded.
    Undecodable,
}

impl FailureKind {
    /// Short name, used in the JSON body and as a metric label.
    pub fn as_str(&self) -> &'static str {
        match self {
            FailureKind::Timeout => "timeout",
            FailureKind::Busy => "busy",
            FailureKind::Unreachable => "unreachable",
            FailureKind::ErrorReply => "error_reply",
            FailureKind::UnexpectedReply => "unexpected_reply",
            FailureKind::Undecodable => "undecodable",
        }
    }
}

/// One worker's failure, naming the worker.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerFailure {
    /// Instance of the worker.
    pub instance_id: String,
    /// Worker id.
    pub worker_id: i64,
    /// `host:port` of its command socket.
    pub endpoint: String,
    /// What went wrong.
    pub kind: FailureKind,
    /// Details (the worker's error text, the reply type, …).
    pub message: String,
}

impl WorkerFailure {
    fn describe(&self) -> String {
        format!(
            "worker ({}, {}) at {}: {}",
            self.instance_id, self.worker_id, self.endpoint, self.message
        )
    }
}

/// A command that did not get a usable answer from every worker.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkersFailed {
    /// The command (`clear`, `health`, …).
    pub command: &'static str,
    /// Its event id (look it up with `/check_finish`).
    pub event_id: String,
    /// Workers addressed.
    pub total: usize,
    /// The workers that failed, in worker-id order.
    pub failures: Vec<WorkerFailure>,
    /// Partial results to include in the body (e.g. `error_codes` of `/health`).
    pub extra: Map<String, Value>,
}

impl WorkersFailed {
    /// 504 if any worker timed out, 503 if all failures are full queues, else 502.
    pub fn status(&self) -> StatusCode {
        if self.failures.iter().any(|f| f.kind == FailureKind::Timeout) {
            StatusCode::GATEWAY_TIMEOUT
        } else if self.failures.iter().all(|f| f.kind == FailureKind::Busy) {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::BAD_GATEWAY
        }
    }

    /// The metric outcome label.
    pub fn outcome(&self) -> &'static str {
        match self.status() {
            StatusCode::GATEWAY_TIMEOUT => "timeout",
            StatusCode::SERVICE_UNAVAILABLE => "busy",
            _ => "worker_error",
        }
    }

    /// One line naming every failed worker.
    pub fn detail(&self) -> String {
        let list: Vec<String> = self.failures.iter().map(WorkerFailure::describe).collect();
        format!(
            "{} failed on {} of {} workers: {}",
            self.command,
            self.failures.len(),
            self.total,
            list.join("; ")
        )
    }
}

/// Most validation errors one answer reports; the rest are only counted, so that a body of a
/// million bad items cannot make a million-item answer.
pub const MAX_REPORTED_ERRORS: usize = 20;

/// The validation errors of one request: the first [`MAX_REPORTED_ERRORS`], and how many
/// more there were.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldErrors {
    /// The errors reported, in the order found.
    pub errors: Vec<FieldError>,
    /// Errors found beyond [`MAX_REPORTED_ERRORS`], counted but not reported.
    pub omitted: usize,
}

impl FieldErrors {
    /// Records one error: kept if fewer than [`MAX_REPORTED_ERRORS`] are, else only counted.
    /// `make` runs only when the error is kept, so counting the rest allocates nothing.
    pub fn push_with(&mut self, make: impl FnOnce() -> FieldError) {
        if self.errors.len() < MAX_REPORTED_ERRORS {
            self.errors.push(make());
        } else {
            self.omitted += 1;
        }
    }

    /// Records one error (see [`FieldErrors::push_with`]).
    pub fn push(&mut self, error: FieldError) {
        self.push_with(|| error);
    }

    /// Whether the cap is reached: further errors are only counted.
    pub fn full(&self) -> bool {
        self.errors.len() >= MAX_REPORTED_ERRORS
    }

    /// No error at all.
    pub fn is_empty(&self) -> bool {
        self.errors.is_empty() && self.omitted == 0
    }
}

impl From<Vec<FieldError>> for FieldErrors {
    fn from(all: Vec<FieldError>) -> Self {
        let mut errors = FieldErrors::default();
        for e in all {
            errors.push(e);
        }
        errors
    }
}

/// Every error an HTTP route returns.
#[derive(Debug)]
pub enum ApiError {
    /// 422: the body or query does not match the route's schema.
    Validation(FieldErrors),
    /// 404: unknown instance, ip, worker or event.
    NotFound(String),
    /// 401: a mutating route without the right bearer token (`invalid`: a token was given).
    Unauthorized {
        /// A token was given, but not the right one.
        invalid: bool,
    },
    /// 409: the command cannot run in the fleet's current state (e.g. no P2P on the target).
    Conflict(String),
    /// 413: the body is larger than the API accepts (`--max-body-bytes`).
    PayloadTooLarge(String),
    /// 413: the body holds more JSON values than the API accepts (`--max-body-items`).
    TooManyItems {
        /// The limit.
        max: usize,
    },
    /// 415: a state-changing route got a body that is not declared as JSON.
    UnsupportedMediaType(String),
    /// 408: the peer took longer than `--http-read-timeout` to send the body.
    RequestTimeout,
    /// 403: a state-changing request from a browser page of another origin.
    Forbidden(String),
    /// 504 / 503 / 502: some workers gave no usable answer.
    Workers(Box<WorkersFailed>),
    /// 500: a bug; never expected.
    Internal(String),
}

impl ApiError {
    /// The status code.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge(_) | ApiError::TooManyItems { .. } => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::Workers(w) => w.status(),
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A one-line description (the `detail` text; for validation errors, the messages).
    pub fn detail(&self) -> String {
        match self {
            ApiError::Validation(errors) => {
                let mut text = errors
                    .errors
                    .iter()
                    .map(|e| format!("{}: {}", loc_text(&e.loc), e.msg))
                    .collect::<Vec<_>>()
                    .join("; ");
                if errors.omitted > 0 {
                    text.push_str(&format!("; and {} more", errors.omitted));
                }
                text
            }
            ApiError::NotFound(s)
            | ApiError::Conflict(s)
            | ApiError::PayloadTooLarge(s)
            | ApiError::UnsupportedMediaType(s)
            | ApiError::Forbidden(s)
            | ApiError::Internal(s) => s.clone(),
            ApiError::RequestTimeout => {
                "the request body was not received within --http-read-timeout".into()
            }
            ApiError::TooManyItems { max } => format!(
                "the body holds more than {max} JSON values (--max-body-items); split the request"
            ),
            ApiError::Unauthorized { invalid: false } => "Not authenticated".into(),
            ApiError::Unauthorized { invalid: true } => "Invalid token".into(),
            ApiError::Workers(w) => w.detail(),
        }
    }

    /// A single validation error.
    pub fn field(error: FieldError) -> Self {
        ApiError::Validation(FieldErrors {
            errors: vec![error],
            omitted: 0,
        })
    }

    /// The limit this error is a refusal by, if any (counted by the metrics layer).
    pub fn limit_hit(&self) -> Option<LimitHit> {
        match self {
            ApiError::TooManyItems { max } => Some(LimitHit {
                limit: WebLimit::BodyItems,
                value: *max as u64,
            }),
            _ => None,
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.status(), self.detail())
    }
}

impl std::error::Error for ApiError {}

fn loc_text(loc: &[LocPart]) -> String {
    loc.iter()
        .map(|p| match p {
            LocPart::Key(k) => k.clone(),
            LocPart::Index(i) => i.to_string(),
        })
        .collect::<Vec<_>>()
        .join(".")
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = match &self {
            ApiError::Validation(errors) if errors.omitted > 0 => {
                json!({ "detail": errors.errors, "omitted_errors": errors.omitted })
            }
            ApiError::Validation(errors) => json!({ "detail": errors.errors }),
            ApiError::Workers(w) => {
                let mut body = Map::new();
                body.insert("detail".into(), w.detail().into());
                body.insert("event_id".into(), w.event_id.clone().into());
                let workers: Vec<Value> = w
                    .failures
                    .iter()
                    .map(|f| {
                        json!({
                            "instance_id": f.instance_id,
                            "worker_id": f.worker_id,
                            "endpoint": f.endpoint,
                            "error": f.kind.as_str(),
                            "message": f.message,
                        })
                    })
                    .collect();
                body.insert("workers".into(), workers.into());
                for (k, v) in &w.extra {
                    body.insert(k.clone(), v.clone());
                }
                Value::Object(body)
            }
            other => json!({ "detail": other.detail() }),
        };
        let mut response = (status, Json(body)).into_response();
        if let Some(hit) = self.limit_hit() {
            response.extensions_mut().insert(hit);
        }
        if let ApiError::Unauthorized { invalid } = self {
            let challenge = if invalid {
                HeaderValue::from_static("Bearer error=\"invalid_token\"")
            } else {
                HeaderValue::from_static("Bearer")
            };
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, challenge);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(kind: FailureKind) -> WorkerFailure {
        WorkerFailure {
            instance_id: "inst".into(),
            worker_id: 1,
            endpoint: "127.0.0.1:9".into(),
            kind,
            message: "it failed".into(),
        }
    }

    fn failed(failures: Vec<WorkerFailure>) -> WorkersFailed {
        WorkersFailed {
            command: "clear",
            event_id: "Clear-x".into(),
            total: 3,
            failures,
            extra: Map::new(),
        }
    }

    #[test]
    fn worker_failures_map_to_gateway_codes() {
        let [timeout, busy, closed] = [
            FailureKind::Timeout,
            FailureKind::Busy,
            FailureKind::Unreachable,
        ]
        .map(failure);
        assert_eq!(
            failed(vec![busy.clone(), timeout.clone()]).status(),
            StatusCode::GATEWAY_TIMEOUT
        );
        assert_eq!(
            failed(vec![busy.clone()]).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(failed(vec![busy, closed]).status(), StatusCode::BAD_GATEWAY);
        let detail = failed(vec![timeout]).detail();
        assert!(
            detail.contains("clear failed on 1 of 3 workers")
                && detail.contains("(inst, 1) at 127.0.0.1:9: it failed"),
            "{detail}"
        );
    }

    #[test]
    fn errors_beyond_the_cap_are_counted_not_kept() {
        let mut errors = FieldErrors::default();
        let mut made = 0;
        for i in 0..MAX_REPORTED_ERRORS + 5 {
            errors.push_with(|| {
                made += 1;
                FieldError::new("int_type", vec!["body".into(), i.into()], "m", json!("x"))
            });
        }
        assert_eq!(
            (errors.errors.len(), errors.omitted),
            (MAX_REPORTED_ERRORS, 5)
        );
        assert_eq!(
            made, MAX_REPORTED_ERRORS,
            "errors past the cap are never built"
        );
        let e = ApiError::Validation(errors);
        assert!(e.detail().ends_with("; and 5 more"), "{}", e.detail());
        assert!(e.to_string().starts_with("422 "), "{e}");
    }

    #[test]
    fn validation_errors_serialize_like_pydantic() {
        let e = FieldError::new(
            "missing",
            vec!["body".into(), "location".into()],
            "Field required",
            json!({"instance_id": "x"}),
        );
        assert_eq!(
            serde_json::to_value(&e).expect("serializes"),
            json!({"type": "missing", "loc": ["body", "location"], "msg": "Field required",
                   "input": {"instance_id": "x"}})
        );
        let e = FieldError::new(
            "int_type",
            vec!["body".into(), "tokens".into(), 3.into()],
            "m",
            json!("x"),
        );
        assert_eq!(ApiError::field(e).detail(), "body.tokens.3: m");
    }
}
