//! Serving a folder of files compiled into the binary (`rust-embed`): `/` is its
//! `index.html`; `/static/<path>` is its `static/<path>`; anything else under `/static/` is a
//! JSON 404, so no fallback ever shadows an API route.
//!
//! Every answer carries a strong `ETag` (the file's SHA-256) with `Cache-Control: no-cache`,
//! so a browser revalidates with `If-None-Match` and gets a 304 until the binary changes. A
//! `Content-Security-Policy` of `'self'` only makes the browser itself refuse any request
//! that would leave the host, and refuse inline script and style.
//!
//! Knows no service: which folder is served is the type parameter, a `RustEmbed` type. Every
//! service serves the same [`Frontend`] (`frontend/`, embedded once), each with its own page
//! at `/` ([`page`]): the controller `index.html`, the indexer `indexer.html`, the
//! coordinator `fleet.html`, the node `node.html`.

use super::error::ApiError;
use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use rust_embed::RustEmbed;

/// The page's security policy: nothing but this origin, no inline script or style sheet.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// The dashboards' files (`frontend/`: one HTML page per service and their shared
/// `static/` modules), compiled into the binary once (read from disk in debug builds).
#[derive(RustEmbed)]
#[folder = "frontend/"]
pub struct Frontend;

/// The routes serving `E`: `/` is its `index.html`, `/static/<path>` its `static/<path>`.
pub fn routes<E: RustEmbed + Send + Sync + 'static, S: Clone + Send + Sync + 'static>() -> Router<S>
{
    page::<E, S>("index.html")
}

/// The routes serving `E` with `page` (a top-level file of `E`) at `/`, and `/static/<path>`.
pub fn page<E: RustEmbed + Send + Sync + 'static, S: Clone + Send + Sync + 'static>(
    page: &'static str,
) -> Router<S> {
    Router::new()
        .route(
            "/",
            get(move |headers: HeaderMap| async move { asset::<E>(page, &headers) }),
        )
        .route("/static/{*path}", get(static_asset::<E>))
}

async fn static_asset<E: RustEmbed>(Path(path): Path<String>, headers: HeaderMap) -> Response {
    asset::<E>(&format!("static/{path}"), &headers)
}

/// Serves one embedded file of `E`, or a JSON 404.
pub fn asset<E: RustEmbed>(path: &str, headers: &HeaderMap) -> Response {
    let file = if path.split('/').any(|seg| seg.is_empty() || seg == "..") {
        None
    } else {
        E::get(path)
    };
    let Some(file) = file else {
        return ApiError::NotFound("Not Found".into()).into_response();
    };
    let etag = format!("\"{}\"", hex(&file.metadata.sha256_hash()[..16]));
    let common = [
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
    ];
    let etag_value = HeaderValue::from_str(&etag).unwrap_or(HeaderValue::from_static("\"\""));
    let matches = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    if matches {
        return (
            StatusCode::NOT_MODIFIED,
            common,
            [(header::ETAG, etag_value)],
        )
            .into_response();
    }
    (
        common,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static(content_type(path)),
            ),
            (header::ETAG, etag_value),
        ],
        file.data.into_owned(),
    )
        .into_response()
}

/// The content type of an asset, from its extension (the few kinds `frontend/` holds).
fn content_type(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map_or("", |(_, e)| e);
    match ext.to_ascii_lowercase().as_str() {
        "html" | "htm" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "json" | "map" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "webmanifest" => "application/manifest+json",
        "woff2" => "font/woff2",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::web::testing::{body_bytes, ctype, get_req, json};

    type Assets = Frontend;

    fn app() -> Router {
        routes::<Assets, ()>()
    }

    #[tokio::test]
    async fn assets_are_served_with_their_types_and_unknown_paths_are_404() {
        let cases = [
            ("/", "text/html; charset=utf-8"),
            ("/static/app.js", "text/javascript; charset=utf-8"),
            ("/static/app.css", "text/css; charset=utf-8"),
            ("/static/favicon.svg", "image/svg+xml"),
        ];
        for (path, want) in cases {
            let resp = get_req(app(), path, &[]).await;
            assert_eq!(resp.status(), StatusCode::OK, "{path}");
            assert_eq!(ctype(&resp), want, "{path}");
            let h = resp.headers();
            assert_eq!(h[header::CACHE_CONTROL], "no-cache", "{path}");
            assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{path}");
            assert!(h.contains_key(header::ETAG), "{path}");
            assert!(!body_bytes(resp).await.is_empty(), "{path}");
        }
        // No fallback to index.html: unknown assets, traversal, the bare folder and paths
        // outside the dashboard's routes are all 404 (API routes are never shadowed).
        for path in [
            "/static/missing.js",
            "/static/../index.html",
            "/static/%2e%2e/index.html",
            "/static//app.js",
            "/static/",
            "/index.html",
            "/workers",
            "/controller/workers",
        ] {
            let resp = get_req(app(), path, &[]).await;
            assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{path}");
        }
        let resp = get_req(app(), "/static/nope.css", &[]).await;
        assert_eq!(ctype(&resp), "application/json");
        assert_eq!(json(resp).await["detail"], "Not Found");
    }

    #[tokio::test]
    async fn every_embedded_static_file_is_served_with_a_known_type() {
        let mut served = 0;
        for path in Assets::iter() {
            if path
                .rsplit('/')
                .next()
                .is_some_and(|name| name.starts_with('.'))
            {
                continue; // never reachable: `/static/` maps only into frontend/static/
            }
            let Some(rest) = path.strip_prefix("static/") else {
                assert!(
                    PAGES.contains(&&*path),
                    "only the services' pages live outside static/: {path}"
                );
                continue;
            };
            let resp = get_req(app(), &format!("/static/{rest}"), &[]).await;
            assert_eq!(resp.status(), StatusCode::OK, "{path}");
            assert_ne!(ctype(&resp), "application/octet-stream", "{path}");
            served += 1;
        }
        assert!(served >= 5, "app.js, its modules, app.css, favicon.svg");
    }

    #[tokio::test]
    async fn etag_revalidation_answers_304() {
        let first = get_req(app(), "/static/app.js", &[]).await;
        let etag = first.headers()[header::ETAG]
            .to_str()
            .expect("ascii")
            .to_owned();
        let again = get_req(app(), "/static/app.js", &[("if-none-match", &etag)]).await;
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        assert!(body_bytes(again).await.is_empty());
        let stale = get_req(app(), "/static/app.js", &[("if-none-match", "\"x\"")]).await;
        assert_eq!(stale.status(), StatusCode::OK);
    }

    /// Every service's page.
    const PAGES: [&str; 4] = ["index.html", "indexer.html", "fleet.html", "node.html"];

    #[tokio::test]
    async fn every_page_references_only_embedded_same_origin_assets() {
        for name in PAGES {
            page_references_only_embedded_assets(name).await;
        }
    }

    async fn page_references_only_embedded_assets(name: &'static str) {
        let app = || page::<Assets, ()>(name);
        let resp = get_req(app(), "/", &[]).await;
        assert_eq!(resp.status(), StatusCode::OK, "{name}");
        let csp = resp.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .expect("ascii")
            .to_owned();
        assert!(csp.contains("connect-src 'self'") && csp.contains("default-src 'none'"));
        let html = String::from_utf8(body_bytes(resp).await).expect("utf-8");
        assert!(
            !html.contains("http://") && !html.contains("https://"),
            "no remote URL"
        );
        for attr in ["src=\"", "href=\""] {
            for (i, _) in html.match_indices(attr) {
                let url = &html[i + attr.len()..];
                let url = &url[..url.find('"').expect("closed attribute")];
                if url.starts_with('#') {
                    continue;
                }
                let path = url.split('?').next().unwrap_or(url);
                let resp = get_req(app(), path, &[]).await;
                assert_eq!(resp.status(), StatusCode::OK, "{name}: {url} is embedded");
            }
        }
    }

    #[test]
    fn content_types_by_extension() {
        assert_eq!(content_type("a/b.HTML"), "text/html; charset=utf-8");
        assert_eq!(content_type("x.mjs"), "text/javascript; charset=utf-8");
        assert_eq!(content_type("x.png"), "image/png");
        assert_eq!(content_type("x.woff2"), "font/woff2");
        assert_eq!(content_type("noext"), "application/octet-stream");
    }
}
