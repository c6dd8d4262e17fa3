//! Counts of the peer connections a listener dropped, by reason.
//!
//! The socket library reports every connection it closes because of the peer (a limit broken,
//! a handshake not done in time, broken framing, a failed read) to the [`TransportStats`]
//! attached through [`TransportLimits::stats`](super::TransportLimits::stats). This module
//! only counts: it knows nothing of metrics, and the controller turns the counts into
//! Prometheus series when it is scraped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Why a listener closed one peer's connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// A frame header claimed more than [`TransportLimits::max_frame_bytes`](super::TransportLimits::max_frame_bytes).
    FrameTooLarge,
    /// A multipart message grew past [`TransportLimits::max_message_bytes`](super::TransportLimits::max_message_bytes).
    MessageTooLarge,
    /// The ZMTP handshake was not done within [`TransportLimits::handshake_timeout`](super::TransportLimits::handshake_timeout).
    HandshakeTimeout,
    /// No complete message within [`TransportLimits::idle_timeout`](super::TransportLimits::idle_timeout).
    IdleTimeout,
    /// Accepted while [`TransportLimits::max_connections`](super::TransportLimits::max_connections)
    /// were open; closed before the handshake.
    ConnectionLimit,
    /// Undecodable framing, or a handshake that failed (bad greeting, incompatible socket
    /// type). A peer that closes its connection before the handshake is not counted.
    ProtocolError,
    /// The connection failed (reset, a frame cut short), or accepting it failed (out of file
    /// descriptors, say).
    IoError,
}

impl DropReason {
    /// Every reason, in a fixed order.
    pub const ALL: [DropReason; 7] = [
        DropReason::FrameTooLarge,
        DropReason::MessageTooLarge,
        DropReason::HandshakeTimeout,
        DropReason::IdleTimeout,
        DropReason::ConnectionLimit,
        DropReason::ProtocolError,
        DropReason::IoError,
    ];

    /// The reason as a metric label: `frame_too_large`, `message_too_large`,
    /// `handshake_timeout`, `idle_timeout`, `connection_limit`, `protocol_error`, `io_error`.
    pub fn label(self) -> &'static str {
        match self {
            DropReason::FrameTooLarge => "frame_too_large",
            DropReason::MessageTooLarge => "message_too_large",
            DropReason::HandshakeTimeout => "handshake_timeout",
            DropReason::IdleTimeout => "idle_timeout",
            DropReason::ConnectionLimit => "connection_limit",
            DropReason::ProtocolError => "protocol_error",
            DropReason::IoError => "io_error",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The socket library's reason, in kvplane's terms.
    pub(super) fn from_zmq(reason: zeromq::PeerDropReason) -> Self {
        use zeromq::PeerDropReason as Z;
        match reason {
            Z::FrameTooLarge => DropReason::FrameTooLarge,
            Z::MessageTooLarge => DropReason::MessageTooLarge,
            Z::HandshakeTimeout => DropReason::HandshakeTimeout,
            Z::IdleTimeout => DropReason::IdleTimeout,
            Z::ConnectionLimit => DropReason::ConnectionLimit,
            Z::Io => DropReason::IoError,
            // Z::Protocol, and whatever a later version adds.
            _ => DropReason::ProtocolError,
        }
    }
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// Peer connections one listener dropped, by [`DropReason`]. Cheap to update from the socket's
/// I/O path (one relaxed atomic add); share it with an [`Arc`].
#[derive(Debug, Default)]
pub struct TransportStats {
    dropped: [AtomicU64; DropReason::ALL.len()],
}

impl TransportStats {
    /// Counters at zero, ready to attach to [`TransportLimits`](super::TransportLimits).
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Peers dropped for `reason` so far.
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.dropped[reason.index()].load(Ordering::Relaxed)
    }

    /// Peers dropped so far, every reason together.
    pub fn total(&self) -> u64 {
        DropReason::ALL.iter().map(|r| self.dropped(*r)).sum()
    }

    /// Counts one dropped peer.
    pub(super) fn record(&self, reason: DropReason) {
        self.dropped[reason.index()].fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%reason, "ZMQ peer connection dropped");
    }

    /// The observer to give the socket library.
    pub(super) fn observer(self: &Arc<Self>) -> zeromq::PeerDropObserver {
        let stats = Arc::clone(self);
        Arc::new(move |reason| stats.record(DropReason::from_zmq(reason)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_reason_with_distinct_labels() {
        let stats = TransportStats::new();
        let observe = stats.observer();
        observe(zeromq::PeerDropReason::FrameTooLarge);
        observe(zeromq::PeerDropReason::FrameTooLarge);
        observe(zeromq::PeerDropReason::Protocol);
        assert_eq!(stats.dropped(DropReason::FrameTooLarge), 2);
        assert_eq!(stats.dropped(DropReason::ProtocolError), 1);
        assert_eq!(stats.dropped(DropReason::IdleTimeout), 0);
        assert_eq!(stats.total(), 3);
        let labels: std::collections::HashSet<_> =
            DropReason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), DropReason::ALL.len());
        for (i, reason) in DropReason::ALL.iter().enumerate() {
            assert_eq!(reason.index(), i);
        }
    }
}
