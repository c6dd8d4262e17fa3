//! The KV indexer's sockets: a SUB subscriber to an engine's event publisher, a bound SUB
//! socket that publishers connect to (the central topology, [`BoundSubscriber`]), and the
//! DEALER client of a publisher's replay ROUTER (vLLM's `replay_endpoint`).
//!
//! Bytes only, as the rest of this module: the indexer decides what frames mean. The SUB
//! socket reconnects by itself (`zeromq` 0.7 does this for SUB); its monitor tells
//! [`Subscriber::next`] when a connection comes up or goes, so the caller can replay after a
//! reconnect. The replay client drops its socket after any failure, so that a late reply to
//! one request is never read as the answer to the next.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use zeromq::prelude::*;
use zeromq::{DealerSocket, SocketEvent, SubSocket, ZmqMessage};

use super::{bind_socket, connect_socket, socket_error, Result, TransportError, TransportLimits};
use std::net::SocketAddr;

/// How long [`Subscriber::next`] waits on the monitor after a receive error before trying
/// again (the socket reconnects in the background meanwhile).
const RETRY_AFTER_ERROR: Duration = Duration::from_millis(100);

/// What a subscriber saw.
#[derive(Debug, PartialEq, Eq)]
pub enum SubscriberEvent {
    /// A connection to the publisher came up (the first one, or after a loss).
    Connected,
    /// The connection to the publisher was lost; the socket keeps trying to reconnect.
    Disconnected,
    /// One multipart message, every frame.
    Message(Vec<Bytes>),
}

/// A SUB socket subscribed to everything a publisher sends.
pub struct Subscriber {
    socket: SubSocket,
    monitor: futures_util::stream::BoxStream<'static, SocketEvent>,
    failed: bool,
}

impl Subscriber {
    /// Connects to the PUB socket at `endpoint` (`tcp://host:port` or `host:port`) and
    /// subscribes to every topic. Waits until the publisher answers (a refused connection is
    /// retried with backoff): the caller bounds this with a timeout or a cancellation.
    ///
    /// # Errors
    /// [`TransportError::Connect`] for a malformed endpoint or a peer that is not a PUB socket.
    pub async fn connect(endpoint: &str, limits: &TransportLimits) -> Result<Self> {
        let mut options = limits.socket_options();
        options.no_connect_timeout();
        let mut socket = SubSocket::with_options(options);
        let monitor = socket.monitor().boxed();
        socket.subscribe("").await.map_err(socket_error)?;
        connect_socket(&mut socket, endpoint).await?;
        Ok(Self {
            socket,
            monitor,
            failed: false,
        })
    }

    /// The next message or connection change. Cancel-safe: nothing is lost when the future is
    /// dropped before it completes.
    ///
    /// # Errors
    /// [`TransportError::Socket`] when the socket's monitor is gone (the socket is unusable).
    pub async fn next(&mut self) -> Result<SubscriberEvent> {
        loop {
            if self.failed {
                // After a receive error, give the socket time to reconnect instead of spinning
                // on an empty peer set.
                self.failed = false;
                match tokio::time::timeout(RETRY_AFTER_ERROR, self.monitor.next()).await {
                    Ok(Some(event)) => {
                        if let Some(e) = monitor_event(event) {
                            return Ok(e);
                        }
                    }
                    Ok(None) => return Err(TransportError::Socket("monitor closed".into())),
                    Err(_) => {}
                }
                continue;
            }
            tokio::select! {
                biased;
                event = self.monitor.next() => match event {
                    Some(event) => {
                        if let Some(e) = monitor_event(event) {
                            return Ok(e);
                        }
                    }
                    None => return Err(TransportError::Socket("monitor closed".into())),
                },
                message = self.socket.recv() => match message {
                    Ok(m) => return Ok(SubscriberEvent::Message(m.into_vec())),
                    Err(e) => {
                        tracing::debug!("subscriber receive error: {e}");
                        self.failed = true;
                    }
                },
            }
        }
    }
}

/// A SUB socket bound to an address, subscribed to every topic, that any number of
/// publishers connect to (vLLM connects its PUB when its endpoint names a concrete host).
/// Messages of every publisher arrive interleaved; the first frame (the topic) tells them
/// apart. Connections come and go without being reported: a connecting publisher is named by
/// its topic, not by its socket.
pub struct BoundSubscriber {
    socket: SubSocket,
}

impl BoundSubscriber {
    /// Binds `addr` (`tcp://*:5556`, `tcp://host:port` or `host:port`; port 0 picks one) and
    /// returns the address bound. `limits` bound what each connecting publisher may send.
    ///
    /// # Errors
    /// [`TransportError::Bind`] when the address cannot be bound.
    pub async fn bind(addr: &str, limits: &TransportLimits) -> Result<(Self, SocketAddr)> {
        let mut socket = SubSocket::with_options(limits.socket_options());
        socket.subscribe("").await.map_err(socket_error)?;
        let local = bind_socket(&mut socket, addr).await?;
        Ok((Self { socket }, local))
    }

    /// The next multipart message from any connected publisher, every frame. One publisher's
    /// broken connection is dropped by the socket (and counted in the limits' stats) and the
    /// others go on: this keeps waiting. Cancel-safe.
    pub async fn next(&mut self) -> Vec<Bytes> {
        loop {
            match self.socket.recv().await {
                Ok(m) => return m.into_vec(),
                Err(e) => {
                    tracing::debug!("bound subscriber: a publisher's connection failed: {e}");
                    // An error with no peer left would return at once again: do not spin.
                    tokio::time::sleep(RETRY_AFTER_ERROR).await;
                }
            }
        }
    }
}

fn monitor_event(event: SocketEvent) -> Option<SubscriberEvent> {
    match event {
        SocketEvent::Connected(..) => Some(SubscriberEvent::Connected),
        SocketEvent::Disconnected(_) => Some(SubscriberEvent::Disconnected),
        _ => None,
    }
}

/// A DEALER client of a replay ROUTER: sends `["", start_seq as 8 bytes BE]` and reads the
/// replies (every frame of each) until the caller sees the end marker.
pub struct ReplayClient {
    endpoint: String,
    socket: Option<DealerSocket>,
}

impl ReplayClient {
    /// A client for the ROUTER at `endpoint`. No I/O until the first request.
    pub fn new(endpoint: String) -> Self {
        Self {
            endpoint,
            socket: None,
        }
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Drops the socket; the next request opens a fresh one. Call it after a failed or
    /// abandoned replay.
    pub fn reset(&mut self) {
        self.socket = None;
    }

    /// Asks for every message from `start_seq` on, connecting first if needed, within
    /// `timeout`.
    ///
    /// # Errors
    /// [`TransportError::Timeout`], [`TransportError::Connect`] or
    /// [`TransportError::Socket`]; the socket is dropped.
    pub async fn request(&mut self, start_seq: u64, timeout: Duration) -> Result<()> {
        let taken = self.socket.take();
        let endpoint = self.endpoint.clone();
        let attempt = async move {
            let mut socket = match taken {
                Some(s) => s,
                None => {
                    let mut s = DealerSocket::with_options(super::client_options());
                    connect_socket(&mut s, &endpoint).await?;
                    s
                }
            };
            let mut msg = ZmqMessage::from(Bytes::copy_from_slice(&start_seq.to_be_bytes()));
            msg.push_front(Bytes::new());
            socket.send(msg).await.map_err(socket_error)?;
            Ok::<_, TransportError>(socket)
        };
        let socket = tokio::time::timeout(timeout, attempt)
            .await
            .map_err(|_| TransportError::Timeout)??;
        self.socket = Some(socket);
        Ok(())
    }

    /// The next reply, every frame (the empty delimiter included). Waits as long as it
    /// takes: the caller bounds it. Cancel-safe: a dropped call loses no reply.
    ///
    /// # Errors
    /// [`TransportError::Socket`] when no request was sent or the connection broke; the
    /// socket is dropped.
    pub async fn recv(&mut self) -> Result<Vec<Bytes>> {
        let socket = self
            .socket
            .as_mut()
            .ok_or_else(|| TransportError::Socket("no replay request in flight".into()))?;
        match socket.recv().await {
            Ok(reply) => Ok(reply.into_vec()),
            Err(e) => {
                self.socket = None;
                Err(socket_error(e))
            }
        }
    }
}
