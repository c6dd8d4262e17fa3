//! A minimal HTTP/1.1 client for service-to-service JSON calls: one request per connection
//! (`Connection: close`), a deadline over connect + write + read, a cap on the reply, and
//! `Content-Length` replies only (chunked ones are refused). The services call small JSON
//! routes of one another (uvicorn or axum answer with `Content-Length`); this keeps every
//! bound visible here and adds no dependency.

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest reply body read.
pub const MAX_REPLY_BYTES: usize = 4 << 20;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Connect, write or read failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// No complete reply within the deadline.
    #[error("no reply within {0:?}")]
    Timeout(Duration),
    /// The reply is not HTTP/1.x we understand, or too large.
    #[error("bad reply: {0}")]
    BadReply(&'static str),
}

/// A reply: status and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Body bytes.
    pub body: Vec<u8>,
}

/// Sends `method path` with an optional JSON body to `host:port`, as `user_agent`.
///
/// # Errors
/// [`ClientError`] on connection failure, timeout or an unreadable reply.
pub async fn call(
    host: &str,
    port: u16,
    method: &str,
    path: &str,
    json: Option<&[u8]>,
    timeout: Duration,
    user_agent: &str,
) -> Result<Reply, ClientError> {
    tokio::time::timeout(
        timeout,
        call_inner(host, port, method, path, json, user_agent),
    )
    .await
    .map_err(|_| ClientError::Timeout(timeout))?
}

async fn call_inner(
    host: &str,
    port: u16,
    method: &str,
    path: &str,
    json: Option<&[u8]>,
    user_agent: &str,
) -> Result<Reply, ClientError> {
    let mut stream = TcpStream::connect((host, port)).await?;
    let body = json.unwrap_or_default();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\nAccept: application/json\r\nUser-Agent: {user_agent}\r\nContent-Length: {}\r\n",
        body.len()
    );
    if json.is_some() {
        head.push_str("Content-Type: application/json\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut buf = Vec::new();
    let limit = (MAX_REPLY_BYTES + 16 * 1024) as u64;
    (&mut stream).take(limit + 1).read_to_end(&mut buf).await?;
    if buf.len() as u64 > limit {
        return Err(ClientError::BadReply("reply too large"));
    }
    parse_reply(&buf)
}

/// Parses a complete HTTP/1.x reply (read to EOF).
fn parse_reply(buf: &[u8]) -> Result<Reply, ClientError> {
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or(ClientError::BadReply("no header end"))?;
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| ClientError::BadReply("head"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    if !parts.next().unwrap_or_default().starts_with("HTTP/1.") {
        return Err(ClientError::BadReply("not HTTP/1.x"));
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or(ClientError::BadReply("status"))?;
    let mut length = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("transfer-encoding") && !value.eq_ignore_ascii_case("identity")
        {
            return Err(ClientError::BadReply("chunked reply"));
        }
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| ClientError::BadReply("content-length"))?,
            );
        }
    }
    let rest = &buf[end + 4..];
    let body = match length {
        Some(n) if n > MAX_REPLY_BYTES => return Err(ClientError::BadReply("reply too large")),
        Some(n) if n > rest.len() => return Err(ClientError::BadReply("truncated body")),
        Some(n) => rest[..n].to_vec(),
        None => rest.to_vec(),
    };
    Ok(Reply { status, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_replies_and_refuses_what_it_cannot_bound() {
        let r = parse_reply(b"HTTP/1.1 202 Accepted\r\ncontent-length: 2\r\n\r\n{}extra").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (202, &b"{}"[..]));
        let r = parse_reply(b"HTTP/1.0 404 Not Found\r\n\r\nnope").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (404, &b"nope"[..]));
        for bad in [
            &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}",
            b"SSH-2.0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n",
        ] {
            assert!(parse_reply(bad).is_err());
        }
    }
}
