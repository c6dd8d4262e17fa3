//! The one way a route reads its request body, and the one way a handler's own failures become
//! answers.
//!
//! Every body goes through [`read`]: the body limit (`--max-body-bytes`: 413), a client too
//! slow to send it (`--http-read-timeout`: 408), an unreadable body (400), then the item limit
//! (`--max-body-items`, counted before anything is parsed: 413). Three extractors stand on it,
//! one per kind of body a handler reads:
//!
//! * [`Json<T>`] — a body with a declarative table ([`crate::web::schema::Body`]): validated
//!   against it (pydantic's errors, `loc` naming the field), then read into `T`;
//! * [`Serde<T>`] — any serde type: a JSON object ([`crate::web::body::read`]), then serde with
//!   the path of the field at fault (`loc`);
//! * [`RawBody`] — the bytes, limits checked, for wire formats a service parses itself (the
//!   indexer's `/query` fast path, the node's byte-exact copies of LMCache's bodies).
//!
//! A refusal is an [`ApiError`]; its *style* is the service's, not the handler's: the stack puts
//! the service's [`ErrorStyle`] into every request ([`crate::web::stack::Stack::style`]) and a
//! route may override it ([`crate::web::route::Spec::style`]), and [`restyle`] renders the same
//! refusal as FastAPI does (422 with pydantic's list: LMCache's controller, coordinator, MP
//! server) or as the Conductor indexer does (400 with a reason code and the field: spec
//! kv-indexer §1). OpenAI's shape (the router's OpenAI routes) is applied to the response by
//! the route itself ([`crate::web::route`]).
//!
//! A handler's own failures implement [`ServiceError`] (status, reason code, field): `?` turns
//! them into an [`ApiError`], so no handler picks a `StatusCode` by hand.
//!
//! Knows no service.

use super::body;
use super::error::{ApiError, FieldError, Refusal};
use super::limits::HttpLimits;
use crate::config::defaults::MAX_BODY_ITEMS;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

/// How a service words a refused request (module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ErrorStyle {
    /// FastAPI's: a body that does not match its schema is a 422 with pydantic's error list
    /// (LMCache's controller, its MP coordinator and MP server).
    #[default]
    FastApi,
    /// The Conductor indexer's: every refused body is a 400 with a stable reason code and the
    /// field at fault (spec kv-indexer §1).
    Conductor,
    /// OpenAI's `{"error": {"message", "type", "param", "code"}}` (the router's OpenAI routes).
    OpenAi,
}

impl ErrorStyle {
    /// The style a request carries (the stack's, or its route's), FastAPI's when none.
    pub fn of(request: &Request) -> Self {
        request
            .extensions()
            .get::<ErrorStyle>()
            .copied()
            .unwrap_or_default()
    }
}

/// A handler's own failure: what it is, as a status and a stable reason code. `?` makes it
/// an [`ApiError`] (a [`Refusal`] of that status, reason and field).
pub trait ServiceError: std::fmt::Display {
    /// The HTTP status.
    fn status(&self) -> StatusCode;
    /// A stable code (`not_found`, `conflict`, `unavailable`, …), the `reason` of the body.
    fn reason(&self) -> &'static str;
    /// The request field at fault, if one is.
    fn field(&self) -> Option<&'static str> {
        None
    }
}

impl<E: ServiceError> From<E> for ApiError {
    fn from(e: E) -> Self {
        let mut refusal = Refusal::new(e.status(), e.reason(), e.to_string());
        refusal.field = e.field().map(std::borrow::Cow::Borrowed);
        ApiError::Refused(Box::new(refusal))
    }
}

/// `e` in `style` (module docs): the Conductor's style turns pydantic's 422 into a 400 naming
/// the first field at fault and an unreadable body into its reason codes; FastAPI's and
/// OpenAI's keep the error as it is (OpenAI's is rendered by the route).
#[must_use]
pub fn restyle(e: ApiError, style: ErrorStyle) -> ApiError {
    if style != ErrorStyle::Conductor {
        return e;
    }
    match e {
        ApiError::Validation(errors) => {
            let first = errors.errors.first();
            let reason = match first.map(|f| f.kind) {
                Some("missing") => "missing",
                Some("json_invalid") => "invalid_json",
                Some(k) if k.ends_with("_type") => "invalid_type",
                _ => "invalid_value",
            };
            let e = ApiError::Validation(errors);
            let mut refusal = Refusal::new(StatusCode::BAD_REQUEST, reason, e.detail());
            refusal.index = e.field_index();
            refusal.field = e.field_name().map(std::borrow::Cow::Owned);
            ApiError::Refused(Box::new(refusal))
        }
        ApiError::BadRequest(m) => Refusal::new(StatusCode::BAD_REQUEST, "invalid_json", m).into(),
        other => other,
    }
}

/// The body of `req`, its limits checked (module docs), the refusal in the request's style.
///
/// # Errors
/// 413 past `--max-body-bytes` or `--max-body-items`, 408 past `--http-read-timeout`, 400 when
/// the body cannot be read.
pub async fn read<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    let style = ErrorStyle::of(&req);
    let limits = req.extensions().get::<HttpLimits>().copied();
    let max_items = limits.map_or(MAX_BODY_ITEMS, |l| l.max_body_items);
    let bytes = Bytes::from_request(req, state)
        .await
        .map_err(|e: BytesRejection| {
            let max = limits.map_or(0, |l| l.max_body_bytes);
            restyle(unreadable(&e, max), style)
        })?;
    // No item limit (the router's prompts): no scan.
    if max_items < usize::MAX && super::schema::too_many_values(&bytes, max_items) {
        return Err(ApiError::TooManyItems { max: max_items });
    }
    Ok(bytes)
}

/// What a body that could not be read is: 413, 408 or 400.
fn unreadable(e: &BytesRejection, max: usize) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::PayloadTooLarge(if max > 0 {
            format!("the body is larger than {max} bytes (--max-body-bytes)")
        } else {
            e.body_text()
        })
    } else if super::limits::is_read_timeout(e) {
        ApiError::RequestTimeout
    } else {
        ApiError::BadRequest(format!("cannot read the body: {}", e.body_text()))
    }
}

/// A body validated against its declarative table, then read into `T` (module docs).
#[derive(Debug)]
pub struct Json<T>(pub T);

impl<T: super::schema::Body, S: Send + Sync> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let style = ErrorStyle::of(&req);
        let bytes = read(req, state).await?;
        super::schema::parse::<T>(&bytes, usize::MAX)
            .map(Json)
            .map_err(|e| restyle(e, style))
    }
}

/// Any serde type read from a JSON object, the field at fault named (module docs).
#[derive(Debug)]
pub struct Serde<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Serde<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let style = ErrorStyle::of(&req);
        let bytes = read(req, state).await?;
        from_object(&bytes)
            .map(Serde)
            .map_err(|e| restyle(e, style))
    }
}

/// `bytes`, a JSON object, as `T`; pydantic's error (422) naming the field at fault otherwise.
///
/// # Errors
/// Not an object, not JSON, or a field of the wrong type or value.
pub fn from_object<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if !body::is_object(bytes) {
        return Err(ApiError::field(FieldError::new(
            "model_attributes_type",
            vec!["body".into()],
            "Input should be a valid dictionary or object to extract fields from",
            Value::Null,
        )));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, T>(&mut de) {
        Ok(v) => Ok(v),
        Err(e) => {
            // Integral floats where integers are due: the documents' `integer` takes them.
            if let Ok(v) = body::read::<T>(bytes) {
                return Ok(v);
            }
            let mut loc = vec!["body".into()];
            for seg in e.path().iter() {
                match seg {
                    serde_path_to_error::Segment::Seq { index } => loc.push((*index).into()),
                    serde_path_to_error::Segment::Map { key } => loc.push(key.as_str().into()),
                    serde_path_to_error::Segment::Enum { variant } => {
                        loc.push(variant.as_str().into());
                    }
                    serde_path_to_error::Segment::Unknown => {}
                }
            }
            let inner = e.into_inner();
            let kind = if inner.is_syntax() || inner.is_eof() {
                "json_invalid"
            } else if inner.to_string().starts_with("missing field") {
                "missing"
            } else {
                "value_error"
            };
            Err(ApiError::field(
                FieldError::new(kind, loc, inner.to_string(), json!({}))
                    .with_ctx(json!({"error": inner.to_string()})),
            ))
        }
    }
}

/// The body's bytes, limits checked, for a wire format the handler parses itself.
#[derive(Debug)]
pub struct RawBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        read(req, state).await.map(RawBody)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    #[derive(serde::Deserialize, Debug)]
    struct Pin {
        #[allow(dead_code)]
        keys: Vec<u64>,
    }

    #[derive(Debug)]
    struct Gone(String);

    impl std::fmt::Display for Gone {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "no object {}", self.0)
        }
    }

    impl ServiceError for Gone {
        fn status(&self) -> StatusCode {
            StatusCode::NOT_FOUND
        }
        fn reason(&self) -> &'static str {
            "not_found"
        }
    }

    fn request(body: &'static str, style: ErrorStyle, limits: HttpLimits) -> Request {
        let mut r = Request::new(Body::from(body));
        r.extensions_mut().insert(style);
        r.extensions_mut().insert(limits);
        r
    }

    fn limits() -> HttpLimits {
        HttpLimits {
            max_body_items: 4,
            ..HttpLimits::default()
        }
    }

    #[tokio::test]
    async fn one_refusal_in_each_style() {
        let fast = Serde::<Pin>::from_request(
            request(r#"{"keys": [1, "x"]}"#, ErrorStyle::FastApi, limits()),
            &(),
        )
        .await
        .unwrap_err();
        assert_eq!(fast.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(fast.field_name().as_deref(), Some("keys"));
        assert_eq!(fast.field_index(), Some(1));
        let conductor = Serde::<Pin>::from_request(
            request(r#"{"keys": [1, "x"]}"#, ErrorStyle::Conductor, limits()),
            &(),
        )
        .await
        .unwrap_err();
        assert_eq!(conductor.status(), StatusCode::BAD_REQUEST);
        assert_eq!(conductor.field_name().as_deref(), Some("keys"));
        let missing =
            Serde::<Pin>::from_request(request("{}", ErrorStyle::Conductor, limits()), &())
                .await
                .unwrap_err();
        assert_eq!(missing.reason(), "missing");
    }

    #[tokio::test]
    async fn limits_come_before_parsing() {
        let e = RawBody::from_request(request("[1,2,3,4,5,6]", ErrorStyle::FastApi, limits()), &())
            .await
            .unwrap_err();
        assert_eq!(e.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let not_object =
            Serde::<Pin>::from_request(request("[[1]]", ErrorStyle::FastApi, limits()), &())
                .await
                .unwrap_err();
        assert_eq!(not_object.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let ok = Serde::<Pin>::from_request(
            request(r#"{"keys": [1, 2.0]}"#, ErrorStyle::FastApi, limits()),
            &(),
        )
        .await;
        assert!(ok.is_ok());
    }

    #[test]
    fn a_service_error_keeps_its_status_and_reason() {
        let e: ApiError = Gone("k".into()).into();
        assert_eq!(e.status(), StatusCode::NOT_FOUND);
        assert_eq!(e.reason(), "not_found");
        assert_eq!(e.detail(), "no object k");
    }
}
