//! The JSON schemas of the controller's answers, for its route table's `/openapi.json`
//! ([`super::table`]). Request bodies document themselves (their [`crate::web::schema::Body`]
//! tables, the ones validation runs); these are what the handlers send back, written by hand
//! with `serde_json` after the handlers' `json!` bodies. Error answers without a schema here
//! have the one error shape of every service (`crate::web::openapi::error_schema`).

use serde_json::{json, Value};

fn int() -> Value {
    json!({ "type": "integer", "format": "int64" })
}

fn nullable_string() -> Value {
    json!({ "type": "string", "nullable": true })
}

fn event_id() -> Value {
    json!({ "type": "string", "description": "Prefix + UUID4, e.g. Clear3f2a…" })
}

/// FastAPI's 422 for a bad query: pydantic's error list in `detail`.
pub(super) fn validation_error() -> Value {
    json!({
        "type": "object", "required": ["detail", "error", "reason"],
        "properties": {
            "detail": { "type": "array", "items": {
                "type": "object", "required": ["loc", "msg", "type"],
                "properties": {
                    "loc": { "type": "array", "items": { "oneOf": [
                        { "type": "string" }, { "type": "integer" } ] } },
                    "msg": { "type": "string" },
                    "type": { "type": "string" },
                    "input": {},
                    "ctx": { "type": "object" }
                } } },
            "error": { "type": "string" }, "reason": { "type": "string" },
            "field": { "type": "string" }, "index": { "type": "integer" },
            "omitted_errors": { "type": "integer" }
        }
    })
}

/// A command some workers failed (502, 503, 504): who, how, and the codes of the others.
pub(super) fn workers_error() -> Value {
    json!({
        "type": "object", "required": ["detail", "event_id", "workers"],
        "properties": {
            "detail": { "type": "string" },
            "event_id": event_id(),
            "workers": { "type": "array", "items": {
                "type": "object",
                "required": ["instance_id", "worker_id", "endpoint", "error", "message"],
                "properties": {
                    "instance_id": { "type": "string" },
                    "worker_id": int(),
                    "endpoint": { "type": "string" },
                    "error": { "type": "string", "enum": ["timeout", "busy", "unreachable",
                        "error_reply", "unexpected_reply", "undecodable"] },
                    "message": { "type": "string" }
                }
            } },
            "error_codes": { "type": "object", "additionalProperties": int() }
        }
    })
}

/// `/clear`, `/pin`, `/compress`, `/decompress`, `/move`.
pub(super) fn num_tokens() -> Value {
    json!({
        "type": "object", "required": ["event_id", "num_tokens", "num_tokens_by_worker"],
        "properties": {
            "event_id": event_id(),
            "num_tokens": int(),
            "num_tokens_by_worker": { "type": "object", "additionalProperties": int(),
                "description": "Each worker's own count, by worker id (source worker for \
                    /move); num_tokens is the smallest." }
        }
    })
}

/// `/lookup`.
pub(super) fn lookup() -> Value {
    json!({
        "type": "object", "required": ["event_id", "layout_info", "num_chunks", "holders"],
        "properties": {
            "event_id": event_id(),
            "layout_info": { "type": "object", "additionalProperties": {
                "type": "array", "minItems": 2, "maxItems": 2,
                "items": { "oneOf": [ { "type": "string" }, int() ] },
                "description": "[location, end token]" } },
            "num_chunks": int(),
            "holders": { "type": "array", "items": {
                "type": "object",
                "required": ["instance_id", "worker_id", "location", "matched_chunks",
                    "end_token", "peer_init_url"],
                "properties": {
                    "instance_id": { "type": "string" },
                    "worker_id": int(),
                    "location": { "type": "string" },
                    "matched_chunks": int(),
                    "end_token": int(),
                    "peer_init_url": nullable_string()
                }
            } }
        }
    })
}

/// `/health`.
pub(super) fn health() -> Value {
    json!({
        "type": "object", "required": ["event_id", "error_codes"],
        "properties": {
            "event_id": event_id(),
            "error_codes": { "type": "object", "additionalProperties": int() }
        }
    })
}

/// `/check_finish`.
pub(super) fn check_finish() -> Value {
    json!({
        "type": "object",
        "required": ["status", "event_id", "command", "instance_id", "created", "finished"],
        "properties": {
            "status": { "type": "string", "enum": ["pending", "finished", "failed"] },
            "event_id": { "type": "string" },
            "command": { "type": "string" },
            "instance_id": { "type": "string" },
            "created": { "type": "number" },
            "finished": { "type": "number", "nullable": true },
            "result": { "type": "object", "description": "The command's answer." },
            "detail": { "type": "string", "description": "Why it failed." }
        }
    })
}

/// `/query_instance`.
pub(super) fn query_instance() -> Value {
    json!({
        "type": "object", "required": ["event_id", "res"],
        "properties": { "event_id": event_id(), "res": { "type": "string" } }
    })
}

/// LMCache's `WorkerInfo`.
fn worker_info() -> Value {
    json!({
        "type": "object",
        "required": ["instance_id", "worker_id", "ip", "port", "peer_init_url",
            "registration_time", "last_heartbeat_time"],
        "properties": {
            "instance_id": { "type": "string" },
            "worker_id": int(),
            "ip": { "type": "string" },
            "port": int(),
            "peer_init_url": nullable_string(),
            "registration_time": { "type": "number" },
            "last_heartbeat_time": { "type": "number" }
        }
    })
}

/// `/query_worker_info`.
pub(super) fn query_worker_info() -> Value {
    json!({
        "type": "object", "required": ["event_id", "worker_infos"],
        "properties": { "event_id": event_id(),
            "worker_infos": { "type": "array", "items": worker_info() } }
    })
}

/// `/controller/key-stats`.
pub(super) fn key_stats() -> Value {
    json!({
        "type": "object",
        "required": ["total_key_count", "total_instance_count", "total_worker_count",
            "instances"],
        "properties": {
            "total_key_count": int(),
            "total_instance_count": int(),
            "total_worker_count": int(),
            "instances": { "type": "array", "items": {
                "type": "object", "required": ["instance_id", "key_count", "worker_count"],
                "properties": { "instance_id": { "type": "string" }, "key_count": int(),
                    "worker_count": int() } } }
        }
    })
}

/// One worker of `/controller/workers`: `WorkerInfo` and kvplane's fields.
fn worker_row() -> Value {
    json!({
        "allOf": [ worker_info(), {
            "type": "object",
            "required": ["key_count", "last_seen", "locations", "sync", "protocol"],
            "properties": {
                "key_count": int(),
                "protocol": { "type": "string",
                    "enum": crate::protocol::Wire::ALL.map(crate::protocol::Wire::label),
                    "description": "The LMCache controller-wire generation the worker \
                        speaks, named by the LMCache releases that speak it." },
                "last_seen": { "type": "number" },
                "locations": { "type": "array", "items": {
                    "type": "object", "required": ["name", "key_count", "last_seq"],
                    "properties": { "name": { "type": "string" }, "key_count": int(),
                        "last_seq": { "type": "integer", "format": "int64",
                            "nullable": true } } } },
                "sync": { "type": "object",
                    "required": ["state", "sync_id", "progress", "missing_batches"],
                    "properties": {
                        "state": { "type": "string",
                            "enum": ["idle", "syncing", "completed", "failed"] },
                        "sync_id": nullable_string(),
                        "progress": { "type": "number" },
                        "missing_batches": int() } }
            }
        } ]
    })
}

/// `/controller/workers`: a list, or one worker.
pub(super) fn workers() -> Value {
    let list = json!({
        "type": "object", "required": ["workers", "total_count"],
        "properties": { "workers": { "type": "array", "items": worker_row() },
            "total_count": int() }
    });
    json!({ "anyOf": [ list, worker_row() ] })
}

/// `/controller/cluster`.
pub(super) fn cluster() -> Value {
    json!({
        "type": "object", "required": ["role"],
        "properties": {
            "role": { "type": "string",
                "enum": ["standalone", "leader", "standby", "replica"] },
            "following": { "type": "object", "nullable": true },
            "cluster": { "type": "string" }, "me": { "type": "string" },
            "lease_holder": { "type": "string", "nullable": true }, "epoch": int(),
            "followed": { "type": "object" }, "published": { "type": "object" },
            "last_failover": { "type": "object", "nullable": true }
        }
    })
}

#[cfg(test)]
mod tests {
    use crate::web::access::Auth;
    use serde_json::{json, Map, Value};

    fn document(auth: &Auth) -> Value {
        super::super::table(false).document(auth)
    }

    /// Every `$ref` in `v` points at an existing component schema.
    fn refs_resolve(v: &Value, schemas: &Map<String, Value>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    let name = r
                        .strip_prefix("#/components/schemas/")
                        .unwrap_or_else(|| panic!("unexpected $ref {r}"));
                    assert!(schemas.contains_key(name), "dangling $ref {r}");
                }
                m.values().for_each(|x| refs_resolve(x, schemas));
            }
            Value::Array(a) => a.iter().for_each(|x| refs_resolve(x, schemas)),
            _ => {}
        }
    }

    #[test]
    fn document_is_structurally_valid_openapi_3() {
        for token_set in [false, true] {
            let auth = if token_set {
                Auth::token("t")
            } else {
                Auth::default()
            };
            let doc = document(&auth);
            assert_eq!(doc["openapi"], "3.0.3");
            assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
            let schemas = doc["components"]["schemas"].as_object().expect("schemas");
            refs_resolve(&doc, schemas);
            let mut ids = std::collections::HashSet::new();
            for (path, item) in doc["paths"].as_object().expect("paths") {
                assert!(path.starts_with('/'), "{path}");
                for (method, op) in item.as_object().expect("path item") {
                    let id = op["operationId"].as_str().expect("operationId");
                    assert!(ids.insert(id.to_owned()), "duplicate operationId {id}");
                    let responses = op["responses"].as_object().expect("responses");
                    assert!(responses.contains_key("200"), "{method} {path}");
                    for (status, r) in responses {
                        assert!(status.parse::<u16>().is_ok(), "{status}");
                        assert!(r["description"].is_string(), "{path} {status}");
                    }
                    let templated = path.contains('{');
                    let has_path_param = op["parameters"].as_array().is_some_and(|ps| {
                        ps.iter()
                            .any(|p| p["in"] == "path" && p["required"] == true)
                    });
                    assert_eq!(templated, has_path_param, "{path}");
                    if let Some(body) = op.get("requestBody") {
                        assert!(body["content"]["application/json"]["schema"].is_object());
                        for status in ["408", "413", "422"] {
                            assert!(responses.contains_key(status), "{path} {status}");
                        }
                    }
                    if token_set && op["x-kvplane-access"] == "write" {
                        assert!(responses.contains_key("401"), "{path}");
                        assert_eq!(op["security"], json!([{ "bearerAuth": [] }]));
                    }
                }
            }
            // OpenAPI 3.0 has no "null" type: nullability is `nullable: true`.
            assert!(!doc.to_string().contains(r#""type":"null""#));
            assert_eq!(
                doc["components"]["securitySchemes"].is_object(),
                token_set,
                "the bearer scheme is declared only when a token is configured"
            );
        }
    }

    #[test]
    fn bodies_list_their_required_fields() {
        let doc = document(&Auth::default());
        let body = |path: &str| {
            doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
                .clone()
        };
        assert_eq!(
            body("/clear")["required"],
            json!(["instance_id", "location"])
        );
        let moving = body("/move");
        assert_eq!(moving["required"], json!(["old_position", "new_position"]));
        assert_eq!(moving["properties"]["old_position"]["minItems"], 2);
        assert_eq!(moving["properties"]["should_copy"]["default"], false);
        assert_eq!(
            body("/compress")["properties"]["tokens"]["default"],
            json!([])
        );
        assert_eq!(
            body("/pin")["properties"]["tokens"]["items"]["type"],
            "integer"
        );
        assert_eq!(
            body("/lookup")["oneOf"],
            json!([{ "required": ["tokens"] }, { "required": ["hashes"] }])
        );
        assert_eq!(body("/query_instance")["required"], json!(["ip"]));
    }

    #[test]
    fn answers_carry_their_bodies() {
        let doc = document(&Auth::default());
        let answer = |method: &str, path: &str, status: &str| {
            doc["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]
                .clone()
        };
        assert_eq!(
            answer("post", "/lookup", "200")["required"],
            json!(["event_id", "layout_info", "num_chunks", "holders"])
        );
        for status in ["502", "503", "504"] {
            assert_eq!(
                answer("post", "/health", status)["required"],
                json!(["detail", "event_id", "workers"]),
                "{status}"
            );
        }
        assert!(doc["paths"]["/move"]["post"]["responses"]["409"].is_object());
        assert_eq!(
            answer("get", "/controller/workers", "422")["properties"]["detail"]["type"],
            "array"
        );
        assert!(answer("get", "/controller/workers", "200")["anyOf"].is_array());
        let params = doc["paths"]["/api/dashboard"]["get"]["parameters"]
            .as_array()
            .expect("parameters");
        assert_eq!(params.len(), 3);
    }
}
