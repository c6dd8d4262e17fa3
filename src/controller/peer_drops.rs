//! The ZMQ peer connections each listening socket dropped, from the transport's
//! [`TransportStats`] to Prometheus.
//!
//! The transport counts drops in atomics and knows nothing of metrics; at every scrape,
//! [`PeerDrops::export`] adds what was counted since the last one to
//! `kvplane_peer_disconnects_total{socket,reason}`, and the drops that are limit hits to
//! `kvplane_limit_hits_total{limit}`. It touches no socket.

use super::metrics::Metrics;
use crate::transport::{DropReason, TransportStats};
use parking_lot::Mutex;
use std::sync::Arc;

const REASONS: usize = DropReason::ALL.len();

/// The `limit` label of `kvplane_limit_hits_total` for a drop that is a limit hit.
fn limit_label(reason: DropReason) -> Option<&'static str> {
    match reason {
        DropReason::FrameTooLarge => Some("frame_bytes"),
        DropReason::MessageTooLarge => Some("message_bytes"),
        DropReason::HandshakeTimeout => Some("zmq_handshake_timeout"),
        DropReason::IdleTimeout => Some("zmq_idle_timeout"),
        DropReason::ConnectionLimit => Some("zmq_connections"),
        DropReason::ProtocolError | DropReason::IoError => None,
    }
}

/// Drop counters of the three listening sockets, and what of them was exported already.
#[derive(Debug, Default)]
pub struct PeerDrops {
    /// PULL socket.
    pub pull: Arc<TransportStats>,
    /// Reply ROUTER socket.
    pub reply: Arc<TransportStats>,
    /// Heartbeat ROUTER socket.
    pub heartbeat: Arc<TransportStats>,
    exported: Mutex<[[u64; REASONS]; 3]>,
}

impl PeerDrops {
    /// Counters at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the drops counted since the last call to the metrics (every series is touched,
    /// so all of them show, at 0 until a drop).
    pub fn export(&self, metrics: &Metrics) {
        let mut exported = self.exported.lock();
        let sockets = [
            ("pull", &self.pull),
            ("reply", &self.reply),
            ("heartbeat", &self.heartbeat),
        ];
        for ((socket, stats), done) in sockets.into_iter().zip(exported.iter_mut()) {
            for (reason, done) in DropReason::ALL.into_iter().zip(done.iter_mut()) {
                let now = stats.dropped(reason);
                let new = now.saturating_sub(*done);
                *done = now;
                metrics
                    .peer_disconnects
                    .with_label_values(&[socket, reason.label()])
                    .inc_by(new);
                if let Some(limit) = limit_label(reason) {
                    metrics.limit_hits.with_label_values(&[limit]).inc_by(new);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::TransportLimits;

    #[tokio::test]
    async fn export_adds_only_what_is_new() {
        let drops = PeerDrops::new();
        let metrics = Metrics::new();
        // Drive a real listener into one drop: a peer over the connection cap of 0 is
        // impossible to configure, so use a cap of 1 and two raw connections.
        let limits = TransportLimits {
            max_connections: Some(1),
            stats: Some(Arc::clone(&drops.reply)),
            ..TransportLimits::default()
        };
        let (_router, addr) = crate::transport::RouterListener::bind_with("127.0.0.1:0", &limits)
            .await
            .expect("bind");
        let _first = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let _second = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while drops.reply.dropped(DropReason::ConnectionLimit) == 0 {
            assert!(tokio::time::Instant::now() < deadline, "no drop counted");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let series = |socket: &str, reason: DropReason| {
            metrics
                .peer_disconnects
                .with_label_values(&[socket, reason.label()])
                .get()
        };
        let hits = || {
            metrics
                .limit_hits
                .with_label_values(&["zmq_connections"])
                .get()
        };
        drops.export(&metrics);
        drops.export(&metrics);
        assert_eq!(series("reply", DropReason::ConnectionLimit), 1);
        assert_eq!(series("pull", DropReason::ConnectionLimit), 0);
        assert_eq!(hits(), 1);
        let rendered = metrics.render();
        assert!(rendered.contains(
            "kvplane_peer_disconnects_total{reason=\"idle_timeout\",socket=\"heartbeat\"} 0"
        ));
    }
}
