//! A keep-alive HTTP/1.1 client connection for the coordinator scenario: one request at a
//! time, `Content-Length` or chunked replies, every call bounded by a timeout. No HTTP client
//! dependency, and nothing the client does is hidden in a pool: one simulated server is one
//! connection, as an MP server's `httpx` client keeps one.

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest reply body read (the bench's replies are small JSON).
const MAX_BODY: usize = 16 << 20;

/// One persistent connection to `authority`.
#[derive(Debug)]
pub(super) struct Conn {
    authority: String,
    stream: TcpStream,
    buf: Vec<u8>,
    out: Vec<u8>,
    /// Whether any byte of the current reply arrived (a failure before that is a stale
    /// keep-alive connection the server closed while idle: reconnect and send again).
    answered: bool,
}

impl Conn {
    /// Connects (bounded by `timeout`).
    ///
    /// # Errors
    /// A message naming the address.
    pub(super) async fn connect(authority: &str, timeout: Duration) -> Result<Conn, String> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect(authority))
            .await
            .map_err(|_| format!("connect {authority}: timed out"))?
            .map_err(|e| format!("connect {authority}: {e}"))?;
        stream
            .set_nodelay(true)
            .map_err(|e| format!("nodelay: {e}"))?;
        Ok(Conn {
            authority: authority.to_owned(),
            stream,
            buf: Vec::with_capacity(4096),
            out: Vec::with_capacity(4096),
            answered: false,
        })
    }

    /// Sends one request and reads its reply: `(status, body)`.
    ///
    /// # Errors
    /// A message naming the request and what failed.
    pub(super) async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<(u16, Vec<u8>), String> {
        let call = async {
            match self.exchange(method, path, body).await {
                Err(_) if !self.answered => {
                    // The server closed the idle connection (uvicorn after its keep-alive
                    // timeout); reconnect once and send again, as httpx does.
                    let fresh = Conn::connect(&self.authority, timeout).await?;
                    *self = fresh;
                    self.exchange(method, path, body).await
                }
                other => other,
            }
        };
        tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| format!("{method} {path}: no answer within {timeout:?}"))?
            .map_err(|e| format!("{method} {path}: {e}"))
    }

    async fn exchange(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<(u16, Vec<u8>), String> {
        self.answered = false;
        self.buf.clear();
        self.out.clear();
        self.out.extend_from_slice(
            format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.authority).as_bytes(),
        );
        if let Some(b) = body {
            self.out.extend_from_slice(
                format!(
                    "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    b.len()
                )
                .as_bytes(),
            );
            self.out.extend_from_slice(b);
        } else {
            self.out.extend_from_slice(b"Content-Length: 0\r\n\r\n");
        }
        self.stream
            .write_all(&self.out)
            .await
            .map_err(|e| format!("write: {e}"))?;
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if self.buf.len() > 64 * 1024 {
                return Err("reply header over 64 KiB".into());
            }
            self.fill().await?;
        };
        let head = std::str::from_utf8(&self.buf[..head_end])
            .map_err(|_| "reply header is not UTF-8".to_owned())?
            .to_owned();
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad status line {:?}", head.lines().next()))?;
        let header = |name: &str| {
            head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_owned())
            })
        };
        self.buf.drain(..head_end);
        let chunked = header("transfer-encoding").is_some_and(|v| v.contains("chunked"));
        let body = if chunked {
            self.read_chunked().await?
        } else {
            let len: usize = match header("content-length") {
                Some(v) => v.parse().map_err(|_| format!("bad Content-Length {v:?}"))?,
                None => 0,
            };
            if len > MAX_BODY {
                return Err(format!("reply body of {len} bytes"));
            }
            while self.buf.len() < len {
                self.fill().await?;
            }
            self.buf.drain(..len).collect()
        };
        Ok((status, body))
    }

    async fn read_chunked(&mut self) -> Result<Vec<u8>, String> {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                self.fill().await?;
            };
            let size_text = String::from_utf8_lossy(&self.buf[..line_end]).into_owned();
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| format!("bad chunk size {size_text:?}"))?;
            if body.len() + size > MAX_BODY {
                return Err("chunked reply too large".into());
            }
            while self.buf.len() < line_end + 2 + size + 2 {
                self.fill().await?;
            }
            body.extend_from_slice(&self.buf[line_end + 2..line_end + 2 + size]);
            self.buf.drain(..line_end + 2 + size + 2);
            if size == 0 {
                return Ok(body);
            }
        }
    }

    async fn fill(&mut self) -> Result<(), String> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self
            .stream
            .read(&mut chunk)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("connection closed".into());
        }
        self.answered = true;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}
