//! Request bodies: one declarative table per body ([`BodySpec`]) drives both the validation
//! that the [`ValidJson`] extractor runs and the body's schema in `/openapi.json`, so the two
//! cannot drift apart.
//!
//! Validation reports every error at once, in pydantic's shape (see [`FieldError`]), with
//! `loc` naming the field and, inside lists, the index. Types are checked strictly: a JSON
//! string is not an integer here even when it holds digits (FastAPI's lax mode would coerce
//! `"5"`; the OpenAPI document says `integer`, and kvplane keeps to it). Unknown fields are
//! ignored, as FastAPI does. The body is parsed as JSON whatever the `Content-Type`.

use super::error::{ApiError, FieldError, LocPart};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};

/// The JSON type of a field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
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
pub enum Default {
    /// No default: the field is absent (deserializes as `None`).
    Absent,
    /// `null`.
    Null,
    /// `[]`.
    EmptyList,
    /// `false`.
    False,
}

impl Default {
    fn value(self) -> Option<Value> {
        match self {
            Default::Absent => None,
            Default::Null => Some(Value::Null),
            Default::EmptyList => Some(json!([])),
            Default::False => Some(Value::Bool(false)),
        }
    }
}

/// One field of a body.
#[derive(Clone, Copy, Debug)]
pub struct Field {
    /// JSON key.
    pub name: &'static str,
    /// Type.
    pub ty: Ty,
    /// Must be present.
    pub required: bool,
    /// `null` is accepted.
    pub nullable: bool,
    /// Value when absent (optional fields only).
    pub default: Default,
    /// For the OpenAPI document.
    pub description: &'static str,
}

impl Field {
    /// A required, non-null field.
    pub const fn required(name: &'static str, ty: Ty, description: &'static str) -> Self {
        Field {
            name,
            ty,
            required: true,
            nullable: false,
            default: Default::Absent,
            description,
        }
    }

    /// An optional field that may not be `null` and is absent when not given.
    pub const fn maybe(name: &'static str, ty: Ty, description: &'static str) -> Self {
        Field {
            name,
            ty,
            required: false,
            nullable: false,
            default: Default::Absent,
            description,
        }
    }

    /// An optional field that may also be `null`, with the value it takes when absent.
    pub const fn optional(
        name: &'static str,
        ty: Ty,
        default: Default,
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
fn int_problem(v: &Value, min: i128, max: i128) -> Option<(&'static str, String, Option<Value>)> {
    let Some(i) = as_integer(v) else {
        return Some(if v.as_f64().is_some() {
            (
                "int_from_float",
                "Input should be a valid integer, got a number with a fractional part".into(),
                None,
            )
        } else {
            ("int_type", "Input should be a valid integer".into(), None)
        });
    };
    if i < min {
        Some((
            "greater_than_equal",
            format!("Input should be greater than or equal to {min}"),
            Some(json!({ "ge": min as f64 })),
        ))
    } else if i > max {
        Some((
            "less_than_equal",
            format!("Input should be less than or equal to {max}"),
            Some(json!({ "le": max as f64 })),
        ))
    } else {
        None
    }
}

fn push_problem(
    errors: &mut Vec<FieldError>,
    (kind, msg, ctx): (&'static str, String, Option<Value>),
    loc: Vec<LocPart>,
    v: &Value,
) {
    let mut e = FieldError::new(kind, loc, msg, v.clone());
    e.ctx = ctx;
    errors.push(e);
}

fn check_list(v: &Value, loc: Vec<LocPart>, min: i128, max: i128, errors: &mut Vec<FieldError>) {
    let Some(items) = v.as_array() else {
        errors.push(FieldError::new(
            "list_type",
            loc,
            "Input should be a valid list",
            v.clone(),
        ));
        return;
    };
    // The hot path of big bodies (a /lookup of 100k tokens): no allocation per valid item.
    for (i, item) in items.iter().enumerate() {
        if let Some(problem) = int_problem(item, min, max) {
            let mut at = loc.clone();
            at.push(i.into());
            push_problem(errors, problem, at, item);
        }
    }
}

fn check(ty: Ty, v: &Value, loc: Vec<LocPart>, errors: &mut Vec<FieldError>) {
    match ty {
        Ty::Str => {
            if !v.is_string() {
                errors.push(FieldError::new(
                    "string_type",
                    loc,
                    "Input should be a valid string",
                    v.clone(),
                ));
            }
        }
        Ty::Bool => {
            if !v.is_boolean() {
                errors.push(FieldError::new(
                    "bool_type",
                    loc,
                    "Input should be a valid boolean",
                    v.clone(),
                ));
            }
        }
        Ty::IntList => check_list(v, loc, I64_MIN, I64_MAX, errors),
        Ty::CountList => check_list(v, loc, 1, I64_MAX, errors),
        Ty::HashList => check_list(v, loc, I64_MIN, U64_MAX, errors),
        Ty::StrPair => {
            let Some(items) = v.as_array() else {
                errors.push(FieldError::new(
                    "tuple_type",
                    loc,
                    "Input should be a valid tuple",
                    v.clone(),
                ));
                return;
            };
            for i in 0..2 {
                let mut at = loc.clone();
                at.push(i.into());
                match items.get(i) {
                    Some(item) => check(Ty::Str, item, at, errors),
                    None => {
                        errors.push(FieldError::new("missing", at, "Field required", v.clone()))
                    }
                }
            }
            if items.len() > 2 {
                errors.push(
                    FieldError::new(
                        "too_long",
                        loc,
                        format!(
                            "Tuple should have at most 2 items after validation, not {}",
                            items.len()
                        ),
                        v.clone(),
                    )
                    .with_ctx(json!({
                        "field_type": "Tuple", "max_length": 2, "actual_length": items.len()
                    })),
                );
            }
        }
    }
}

/// Checks `value` against `spec` and fills in defaults; every error is reported.
///
/// # Errors
/// The pydantic-style errors, in field order.
pub fn validate(spec: &BodySpec, value: Value) -> Result<Map<String, Value>, Vec<FieldError>> {
    let mut object = match value {
        Value::Object(map) => map,
        other => {
            return Err(vec![FieldError::new(
                "model_attributes_type",
                body_loc(&[]),
                "Input should be a valid dictionary or object to extract fields from",
                other,
            )])
        }
    };
    let mut errors = Vec::new();
    for field in spec.fields {
        match object.get(field.name) {
            None if field.required => errors.push(FieldError::new(
                "missing",
                body_loc(&[field.name.into()]),
                "Field required",
                Value::Object(object.clone()),
            )),
            None => {}
            Some(Value::Null) if field.nullable => {}
            Some(v) => check(field.ty, v, body_loc(&[field.name.into()]), &mut errors),
        }
    }
    if !spec.exactly_one_of.is_empty() {
        let present: Vec<&str> = spec
            .exactly_one_of
            .iter()
            .copied()
            .filter(|k| object.get(*k).is_some_and(|v| !v.is_null()))
            .collect();
        let names = spec.exactly_one_of.join("` or `");
        match present.len() {
            1 => {}
            0 => errors.push(FieldError::new(
                "missing",
                body_loc(&[spec.exactly_one_of[0].into()]),
                format!("Field required (give `{names}`)"),
                Value::Object(object.clone()),
            )),
            _ => errors.push(FieldError::new(
                "value_error",
                body_loc(&[]),
                format!("Value error, give `{names}`, not several"),
                Value::Object(object.clone()),
            )),
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

/// Parses and validates a JSON body (any `Content-Type`).
///
/// # Errors
/// 422 for an empty, malformed or invalid body; 413 if it is too large.
pub fn parse<T: Body>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::field(FieldError::new(
            "missing",
            body_loc(&[]),
            "Field required",
            Value::Null,
        )));
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

/// Extractor: the body as `T`, or a FastAPI-style 422 naming every bad field.
#[derive(Debug)]
pub struct ValidJson<T>(pub T);

impl<T: Body, S: Send + Sync> FromRequest<S> for ValidJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e: BytesRejection| match e.status() {
                StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge(e.body_text()),
                _ => ApiError::field(FieldError::new(
                    "missing",
                    body_loc(&[]),
                    format!("Field required ({})", e.body_text()),
                    Value::Null,
                )),
            })?;
        parse::<T>(&bytes).map(ValidJson)
    }
}

/// The JSON Schema (OpenAPI 3.0 dialect) of one field type.
pub fn type_schema(ty: Ty) -> Value {
    let int64 = json!({ "type": "integer", "format": "int64" });
    match ty {
        Ty::Str => json!({ "type": "string" }),
        Ty::Bool => json!({ "type": "boolean" }),
        Ty::IntList => json!({ "type": "array", "items": int64 }),
        Ty::CountList => json!({
            "type": "array",
            "items": { "type": "integer", "format": "int64", "minimum": 1 }
        }),
        Ty::HashList => json!({
            "type": "array",
            "items": {
                "type": "integer",
                "minimum": i64::MIN,
                "maximum": u64::MAX,
                "description": "A chunk hash: signed 64-bit (Python hash) or unsigned 64-bit (digest)."
            }
        }),
        Ty::StrPair => json!({
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
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Demo {
        name: String,
        tokens: Option<Vec<i64>>,
        pair: (String, String),
        flag: Option<bool>,
        hashes: Option<Vec<crate::protocol::ChunkHash>>,
    }

    impl Body for Demo {
        const SPEC: BodySpec = BodySpec {
            name: "Demo",
            fields: &[
                Field::required("name", Ty::Str, ""),
                Field::optional("tokens", Ty::IntList, Default::EmptyList, ""),
                Field::required("pair", Ty::StrPair, ""),
                Field::optional("flag", Ty::Bool, Default::False, ""),
                Field::optional("hashes", Ty::HashList, Default::Absent, ""),
            ],
            exactly_one_of: &[],
        };
    }

    fn errors(body: &str) -> Value {
        match parse::<Demo>(body.as_bytes()) {
            Err(ApiError::Validation(e)) => serde_json::to_value(e).expect("serializes"),
            other => panic!("expected a validation error for {body}, got {other:?}"),
        }
    }

    #[test]
    fn defaults_fill_in_and_null_is_kept() {
        let d = parse::<Demo>(br#"{"name":"a","pair":["x","y"],"extra":1}"#).expect("valid");
        assert_eq!(d.tokens, Some(vec![]));
        assert_eq!(d.flag, Some(false));
        assert_eq!(d.hashes, None);
        let d = parse::<Demo>(
            br#"{"name":"a","pair":["x","y"],"tokens":null,"hashes":[-1,18446744073709551615]}"#,
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
        assert_eq!(
            errors(r#"{"name":5,"pair":["a"],"tokens":[1,"x",2.5],"flag":"maybe"}"#),
            json!([
                {"type":"string_type","loc":["body","name"],"msg":"Input should be a valid string","input":5},
                {"type":"int_type","loc":["body","tokens",1],"msg":"Input should be a valid integer","input":"x"},
                {"type":"int_from_float","loc":["body","tokens",2],
                 "msg":"Input should be a valid integer, got a number with a fractional part","input":2.5},
                {"type":"missing","loc":["body","pair",1],"msg":"Field required","input":["a"]},
                {"type":"bool_type","loc":["body","flag"],"msg":"Input should be a valid boolean","input":"maybe"}
            ])
        );
        let e = errors(r#"{"name":"a","pair":["a","b","c"],"tokens":[9223372036854775808]}"#);
        assert_eq!(e[0]["type"], "less_than_equal");
        assert_eq!(e[0]["loc"], json!(["body", "tokens", 0]));
        assert_eq!(e[1]["type"], "too_long");
        let e = errors(r#"{"pair":["a","b"],"hashes":[18446744073709551616]}"#);
        assert_eq!(e[0]["loc"], json!(["body", "name"]));
        assert_eq!(
            e[0]["input"],
            json!({"pair":["a","b"],"hashes":[18446744073709551616.0]})
        );
        assert_eq!(e[1]["loc"], json!(["body", "hashes", 0]));
    }

    #[test]
    fn exactly_one_of() {
        const SPEC: BodySpec = BodySpec {
            name: "OneOf",
            fields: &[
                Field::maybe("a", Ty::IntList, ""),
                Field::maybe("b", Ty::IntList, ""),
            ],
            exactly_one_of: &["a", "b"],
        };
        assert!(validate(&SPEC, json!({"a": [1]})).is_ok());
        let null = validate(&SPEC, json!({"a": null, "b": [1]})).expect_err("null");
        assert_eq!(null[0].kind, "list_type");
        let none = validate(&SPEC, json!({})).expect_err("neither");
        assert_eq!(none[0].kind, "missing");
        let both = validate(&SPEC, json!({"a": [], "b": []})).expect_err("both");
        assert_eq!(both[0].kind, "value_error");
        let schema = body_schema(&SPEC);
        assert_eq!(schema["oneOf"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn json_error_offsets() {
        assert_eq!(byte_offset(b"{\n  x", 2, 3), 4);
        assert_eq!(byte_offset(b"abc", 1, 1), 0);
    }
}
