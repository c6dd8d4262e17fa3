//! Cross-site request forgery guard for the routes that change state: a middleware that
//! lets a request through only if a web page of another origin could not have sent it.
//!
//! * `Content-Type` must be `application/json` or `<type>/<subtype>+json` (any parameters);
//!   anything else, a missing one included, is a 415. A browser sends a cross-origin POST
//!   without a CORS preflight only with `text/plain`, `application/x-www-form-urlencoded` or
//!   `multipart/form-data` (or no body type at all), so a JSON content type proves the
//!   request passed a preflight, which kvplane never grants (it sends no CORS headers).
//! * An `Origin` header (browsers send it on every POST) must name the host the request was
//!   sent to (`Host`), else 403; so must `Sec-Fetch-Site` when present (`same-origin` or
//!   `none`). Requests without them (curl, LMCache, scripts) pass: they are not from a page.
//!
//! This is FastAPI's fix for CVE-2021-32677, which LMCache's controller inherits. A reverse
//! proxy in front must pass `Host` through unchanged.
//!
//! [`same_origin_only`] is the second half alone, for services whose clients send
//! state-changing requests without a body (LMCache's MP servers: `PUT .../heartbeat`,
//! `DELETE /instances/{id}`) or without a content type (the Conductor's clients): a browser
//! names the page's origin on every such request, so a page of another origin is refused
//! whatever it sends, and non-browser clients pass unchanged.

use super::error::ApiError;
use axum::extract::Request;
use axum::http::{header, HeaderMap, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Middleware: 415 or 403 for a request a cross-origin page could have sent (see the module
/// docs). Use with `axum::middleware::from_fn(same_origin_json)`.
/// Safe methods (`GET`, `HEAD`, `OPTIONS`, `TRACE`) pass: they change nothing, and a route
/// that does not take them answers 405 as usual.
pub async fn same_origin_json(request: Request, next: Next) -> Response {
    if request.method().is_safe() {
        return next.run(request).await;
    }
    match check(request.headers(), request.uri()) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

/// Middleware: 403 for a state-changing request a page of another origin sent (`Origin` or
/// `Sec-Fetch-Site` say so); any content type. Use with
/// `axum::middleware::from_fn(same_origin_only)`.
pub async fn same_origin_only(request: Request, next: Next) -> Response {
    if request.method().is_safe() {
        return next.run(request).await;
    }
    match check_origin(request.headers(), request.uri()) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

/// The guard's rule, on a request's headers and URI.
///
/// # Errors
/// [`ApiError::UnsupportedMediaType`] or [`ApiError::Forbidden`].
pub fn check(headers: &HeaderMap, uri: &Uri) -> Result<(), ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !is_json(content_type) {
        return Err(ApiError::UnsupportedMediaType(format!(
            "this route takes a JSON body: send Content-Type: application/json (got {})",
            if content_type.is_empty() {
                "none".to_owned()
            } else {
                format!("{content_type:?}")
            }
        )));
    }
    check_origin(headers, uri)
}

/// The origin half of the rule: a browser's `Sec-Fetch-Site` must be `same-origin` or
/// `none`, its `Origin` must name `Host`; requests without them pass.
///
/// # Errors
/// [`ApiError::Forbidden`].
pub fn check_origin(headers: &HeaderMap, uri: &Uri) -> Result<(), ApiError> {
    if let Some(site) = headers.get("sec-fetch-site") {
        if !matches!(site.as_bytes(), b"same-origin" | b"none") {
            return Err(cross_origin("the browser says it is"));
        }
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()));
    let same = match (origin.to_str().ok().and_then(origin_authority), host) {
        (Some((scheme, authority)), Some(host)) => strip_default_port(scheme, authority)
            .eq_ignore_ascii_case(strip_default_port(scheme, host)),
        _ => false,
    };
    if same {
        Ok(())
    } else {
        Err(cross_origin("its Origin is not this host"))
    }
}

fn cross_origin(why: &str) -> ApiError {
    ApiError::Forbidden(format!(
        "cross-origin request refused ({why}): state-changing routes accept requests from \
         this host's own pages or from non-browser clients only"
    ))
}

/// `application/json`, or any `type/subtype+json`, ignoring parameters and case.
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    !kind.is_empty()
        && (subtype.eq_ignore_ascii_case("json") && kind.eq_ignore_ascii_case("application")
            || subtype.len() > 5 && subtype[subtype.len() - 5..].eq_ignore_ascii_case("+json"))
}

/// `(scheme, host[:port])` of an `Origin` value (`null` and malformed values: `None`).
fn origin_authority(origin: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = origin.split_once("://")?;
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    (!authority.is_empty() && !authority.contains('/')).then_some((scheme, authority))
}

/// `host:80` is `host` for http, `host:443` for https (browsers omit default ports).
fn strip_default_port<'a>(scheme: &str, authority: &'a str) -> &'a str {
    let default = match scheme {
        "http" => ":80",
        "https" => ":443",
        _ => return authority,
    };
    authority.strip_suffix(default).unwrap_or(authority)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderName, HeaderValue, StatusCode};

    fn verdict(pairs: &[(&str, &str)]) -> Option<StatusCode> {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                HeaderName::from_bytes(k.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        check(&h, &Uri::from_static("/clear"))
            .err()
            .map(|e| e.status())
    }

    const JSON: (&str, &str) = ("content-type", "application/json");
    const HOST: (&str, &str) = ("host", "127.0.0.1:9000");

    #[test]
    fn only_json_bodies_pass() {
        assert_eq!(verdict(&[JSON, HOST]), None);
        assert_eq!(
            verdict(&[("content-type", "Application/JSON; charset=utf-8")]),
            None
        );
        assert_eq!(
            verdict(&[("content-type", "application/merge-patch+json")]),
            None
        );
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
            "application/jsonp",
            "json",
            "+json",
            "text/json5",
        ] {
            assert_eq!(
                verdict(&[("content-type", bad)]),
                Some(StatusCode::UNSUPPORTED_MEDIA_TYPE),
                "{bad}"
            );
        }
        assert_eq!(
            verdict(&[HOST]),
            Some(StatusCode::UNSUPPORTED_MEDIA_TYPE),
            "missing"
        );
    }

    #[test]
    fn the_origin_half_alone_takes_any_body_type() {
        let verdict = |pairs: &[(&str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(
                    HeaderName::from_bytes(k.as_bytes()).expect("name"),
                    HeaderValue::from_str(v).expect("value"),
                );
            }
            check_origin(&h, &Uri::from_static("/register"))
                .err()
                .map(|e| e.status())
        };
        assert_eq!(verdict(&[]), None, "curl, LMCache: no Origin");
        assert_eq!(verdict(&[("content-type", "text/plain"), HOST]), None);
        assert_eq!(verdict(&[HOST, ("origin", "http://127.0.0.1:9000")]), None);
        assert_eq!(
            verdict(&[HOST, ("origin", "http://evil.example")]),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            verdict(&[
                ("content-type", "text/plain"),
                ("sec-fetch-site", "cross-site")
            ]),
            Some(StatusCode::FORBIDDEN)
        );
    }

    #[test]
    fn only_same_origin_pages_pass() {
        assert_eq!(
            verdict(&[JSON, HOST, ("origin", "http://127.0.0.1:9000")]),
            None
        );
        assert_eq!(
            verdict(&[
                JSON,
                ("host", "kv.example"),
                ("origin", "https://kv.example:443")
            ]),
            None
        );
        assert_eq!(
            verdict(&[JSON, HOST, ("sec-fetch-site", "same-origin")]),
            None
        );
        for (origin, site) in [
            ("http://evil.example", "cross-site"),
            ("http://127.0.0.1:9001", "same-site"),
            ("https://127.0.0.1:9000.evil.example", "cross-site"),
            ("null", "cross-site"),
        ] {
            assert_eq!(
                verdict(&[JSON, HOST, ("origin", origin)]),
                Some(StatusCode::FORBIDDEN),
                "{origin}"
            );
            assert_eq!(
                verdict(&[JSON, HOST, ("sec-fetch-site", site)]),
                Some(StatusCode::FORBIDDEN),
                "{site}"
            );
        }
    }
}
