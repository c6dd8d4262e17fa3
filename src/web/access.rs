//! Who may call which route, the same way on every service: each route has an [`Access`]
//! class, each service a [`Policy`] (its routes' classes and its [`Auth`] settings), and one
//! middleware, [`enforce`], checks the bearer token against the class of the route a request
//! matched. The flags are the same on every service ([`AuthArgs`]: `--api-token`,
//! `--api-token-reads`, `--api-token-peers`).
//!
//! * [`Access::Open`] — liveness and readiness probes and `/openapi.json`: never a token
//!   (orchestrators' probes cannot send one; the document names no secret).
//! * [`Access::Read`] — reads and queries (`GET`s, `POST /lookup`, `POST /query`, `/metrics`,
//!   the dashboards): a token only with `--api-token-reads`.
//! * [`Access::Write`] — what an operator changes (quotas, pins, deletes, commands,
//!   registrations of publishers or engines): the token whenever `--api-token` is set.
//! * [`Access::Peer`] — what the replaced system's own clients change and cannot send a
//!   token with (LMCache's MP servers registering, heartbeating and reporting events to the
//!   coordinator): a token only with `--api-token-peers`; each service's page documents the
//!   risk of leaving them open.
//!
//! A route missing from a policy is classed by its method (safe methods [`Access::Read`],
//! others [`Access::Write`]), so forgetting a route can only make it stricter.
//!
//! Knows no service: the policies come from the services' route tables.

use super::auth::{bearer, BearerToken};
use super::error::ApiError;
use crate::config::ApiToken;
use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// A route's access class (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Probes and the API document: never a token.
    Open,
    /// Reads and queries: a token only with `--api-token-reads`.
    Read,
    /// Operator changes: the token whenever one is set.
    Write,
    /// Changes by the replaced system's own clients: a token only with `--api-token-peers`.
    Peer,
}

impl Access {
    /// The class's name, as `x-kvplane-access` in each service's OpenAPI document.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Open => "open",
            Access::Read => "read",
            Access::Write => "write",
            Access::Peer => "peer",
        }
    }

    /// The class of a route no policy names: by its method.
    pub fn of_method(method: &Method) -> Access {
        if method.is_safe() {
            Access::Read
        } else {
            Access::Write
        }
    }
}

/// The token flags every service has (each service gives them its `KVPLANE_<SERVICE>_*`
/// variables).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct AuthArgs {
    /// Bearer token every mutating HTTP route requires (`Authorization: Bearer <token>`;
    /// 401 without it); unset, they are open to anyone who reaches the HTTP port. Probes
    /// (`/healthz`, `/readyz`) and `/openapi.json` never need it.
    #[arg(long, hide_env_values = true, value_parser = parse_token)]
    pub api_token: Option<ApiToken>,
    /// With `--api-token`: the read routes (queries, `/metrics`, the dashboard) need it too.
    #[arg(long, requires = "api_token")]
    pub api_token_reads: bool,
    /// With `--api-token`: the routes the replaced system's own clients call (which cannot
    /// send a token; see the service's docs) need it too.
    #[arg(long, requires = "api_token")]
    pub api_token_peers: bool,
}

/// An empty token means none.
fn parse_token(s: &str) -> Result<ApiToken, String> {
    if s.is_empty() {
        return Err("the token is empty (leave the flag out for no token)".into());
    }
    Ok(ApiToken::new(s))
}

/// A service's token settings.
#[derive(Clone, Debug, Default)]
pub struct Auth {
    /// The token, if one is set.
    pub token: Option<ApiToken>,
    /// Reads need it too.
    pub reads: bool,
    /// Peer routes need it too.
    pub peers: bool,
}

impl From<&AuthArgs> for Auth {
    fn from(a: &AuthArgs) -> Self {
        Auth {
            token: a.api_token.clone(),
            reads: a.api_token_reads,
            peers: a.api_token_peers,
        }
    }
}

impl Auth {
    /// Only a token for the mutating routes.
    pub fn token(token: &str) -> Self {
        Auth {
            token: Some(ApiToken::new(token)),
            ..Auth::default()
        }
    }

    /// Whether a route of class `access` needs the token.
    pub fn requires(&self, access: Access) -> bool {
        self.token.is_some()
            && match access {
                Access::Open => false,
                Access::Read => self.reads,
                Access::Write => true,
                Access::Peer => self.peers,
            }
    }
}

/// A service's routes' classes and its token settings.
#[derive(Debug)]
pub struct Policy {
    service: &'static str,
    routes: Vec<(Method, &'static str, Access)>,
    auth: Auth,
    token: Option<BearerToken>,
}

impl Policy {
    /// `routes`: (method, path as the router declares it, class).
    pub fn new(
        service: &'static str,
        routes: Vec<(Method, &'static str, Access)>,
        auth: Auth,
    ) -> Self {
        let token = auth.token.as_ref().map(|t| BearerToken::new(t.expose()));
        Policy {
            service,
            routes,
            auth,
            token,
        }
    }

    /// The class of `method path` (the route template, e.g. `/instances/{instance_id}`).
    pub fn access(&self, method: &Method, path: &str) -> Access {
        let method = if method == Method::HEAD {
            &Method::GET
        } else {
            method
        };
        self.routes
            .iter()
            .find(|(m, p, _)| m == method && same_template(p, path))
            .map_or_else(|| Access::of_method(method), |(_, _, a)| *a)
    }

    /// Whether `method path` is one of the classified routes (not classed by its method).
    pub fn lists(&self, method: &Method, path: &str) -> bool {
        self.routes
            .iter()
            .any(|(m, p, _)| m == method && same_template(p, path))
    }

    /// Every classified route.
    pub fn routes(&self) -> &[(Method, &'static str, Access)] {
        &self.routes
    }

    /// The token settings.
    pub fn auth(&self) -> &Auth {
        &self.auth
    }

    /// Logs, once at start, what the token protects.
    pub fn log(&self) {
        let service = self.service;
        let open_writes: Vec<String> = self
            .routes
            .iter()
            .filter(|(_, _, a)| matches!(a, Access::Write | Access::Peer))
            .filter(|(_, _, a)| !self.auth.requires(*a))
            .map(|(m, p, _)| format!("{m} {p}"))
            .collect();
        if open_writes.is_empty() {
            tracing::info!("{service}: every mutating HTTP route requires the --api-token");
        } else if self.auth.token.is_none() {
            tracing::warn!(
                "{service}: no --api-token set: the mutating HTTP routes are open to anyone \
                 who can reach the HTTP port (browsers' cross-origin requests are refused)"
            );
        } else {
            tracing::warn!(
                "{service}: routes the replaced system's clients call stay open without \
                 --api-token-peers: {}",
                open_writes.join(", ")
            );
        }
    }
}

/// Whether two route templates are the same route (path parameters match whatever their
/// names: the router's `{id}` is the document's `{instance_id}`).
fn same_template(a: &str, b: &str) -> bool {
    let param = |s: &str| s.starts_with('{') && s.ends_with('}');
    a.split('/').count() == b.split('/').count()
        && a.split('/')
            .zip(b.split('/'))
            .all(|(x, y)| x == y || (param(x) && param(y)))
}

/// Middleware: lets a request through when its route's class needs no token or it carries
/// the right one; 401 otherwise. Use with `from_fn_with_state(Arc<Policy>, enforce)` as a
/// layer of the whole router (the matched route's template is known there).
pub async fn enforce(State(policy): State<Arc<Policy>>, request: Request, next: Next) -> Response {
    let Some(token) = &policy.token else {
        return next.run(request).await;
    };
    let access = match request.extensions().get::<MatchedPath>() {
        Some(path) => policy.access(request.method(), path.as_str()),
        None => Access::of_method(request.method()),
    };
    if !policy.auth.requires(access) {
        return next.run(request).await;
    }
    match bearer(request.headers()) {
        Some(given) if token.matches(given) => next.run(request).await,
        Some(_) => ApiError::Unauthorized { invalid: true }.into_response(),
        None => ApiError::Unauthorized { invalid: false }.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_need_the_token_as_documented() {
        let none = Auth::default();
        let writes = Auth::token("t");
        let all = Auth {
            reads: true,
            peers: true,
            ..Auth::token("t")
        };
        for a in [Access::Open, Access::Read, Access::Write, Access::Peer] {
            assert!(!none.requires(a), "{a:?} without a token");
        }
        assert_eq!(
            [Access::Open, Access::Read, Access::Write, Access::Peer].map(|a| writes.requires(a)),
            [false, false, true, false]
        );
        assert_eq!(
            [Access::Open, Access::Read, Access::Write, Access::Peer].map(|a| all.requires(a)),
            [false, true, true, true]
        );
    }

    #[test]
    fn unknown_routes_are_classed_by_method() {
        let p = Policy::new(
            "t",
            vec![(Method::POST, "/query", Access::Read)],
            Auth::token("t"),
        );
        assert_eq!(p.access(&Method::POST, "/query"), Access::Read);
        assert_eq!(p.access(&Method::POST, "/other"), Access::Write);
        assert_eq!(p.access(&Method::GET, "/other"), Access::Read);
        assert_eq!(p.access(&Method::HEAD, "/query"), Access::Read);
        let p = Policy::new(
            "t",
            vec![(Method::PUT, "/i/{id}/beat", Access::Peer)],
            Auth::token("t"),
        );
        assert_eq!(
            p.access(&Method::PUT, "/i/{instance_id}/beat"),
            Access::Peer
        );
        assert_eq!(p.access(&Method::PUT, "/i/x/beat"), Access::Write);
        assert_eq!(p.access(&Method::PUT, "/i/{id}"), Access::Write);
    }
}
