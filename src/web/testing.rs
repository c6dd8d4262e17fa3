//! Test helpers for a service's routes: send one GET through a router and read what comes
//! back. Compiled for tests only; no service's behaviour depends on it.

use axum::body::Body;
use axum::http::{header, Request};
use axum::response::Response;
use axum::Router;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

/// `GET uri` with `headers` through `app`.
pub async fn get_req(app: Router, uri: &str, headers: &[(&str, &str)]) -> Response {
    let mut req = Request::get(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    app.oneshot(req.body(Body::empty()).expect("request"))
        .await
        .expect("infallible")
}

/// The whole body.
pub async fn body_bytes(resp: Response) -> Vec<u8> {
    resp.into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
        .to_vec()
}

/// The body as JSON.
pub async fn json(resp: Response) -> Value {
    serde_json::from_slice(&body_bytes(resp).await).expect("JSON body")
}

/// The `Content-Type`, empty when there is none.
pub fn ctype(resp: &Response) -> &str {
    resp.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// Polls `check` until it holds, panicking after 10 s (a bound, not a timing: what is awaited
/// happens on another task).
pub async fn until(check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the condition never held"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}
