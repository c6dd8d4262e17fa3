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
//!
//! The parts: `table` (the declarative table: [`FieldType`], [`Field`], [`BodySpec`],
//! [`Body`]), `validate` (a value checked against its table, pydantic's errors built),
//! `extract` (the bytes of a request made a body: the item scan, parsing, [`ValidJson`]) and
//! `json_schema` (the table written as the body's OpenAPI schema). Only `extract` sees a
//! request; nothing here knows a route or a service.

mod extract;
mod json_schema;
mod table;
mod validate;

pub use extract::{parse, too_many_values, ValidJson};
pub use json_schema::{body_schema, type_schema};
pub use table::{Body, BodySpec, Field, FieldDefault, FieldType};
pub use validate::validate;

#[cfg(test)]
mod tests;
