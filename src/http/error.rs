//! The HTTP API's one error type, [`ApiError`], and how each variant maps to a status code
//! and a JSON body.
//!
//! Bodies follow FastAPI, which LMCache's controller runs on, so LMCache clients parse them
//! unchanged: `{"detail": "<text>"}` for every error, and for a bad request body the
//! pydantic list `{"detail": [{"type", "loc", "msg", "input"}]}` with `loc` naming the field.
//! Errors about workers add `event_id` and a `workers` list naming each failed worker.

use crate::controller::DownlinkError;
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
    /// Classifies a downlink error.
    pub fn from_downlink(
        instance_id: &str,
        worker_id: i64,
        endpoint: &str,
        error: &DownlinkError,
    ) -> Self {
        let kind = match error {
            DownlinkError::Timeout(_) => FailureKind::Timeout,
            DownlinkError::Busy => FailureKind::Busy,
            DownlinkError::Decode(_) => FailureKind::Undecodable,
            DownlinkError::Transport(_) | DownlinkError::Closed => FailureKind::Unreachable,
        };
        let message = match error {
            // The downlink reports the time left before the deadline (e.g. 4.99995s): round.
            DownlinkError::Timeout(d) => format!(
                "worker did not answer within {:?}",
                std::time::Duration::from_millis(d.as_secs_f64().mul_add(1000.0, 0.5) as u64)
            ),
            other => other.to_string(),
        };
        WorkerFailure {
            instance_id: instance_id.to_owned(),
            worker_id,
            endpoint: endpoint.to_owned(),
            kind,
            message,
        }
    }

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

/// Every error the HTTP API returns.
#[derive(Debug)]
pub enum ApiError {
    /// 422: the body or query does not match the route's schema.
    Validation(Vec<FieldError>),
    /// 404: unknown instance, ip, worker or event.
    NotFound(String),
    /// 401: a mutating route without the right bearer token (`invalid`: a token was given).
    Unauthorized {
        /// A token was given, but not the right one.
        invalid: bool,
    },
    /// 409: the command cannot run in the fleet's current state (e.g. no P2P on the target).
    Conflict(String),
    /// 413: the body is larger than the API accepts.
    PayloadTooLarge(String),
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
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Workers(w) => w.status(),
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A one-line description (the `detail` text; for validation errors, the messages).
    pub fn detail(&self) -> String {
        match self {
            ApiError::Validation(errors) => errors
                .iter()
                .map(|e| format!("{}: {}", loc_text(&e.loc), e.msg))
                .collect::<Vec<_>>()
                .join("; "),
            ApiError::NotFound(s)
            | ApiError::Conflict(s)
            | ApiError::PayloadTooLarge(s)
            | ApiError::Internal(s) => s.clone(),
            ApiError::Unauthorized { invalid: false } => "Not authenticated".into(),
            ApiError::Unauthorized { invalid: true } => "Invalid token".into(),
            ApiError::Workers(w) => w.detail(),
        }
    }

    /// A single validation error.
    pub fn field(error: FieldError) -> Self {
        ApiError::Validation(vec![error])
    }
}

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
            ApiError::Validation(errors) => json!({ "detail": errors }),
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
    use std::time::Duration;

    fn failure(kind: DownlinkError) -> WorkerFailure {
        WorkerFailure::from_downlink("inst", 1, "127.0.0.1:9", &kind)
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
        let timeout = failure(DownlinkError::Timeout(Duration::from_millis(500)));
        let busy = failure(DownlinkError::Busy);
        let closed = failure(DownlinkError::Closed);
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
                && detail.contains("(inst, 1) at 127.0.0.1:9"),
            "{detail}"
        );
        let nearly = failure(DownlinkError::Timeout(Duration::from_nanos(4_999_954_026)));
        assert_eq!(nearly.message, "worker did not answer within 5s");
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
