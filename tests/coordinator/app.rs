//! The coordinator's router in process, for the route tests of this binary: a test
//! configuration with no timers, the router over a fresh driver, and [`call`] through
//! `oneshot` (no HTTP port). It holds no test and starts no server.

use crate::support::within;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use kvplane::coordinator::state::driver;
use kvplane::coordinator::{self, model, routes, CoordinatorConfig};
use serde_json::{json, Value};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// The defaults on 127.0.0.1, port 0, with no health, eviction or resync timer: a test
/// drives each of them itself.
pub(crate) fn quiet_config() -> CoordinatorConfig {
    let mut c = CoordinatorConfig::with_defaults("127.0.0.1", 0);
    c.health_check_interval = None;
    c.eviction_check_interval = None;
    c.resync = None;
    c
}

/// The router over a fresh driver for `c` (no timers run; outbound calls time out after
/// `c.outbound_timeout`), and the driver's handle.
pub(crate) fn app(c: &CoordinatorConfig) -> (Router, driver::Handle) {
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
        &TaskTracker::new(),
    );
    (
        routes::router(coordinator::api_state(c, handle.clone())),
        handle,
    )
}

/// [`quiet_config`] with `chunk_size` and `outbound_timeout` set.
pub(crate) fn config_with(chunk_size: usize, outbound_timeout: Duration) -> CoordinatorConfig {
    let mut c = quiet_config();
    c.chunk_size = chunk_size;
    c.outbound_timeout = outbound_timeout;
    c
}

/// One request through `oneshot`: the status and the body as JSON (`null` when empty, a JSON
/// string when not JSON).
pub(crate) async fn call(
    app: &Router,
    method: &str,
    uri: &str,
    body: Option<&str>,
) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_owned())))
        .expect("request builds");
    let res = within(uri, app.clone().oneshot(req))
        .await
        .expect("infallible");
    let status = res.status();
    let bytes = within("body", res.into_body().collect())
        .await
        .expect("body")
        .to_bytes();
    let v = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
    };
    (status, v)
}

/// `GET uri` through [`call`].
pub(crate) async fn get(app: &Router, uri: &str) -> (StatusCode, Value) {
    call(app, "GET", uri, None).await
}

/// `PUT uri` with `body` through [`call`].
pub(crate) async fn put(app: &Router, uri: &str, body: &str) -> (StatusCode, Value) {
    call(app, "PUT", uri, Some(body)).await
}

/// `POST uri` with `body` through [`call`].
pub(crate) async fn post(app: &Router, uri: &str, body: &str) -> (StatusCode, Value) {
    call(app, "POST", uri, Some(body)).await
}

/// [`call`] with a JSON body.
pub(crate) async fn call_json(
    app: &Router,
    method: &str,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    call(app, method, uri, body.map(|b| b.to_string()).as_deref()).await
}

/// Registers the MP server `id` at `127.0.0.1:port`; the coordinator must accept it.
pub(crate) async fn register(app: &Router, id: &str, port: u16) {
    let body = json!({"instance_id": id, "ip": "127.0.0.1", "http_port": port}).to_string();
    assert_eq!(
        call(app, "POST", "/instances", Some(&body)).await.0,
        StatusCode::OK
    );
}
