//! `/openapi.json` for the indexer: every route, its body and its answers.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

/// A port, 0 to 65535 in 1 to 5 digits (`api::port` reads it alike).
pub(crate) const PORT: &str =
    "(?:[0-9]{1,4}|[0-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])";

fn error() -> Value {
    json!({"type": "object", "required": ["error", "reason"], "properties": {
        "error": {"type": "string"}, "reason": {"type": "string"},
        "field": {"type": "string"}, "index": {"type": "integer"}}})
}

fn query_body(blocks: (&str, Value)) -> Value {
    let mut props = json!({
        "model": {"type": "string"}, "lora_name": {"type": ["string", "null"]},
        "lora_id": {"type": ["integer", "null"], "deprecated": true},
        "tenant_id": {"type": ["string", "null"], "default": "default"},
        "instance_id": {"type": ["string", "null"]}, "block_size": {"type": "integer", "minimum": 1, "maximum": 4294967295u64},
        "cache_salt": {"type": ["string", "null"]}});
    props[blocks.0] = blocks.1;
    json!({"type": "object", "required": ["model", "block_size", blocks.0], "properties": props,
        // lora_id is the deprecated form of lora_name: never both.
        "not": {"required": ["lora_name", "lora_id"], "properties": {
            "lora_name": {"type": "string"}, "lora_id": {"type": "integer"}}}})
}

fn answer() -> Value {
    json!({"type": "object", "description": "{tenant: {instance: match}}",
      "additionalProperties": {"type": "object", "additionalProperties": {
        "type": "object", "properties": {
          "longest_matched": {"type": "integer"}, "GPU": {"type": "integer"},
          "CPU": {"type": "integer"}, "DISK": {"type": "integer"},
          "DP": {"type": "object", "additionalProperties": {"type": "integer"}}}}}})
}

fn op(summary: &str, body: Option<Value>, ok: Value, errors: &[&str]) -> Value {
    // Prometheus' text format is the one answer that is not JSON.
    let media = if ok["type"] == "string" {
        "text/plain"
    } else {
        "application/json"
    };
    let mut responses = json!({"200": {"description": "OK",
        "content": {media: {"schema": ok}}}});
    for code in errors {
        responses[*code] = json!({"description": "error",
            "content": {"application/json": {"schema": error()}}});
    }
    let mut o = json!({"summary": summary, "responses": responses});
    if let Some(b) = body {
        for (code, what) in [
            ("403", "Cross-origin browser request (CSRF guard)"),
            ("415", "A body not declared as JSON (CSRF guard)"),
        ] {
            o["responses"][code] = json!({"description": what,
                "content": {"application/json": {"schema": error()}}});
        }
        o["requestBody"] = json!({"required": true,
            "content": {"application/json": {"schema": b}}});
    }
    o
}

/// The document.
pub(crate) fn openapi_doc() -> Value {
    let id = json!({"type": "string", "minLength": 1, "maxLength": 256});
    let register = json!({"type": "object",
        "required": ["endpoint", "type", "modelname", "instance_id", "block_size", "dp_rank"],
        "properties": {
          "endpoint": {"type": "string", "example": "tcp://10.0.0.5:5557",
                       "pattern": format!("^tcp://[^*]+:{PORT}$")},
          "replay_endpoint": {"type": ["string", "null"], "pattern": format!("^(tcp://[^*]+:{PORT})?$")},
          "type": {"type": "string", "enum": ["vLLM", "SGLang", "Mooncake"]},
          "modelname": {"type": "string"}, "lora_name": {"type": ["string", "null"]},
          "tenant_id": {"type": ["string", "null"]}, "instance_id": {"type": "string", "minLength": 1},
          "block_size": {"type": "integer", "minimum": 1, "maximum": 4294967295u64},
          "dp_rank": {"type": "integer", "minimum": 0, "maximum": 4294967295u64},
          "additionalsalt": {"type": ["string", "null"]},
          "http_endpoint": {"type": ["string", "null"], "example": "http://10.0.0.5:8000",
                            "pattern": format!("^(http://[^*/]+:{PORT}/*)?$")},
          "backend_id": {"oneOf": [{"type": "null"}, id.clone(),
              {"type": "array", "maxItems": 64, "items": id}]}}});
    let unregister = json!({"type": "object", "required": ["instance_id"], "properties": {
        "instance_id": {"type": "string"}, "tenant_id": {"type": ["string", "null"]},
        "dp_rank": {"type": ["integer", "null"], "minimum": 0, "maximum": 4294967295u64}}});
    let hashes = json!({"type": "array", "items": {"oneOf": [
        {"type": "integer", "minimum": -9223372036854775808i64, "maximum": 18446744073709551615u64},
        {"type": "string", "pattern": "^(0[xX][0-9a-fA-F]{1,16}|-?[0-9]{1,18})$"}]}});
    json!({
      "openapi": "3.1.0",
      "info": {"title": "kvplane indexer", "version": env!("CARGO_PKG_VERSION"),
               "description": "The Mooncake Conductor Indexer API, fed by vLLM/SGLang/Mooncake KV events."},
      "paths": {
        "/register": {"post": op("Subscribe to a publisher", Some(register),
            json!({"type": "object"}), &["400", "405", "408", "409", "413"])},
        "/unregister": {"post": op("Remove a stream and its blocks", Some(unregister),
            json!({"type": "object"}), &["400", "404", "405", "408", "413"])},
        "/query": {"post": op("Longest cached prefix per instance, tier and rank",
            Some(query_body(("token_ids", json!({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 4294967295u64}})))),
            answer(), &["400", "405", "408", "413"])},
        "/query_by_hash": {"post": op("As /query, from rolling XXH3 sequence hashes (alias block_hash)",
            Some(query_body(("seq_hashes", hashes))), answer(), &["400", "405", "408", "413"])},
        "/services": {"get": op("Registered streams with connection and sequence state", None,
            json!({"type": "object"}), &["405"])},
        "/global_view": {"get": op("Every instance with its streams, blocks per tier, publishers and LMCache servers", None,
            json!({"type": "object"}), &["405"])},
        "/dump": {"get": op("Every stream's blocks by standard sequence hash with their tier references", None,
            json!({"type": "object"}), &["405"])},
        "/healthz": {"get": op("Liveness", None, json!({"type": "object"}), &["405"])},
        "/readyz": {"get": op("Ready: answering from a complete index (a replica: caught up)", None,
            json!({"type": "object"}), &["405", "503"])},
        "/indexer/cluster": {"get": op("Place in the --cluster (role, log position, lag, published records; {\"role\": \"standalone\"} without one)", None,
            json!({"type": "object"}), &["405"])},
        "/metrics": {"get": op("Prometheus metrics (text)", None, json!({"type": "string"}), &["405"])},
        "/openapi.json": {"get": op("This document", None, json!({"type": "object"}), &["405"])}
      }
    })
}

/// `GET /openapi.json`: the document with each route's access class.
pub(super) async fn openapi(State(st): super::St) -> Json<Value> {
    let mut doc = openapi_doc();
    crate::web::openapi::annotate(&mut doc, &super::policy(st.config.auth.clone()));
    Json(doc)
}
