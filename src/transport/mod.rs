//! ZMQ sockets, byte level: the only module of kvplane that touches the `zeromq` crate.
//!
//! It owns socket set-up (bind and connect addresses, the bound port when port 0 is asked),
//! multipart framing, timeouts and recovery. It decodes nothing: every frame goes in and out as
//! [`Bytes`], and the protocol layer decides what the bytes mean. Keeping the crate behind this
//! module lets kvplane swap it (for libzmq bindings, say) without touching the callers.
//!
//! Controller side: [`PullListener`] (fire-and-forget worker batches), [`RouterListener`]
//! (requests from workers' DEALER sockets, replies by peer identity, splittable into
//! [`RouterReceiver`] and [`RouterSender`]) and [`ReqClient`] (the downlink to one worker's REP
//! socket). Worker side: [`PushSender`], [`DealerClient`] and [`RepServer`]. Indexer side:
//! [`Subscriber`] and [`ReplayClient`]; their engine-side twins, for load generators and
//! simulated engines: [`Publisher`] and [`ReplayServer`]. The listeners'
//! `bind_with` takes the [`TransportLimits`] their peers must keep to; clients use the
//! defaults.
//!
//! What `zeromq` 0.7.0 lacks, and how this module makes up for it (pinned by the learning tests
//! in `tests/system/transport.rs`):
//!
//! * No socket timeouts: every call that waits on a peer is bounded by a caller-provided
//!   duration and fails with [`TransportError::Timeout`] instead of hanging. Listener `recv`
//!   calls wait for traffic on purpose and have no timeout; they are cancel-safe, so the caller
//!   can `select!` them against a shutdown signal or wrap them in its own timeout.
//! * No reconnection for REQ, DEALER and PUSH, and a REQ socket is stuck after a lost reply:
//!   the clients connect lazily and drop their socket after any failure, so the next call
//!   builds a fresh one.
//! * A connect to a port where nothing listens retries (with backoff) until the timeout.
//! * A broken peer connection makes `zeromq`'s PULL `recv` return an error (after dropping
//!   that peer): [`PullListener`] returns it as [`TransportError::PeerDropped`] and keeps
//!   receiving from the others. Upstream, `zeromq`'s REP socket keeps such a peer and returns
//!   the same error forever (the patch ends a peer's stream after its first error), so
//!   [`RepServer`] is built on a ROUTER socket instead. Broken peers are only noticed while
//!   `recv` runs.
//! * A dropped `zeromq` PULL socket keeps its accepted connections open: [`PullListener`]
//!   closes them on drop. A dropped listener frees its port shortly after, not at once.
//! * No defence against hostile peers: upstream 0.7.0 reserves a frame's claimed length
//!   before reading it (73 bytes claiming 1 TiB abort the process), buffers an endless
//!   multipart message, and has no handshake timeout. kvplane builds a patched copy
//!   (`vendor/zeromq`, see its `KVPLANE-PATCHES.md`) and sets [`TransportLimits`] on every
//!   socket it creates: a frame or message over the limit, or a handshake not done in time,
//!   closes that one connection, and memory is prepared only as a frame's bytes arrive.
//! * No cap on connections and no idle timeout: a peer could open thousands of connections,
//!   or complete a handshake and then hold its connection silently forever. The patch adds
//!   both, set through [`TransportLimits`] (`max_connections`, `idle_timeout`).
//! * Dropped peers are invisible: the patch reports each one with its reason, and the
//!   listeners count them in the [`TransportStats`] attached to their limits.
//!   [`PullListener::recv`] also returns them as [`TransportError::PeerDropped`].
//!
//! Addresses are `host:port` without a scheme, as LMCache writes them (`tcp://` is accepted
//! too); `*` as a bind host means all interfaces.

mod client;
mod listener;
mod publisher;
mod stats;
mod subscriber;

pub use client::{DealerClient, PushSender, RepServer, ReqClient};
pub use listener::{
    PeerId, PullListener, RouterListener, RouterReceiver, RouterRequest, RouterSender,
    DEFAULT_REPLY_TIMEOUT,
};
pub use publisher::{Publisher, ReplayServer};
pub use stats::{DropReason, TransportStats};
pub use subscriber::{BoundSubscriber, ReplayClient, Subscriber, SubscriberEvent};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use zeromq::{Socket, ZmqError, ZmqMessage};

/// A boxed error from the socket library, kept as a source so callers never see its type.
type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in the transport layer.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The address could not be bound (bad syntax, port in use, unresolvable host).
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address as the caller gave it.
        addr: String,
        /// What the operating system or the socket library said.
        #[source]
        source: BoxError,
    },
    /// Connecting failed for a reason other than "nobody listens yet" (which is retried until
    /// the timeout): a malformed or unresolvable address, or a peer that is not a compatible
    /// ZMQ socket.
    #[error("cannot connect to {endpoint}: {source}")]
    Connect {
        /// The endpoint as the caller gave it.
        endpoint: String,
        /// What went wrong.
        #[source]
        source: BoxError,
    },
    /// The operation did not complete within the caller's bound.
    #[error("timed out")]
    Timeout,
    /// Sending or receiving failed, e.g. the peer went away.
    #[error("socket error: {0}")]
    Socket(#[source] BoxError),
    /// A message must have at least one frame.
    #[error("cannot send a message with no frames")]
    EmptyMessage,
    /// A listener closed one peer's connection (already counted in its [`TransportStats`]).
    /// Not a failure of the listener: it goes on serving the other peers, and the next
    /// `recv` may be called at once.
    #[error("peer connection dropped: {reason}")]
    PeerDropped {
        /// Why.
        reason: DropReason,
    },
}

/// Result alias for this module.
pub type Result<T, E = TransportError> = std::result::Result<T, E>;

fn socket_error(error: ZmqError) -> TransportError {
    TransportError::Socket(Box::new(error))
}

/// Turns a `host:port` (or `tcp://host:port`, or `*:port`) bind address into what
/// `TcpListener::bind` resolves.
fn bind_target(addr: &str) -> String {
    let addr = addr.strip_prefix("tcp://").unwrap_or(addr);
    match addr.strip_prefix("*:") {
        Some(port) => format!("0.0.0.0:{port}"),
        None => addr.to_owned(),
    }
}

/// Turns a `host:port` connect address into a `zeromq` endpoint string.
fn connect_target(endpoint: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("tcp://{endpoint}")
    }
}

/// Binds `socket` to `addr` and returns the address actually bound (port 0 resolved).
///
/// The TCP listener is bound here and handed to the socket, so the result is the kernel's own
/// `local_addr` (`zeromq`'s `bind` would echo the host string back, unresolved).
async fn bind_socket<S: Socket>(socket: &mut S, addr: &str) -> Result<SocketAddr> {
    let bind_error = |source: BoxError| TransportError::Bind {
        addr: addr.to_owned(),
        source,
    };
    let listener = tokio::net::TcpListener::bind(bind_target(addr))
        .await
        .map_err(|e| bind_error(e.into()))?;
    let local = listener.local_addr().map_err(|e| bind_error(e.into()))?;
    let listener = listener.into_std().map_err(|e| bind_error(e.into()))?;
    socket
        .bind_listener(listener)
        .await
        .map_err(|e| bind_error(e.into()))?;
    Ok(local)
}

/// Connects `socket` to `endpoint`. A refused connection is retried by `zeromq` with backoff,
/// forever: the caller bounds this with its own timeout.
async fn connect_socket<S: Socket>(socket: &mut S, endpoint: &str) -> Result<()> {
    socket
        .connect(&connect_target(endpoint))
        .await
        .map_err(|e| TransportError::Connect {
            endpoint: endpoint.to_owned(),
            source: e.into(),
        })
}

/// Default for [`TransportLimits::max_frame_bytes`], as the controller's `--max-frame-bytes`.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;
/// Default for [`TransportLimits::max_message_bytes`].
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;
/// Default for [`TransportLimits::handshake_timeout`].
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default for [`TransportLimits::max_connections`], as the controller's
/// `--max-zmq-connections`: far above one connection per socket per LMCache worker, far below
/// a default file-descriptor limit of 65 536.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Room a message always has beside one frame of the largest size, for its envelope (a
/// DEALER's empty delimiter, say).
const ENVELOPE_ALLOWANCE: usize = 64 * 1024;

/// What one peer may make a socket hold, and where the connections a listener drops are
/// counted. Breaking a limit closes that peer's connection; the socket goes on serving the
/// others.
#[derive(Clone, Debug)]
pub struct TransportLimits {
    /// Largest frame accepted. A frame header claiming more closes the connection before any
    /// of the frame is read.
    pub max_frame_bytes: usize,
    /// Largest multipart message accepted, all frames together (each counts at least 32
    /// bytes, so a flood of empty frames is bounded too). Never less, in effect, than
    /// `max_frame_bytes` plus 64 KiB, so one frame of the largest size always fits.
    pub max_message_bytes: usize,
    /// Time a new connection has for the ZMTP greeting and READY exchange.
    pub handshake_timeout: Duration,
    /// Most connections a listener keeps open at once; one accepted beyond is closed at
    /// once. `None`: unlimited.
    pub max_connections: Option<usize>,
    /// Longest a connection may go, after its handshake, without delivering a complete
    /// message (a partial frame does not count). `None` (the default): no limit, because a
    /// healthy LMCache worker's PUSH or DEALER socket may be silent for hours. Enforced while
    /// the listener's `recv` is waiting.
    pub idle_timeout: Option<Duration>,
    /// Where dropped peers are counted; `None`: nowhere (they are still logged at debug).
    pub stats: Option<Arc<TransportStats>>,
}

impl Default for TransportLimits {
    fn default() -> Self {
        Self {
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_connections: Some(DEFAULT_MAX_CONNECTIONS),
            idle_timeout: None,
            stats: None,
        }
    }
}

impl TransportLimits {
    /// The defaults, with `max_frame_bytes` as given.
    pub fn with_max_frame_bytes(max_frame_bytes: usize) -> Self {
        Self {
            max_frame_bytes,
            ..Self::default()
        }
    }

    /// The `zeromq` options that enforce these limits.
    fn socket_options(&self) -> zeromq::SocketOptions {
        let max_message = self
            .max_message_bytes
            .max(self.max_frame_bytes.saturating_add(ENVELOPE_ALLOWANCE));
        let mut options = zeromq::SocketOptions::default();
        options
            .max_frame_size(self.max_frame_bytes)
            .max_message_size(max_message)
            .handshake_timeout(self.handshake_timeout);
        if let Some(max) = self.max_connections {
            options.max_connections(max);
        }
        if let Some(idle) = self.idle_timeout {
            options.idle_timeout(idle);
        }
        if let Some(stats) = &self.stats {
            options.peer_drop_observer(stats.observer());
        }
        options
    }
}

/// Socket options for client sockets: the default [`TransportLimits`], and no connect timeout
/// of the crate's own (its default is 30 s), because every client call is bounded by the
/// caller's timeout as a whole.
fn client_options() -> zeromq::SocketOptions {
    let mut options = TransportLimits::default().socket_options();
    options.no_connect_timeout();
    options
}

/// Builds a message from frames; `None` when there are none.
fn message(frames: Vec<Bytes>) -> Option<ZmqMessage> {
    ZmqMessage::try_from(frames).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_target_accepts_lmcache_forms() {
        assert_eq!(bind_target("0.0.0.0:8300"), "0.0.0.0:8300");
        assert_eq!(bind_target("*:8300"), "0.0.0.0:8300");
        assert_eq!(bind_target("tcp://127.0.0.1:0"), "127.0.0.1:0");
        assert_eq!(bind_target("tcp://*:0"), "0.0.0.0:0");
        assert_eq!(bind_target("[::1]:0"), "[::1]:0");
    }

    #[test]
    fn connect_target_adds_the_scheme_once() {
        assert_eq!(connect_target("10.0.0.5:8001"), "tcp://10.0.0.5:8001");
        assert_eq!(connect_target("tcp://10.0.0.5:8001"), "tcp://10.0.0.5:8001");
        assert_eq!(connect_target("[::1]:8001"), "tcp://[::1]:8001");
    }

    #[test]
    fn limits_default_to_the_controller_defaults() {
        let limits = TransportLimits::default();
        assert_eq!(limits.max_frame_bytes, 64 * 1024 * 1024);
        assert_eq!(limits.max_message_bytes, 256 * 1024 * 1024);
        assert_eq!(limits.handshake_timeout, Duration::from_secs(10));
        assert_eq!(limits.max_connections, Some(4096));
        assert_eq!(limits.idle_timeout, None);
        let custom = TransportLimits::with_max_frame_bytes(1024);
        assert_eq!(custom.max_frame_bytes, 1024);
        assert_eq!(custom.max_message_bytes, DEFAULT_MAX_MESSAGE_BYTES);
    }

    #[test]
    fn message_needs_a_frame() {
        assert!(message(Vec::new()).is_none());
        let frames = vec![Bytes::from_static(b"a"), Bytes::new()];
        assert_eq!(message(frames).map(|m| m.len()), Some(2));
    }

    #[tokio::test]
    async fn bind_reports_the_real_port_and_rejects_garbage() {
        let (_pull, addr) = PullListener::bind("127.0.0.1:0").await.expect("bind");
        assert_ne!(addr.port(), 0);
        assert!(addr.ip().is_loopback());
        let taken = PullListener::bind(&addr.to_string()).await;
        assert!(matches!(taken, Err(TransportError::Bind { .. })));
        let garbage = PullListener::bind("not an address").await;
        assert!(matches!(garbage, Err(TransportError::Bind { .. })));
    }

    #[tokio::test]
    async fn malformed_endpoint_is_a_connect_error() {
        let mut req = ReqClient::new("no-port-here".into(), Duration::from_secs(2));
        let result = req.request(Bytes::from_static(b"x")).await;
        assert!(
            matches!(result, Err(TransportError::Connect { .. })),
            "{result:?}"
        );
    }
}
