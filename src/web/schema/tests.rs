//! Tests of request bodies end to end: defaults, pydantic's error shapes, the bounded answer
//! to a body of many bad items, the value count refused before parsing, `exactly_one_of` in
//! validation and in the schema, and JSON error offsets.

use super::extract::byte_offset;
use super::validate::body_loc;
use super::*;
use crate::config::defaults::MAX_BODY_ITEMS;
use crate::web::error::{ApiError, MAX_REPORTED_ERRORS};
use serde::Deserialize;
use serde_json::{json, Value};

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
