//! The connection limits of `kvplane::transport` listeners, over real sockets on 127.0.0.1:
//! each drop is counted in the listener's `TransportStats` with its reason, and the listener
//! goes on serving well-behaved peers. Frame and message limits are in `tests/system/transport.rs`
//! (`…_drops_peers_over_the_limits_…`); the `/metrics` export is in `tests/system/resource_limits.rs`.
//!
//! Raw `TcpStream` peers play the hostile side. Timeouts under test are short and configured;
//! nothing asserts on how long anything took: every wait is bounded, and each check follows
//! from an event the test observed (a hang-up, a message received).

use crate::support::zmtp::{zmtp_handshake, zmtp_header};
use crate::support::{eventually, within, STEP};
use bytes::Bytes;
use kvplane::transport::{
    DropReason, PullListener, PushSender, TransportError, TransportLimits, TransportStats,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Timeout given to the clients under test.
const SHORT: Duration = Duration::from_millis(500);

fn bytes(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

async fn raw_connect(port: u16) -> TcpStream {
    within("raw connect", TcpStream::connect(("127.0.0.1", port)))
        .await
        .expect("raw connect")
}

/// Waits (bounded) until the listener closes `stream`; returns what it sent before.
async fn hung_up(stream: &mut TcpStream, case: &str) -> Vec<u8> {
    let mut received = Vec::new();
    // A reset instead of a clean close is a hang-up too.
    let _ = within(case, stream.read_to_end(&mut received)).await;
    received
}

/// Reads the listener's whole greeting (64 bytes): proof that it accepted the connection and
/// started its handshake. Nothing more comes until the peer greets, so closing afterwards is
/// a clean close (closing with unread bytes would send a reset).
async fn greeted(stream: &mut TcpStream) {
    let mut greeting = [0u8; 64];
    within("greeting", stream.read_exact(&mut greeting))
        .await
        .expect("the listener's greeting");
    assert_eq!(greeting[0], 0xff, "not a ZMTP greeting");
}

/// A PULL listener with `limits` counting into fresh stats, and a task that receives `n`
/// messages from it, collecting the drops `recv` reports on the way.
async fn pull_receiving(
    limits: TransportLimits,
    n: usize,
) -> (
    Arc<TransportStats>,
    u16,
    tokio::task::JoinHandle<(Vec<Vec<Bytes>>, Vec<DropReason>)>,
) {
    let stats = TransportStats::new();
    let limits = TransportLimits {
        stats: Some(Arc::clone(&stats)),
        ..limits
    };
    let (mut pull, addr) = within("bind", PullListener::bind_with("127.0.0.1:0", &limits))
        .await
        .expect("bind");
    let receiver = tokio::spawn(async move {
        let (mut messages, mut dropped) = (Vec::new(), Vec::new());
        // Bounded: n messages and at most 100 drops.
        for _ in 0..n + 100 {
            match pull.recv().await {
                Ok(frames) => messages.push(frames),
                Err(TransportError::PeerDropped { reason }) => dropped.push(reason),
                Err(other) => panic!("recv: {other}"),
            }
            if messages.len() == n {
                break;
            }
        }
        (messages, dropped)
    });
    (stats, addr.port(), receiver)
}

/// A peer that connects and says nothing is dropped at the handshake timeout and counted as
/// `handshake_timeout`; a PUSH peer is served meanwhile and after.
#[tokio::test]
async fn handshake_timeout_is_counted_and_others_are_served() {
    let limits = TransportLimits {
        handshake_timeout: Duration::from_millis(200),
        ..TransportLimits::default()
    };
    let (stats, port, receiver) = pull_receiving(limits, 2).await;
    let mut silent = raw_connect(port).await;
    let mut push = PushSender::new(format!("127.0.0.1:{port}"));
    within("send", push.send(vec![bytes("during")], SHORT))
        .await
        .expect("send");
    hung_up(&mut silent, "silent peer").await;
    assert_eq!(stats.dropped(DropReason::HandshakeTimeout), 1);
    within("send", push.send(vec![bytes("after")], SHORT))
        .await
        .expect("send");
    let (messages, dropped) = within("receiver", receiver).await.expect("receiver");
    assert_eq!(messages, [vec![bytes("during")], vec![bytes("after")]]);
    // Dropped before its handshake: counted, not reported by recv.
    assert!(dropped.is_empty(), "{dropped:?}");
    assert_eq!(stats.total(), 1);
}

/// With `max_connections` = 2 and two connections open, a third is closed at accept, before
/// any handshake, and counted as `connection_limit`. Once one of the two leaves (a clean
/// close, which is not counted as a drop), a PUSH peer gets its place and is served.
#[tokio::test]
async fn connection_cap_closes_extra_connections_at_accept() {
    let limits = TransportLimits {
        max_connections: Some(2),
        // Long enough that the two silent peers hold their places for the whole test.
        handshake_timeout: Duration::from_secs(60),
        ..TransportLimits::default()
    };
    let (stats, port, receiver) = pull_receiving(limits, 1).await;
    let mut first = raw_connect(port).await;
    let mut second = raw_connect(port).await;
    greeted(&mut first).await;
    greeted(&mut second).await;

    let mut third = raw_connect(port).await;
    let got = hung_up(&mut third, "connection over the cap").await;
    assert!(got.is_empty(), "closed after a greeting: {got:?}");
    assert_eq!(stats.dropped(DropReason::ConnectionLimit), 1);
    assert_eq!(stats.total(), 1);

    // One leaves; a PUSH peer is served once the listener has noticed (until then its
    // connection is refused as well, and it reconnects on the next send).
    drop(first);
    let mut push = PushSender::new(format!("127.0.0.1:{port}"));
    eventually("a place freed for the PUSH peer", STEP, async || {
        push.send(vec![bytes("served")], SHORT).await.is_ok()
    })
    .await;
    let (messages, dropped) = within("receiver", receiver).await.expect("receiver");
    assert_eq!(messages, [vec![bytes("served")]]);
    assert!(dropped.is_empty(), "{dropped:?}");
    // The place came from `first` leaving, so its clean close was handled by now: not a drop.
    assert_eq!(stats.dropped(DropReason::ProtocolError), 0);
    assert_eq!(stats.dropped(DropReason::IoError), 0);
    assert_eq!(
        stats.total(),
        stats.dropped(DropReason::ConnectionLimit),
        "only cap refusals"
    );
    drop(second);
}

/// With an idle timeout, a peer that completes the handshake and then says nothing, one that
/// stops in the middle of a frame, and one that sends a message and then falls silent are all
/// dropped, counted as `idle_timeout` and reported by `recv`; the message that did arrive is
/// delivered and a PUSH peer is served after.
#[tokio::test]
async fn idle_timeout_drops_silent_peers_after_the_handshake() {
    let limits = TransportLimits {
        idle_timeout: Some(Duration::from_millis(300)),
        ..TransportLimits::default()
    };
    let (stats, port, receiver) = pull_receiving(limits, 2).await;
    let mut partial = zmtp_handshake("PUSH");
    partial.extend_from_slice(&zmtp_header(100, false, false));
    partial.extend_from_slice(&[b'x'; 10]);
    let mut one_message = zmtp_handshake("PUSH");
    one_message.extend_from_slice(&zmtp_header(7, false, false));
    one_message.extend_from_slice(b"message");
    let cases = [
        ("silent after the handshake", zmtp_handshake("PUSH")),
        ("stopped mid-frame", partial),
        ("silent after one message", one_message),
    ];
    for (case, sent) in &cases {
        let mut peer = raw_connect(port).await;
        within(case, peer.write_all(sent)).await.expect("write");
        hung_up(&mut peer, case).await;
    }
    assert_eq!(stats.dropped(DropReason::IdleTimeout), 3);
    let mut push = PushSender::new(format!("127.0.0.1:{port}"));
    within("send", push.send(vec![bytes("after")], SHORT))
        .await
        .expect("send");
    let (messages, dropped) = within("receiver", receiver).await.expect("receiver");
    assert_eq!(messages, [vec![bytes("message")], vec![bytes("after")]]);
    assert_eq!(dropped, [DropReason::IdleTimeout; 3]);
    assert_eq!(stats.total(), 3);
}
