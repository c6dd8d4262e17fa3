//! `GET /openapi.json`: the node's HTTP routes, their bodies and who may call them, from the
//! one document builder of [`crate::web::openapi`].

use crate::web::access::{Access, Auth};
use crate::web::openapi::{self, Operation};
use axum::http::Method as M;
use serde_json::{json, Value};

fn i64_schema() -> Value {
    json!({"type": "integer", "minimum": i64::MIN, "maximum": i64::MAX})
}

/// A salt as LMCache writes it into a key (`@cache_salt%S`): the node refuses others.
fn salt_schema() -> Value {
    json!({"type": "string", "maxLength": 128, "pattern": r"^[^@/\\\x00]*$"})
}

/// Every route the node's HTTP listener serves.
pub(crate) fn operations() -> Vec<Operation> {
    use Access::{Open, Peer, Read, Write};
    let key = json!({"oneOf": [
        {"type": "string", "description": "the key as `lm://` names it"},
        {"type": "object", "required": ["chunk_hash_hex", "model_name", "kv_rank"],
         "properties": {"chunk_hash_hex": {"type": "string"}, "model_name": {"type": "string"},
                        "kv_rank": i64_schema(), "object_group_id": i64_schema(),
                        "cache_salt": {"type": "string"}}}]});
    let tier = json!({"type": "string", "enum": ["l1", "l2", "all"]});
    vec![
        Operation::new(M::GET, "/healthz", Open, "Liveness"),
        Operation::new(
            M::GET,
            "/readyz",
            Open,
            "Readiness: the listeners are bound",
        ),
        Operation::new(M::GET, "/openapi.json", Open, "This document"),
        Operation::new(M::GET, "/metrics", Read, "Prometheus metrics"),
        Operation::new(
            M::GET,
            "/cache/objects",
            Read,
            "Keys held, by tier, one page",
        )
        .query(
            "tier",
            json!({"type": "string", "enum": ["l1", "l2"]}),
            false,
        )
        .query(
            "page_size",
            json!({"type": "integer", "minimum": 1, "maximum": u64::MAX,
                "description": "at most 1000 keys are listed whatever is asked, as LMCache's MP server"}),
            false,
        )
        .query("page_token", json!({"type": "string"}), false)
        .answers(&[
            (200, "A page of keys"),
            (400, "A query that does not parse"),
            (422, "A tier other than l1 or l2, or a page_size of 0"),
        ]),
        Operation::new(
            M::DELETE,
            "/cache/objects",
            Peer,
            "Delete objects (a coordinator's eviction)",
        )
        .answers(&[
            (200, "Deleted"),
            (503, "The tier includes l2 and the node has no L2"),
        ])
        .body(
            json!({"type": "object", "required": ["keys"], "properties": {
                "keys": {"type": "array", "items": key},
                "tier": tier, "force": {"type": "boolean"},
                "adapter": {"description": "0.5.6's L2 adapter name: accepted and ignored (a node has one L2)"}}}),
        ),
        Operation::new(M::GET, "/pins", Read, "Pinned objects"),
        Operation::new(
            M::POST,
            "/unpin",
            Write,
            "Unpin what a controller's /pin pinned",
        )
        .optional_body(
            json!({"type": "object", "additionalProperties": false, "properties": {
                "location": {"type": ["string", "null"],
                    "enum": ["LocalCPUBackend", "LocalDiskBackend", null]},
                "tokens": {"type": ["array", "null"], "items": i64_schema()}}}),
        ),
        Operation::new(
            M::POST,
            "/cache/prefetches",
            Peer,
            "Warm prefetch (a coordinator's)",
        )
        .answers(&[
            (202, "Submitted, or a noop (no complete chunk)"),
            (503, "1,024 prefetches are running"),
        ])
        .body(
            json!({"type": "object", "required": ["model_name", "world_size", "token_ids"],
                "properties": {"model_name": {"type": "string", "pattern": "^[^@]*$"},
                    "world_size": {"type": "integer", "minimum": 1, "maximum": 255},
                    "token_ids": {"type": "array", "items": {"type": "integer", "minimum": 0,
                        "maximum": u32::MAX}},
                    "cache_salt": salt_schema(),
                    "source_tier": {"type": ["string", "null"], "enum": ["l2", null]},
                    "target_tier": {"type": ["string", "null"], "enum": ["l1", null]}}}),
        ),
        Operation::new(
            M::GET,
            "/cache/prefetches/{request}",
            Read,
            "A prefetch's progress",
        ),
        Operation::new(M::GET, "/", Read, "The node's dashboard page"),
        Operation::new(M::GET, "/static/{path}", Read, "Dashboard assets"),
        Operation::new(M::GET, "/api/dashboard", Read, "The dashboard's feed"),
    ]
}

/// The document, with the token marked where `auth` requires it.
pub(crate) fn document(auth: &Auth) -> Value {
    openapi::document("kvplane node", &operations(), auth)
}
