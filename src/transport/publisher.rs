//! The engine side of a KV-event stream: a PUB socket that publishes multipart messages and
//! the ROUTER that serves replays of them (vLLM's `endpoint` and `replay_endpoint`).
//!
//! kvplane's own services never publish events; these sockets are for the load generators and
//! the simulated engines of `kvplane bench`, which stand in for vLLM's publisher. Bytes only,
//! as the rest of this module: the caller frames the messages (sequence numbers, payloads, a
//! replay's end marker) exactly as the publisher it imitates does.

use std::net::SocketAddr;

use bytes::Bytes;
use zeromq::prelude::*;
use zeromq::{PubSocket, RouterSocket};

use super::{bind_socket, connect_socket, message, socket_error, Result, TransportError};

/// A PUB socket, bound (vLLM with a wildcard endpoint) or connected to a subscriber's bound
/// SUB socket (vLLM with a concrete host: llm-d's central topology).
pub struct Publisher {
    socket: PubSocket,
}

impl Publisher {
    /// Binds to `addr` (`host:port`, `tcp://…`, `*:port`; port 0 allowed).
    ///
    /// # Errors
    /// [`TransportError::Bind`].
    pub async fn bind(addr: &str) -> Result<(Self, SocketAddr)> {
        let mut socket = PubSocket::new();
        let local = bind_socket(&mut socket, addr).await?;
        Ok((Self { socket }, local))
    }

    /// Connects to a bound SUB socket at `endpoint`; waits until it answers (the caller
    /// bounds this).
    ///
    /// # Errors
    /// [`TransportError::Connect`].
    pub async fn connect(endpoint: &str) -> Result<Self> {
        let mut socket = PubSocket::new();
        connect_socket(&mut socket, endpoint).await?;
        Ok(Self { socket })
    }

    /// Publishes one multipart message. A PUB drops what no subscriber has asked for yet.
    ///
    /// # Errors
    /// [`TransportError::EmptyMessage`], or a socket failure.
    pub async fn send(&mut self, frames: Vec<Bytes>) -> Result<()> {
        let msg = message(frames).ok_or(TransportError::EmptyMessage)?;
        self.socket.send(msg).await.map_err(socket_error)
    }
}

/// A ROUTER socket answering replay requests: [`ReplayServer::recv`] returns every frame of a
/// request, the sender's identity first, and [`ReplayServer::send`] routes a reply by the
/// identity in its first frame.
pub struct ReplayServer {
    socket: RouterSocket,
}

impl ReplayServer {
    /// Binds to `addr` (`host:port`, `tcp://…`, `*:port`; port 0 allowed).
    ///
    /// # Errors
    /// [`TransportError::Bind`].
    pub async fn bind(addr: &str) -> Result<(Self, SocketAddr)> {
        let mut socket = RouterSocket::new();
        let local = bind_socket(&mut socket, addr).await?;
        Ok((Self { socket }, local))
    }

    /// The next request, identity frame first. Cancel-safe.
    ///
    /// # Errors
    /// A socket failure.
    pub async fn recv(&mut self) -> Result<Vec<Bytes>> {
        let msg = self.socket.recv().await.map_err(socket_error)?;
        Ok(msg.into_vec())
    }

    /// Sends `frames` (the peer's identity first) to that peer.
    ///
    /// # Errors
    /// [`TransportError::EmptyMessage`], or a socket failure (an unknown or gone peer).
    pub async fn send(&mut self, frames: Vec<Bytes>) -> Result<()> {
        let msg = message(frames).ok_or(TransportError::EmptyMessage)?;
        self.socket.send(msg).await.map_err(socket_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{ReplayClient, Subscriber, SubscriberEvent, TransportLimits};
    use std::time::Duration;

    #[tokio::test]
    async fn a_subscriber_receives_what_a_bound_publisher_sends() {
        let (mut publisher, addr) = Publisher::bind("127.0.0.1:0").await.expect("bind");
        let mut sub = Subscriber::connect(&addr.to_string(), &TransportLimits::default())
            .await
            .expect("connect");
        let frames = vec![Bytes::from_static(b"topic"), Bytes::from_static(b"body")];
        // A PUB drops messages until the subscription has arrived: send until one lands.
        let got = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                publisher.send(frames.clone()).await.expect("send");
                match tokio::time::timeout(Duration::from_millis(50), sub.next()).await {
                    Ok(Ok(SubscriberEvent::Message(m))) => break m,
                    _ => continue,
                }
            }
        })
        .await
        .expect("a message within 10 s");
        assert_eq!(got, frames);
        assert!(matches!(
            publisher.send(Vec::new()).await,
            Err(TransportError::EmptyMessage)
        ));
    }

    #[tokio::test]
    async fn a_replay_server_answers_the_requester_by_identity() {
        let (mut server, addr) = ReplayServer::bind("127.0.0.1:0").await.expect("bind");
        let serve = tokio::spawn(async move {
            let req = server.recv().await.expect("request");
            // [identity, empty, start sequence] from a DEALER replay client.
            assert_eq!(req.len(), 3, "{req:?}");
            let id = req[0].clone();
            let end = Bytes::from_static(&[0xff; 8]);
            server
                .send(vec![id, Bytes::new(), Bytes::new(), end, Bytes::new()])
                .await
                .expect("reply");
        });
        let mut client = ReplayClient::new(format!("tcp://{addr}"));
        client
            .request(0, Duration::from_secs(10))
            .await
            .expect("request");
        let reply = tokio::time::timeout(Duration::from_secs(10), client.recv())
            .await
            .expect("a reply within 10 s")
            .expect("reply");
        assert_eq!(reply.len(), 4, "{reply:?}");
        assert_eq!(&reply[2][..], &[0xff; 8]);
        serve.await.expect("server task");
    }
}
