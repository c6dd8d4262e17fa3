//! `kvplane coordinator`: the membership and quota routes with every code through
//! `router(state).oneshot(..)`, the body limit, and quotas and pins across a restart of the
//! real server. What the coordinator sends to MP servers is in `forwarding.rs`; the router
//! harness in `app.rs`.

use crate::app::{app, call_json, config_with};
use crate::support::within;
use axum::http::StatusCode;
use axum::Router;
use kvplane::coordinator::{self, CoordinatorConfig};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;

pub(crate) fn config() -> CoordinatorConfig {
    let mut c = config_with(4, Duration::from_secs(2));
    c.max_events_per_request = 5;
    c.model.max_instances = 3;
    c
}

pub(crate) fn app_with(c: &CoordinatorConfig) -> Router {
    app(c).0
}

pub(crate) fn key(hash: &str, salt: &str) -> Value {
    json!({"chunk_hash_hex": hash, "model_name": "m", "kv_rank": 16777472, "object_group_id": 0, "cache_salt": salt})
}

#[tokio::test]
async fn membership_routes_and_codes() {
    let app = app_with(&config());
    let (s, v) = call_json(
        &app,
        "POST",
        "/instances",
        Some(json!({"ip": "10.0.0.5", "http_port": 8080})),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let generated = v["instance_id"].as_str().unwrap().to_owned();
    assert!(
        generated.starts_with("mp-") && generated.len() == 35,
        "{generated}"
    );
    assert_eq!(v["re_registered"], false);
    let body = json!({"instance_id": "server-1", "ip": "127.0.0.1", "http_port": 18080, "metadata": {"a": "b"}, "p2p_advertised_url": "", "mq_port": 0});
    assert_eq!(
        call_json(&app, "POST", "/instances", Some(body.clone()))
            .await
            .1["re_registered"],
        false
    );
    assert_eq!(
        call_json(&app, "POST", "/instances", Some(body)).await.1,
        json!({"instance_id": "server-1", "re_registered": true})
    );
    // Field-level validation names the field.
    for (bad, field) in [
        (json!({"ip": " ", "http_port": 1}), "ip"),
        (json!({"ip": "h", "http_port": 0}), "http_port"),
        (json!({"ip": "h", "http_port": 70000}), "http_port"),
        (json!({"ip": "h", "http_port": 1, "mq_port": -1}), "mq_port"),
        (
            json!({"ip": "h", "http_port": 1, "instance_id": "a/b"}),
            "instance_id",
        ),
    ] {
        let (s, v) = call_json(&app, "POST", "/instances", Some(bad)).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(v["detail"][0]["loc"], json!(["body", field]));
    }
    let (s, v) = call_json(&app, "POST", "/instances", Some(json!({"http_port": 1}))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        v["detail"][0]["msg"].as_str().unwrap().contains("`ip`"),
        "{v}"
    );
    // The instance limit (3): a new id is refused, a re-registration is not.
    call_json(
        &app,
        "POST",
        "/instances",
        Some(json!({"instance_id": "x", "ip": "h", "http_port": 1})),
    )
    .await;
    let (s, _) = call_json(
        &app,
        "POST",
        "/instances",
        Some(json!({"instance_id": "y", "ip": "h", "http_port": 1})),
    )
    .await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    // Heartbeat: 200 known, 404 unknown (with LMCache's "error" key).
    assert_eq!(
        call_json(&app, "PUT", "/instances/server-1/heartbeat", None).await,
        (StatusCode::OK, json!({"instance_id": "server-1"}))
    );
    let (s, v) = call_json(&app, "PUT", "/instances/nope/heartbeat", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(v["error"].as_str().unwrap().contains("re-register"));
    // List, in registration order.
    let (s, v) = call_json(&app, "GET", "/instances", None).await;
    assert_eq!(s, StatusCode::OK);
    let ids: Vec<_> = v["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["instance_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [generated.as_str(), "server-1", "x"]);
    let one = &v["instances"][1];
    assert_eq!(
        (
            one["ip"].clone(),
            one["http_port"].clone(),
            one["metadata"].clone()
        ),
        (json!("127.0.0.1"), json!(18080), json!({"a": "b"}))
    );
    assert!(one["registration_time"].as_f64().unwrap() > 1.0e9);
    // Delete is idempotent: 204 twice, then gone.
    for _ in 0..2 {
        let (s, v) = call_json(&app, "DELETE", "/instances/server-1", None).await;
        assert_eq!((s, v), (StatusCode::NO_CONTENT, Value::Null));
    }
    assert_eq!(
        call_json(&app, "PUT", "/instances/server-1/heartbeat", None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call_json(&app, "GET", "/healthz", None).await,
        (StatusCode::OK, json!({"status": "healthy"}))
    );
}

#[tokio::test]
async fn quota_routes_and_both_event_forms() {
    let app = app_with(&config());
    assert_eq!(
        call_json(
            &app,
            "PUT",
            "/quota/user-a",
            Some(json!({"limit_gb": 10.0}))
        )
        .await,
        (
            StatusCode::OK,
            json!({"cache_salt": "user-a", "limit_gb": 10.0, "status": "ok"})
        )
    );
    for bad in [json!({"limit_gb": -1.0}), json!({"limit_gb": 1e300})] {
        assert_eq!(
            call_json(&app, "PUT", "/quota/user-a", Some(bad)).await.0,
            StatusCode::BAD_REQUEST
        );
    }
    assert_eq!(
        call_json(
            &app,
            "PUT",
            "/quota/user-a",
            Some(json!({"limit_gb": 1, "tier": "l1"}))
        )
        .await
        .0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        call_json(&app, "PUT", "/quota/user-a", Some(json!({"limit_gb": "x"})))
            .await
            .0,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(
        call_json(
            &app,
            "PUT",
            "/quota/_default",
            Some(json!({"limit_gb": 0.5}))
        )
        .await
        .1["cache_salt"],
        ""
    );
    // The documented form: store, lookup, delete of one key, then a store that stays.
    let legacy = json!({"instance_id": "server-1", "seq": 1, "events": [
        {"type": "store", "key": key("aa", "user-a"), "bytes": 1024},
        {"type": "lookup", "key": key("aa", "user-a"), "bytes": 0},
        {"type": "delete", "key": key("aa", "user-a"), "bytes": 0},
        {"type": "store", "key": key("bb", "user-a"), "bytes": 1 << 20}]});
    assert_eq!(
        call_json(&app, "POST", "/quota/events", Some(legacy.clone())).await,
        (StatusCode::OK, json!({"recorded": 4}))
    );
    // A replay of seq 1 is dropped: nothing recorded, usage unchanged.
    assert_eq!(
        call_json(&app, "POST", "/quota/events", Some(legacy))
            .await
            .1,
        json!({"recorded": 0})
    );
    let (s, v) = call_json(&app, "GET", "/quota/user-a", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        v,
        json!({"cache_salt": "user-a", "quota_limit_gb": 10.0, "quota_exists": true, "usage_gb": 1.0 / 1024.0,
               "effective_limit_gb": 10.0, "limit_source": "quota"})
    );
    // The 0.5.6 form, as a real MP server posts it (config batch, then stores; unknown fields).
    let modern = json!({"batches": [
        {"instance_id": "mp-a", "incarnation": 7, "seq": 1, "event_type": "config", "tier": "l1", "backend": "dram", "entries": [], "shared": false, "ts": 1.0, "capacity_bytes": 1, "capacity_revision": 1},
        {"instance_id": "mp-a", "incarnation": 7, "seq": 2, "event_type": "store", "tier": "l2", "backend": "fs", "entries": [
            {"key": key("cc", "user-b"), "size_bytes": 2048, "token_ids": [1, 2], "token_offset": 0}]},
        {"instance_id": "mp-a", "incarnation": 6, "seq": 9, "event_type": "store", "tier": "l2", "backend": "fs", "entries": []},
        {"instance_id": "mp-a", "incarnation": 7, "seq": 2, "event_type": "store", "tier": "l2", "backend": "fs", "entries": []}]});
    assert_eq!(
        call_json(&app, "POST", "/events", Some(modern)).await,
        (
            StatusCode::OK,
            json!({"applied": 2, "duplicates": 1, "stale": 1})
        )
    );
    // Per-request event limit (5) and a required `batches`.
    let many: Vec<Value> = (0..6)
        .map(|i| json!({"key": key(&format!("{i:02x}"), ""), "size_bytes": 1}))
        .collect();
    let (s, v) = call_json(&app, "POST", "/events", Some(json!({"batches": [{"instance_id": "mp-a", "incarnation": 7, "seq": 3, "event_type": "store", "tier": "l2", "backend": "fs", "entries": many}]}))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(v["detail"][0]["loc"], json!(["body", "batches"]));
    assert_eq!(
        call_json(&app, "POST", "/events", Some(json!({}))).await.0,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(
        call_json(
            &app,
            "POST",
            "/quota/events",
            Some(json!({"instance_id": "s", "seq": 0, "events": []}))
        )
        .await
        .0,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let (_, v) = call_json(&app, "GET", "/quota", None).await;
    let salts: Vec<_> = v["by_cache_salt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["cache_salt"].as_str().unwrap())
        .collect();
    assert_eq!(salts, ["", "user-a", "user-b"]);
    assert_eq!(
        v["total_gb"].as_f64().unwrap(),
        ((1 << 20) + 2048) as f64 / (1u64 << 30) as f64
    );
    // No quota and the boot default (null): limit 0 / no quota as 0.5.6 reads, and exempt.
    let (_, b) = call_json(&app, "GET", "/quota/user-b", None).await;
    assert_eq!(
        (b["quota_limit_gb"].clone(), b["quota_exists"].clone()),
        (json!(0.0), json!(false))
    );
    assert_eq!(
        (b["effective_limit_gb"].clone(), b["limit_source"].clone()),
        (Value::Null, json!("exempt"))
    );
    assert_eq!(
        call_json(&app, "DELETE", "/quota/user-a", None).await.1["status"],
        "removed"
    );
    assert_eq!(
        call_json(&app, "DELETE", "/quota/user-a", None).await,
        (
            StatusCode::OK,
            json!({"cache_salt": "user-a", "limit_gb": 0.0, "status": "not_found"})
        )
    );
    let (s, text) = call_json(&app, "GET", "/metrics", None).await;
    assert_eq!(s, StatusCode::OK);
    let text = text.as_str().unwrap();
    assert!(
        text.contains("kvplane_coordinator_batches_duplicate_total 2"),
        "{text}"
    );
    assert!(text.contains("kvplane_coordinator_batches_stale_total 1"));
    assert!(text.contains("kvplane_coordinator_refused_events_per_request_total 1"));
    assert!(text.contains("kvplane_coordinator_usage_bytes{cache_salt=\"user-b\"} 2048"));
}

#[tokio::test]
async fn bodies_over_the_limit_get_413_and_are_counted() {
    let mut c = config();
    c.http.max_body_bytes = 1024;
    let app = app_with(&c);
    let big = json!({"instance_id": "s", "seq": 1, "events": [], "pad": "x".repeat(2048)});
    assert_eq!(
        call_json(&app, "POST", "/quota/events", Some(big)).await.0,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    let (_, text) = call_json(&app, "GET", "/metrics", None).await;
    assert!(text
        .as_str()
        .unwrap()
        .contains("kvplane_coordinator_refused_body_bytes_total 1"));
}

/// `--metadata-path`: quotas, the default quota and pins written after each change survive a
/// restart of the real server; a malformed file is ignored (the server still starts).
#[tokio::test]
async fn quotas_and_pins_survive_a_restart_with_a_metadata_path() {
    let dir = std::env::temp_dir().join(format!("kvplane-coord-meta-{}", rand::random::<u64>()));
    let path = dir.join("meta.json");
    let mut c = config();
    c.metadata_path = Some(path.clone());
    let req = |addr: SocketAddr, method: &'static str, uri: String, body: Option<Value>| async move {
        let body = body.map(|b| b.to_string());
        let r = within(
            "request",
            coordinator::state::outbound::MP.call(
                "127.0.0.1",
                addr.port(),
                method,
                &uri,
                body.as_deref().map(str::as_bytes),
                Duration::from_secs(5),
            ),
        )
        .await
        .unwrap();
        let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
        (r.status, v)
    };
    let pin = json!({"model_name": "m", "world_size": 1, "token_ids": [1, 2, 3, 4, 5, 6, 7, 8]});
    let first = within("start", coordinator::start(c.clone()))
        .await
        .unwrap();
    let a = first.addr;
    assert_eq!(
        req(
            a,
            "PUT",
            "/quota/user-a".into(),
            Some(json!({"limit_gb": 2.0}))
        )
        .await
        .0,
        200
    );
    assert_eq!(
        req(
            a,
            "PUT",
            "/quota/gone".into(),
            Some(json!({"limit_gb": 1.0}))
        )
        .await
        .0,
        200
    );
    assert_eq!(req(a, "DELETE", "/quota/gone".into(), None).await.0, 200);
    let body = Some(json!({"default_limit_gb": 0.5}));
    assert_eq!(req(a, "PUT", "/quota/config".into(), body).await.0, 200);
    assert_eq!(
        req(a, "POST", "/cache/pins".into(), Some(pin.clone()))
            .await
            .0,
        200
    );
    assert_eq!(
        req(a, "POST", "/cache/pins".into(), Some(pin.clone()))
            .await
            .0,
        200
    );
    let (_, pins_before) = req(a, "GET", "/cache/pins".into(), None).await;
    assert_eq!(pins_before["total"], 2);
    first.stop().await;

    let second = within("restart", coordinator::start(c.clone()))
        .await
        .unwrap();
    let b = second.addr;
    let (code, q) = req(b, "GET", "/quota".into(), None).await;
    assert_eq!(code, 200);
    let salts: Vec<_> = q["by_cache_salt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["cache_salt"].clone(), r["quota_limit_gb"].clone()))
        .collect();
    assert_eq!(salts, [(json!("user-a"), json!(2.0))]);
    assert_eq!(
        req(b, "GET", "/quota/config".into(), None).await.1,
        json!({"default_limit_gb": 0.5})
    );
    assert_eq!(
        req(b, "GET", "/cache/pins".into(), None).await.1,
        pins_before
    );
    // One unpin: each key keeps one pin after the next restart.
    assert_eq!(
        req(b, "DELETE", "/cache/pins".into(), Some(pin)).await.0,
        200
    );
    second.stop().await;
    let doc = coordinator::state::metadata::load(&path).unwrap().unwrap();
    assert_eq!(doc.pins.len(), 2);
    assert!(doc.pins.iter().all(|p| p.pin_count == 1));

    std::fs::write(&path, b"not json").unwrap();
    let third = within("start on a bad file", coordinator::start(c))
        .await
        .unwrap();
    let (_, q) = req(third.addr, "GET", "/quota".into(), None).await;
    assert_eq!(q["by_cache_salt"], json!([]));
    third.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
}
