//! The limits of `kvplane::transport` listeners, over real sockets on 127.0.0.1: connection
//! caps, handshake and idle timeouts, frame and message sizes. Each drop is counted in the
//! listener's `TransportStats` with its reason, and the listener goes on serving well-behaved
//! peers. The frame, message and handshake limits are kvplane's patch to `zeromq` 0.7.0
//! (`vendor/zeromq/KVPLANE-PATCHES.md`); the tests of that part are its regression tests. The
//! `/metrics` export is in `resource_limits.rs`; the shared helpers are in `transport.rs`.
//!
//! Raw `TcpStream` peers play the hostile side. Timeouts under test are short and configured;
//! no upper bound on how long anything took is asserted: every wait is bounded, and each check
//! follows from an event the test observed (a hang-up, a message received).

use crate::support::process::Launch;
use crate::support::zmtp::{zmtp_greeting, zmtp_handshake, zmtp_header};
use crate::support::{eventually, still_connected, within, SLOW, STEP};
use crate::transport::{
    assert_echo, bound, bytes, echo_router, random_bytes, raw_connect, recv_message, send_ok, SHORT,
};
use bytes::Bytes;
use kvplane::transport::{
    DealerClient, DropReason, PullListener, PushSender, RouterListener, TransportError,
    TransportLimits, TransportStats,
};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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
    let (mut pull, addr) = bound(PullListener::bind_with("127.0.0.1:0", &limits)).await;
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
    send_ok(&mut push, vec![bytes("during")]).await;
    hung_up(&mut silent, "silent peer").await;
    assert_eq!(stats.dropped(DropReason::HandshakeTimeout), 1);
    send_ok(&mut push, vec![bytes("after")]).await;
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
    send_ok(&mut push, vec![bytes("after")]).await;
    let (messages, dropped) = within("receiver", receiver).await.expect("receiver");
    assert_eq!(messages, [vec![bytes("message")], vec![bytes("after")]]);
    assert_eq!(dropped, [DropReason::IdleTimeout; 3]);
    assert_eq!(stats.total(), 3);
}

// ---------------------------------------------------------------------------------------------
// Regression tests for kvplane's patch to zeromq 0.7.0 (vendor/zeromq/KVPLANE-PATCHES.md):
// frame and message size limits, read-ahead bounded by the bytes received, handshake timeout.
// ---------------------------------------------------------------------------------------------

/// Set in the environment of a child process that runs one `#[ignore]`d test on its own.
const CHILD_ENV: &str = "KVPLANE_TRANSPORT_CHILD";

/// Runs the `#[ignore]`d test `name` alone in a child process and asserts that it passed. Used
/// where a regression would kill the process (the test runner must outlive it) or where the
/// test measures the process (no other test may run beside it).
async fn run_child_test(name: &str) -> String {
    let exe = std::env::current_exe().expect("test binary");
    // The test's path inside this binary: `transport::name` (module_path! starts with the crate).
    let path = module_path!()
        .split_once("::")
        .map_or(module_path!(), |(_, m)| m);
    let out = Launch::new(&format!("child test {name}"), exe)
        .args([
            &format!("{path}::{name}"),
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, name)
        .run(SLOW)
        .await;
    assert!(
        out.status.success() && out.stdout.contains("1 passed"),
        "child {name} failed: status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    out.stdout
}

/// True when this process is the child started for test `name`.
fn is_child(name: &str) -> bool {
    std::env::var(CHILD_ENV).is_ok_and(|child| child == name)
}

/// Connects, writes `bytes` (a write error is fine: the listener may hang up first) and,
/// without closing its own side, expects the listener to close the connection (within
/// [`STEP`]). Returns how long that took after the connection was made.
async fn assert_listener_hangs_up(port: u16, bytes: &[u8], case: &str) -> Duration {
    let mut stream = raw_connect(port).await;
    let start = Instant::now();
    let _ = tokio::time::timeout(STEP, stream.write_all(bytes)).await;
    let mut sink = Vec::new();
    let closed = tokio::time::timeout(STEP, stream.read_to_end(&mut sink)).await;
    assert!(closed.is_ok(), "{case}: listener kept the connection open");
    start.elapsed()
}

/// [`assert_listener_hangs_up`], and proof that the hang-up came from a check of what was
/// sent, not from the handshake timeout: a silent peer connected first is still connected.
async fn assert_hung_up_at_once(port: u16, bytes: &[u8], case: &str) {
    let witness = raw_connect(port).await;
    assert_listener_hangs_up(port, bytes, case).await;
    assert!(
        still_connected(&witness),
        "{case}: hung up on only by the handshake timeout"
    );
}

/// Limits small enough to break cheaply in tests.
const TEST_MAX_FRAME: usize = 1 << 20;
const TEST_MAX_MESSAGE: usize = 2 << 20;
const TEST_HANDSHAKE: Duration = Duration::from_millis(300);

fn test_limits() -> TransportLimits {
    TransportLimits {
        max_frame_bytes: TEST_MAX_FRAME,
        max_message_bytes: TEST_MAX_MESSAGE,
        handshake_timeout: TEST_HANDSHAKE,
        ..TransportLimits::default()
    }
}

/// [`test_limits`] counting drops into fresh stats, and the stats.
fn counted_limits() -> (Arc<TransportStats>, TransportLimits) {
    let stats = TransportStats::new();
    let limits = TransportLimits {
        stats: Some(Arc::clone(&stats)),
        ..test_limits()
    };
    (stats, limits)
}

/// Peers that complete the handshake as `socket_type`, then break one of `test_limits()`.
fn over_limit_peers(socket_type: &str) -> Vec<(&'static str, Vec<u8>)> {
    let after_handshake = |tail: &[u8]| {
        let mut bytes = zmtp_handshake(socket_type);
        bytes.extend_from_slice(tail);
        bytes
    };
    let one_over = TEST_MAX_FRAME as u64 + 1;
    // Three frames of 900 KiB: each within the frame limit, together over the message limit.
    let mut multipart = Vec::new();
    for i in 0..3 {
        multipart.extend_from_slice(&zmtp_header(900 * 1024, i < 2, false));
        multipart.resize(multipart.len() + 900 * 1024, b'x');
    }
    // Empty frames, each with MORE set: no payload, yet bounded by the message limit.
    let empty_frames: Vec<u8> = (0..100_000).flat_map(|_| [0x01, 0x00]).collect();
    vec![
        (
            "frame one byte over the limit",
            after_handshake(&zmtp_header(one_over, false, false)),
        ),
        (
            "frame claiming 1 TiB",
            after_handshake(&zmtp_header(1 << 40, false, false)),
        ),
        (
            "command over the frame limit",
            after_handshake(&zmtp_header(one_over, false, true)),
        ),
        (
            "READY over the frame limit",
            [zmtp_greeting(), zmtp_header(one_over, false, true)].concat(),
        ),
        (
            "multipart over the message limit",
            after_handshake(&multipart),
        ),
        ("endless empty MORE frames", after_handshake(&empty_frames)),
    ]
}

/// The 73 bytes that used to abort the process (a greeting, then a command header claiming
/// 1 TiB), and the same claim for a message frame after a complete handshake, are rejected:
/// the listener hangs up on them, the process lives, and other peers are served. Runs in a
/// child process, so that a regression kills the child, not the test runner.
#[tokio::test]
async fn oversized_frame_claim_is_rejected_and_the_process_lives() {
    run_child_test("oversized_frame_claim_child").await;
}

/// Child of `oversized_frame_claim_is_rejected_and_the_process_lives`; does nothing unless
/// run by it. Uses the production defaults (`bind`), not the test limits.
#[tokio::test]
#[ignore = "run as a child process by oversized_frame_claim_is_rejected_and_the_process_lives"]
async fn oversized_frame_claim_child() {
    if !is_child("oversized_frame_claim_child") {
        return;
    }
    let mut attack = zmtp_greeting();
    attack.extend_from_slice(&zmtp_header(1 << 40, false, true));
    assert_eq!(attack.len(), 73);
    let mut after_handshake = zmtp_handshake("PUSH");
    after_handshake.extend_from_slice(&zmtp_header(1 << 40, true, false));

    let (mut pull, addr) = bound(PullListener::bind("127.0.0.1:0")).await;
    let receiver = tokio::spawn(async move { recv_message(&mut pull, &mut Vec::new()).await });
    assert_hung_up_at_once(addr.port(), &attack, "73-byte 1 TiB claim").await;
    assert_hung_up_at_once(addr.port(), &after_handshake, "1 TiB frame").await;
    let mut push = PushSender::new(addr.to_string());
    send_ok(&mut push, vec![bytes("alive")]).await;
    let got = within("receiver", receiver).await.expect("receiver");
    assert_eq!(got, vec![bytes("alive")]);

    let (router, addr) = bound(RouterListener::bind("127.0.0.1:0")).await;
    let server = echo_router(router, 1);
    assert_hung_up_at_once(addr.port(), &attack, "73-byte 1 TiB claim").await;
    assert_hung_up_at_once(addr.port(), &after_handshake, "1 TiB frame").await;
    let mut client = DealerClient::new(addr.to_string(), SHORT);
    assert_echo(&mut client, "alive").await;
    within("server", server).await.expect("server");
}

/// A PULL listener hangs up on each peer that breaks a limit (a frame over the frame limit,
/// claimed or sent, a multipart over the message limit, endless MORE frames), counts each
/// with its reason, reports those dropped after the handshake from `recv`, and keeps
/// receiving from a well-behaved peer, including a frame exactly at the limit.
#[tokio::test]
async fn pull_drops_peers_over_the_limits_and_serves_others() {
    let (stats, limits) = counted_limits();
    let (mut pull, addr) = bound(PullListener::bind_with("127.0.0.1:0", &limits)).await;
    let receiver = tokio::spawn(async move {
        let mut received = Vec::new();
        let mut dropped = Vec::new();
        for _ in 0..3 {
            received.push(recv_message(&mut pull, &mut dropped).await);
        }
        (received, dropped)
    });
    let at_limit = Bytes::from(random_bytes(TEST_MAX_FRAME));
    let expected = vec![
        vec![bytes("before")],
        vec![bytes("head"), at_limit.clone()],
        vec![bytes("after")],
    ];
    let mut push = PushSender::new(addr.to_string());
    send_ok(&mut push, expected[0].clone()).await;
    for (case, bytes) in over_limit_peers("PUSH") {
        assert_listener_hangs_up(addr.port(), &bytes, case).await;
    }
    within("send", push.send(expected[1].clone(), SHORT))
        .await
        .expect("send at the limit");
    send_ok(&mut push, expected[2].clone()).await;
    let (received, dropped) = within("receiver", receiver).await.expect("receiver");
    // The READY over the limit is dropped during the handshake: counted, not returned.
    use DropReason::{FrameTooLarge as Frame, MessageTooLarge as Message};
    assert_eq!(dropped, [Frame, Frame, Frame, Message, Message]);
    assert_eq!(
        (stats.dropped(Frame), stats.dropped(Message), stats.total()),
        (4, 2, 6)
    );
    let sizes = |messages: &[Vec<Bytes>]| -> Vec<Vec<usize>> {
        messages
            .iter()
            .map(|m| m.iter().map(Bytes::len).collect())
            .collect()
    };
    assert!(
        received == expected,
        "expected messages of frame sizes {:?}, got {:?}",
        sizes(&expected),
        sizes(&received)
    );
}

/// The same limits on a ROUTER listener: each offending peer is dropped, a DEALER's requests
/// are still answered.
#[tokio::test]
async fn router_drops_peers_over_the_limits_and_serves_others() {
    let (stats, limits) = counted_limits();
    let (mut router, addr) = bound(RouterListener::bind_with("127.0.0.1:0", &limits)).await;
    let server = tokio::spawn(async move {
        for _ in 0..2 {
            let request = router.recv().await.expect("recv");
            let sizes: Vec<usize> = request.frames.iter().map(Bytes::len).collect();
            assert!(
                sizes.len() == 2 && sizes[1] < 100,
                "a request of frame sizes {sizes:?} came through"
            );
            let payload = request.frames.last().cloned().unwrap_or_default();
            router.reply(&request.peer, payload).await.expect("reply");
        }
    });
    let mut client = DealerClient::new(addr.to_string(), SHORT);
    assert_echo(&mut client, "before").await;
    for (case, bytes) in over_limit_peers("DEALER") {
        assert_listener_hangs_up(addr.port(), &bytes, case).await;
    }
    assert_echo(&mut client, "after").await;
    assert_eq!(
        (
            stats.dropped(DropReason::FrameTooLarge),
            stats.dropped(DropReason::MessageTooLarge),
            stats.total()
        ),
        (4, 2, 6)
    );
    within("server", server).await.expect("server");
}

/// A peer that connects and says nothing, stops halfway through the greeting, or greets but
/// never sends READY is disconnected once the handshake timeout has passed (not before), while
/// a well-behaved peer is served meanwhile. Checked on PULL and ROUTER listeners.
#[tokio::test]
async fn stalled_handshakes_are_dropped_after_the_timeout() {
    let (mut pull, addr) = bound(PullListener::bind_with("127.0.0.1:0", &test_limits())).await;
    let stalls = stall_handshakes(addr.port());
    let mut push = PushSender::new(addr.to_string());
    send_ok(&mut push, vec![bytes("served")]).await;
    let got = within("recv", pull.recv()).await.expect("recv");
    assert_eq!(got, vec![bytes("served")]);
    within("stalled peers", stalls.join_all()).await;

    let (router, addr) = bound(RouterListener::bind_with("127.0.0.1:0", &test_limits())).await;
    let server = echo_router(router, 1);
    let stalls = stall_handshakes(addr.port());
    let mut client = DealerClient::new(addr.to_string(), SHORT);
    assert_echo(&mut client, "served").await;
    within("stalled peers", stalls.join_all()).await;
    within("server", server).await.expect("server");
}

/// Starts one task per kind of stalled handshake against `port`; each checks that the
/// listener hangs up, and not before the test handshake timeout.
fn stall_handshakes(port: u16) -> tokio::task::JoinSet<()> {
    let stalled: [(&str, Vec<u8>); 3] = [
        ("silent", Vec::new()),
        ("half greeting", zmtp_greeting()[..10].to_vec()),
        ("greeting without READY", zmtp_greeting()),
    ];
    let mut set = tokio::task::JoinSet::new();
    for (case, bytes) in stalled {
        set.spawn(async move {
            let elapsed = assert_listener_hangs_up(port, &bytes, case).await;
            assert!(
                elapsed >= TEST_HANDSHAKE - Duration::from_millis(50),
                "{case}: dropped after {elapsed:?}, before the handshake timeout"
            );
        });
    }
    set
}

/// 200 connections, each claiming a 60 MiB frame (within the 64 MiB default) and sending
/// none of it, leave the listener serving others. That they cost next to no memory (the
/// reader prepares memory only as a frame's bytes arrive) is a ceiling of `scripts/soak.sh`
/// against the real binary: resident memory is a soak measure, not a test's.
#[tokio::test]
async fn idle_frame_claims_leave_the_listener_serving() {
    const CONNECTIONS: usize = 200;
    const CLAIM: u64 = 60 << 20;
    let (mut pull, addr) = bound(PullListener::bind("127.0.0.1:0")).await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let receiver = tokio::spawn(async move {
        while let Ok(frames) = pull.recv().await {
            if tx.send(frames).await.is_err() {
                break;
            }
        }
    });
    let mut push = PushSender::new(addr.to_string());
    send_ok(&mut push, vec![bytes("warm-up")]).await;
    assert_eq!(
        within("recv", rx.recv()).await,
        Some(vec![bytes("warm-up")])
    );

    let mut claim = zmtp_handshake("PUSH");
    claim.extend_from_slice(&zmtp_header(CLAIM, false, false));
    let mut idle = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        let mut stream = raw_connect(addr.port()).await;
        within("claim", stream.write_all(&claim))
            .await
            .expect("write claim");
        idle.push(stream);
    }
    // Let the listener read every claim, then check it still serves.
    tokio::time::sleep(Duration::from_millis(500)).await;
    send_ok(&mut push, vec![bytes("after")]).await;
    assert_eq!(within("recv", rx.recv()).await, Some(vec![bytes("after")]));
    drop(idle);
    receiver.abort();
}
