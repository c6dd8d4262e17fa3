//! One HTTP stack on every service: each service (controller, indexer, coordinator, node,
//! router) started with `--api-token`, `--api-token-reads` and `--api-token-peers`, and its own
//! `/openapi.json` walked: every operation names its access class, every class that needs the
//! token refuses a request without it (and with a wrong one) with the same 401, and the routes
//! that never need it (probes, the document) answer without it. Then the same mistakes get
//! the same answer everywhere: an unknown route, a wrong method, a cross-origin POST.

use crate::support;
use kvplane::web::access::Auth;
use serde_json::Value;
use std::net::SocketAddr;
use support::http::http;
use support::node::node_with;

const TOKEN: &str = "s3cret-token";

/// Token on every class that can have one.
fn all_routes() -> Auth {
    Auth {
        reads: true,
        peers: true,
        ..Auth::token(TOKEN)
    }
}

/// Each service, started in this process with [`all_routes`]: (name, HTTP address, what
/// keeps it running).
async fn services() -> Vec<(&'static str, SocketAddr, Box<dyn std::any::Any>)> {
    let mut out: Vec<(&'static str, SocketAddr, Box<dyn std::any::Any>)> = Vec::new();
    let controller = support::server_with(|c| {
        c.api_token = all_routes().token;
        c.api_token_reads = true;
    })
    .await;
    out.push(("controller", controller.addrs.http, Box::new(controller)));

    let indexer = kvplane::indexer::start(kvplane::indexer::IndexerConfig {
        auth: all_routes(),
        ..Default::default()
    })
    .await
    .expect("indexer");
    out.push(("indexer", indexer.addr, Box::new(indexer)));

    let mut c = kvplane::coordinator::CoordinatorConfig::with_defaults("127.0.0.1", 0);
    c.resync = None;
    c.auth = all_routes();
    let coordinator = kvplane::coordinator::start(c).await.expect("coordinator");
    out.push(("coordinator", coordinator.addr, Box::new(coordinator)));

    let node = node_with(|c| {
        c.http_port = Some(0);
        c.auth = all_routes();
    })
    .await;
    let node_http = node.addrs.http.expect("the node's HTTP port");
    out.push(("node", node_http, Box::new(node)));

    let mut r = kvplane::router::RouterConfig::new("m", Vec::new());
    r.auth = all_routes();
    let router = kvplane::router::start(r).await.expect("router");
    out.push(("router", router.addr, Box::new(router)));
    out
}

/// `path` with every `{param}` filled in.
fn concrete(path: &str) -> String {
    path.split('/')
        .map(|seg| if seg.starts_with('{') { "x" } else { seg })
        .collect::<Vec<_>>()
        .join("/")
}

#[tokio::test]
async fn every_service_refuses_every_protected_route_without_the_token() {
    let services = services().await;
    for (service, addr, _keep) in &services {
        let (status, doc) = http(*addr, "GET", "/openapi.json", None, &[]).await;
        assert_eq!(status, 200, "{service}: /openapi.json needs no token");
        let paths = doc["paths"].as_object().expect("paths");
        let mut checked = 0;
        for (path, item) in paths {
            for (method, op) in item.as_object().expect("path item") {
                let method = method.to_ascii_uppercase();
                let access = op["x-kvplane-access"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{service} {method} {path}: no access class"));
                let uri = concrete(path);
                let body = (method != "GET").then_some("{}");
                let (status, answer) = http(*addr, &method, &uri, body, &[]).await;
                if access == "open" {
                    assert_ne!(status, 401, "{service} {method} {path} is open");
                    continue;
                }
                assert_eq!(
                    status, 401,
                    "{service} {method} {path} ({access}) without the token: {answer}"
                );
                assert_eq!(answer["reason"], "unauthorized", "{service} {path}");
                assert_eq!(answer["detail"], "Not authenticated", "{service} {path}");
                let wrong = [("Authorization", "Bearer nope")];
                let (status, answer) = http(*addr, &method, &uri, body, &wrong).await;
                assert_eq!(status, 401, "{service} {method} {path} with a wrong token");
                assert_eq!(answer["detail"], "Invalid token", "{service} {path}");
                assert_eq!(op["security"][0]["bearerAuth"], Value::Array(vec![]));
                checked += 1;
            }
        }
        assert!(checked >= 3, "{service}: only {checked} protected routes");
    }
}

#[tokio::test]
async fn the_same_mistake_gets_the_same_answer_on_every_service() {
    let services = services().await;
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("Authorization", bearer.as_str())];
    let mut shapes = Vec::new();
    for (service, addr, _keep) in &services {
        let (status, unknown) = http(*addr, "GET", "/no/such/route", None, &auth).await;
        assert_eq!(status, 404, "{service}");
        let (status, method) = http(*addr, "PATCH", "/openapi.json", Some("{}"), &auth).await;
        assert_eq!(status, 405, "{service}");
        let (status, cross) = http(
            *addr,
            "POST",
            "/no/such/route",
            Some("{}"),
            &[("Origin", "http://evil.example"), auth[0]],
        )
        .await;
        assert_eq!(status, 403, "{service}: a cross-origin page's POST");
        let (status, _) = http(*addr, "GET", "/healthz", None, &[]).await;
        assert_eq!(status, 200, "{service}: /healthz");
        let (status, _) = http(*addr, "GET", "/readyz", None, &[]).await;
        assert!(
            [200, 503].contains(&status),
            "{service}: /readyz answers {status} without a token"
        );
        shapes.push((*service, [unknown, method, cross]));
    }
    let (first, reference) = &shapes[0];
    for (service, answers) in &shapes {
        for (a, b) in answers.iter().zip(reference) {
            assert_eq!(a, b, "{service} and {first} answer one mistake differently");
        }
    }
    assert_eq!(reference[0]["reason"], "not_found");
    assert_eq!(reference[1]["reason"], "method_not_allowed");
    assert_eq!(reference[2]["reason"], "forbidden");
}
