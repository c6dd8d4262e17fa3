//! Controller-side listeners: PULL for worker batches, ROUTER for worker requests.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use zeromq::prelude::*;
use zeromq::{PullSocket, RouterRecvHalf, RouterSendHalf, RouterSocket, ZmqMessage};

use super::{bind_socket, socket_error, DropReason, Result, TransportError, TransportLimits};

/// How long a ROUTER or REP reply may wait before it fails, unless set otherwise.
pub const DEFAULT_REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// A bound PULL socket: receives the multipart messages that workers' PUSH sockets send.
pub struct PullListener {
    socket: PullSocket,
}

impl PullListener {
    /// Binds to `addr` (`host:port`, port 0 allowed) with the default [`TransportLimits`] and
    /// returns the listener with the address actually bound.
    pub async fn bind(addr: &str) -> Result<(Self, SocketAddr)> {
        Self::bind_with(addr, &TransportLimits::default()).await
    }

    /// As [`bind`](Self::bind), with the given limits for every peer.
    pub async fn bind_with(addr: &str, limits: &TransportLimits) -> Result<(Self, SocketAddr)> {
        let mut socket = PullSocket::with_options(limits.socket_options());
        let local = bind_socket(&mut socket, addr).await?;
        Ok((Self { socket }, local))
    }

    /// Waits for the next multipart message from any peer and returns its frames (at least
    /// one; LMCache sends up to 50, each one encoded message).
    ///
    /// Peers are served fairly, one message each in turn. Waits as long as it takes;
    /// cancel-safe (no message is lost when the future is dropped).
    ///
    /// # Errors
    /// [`TransportError::PeerDropped`] when the listener closed one peer's connection after
    /// its handshake (broken connection, undecodable framing, a [`TransportLimits`] limit
    /// broken, idle too long). That peer is gone, the drop is already counted in the limits'
    /// [`TransportStats`](super::TransportStats), and the listener serves the others: call
    /// `recv` again. Peers dropped before their handshake completes (connection cap,
    /// handshake timeout) are only counted.
    pub async fn recv(&mut self) -> Result<Vec<Bytes>> {
        loop {
            match self.socket.recv().await {
                Ok(message) => return Ok(message.into_vec()),
                // zeromq's PULL reports one peer's broken stream as an error of the whole
                // socket, after it has already dropped that peer.
                Err(error) => match error.peer_drop_reason() {
                    Some(reason) => {
                        return Err(TransportError::PeerDropped {
                            reason: DropReason::from_zmq(reason),
                        })
                    }
                    None => tracing::debug!(%error, "PULL peer left"),
                },
            }
        }
    }
}

impl Drop for PullListener {
    fn drop(&mut self) {
        // zeromq's PullSocket has no Drop of its own and its peers' writer tasks keep the
        // backend alive, so without this the accepted connections would stay open.
        self.socket.backend().shutdown();
    }
}

/// The identity a ROUTER socket gave one connected peer. Opaque bytes; stable for the life of
/// that connection, new after a reconnect.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PeerId(Bytes);

impl PeerId {
    /// The identity bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// One message a ROUTER received.
#[derive(Clone, Debug)]
pub struct RouterRequest {
    /// Who sent it; pass to [`RouterSender::reply`].
    pub peer: PeerId,
    /// Every frame after the identity. From a well-behaved DEALER this is `["", payload]`;
    /// validating that is the caller's job.
    pub frames: Vec<Bytes>,
}

/// A bound ROUTER socket, for requests from workers' DEALER sockets.
///
/// Use it as is from one task, or [`split`](Self::split) it to reply from other tasks while
/// receiving. Replies to one peer go out in the order `reply` is called. A reply waits at most
/// [`DEFAULT_REPLY_TIMEOUT`] unless [`with_reply_timeout`](Self::with_reply_timeout) says
/// otherwise.
pub struct RouterListener {
    receiver: RouterReceiver,
    sender: RouterSender,
}

impl RouterListener {
    /// Binds to `addr` (`host:port`, port 0 allowed) with the default [`TransportLimits`] and
    /// returns the listener with the address actually bound.
    pub async fn bind(addr: &str) -> Result<(Self, SocketAddr)> {
        Self::bind_with(addr, &TransportLimits::default()).await
    }

    /// As [`bind`](Self::bind), with the given limits for every peer.
    pub async fn bind_with(addr: &str, limits: &TransportLimits) -> Result<(Self, SocketAddr)> {
        let mut socket = RouterSocket::with_options(limits.socket_options());
        let local = bind_socket(&mut socket, addr).await?;
        let (send, recv) = socket.split();
        let listener = Self {
            receiver: RouterReceiver { half: recv },
            sender: RouterSender {
                half: send,
                timeout: DEFAULT_REPLY_TIMEOUT,
            },
        };
        Ok((listener, local))
    }

    /// Sets how long a reply may wait before failing with [`TransportError::Timeout`].
    pub fn with_reply_timeout(mut self, timeout: Duration) -> Self {
        self.sender.timeout = timeout;
        self
    }

    /// See [`RouterReceiver::recv`].
    pub async fn recv(&mut self) -> Result<RouterRequest> {
        self.receiver.recv().await
    }

    /// See [`RouterSender::reply`].
    pub async fn reply(&mut self, peer: &PeerId, payload: Bytes) -> Result<()> {
        self.sender.reply(peer, payload).await
    }

    /// Sends `message` to `peer` as is (after the identity), within the reply timeout.
    pub(super) async fn send(&mut self, peer: &PeerId, message: ZmqMessage) -> Result<()> {
        self.sender.send(peer, message).await
    }

    /// Splits into a receiving half and a cloneable sending half. The socket stays open until
    /// both are dropped.
    pub fn split(self) -> (RouterReceiver, RouterSender) {
        (self.receiver, self.sender)
    }
}

/// The receiving half of a [`RouterListener`].
pub struct RouterReceiver {
    half: RouterRecvHalf,
}

impl RouterReceiver {
    /// Waits for the next message from any peer. Peers are served fairly, one message each in
    /// turn, so a flooding peer cannot starve the others; broken peers, and peers that break a
    /// [`TransportLimits`] limit, are dropped by the socket and only counted in the limits'
    /// [`TransportStats`](super::TransportStats). Waits as long as it takes; cancel-safe.
    pub async fn recv(&mut self) -> Result<RouterRequest> {
        let mut frames = self
            .half
            .recv()
            .await
            .map_err(socket_error)?
            .into_vecdeque();
        // The socket always puts the identity first; an empty message would be a bug there.
        let identity = frames
            .pop_front()
            .ok_or_else(|| TransportError::Socket("ROUTER message without identity".into()))?;
        Ok(RouterRequest {
            peer: PeerId(identity),
            frames: frames.into(),
        })
    }
}

/// The sending half of a [`RouterListener`]; clone it to reply from several tasks.
#[derive(Clone)]
pub struct RouterSender {
    half: RouterSendHalf,
    timeout: Duration,
}

impl RouterSender {
    /// Sends `[identity, "", payload]` to `peer`, as LMCache's controller replies.
    ///
    /// The message is queued for that peer's connection; `Ok` does not mean it was delivered.
    /// A peer the socket already knows to be gone gives [`TransportError::Socket`]; one that
    /// vanished unnoticed has the reply dropped with the connection. Waits (only when that
    /// peer's send queue is full) at most the listener's reply timeout, then fails with
    /// [`TransportError::Timeout`].
    pub async fn reply(&mut self, peer: &PeerId, payload: Bytes) -> Result<()> {
        let mut message = ZmqMessage::from(payload);
        message.push_front(Bytes::new());
        self.send(peer, message).await
    }

    /// Sends `message` to `peer`, within the reply timeout.
    pub(super) async fn send(&mut self, peer: &PeerId, mut message: ZmqMessage) -> Result<()> {
        message.push_front(peer.0.clone());
        tokio::time::timeout(self.timeout, self.half.send(message))
            .await
            .map_err(|_| TransportError::Timeout)?
            .map_err(socket_error)
    }
}
