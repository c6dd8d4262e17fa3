//! A minimal HTTP/1.0 GET client for `GET /controller/key-stats` (kvplane's and LMCache's),
//! so the load generator needs no HTTP client dependency. Every call is bounded.

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Splits `http://host:port[/prefix]` into `host:port` and the path prefix.
pub(super) fn split_base(base: &str) -> Result<(String, String), String> {
    let rest = base
        .strip_prefix("http://")
        .ok_or_else(|| format!("--http must start with http:// (got {base:?})"))?;
    let (authority, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    Ok((authority.to_owned(), prefix.to_owned()))
}

/// GETs `path` and parses the body as JSON.
///
/// # Errors
/// A message naming what failed (connect, status, body).
pub(super) async fn get_json(
    base: &str,
    path: &str,
    timeout: Duration,
) -> Result<serde_json::Value, String> {
    let (authority, prefix) = split_base(base)?;
    let call = async {
        let mut stream = TcpStream::connect(&authority)
            .await
            .map_err(|e| format!("connect {authority}: {e}"))?;
        let request = format!(
            "GET {prefix}{path} HTTP/1.0\r\nHost: {authority}\r\nAccept: application/json\r\n\r\n"
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut raw = Vec::new();
        stream
            .read_to_end(&mut raw)
            .await
            .map_err(|e| format!("read: {e}"))?;
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or("response without a header terminator")?;
        let head = String::from_utf8_lossy(&raw[..split]);
        let status = head.split_whitespace().nth(1).unwrap_or("");
        if status != "200" {
            return Err(format!("GET {path}: HTTP {status}"));
        }
        serde_json::from_slice(&raw[split + 4..])
            .map_err(|e| format!("GET {path}: body is not JSON: {e}"))
    };
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| format!("GET {path}: no answer within {timeout:?}"))?
}

/// `total_key_count` from `GET /controller/key-stats`, waiting at most `timeout`.
///
/// # Errors
/// As [`get_json`], or when the field is missing.
pub(super) async fn total_keys(base: &str, timeout: Duration) -> Result<u64, String> {
    let v = get_json(base, "/controller/key-stats", timeout).await?;
    v["total_key_count"]
        .as_u64()
        .ok_or_else(|| format!("key-stats without total_key_count: {v}"))
}
