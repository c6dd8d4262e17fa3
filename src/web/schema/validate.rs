//! A JSON value checked against a body's table ([`BodySpec`]), with pydantic's error shapes:
//! the shape of every field first, list items only once the shape is right, defaults filled
//! in last. Bounded: at most [`MAX_REPORTED_ERRORS`](crate::web::error::MAX_REPORTED_ERRORS)
//! errors are built (the rest counted) and an error echoes only a small input. Takes a parsed
//! value: it neither reads a request nor parses bytes.

use super::table::{BodySpec, FieldType};
use crate::web::error::{FieldError, FieldErrors, LocPart};
use serde_json::{json, Map, Value};
use std::borrow::Cow;

const I64_MIN: i128 = i64::MIN as i128;
const I64_MAX: i128 = i64::MAX as i128;
const U64_MAX: i128 = u64::MAX as i128;

/// `["body", parts…]`: where an error is, as pydantic writes it.
pub(super) fn body_loc(parts: &[LocPart]) -> Vec<LocPart> {
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
/// item, and nothing either for a bad one once [`MAX_REPORTED_ERRORS`](crate::web::error::MAX_REPORTED_ERRORS) are kept.
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
/// items only when the shape is right. At most [`MAX_REPORTED_ERRORS`](crate::web::error::MAX_REPORTED_ERRORS) errors are kept.
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
