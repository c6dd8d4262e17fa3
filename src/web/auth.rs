//! The bearer token itself: [`BearerToken`] (compared in constant time, never shown by
//! `Debug`) and reading it from an `Authorization` header. Which routes need it, and the one
//! check every service runs, is [`super::access`].

use axum::http::{header, HeaderMap};

use std::sync::Arc;

/// The token a route requires (cheap to clone; never shown by `Debug`).
#[derive(Clone)]
pub struct BearerToken(Arc<str>);

impl BearerToken {
    /// Wraps a token.
    pub fn new(token: &str) -> Self {
        BearerToken(Arc::from(token))
    }
}

impl BearerToken {
    /// Whether `given` is this token (in time that depends only on the lengths).
    pub fn matches(&self, given: &[u8]) -> bool {
        constant_time_eq(given, self.0.as_bytes())
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

/// The bearer token of an `Authorization` header (scheme case-insensitive), if any.
pub(super) fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let scheme = value.get(..7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    Some(value[7..].trim_ascii())
}

/// Compares two secrets in time that depends only on their lengths, not on where they
/// differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| acc | std::hint::black_box(x ^ y));
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn bearer_parsing() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer abc "),
        );
        assert_eq!(bearer(&h), Some(&b"abc"[..]));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer abc"),
        );
        assert_eq!(bearer(&h), Some(&b"abc"[..]));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bear"));
        assert_eq!(bearer(&h), None);
    }

    #[test]
    fn constant_time_compare() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(constant_time_eq(b"", b""));
    }
}
