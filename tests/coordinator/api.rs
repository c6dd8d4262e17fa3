//! `kvplane coordinator`: every route and code through `router(state).oneshot(..)`, prefetch
//! forwarding against a fake MP server on a real loopback port, and the real server with its
//! eviction loop dispatching `DELETE /cache/objects` to that fake server.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{Request, StatusCode};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use http_body_util::BodyExt;
use kvplane::coordinator::{self, api, driver, model, CoordinatorConfig};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

fn config() -> CoordinatorConfig {
    let mut c = CoordinatorConfig::with_defaults("127.0.0.1", 0);
    c.health_check_interval = None;
    c.eviction_check_interval = None;
    c.chunk_size = 4;
    c.max_events_per_request = 5;
    c.outbound_timeout = Duration::from_secs(2);
    c.model.max_instances = 3;
    c.resync = None;
    c
}

fn app_with(c: &CoordinatorConfig) -> Router {
    let tasks = TaskTracker::new();
    let timing = driver::Timing {
        instance_timeout: c.instance_timeout,
        health_check_interval: None,
        eviction_check_interval: None,
    };
    let handle = driver::spawn(
        model::Model::new(c.model.clone()),
        timing,
        driver::http_dispatcher(c.outbound_timeout),
        CancellationToken::new(),
        &tasks,
    );
    api::router(coordinator::api_state(c, handle))
}

async fn call(app: &Router, method: &str, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    let res = within(uri, app.clone().oneshot(req)).await.unwrap();
    let status = res.status();
    let bytes = within("body", res.into_body().collect())
        .await
        .unwrap()
        .to_bytes();
    let v = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
    };
    (status, v)
}

fn key(hash: &str, salt: &str) -> Value {
    json!({"chunk_hash_hex": hash, "model_name": "m", "kv_rank": 16777472, "object_group_id": 0, "cache_salt": salt})
}

#[tokio::test]
async fn membership_routes_and_codes() {
    let app = app_with(&config());
    let (s, v) = call(
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
        call(&app, "POST", "/instances", Some(body.clone())).await.1["re_registered"],
        false
    );
    assert_eq!(
        call(&app, "POST", "/instances", Some(body)).await.1,
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
        let (s, v) = call(&app, "POST", "/instances", Some(bad)).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(v["detail"][0]["loc"], json!(["body", field]));
    }
    let (s, v) = call(&app, "POST", "/instances", Some(json!({"http_port": 1}))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        v["detail"][0]["msg"].as_str().unwrap().contains("`ip`"),
        "{v}"
    );
    // The instance limit (3): a new id is refused, a re-registration is not.
    call(
        &app,
        "POST",
        "/instances",
        Some(json!({"instance_id": "x", "ip": "h", "http_port": 1})),
    )
    .await;
    let (s, _) = call(
        &app,
        "POST",
        "/instances",
        Some(json!({"instance_id": "y", "ip": "h", "http_port": 1})),
    )
    .await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    // Heartbeat: 200 known, 404 unknown (with LMCache's "error" key).
    assert_eq!(
        call(&app, "PUT", "/instances/server-1/heartbeat", None).await,
        (StatusCode::OK, json!({"instance_id": "server-1"}))
    );
    let (s, v) = call(&app, "PUT", "/instances/nope/heartbeat", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(v["error"].as_str().unwrap().contains("re-register"));
    // List, in registration order.
    let (s, v) = call(&app, "GET", "/instances", None).await;
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
        let (s, v) = call(&app, "DELETE", "/instances/server-1", None).await;
        assert_eq!((s, v), (StatusCode::NO_CONTENT, Value::Null));
    }
    assert_eq!(
        call(&app, "PUT", "/instances/server-1/heartbeat", None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(&app, "GET", "/healthz", None).await,
        (StatusCode::OK, json!({"status": "healthy"}))
    );
}

#[tokio::test]
async fn quota_routes_and_both_event_forms() {
    let app = app_with(&config());
    assert_eq!(
        call(
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
            call(&app, "PUT", "/quota/user-a", Some(bad)).await.0,
            StatusCode::BAD_REQUEST
        );
    }
    assert_eq!(
        call(
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
        call(&app, "PUT", "/quota/user-a", Some(json!({"limit_gb": "x"})))
            .await
            .0,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(
        call(
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
        call(&app, "POST", "/quota/events", Some(legacy.clone())).await,
        (StatusCode::OK, json!({"recorded": 4}))
    );
    // A replay of seq 1 is dropped: nothing recorded, usage unchanged.
    assert_eq!(
        call(&app, "POST", "/quota/events", Some(legacy)).await.1,
        json!({"recorded": 0})
    );
    let (s, v) = call(&app, "GET", "/quota/user-a", None).await;
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
        call(&app, "POST", "/events", Some(modern)).await,
        (
            StatusCode::OK,
            json!({"applied": 2, "duplicates": 1, "stale": 1})
        )
    );
    // Per-request event limit (5) and a required `batches`.
    let many: Vec<Value> = (0..6)
        .map(|i| json!({"key": key(&format!("{i:02x}"), ""), "size_bytes": 1}))
        .collect();
    let (s, v) = call(&app, "POST", "/events", Some(json!({"batches": [{"instance_id": "mp-a", "incarnation": 7, "seq": 3, "event_type": "store", "tier": "l2", "backend": "fs", "entries": many}]}))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(v["detail"][0]["loc"], json!(["body", "batches"]));
    assert_eq!(
        call(&app, "POST", "/events", Some(json!({}))).await.0,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(
        call(
            &app,
            "POST",
            "/quota/events",
            Some(json!({"instance_id": "s", "seq": 0, "events": []}))
        )
        .await
        .0,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let (_, v) = call(&app, "GET", "/quota", None).await;
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
    let (_, b) = call(&app, "GET", "/quota/user-b", None).await;
    assert_eq!(
        (b["quota_limit_gb"].clone(), b["quota_exists"].clone()),
        (json!(0.0), json!(false))
    );
    assert_eq!(
        (b["effective_limit_gb"].clone(), b["limit_source"].clone()),
        (Value::Null, json!("exempt"))
    );
    assert_eq!(
        call(&app, "DELETE", "/quota/user-a", None).await.1["status"],
        "removed"
    );
    assert_eq!(
        call(&app, "DELETE", "/quota/user-a", None).await,
        (
            StatusCode::OK,
            json!({"cache_salt": "user-a", "limit_gb": 0.0, "status": "not_found"})
        )
    );
    let (s, text) = call(&app, "GET", "/metrics", None).await;
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

/// A fake MP server: records what it receives; `POST /cache/prefetches` answers 202 (or 503
/// for model "bad"), the poll answers completed once then 404, like 0.5.6.
#[derive(Default)]
struct FakeMp {
    seen: Mutex<Vec<(String, Value)>>,
    polled: Mutex<bool>,
}

async fn fake_mp() -> (SocketAddr, Arc<FakeMp>) {
    let state = Arc::new(FakeMp::default());
    let app = Router::new()
        .route(
            "/cache/prefetches",
            post(|State(s): State<Arc<FakeMp>>, Json(v): Json<Value>| async move {
                s.seen.lock().unwrap().push(("prefetch".into(), v.clone()));
                if v["model_name"] == "bad" {
                    return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"detail": "no layout registered"})));
                }
                (StatusCode::ACCEPTED, Json(json!({"request_id": "r1", "chunks": 2, "status": "submitted"})))
            }),
        )
        .route(
            "/cache/prefetches/{rid}",
            get(|State(s): State<Arc<FakeMp>>, Path(rid): Path<String>| async move {
                let mut polled = s.polled.lock().unwrap();
                if rid == "r1" && !*polled {
                    *polled = true;
                    return (StatusCode::OK, Json(json!({"request_id": "r1", "status": "completed", "found_keys": 2, "total_keys": 2})));
                }
                (StatusCode::NOT_FOUND, Json(json!({"detail": format!("unknown prefetch request_id='{rid}'")})))
            }),
        )
        .route(
            "/cache/objects",
            delete(|State(s): State<Arc<FakeMp>>, Json(v): Json<Value>| async move {
                s.seen.lock().unwrap().push(("delete".into(), v));
                Json(json!({"deleted": 1}))
            })
            .get(|State(s): State<Arc<FakeMp>>, Query(q): Query<BTreeMap<String, String>>| async move {
                // Two pages: "aa" and "bb" in user-r, then "cc" (the token has characters to encode).
                s.seen.lock().unwrap().push(("list".into(), json!(q)));
                let entry = |h: &str, n: u64| json!({"key": key(h, "user-r"), "size_bytes": n});
                match q.get("page_token").map(String::as_str) {
                    None => Json(json!({"adapter": "s3", "shared": true, "entries": [entry("aa", 100), entry("bb", 200)], "next_page_token": "p 2/x"})),
                    Some("p 2/x") => Json(json!({"adapter": "s3", "shared": true, "entries": [entry("cc", 300)], "next_page_token": null})),
                    Some(_) => Json(json!({"entries": [], "next_page_token": "loop"})),
                }
            }),
        )
        .with_state(Arc::clone(&state));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, state)
}

#[tokio::test]
async fn prefetch_is_forwarded_and_its_status_relayed() {
    let app = app_with(&config());
    let (mp, fake) = fake_mp().await;
    call(
        &app,
        "POST",
        "/instances",
        Some(json!({"instance_id": "s1", "ip": "127.0.0.1", "http_port": mp.port()})),
    )
    .await;
    // A port nobody listens on: 502.
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    call(
        &app,
        "POST",
        "/instances",
        Some(json!({"instance_id": "dead", "ip": "127.0.0.1", "http_port": dead.port()})),
    )
    .await;
    let submit = |id: &str, model: &str, n: u32| json!({"instance_id": id, "model_name": model, "world_size": 1, "token_ids": (0..n).collect::<Vec<_>>(), "cache_salt": "u"});
    assert_eq!(
        call(
            &app,
            "POST",
            "/cache/prefetches",
            Some(submit("s1", "m", 8))
        )
        .await,
        (
            StatusCode::OK,
            json!({"instance_id": "s1", "request_id": "r1", "chunks": 2, "status": "submitted"})
        )
    );
    let forwarded = fake.seen.lock().unwrap()[0].1.clone();
    assert_eq!(
        forwarded,
        json!({"model_name": "m", "world_size": 1, "token_ids": [0, 1, 2, 3, 4, 5, 6, 7], "cache_salt": "u"})
    );
    // Under one chunk (4 tokens here): noop, nothing sent.
    assert_eq!(
        call(
            &app,
            "POST",
            "/cache/prefetches",
            Some(submit("s1", "m", 3))
        )
        .await
        .1,
        json!({"instance_id": "s1", "request_id": "", "chunks": 0, "status": "noop"})
    );
    assert_eq!(fake.seen.lock().unwrap().len(), 1);
    assert_eq!(
        call(
            &app,
            "POST",
            "/cache/prefetches",
            Some(submit("ghost", "m", 8))
        )
        .await
        .0,
        StatusCode::NOT_FOUND
    );
    let (s, v) = call(
        &app,
        "POST",
        "/cache/prefetches",
        Some(submit("s1", "bad", 8)),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_GATEWAY);
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("no layout registered"),
        "{v}"
    );
    assert_eq!(
        call(
            &app,
            "POST",
            "/cache/prefetches",
            Some(submit("dead", "m", 8))
        )
        .await
        .0,
        StatusCode::BAD_GATEWAY
    );
    let mut bad_ws = submit("s1", "m", 8);
    bad_ws["world_size"] = json!(300);
    assert_eq!(
        call(&app, "POST", "/cache/prefetches", Some(bad_ws))
            .await
            .1["detail"][0]["loc"],
        json!(["body", "world_size"])
    );
    let mut neg = submit("s1", "m", 8);
    neg["token_ids"] = json!([-1]);
    assert_eq!(
        call(&app, "POST", "/cache/prefetches", Some(neg)).await.0,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    // Poll: relayed status and body, then the server's 404 relayed.
    let (s, v) = call(&app, "GET", "/cache/prefetches/s1/r1", None).await;
    assert_eq!(
        (s, v["status"].clone(), v["found_keys"].clone()),
        (StatusCode::OK, json!("completed"), json!(2))
    );
    let (s, v) = call(&app, "GET", "/cache/prefetches/s1/r1", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(v["detail"].as_str().unwrap().contains("unknown prefetch"));
    assert_eq!(
        call(&app, "GET", "/cache/prefetches/ghost/r1", None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(&app, "GET", "/cache/prefetches/dead/r1", None).await.0,
        StatusCode::BAD_GATEWAY
    );
}

#[tokio::test]
async fn the_server_evicts_over_quota_salts_through_a_registered_mp_server() {
    let (mp, fake) = fake_mp().await;
    let mut c = config();
    c.eviction_check_interval = Some(Duration::from_millis(50));
    // The seed's allowlist (`--default-quota-gb 0`): salts without a quota may hold nothing.
    c.default_quota_gb = Some(0.0);
    let server = within("start", coordinator::start(c)).await.unwrap();
    let base = format!("http://{}", server.addr);
    let h = server.handle.clone();
    // Register and report through the real HTTP port, with the crate's own outbound client.
    let post = |path: &'static str, v: Value| {
        let addr = server.addr;
        async move {
            let body = v.to_string();
            coordinator::outbound::call(
                "127.0.0.1",
                addr.port(),
                "POST",
                path,
                Some(body.as_bytes()),
                Duration::from_secs(2),
            )
            .await
            .unwrap()
        }
    };
    let r = within(
        "register",
        post(
            "/instances",
            json!({"instance_id": "s1", "ip": "127.0.0.1", "http_port": mp.port()}),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{base}");
    let events = json!({"instance_id": "s1", "seq": 1, "events": [
        {"type": "store", "key": key("01", "t"), "bytes": 10},
        {"type": "store", "key": key("02", "t"), "bytes": 10}]});
    assert_eq!(
        within("events", post("/quota/events", events)).await.status,
        200
    );
    // No quota for "t" and the allowlist on: both keys are dispatched to s1 in one DELETE.
    let mut deleted = Value::Null;
    for _ in 0..200 {
        if let Some((_, v)) = fake
            .seen
            .lock()
            .unwrap()
            .iter()
            .find(|(k, _)| k == "delete")
        {
            deleted = v.clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut hashes: Vec<_> = deleted["keys"]
        .as_array()
        .expect("a DELETE /cache/objects arrived")
        .iter()
        .map(|k| k["chunk_hash_hex"].as_str().unwrap().to_owned())
        .collect();
    hashes.sort();
    assert_eq!(hashes, ["01", "02"]);
    // L2, the server's primary adapter (the documented form names none: backend `default`).
    assert_eq!(deleted["tier"], "l2", "{deleted}");
    assert!(deleted.get("adapter").is_none(), "{deleted}");
    assert!(
        h.stats
            .dispatches_ok
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
    within("stop", server.stop()).await;
}

#[tokio::test]
async fn startup_resync_pages_the_first_registered_server() {
    let (mp, fake) = fake_mp().await;
    let mut c = config();
    c.resync = Some(coordinator::resync::ResyncConfig {
        poll_interval: Duration::from_millis(20),
        max_wait: Duration::from_secs(10),
        page_size: 2,
    });
    let server = within("start", coordinator::start(c)).await.unwrap();
    let h = server.handle.clone();
    // An event reports "aa" first with another size: the resync must not overwrite it.
    let body: kvplane::coordinator::events::LegacyEvents = serde_json::from_value(json!({
        "instance_id": "s1", "seq": 1,
        "events": [{"type": "store", "key": key("aa", "user-r"), "bytes": 1000}]}))
    .unwrap();
    h.admit(vec![body.into()], usize::MAX).await.unwrap();
    let port = mp.port();
    let reg = kvplane::coordinator::fleet::Registration {
        instance_id: Some("s1".into()),
        ip: "127.0.0.1".into(),
        http_port: port,
        metadata: Default::default(),
        p2p_advertised_url: String::new(),
        mq_port: 0,
    };
    h.register(reg, String::new).await.unwrap().unwrap();
    let mut usage = 0.0;
    for _ in 0..200 {
        usage = h
            .with(|m, _, _| m.quota_status("user-r").usage_gb)
            .await
            .unwrap()
            * (1u64 << 30) as f64;
        if usage == 1500.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        usage, 1500.0,
        "1000 from the event + 200 + 300 from the listing"
    );
    let lists: Vec<Value> = fake
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(k, _)| k == "list")
        .map(|(_, v)| v.clone())
        .collect();
    assert_eq!(
        lists,
        [
            json!({"tier": "l2", "page_size": "2"}),
            json!({"tier": "l2", "page_size": "2", "page_token": "p 2/x"})
        ]
    );
    assert_eq!(
        h.stats
            .resync_keys
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    within("stop", server.stop()).await;
}

#[tokio::test]
async fn bodies_over_the_limit_get_413_and_are_counted() {
    let mut c = config();
    c.http.max_body_bytes = 1024;
    let app = app_with(&c);
    let big = json!({"instance_id": "s", "seq": 1, "events": [], "pad": "x".repeat(2048)});
    assert_eq!(
        call(&app, "POST", "/quota/events", Some(big)).await.0,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    let (_, text) = call(&app, "GET", "/metrics", None).await;
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
            coordinator::outbound::call(
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
    let doc = coordinator::metadata::load(&path).unwrap().unwrap();
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
