//! What the coordinator sends to MP servers: prefetch forwarding and its status relayed
//! against a fake MP server on a real loopback port, the real server's eviction loop
//! dispatching `DELETE /cache/objects` to it, and the startup resync paging its listing.

use crate::api::{app_with, config, key};
use crate::app::{call_json, register};
use crate::support::{eventually, within, STEP};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use kvplane::coordinator;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    register(&app, "s1", mp.port()).await;
    // A port nobody listens on: 502.
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    register(&app, "dead", dead.port()).await;
    let submit = |id: &str, model: &str, n: u32| json!({"instance_id": id, "model_name": model, "world_size": 1, "token_ids": (0..n).collect::<Vec<_>>(), "cache_salt": "u"});
    assert_eq!(
        call_json(
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
        call_json(
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
        call_json(
            &app,
            "POST",
            "/cache/prefetches",
            Some(submit("ghost", "m", 8))
        )
        .await
        .0,
        StatusCode::NOT_FOUND
    );
    let (s, v) = call_json(
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
        call_json(
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
        call_json(&app, "POST", "/cache/prefetches", Some(bad_ws))
            .await
            .1["detail"][0]["loc"],
        json!(["body", "world_size"])
    );
    let mut neg = submit("s1", "m", 8);
    neg["token_ids"] = json!([-1]);
    assert_eq!(
        call_json(&app, "POST", "/cache/prefetches", Some(neg))
            .await
            .0,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    // Poll: relayed status and body, then the server's 404 relayed.
    let (s, v) = call_json(&app, "GET", "/cache/prefetches/s1/r1", None).await;
    assert_eq!(
        (s, v["status"].clone(), v["found_keys"].clone()),
        (StatusCode::OK, json!("completed"), json!(2))
    );
    let (s, v) = call_json(&app, "GET", "/cache/prefetches/s1/r1", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(v["detail"].as_str().unwrap().contains("unknown prefetch"));
    assert_eq!(
        call_json(&app, "GET", "/cache/prefetches/ghost/r1", None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call_json(&app, "GET", "/cache/prefetches/dead/r1", None)
            .await
            .0,
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
            coordinator::state::outbound::MP
                .call(
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
    let deleted = eventually("a DELETE /cache/objects arrived", STEP, async || {
        let seen = fake.seen.lock().unwrap();
        seen.iter()
            .find(|(k, _)| k == "delete")
            .map(|(_, v)| v.clone())
    })
    .await;
    let mut hashes: Vec<_> = deleted["keys"]
        .as_array()
        .expect("keys")
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
    c.resync = Some(coordinator::state::resync::ResyncConfig {
        poll_interval: Duration::from_millis(20),
        max_wait: Duration::from_secs(10),
        page_size: 2,
    });
    let server = within("start", coordinator::start(c)).await.unwrap();
    let h = server.handle.clone();
    // An event reports "aa" first with another size: the resync must not overwrite it.
    let body: kvplane::coordinator::model::events::LegacyEvents = serde_json::from_value(json!({
        "instance_id": "s1", "seq": 1,
        "events": [{"type": "store", "key": key("aa", "user-r"), "bytes": 1000}]}))
    .unwrap();
    h.admit(vec![body.into()], usize::MAX).await.unwrap();
    let port = mp.port();
    let reg = kvplane::coordinator::model::fleet::Registration {
        instance_id: Some("s1".into()),
        ip: "127.0.0.1".into(),
        http_port: port,
        metadata: Default::default(),
        p2p_advertised_url: String::new(),
        mq_port: 0,
    };
    h.register(reg, String::new).await.unwrap().unwrap();
    // 1000 from the event + 200 + 300 from the listing.
    eventually(
        "the listing's sizes added to the event's",
        STEP,
        async || {
            let usage = h
                .with(|m, _, _| m.quota_status("user-r").usage_gb)
                .await
                .unwrap()
                * (1u64 << 30) as f64;
            if usage == 1500.0 {
                Ok(())
            } else {
                Err(format!("usage {usage} bytes"))
            }
        },
    )
    .await;
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
