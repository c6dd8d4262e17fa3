//! The HTTP stack every service's router is finished with, so that every service answers the
//! same way to the same mistake and is protected the same way:
//!
//! * per-route request metrics ([`super::metrics_layer`]), outermost, so refusals count too;
//! * the bearer token ([`super::access::enforce`]) by the matched route's class, before
//!   anything else is checked, so a caller without the token learns nothing more (401);
//! * the CSRF guard ([`super::guard`]) on every state-changing request: for the
//!   [`Access::Write`] routes its policy lists, of a service whose clients send JSON, content
//!   type and origin; otherwise origin alone (clients that send bodies without a type, or
//!   none; a method no route serves, which then gets the one 405);
//! * the body limit (`--max-body-bytes`: an announced oversize body is refused before it is
//!   read, a longer one when it passes the limit), each refusal counted;
//! * one 404 and one 405 for routes and methods that do not exist, in the one error shape
//!   ([`super::error`]);
//! * the limits and the service's [`ErrorStyle`] in every request's extensions, where the body
//!   extractors of [`super::json`] read them.
//!
//! Knows no service: the policy, the limits and the metric handles come in as a [`Stack`].

use super::access::{enforce, Access, Policy};
use super::error::ApiError;
use super::guard;
use super::json::ErrorStyle;
use super::limits::{HttpLimits, LimitHit, WebLimit};
use super::metrics_layer::{track, HttpMetrics};
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};
use std::sync::Arc;

/// What a service's state-changing requests must show to pass the CSRF guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guard {
    /// [`Access::Write`] routes take JSON: content type and origin (the controller, whose
    /// LMCache clients always send JSON); other state-changing routes: origin alone.
    JsonWrites,
    /// Origin alone on every state-changing route (services whose real clients send bodies
    /// without a content type, or none).
    OriginOnly,
}

/// The parts of a service's HTTP stack.
#[derive(Clone)]
pub struct Stack {
    /// Who may call what.
    pub policy: Arc<Policy>,
    /// The request limits (the body limit is applied here; connections and read times by
    /// [`super::serve`]).
    pub limits: HttpLimits,
    /// Where requests are counted and timed, and refusals reported.
    pub metrics: Arc<HttpMetrics>,
    /// The CSRF guard's strictness.
    pub guard: Guard,
    /// How the service words a refused request (`web::json`); a route may override it.
    pub style: ErrorStyle,
}

impl Stack {
    /// `router` with the whole stack around it (module docs), and the 404/405 answers.
    pub fn finish<S: Clone + Send + Sync + 'static>(&self, router: Router<S>) -> Router<S> {
        let policy = Arc::clone(&self.policy);
        let max_body_bytes = self.limits.max_body_bytes;
        router
            .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
            .fallback(|| async { ApiError::NotFound("Not Found".into()) })
            // Layers run last-added first: metrics, token, guard, body limit, handler. The
            // token comes first so that a caller without one learns only that (401), never
            // what else its request lacks.
            .layer(DefaultBodyLimit::max(max_body_bytes))
            .layer(from_fn_with_state(
                max_body_bytes,
                refuse_announced_oversize,
            ))
            .layer(from_fn_with_state((Arc::clone(&policy), self.guard), csrf))
            .layer(from_fn_with_state(Arc::clone(&policy), enforce))
            .layer(from_fn_with_state(Arc::clone(&self.metrics), track))
            // Outermost: what the body extractors of `web::json` read (the limits, the style).
            .layer(Extension(self.limits))
            .layer(Extension(self.style))
    }

    /// The limit hit a 413 without its own [`LimitHit`] stands for.
    pub fn body_limit_hit(&self) -> LimitHit {
        LimitHit {
            limit: WebLimit::BodyBytes,
            value: self.limits.max_body_bytes as u64,
        }
    }
}

/// The CSRF guard, by the matched route's class (see [`Guard`]).
async fn csrf(
    State((policy, strictness)): State<(Arc<Policy>, Guard)>,
    request: Request,
    next: Next,
) -> Response {
    if request.method().is_safe() {
        return next.run(request).await;
    }
    // The body's type is checked on the write routes the policy lists (a JsonWrites service
    // lists every route it serves), so a method no route serves gets the one 405, not a 415.
    let json_write = request
        .extensions()
        .get::<MatchedPath>()
        .is_some_and(|path| {
            policy.lists(request.method(), path.as_str())
                && policy.access(request.method(), path.as_str()) == Access::Write
        });
    let checked = if strictness == Guard::JsonWrites && json_write {
        guard::check(request.headers(), request.uri())
    } else {
        guard::check_origin(request.headers(), request.uri())
    };
    match checked {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

/// Middleware: a request whose `Content-Length` announces more than `max_body_bytes` gets 413
/// before its body is touched, so a client that sent `Expect: 100-continue` (curl does for
/// large bodies) is never asked for it and nothing is read. Bodies without a length are
/// still cut at the limit while read (`axum::extract::DefaultBodyLimit`). Use with
/// `axum::middleware::from_fn_with_state(max_body_bytes, refuse_announced_oversize)`.
pub async fn refuse_announced_oversize(
    State(max_body_bytes): State<usize>,
    request: Request,
    next: Next,
) -> Response {
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match announced {
        Some(n) if n > max_body_bytes as u64 => ApiError::PayloadTooLarge(format!(
            "the body announces {n} bytes; at most {max_body_bytes} are accepted \
             (--max-body-bytes)"
        ))
        .into_response(),
        _ => next.run(request).await,
    }
}
