//! A move to another node: the objects are PUT to the peer over the LMCache protocol (the
//! peer's `peer_init_url` is its `lm://` address), then one HEALTH: replies come in request
//! order on a connection, so its answer means every PUT before it was read and stored.

use crate::node::model::codec::{self, LmCommand, LmRequest, ObjectMeta, REPLY_HEADER_LEN};
use bytes::Bytes;
use std::io;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One object to send.
pub(crate) struct Outgoing {
    pub(crate) key: String,
    pub(crate) meta: ObjectMeta,
    /// The body as PUT (decoded).
    pub(crate) data: Bytes,
}

/// A connection to a peer node, every step bounded by `timeout`.
pub(crate) struct PeerConn {
    stream: TcpStream,
    timeout: Duration,
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("peer {what} timed out"))
}

impl PeerConn {
    /// Connects to `addr` (`host:port`).
    pub(crate) async fn connect(addr: &str, timeout: Duration) -> io::Result<Self> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| timed_out("connect"))??;
        stream.set_nodelay(true)?;
        Ok(PeerConn { stream, timeout })
    }

    /// Sends one PUT (no reply, as LMCache's protocol has it).
    pub(crate) async fn put(&mut self, obj: &Outgoing) -> io::Result<()> {
        let header = codec::encode_request(&LmRequest {
            command: LmCommand::Put,
            length: obj.data.len(),
            meta: obj.meta,
            key: obj.key.clone(),
        })
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let write = async {
            self.stream.write_all(&header).await?;
            self.stream.write_all(&obj.data).await
        };
        tokio::time::timeout(self.timeout, write)
            .await
            .map_err(|_| timed_out("PUT"))?
    }

    /// Sends HEALTH and waits for SUCCESS: every PUT before it was stored.
    pub(crate) async fn confirm(&mut self) -> io::Result<()> {
        let header = codec::encode_request(&LmRequest {
            command: LmCommand::Health,
            length: 0,
            meta: ObjectMeta::default(),
            key: "kvplane-move".into(),
        })
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let exchange = async {
            self.stream.write_all(&header).await?;
            let mut reply = [0u8; REPLY_HEADER_LEN];
            self.stream.read_exact(&mut reply).await?;
            codec::parse_reply(&reply)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
        };
        let reply = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| timed_out("HEALTH"))??;
        if reply.code == codec::CODE_SUCCESS {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "peer answered HEALTH with code {}",
                reply.code
            )))
        }
    }
}
