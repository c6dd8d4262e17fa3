//! `http_bodies`: arbitrary request bodies (and query strings) through the real axum router,
//! driven with `oneshot` — the same extractors, validation and handlers as the server.
//!
//! Input: `[route: u8][flags: u8][rest]`. `route` picks one entry of
//! [`kvplane::controller::routes::operations`] (the route table's); for a POST, `rest` is the
//! body; for a GET, `rest` is the query string. `flags & 1` sends the right bearer token, `flags & 2` a wrong one. The server
//! has `--api-token` set and no workers registered.
//!
//! Properties: no panic; never a 5xx (504 needs a worker, and none is registered; /readyz is
//! 503 because no socket loop runs here); a
//! token-guarded route answers 401 unless the right token was sent; every answer to a POST has
//! a JSON body.
#![no_main]

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use http_body_util::BodyExt;
use kvplane::config::{ApiToken, ServeConfig};
use kvplane::controller::Driver;
use kvplane::controller::routes::{operations, router, Access};
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, OnceLock};
use tower::ServiceExt;

const TOKEN: &str = "fuzz-token";

struct World {
    rt: tokio::runtime::Runtime,
    app: axum::Router,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let mut config = ServeConfig::ephemeral();
        config.api_token = Some(ApiToken::new(TOKEN));
        let app = {
            let _guard = rt.enter();
            router(Arc::new(Driver::new(config, Some(1))))
        };
        World { rt, app }
    })
}

fuzz_target!(|data: &[u8]| {
    let [route, flags, rest @ ..] = data else {
        return;
    };
    let routes = operations();
    let r = &routes[usize::from(*route) % routes.len()];
    let mut req = Request::builder().method(r.method.clone());
    if r.method == Method::GET {
        let Ok(query) = std::str::from_utf8(rest) else {
            return;
        };
        req = req.uri(format!("{}?{query}", r.path));
    } else {
        req = req
            .uri(r.path)
            .header(header::CONTENT_TYPE, "application/json");
    }
    let good_token = flags & 1 != 0;
    if good_token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {TOKEN}"));
    } else if flags & 2 != 0 {
        req = req.header(header::AUTHORIZATION, "Bearer wrong");
    }
    let body = if r.method == Method::GET {
        Body::empty()
    } else {
        Body::from(rest.to_vec())
    };
    // A query string the URI parser refuses is not a request the server can receive.
    let Ok(req) = req.body(body) else { return };
    let w = world();
    let (status, bytes) = w.rt.block_on(async {
        let resp = w.app.clone().oneshot(req).await.expect("infallible");
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        (status, bytes)
    });
    // /readyz is 503 by design here: the harness runs no socket loops.
    let documented = r.path == "/readyz" && status == StatusCode::SERVICE_UNAVAILABLE;
    assert!(
        !status.is_server_error() || documented,
        "{} {} gave {status}: {}",
        r.method,
        r.path,
        String::from_utf8_lossy(&bytes)
    );
    if r.access == Access::Write && !good_token {
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "{} without the token",
            r.path
        );
    }
    if r.method == Method::POST {
        assert!(
            serde_json::from_slice::<serde_json::Value>(&bytes).is_ok(),
            "{} {status}: body is not JSON: {}",
            r.path,
            String::from_utf8_lossy(&bytes)
        );
    }
});
