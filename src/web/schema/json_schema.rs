//! A body's table ([`BodySpec`]) written as its JSON Schema (the OpenAPI 3.0 dialect), so the
//! document says what validation checks. Writes values only: validates nothing.

use super::table::{BodySpec, FieldType};
use serde_json::{json, Map, Value};

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
