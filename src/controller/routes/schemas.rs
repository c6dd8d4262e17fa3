//! `GET /openapi.json`: an OpenAPI 3.0.3 document of every route, written by hand with
//! `serde_json`. The paths come from the route table ([`super::api_routes`]) plus the
//! dashboard's routes ([`DASHBOARD_ROUTES`]); request bodies come from the same [`BodySpec`]s
//! the validation runs, so the schemas are exactly what the server accepts. Tests check that
//! every registered route is documented and that the document is structurally valid.

use super::lookup::{LookupRequest, QueryInstRequest, QueryWorkerInfoRequest};
use super::orchestration::{
    CheckFinishRequest, ClearRequest, CompressRequest, DecompressRequest, HealthRequest,
    MoveRequest, PinRequest,
};
use super::{api_routes, Access};
use crate::controller::Driver;
use crate::web::access::Auth;
use crate::web::schema::{body_schema, Body, BodySpec};
use axum::extract::State;
use axum::http::Method;
use axum::Json;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// Routes served by the dashboard module (`dashboard::routes`), documented here too.
pub(crate) const DASHBOARD_ROUTES: &[(&str, &str)] = &[
    ("/", "The dashboard page (HTML)."),
    (
        "/static/{path}",
        "Dashboard assets (scripts, styles, images).",
    ),
    (
        "/api/dashboard",
        "The dashboard's JSON feed: totals, counters and worker rows.",
    ),
];

/// Every request body, for `components.schemas`.
const BODIES: &[BodySpec] = &[
    LookupRequest::SPEC,
    QueryInstRequest::SPEC,
    QueryWorkerInfoRequest::SPEC,
    ClearRequest::SPEC,
    PinRequest::SPEC,
    CompressRequest::SPEC,
    DecompressRequest::SPEC,
    MoveRequest::SPEC,
    HealthRequest::SPEC,
    CheckFinishRequest::SPEC,
];

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn json_response(description: &str, schema: &str) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": schema_ref(schema) } }
    })
}

/// Documentation of one API operation (everything but the security and 401 parts).
struct Op {
    summary: &'static str,
    description: &'static str,
    body: Option<&'static str>,
    ok: &'static str,
    /// Extra `(status, description, schema)` responses.
    errors: &'static [(&'static str, &'static str, &'static str)],
}

const NOT_FOUND_INSTANCE: (&str, &str, &str) = ("404", "Unknown instance.", "ErrorDetail");
const WORKER_ERRORS: [(&str, &str, &str); 3] = [
    (
        "502",
        "A worker answered ErrorMsg, a wrong reply type, or could not be reached.",
        "WorkersError",
    ),
    (
        "503",
        "Every failing worker already had too many commands queued.",
        "WorkersError",
    ),
    (
        "504",
        "A worker did not answer within --downlink-timeout.",
        "WorkersError",
    ),
];

const fn command_errors() -> [(&'static str, &'static str, &'static str); 4] {
    [
        NOT_FOUND_INSTANCE,
        WORKER_ERRORS[0],
        WORKER_ERRORS[1],
        WORKER_ERRORS[2],
    ]
}

const COMMAND_ERRORS: [(&str, &str, &str); 4] = command_errors();
const MOVE_ERRORS: [(&str, &str, &str); 5] = [
    NOT_FOUND_INSTANCE,
    (
        "409",
        "A destination worker has no peer_init_url (P2P not enabled).",
        "ErrorDetail",
    ),
    WORKER_ERRORS[0],
    WORKER_ERRORS[1],
    WORKER_ERRORS[2],
];

fn operation(method: &Method, path: &str) -> Option<Op> {
    let op = match (method.as_str(), path) {
        ("POST", "/lookup") => Op {
            summary: "Which instances hold this prefix",
            description: "LMCache's /lookup: the tokens are hashed into chunks as an LMCache \
                worker hashes them (CPython's builtin hash, --lookup-chunk-size, \
                --lookup-none-hash), or the chunk hashes are given directly. layout_info maps \
                each instance credited with a chunk (first holder per chunk, stopping at the \
                first miss) to [location, end token]; holders lists every holder of the \
                prefix.",
            body: Some("LookupRequest"),
            ok: "LookupResponse",
            errors: &[],
        },
        ("POST", "/query_instance") => Op {
            summary: "Instance of a worker ip",
            description: "The first instance (registration order) with a worker at this ip.",
            body: Some("QueryInstRequest"),
            ok: "QueryInstResponse",
            errors: &[("404", "No worker has this ip.", "ErrorDetail")],
        },
        ("POST", "/query_worker_info") => Op {
            summary: "WorkerInfo records",
            description: "Workers of an instance (or of every instance with \"all\").",
            body: Some("QueryWorkerInfoRequest"),
            ok: "QueryWorkerInfoResponse",
            errors: &[NOT_FOUND_INSTANCE],
        },
        ("POST", "/clear") => Op {
            summary: "Clear a location on every worker of an instance",
            description: "Sends ClearWorkerMsg to every worker of the instance concurrently.",
            body: Some("ClearRequest"),
            ok: "NumTokensResponse",
            errors: &COMMAND_ERRORS,
        },
        ("POST", "/pin") => Op {
            summary: "Pin tokens on every worker of an instance",
            description: "Sends PinWorkerMsg to every worker of the instance concurrently.",
            body: Some("PinRequest"),
            ok: "NumTokensResponse",
            errors: &COMMAND_ERRORS,
        },
        ("POST", "/compress") => Op {
            summary: "Compress KV on every worker of an instance",
            description: "Sends CompressWorkerMsg to every worker of the instance.",
            body: Some("CompressRequest"),
            ok: "NumTokensResponse",
            errors: &COMMAND_ERRORS,
        },
        ("POST", "/decompress") => Op {
            summary: "Decompress KV on every worker of an instance",
            description: "Sends DecompressWorkerMsg to every worker of the instance.",
            body: Some("DecompressRequest"),
            ok: "NumTokensResponse",
            errors: &COMMAND_ERRORS,
        },
        ("POST", "/move") => Op {
            summary: "Move KV between instances",
            description: "Pairs source and destination workers by rank (worker-id order, \
                the shorter list decides) and sends each source a MoveWorkerMsg whose \
                new_position is (destination peer_init_url, destination location).",
            body: Some("MoveRequest"),
            ok: "NumTokensResponse",
            errors: &MOVE_ERRORS,
        },
        ("POST", "/health") => Op {
            summary: "Probe the workers of an instance",
            description: "error_codes: worker id -> 0 healthy, -1 memory check failed, \
                -1001 ErrorMsg, -1002 unexpected reply, -1003 undecodable; in a 504/502 body \
                also -1004 timeout, -1005 unreachable. An unknown instance answers 200 with \
                no codes (LMCache's behaviour; its dashboard relies on it).",
            body: Some("HealthRequest"),
            ok: "HealthResponse",
            errors: &WORKER_ERRORS,
        },
        ("POST", "/check_finish") => Op {
            summary: "Status of a command",
            description: "pending, finished or failed, for the last 10,000 commands.",
            body: Some("CheckFinishRequest"),
            ok: "CheckFinishResponse",
            errors: &[("404", "Unknown or forgotten event_id.", "ErrorDetail")],
        },
        ("GET", "/controller/key-stats") => Op {
            summary: "Key counts",
            description: "Totals and per-instance key and worker counts.",
            body: None,
            ok: "KeyStatsResponse",
            errors: &[],
        },
        ("GET", "/controller/workers") => Op {
            summary: "Registered workers",
            description: "All workers; ?instance_id= one instance; ?instance_id=&worker_id= \
                one worker object; ?worker_id= that worker id in every instance.",
            body: None,
            ok: "WorkersResponse",
            errors: &[
                ("404", "Unknown instance or worker.", "ErrorDetail"),
                ("422", "worker_id is not an integer.", "HTTPValidationError"),
            ],
        },
        ("GET", "/controller/cluster") => Op {
            summary: "Place in the cluster (--cluster)",
            description: "role (standalone, leader), this process's lease name, the lease \
                holder and epoch, the change log followed before taking over (epoch, seq, \
                in_sync, gaps, fenced) and published since, and the last failover \
                (docs/CLUSTER.md).",
            body: None,
            ok: "ClusterStatus",
            errors: &[],
        },
        ("GET", "/healthz") => Op {
            summary: "Liveness",
            description: "The process answers HTTP; with fleet totals.",
            body: None,
            ok: "Healthz",
            errors: &[],
        },
        ("GET", "/readyz") => Op {
            summary: "Readiness",
            description: "200 once every configured ZMQ socket is bound and served, else 503.",
            body: None,
            ok: "Readyz",
            errors: &[("503", "Not ready (starting or shutting down).", "Readyz")],
        },
        ("GET", "/metrics") => Op {
            summary: "Prometheus metrics",
            description: "LMCache's lmcache:cache_controller_* gauges and kvplane_* metrics.",
            body: None,
            ok: "",
            errors: &[],
        },
        ("GET", "/openapi.json") => Op {
            summary: "This document",
            description: "",
            body: None,
            ok: "",
            errors: &[],
        },
        _ => return None,
    };
    Some(op)
}

fn operation_id(method: &Method, path: &str) -> String {
    let name: String = path
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!(
        "{}{}",
        method.as_str().to_ascii_lowercase(),
        name.trim_end_matches('_')
    )
}

fn render(method: &Method, path: &str, access: Access, auth: &Auth, op: &Op) -> Value {
    let mut responses = Map::new();
    let ok = match (path, op.ok) {
        ("/metrics", _) => json!({
            "description": "Prometheus text format 0.0.4.",
            "content": { "text/plain": { "schema": { "type": "string" } } }
        }),
        ("/openapi.json", _) => json!({
            "description": "OpenAPI 3.0.3 document.",
            "content": { "application/json": { "schema": { "type": "object" } } }
        }),
        (_, schema) => json_response("Successful Response", schema),
    };
    responses.insert("200".into(), ok);
    for (status, description, schema) in op.errors {
        responses.insert((*status).into(), json_response(description, schema));
    }
    let mut operation = Map::new();
    operation.insert("operationId".into(), operation_id(method, path).into());
    operation.insert("summary".into(), op.summary.into());
    if !op.description.is_empty() {
        operation.insert("description".into(), op.description.into());
    }
    if let Some(body) = op.body {
        operation.insert(
            "requestBody".into(),
            json!({
                "required": true,
                "content": { "application/json": { "schema": schema_ref(body) } }
            }),
        );
        responses.insert(
            "422".into(),
            json_response("Validation Error", "HTTPValidationError"),
        );
        responses.insert(
            "413".into(),
            json_response(
                "Body over --max-body-bytes (4 MiB) or --max-body-items (262,144 JSON values).",
                "ErrorDetail",
            ),
        );
        responses.insert(
            "408".into(),
            json_response(
                "Body not received within --http-read-timeout.",
                "ErrorDetail",
            ),
        );
        if access == Access::Write {
            responses.insert(
                "415".into(),
                json_response("Content-Type is not JSON (CSRF guard).", "ErrorDetail"),
            );
            responses.insert(
                "403".into(),
                json_response("Cross-origin browser request (CSRF guard).", "ErrorDetail"),
            );
        }
    }
    if path == "/controller/workers" {
        operation.insert(
            "parameters".into(),
            json!([
                { "name": "instance_id", "in": "query", "required": false,
                  "schema": { "type": "string" } },
                { "name": "worker_id", "in": "query", "required": false,
                  "schema": { "type": "integer", "format": "int64" } }
            ]),
        );
    }
    if access == Access::Write {
        operation.insert("tags".into(), json!(["commands"]));
    }
    operation.insert("x-kvplane-access".into(), access.as_str().into());
    if auth.requires(access) {
        operation.insert("security".into(), json!([{ "bearerAuth": [] }]));
        responses.insert(
            "401".into(),
            json_response("Missing or wrong bearer token.", "ErrorDetail"),
        );
    }
    operation.insert("responses".into(), Value::Object(responses));
    Value::Object(operation)
}

fn schemas() -> Map<String, Value> {
    let mut s = Map::new();
    for spec in BODIES {
        s.insert(spec.name.into(), body_schema(spec));
    }
    let int = json!({ "type": "integer", "format": "int64" });
    let nullable_string = json!({ "type": "string", "nullable": true });
    let event_id = json!({ "type": "string", "description": "Prefix + UUID4, e.g. Clear3f2a…" });
    let more = json!({
        "ErrorDetail": {
            "type": "object", "required": ["detail", "error", "reason"],
            "description": "The one error shape of every kvplane service (FastAPI's detail, \
                the Conductor's error and reason).",
            "properties": { "detail": { "type": "string" }, "error": { "type": "string" },
                "reason": { "type": "string" }, "field": { "type": "string" },
                "index": { "type": "integer" } }
        },
        "ValidationError": {
            "type": "object", "required": ["loc", "msg", "type"],
            "properties": {
                "loc": { "type": "array", "items": { "oneOf": [
                    { "type": "string" }, { "type": "integer" } ] } },
                "msg": { "type": "string" },
                "type": { "type": "string" },
                "input": {},
                "ctx": { "type": "object" }
            }
        },
        "HTTPValidationError": {
            "type": "object", "required": ["detail", "error", "reason"],
            "properties": { "detail": { "type": "array",
                "items": schema_ref("ValidationError") },
                "error": { "type": "string" }, "reason": { "type": "string" },
                "field": { "type": "string" }, "index": { "type": "integer" },
                "omitted_errors": { "type": "integer" } }
        },
        "WorkersError": {
            "type": "object", "required": ["detail", "event_id", "workers"],
            "properties": {
                "detail": { "type": "string" },
                "event_id": event_id,
                "workers": { "type": "array", "items": {
                    "type": "object",
                    "required": ["instance_id", "worker_id", "endpoint", "error", "message"],
                    "properties": {
                        "instance_id": { "type": "string" },
                        "worker_id": int,
                        "endpoint": { "type": "string" },
                        "error": { "type": "string", "enum": ["timeout", "busy", "unreachable",
                            "error_reply", "unexpected_reply", "undecodable"] },
                        "message": { "type": "string" }
                    }
                } },
                "error_codes": { "type": "object", "additionalProperties": int }
            }
        },
        "NumTokensResponse": {
            "type": "object", "required": ["event_id", "num_tokens", "num_tokens_by_worker"],
            "properties": {
                "event_id": event_id,
                "num_tokens": int,
                "num_tokens_by_worker": { "type": "object", "additionalProperties": int,
                    "description": "Each worker's own count, by worker id (source worker for \
                        /move); num_tokens is the smallest." }
            }
        },
        "LookupResponse": {
            "type": "object", "required": ["event_id", "layout_info", "num_chunks", "holders"],
            "properties": {
                "event_id": event_id,
                "layout_info": { "type": "object", "additionalProperties": {
                    "type": "array", "minItems": 2, "maxItems": 2,
                    "items": { "oneOf": [ { "type": "string" }, int ] },
                    "description": "[location, end token]" } },
                "num_chunks": int,
                "holders": { "type": "array", "items": {
                    "type": "object",
                    "required": ["instance_id", "worker_id", "location", "matched_chunks",
                        "end_token", "peer_init_url"],
                    "properties": {
                        "instance_id": { "type": "string" },
                        "worker_id": int,
                        "location": { "type": "string" },
                        "matched_chunks": int,
                        "end_token": int,
                        "peer_init_url": nullable_string
                    }
                } }
            }
        },
        "HealthResponse": {
            "type": "object", "required": ["event_id", "error_codes"],
            "properties": {
                "event_id": event_id,
                "error_codes": { "type": "object", "additionalProperties": int }
            }
        },
        "CheckFinishResponse": {
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
        },
        "QueryInstResponse": {
            "type": "object", "required": ["event_id", "res"],
            "properties": { "event_id": event_id, "res": { "type": "string" } }
        },
        "WorkerInfo": {
            "type": "object",
            "required": ["instance_id", "worker_id", "ip", "port", "peer_init_url",
                "registration_time", "last_heartbeat_time"],
            "properties": {
                "instance_id": { "type": "string" },
                "worker_id": int,
                "ip": { "type": "string" },
                "port": int,
                "peer_init_url": nullable_string,
                "registration_time": { "type": "number" },
                "last_heartbeat_time": { "type": "number" }
            }
        },
        "QueryWorkerInfoResponse": {
            "type": "object", "required": ["event_id", "worker_infos"],
            "properties": { "event_id": event_id,
                "worker_infos": { "type": "array", "items": schema_ref("WorkerInfo") } }
        },
        "KeyStatsResponse": {
            "type": "object",
            "required": ["total_key_count", "total_instance_count", "total_worker_count",
                "instances"],
            "properties": {
                "total_key_count": int,
                "total_instance_count": int,
                "total_worker_count": int,
                "instances": { "type": "array", "items": {
                    "type": "object", "required": ["instance_id", "key_count", "worker_count"],
                    "properties": { "instance_id": { "type": "string" }, "key_count": int,
                        "worker_count": int } } }
            }
        },
        "WorkerRow": {
            "allOf": [ schema_ref("WorkerInfo"), {
                "type": "object",
                "required": ["key_count", "last_seen", "locations", "sync", "protocol"],
                "properties": {
                    "key_count": int,
                    "protocol": { "type": "string",
                        "enum": crate::protocol::Wire::ALL.map(crate::protocol::Wire::label),
                        "description": "The LMCache controller-wire generation the worker \
                            speaks, named by the LMCache releases that speak it." },
                    "last_seen": { "type": "number" },
                    "locations": { "type": "array", "items": {
                        "type": "object", "required": ["name", "key_count", "last_seq"],
                        "properties": { "name": { "type": "string" }, "key_count": int,
                            "last_seq": { "type": "integer", "format": "int64",
                                "nullable": true } } } },
                    "sync": { "type": "object",
                        "required": ["state", "sync_id", "progress", "missing_batches"],
                        "properties": {
                            "state": { "type": "string",
                                "enum": ["idle", "syncing", "completed", "failed"] },
                            "sync_id": nullable_string,
                            "progress": { "type": "number" },
                            "missing_batches": int } }
                }
            } ]
        },
        "WorkerList": {
            "type": "object", "required": ["workers", "total_count"],
            "properties": { "workers": { "type": "array", "items": schema_ref("WorkerRow") },
                "total_count": int }
        },
        "WorkersResponse": {
            "anyOf": [ schema_ref("WorkerList"), schema_ref("WorkerRow") ]
        },
        "Healthz": {
            "type": "object", "required": ["status", "workers", "instances", "keys"],
            "properties": { "status": { "type": "string" }, "workers": int,
                "instances": int, "keys": int }
        },
        "ClusterStatus": {
            "type": "object", "required": ["role"],
            "properties": {
                "role": { "type": "string",
                    "enum": ["standalone", "leader", "standby", "replica"] },
                "following": { "type": "object", "nullable": true },
                "cluster": { "type": "string" }, "me": { "type": "string" },
                "lease_holder": { "type": "string", "nullable": true }, "epoch": int,
                "followed": { "type": "object" }, "published": { "type": "object" },
                "last_failover": { "type": "object", "nullable": true }
            }
        },
        "Readyz": {
            "type": "object", "required": ["status", "http", "sockets"],
            "properties": {
                "status": { "type": "string", "enum": ["ready", "not_ready"] },
                "http": { "type": "string" },
                "sockets": { "type": "object", "additionalProperties": { "type": "string",
                    "enum": ["serving", "not_serving", "not_configured"] } },
                "replica": { "type": "object" }
            }
        }
    });
    if let Value::Object(m) = more {
        s.extend(m);
    }
    s
}

/// The OpenAPI document; `auth` adds the bearer security to the routes that need the token.
pub(crate) fn document(auth: &Auth) -> Value {
    let mut paths = Map::new();
    let mut add = |path: &str, method: &Method, op: Value| {
        let entry = paths
            .entry(path.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(e) = entry {
            e.insert(method.as_str().to_ascii_lowercase(), op);
        }
    };
    for r in api_routes() {
        let op = operation(&r.method, r.path).map_or_else(
            || json!({ "summary": "undocumented", "responses": { "200": { "description": "" } } }),
            |op| render(&r.method, r.path, r.access, auth, &op),
        );
        add(r.path, &r.method, op);
    }
    for (path, summary) in DASHBOARD_ROUTES {
        let mut op = json!({
            "operationId": operation_id(&Method::GET, path),
            "summary": summary,
            "tags": ["dashboard"],
            "x-kvplane-access": "read",
            "responses": {
                "200": { "description": "The asset or feed." },
                "304": { "description": "Not modified (ETag)." },
                "404": json_response("No such asset.", "ErrorDetail")
            }
        });
        if path.contains("{path}") {
            op["parameters"] = json!([{ "name": "path", "in": "path", "required": true,
                "schema": { "type": "string" } }]);
        }
        if *path == "/api/dashboard" {
            let count = json!({ "type": "integer", "minimum": 0 });
            op["parameters"] = json!([
                { "name": "offset", "in": "query", "required": false, "schema": count,
                  "description": "First worker row (registration order)." },
                { "name": "limit", "in": "query", "required": false, "schema": count,
                  "description": "Most worker rows (default: all)." },
                { "name": "history", "in": "query", "required": false,
                  "schema": { "type": "integer", "enum": [0, 1] },
                  "description": "1: add the server's 15-minute history of counters." }
            ]);
            op["responses"]["422"] = json_response("Bad query.", "HTTPValidationError");
        }
        if auth.requires(Access::Read) {
            op["security"] = json!([{ "bearerAuth": [] }]);
            op["responses"]["401"] = json_response("Missing or wrong bearer token.", "ErrorDetail");
        }
        add(path, &Method::GET, op);
    }
    let mut components = json!({ "schemas": schemas() });
    if auth.token.is_some() {
        components["securitySchemes"] =
            json!({ "bearerAuth": { "type": "http", "scheme": "bearer" } });
    }
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "kvplane",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "KV-cache controller, a drop-in replacement for the LMCache 0.5.6 \
                controller. See docs/API.md."
        },
        "paths": paths,
        "components": components
    })
}

/// `GET /openapi.json`.
pub(crate) async fn serve(State(shared): State<Arc<Driver>>) -> Json<Value> {
    Json(document(&super::auth(&shared)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_route_is_documented() {
        for r in api_routes() {
            assert!(
                operation(&r.method, r.path).is_some(),
                "{} {} has no OpenAPI operation",
                r.method,
                r.path
            );
        }
        let doc = document(&Auth::token("t"));
        let paths = doc["paths"].as_object().expect("paths");
        for r in api_routes() {
            let method = r.method.as_str().to_ascii_lowercase();
            assert!(
                paths[r.path][&method].is_object(),
                "{} {}",
                r.method,
                r.path
            );
        }
        for (path, _) in DASHBOARD_ROUTES {
            assert!(paths[*path]["get"].is_object(), "{path}");
        }
        assert_eq!(paths.len(), api_routes().len() + DASHBOARD_ROUTES.len());
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
                    assert!(
                        ["get", "post", "put", "delete", "patch", "head", "options"]
                            .contains(&method.as_str()),
                        "{method}"
                    );
                    let id = op["operationId"].as_str().expect("operationId");
                    assert!(ids.insert(id.to_owned()), "duplicate operationId {id}");
                    let responses = op["responses"].as_object().expect("responses");
                    assert!(!responses.is_empty());
                    for (status, r) in responses {
                        assert!(
                            status.len() == 3 && status.parse::<u16>().is_ok(),
                            "{status}"
                        );
                        assert!(r["description"].is_string(), "{path} {status}");
                    }
                    // Path templates and path parameters agree.
                    let templated = path.contains('{');
                    let has_path_param = op["parameters"].as_array().is_some_and(|ps| {
                        ps.iter()
                            .any(|p| p["in"] == "path" && p["required"] == true)
                    });
                    assert_eq!(templated, has_path_param, "{path}");
                    if let Some(body) = op.get("requestBody") {
                        assert!(body["content"]["application/json"]["schema"].is_object());
                        assert!(
                            responses.contains_key("422"),
                            "{path}: bodies can be invalid"
                        );
                    }
                    if token_set && op["tags"] == json!(["commands"]) {
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
        let s = &doc["components"]["schemas"];
        assert_eq!(
            s["ClearRequest"]["required"],
            json!(["instance_id", "location"])
        );
        assert_eq!(
            s["MoveRequest"]["required"],
            json!(["old_position", "new_position"])
        );
        assert_eq!(
            s["MoveRequest"]["properties"]["old_position"]["minItems"],
            2
        );
        assert_eq!(
            s["MoveRequest"]["properties"]["should_copy"]["default"],
            false
        );
        assert_eq!(
            s["CompressRequest"]["properties"]["tokens"]["default"],
            json!([])
        );
        assert_eq!(
            s["PinRequest"]["properties"]["tokens"]["items"]["type"],
            "integer"
        );
        assert_eq!(
            s["LookupRequest"]["oneOf"],
            json!([{ "required": ["tokens"] }, { "required": ["hashes"] }])
        );
        assert_eq!(s["QueryInstRequest"]["required"], json!(["ip"]));
    }
}
