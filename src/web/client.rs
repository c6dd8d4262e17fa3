//! The HTTP client of every service: hyper's HTTP/1 client through hyper-util's pooled client.
//! [`pooled`] builds one (the router's calls to engines hold their own, with their own pool
//! size); [`Caller::call`] is the bounded JSON call services make to one another (the coordinator to
//! MP servers, a node to its coordinator): a deadline over connect + write + read, the reply
//! body capped at [`MAX_REPLY_BYTES`] whether it comes with a `Content-Length`, chunked or up
//! to the close, and few idle connections kept per peer.
//!
//! Owns the client and its bounds only: what a reply means is the caller's.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Body;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::sync::OnceLock;
use std::time::Duration;

/// Largest reply body read by [`Caller::call`].
pub const MAX_REPLY_BYTES: usize = 4 << 20;

/// Idle connections [`Caller::call`] keeps per peer: a node's batches to its coordinator reuse one;
/// a coordinator of 10,000 MP servers holds at most one idle connection to each, for
/// [`CALL_IDLE`] at most.
const CALL_IDLE_PER_PEER: usize = 1;

/// How long an idle connection of [`Caller::call`] stays open.
const CALL_IDLE: Duration = Duration::from_secs(15);

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The request is not one HTTP can carry (a host or path with bad characters).
    #[error("bad request: {0}")]
    Request(#[from] hyper::http::Error),
    /// Connect, write or read failed.
    #[error("{0}")]
    Transport(#[from] hyper_util::client::legacy::Error),
    /// No complete reply within the deadline.
    #[error("no reply within {0:?}")]
    Timeout(Duration),
    /// The reply body broke off, or is larger than [`MAX_REPLY_BYTES`].
    #[error("bad reply: {0}")]
    BadReply(String),
}

/// A reply: status and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Body bytes.
    pub body: Vec<u8>,
}

/// A pooled HTTP/1 client: `connect` bounds each TCP connect (`None`: the caller's own
/// deadline does), idle connections close after `idle`, at most `idle_per_host` kept per peer.
pub fn pooled<B>(
    connect: Option<Duration>,
    idle: Duration,
    idle_per_host: usize,
) -> Client<HttpConnector, B>
where
    B: Body + Send + 'static,
    B::Data: Send,
{
    let mut http = HttpConnector::new();
    http.set_connect_timeout(connect);
    http.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(idle)
        .pool_max_idle_per_host(idle_per_host)
        .build(http)
}

/// The client every [`Caller::call`] of this process goes through.
fn shared() -> &'static Client<HttpConnector, Full<Bytes>> {
    static CLIENT: OnceLock<Client<HttpConnector, Full<Bytes>>> = OnceLock::new();
    CLIENT.get_or_init(|| pooled(None, CALL_IDLE, CALL_IDLE_PER_PEER))
}

/// A service's calls: the user agent each of them names.
#[derive(Clone, Copy, Debug)]
pub struct Caller(pub &'static str);

impl Caller {
    /// Sends `method path` with an optional JSON body to `host:port`.
    ///
    /// # Errors
    /// [`ClientError`] on connection failure, timeout or an unreadable reply.
    pub async fn call(
        self,
        host: &str,
        port: u16,
        method: &str,
        path: &str,
        json: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Reply, ClientError> {
        let authority = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("http://{authority}{path}"))
            .header(hyper::header::ACCEPT, "application/json")
            .header(hyper::header::USER_AGENT, self.0);
        if json.is_some() {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let req = req.body(Full::new(Bytes::copy_from_slice(json.unwrap_or_default())))?;
        tokio::time::timeout(timeout, async {
            let resp = shared().request(req).await?;
            let status = resp.status().as_u16();
            let body = Limited::new(resp.into_body(), MAX_REPLY_BYTES)
                .collect()
                .await
                .map_err(|e| ClientError::BadReply(e.to_string()))?
                .to_bytes();
            Ok(Reply {
                status,
                body: body.to_vec(),
            })
        })
        .await
        .map_err(|_| ClientError::Timeout(timeout))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A peer that reads one request head and answers `reply` as written, then closes.
    async fn peer(reply: Vec<u8>) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    return;
                }
                got.extend_from_slice(&buf[..n]);
            }
            let _ = s.write_all(&reply).await;
            let _ = s.shutdown().await;
        });
        port
    }

    async fn get(port: u16) -> Result<Reply, ClientError> {
        Caller("t")
            .call("127.0.0.1", port, "GET", "/x", None, Duration::from_secs(5))
            .await
    }

    #[tokio::test]
    async fn reads_every_framing_and_refuses_what_it_cannot_bound() {
        let ok = |p: &[u8]| p.to_vec();
        let port = peer(ok(b"HTTP/1.1 202 Accepted\r\ncontent-length: 2\r\n\r\n{}")).await;
        let r = get(port).await.unwrap();
        assert_eq!((r.status, r.body.as_slice()), (202, &b"{}"[..]));
        let port = peer(ok(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        ))
        .await;
        assert_eq!(get(port).await.unwrap().body, b"{}");
        let port = peer(ok(b"HTTP/1.0 404 Not Found\r\n\r\nnope")).await;
        let r = get(port).await.unwrap();
        assert_eq!((r.status, r.body.as_slice()), (404, &b"nope"[..]));
        // A body cut short, a reply that is not HTTP, a body over the cap.
        let port = peer(ok(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}")).await;
        assert!(matches!(get(port).await, Err(ClientError::BadReply(_))));
        let port = peer(ok(b"SSH-2.0\r\n\r\n")).await;
        assert!(matches!(get(port).await, Err(ClientError::Transport(_))));
        let mut big = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
            MAX_REPLY_BYTES + 1
        )
        .into_bytes();
        big.resize(big.len() + MAX_REPLY_BYTES + 1, b' ');
        let port = peer(big).await;
        assert!(matches!(get(port).await, Err(ClientError::BadReply(_))));
    }

    #[tokio::test]
    async fn a_silent_peer_times_out_and_a_closed_port_fails() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let r = Caller("t")
            .call(
                "127.0.0.1",
                port,
                "GET",
                "/",
                None,
                Duration::from_millis(200),
            )
            .await;
        assert!(matches!(r, Err(ClientError::Timeout(_))));
        drop(l);
        assert!(matches!(get(port).await, Err(ClientError::Transport(_))));
    }
}
