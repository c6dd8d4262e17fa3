//! The one error type of kvplane's HTTP services, [`ApiError`], and how each variant maps to
//! a status code, a stable reason code and a JSON body. Every error answer of every route of
//! every service goes through it, so the same mistake gets the same answer everywhere.
//!
//! One body shape serves every service's real clients at once:
//!
//! ```json
//! {"detail": <text, or pydantic's error list>, "error": "<one line>", "reason": "<code>",
//!  "field": "<field at fault>", "index": <list index>}
//! ```
//!
//! * `detail` is FastAPI's, which LMCache's controller, its MP coordinator and its MP server
//!   run on, so LMCache clients parse it unchanged: the text, or for a bad request body the
//!   pydantic list `[{"type", "loc", "msg", "input"}]` with `loc` naming the field (at most
//!   [`MAX_REPORTED_ERRORS`] of them; `omitted_errors` counts the rest);
//! * `error`, `reason`, `field` and `index` are the Conductor indexer's (spec kv-indexer §1:
//!   routers read `reason`, a stable code such as `missing`, `not_found`, `unauthorized`);
//!   `field` and `index` come from the first error's `loc`.
//!
//! Errors about workers add `event_id` and a `workers` list naming each failed worker. The
//! router's OpenAI routes render the same error in OpenAI's shape
//! ([`ApiError::openai_response`]), the one place a client expects another.
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

/// A refusal in the Conductor indexer's terms (spec kv-indexer §1): any status, a stable
/// reason code, the field and list index at fault. Rendered as an [`ApiError`] (`detail` and
/// `error` carry the message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP status.
    pub status: StatusCode,
    /// A stable code: `missing`, `invalid_type`, `invalid_value`, `out_of_range`,
    /// `invalid_json`, `not_found`, `conflict`, `method_not_allowed`, `internal`.
    pub reason: &'static str,
    /// What went wrong.
    pub message: String,
    /// The field at fault.
    pub field: Option<std::borrow::Cow<'static, str>>,
    /// The index inside a list field.
    pub index: Option<usize>,
}

impl Refusal {
    /// A refusal with no field.
    pub fn new(status: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            reason,
            message: message.into(),
            field: None,
            index: None,
        }
    }

    /// The request body could not be read: 413 past the body limit, 408 when the client was
    /// too slow sending it, 400 otherwise.
    pub fn unreadable_body(e: &axum::extract::rejection::BytesRejection, max: usize) -> Self {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("the body is larger than {max} bytes (--max-body-bytes)"),
            )
        } else if super::limits::is_read_timeout(e) {
            Self::new(
                StatusCode::REQUEST_TIMEOUT,
                "timeout",
                "the request body was not received within --http-read-timeout",
            )
        } else {
            Self::new(
                StatusCode::BAD_REQUEST,
                "unreadable_body",
                format!("cannot read the body: {}", e.body_text()),
            )
        }
    }

    /// A 400 about `field`.
    pub fn field(reason: &'static str, field: &'static str, message: impl Into<String>) -> Self {
        Self {
            field: Some(field.into()),
            ..Self::new(StatusCode::BAD_REQUEST, reason, message)
        }
    }

    /// A 400 for a body that is not JSON.
    pub fn invalid_json(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_json", message)
    }

    /// A 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// A 409 about `field`.
    pub fn conflict(field: &'static str, message: impl Into<String>) -> Self {
        Self {
            field: Some(field.into()),
            ..Self::new(StatusCode::CONFLICT, "conflict", message)
        }
    }

    /// A 405.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "method not allowed on this route",
        )
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        ApiError::Refused(Box::new(self)).into_response()
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> Self {
        ApiError::Refused(Box::new(r))
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
    /// 400: a request the schema allows but the service refuses, or a body that is not JSON.
    BadRequest(String),
    /// 405: the route exists, not with this method.
    MethodNotAllowed,
    /// 502: a peer the request needed (an MP server, an engine) failed or refused.
    BadGateway(String),
    /// 503: a limit is reached, the service is stopping, or it cannot serve this yet.
    Unavailable(String),
    /// 504: a peer the request needed did not answer in time.
    GatewayTimeout(String),
    /// Any status, with the Conductor's reason code, field and index ([`Refusal`]).
    Refused(Box<Refusal>),
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
    /// An error of `status` for a handler that picks the status itself, with the variant's
    /// reason code (`not_found`, `unavailable`, …; `invalid_value` for a 422).
    pub fn of_status(status: StatusCode, message: impl Into<String>) -> Self {
        let m = message.into();
        match status {
            StatusCode::BAD_REQUEST => ApiError::BadRequest(m),
            StatusCode::NOT_FOUND => ApiError::NotFound(m),
            StatusCode::CONFLICT => ApiError::Conflict(m),
            StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge(m),
            StatusCode::BAD_GATEWAY => ApiError::BadGateway(m),
            StatusCode::SERVICE_UNAVAILABLE => ApiError::Unavailable(m),
            StatusCode::GATEWAY_TIMEOUT => ApiError::GatewayTimeout(m),
            StatusCode::INTERNAL_SERVER_ERROR => ApiError::Internal(m),
            _ => Refusal::new(status, "invalid_value", m).into(),
        }
    }

    /// The status code.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::BadGateway(_) => StatusCode::BAD_GATEWAY,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::GatewayTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Refused(r) => r.status,
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
            | ApiError::BadRequest(s)
            | ApiError::BadGateway(s)
            | ApiError::Unavailable(s)
            | ApiError::GatewayTimeout(s)
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
            ApiError::Refused(r) => r.message.clone(),
            ApiError::MethodNotAllowed => "Method Not Allowed".into(),
            ApiError::Unauthorized { invalid: false } => "Not authenticated".into(),
            ApiError::Unauthorized { invalid: true } => "Invalid token".into(),
            ApiError::Workers(w) => w.detail(),
        }
    }

    /// The stable reason code of the body's `reason` (the Conductor's vocabulary where it
    /// has a word; a validation error's is its first error's `type`).
    pub fn reason(&self) -> &'static str {
        match self {
            ApiError::Validation(errors) => errors.errors.first().map_or("invalid", |e| e.kind),
            ApiError::NotFound(_) => "not_found",
            ApiError::Unauthorized { .. } => "unauthorized",
            ApiError::Conflict(_) => "conflict",
            ApiError::BadRequest(_) => "bad_request",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::BadGateway(_) => "bad_gateway",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::GatewayTimeout(_) => "gateway_timeout",
            ApiError::Refused(r) => r.reason,
            ApiError::PayloadTooLarge(_) | ApiError::TooManyItems { .. } => "too_large",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::RequestTimeout => "timeout",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::Workers(w) => w.outcome(),
            ApiError::Internal(_) => "internal",
        }
    }

    /// The same error in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`
    /// (`code` the status, as vLLM answers), for the router's OpenAI-compatible routes (their
    /// clients read nothing else). `type` is a [`Refusal`]'s reason, else OpenAI's class.
    pub fn openai_response(self) -> Response {
        let status = self.status();
        let kind = match (&self, status.as_u16()) {
            (ApiError::Refused(r), _) => r.reason,
            (_, 401 | 403) => "authentication_error",
            (_, 400..=499) => "invalid_request_error",
            _ => "server_error",
        };
        let body = json!({"error": {
            "message": self.detail(), "type": kind, "param": self.field_name(),
            "code": status.as_u16(),
        }});
        let mut response = (status, Json(body)).into_response();
        self.decorate(&mut response);
        response
    }

    /// The field at fault (the first error's `loc` after `body`/`query`), if any.
    pub fn field_name(&self) -> Option<String> {
        if let ApiError::Refused(r) = self {
            return r.field.as_deref().map(str::to_owned);
        }
        let ApiError::Validation(errors) = self else {
            return None;
        };
        match errors.errors.first()?.loc.get(1)? {
            LocPart::Key(k) => Some(k.clone()),
            LocPart::Index(_) => None,
        }
    }

    /// The list index at fault (the first integer of the first error's `loc`), if any.
    pub fn field_index(&self) -> Option<usize> {
        if let ApiError::Refused(r) = self {
            return r.index;
        }
        let ApiError::Validation(errors) = self else {
            return None;
        };
        errors.errors.first()?.loc.iter().find_map(|p| match p {
            LocPart::Index(i) => Some(*i),
            LocPart::Key(_) => None,
        })
    }

    /// Adds the limit hit and the auth challenge a response of this error carries.
    fn decorate(&self, response: &mut Response) {
        if let Some(hit) = self.limit_hit() {
            response.extensions_mut().insert(hit);
        }
        if let ApiError::Unauthorized { invalid } = self {
            let challenge = if *invalid {
                HeaderValue::from_static("Bearer error=\"invalid_token\"")
            } else {
                HeaderValue::from_static("Bearer")
            };
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, challenge);
        }
    }

    /// A 422 with one pydantic `value_error` at `loc` (JSON strings are keys, integers list
    /// indices), as a model validator's refusal reads in FastAPI.
    pub fn value_error(loc: Vec<Value>, msg: impl Into<String>) -> Self {
        let loc = loc
            .into_iter()
            .map(|v| match v {
                Value::Number(n) => n.as_u64().map_or_else(
                    || LocPart::Key(n.to_string()),
                    |i| LocPart::Index(i as usize),
                ),
                Value::String(s) => LocPart::Key(s),
                other => LocPart::Key(other.to_string()),
            })
            .collect();
        ApiError::field(FieldError::new("value_error", loc, msg, Value::Null))
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

impl ApiError {
    /// The JSON body (module docs: `detail`, `error`, `reason`, `field`, `index`, and the
    /// workers' details for a worker failure).
    pub fn body(&self) -> Value {
        let mut body = Map::new();
        match self {
            ApiError::Validation(errors) => {
                body.insert("detail".into(), json!(errors.errors));
                if errors.omitted > 0 {
                    body.insert("omitted_errors".into(), errors.omitted.into());
                }
            }
            other => {
                body.insert("detail".into(), other.detail().into());
            }
        }
        body.insert("error".into(), self.detail().into());
        body.insert("reason".into(), self.reason().into());
        if let Some(field) = self.field_name() {
            body.insert("field".into(), field.into());
        }
        if let Some(index) = self.field_index() {
            body.insert("index".into(), index.into());
        }
        if let ApiError::Workers(w) = self {
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
        }
        Value::Object(body)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), Json(self.body())).into_response();
        self.decorate(&mut response);
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
