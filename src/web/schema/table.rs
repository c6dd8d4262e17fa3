//! The declarative table of a request body: each field's JSON type, whether it is required
//! or nullable, its default and its description, and the body's `exactly_one_of` rule. Plain
//! data read by `validate` and `json_schema`; it checks nothing and writes nothing itself.

use serde::de::DeserializeOwned;
use serde_json::{json, Value};

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
    /// The default as a JSON value (`None`: the field stays absent).
    pub(super) fn value(self) -> Option<Value> {
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
    /// The schema; [`ValidJson`](super::ValidJson) checks it before deserializing.
    const SPEC: BodySpec;
}
