//! Request bodies: one declarative table per body ([`BodySpec`]) drives both the validation
//! that the [`ValidJson`] extractor runs and the body's schema in `/openapi.json`, so the two
//! cannot drift apart.
//!
//! Validation reports errors in pydantic's shape (see [`FieldError`]), with `loc` naming the
//! field and, inside lists, the index. Types are checked strictly: a JSON string is not an
//! integer here even when it holds digits (FastAPI's lax mode would coerce `"5"`; the OpenAPI
//! document says `integer`, and kvplane keeps to it). Unknown fields are ignored, as FastAPI
//! does.
//!
//! The work one body can cause is bounded, whatever it holds:
//! * a body with more than `--max-body-items` JSON values is refused (413) by a scan that
//!   allocates nothing, before it is parsed;
//! * the shape (fields present, lists where lists are due) is checked before any list item,
//!   and items are checked only when the shape is right;
//! * at most [`MAX_REPORTED_ERRORS`](super::error::MAX_REPORTED_ERRORS) errors are built; the rest are only counted;
//! * an error's `input` echoes the offending value only when it is small (pydantic echoes the
//!   whole object for a missing field; kvplane replaces a large one by a short description).
//!
//! This module parses the body as JSON whatever its `Content-Type`: routes that change state
//! also carry [`super::guard`], which refuses non-JSON content types.

use super::error::{ApiError, FieldError, FieldErrors, LocPart};
use super::limits::HttpLimits;
use crate::config::defaults::MAX_BODY_ITEMS;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};
use std::borrow::Cow;

/// The JSON type of a field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldType {
    /// A string.
    Str,
    /// `true` or `false`.
    Bool,
    /// A list of integers in `[-2^63, 2^63 - 1]` (token ids, worker ids).
    IntList,
    /// A list of integers ≥ 1 (token counts).
    CountList,
    /// A list of chunk hashes: integers in `[-2^63, 2^64 - 1]`.
    HashList,
    /// A pair of strings, `[a, b]` (pydantic's `Tuple[str, str]`).
    StrPair,
}

/// The value a missing optional field takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldDefault {
    /// No default: the field is absent (deserializes as `None`).
    Absent,
    /// `null`.
    Null,
    /// `[]`.
    EmptyList,
    /// `false`.
    False,
}

impl FieldDefault {
    fn value(self) -> Option<Value> {
        match self {
            FieldDefault::Absent => None,
            FieldDefault::Null => Some(Value::Null),
            FieldDefault::EmptyList => Some(json!([])),
            FieldDefault::False => Some(Value::Bool(false)),
        }
    }
}

/// One field of a body.
#[derive(Clone, Copy, Debug)]
pub struct Field {
    /// JSON key.
    pub name: &'static str,
    /// Type.
    pub ty: FieldType,
    /// Must be present.
    pub required: bool,
    /// `null` is accepted.
    pub nullable: bool,
    /// Value when absent (optional fields only).
    pub default: FieldDefault,
    /// For the OpenAPI document.
    pub description: &'static str,
}

impl Field {
    /// A required, non-null field.
    pub const fn required(name: &'static str, ty: FieldType, description: &'static str) -> Self {
        Field {
            name,
            ty,
            required: true,
            nullable: false,
            default: FieldDefault::Absent,
            description,
        }
    }

    /// An optional field that may not be `null` and is absent when not given.
    pub const fn maybe(name: &'static str, ty: FieldType, description: &'static str) -> Self {
        Field {
            name,
            ty,
            required: false,
            nullable: false,
            default: FieldDefault::Absent,
            description,
        }
    }

    /// An optional field that may also be `null`, with the value it takes when absent.
    pub const fn optional(
        name: &'static str,
        ty: FieldType,
        default: FieldDefault,
        description: &'static str,
    ) -> Self {
        Field {
            name,
            ty,
            required: false,
            nullable: true,
            default,
            description,
        }
    }
}

/// The schema of one request body.
#[derive(Clone, Copy, Debug)]
pub struct BodySpec {
    /// Schema name in the OpenAPI document (`ClearRequest`, …).
    pub name: &'static str,
    /// Its fields.
    pub fields: &'static [Field],
    /// Exactly one of these fields must be present (empty: no such rule). List only fields
    /// declared with [`Field::maybe`], so that the OpenAPI `oneOf` says the same.
    pub exactly_one_of: &'static [&'static str],
}

/// A request body type with its schema.
pub trait Body: DeserializeOwned {
    /// The schema; [`ValidJson`] checks it before deserializing.
    const SPEC: BodySpec;
}

const I64_MIN: i128 = i64::MIN as i128;
const I64_MAX: i128 = i64::MAX as i128;
const U64_MAX: i128 = u64::MAX as i128;

fn body_loc(parts: &[LocPart]) -> Vec<LocPart> {
    let mut loc = vec![LocPart::from("body")];
    loc.extend_from_slice(parts);
    loc
}

/// The integer a JSON number holds exactly, if it is one.
fn as_integer(v: &Value) -> Option<i128> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from)),
        _ => None,
    }
}

/// What is wrong with `v` as an integer in `[min, max]`, if anything: pydantic's error type,
/// message and context. Cheap when nothing is wrong (no allocation).
fn int_problem(
    v: &Value,
    min: i128,
    max: i128,
) -> Option<(&'static str, Cow<'static, str>, Option<Value>)> {
    let Some(i) = as_integer(v) else {
        return Some(if v.as_f64().is_some() {
            (
                "int_from_float",
                Cow::Borrowed(
                    "Input should be a valid integer, got a number with a fractional part",
                ),
                None,
            )
        } else {
            (
                "int_type",
                Cow::Borrowed("Input should be a valid integer"),
                None,
            )
        });
    };
    if i < min {
        Some((
            "greater_than_equal",
            Cow::Owned(format!("Input should be greater than or equal to {min}")),
            Some(json!({ "ge": min as f64 })),
        ))
    } else if i > max {
        Some((
            "less_than_equal",
            Cow::Owned(format!("Input should be less than or equal to {max}")),
            Some(json!({ "le": max as f64 })),
        ))
    } else {
        None
    }
}

/// How many bytes of echoed input an error may carry before the value is described instead.
const INPUT_ECHO_BYTES: usize = 256;

/// Whether `v`, serialised, takes at most `budget` bytes (roughly); stops as soon as it is
/// over, so a huge value costs no more than a small one.
fn within(v: &Value, budget: &mut usize) -> bool {
    let cost = match v {
        Value::Null | Value::Bool(_) | Value::Number(_) => 8,
        Value::String(s) => s.len() + 2,
        Value::Array(items) => {
            *budget = match budget.checked_sub(2) {
                Some(b) => b,
                None => return false,
            };
            return items.iter().all(|i| within(i, budget));
        }
        Value::Object(map) => return map_within(map, budget),
    };
    match budget.checked_sub(cost) {
        Some(b) => {
            *budget = b;
            true
        }
        None => false,
    }
}

fn map_within(map: &Map<String, Value>, budget: &mut usize) -> bool {
    map.iter()
        .all(|(k, v)| match budget.checked_sub(k.len() + 4) {
            Some(b) => {
                *budget = b;
                within(v, budget)
            }
            None => false,
        })
}

/// A short description of a value too large to echo.
fn describe(v: &Value) -> Value {
    let what = match v {
        Value::Array(items) => format!("a list of {} items", items.len()),
        Value::Object(map) => format!("an object of {} fields", map.len()),
        Value::String(s) => format!("a string of {} bytes", s.len()),
        _ => "a value".to_owned(),
    };
    Value::String(format!("<{what}, too large to echo>"))
}

/// The `input` of an error about `v`: `v` itself when small, else a description of it.
fn echo(v: &Value) -> Value {
    if within(v, &mut INPUT_ECHO_BYTES.clone()) {
        v.clone()
    } else {
        describe(v)
    }
}

/// The `input` of a `missing` error: the object when small (as pydantic), else described.
fn echo_object(map: &Map<String, Value>) -> Value {
    if map_within(map, &mut INPUT_ECHO_BYTES.clone()) {
        Value::Object(map.clone())
    } else {
        Value::String(format!(
            "<an object of {} fields, too large to echo>",
            map.len()
        ))
    }
}

fn field_loc(name: &'static str) -> Vec<LocPart> {
    body_loc(&[name.into()])
}

/// First pass: is `v` the right kind of JSON value for `ty` (a list where a list is due, the
/// right length for a pair)? Looks at no list item except a pair's two.
fn check_shape(ty: FieldType, v: &Value, name: &'static str, errors: &mut FieldErrors) {
    let (kind, msg) = match ty {
        FieldType::Str if !v.is_string() => ("string_type", "Input should be a valid string"),
        FieldType::Bool if !v.is_boolean() => ("bool_type", "Input should be a valid boolean"),
        FieldType::IntList | FieldType::CountList | FieldType::HashList if !v.is_array() => {
            ("list_type", "Input should be a valid list")
        }
        FieldType::StrPair => {
            let Some(items) = v.as_array() else {
                errors.push_with(|| {
                    FieldError::new(
                        "tuple_type",
                        field_loc(name),
                        "Input should be a valid tuple",
                        echo(v),
                    )
                });
                return;
            };
            for i in items.len()..2 {
                errors.push_with(|| {
                    let mut at = field_loc(name);
                    at.push(i.into());
                    FieldError::new("missing", at, "Field required", echo(v))
                });
            }
            if items.len() > 2 {
                errors.push_with(|| {
                    FieldError::new(
                        "too_long",
                        field_loc(name),
                        format!(
                            "Tuple should have at most 2 items after validation, not {}",
                            items.len()
                        ),
                        echo(v),
                    )
                    .with_ctx(json!({
                        "field_type": "Tuple", "max_length": 2, "actual_length": items.len()
                    }))
                });
            }
            return;
        }
        _ => return,
    };
    errors.push_with(|| FieldError::new(kind, field_loc(name), msg, echo(v)));
}

/// Second pass, once the shape is right: every list item. Allocates nothing for a valid
/// item, and nothing either for a bad one once [`MAX_REPORTED_ERRORS`](super::error::MAX_REPORTED_ERRORS) are kept.
fn check_items(ty: FieldType, v: &Value, name: &'static str, errors: &mut FieldErrors) {
    let (min, max) = match ty {
        FieldType::IntList => (I64_MIN, I64_MAX),
        FieldType::CountList => (1, I64_MAX),
        FieldType::HashList => (I64_MIN, U64_MAX),
        FieldType::StrPair => {
            for (i, item) in v.as_array().into_iter().flatten().take(2).enumerate() {
                if !item.is_string() {
                    errors.push_with(|| {
                        let mut at = field_loc(name);
                        at.push(i.into());
                        FieldError::new(
                            "string_type",
                            at,
                            "Input should be a valid string",
                            echo(item),
                        )
                    });
                }
            }
            return;
        }
        FieldType::Str | FieldType::Bool => return,
    };
    // The hot path of big bodies (a /lookup of 100k tokens).
    for (i, item) in v.as_array().into_iter().flatten().enumerate() {
        if errors.full() {
            if int_problem(item, min, max).is_some() {
                errors.omitted += 1;
            }
            continue;
        }
        if let Some((kind, msg, ctx)) = int_problem(item, min, max) {
            let mut at = field_loc(name);
            at.push(i.into());
            let mut e = FieldError::new(kind, at, msg, echo(item));
            e.ctx = ctx;
            errors.push(e);
        }
    }
}

/// Checks `value` against `spec` and fills in defaults. The shape is checked first; list
/// items only when the shape is right. At most [`MAX_REPORTED_ERRORS`](super::error::MAX_REPORTED_ERRORS) errors are kept.
///
/// # Errors
/// The pydantic-style errors, in field order within each pass.
pub fn validate(spec: &BodySpec, value: Value) -> Result<Map<String, Value>, FieldErrors> {
    let mut object = match value {
        Value::Object(map) => map,
        other => {
            return Err(vec![FieldError::new(
                "model_attributes_type",
                body_loc(&[]),
                "Input should be a valid dictionary or object to extract fields from",
                echo(&other),
            )]
            .into())
        }
    };
    let mut errors = FieldErrors::default();
    for field in spec.fields {
        match object.get(field.name) {
            None if field.required => errors.push_with(|| {
                FieldError::new(
                    "missing",
                    field_loc(field.name),
                    "Field required",
                    echo_object(&object),
                )
            }),
            None => {}
            Some(Value::Null) if field.nullable => {}
            Some(v) => check_shape(field.ty, v, field.name, &mut errors),
        }
    }
    if !spec.exactly_one_of.is_empty() {
        let present = spec
            .exactly_one_of
            .iter()
            .filter(|k| object.get(**k).is_some_and(|v| !v.is_null()))
            .count();
        let names = spec.exactly_one_of.join("` or `");
        match present {
            1 => {}
            0 => errors.push_with(|| {
                FieldError::new(
                    "missing",
                    body_loc(&[spec.exactly_one_of[0].into()]),
                    format!("Field required (give `{names}`)"),
                    echo_object(&object),
                )
            }),
            _ => errors.push_with(|| {
                FieldError::new(
                    "value_error",
                    body_loc(&[]),
                    format!("Value error, give `{names}`, not several"),
                    echo_object(&object),
                )
            }),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    for field in spec.fields {
        if let Some(v) = object.get(field.name).filter(|v| !v.is_null()) {
            check_items(field.ty, v, field.name, &mut errors);
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    for field in spec.fields {
        if !object.contains_key(field.name) {
            if let Some(v) = field.default.value() {
                object.insert(field.name.to_owned(), v);
            }
        }
    }
    Ok(object)
}

/// Whether `bytes`, read as JSON, holds more than `max` values (list items and object fields),
/// counted as the commas outside strings plus one. No allocation, one pass, stops at `max`:
/// it runs before the body is parsed, so an oversized body costs no parsing at all.
pub fn too_many_values(bytes: &[u8], max: usize) -> bool {
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
fn byte_offset(bytes: &[u8], line: usize, column: usize) -> usize {
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
                _ if super::limits::is_read_timeout(&e) => ApiError::RequestTimeout,
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

/// The JSON Schema (OpenAPI 3.0 dialect) of one field type.
pub fn type_schema(ty: FieldType) -> Value {
    let int64 = json!({ "type": "integer", "format": "int64" });
    match ty {
        FieldType::Str => json!({ "type": "string" }),
        FieldType::Bool => json!({ "type": "boolean" }),
        FieldType::IntList => json!({ "type": "array", "items": int64 }),
        FieldType::CountList => json!({
            "type": "array",
            "items": { "type": "integer", "format": "int64", "minimum": 1 }
        }),
        FieldType::HashList => json!({
            "type": "array",
            "items": {
                "type": "integer",
                "minimum": i64::MIN,
                "maximum": u64::MAX,
                "description": "A chunk hash: signed 64-bit (Python hash) or unsigned 64-bit (digest)."
            }
        }),
        FieldType::StrPair => json!({
            "type": "array",
            "items": { "type": "string" },
            "minItems": 2,
            "maxItems": 2
        }),
    }
}

/// The JSON Schema (OpenAPI 3.0 dialect) of a body.
pub fn body_schema(spec: &BodySpec) -> Value {
    let mut properties = Map::new();
    for f in spec.fields {
        let mut schema = type_schema(f.ty);
        if let Value::Object(s) = &mut schema {
            if f.nullable {
                s.insert("nullable".into(), true.into());
            }
            if let Some(d) = f.default.value() {
                s.insert("default".into(), d);
            }
            if !f.description.is_empty() {
                s.insert("description".into(), f.description.into());
            }
        }
        properties.insert(f.name.to_owned(), schema);
    }
    let required: Vec<&str> = spec
        .fields
        .iter()
        .filter(|f| f.required)
        .map(|f| f.name)
        .collect();
    let mut schema = json!({ "type": "object", "title": spec.name, "properties": properties });
    if let Value::Object(s) = &mut schema {
        if !required.is_empty() {
            s.insert("required".into(), json!(required));
        }
        if !spec.exactly_one_of.is_empty() {
            let one_of: Vec<Value> = spec
                .exactly_one_of
                .iter()
                .map(|k| json!({ "required": [k] }))
                .collect();
            s.insert("oneOf".into(), one_of.into());
        }
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::super::error::MAX_REPORTED_ERRORS;
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Demo {
        name: String,
        tokens: Option<Vec<i64>>,
        pair: (String, String),
        flag: Option<bool>,
        hashes: Option<Vec<i128>>,
    }

    impl Body for Demo {
        const SPEC: BodySpec = BodySpec {
            name: "Demo",
            fields: &[
                Field::required("name", FieldType::Str, ""),
                Field::optional("tokens", FieldType::IntList, FieldDefault::EmptyList, ""),
                Field::required("pair", FieldType::StrPair, ""),
                Field::optional("flag", FieldType::Bool, FieldDefault::False, ""),
                Field::optional("hashes", FieldType::HashList, FieldDefault::Absent, ""),
            ],
            exactly_one_of: &[],
        };
    }

    fn errors(body: &str) -> Value {
        match parse::<Demo>(body.as_bytes(), MAX_BODY_ITEMS) {
            Err(ApiError::Validation(e)) => serde_json::to_value(e.errors).expect("serializes"),
            other => panic!("expected a validation error for {body}, got {other:?}"),
        }
    }

    #[test]
    fn defaults_fill_in_and_null_is_kept() {
        let d = parse::<Demo>(
            br#"{"name":"a","pair":["x","y"],"extra":1}"#,
            MAX_BODY_ITEMS,
        )
        .expect("valid");
        assert_eq!(d.tokens, Some(vec![]));
        assert_eq!(d.flag, Some(false));
        assert_eq!(d.hashes, None);
        let d = parse::<Demo>(
            br#"{"name":"a","pair":["x","y"],"tokens":null,"hashes":[-1,18446744073709551615]}"#,
            MAX_BODY_ITEMS,
        )
        .expect("valid");
        assert_eq!(d.tokens, None);
        assert_eq!(d.hashes.map(|h| h.len()), Some(2));
    }

    #[test]
    fn errors_name_the_field_like_fastapi() {
        // The exact shapes a real LMCache 0.5.6 controller (FastAPI, pydantic 2) returns.
        assert_eq!(
            errors(""),
            json!([{"type":"missing","loc":["body"],"msg":"Field required","input":null}])
        );
        assert_eq!(
            errors("[1]"),
            json!([{"type":"model_attributes_type","loc":["body"],
                    "msg":"Input should be a valid dictionary or object to extract fields from",
                    "input":[1]}])
        );
        // FastAPI reports where the bad value starts, serde_json where it noticed: both are
        // a position in the body.
        let e = errors("\n not json");
        assert_eq!(e[0]["type"], "json_invalid");
        assert_eq!(e[0]["loc"][0], "body");
        assert!(
            (2..=4).contains(&e[0]["loc"][1].as_u64().expect("offset")),
            "{e}"
        );
        // Shape errors first; list items are looked at only once the shape is right.
        assert_eq!(
            errors(r#"{"name":5,"pair":["a"],"tokens":[1,"x",2.5],"flag":"maybe"}"#),
            json!([
                {"type":"string_type","loc":["body","name"],"msg":"Input should be a valid string","input":5},
                {"type":"missing","loc":["body","pair",1],"msg":"Field required","input":["a"]},
                {"type":"bool_type","loc":["body","flag"],"msg":"Input should be a valid boolean","input":"maybe"}
            ])
        );
        assert_eq!(
            errors(r#"{"name":"n","pair":["a",3],"tokens":[1,"x",2.5],"flag":true}"#),
            json!([
                {"type":"int_type","loc":["body","tokens",1],"msg":"Input should be a valid integer","input":"x"},
                {"type":"int_from_float","loc":["body","tokens",2],
                 "msg":"Input should be a valid integer, got a number with a fractional part","input":2.5},
                {"type":"string_type","loc":["body","pair",1],"msg":"Input should be a valid string","input":3}
            ])
        );
        let e = errors(r#"{"name":"a","pair":["a","b","c"],"tokens":[9223372036854775808]}"#);
        assert_eq!(e[0]["type"], "too_long");
        let e = errors(r#"{"name":"a","pair":["a","b"],"tokens":[9223372036854775808]}"#);
        assert_eq!(e[0]["type"], "less_than_equal");
        assert_eq!(e[0]["loc"], json!(["body", "tokens", 0]));
        let e = errors(r#"{"pair":["a","b"],"hashes":[18446744073709551616]}"#);
        assert_eq!(e[0]["loc"], json!(["body", "name"]));
        assert_eq!(
            e[0]["input"],
            json!({"pair":["a","b"],"hashes":[18446744073709551616.0]})
        );
        assert_eq!(
            e.as_array().map(Vec::len),
            Some(1),
            "items wait for the shape"
        );
    }

    #[test]
    fn a_body_of_many_bad_items_makes_a_small_answer() {
        // 200k bad tokens and a missing field: the answer names the missing field once,
        // without echoing the 200k-item object, and checks no item.
        let tokens = vec!["\"a\""; 200_000].join(",");
        let body = format!(r#"{{"pair":["a","b"],"tokens":[{tokens}]}}"#);
        let Err(ApiError::Validation(e)) = parse::<Demo>(body.as_bytes(), MAX_BODY_ITEMS) else {
            panic!("expected a validation error");
        };
        assert_eq!((e.errors.len(), e.omitted), (1, 0));
        assert_eq!(
            e.errors[0].input,
            json!("<an object of 2 fields, too large to echo>")
        );
        // With the shape right, the first MAX_REPORTED_ERRORS items are reported, the rest
        // counted.
        let body = format!(r#"{{"name":"n","pair":["a","b"],"tokens":[{tokens}]}}"#);
        let Err(err) = parse::<Demo>(body.as_bytes(), MAX_BODY_ITEMS) else {
            panic!("expected a validation error");
        };
        let ApiError::Validation(e) = &err else {
            panic!("expected a validation error, got {err:?}");
        };
        assert_eq!(e.errors.len(), MAX_REPORTED_ERRORS);
        assert_eq!(e.omitted, 200_000 - MAX_REPORTED_ERRORS);
        assert_eq!(e.errors[19].loc, body_loc(&["tokens".into(), 19.into()]));
        let rendered = serde_json::to_vec(&e.errors).expect("serializes");
        assert!(rendered.len() < 4096, "{} bytes", rendered.len());
    }

    #[test]
    fn too_many_values_is_refused_before_parsing() {
        assert!(!too_many_values(br#"{"a":[1,2,3]}"#, 4));
        assert!(too_many_values(br#"{"a":[1,2,3],"b":1}"#, 3));
        // Commas inside strings, escaped quotes included, are not separators.
        assert!(!too_many_values(br#"{"a":"x,\",,,,y"}"#, 2));
        let body = format!(
            r#"{{"name":"n","pair":["a","b"],"tokens":[{}]}}"#,
            vec!["1"; 50].join(",")
        );
        assert!(matches!(
            parse::<Demo>(body.as_bytes(), 40),
            Err(ApiError::TooManyItems { max: 40 })
        ));
        assert!(parse::<Demo>(body.as_bytes(), 60).is_ok());
    }

    #[test]
    fn exactly_one_of() {
        const SPEC: BodySpec = BodySpec {
            name: "OneOf",
            fields: &[
                Field::maybe("a", FieldType::IntList, ""),
                Field::maybe("b", FieldType::IntList, ""),
            ],
            exactly_one_of: &["a", "b"],
        };
        assert!(validate(&SPEC, json!({"a": [1]})).is_ok());
        let null = validate(&SPEC, json!({"a": null, "b": [1]})).expect_err("null");
        assert_eq!(null.errors[0].kind, "list_type");
        let none = validate(&SPEC, json!({})).expect_err("neither");
        assert_eq!(none.errors[0].kind, "missing");
        let both = validate(&SPEC, json!({"a": [], "b": []})).expect_err("both");
        assert_eq!(both.errors[0].kind, "value_error");
        let schema = body_schema(&SPEC);
        assert_eq!(schema["oneOf"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn json_error_offsets() {
        assert_eq!(byte_offset(b"{\n  x", 2, 3), 4);
        assert_eq!(byte_offset(b"abc", 1, 1), 0);
    }
}
