//! Request clients and the worker-side sockets: REQ (controller downlink), PUSH, DEALER, and
//! a REP server.
//!
//! The connecting sockets connect lazily and are dropped after any failure, so that the next
//! call starts from a fresh socket: `zeromq` does not reconnect REQ, DEALER or PUSH sockets, a
//! REQ socket whose reply was lost refuses to send again, and a late reply on a DEALER would
//! be taken for the answer to the next request.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use zeromq::prelude::*;
use zeromq::{DealerSocket, PushSocket, ReqSocket, ZmqMessage};

use super::{
    client_options, connect_socket, message, socket_error, PeerId, Result, RouterListener,
    RouterRequest, TransportError, TransportLimits,
};

/// Runs `op` on the socket in `slot` (connecting a new one to `endpoint` first if there is
/// none), all within `timeout`. The socket is taken out of `slot` for the call and put back
/// only on success, so a failure, a timeout or a cancelled call leaves `slot` empty and the
/// next call starts from a fresh socket.
async fn with_socket<S, T, F>(
    slot: &mut Option<S>,
    endpoint: &str,
    timeout: Duration,
    op: F,
) -> Result<T>
where
    S: Socket,
    F: AsyncFnOnce(&mut S) -> Result<T>,
{
    let taken = slot.take();
    let attempt = async {
        let mut socket = match taken {
            Some(socket) => socket,
            None => {
                let mut socket = S::with_options(client_options());
                connect_socket(&mut socket, endpoint).await?;
                socket
            }
        };
        let value = op(&mut socket).await?;
        Ok((socket, value))
    };
    let (socket, value) = tokio::time::timeout(timeout, attempt)
        .await
        .map_err(|_| TransportError::Timeout)??;
    *slot = Some(socket);
    Ok(value)
}

/// The payload of a reply: its last frame, as LMCache reads `frames[-1]`.
fn last_frame(reply: ZmqMessage) -> Result<Bytes> {
    reply
        .into_vec()
        .pop()
        .ok_or_else(|| TransportError::Socket("empty reply".into()))
}

/// The controller's downlink to one worker's REP socket: one request, one reply, at a time.
pub struct ReqClient {
    endpoint: String,
    timeout: Duration,
    socket: Option<ReqSocket>,
}

impl ReqClient {
    /// A client for the REP socket at `endpoint` (`ip:port`). No I/O happens until the first
    /// request; every request (connecting included) is bounded by `timeout`.
    pub fn new(endpoint: String, timeout: Duration) -> Self {
        Self {
            endpoint,
            timeout,
            socket: None,
        }
    }

    /// The endpoint this client talks to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Drops the socket, if any; the next request opens a fresh one. Not needed after a
    /// failed or cancelled request, which already does this.
    pub fn reset(&mut self) {
        self.socket = None;
    }

    /// Sends `payload` as one frame and returns the reply's payload frame.
    ///
    /// Connects first if needed; a worker that does not listen yet is retried until the
    /// timeout. Fails with [`TransportError::Timeout`] if the whole exchange takes longer than
    /// the timeout, [`TransportError::Connect`] if the endpoint is malformed or is not a REP
    /// socket, [`TransportError::Socket`] if the connection breaks. After any failure the
    /// socket is discarded and the next request opens a fresh one; the same holds when the
    /// caller drops the returned future before it completes.
    pub async fn request(&mut self, payload: Bytes) -> Result<Bytes> {
        with_socket(
            &mut self.socket,
            &self.endpoint,
            self.timeout,
            async |socket: &mut ReqSocket| {
                socket.send(payload.into()).await.map_err(socket_error)?;
                last_frame(socket.recv().await.map_err(socket_error)?)
            },
        )
        .await
    }
}

/// A worker's DEALER socket to a controller ROUTER: request/reply with LMCache's framing.
pub struct DealerClient {
    endpoint: String,
    timeout: Duration,
    socket: Option<DealerSocket>,
}

impl DealerClient {
    /// A client for the ROUTER socket at `endpoint` (`host:port`). No I/O happens until the
    /// first request; every request (connecting included) is bounded by `timeout`.
    pub fn new(endpoint: String, timeout: Duration) -> Self {
        Self {
            endpoint,
            timeout,
            socket: None,
        }
    }

    /// Sends `["", payload]` and returns the last frame of the reply. Errors as for
    /// [`ReqClient::request`]; after any failure the socket is rebuilt, as LMCache's worker
    /// does, so a late reply is never taken for the answer to a later request.
    pub async fn request(&mut self, payload: Bytes) -> Result<Bytes> {
        with_socket(
            &mut self.socket,
            &self.endpoint,
            self.timeout,
            async |socket: &mut DealerSocket| {
                let mut request = ZmqMessage::from(payload);
                request.push_front(Bytes::new());
                socket.send(request).await.map_err(socket_error)?;
                last_frame(socket.recv().await.map_err(socket_error)?)
            },
        )
        .await
    }
}

/// A worker's PUSH socket to the controller's PULL socket.
pub struct PushSender {
    endpoint: String,
    socket: Option<PushSocket>,
}

impl PushSender {
    /// A sender to the PULL socket at `endpoint` (`host:port`). No I/O happens until the first
    /// send.
    pub fn new(endpoint: String) -> Self {
        Self {
            endpoint,
            socket: None,
        }
    }

    /// Sends `frames` as one multipart message, connecting first if needed, all within
    /// `timeout`.
    ///
    /// `Ok` means the message was queued for the connection, not that the peer got it: as with
    /// libzmq, messages queued on a connection that then breaks are lost. Once the socket
    /// notices the break, `send` fails and the next one reconnects.
    pub async fn send(&mut self, frames: Vec<Bytes>, timeout: Duration) -> Result<()> {
        let message = message(frames).ok_or(TransportError::EmptyMessage)?;
        with_socket(
            &mut self.socket,
            &self.endpoint,
            timeout,
            async |socket: &mut PushSocket| socket.send(message).await.map_err(socket_error),
        )
        .await
    }
}

/// A worker's REP socket, which serves the controller's REQ requests one at a time.
///
/// Built on a ROUTER socket, as libzmq builds REP: `zeromq`'s own REP socket keeps a peer
/// whose stream broke mid-frame and reports the same error from every later `recv`, which
/// would turn a serving loop into a busy loop. REQ peers accept a ROUTER as a REP.
///
/// A reply waits at most [`DEFAULT_REPLY_TIMEOUT`](super::DEFAULT_REPLY_TIMEOUT) unless
/// [`with_reply_timeout`](Self::with_reply_timeout) says otherwise.
pub struct RepServer {
    router: RouterListener,
    /// The peer and envelope (routing frames up to the empty delimiter, included) of the
    /// request awaiting its reply.
    pending: Option<(PeerId, Vec<Bytes>)>,
}

impl RepServer {
    /// Binds to `addr` (`host:port`, port 0 allowed) with the default [`TransportLimits`] and
    /// returns the server with the address actually bound.
    pub async fn bind(addr: &str) -> Result<(Self, SocketAddr)> {
        Self::bind_with(addr, &TransportLimits::default()).await
    }

    /// As [`bind`](Self::bind), with the given limits for every peer.
    pub async fn bind_with(addr: &str, limits: &TransportLimits) -> Result<(Self, SocketAddr)> {
        let (router, local) = RouterListener::bind_with(addr, limits).await?;
        let server = Self {
            router,
            pending: None,
        };
        Ok((server, local))
    }

    /// Sets how long a reply may wait before failing with [`TransportError::Timeout`].
    pub fn with_reply_timeout(mut self, timeout: Duration) -> Self {
        self.router = self.router.with_reply_timeout(timeout);
        self
    }

    /// Waits for the next request and returns its payload (the last frame). A request without
    /// the empty delimiter or without a payload is logged and skipped, and broken peers are
    /// dropped. A request left unanswered is forgotten when the next one arrives. Waits as
    /// long as it takes; cancel-safe.
    pub async fn recv(&mut self) -> Result<Bytes> {
        loop {
            let RouterRequest { peer, mut frames } = self.router.recv().await?;
            let Some(delimiter) = frames.iter().position(Bytes::is_empty) else {
                tracing::debug!(
                    frames = frames.len(),
                    "REP request without delimiter dropped"
                );
                continue;
            };
            let body = frames.split_off(delimiter + 1);
            let Some(payload) = body.into_iter().last() else {
                tracing::debug!("REP request without payload dropped");
                continue;
            };
            self.pending = Some((peer, frames));
            return Ok(payload);
        }
    }

    /// Replies to the request last returned by [`recv`](Self::recv), within the reply
    /// timeout. Fails with [`TransportError::Socket`] if there is none or its peer has gone.
    pub async fn reply(&mut self, payload: Bytes) -> Result<()> {
        let (peer, envelope) = self
            .pending
            .take()
            .ok_or_else(|| TransportError::Socket("no request awaits a reply".into()))?;
        let mut frames = envelope;
        frames.push(payload);
        let message = message(frames).ok_or(TransportError::EmptyMessage)?;
        self.router.send(&peer, message).await
    }
}
