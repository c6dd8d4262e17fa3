//! `GET /openapi.json`: an OpenAPI 3.1 description of every route the coordinator serves,
//! written from the route table (path, method, summary, answers). Request bodies carry
//! LMCache 0.5.6's own schemas (`openapi_schemas.json`, copied from its coordinator's
//! document); reply bodies are described in docs/COORDINATOR.md. Owns the document only: it
//! must not decide what a route accepts (the handlers do) or who may call it (`api::policy`).

use serde_json::{json, Map, Value};

/// Every served route: path, method, summary, the status codes it answers.
pub const ROUTES: &[(&str, &str, &str, &[u16])] = &[
    (
        "/instances",
        "post",
        "Register an MP server",
        &[200, 413, 422, 503],
    ),
    ("/instances", "get", "List registered MP servers", &[200]),
    (
        "/instances/usage",
        "get",
        "Memory usage of every MP server and shared pool",
        &[200],
    ),
    (
        "/instances/{instance_id}/usage",
        "get",
        "Memory usage of one MP server",
        &[200, 404],
    ),
    (
        "/instances/{instance_id}/heartbeat",
        "put",
        "Heartbeat",
        &[200, 404],
    ),
    (
        "/instances/{instance_id}",
        "delete",
        "Deregister (idempotent)",
        &[204],
    ),
    ("/healthz", "get", "Liveness", &[200]),
    (
        "/readyz",
        "get",
        "Readiness: the owner tasks answer",
        &[200, 503],
    ),
    ("/metrics", "get", "Prometheus metrics", &[200]),
    (
        "/coordinator/cluster",
        "get",
        "This coordinator's place in its cluster (--cluster): role, lease, failover",
        &[200],
    ),
    ("/openapi.json", "get", "This document", &[200]),
    (
        "/quota",
        "get",
        "Quota and usage of every salt (tier=l2)",
        &[200, 400, 422],
    ),
    (
        "/quota/config",
        "get",
        "The default quota of salts without one",
        &[200, 400, 422],
    ),
    (
        "/quota/config",
        "put",
        "Set the default quota (null: exempt)",
        &[200, 400, 413, 422],
    ),
    (
        "/quota/{cache_salt}",
        "get",
        "Quota and usage of one salt (_default: empty salt)",
        &[200, 400, 422],
    ),
    (
        "/quota/{cache_salt}",
        "put",
        "Set a salt's quota",
        &[200, 400, 413, 422, 503],
    ),
    (
        "/quota/{cache_salt}",
        "delete",
        "Remove a salt's quota",
        &[200, 400, 422],
    ),
    (
        "/quota/events",
        "post",
        "Usage events, documented (<= 0.5.2) form",
        &[200, 413, 422],
    ),
    (
        "/events",
        "post",
        "Cache events, 0.5.6 form",
        &[200, 413, 422],
    ),
    (
        "/cache/prefetches",
        "post",
        "Forward a warm prefetch to an MP server",
        &[200, 404, 413, 422, 502],
    ),
    (
        "/cache/prefetches/{instance_id}/{request_id}",
        "get",
        "Relay a prefetch's status",
        &[200, 404, 502],
    ),
    (
        "/cache/delete",
        "post",
        "Delete a token sequence's chunks on one MP server (tier l1, l2 or all)",
        &[200, 400, 404, 413, 422, 502],
    ),
    (
        "/cache/pins",
        "post",
        "Pin a token sequence's chunks against L2 eviction",
        &[200, 400, 413, 422],
    ),
    (
        "/cache/pins",
        "delete",
        "Unpin a token sequence's chunks",
        &[200, 400, 413, 422],
    ),
    (
        "/cache/pins",
        "get",
        "Pinned keys, one page at a time",
        &[200, 400, 422],
    ),
    (
        "/directory/lookup",
        "post",
        "Placements, token ids and access counts of keys or of a token sequence",
        &[200, 400, 413, 422],
    ),
    (
        "/directory/blend-lookup",
        "post",
        "CacheBlend: stored chunks found anywhere in a query (--enable-blend-lookup)",
        &[200, 400, 413, 422],
    ),
    (
        "/directory/keys",
        "get",
        "Directory keys and placements, one page at a time",
        &[200, 400, 422],
    ),
    ("/directory/stats", "get", "Directory totals", &[200]),
];

/// The schemas of LMCache 0.5.6's request bodies (see the file's `$comment`).
const SCHEMAS: &str = include_str!("openapi_schemas.json");

/// The component schema of a route's JSON body (LMCache 0.5.6's name for it), or a bare
/// object where LMCache's document has none; `None` for routes without a body.
fn body_schema(path: &str, method: &str) -> Option<Value> {
    let name = match (method, path) {
        ("post", "/instances") => "RegisterRequest",
        ("put", "/quota/config") => "QuotaConfigRequest",
        ("put", "/quota/{cache_salt}") => "SetQuotaRequest",
        ("post", "/events") => "CacheEventsRequest",
        ("post", "/cache/prefetches") => "PrefetchRequest",
        ("post", "/cache/delete") => "DeleteRequest",
        ("post" | "delete", "/cache/pins") => "PinRequest",
        ("post", "/directory/lookup") => "DirectoryLookupRequest",
        ("post", "/directory/blend-lookup") => "BlendLookupRequest",
        // The <= 0.5.2 usage events (docs/COORDINATOR.md): not in 0.5.6's document.
        ("post", "/quota/events") => "LegacyEventsRequest",
        _ => return None,
    };
    Some(json!({ "$ref": format!("#/components/schemas/{name}") }))
}

/// Query parameters besides `tier` on `/quota*`: name, schema.
fn query_params(path: &str, method: &str) -> Vec<(&'static str, Value)> {
    let page = || {
        [
            (
                "offset",
                json!({"type": "integer", "minimum": 0, "maximum": i64::MAX, "default": 0}),
            ),
            (
                "limit",
                json!({"type": "integer", "minimum": 1, "maximum": 10000, "default": 1000}),
            ),
        ]
    };
    let text = || json!({"type": "string", "default": ""});
    match (method, path) {
        ("get", "/cache/pins") => {
            let mut q = vec![("cache_salt", text()), ("model_name", text())];
            q.extend(page());
            q
        }
        ("get", "/directory/keys") => {
            let mut q = vec![
                (
                    "tier",
                    json!({"type": "string", "enum": ["l1", "l2", "all"], "default": "all"}),
                ),
                ("instance_id", text()),
                ("backend", text()),
            ];
            q.extend(page());
            q
        }
        _ => Vec::new(),
    }
}

/// The document.
pub fn document() -> Value {
    let mut paths = Map::new();
    for &(path, method, summary, codes) in ROUTES {
        let responses: Map<String, Value> = codes
            .iter()
            .map(|c| (c.to_string(), json!({ "description": reason(*c) })))
            .collect();
        let mut op = json!({ "summary": summary, "responses": responses });
        let params: Vec<Value> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
            .map(|name| {
                // A quota is set only for a salt LMCache can write into a key.
                let schema = if (method, name) == ("put", "cache_salt") {
                    json!({"type": "string", "maxLength": 128, "pattern": r"^[^@/\\\x00]*$"})
                } else {
                    json!({"type": "string"})
                };
                json!({"name": name, "in": "path", "required": true, "schema": schema})
            })
            .collect();
        if !params.is_empty() {
            op["parameters"] = Value::Array(params);
        }
        // PUTs take the tier from the body; kvplane's quotas and usage are l2 only.
        if path.starts_with("/quota") && matches!(method, "get" | "delete") {
            let tier = json!({"name": "tier", "in": "query", "required": false,
                "schema": {"type": "string", "enum": ["l2"], "default": "l2"}});
            match op.get_mut("parameters").and_then(Value::as_array_mut) {
                Some(list) => list.push(tier),
                None => op["parameters"] = json!([tier]),
            }
        }
        let extra: Vec<Value> = query_params(path, method)
            .into_iter()
            .map(|(name, schema)| json!({"name": name, "in": "query", "required": false, "schema": schema}))
            .collect();
        if !extra.is_empty() {
            match op.get_mut("parameters").and_then(Value::as_array_mut) {
                Some(list) => list.extend(extra),
                None => op["parameters"] = Value::Array(extra),
            }
        }
        if let Some(schema) = body_schema(path, method) {
            op["requestBody"] = json!({"required": true,
                "content": {"application/json": {"schema": schema}}});
        }
        paths
            .entry(path.to_owned())
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .map(|o| o.insert(method.to_owned(), op));
    }
    let schemas: Value = serde_json::from_str(SCHEMAS).expect("openapi_schemas.json is JSON");
    json!({
        "openapi": "3.1.0",
        "info": {"title": "kvplane MP coordinator", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "components": {"schemas": schemas["schemas"]},
    })
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request: a value the coordinator refuses",
        404 => "Not Found",
        413 => "Payload Too Large: --max-body-bytes or --max-body-items",
        422 => "Validation Error",
        502 => "Bad Gateway: the MP server failed",
        503 => "Service Unavailable: a limit is reached",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_described_once_with_its_parameters() {
        let doc = document();
        let paths = doc["paths"].as_object().unwrap();
        let ops: usize = paths.values().map(|p| p.as_object().unwrap().len()).sum();
        assert_eq!(ops, ROUTES.len());
        let hb = &paths["/instances/{instance_id}/heartbeat"]["put"];
        assert_eq!(hb["parameters"][0]["name"], "instance_id");
        assert!(hb.get("requestBody").is_none());
        let q = &paths["/quota/{cache_salt}"]["get"]["parameters"];
        assert_eq!(q[1]["name"], "tier");
        let events = &paths["/events"]["post"]["requestBody"]["content"]["application/json"];
        assert_eq!(
            events["schema"]["$ref"],
            "#/components/schemas/CacheEventsRequest"
        );
        // Every body's schema is in the document.
        for item in paths.values() {
            for op in item.as_object().unwrap().values() {
                let schema = &op["requestBody"]["content"]["application/json"]["schema"];
                if let Some(r) = schema["$ref"].as_str() {
                    let name = r.trim_start_matches("#/components/schemas/");
                    assert!(doc["components"]["schemas"][name].is_object(), "{r}");
                }
            }
        }
    }
}
