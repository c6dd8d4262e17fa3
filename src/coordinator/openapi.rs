//! `GET /openapi.json`: an OpenAPI 3.1 description of every route the coordinator serves,
//! written from the route table (path, method, summary, answers). Request and reply bodies are
//! described in docs/COORDINATOR.md; LMCache 0.5.6's own document lists their schemas.

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
        &[200, 422],
    ),
    ("/directory/stats", "get", "Directory totals", &[200]),
];

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
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        if !params.is_empty() {
            op["parameters"] = Value::Array(params);
        }
        if path.starts_with("/quota") && method != "post" {
            let tier = json!({"name": "tier", "in": "query", "required": false,
                "schema": {"type": "string", "enum": ["l1", "l2", "all"], "default": "l2"}});
            match op.get_mut("parameters").and_then(Value::as_array_mut) {
                Some(list) => list.push(tier),
                None => op["parameters"] = json!([tier]),
            }
        }
        if matches!(method, "post" | "put") && path != "/instances/{instance_id}/heartbeat" {
            op["requestBody"] = json!({"required": true,
                "content": {"application/json": {"schema": {"type": "object"}}}});
        }
        paths
            .entry(path.to_owned())
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .map(|o| o.insert(method.to_owned(), op));
    }
    json!({
        "openapi": "3.1.0",
        "info": {"title": "kvplane MP coordinator", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
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
        assert!(paths["/events"]["post"]["requestBody"].is_object());
    }
}
