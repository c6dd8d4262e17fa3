//! HTTP and fake-worker helpers: fake workers (a REP socket on its own task), a `oneshot`
//! caller for the router, and the one HTTP/1.1 client the integration tests use over real
//! sockets. Every wait is bounded; loopback only.

use super::within;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt;
use kvplane::protocol::{decode, encode, Msg};
use kvplane::transport::RepServer;
use serde_json::Value;
use std::future::Future;
use std::net::SocketAddr;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tower::ServiceExt;

/// Aborts the task when dropped.
pub struct AbortOnDrop(pub JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A worker's command socket on 127.0.0.1 served by a background task.
pub struct FakeWorker {
    /// The REP port.
    pub port: u16,
    /// Every command received, in order.
    pub commands: mpsc::UnboundedReceiver<Msg>,
    _task: AbortOnDrop,
}

impl FakeWorker {
    /// Starts a worker that answers each command with `answer(command)`, or stays silent when
    /// it returns `None`.
    pub async fn start(answer: impl Fn(&Msg) -> Option<Msg> + Send + 'static) -> Self {
        Self::start_async(move |msg| std::future::ready(answer(&msg))).await
    }

    /// [`FakeWorker::start`] with an answer that may wait (on a barrier, a gate) before it is
    /// sent; the command is recorded as it arrives.
    pub async fn start_async<F, Fut>(answer: F) -> Self
    where
        F: Fn(Msg) -> Fut + Send + 'static,
        Fut: Future<Output = Option<Msg>> + Send,
    {
        let (mut rep, addr) = within("bind rep", RepServer::bind("127.0.0.1:0"))
            .await
            .expect("rep binds");
        let (tx, commands) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Ok(bytes) = rep.recv().await {
                let Ok(msg) = decode(&bytes) else { continue };
                let _ = tx.send(msg.clone());
                if let Some(reply) = answer(msg).await {
                    let _ = rep.reply(Bytes::from(encode(&reply))).await;
                }
            }
        });
        FakeWorker {
            port: addr.port(),
            commands,
            _task: AbortOnDrop(task),
        }
    }

    /// The next command received.
    pub async fn next_command(&mut self) -> Msg {
        within("worker command", self.commands.recv())
            .await
            .expect("worker task alive")
    }
}

/// A response: status, headers and the body as JSON (or a JSON string for non-JSON bodies).
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

/// Sends one request through the router with `oneshot`.
pub async fn call(
    app: Router,
    method: &str,
    uri: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> Answer {
    let mut builder = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    let request = match body {
        Some(b) => builder
            .header("content-type", "application/json")
            .body(Body::from(b.to_owned())),
        None => builder.body(Body::empty()),
    }
    .expect("request builds");
    let response = within(&format!("{method} {uri}"), app.oneshot(request))
        .await
        .expect("infallible");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = within("body", response.into_body().collect())
        .await
        .expect("body")
        .to_bytes();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    Answer {
        status,
        headers,
        body,
    }
}

/// One HTTP/1.1 request over a fresh TCP connection (`Connection: close`), bounded by
/// [`STEP`](super::STEP): the status and the body as JSON (a JSON string for a non-JSON body).
/// Panics on a connection error or a malformed response.
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> (u16, Value) {
    within(
        &format!("HTTP {method} {path}"),
        try_http(addr, method, path, body, headers),
    )
    .await
    .unwrap_or_else(|e| panic!("HTTP {method} {path} to {addr}: {e}"))
}

/// [`http`] `POST path` with a JSON `body` and no other headers.
pub async fn http_post(addr: SocketAddr, path: &str, body: &str) -> (u16, Value) {
    http(addr, "POST", path, Some(body), &[]).await
}

/// [`http`] without the bound and the panic: an error if the connection fails or the answer
/// is not HTTP (for probing a server that may not be up yet; wrap it in a timeout).
pub async fn try_http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> std::io::Result<(u16, Value)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = body.unwrap_or("");
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(head.as_bytes()).await?;
    s.write_all(body.as_bytes()).await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP response");
    let (head, payload) = text.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let payload = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(payload)
    } else {
        payload.to_owned()
    };
    let value = serde_json::from_str(&payload).unwrap_or(Value::String(payload));
    Ok((status, value))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Polls `GET path` on `addr` until a 200 answer's JSON satisfies `cond` (connection errors
/// count as not yet), for at most `limit`; that answer.
pub async fn until_json(
    addr: SocketAddr,
    path: &str,
    what: &str,
    limit: std::time::Duration,
    cond: impl Fn(&Value) -> bool,
) -> Value {
    super::eventually(what, limit, async || {
        match try_http(addr, "GET", path, None, &[]).await {
            Ok((200, v)) if cond(&v) => Ok(v),
            Ok((status, v)) => Err(format!("{status} {v}")),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
}

/// Sends `request` as raw bytes on a fresh connection and reads until the server closes it.
pub async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    within("raw exchange", async {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(request).await.expect("write");
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    })
    .await
}
