//! One route table per service: each route is written once — method, path, access class,
//! summary, the body it reads, its answers, its handler — and the service's axum router, its
//! access [`Policy`] and its `/openapi.json` are all derived from that one table, so they
//! cannot drift apart and a path is spelled in one place.
//!
//! ```ignore
//! Routes::new("coordinator", "kvplane coordinator")
//!     .health(|| async { "ok" })
//!     .route(post("/cache/pins", Access::Write, "Pin keys")
//!         .body::<PinBody>()
//!         .answers(&[(200, "Pinned"), (404, "Unknown key"), (422, "Bad body")])
//!         .to(cache::pin))
//!     .into_router(&auth)
//! ```
//!
//! A body's schema comes from the type the handler reads ([`Documented`]; every
//! [`crate::web::schema::Body`] is documented by its table). Probes and the document come from
//! here in one shape for every service: [`Routes::health`] and [`Routes::ready`] (`Open`),
//! [`Routes::metrics`] (`Read`), and `GET /openapi.json` (`Open`), added by
//! [`Routes::into_router`]. Routes kept out of the document (the dashboards' static files) are
//! [`Routes::undocumented`], still classed for the policy.
//!
//! Knows no service.

use super::access::{Access, Auth, Policy};
use super::json::ErrorStyle;
use super::openapi::{self, Operation};
use axum::extract::Request;
use axum::handler::Handler;
use axum::http::Method;
use axum::middleware::{from_fn, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::{Json, Router};
use serde_json::Value;
use std::sync::Arc;

/// A request body type that can say its JSON schema (the OpenAPI document's `requestBody`).
pub trait Documented {
    /// The schema.
    fn schema() -> Value;
}

impl<T: super::schema::Body> Documented for T {
    fn schema() -> Value {
        super::schema::body_schema(&T::SPEC)
    }
}

/// A route being declared: its operation, before its handler is given ([`Spec::to`]).
#[must_use]
pub struct Spec {
    op: Operation,
    style: Option<ErrorStyle>,
}

/// `GET path`.
pub fn get(path: &'static str, access: Access, summary: &'static str) -> Spec {
    Spec::new(Method::GET, path, access, summary)
}

/// `POST path`.
pub fn post(path: &'static str, access: Access, summary: &'static str) -> Spec {
    Spec::new(Method::POST, path, access, summary)
}

/// `PUT path`.
pub fn put(path: &'static str, access: Access, summary: &'static str) -> Spec {
    Spec::new(Method::PUT, path, access, summary)
}

/// `DELETE path`.
pub fn delete(path: &'static str, access: Access, summary: &'static str) -> Spec {
    Spec::new(Method::DELETE, path, access, summary)
}

impl Spec {
    /// `method path`, answering 200.
    pub fn new(method: Method, path: &'static str, access: Access, summary: &'static str) -> Self {
        Spec {
            op: Operation::new(method, path, access, summary),
            style: None,
        }
    }

    /// Reads a JSON body of type `T` (its schema in the document).
    pub fn body<T: Documented>(self) -> Self {
        self.body_schema(T::schema())
    }

    /// Reads a JSON body of type `T` that may be left out.
    pub fn optional_body<T: Documented>(mut self) -> Self {
        self.op = self.op.optional_body(T::schema());
        self
    }

    /// Reads a JSON body of this schema (a wire form copied from the replaced system, which
    /// the handler reads as it comes).
    pub fn body_schema(mut self, schema: Value) -> Self {
        self.op = self.op.body(schema);
        self
    }

    /// With a longer description than its summary.
    pub fn describe(mut self, description: &'static str) -> Self {
        self.op = self.op.describe(description);
        self
    }

    /// Takes a query parameter.
    pub fn query(mut self, name: &'static str, schema: Value, required: bool) -> Self {
        self.op = self.op.query(name, schema, required);
        self
    }

    /// Its answers besides the errors every route may give (instead of 200 alone).
    pub fn answers(mut self, answers: &[(u16, &'static str)]) -> Self {
        self.op = self.op.answers(answers);
        self
    }

    /// The body of answer `status` follows `schema`.
    pub fn answer_body(mut self, status: u16, schema: Value) -> Self {
        self.op = self.op.answer_body(status, schema);
        self
    }

    /// Refusals of this route in `style` instead of the service's (the router's OpenAI
    /// routes). OpenAI's style also renders the route's error answers in OpenAI's shape.
    pub fn style(mut self, style: ErrorStyle) -> Self {
        if style == ErrorStyle::OpenAi {
            self.op = self.op.error_body(openai_error_schema());
        }
        self.style = Some(style);
        self
    }

    /// The route, served by `handler`.
    pub fn to<H, T, S>(self, handler: H) -> Route<S>
    where
        H: Handler<T, S>,
        T: 'static,
        S: Clone + Send + Sync + 'static,
    {
        let filter = MethodFilter::try_from(self.op.method.clone())
            .unwrap_or_else(|_| panic!("no method filter for {}", self.op.method));
        let mut method_router = on(filter, handler);
        if let Some(style) = self.style {
            method_router = method_router.layer(from_fn(move |mut req: Request, next: Next| {
                req.extensions_mut().insert(style);
                async move {
                    let response = next.run(req).await;
                    if style == ErrorStyle::OpenAi {
                        openai_shape(response).await
                    } else {
                        response
                    }
                }
            }));
        }
        Route {
            op: self.op,
            method_router,
        }
    }
}

/// The schema of OpenAI's error body.
fn openai_error_schema() -> Value {
    serde_json::json!({"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type"], "properties": {
            "message": {"type": "string"}, "type": {"type": "string"},
            "param": {"type": "string", "nullable": true}, "code": {"type": "integer"}}}}})
}

/// Marks an answer a route passes on from a peer as it came (the router's engines' answers):
/// put in the response's extensions (`axum::Extension(Passed)`), its route's style leaves it
/// as it is.
#[derive(Clone, Copy, Debug)]
pub struct Passed;

/// An error answer in the one shape rewritten in OpenAI's (a success, an answer already in
/// OpenAI's shape, or one [`Passed`] on, as it is).
async fn openai_shape(response: Response) -> Response {
    let status = response.status();
    if !status.is_client_error() && !status.is_server_error() {
        return response;
    }
    if response.extensions().get::<Passed>().is_some() {
        return response;
    }
    let (parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 1 << 20).await else {
        return (parts.status, "error").into_response();
    };
    let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
        return Response::from_parts(parts, axum::body::Body::from(bytes));
    };
    if v.get("error").is_some_and(Value::is_object) {
        return Response::from_parts(parts, axum::body::Body::from(bytes));
    }
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    let message = text("error").or_else(|| text("detail")).unwrap_or_default();
    let body = serde_json::json!({"error": {
        "message": message,
        "type": text("reason").unwrap_or_else(|| "invalid_request_error".into()),
        "param": text("field"),
        "code": status.as_u16(),
    }});
    let mut out = (status, Json(body)).into_response();
    // What the stack reads off the answer (a limit hit for the metrics layer) stays with it.
    *out.extensions_mut() = parts.extensions;
    for (name, value) in &parts.headers {
        if name != axum::http::header::CONTENT_LENGTH && name != axum::http::header::CONTENT_TYPE {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

/// One route of a table: its operation and its handler.
pub struct Route<S> {
    op: Operation,
    method_router: MethodRouter<S>,
}

/// A service's route table (module docs).
pub struct Routes<S> {
    title: &'static str,
    service: &'static str,
    routes: Vec<Route<S>>,
    undocumented: Vec<(Access, &'static str, MethodRouter<S>)>,
}

impl<S: Clone + Send + Sync + 'static> Routes<S> {
    /// An empty table; `service` names the policy, `title` the document.
    pub fn new(service: &'static str, title: &'static str) -> Self {
        Routes {
            title,
            service,
            routes: Vec::new(),
            undocumented: Vec::new(),
        }
    }

    /// With `route`.
    #[must_use]
    pub fn route(mut self, route: Route<S>) -> Self {
        self.routes.push(route);
        self
    }

    /// With every route of `other` (a resource's own table).
    #[must_use]
    pub fn merge(mut self, other: Routes<S>) -> Self {
        self.routes.extend(other.routes);
        self.undocumented.extend(other.undocumented);
        self
    }

    /// With `GET /healthz` (liveness: open, never a token) served by `handler`.
    #[must_use]
    pub fn health<H: Handler<T, S>, T: 'static>(self, handler: H) -> Self {
        self.route(get("/healthz", Access::Open, "Liveness").to(handler))
    }

    /// With `GET /readyz` (readiness: open; 503 while not ready) served by `handler`.
    #[must_use]
    pub fn ready<H: Handler<T, S>, T: 'static>(self, handler: H) -> Self {
        self.route(
            get("/readyz", Access::Open, "Readiness")
                .answers(&[(200, "Ready"), (503, "Not ready")])
                // The probe answers with the service's readiness document, ready or not.
                .answer_body(503, serde_json::json!({"type": "object"}))
                .to(handler),
        )
    }

    /// With `GET /metrics` (Prometheus text; a read) served by `handler`.
    #[must_use]
    pub fn metrics<H: Handler<T, S>, T: 'static>(self, handler: H) -> Self {
        self.route(get("/metrics", Access::Read, "Prometheus metrics").to(handler))
    }

    /// With a route the document leaves out (static files), classed `access` for the policy.
    #[must_use]
    pub fn undocumented(
        mut self,
        access: Access,
        path: &'static str,
        method_router: MethodRouter<S>,
    ) -> Self {
        self.undocumented.push((access, path, method_router));
        self
    }

    /// Every documented operation, `GET /openapi.json` included.
    pub fn operations(&self) -> Vec<Operation> {
        let mut ops: Vec<Operation> = self.routes.iter().map(|r| r.op.clone()).collect();
        ops.push(openapi_operation());
        ops
    }

    /// Who may call what: every route's class, `auth`'s token settings.
    pub fn policy(&self, auth: Auth) -> Policy {
        let mut classes: Vec<(Method, &'static str, Access)> = self
            .operations()
            .into_iter()
            .map(|op| (op.method, op.path, op.access))
            .collect();
        classes.extend(
            self.undocumented
                .iter()
                .map(|(access, path, _)| (Method::GET, *path, *access)),
        );
        Policy::new(self.service, classes, auth)
    }

    /// The OpenAPI document, `auth` marking the routes needing the token.
    pub fn document(&self, auth: &Auth) -> Value {
        openapi::document(self.title, &self.operations(), auth)
    }

    /// The axum router of every route, `GET /openapi.json` serving [`Self::document`]. The
    /// caller finishes it with its [`super::stack::Stack`], whose policy is [`Self::policy`].
    pub fn into_router(self, auth: &Auth) -> Router<S> {
        let doc = Arc::new(self.document(auth));
        let mut by_path: Vec<(&'static str, MethodRouter<S>)> = Vec::new();
        for route in self.routes {
            match by_path.iter_mut().find(|(p, _)| *p == route.op.path) {
                Some((_, existing)) => {
                    let merged = std::mem::take(existing).merge(route.method_router);
                    *existing = merged;
                }
                None => by_path.push((route.op.path, route.method_router)),
            }
        }
        let mut router = Router::new();
        for (path, method_router) in by_path {
            router = router.route(path, method_router);
        }
        for (_, path, method_router) in self.undocumented {
            router = router.route(path, method_router);
        }
        router.route(
            "/openapi.json",
            axum::routing::get(move || async move { Json(Value::clone(&doc)) }),
        )
    }
}

/// `GET /openapi.json`, in every service's table.
fn openapi_operation() -> Operation {
    Operation::new(
        Method::GET,
        "/openapi.json",
        Access::Open,
        "This document (OpenAPI 3.0)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::web::json::Serde;
    use axum::body::Body;
    use axum::http::StatusCode;
    use tower::ServiceExt;

    #[derive(serde::Deserialize)]
    struct Keys {
        keys: Vec<u64>,
    }

    impl Documented for Keys {
        fn schema() -> Value {
            serde_json::json!({"type": "object", "required": ["keys"],
                "properties": {"keys": {"type": "array", "items": {"type": "integer"}}}})
        }
    }

    fn table() -> Routes<()> {
        Routes::new("t", "test")
            .health(|| async { "ok" })
            .route(
                post("/pins", Access::Write, "Pin keys")
                    .body::<Keys>()
                    .to(|Serde(k): Serde<Keys>| async move { k.keys.len().to_string() }),
            )
            .route(get("/pins", Access::Read, "The pins").to(|| async { "[]" }))
            .route(
                post("/v1/chat", Access::Read, "Chat")
                    .body::<Keys>()
                    .style(ErrorStyle::OpenAi)
                    .to(|Serde(k): Serde<Keys>| async move { k.keys.len().to_string() }),
            )
    }

    #[test]
    fn one_table_gives_the_policy_and_the_document() {
        let t = table();
        let auth = Auth::token("s");
        let policy = t.policy(auth.clone());
        assert_eq!(policy.access(&Method::POST, "/pins"), Access::Write);
        assert_eq!(policy.access(&Method::GET, "/pins"), Access::Read);
        assert_eq!(policy.access(&Method::GET, "/openapi.json"), Access::Open);
        let doc = t.document(&auth);
        assert_eq!(
            doc["paths"]["/pins"]["post"]["requestBody"]["content"]["application/json"]["schema"]
                ["required"][0],
            "keys"
        );
        assert!(doc["paths"]["/pins"]["get"].is_object());
        assert!(doc["paths"]["/healthz"]["get"]["security"].is_null());
    }

    #[tokio::test]
    async fn one_path_serves_every_method_of_the_table() {
        let app = table().into_router(&Auth::default());
        let call = |method: &str, path: &str, body: &'static str| {
            let app = app.clone();
            let req = Request::builder()
                .method(method)
                .uri(path)
                .body(Body::from(body))
                .unwrap();
            async move { app.oneshot(req).await.unwrap() }
        };
        assert_eq!(call("GET", "/pins", "").await.status(), StatusCode::OK);
        assert_eq!(
            call("POST", "/pins", r#"{"keys": [1]}"#).await.status(),
            StatusCode::OK
        );
        assert_eq!(
            call("GET", "/openapi.json", "").await.status(),
            StatusCode::OK
        );
        let refused = call("POST", "/v1/chat", r#"{"keys": "x"}"#).await;
        assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let body = axum::body::to_bytes(refused.into_body(), 1 << 16)
            .await
            .unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["param"], "keys", "{v}");
        assert_eq!(v["error"]["code"], 422, "{v}");
    }
}
