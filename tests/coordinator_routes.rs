//! The 0.5.6 routes added beside the documented ones: the default quota (`/quota/config`), the
//! `tier` query parameter of the quota routes, and `/openapi.json` — every code, through
//! `router(state).oneshot`, with the bodies LMCache 0.5.6 answers (its probe is in
//! /work/shared/spec/mp-coordinator/coordinator_probe_0.5.6.txt).

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use kvplane::coordinator::{self, api, driver, model, openapi, CoordinatorConfig};
use serde_json::{json, Value};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

fn app() -> (Router, driver::Handle) {
    let mut c = CoordinatorConfig::with_defaults("127.0.0.1", 0);
    c.resync = None;
    let timing = driver::Timing {
        instance_timeout: c.instance_timeout,
        health_check_interval: None,
        eviction_check_interval: None,
    };
    let handle = driver::spawn(
        model::Model::new(c.model.clone()),
        timing,
        driver::http_dispatcher(Duration::from_secs(1)),
        CancellationToken::new(),
        &TaskTracker::new(),
    );
    (
        api::router(coordinator::api_state(&c, handle.clone())),
        handle,
    )
}

async fn call(app: &Router, method: &str, uri: &str, body: Option<&str>) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_owned())))
        .unwrap();
    let res = tokio::time::timeout(Duration::from_secs(10), app.clone().oneshot(req))
        .await
        .expect("answered")
        .unwrap();
    let status = res.status();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, v)
}

#[tokio::test]
async fn quota_config_sets_reads_and_validates_the_default() {
    let (app, handle) = app();
    // Boot: the document's allowlist, 0 GiB (0.5.6 boots with null = exempt).
    assert_eq!(
        call(&app, "GET", "/quota/config", None).await,
        (StatusCode::OK, json!({"default_limit_gb": 0.0}))
    );
    assert_eq!(
        call(
            &app,
            "PUT",
            "/quota/config",
            Some(r#"{"default_limit_gb": 2.5}"#)
        )
        .await,
        (StatusCode::OK, json!({"default_limit_gb": 2.5}))
    );
    assert_eq!(
        call(&app, "GET", "/quota/config?tier=l2", None).await,
        (StatusCode::OK, json!({"default_limit_gb": 2.5}))
    );
    assert_eq!(
        handle.with(|m, _, _| m.default_limit_gb()).await.unwrap(),
        Some(2.5)
    );
    // {} and null both exempt salts without a quota, as in 0.5.6.
    for body in [r#"{"default_limit_gb": null}"#, "{}"] {
        assert_eq!(
            call(&app, "PUT", "/quota/config", Some(body)).await,
            (StatusCode::OK, json!({"default_limit_gb": null}))
        );
    }
    assert_eq!(
        call(&app, "GET", "/quota/config", None).await.1,
        json!({"default_limit_gb": null})
    );
    // Codes.
    let (code, body) = call(
        &app,
        "PUT",
        "/quota/config",
        Some(r#"{"default_limit_gb": -1}"#),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        body["detail"][0]["loc"],
        json!(["body", "default_limit_gb"])
    );
    let (code, body) = call(
        &app,
        "PUT",
        "/quota/config",
        Some(r#"{"default_limit_gb": 1, "tier": "l1"}"#),
    )
    .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(body["detail"], "quotas apply to tier 'l2' only, not 'l1'");
    let (code, body) = call(
        &app,
        "PUT",
        "/quota/config",
        Some(r#"{"default_limit_gb": 1e300}"#),
    )
    .await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{body}");
    let (code, body) = call(
        &app,
        "PUT",
        "/quota/config",
        Some(r#"{"default_limit_gb": "x"}"#),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (code, body) = call(&app, "GET", "/quota/config?tier=l1", None).await;
    assert_eq!(
        (code, body["detail"].as_str()),
        (
            StatusCode::BAD_REQUEST,
            Some("quotas apply to tier 'l2' only, not 'l1'")
        )
    );
    let (code, body) = call(&app, "GET", "/quota/config?tier=xx", None).await;
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
    let (app, _) = app();
    assert_eq!(
        call(
            &app,
            "PUT",
            "/quota/user-a",
            Some(r#"{"limit_gb": 1.5, "tier": "l2"}"#)
        )
        .await,
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
        let (code, got) = call(&app, "PUT", "/quota/user-a", Some(&body)).await;
        assert_eq!(
            (code, got["detail"].as_str()),
            (StatusCode::BAD_REQUEST, Some(detail))
        );
    }
    // Tier names are case-sensitive: 422 at the body's tier, as FastAPI's enum check.
    let (code, got) = call(
        &app,
        "PUT",
        "/quota/user-a",
        Some(r#"{"limit_gb": 1, "tier": "L2"}"#),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(got["detail"][0]["loc"], json!(["body", "tier"]));
    // Reads: l2 (explicit or default) answers; all is 400 as in 0.5.6; l1 is 400 (not tracked).
    let row = json!({"cache_salt": "user-a", "quota_limit_gb": 1.5, "quota_exists": true, "usage_gb": 0.0});
    for uri in ["/quota/user-a", "/quota/user-a?tier=l2"] {
        assert_eq!(
            call(&app, "GET", uri, None).await,
            (StatusCode::OK, row.clone())
        );
    }
    let (code, got) = call(&app, "GET", "/quota?tier=l2", None).await;
    assert_eq!((code, &got["by_cache_salt"][0]), (StatusCode::OK, &row));
    for uri in ["/quota/user-a?tier=all", "/quota?tier=all"] {
        let (code, got) = call(&app, "GET", uri, None).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{uri}");
        assert_eq!(
            got["detail"],
            "tier 'all' has no usage accounting; only 'l1', 'l2'"
        );
    }
    for uri in ["/quota/user-a?tier=l1", "/quota?tier=l1"] {
        let (code, got) = call(&app, "GET", uri, None).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{uri}");
        assert!(got["detail"].as_str().unwrap().contains("L2 usage only"));
    }
    for uri in ["/quota/user-a?tier=xx", "/quota?tier=xx"] {
        let (code, got) = call(&app, "GET", uri, None).await;
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
    let (app, _) = app();
    let (code, doc) = call(&app, "GET", "/openapi.json", None).await;
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
            assert!(body.get("detail").is_some(), "{method} {uri}: unrouted");
        }
    }
    // A route not listed is not served.
    let (code, body) = call(&app, "GET", "/directory/stats", None).await;
    assert_eq!((code, body), (StatusCode::NOT_FOUND, Value::Null));
}
