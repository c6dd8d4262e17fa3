//! The 0.5.6 routes added beside the documented ones: the default quota (`/quota/config`), the
//! `tier` query parameter of the quota routes, and `/openapi.json` — every code, through
//! `router(state).oneshot`, with the bodies LMCache 0.5.6 answers (its probe is in
//! the reference material as `spec/mp-coordinator/coordinator_probe_0.5.6.txt`; the bodies
//! below are copied from it).

use crate::app::{app, call, config_with, get, post, put, quiet_config, register};
use axum::http::StatusCode;
use axum::Router;
use kvplane::coordinator::routes::openapi;
use kvplane::coordinator::state::driver;
use serde_json::{json, Value};
use std::time::Duration;

fn default_app() -> (Router, driver::Handle) {
    let mut c = quiet_config();
    c.outbound_timeout = Duration::from_secs(1);
    app(&c)
}

#[tokio::test]
async fn quota_config_sets_reads_and_validates_the_default() {
    let (app, handle) = default_app();
    // Boot: null, salts without a quota exempt (0.5.6's; `--default-quota-gb` changes it).
    assert_eq!(
        get(&app, "/quota/config").await,
        (StatusCode::OK, json!({"default_limit_gb": null}))
    );
    // The allowlist: 0 GiB for salts without a quota; GET /quota shows it as their limit.
    assert_eq!(
        put(&app, "/quota/config", r#"{"default_limit_gb": 0}"#).await,
        (StatusCode::OK, json!({"default_limit_gb": 0.0}))
    );
    let (_, row) = get(&app, "/quota/nobody").await;
    assert_eq!(
        row,
        json!({"cache_salt": "nobody", "quota_limit_gb": 0.0, "quota_exists": false,
               "usage_gb": 0.0, "effective_limit_gb": 0.0, "limit_source": "default"})
    );
    // An unknown field is a 422 naming it, never a silent reset (0.5.6 resets to null, Q10).
    let (code, body) = put(&app, "/quota/config", r#"{"limit_gb": 5}"#).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["detail"][0]["loc"], json!(["body", "limit_gb"]));
    assert_eq!(
        get(&app, "/quota/config").await.1,
        json!({"default_limit_gb": 0.0})
    );
    assert_eq!(
        put(&app, "/quota/config", r#"{"default_limit_gb": 2.5}"#).await,
        (StatusCode::OK, json!({"default_limit_gb": 2.5}))
    );
    assert_eq!(
        get(&app, "/quota/config?tier=l2").await,
        (StatusCode::OK, json!({"default_limit_gb": 2.5}))
    );
    assert_eq!(
        handle.with(|m, _, _| m.default_limit_gb()).await.unwrap(),
        Some(2.5)
    );
    // {} and null both exempt salts without a quota, as in 0.5.6.
    for body in [r#"{"default_limit_gb": null}"#, "{}"] {
        assert_eq!(
            put(&app, "/quota/config", body).await,
            (StatusCode::OK, json!({"default_limit_gb": null}))
        );
    }
    assert_eq!(
        get(&app, "/quota/config").await.1,
        json!({"default_limit_gb": null})
    );
    // Codes.
    let (code, body) = put(&app, "/quota/config", r#"{"default_limit_gb": -1}"#).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        body["detail"][0]["loc"],
        json!(["body", "default_limit_gb"])
    );
    let (code, body) = put(
        &app,
        "/quota/config",
        r#"{"default_limit_gb": 1, "tier": "l1"}"#,
    )
    .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(body["detail"], "quotas apply to tier 'l2' only, not 'l1'");
    let (code, body) = put(&app, "/quota/config", r#"{"default_limit_gb": 1e300}"#).await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{body}");
    let (code, body) = put(&app, "/quota/config", r#"{"default_limit_gb": "x"}"#).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (code, body) = get(&app, "/quota/config?tier=l1").await;
    assert_eq!(
        (code, body["detail"].as_str()),
        (
            StatusCode::BAD_REQUEST,
            Some("quotas apply to tier 'l2' only, not 'l1'")
        )
    );
    let (code, body) = get(&app, "/quota/config?tier=xx").await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["detail"][0]["loc"], json!(["query", "tier"]));
    // Nothing above changed the default.
    assert_eq!(
        handle.with(|m, _, _| m.default_limit_gb()).await.unwrap(),
        None
    );
}

#[tokio::test]
async fn quota_routes_take_the_tier_parameter() {
    let (app, _) = default_app();
    assert_eq!(
        put(&app, "/quota/user-a", r#"{"limit_gb": 1.5, "tier": "l2"}"#).await,
        (
            StatusCode::OK,
            json!({"cache_salt": "user-a", "limit_gb": 1.5, "status": "ok"})
        )
    );
    for (tier, detail) in [
        ("l1", "quotas apply to tier 'l2' only, not 'l1'"),
        ("all", "quotas apply to tier 'l2' only, not 'all'"),
    ] {
        let body = format!(r#"{{"limit_gb": 1, "tier": "{tier}"}}"#);
        let (code, got) = put(&app, "/quota/user-a", &body).await;
        assert_eq!(
            (code, got["detail"].as_str()),
            (StatusCode::BAD_REQUEST, Some(detail))
        );
    }
    // Tier names are case-sensitive: 422 at the body's tier, as FastAPI's enum check.
    let (code, got) = put(&app, "/quota/user-a", r#"{"limit_gb": 1, "tier": "L2"}"#).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(got["detail"][0]["loc"], json!(["body", "tier"]));
    // Reads: l2 (explicit or default) answers; all is 400 as in 0.5.6; l1 is 400 (not tracked).
    let row = json!({"cache_salt": "user-a", "quota_limit_gb": 1.5, "quota_exists": true, "usage_gb": 0.0,
                     "effective_limit_gb": 1.5, "limit_source": "quota"});
    for uri in ["/quota/user-a", "/quota/user-a?tier=l2"] {
        assert_eq!(get(&app, uri).await, (StatusCode::OK, row.clone()));
    }
    let (code, got) = get(&app, "/quota?tier=l2").await;
    assert_eq!((code, &got["by_cache_salt"][0]), (StatusCode::OK, &row));
    for uri in ["/quota/user-a?tier=all", "/quota?tier=all"] {
        let (code, got) = get(&app, uri).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{uri}");
        assert_eq!(
            got["detail"],
            "tier 'all' has no usage accounting; only 'l1', 'l2'"
        );
    }
    for uri in ["/quota/user-a?tier=l1", "/quota?tier=l1"] {
        let (code, got) = get(&app, uri).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{uri}");
        assert!(got["detail"].as_str().unwrap().contains("L2 usage only"));
    }
    for uri in ["/quota/user-a?tier=xx", "/quota?tier=xx"] {
        let (code, got) = get(&app, uri).await;
        assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{uri}");
        assert_eq!(got["detail"][0]["loc"], json!(["query", "tier"]));
    }
    // Delete: l2 only; a refused delete removes nothing.
    let (code, got) = call(&app, "DELETE", "/quota/user-a?tier=l1", None).await;
    assert_eq!(
        (code, got["detail"].as_str()),
        (
            StatusCode::BAD_REQUEST,
            Some("quotas apply to tier 'l2' only, not 'l1'")
        )
    );
    assert_eq!(
        call(&app, "DELETE", "/quota/user-a?tier=l2", None).await,
        (
            StatusCode::OK,
            json!({"cache_salt": "user-a", "limit_gb": 0.0, "status": "removed"})
        )
    );
}

#[tokio::test]
async fn openapi_lists_exactly_the_routes_served() {
    let (app, _) = default_app();
    let (code, doc) = get(&app, "/openapi.json").await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    for &(path, method, _, _) in openapi::ROUTES {
        assert!(paths[path].get(method).is_some(), "{method} {path}");
        // Every listed route is served: never axum's bare 404/405 (an empty body).
        let uri = path
            .replace("{instance_id}", "nobody")
            .replace("{request_id}", "r1")
            .replace("{cache_salt}", "user-a");
        let (code, body) = call(&app, &method.to_uppercase(), &uri, Some("{}")).await;
        assert_ne!(code, StatusCode::METHOD_NOT_ALLOWED, "{method} {uri}");
        if code == StatusCode::NOT_FOUND {
            assert_ne!(body["detail"], "Not Found", "{method} {uri}: unrouted");
        }
    }
    // A route not listed is not served (0.5.3's event route): the one 404 of every service.
    let (code, body) = post(&app, "/directory/events", "{}").await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert_eq!(
        (&body["detail"], &body["reason"]),
        (&json!("Not Found"), &json!("not_found"))
    );
}

/// The bench client's request of LMCache's research run: `[1] + [9906] × 64`, chunk 16 → 4
/// chunks; its first key (token_key_vectors.json, `cs16_seq1_bench`).
fn bench_tokens() -> Vec<u32> {
    let mut t = vec![1];
    t.extend(std::iter::repeat_n(9906, 64));
    t
}
const BENCH_KEY0: &str = "9e735f593b5ffb1be4963a5414c9697b0138f34f6738c58fc8b0239dc263a607";

fn app_chunk16() -> (Router, driver::Handle) {
    app(&config_with(16, Duration::from_secs(2)))
}

fn pin_body(tokens: &[u32], salt: &str, world: i64) -> String {
    json!({"model_name": "test-model", "world_size": world, "token_ids": tokens, "cache_salt": salt})
        .to_string()
}

#[tokio::test]
async fn pins_resolve_tokens_count_and_list() {
    let (app, handle) = app_chunk16();
    let tokens = bench_tokens();
    assert_eq!(
        post(&app, "/cache/pins", &pin_body(&tokens, "", 1)).await,
        (
            StatusCode::OK,
            json!({"requested": 4, "affected": 4, "status": "pinned"})
        )
    );
    // World size 2: one key per rank; the chunk hash ignores the salt.
    assert_eq!(
        post(&app, "/cache/pins", &pin_body(&tokens[..16], "t", 2)).await,
        (
            StatusCode::OK,
            json!({"requested": 1, "affected": 2, "status": "pinned"})
        )
    );
    post(&app, "/cache/pins", &pin_body(&tokens[..16], "", 1)).await;
    let (code, got) = get(&app, "/cache/pins").await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(got["total"], 6);
    assert_eq!(
        got["pins"][0],
        json!({"key": {"chunk_hash_hex": BENCH_KEY0, "model_name": "test-model",
                       "kv_rank": 16777472, "object_group_id": 0, "cache_salt": ""},
               "pin_count": 2})
    );
    let (_, got) = get(&app, "/cache/pins?cache_salt=t&limit=1&offset=1").await;
    assert_eq!(got["total"], 2);
    assert_eq!(got["pins"][0]["key"]["kv_rank"], 33620481);
    assert_eq!(
        get(&app, "/cache/pins?model_name=other").await.1,
        json!({"total": 0, "pins": []})
    );
    // Under one chunk: nothing pinned.
    assert_eq!(
        post(&app, "/cache/pins", &pin_body(&tokens[..15], "", 1))
            .await
            .1,
        json!({"requested": 0, "affected": 0, "status": "pinned"})
    );
    // Unpin: counted down; at zero the key leaves.
    assert_eq!(
        call(
            &app,
            "DELETE",
            "/cache/pins",
            Some(&pin_body(&tokens, "", 1))
        )
        .await,
        (
            StatusCode::OK,
            json!({"requested": 4, "affected": 4, "status": "unpinned"})
        )
    );
    assert_eq!(handle.with(|m, _, _| m.pins.len()).await.unwrap(), 3);
    // Codes.
    for (body, code) in [
        (pin_body(&tokens, "", 0), StatusCode::UNPROCESSABLE_ENTITY),
        (pin_body(&tokens, "", 256), StatusCode::UNPROCESSABLE_ENTITY),
        (pin_body(&tokens, "a/b", 1), StatusCode::BAD_REQUEST),
        (
            r#"{"world_size": 1}"#.to_owned(),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            r#"{"model_name": "m", "world_size": 1, "token_ids": [-1]}"#.to_owned(),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ] {
        for method in ["POST", "DELETE"] {
            assert_eq!(
                call(&app, method, "/cache/pins", Some(&body)).await.0,
                code,
                "{method} {body}"
            );
        }
    }
    let model_at = r#"{"model_name": "a@b", "world_size": 1, "token_ids": []}"#;
    assert_eq!(
        post(&app, "/cache/pins", model_at).await.0,
        StatusCode::BAD_REQUEST
    );
    for q in ["limit=0", "limit=10001", "offset=-1", "limit=x"] {
        let (code, _) = get(&app, &format!("/cache/pins?{q}")).await;
        assert!(code.is_client_error(), "{q}: {code}");
    }
    assert_eq!(handle.with(|m, _, _| m.pins.len()).await.unwrap(), 3);
}

/// A fake MP server answering `DELETE /cache/objects` with `status`, recording the bodies.
async fn fake_mp(
    status: u16,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
) {
    use axum::routing::delete;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let rec = seen.clone();
    let app = Router::new().route(
        "/cache/objects",
        delete(move |axum::Json(body): axum::Json<Value>| {
            let rec = rec.clone();
            async move {
                let n = body["keys"].as_array().map_or(0, Vec::len);
                rec.lock().unwrap().push(body);
                (
                    StatusCode::from_u16(status).unwrap(),
                    axum::Json(json!({"deleted": n, "skipped": 1})),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, seen)
}

fn delete_body(id: &str, tokens: &[u32], tier: &str, force: bool) -> String {
    json!({"instance_id": id, "model_name": "test-model", "world_size": 1,
           "token_ids": tokens, "tier": tier, "force": force})
    .to_string()
}

#[tokio::test]
async fn cache_delete_holds_back_pinned_keys_unless_forced() {
    let (app, handle) = app_chunk16();
    let (addr, seen) = fake_mp(200).await;
    register(&app, "mp-a", addr.port()).await;
    let tokens = bench_tokens();
    // Pin the first chunk.
    post(&app, "/cache/pins", &pin_body(&tokens[..16], "", 1)).await;
    // tier all, not forced: the pinned key is held back (skipped), 3 sent.
    assert_eq!(
        post(
            &app,
            "/cache/delete",
            &delete_body("mp-a", &tokens, "all", false)
        )
        .await,
        (
            StatusCode::OK,
            json!({"instance_id": "mp-a", "requested": 4, "affected": 3, "skipped": 2, "status": "deleted"})
        )
    );
    {
        let seen = seen.lock().unwrap();
        assert_eq!(
            (seen[0]["tier"].as_str(), seen[0]["force"].as_bool()),
            (Some("all"), Some(false))
        );
        let sent: Vec<_> = seen[0]["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["chunk_hash_hex"].clone())
            .collect();
        assert_eq!(sent.len(), 3);
        assert!(!sent.contains(&json!(BENCH_KEY0)));
    }
    // tier l1 ignores L2 pins: all 4 sent.
    let (_, got) = post(
        &app,
        "/cache/delete",
        &delete_body("mp-a", &tokens, "l1", false),
    )
    .await;
    assert_eq!(got["affected"], 4);
    // force: all sent, and the pin is gone.
    let (_, got) = post(
        &app,
        "/cache/delete",
        &delete_body("mp-a", &tokens, "l2", true),
    )
    .await;
    assert_eq!(
        (got["affected"].clone(), got["skipped"].clone()),
        (json!(4), json!(1))
    );
    assert_eq!(seen.lock().unwrap()[2]["force"], true);
    assert_eq!(handle.with(|m, _, _| m.pins.len()).await.unwrap(), 0);
    // Under one chunk: noop, nothing sent.
    assert_eq!(
        post(
            &app,
            "/cache/delete",
            &delete_body("mp-a", &tokens[..3], "all", false)
        )
        .await
        .1,
        json!({"instance_id": "mp-a", "requested": 0, "affected": 0, "skipped": 0, "status": "noop"})
    );
    assert_eq!(seen.lock().unwrap().len(), 3);
    // Codes: unknown instance 404, bad tier / world size 422, bad salt 400.
    let (code, got) = post(
        &app,
        "/cache/delete",
        &delete_body("nobody", &tokens, "all", false),
    )
    .await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert!(got["detail"].as_str().unwrap().contains("nobody"));
    let (code, _) = post(
        &app,
        "/cache/delete",
        &delete_body("mp-a", &tokens, "L2", false),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY);
    let bad_salt = json!({"instance_id": "mp-a", "model_name": "m", "world_size": 1, "token_ids": tokens, "cache_salt": "a@b"}).to_string();
    assert_eq!(
        post(&app, "/cache/delete", &bad_salt).await.0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(seen.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn cache_delete_is_502_when_the_server_fails_or_is_gone() {
    let (app, _) = app_chunk16();
    let (addr, _) = fake_mp(500).await;
    register(&app, "mp-err", addr.port()).await;
    let tokens = bench_tokens();
    let (code, got) = post(
        &app,
        "/cache/delete",
        &delete_body("mp-err", &tokens, "all", false),
    )
    .await;
    assert_eq!(code, StatusCode::BAD_GATEWAY);
    assert!(
        got["detail"].as_str().unwrap().contains("status 500"),
        "{got}"
    );
    // A port nobody listens on.
    let free = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    register(&app, "mp-gone", port).await;
    let (code, _) = post(
        &app,
        "/cache/delete",
        &delete_body("mp-gone", &tokens, "all", false),
    )
    .await;
    assert_eq!(code, StatusCode::BAD_GATEWAY);
}

#[tokio::test]
async fn a_missing_field_is_named_in_loc() {
    let (app, _) = default_app();
    let (code, got) = post(&app, "/instances", r#"{"http_port": 8080}"#).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(got["detail"][0]["loc"], json!(["body", "ip"]));
    // Nested: the path to the object, then the field.
    let body = r#"{"batches": [{"instance_id": "a", "seq": 1, "event_type": "store", "tier": "l2", "backend": "fs", "entries": [{"size_bytes": 1}]}]}"#;
    let (code, got) = post(&app, "/events", body).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{got}");
    assert_eq!(
        got["detail"][0]["loc"],
        json!(["body", "batches", 0, "entries", 0, "key"])
    );
}

/// `GET /instances/usage` and `GET /instances/{id}/usage` (0.5.6): bytes per compartment from
/// the events, joined to the capacities of `config` batches; 404 for an unknown id.
#[tokio::test]
async fn instance_usage_joins_event_bytes_to_declared_capacity() {
    let (app, _) = default_app();
    let (code, _) = post(
        &app,
        "/instances",
        r#"{"instance_id": "mp-a", "ip": "127.0.0.1", "http_port": 9}"#,
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    let key =
        |h: &str| json!({"chunk_hash_hex": h, "model_name": "m", "kv_rank": 0, "cache_salt": ""});
    let batch = |seq: u64, kind: &str, tier: &str, backend: &str, shared: bool, entries: Value| {
        json!({"instance_id": "mp-a", "incarnation": 7, "seq": seq, "event_type": kind,
               "tier": tier, "backend": backend, "shared": shared, "entries": entries})
    };
    let mut l1_config = batch(1, "config", "l1", "dram", false, json!([]));
    l1_config["capacity_bytes"] = json!(1000);
    l1_config["capacity_revision"] = json!(1);
    let mut nfs_config = batch(2, "config", "l2", "nfs", true, json!([]));
    nfs_config["capacity_bytes"] = json!(4000);
    nfs_config["capacity_revision"] = json!(1);
    let body = json!({"batches": [
        l1_config,
        nfs_config,
        batch(3, "store", "l1", "dram", false, json!([
            {"key": key("01"), "size_bytes": 100}, {"key": key("02"), "size_bytes": 150}])),
        batch(4, "delete", "l1", "dram", false, json!([{"key": key("02")}])),
        batch(5, "store", "l2", "nfs", true, json!([{"key": key("03"), "size_bytes": 1000}])),
        batch(6, "store", "l2", "fs", false, json!([{"key": key("04"), "size_bytes": 30}])),
    ]});
    let (code, v) = post(&app, "/events", &body.to_string()).await;
    assert_eq!((code, v["applied"].clone()), (StatusCode::OK, json!(6)));
    let dram = json!({"tier": "l1", "backend": "dram", "shared": false, "used_bytes": 100,
                      "capacity_bytes": 1000, "usage_ratio": 0.1});
    let fs = json!({"tier": "l2", "backend": "fs", "shared": false, "used_bytes": 30,
                    "capacity_bytes": 0, "usage_ratio": null});
    let mp_a = json!({"instance_id": "mp-a", "registered": true, "declared_capacity": true,
                      "modules": [dram, fs]});
    assert_eq!(
        get(&app, "/instances/mp-a/usage").await,
        (StatusCode::OK, mp_a.clone())
    );
    let shared = json!([{"tier": "l2", "backend": "nfs", "shared": true, "used_bytes": 1000,
                         "capacity_bytes": 4000, "usage_ratio": 0.25}]);
    assert_eq!(
        get(&app, "/instances/usage").await,
        (
            StatusCode::OK,
            json!({"instances": [mp_a], "shared_modules": shared.clone()})
        )
    );
    let (code, v) = get(&app, "/instances/nobody/usage").await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert_eq!(v["detail"], "unknown instance 'nobody'");
    // Deregistered: L1 bytes and the declaration go, the L2 bytes stay (registered: false).
    let (code, _) = call(&app, "DELETE", "/instances/mp-a", None).await;
    assert_eq!(code, StatusCode::NO_CONTENT);
    let left = json!({"instance_id": "mp-a", "registered": false, "declared_capacity": false,
                      "modules": [{"tier": "l2", "backend": "fs", "shared": false,
                                   "used_bytes": 30, "capacity_bytes": 0, "usage_ratio": null}]});
    assert_eq!(
        get(&app, "/instances/mp-a/usage").await,
        (StatusCode::OK, left.clone())
    );
    // The shared pool's capacity was declared by the server that left: now undeclared.
    let shared_now = json!([{"tier": "l2", "backend": "nfs", "shared": true, "used_bytes": 1000,
                             "capacity_bytes": 0, "usage_ratio": null}]);
    assert_eq!(
        get(&app, "/instances/usage").await,
        (
            StatusCode::OK,
            json!({"instances": [left], "shared_modules": shared_now})
        )
    );
}

/// `POST /cache/delete` also sends the chunks' tracked copies in other object groups (0.5.6's
/// key-directory expansion), each right after its group-0 key; `requested` stays the chunks.
#[tokio::test]
async fn cache_delete_reaches_tracked_copies_in_other_object_groups() {
    let (app, _) = app_chunk16();
    let (addr, seen) = fake_mp(200).await;
    register(&app, "mp-a", addr.port()).await;
    let copy = |group: i64| {
        json!({"key": {"chunk_hash_hex": BENCH_KEY0, "model_name": "test-model",
                       "kv_rank": 16_777_472, "object_group_id": group, "cache_salt": ""},
               "size_bytes": 10})
    };
    let body = json!({"batches": [{"instance_id": "mp-a", "incarnation": 1, "seq": 1,
        "event_type": "store", "tier": "l2", "backend": "fs", "entries": [copy(5), copy(2)]}]});
    let (code, _) = post(&app, "/events", &body.to_string()).await;
    assert_eq!(code, StatusCode::OK);
    let (code, got) = post(
        &app,
        "/cache/delete",
        &delete_body("mp-a", &bench_tokens(), "l1", false),
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(
        (got["requested"].clone(), got["affected"].clone()),
        (json!(4), json!(6))
    );
    let seen = seen.lock().unwrap();
    let sent: Vec<_> = seen[0]["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["chunk_hash_hex"].clone(), k["object_group_id"].clone()))
        .collect();
    assert_eq!(sent.len(), 6);
    assert_eq!(
        sent[..3],
        [
            (json!(BENCH_KEY0), json!(0)),
            (json!(BENCH_KEY0), json!(2)),
            (json!(BENCH_KEY0), json!(5))
        ]
    );
}
