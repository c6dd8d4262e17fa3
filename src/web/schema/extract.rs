//! A request's bytes made a typed body: the allocation-free scan that refuses too many JSON
//! values before parsing, JSON parsing with FastAPI's error offsets, validation against the
//! body's table, deserialization, and the [`ValidJson`] extractor that reads the body within
//! the request's [`HttpLimits`]. Owns no rule of what a valid body is (that is `validate`'s).

use super::table::Body;
use super::validate::{body_loc, validate};
use crate::config::defaults::MAX_BODY_ITEMS;
use crate::web::error::{ApiError, FieldError};
use crate::web::limits::HttpLimits;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde_json::{json, Value};

/// Whether `bytes`, read as JSON, holds more than `max` values (list items and object fields),
/// counted as the commas outside strings plus one. No allocation, one pass, stops at `max`:
/// it runs before the body is parsed, so an oversized body costs no parsing at all. No limit
/// (`usize::MAX`, the indexer's) costs no pass.
pub fn too_many_values(bytes: &[u8], max: usize) -> bool {
    if max == usize::MAX {
        return false;
    }
    let (mut in_string, mut escaped, mut commas) = (false, false, 0usize);
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else if b == b'"' {
            in_string = true;
        } else if b == b',' {
            commas += 1;
            if commas >= max {
                return true;
            }
        }
    }
    false
}

/// Parses and validates a JSON body (any `Content-Type`) of at most `max_values` JSON values.
///
/// # Errors
/// 422 for an empty, malformed or invalid body; 413 if it holds too many values.
pub fn parse<T: Body>(bytes: &[u8], max_values: usize) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::field(FieldError::new(
            "missing",
            body_loc(&[]),
            "Field required",
            Value::Null,
        )));
    }
    if too_many_values(bytes, max_values) {
        return Err(ApiError::TooManyItems { max: max_values });
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        let offset = byte_offset(bytes, e.line(), e.column());
        ApiError::field(
            FieldError::new(
                "json_invalid",
                body_loc(&[offset.into()]),
                "JSON decode error",
                json!({}),
            )
            .with_ctx(json!({ "error": e.to_string() })),
        )
    })?;
    let object = validate(&T::SPEC, value).map_err(ApiError::Validation)?;
    serde_json::from_value(Value::Object(object)).map_err(|e| {
        // Validation accepted what deserialization refuses: the table and the type disagree.
        ApiError::Internal(format!("body schema {} is inconsistent: {e}", T::SPEC.name))
    })
}

/// Offset of (1-based line, 1-based column) in `bytes`, as FastAPI reports JSON errors.
pub(super) fn byte_offset(bytes: &[u8], line: usize, column: usize) -> usize {
    let line_start: usize = bytes
        .split(|&b| b == b'\n')
        .take(line.saturating_sub(1))
        .map(|l| l.len() + 1)
        .sum();
    (line_start + column.saturating_sub(1)).min(bytes.len())
}

/// Extractor: the body as `T`, or a FastAPI-style 422 naming the bad fields (413 past
/// `--max-body-bytes` or `--max-body-items`, read from the request's [`HttpLimits`]
/// extension; 408 when the peer is too slow sending it).
#[derive(Debug)]
pub struct ValidJson<T>(pub T);

impl<T: Body, S: Send + Sync> FromRequest<S> for ValidJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let max_values = req
            .extensions()
            .get::<HttpLimits>()
            .map_or(MAX_BODY_ITEMS, |l| l.max_body_items);
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e: BytesRejection| match e.status() {
                StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge(e.body_text()),
                _ if crate::web::limits::is_read_timeout(&e) => ApiError::RequestTimeout,
                _ => ApiError::field(FieldError::new(
                    "missing",
                    body_loc(&[]),
                    format!("Field required ({})", e.body_text()),
                    Value::Null,
                )),
            })?;
        parse::<T>(&bytes, max_values).map(ValidJson)
    }
}
