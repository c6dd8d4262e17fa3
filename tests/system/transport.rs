//! Learning tests for `kvplane::transport` and the `zeromq` 0.7.0 behaviour it relies on, and
//! the helpers the transport tests share (binding, echo servers, raw TCP peers).
//!
//! Real sockets on 127.0.0.1 with ephemeral ports. Every await is bounded and every loop has a
//! fixed number of rounds, so a behaviour change shows up as a failure, never as a hung run.
//! If a `zeromq` upgrade breaks one of these, read the test's doc before changing it. The
//! regression tests of kvplane's patch to `zeromq` (`vendor/zeromq/KVPLANE-PATCHES.md`) and
//! the listeners' limits are in `transport_limits.rs`.

use crate::support::zmtp::{zmtp_greeting, zmtp_ready};
use crate::support::{eventually, hold_port, within, STEP};
use bytes::Bytes;
use kvplane::transport::{
    DealerClient, DropReason, PeerId, PullListener, PushSender, RepServer, ReqClient,
    RouterListener, TransportError, TransportLimits,
};
use rand::Rng;
use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use zeromq::prelude::*;

/// Timeout given to the clients under test.
pub(crate) const SHORT: Duration = Duration::from_millis(500);

pub(crate) fn bytes(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

pub(crate) fn random_bytes(len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    rand::rng().fill(&mut data[..]);
    data
}

pub(crate) async fn raw_connect(port: u16) -> TcpStream {
    within("raw connect", TcpStream::connect(("127.0.0.1", port)))
        .await
        .expect("raw connect")
}

/// Awaits a listener's bind (bounded by [`STEP`]); the test fails if it does not bind.
pub(crate) async fn bound<S>(
    bind: impl Future<Output = Result<(S, SocketAddr), TransportError>>,
) -> (S, SocketAddr) {
    within("bind", bind).await.expect("bind")
}

/// Sends `frames` on `push`, which must succeed within [`SHORT`].
pub(crate) async fn send_ok(push: &mut PushSender, frames: Vec<Bytes>) {
    within("send", push.send(frames, SHORT))
        .await
        .expect("send");
}

/// A task answering `n` requests on `router`, each with its own last frame.
pub(crate) fn echo_router(mut router: RouterListener, n: usize) -> JoinHandle<()> {
    tokio::spawn(async move {
        for _ in 0..n {
            let request = router.recv().await.expect("recv");
            let payload = request.frames.last().cloned().unwrap_or_default();
            router.reply(&request.peer, payload).await.expect("reply");
        }
    })
}

/// A task answering `n` requests on `rep`, each with itself.
pub(crate) fn echo_rep(mut rep: RepServer, n: usize) -> JoinHandle<()> {
    tokio::spawn(async move {
        for _ in 0..n {
            let request = rep.recv().await.expect("recv");
            rep.reply(request).await.expect("reply");
        }
    })
}

/// The next message from `pull`, skipping the peer drops it reports (pushed onto `dropped`).
/// At most 100 drops in a row.
pub(crate) async fn recv_message(
    pull: &mut PullListener,
    dropped: &mut Vec<DropReason>,
) -> Vec<Bytes> {
    for _ in 0..100 {
        match pull.recv().await {
            Ok(frames) => return frames,
            Err(TransportError::PeerDropped { reason }) => dropped.push(reason),
            Err(other) => panic!("recv: {other}"),
        }
    }
    panic!("100 peer drops in a row: {dropped:?}");
}

/// The request of both request clients, so that one echo check serves them.
pub(crate) trait Requester {
    fn ask(&mut self, payload: Bytes) -> impl Future<Output = Result<Bytes, TransportError>>;
}

impl Requester for DealerClient {
    fn ask(&mut self, payload: Bytes) -> impl Future<Output = Result<Bytes, TransportError>> {
        self.request(payload)
    }
}

impl Requester for ReqClient {
    fn ask(&mut self, payload: Bytes) -> impl Future<Output = Result<Bytes, TransportError>> {
        self.request(payload)
    }
}

/// Sends `text` through an echo server and checks that it comes back.
pub(crate) async fn assert_echo(client: &mut impl Requester, text: &str) {
    let reply = within("request", client.ask(bytes(text)))
        .await
        .expect("request");
    assert_eq!(reply, bytes(text));
}

/// Writes `bytes`, half-closes, and reads until the listener closes the connection. Write
/// errors are expected when the listener hangs up first. Panics if the listener keeps the
/// connection open (past [`STEP`]): a broken peer must be dropped (while the listener's `recv`
/// runs).
async fn raw_send_and_close(port: u16, bytes: &[u8], case: &str) {
    let mut stream = raw_connect(port).await;
    let _ = stream.write_all(bytes).await;
    let _ = stream.shutdown().await;
    let mut sink = Vec::new();
    let closed = tokio::time::timeout(STEP, stream.read_to_end(&mut sink)).await;
    assert!(closed.is_ok(), "{case}: listener kept the connection open");
}

/// Every kind of broken raw-TCP peer the listeners must shrug off; each is disconnected by
/// the listener. Returns the connections that stay open, idle, so the caller can keep them
/// alive while it checks the listener. The listener's `recv` must be running meanwhile:
/// broken streams are only noticed when the socket polls them.
async fn abuse_listener(port: u16, socket_type: &str) -> Vec<TcpStream> {
    let mut garbage = random_bytes(1 << 20);
    garbage[0] = 0; // not a greeting's 0xff, so the greeting check rejects it at once
    raw_send_and_close(port, &garbage, "garbage").await;
    raw_send_and_close(port, &zmtp_greeting()[..20], "half greeting").await;
    raw_send_and_close(port, &[], "nothing").await;

    // A complete handshake, then a frame cut short by EOF: zeromq's PULL and REP report this
    // as an error from recv(), which the listeners must swallow.
    let mut truncated = zmtp_greeting();
    truncated.extend_from_slice(&zmtp_ready(socket_type));
    truncated.extend_from_slice(&[0x00, 200, 1, 2, 3]);
    raw_send_and_close(port, &truncated, "truncated frame").await;

    // A complete handshake, then an unknown command.
    let mut bad_command = zmtp_greeting();
    bad_command.extend_from_slice(&zmtp_ready(socket_type));
    bad_command.extend_from_slice(&[0x04, 6, 5, b'B', b'O', b'G', b'U', b'S']);
    raw_send_and_close(port, &bad_command, "unknown command").await;

    // Connections that stay open: silent, or stopping halfway through the greeting. They must
    // not block other peers (the handshake timeout, 10 s by default, closes them later).
    let silent = raw_connect(port).await;
    let mut half = raw_connect(port).await;
    within("half greeting", half.write_all(&zmtp_greeting()[..10]))
        .await
        .expect("write half greeting");
    vec![silent, half]
}

/// PUSH→PULL: a 50-frame multipart (LMCache's batch size) arrives as one message with every
/// frame intact and in order, including empty frames.
#[tokio::test]
async fn push_pull_50_frame_multipart_arrives_whole() {
    let (mut pull, addr) = bound(PullListener::bind("127.0.0.1:0")).await;
    assert_ne!(addr.port(), 0, "port 0 must be resolved");
    let mut push = PushSender::new(addr.to_string());

    let frames: Vec<Bytes> = (0..50)
        .map(|i| match i {
            7 => Bytes::new(),
            _ => Bytes::from(format!("frame-{i}-{}", "x".repeat(i * 27))),
        })
        .collect();
    for _ in 0..3 {
        send_ok(&mut push, frames.clone()).await;
    }
    for _ in 0..3 {
        let got = within("recv", pull.recv()).await.expect("recv");
        assert_eq!(got, frames);
    }
    let empty = within("send empty", push.send(Vec::new(), SHORT)).await;
    assert!(matches!(empty, Err(TransportError::EmptyMessage)));
}

/// `*:0` binds all interfaces; the reported address is the kernel's, with the real port.
#[tokio::test]
async fn bind_star_port_zero_reports_the_bound_address() {
    let (_router, addr) = bound(RouterListener::bind("*:0")).await;
    assert!(addr.ip().is_unspecified());
    assert_ne!(addr.port(), 0);
    raw_connect(addr.port()).await;
}

/// DEALER→ROUTER→DEALER: the ROUTER sees `[identity, "", payload]`, each peer has its own
/// identity, and with two peers pipelining requests, each gets its replies in its own order.
#[tokio::test]
async fn dealer_router_echo_keeps_per_peer_order() {
    const ROUNDS: usize = 200;
    let (mut router, addr) = bound(RouterListener::bind("127.0.0.1:0")).await;
    let endpoint = format!("tcp://{addr}");
    let mut dealers = Vec::new();
    for _ in 0..2 {
        let mut dealer = zeromq::DealerSocket::new();
        within("connect", dealer.connect(&endpoint))
            .await
            .expect("connect");
        dealers.push(dealer);
    }

    for i in 0..ROUNDS {
        for (d, dealer) in dealers.iter_mut().enumerate() {
            let mut msg = zeromq::ZmqMessage::from(format!("d{d}-{i}"));
            msg.push_front(Bytes::new());
            within("dealer send", dealer.send(msg))
                .await
                .expect("dealer send");
        }
    }

    let mut identities = std::collections::HashMap::new();
    for _ in 0..ROUNDS * 2 {
        let request = within("router recv", router.recv()).await.expect("recv");
        assert_eq!(request.frames.len(), 2, "expected [\"\", payload]");
        assert!(request.frames[0].is_empty());
        let payload = String::from_utf8(request.frames[1].to_vec()).expect("utf8");
        let dealer = payload[..2].to_owned();
        let known = identities
            .entry(dealer)
            .or_insert_with(|| request.peer.clone());
        assert_eq!(*known, request.peer, "identity is stable per connection");
        let reply = Bytes::from(format!("echo:{payload}"));
        within("reply", router.reply(&request.peer, reply))
            .await
            .expect("reply");
    }
    assert_eq!(identities.len(), 2);
    assert_ne!(identities["d0"], identities["d1"]);

    for (d, dealer) in dealers.iter_mut().enumerate() {
        for i in 0..ROUNDS {
            let reply = within("dealer recv", dealer.recv()).await.expect("recv");
            let frames = reply.into_vec();
            assert_eq!(frames.len(), 2);
            assert!(frames[0].is_empty());
            assert_eq!(frames[1], bytes(&format!("echo:d{d}-{i}")));
        }
    }
}

/// `split()`: one task receives, another replies, and `DealerClient` gets the last frame.
#[tokio::test]
async fn split_router_replies_from_another_task() {
    let (router, addr) = bound(RouterListener::bind("127.0.0.1:0")).await;
    let (mut receiver, sender) = router.split();
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let replier = tokio::spawn(async move {
        let mut sender = sender;
        while let Some((peer, payload)) = rx.recv().await {
            sender.reply(&peer, payload).await.expect("reply");
        }
    });
    let receive = tokio::spawn(async move {
        for _ in 0..10 {
            let request = receiver.recv().await.expect("recv");
            let payload = request.frames.last().cloned().unwrap_or_default();
            tx.send((request.peer, payload)).await.expect("to replier");
        }
    });

    let mut client = DealerClient::new(addr.to_string(), SHORT);
    for i in 0..10 {
        assert_echo(&mut client, &format!("req-{i}")).await;
    }
    within("receiver task", receive).await.expect("receiver");
    within("replier task", replier).await.expect("replier");
}

/// A flooding peer does not starve another: the fair queue serves connections in turn.
#[tokio::test]
async fn router_recv_is_fair_between_peers() {
    let (mut router, addr) = bound(RouterListener::bind("127.0.0.1:0")).await;
    let endpoint = format!("tcp://{addr}");
    let mut flooder = zeromq::DealerSocket::new();
    let mut quiet = zeromq::DealerSocket::new();
    within("connect", flooder.connect(&endpoint))
        .await
        .expect("connect");
    within("connect", quiet.connect(&endpoint))
        .await
        .expect("connect");

    for i in 0..5000 {
        let mut msg = zeromq::ZmqMessage::from(format!("flood-{i}"));
        msg.push_front(Bytes::new());
        within("flood", flooder.send(msg)).await.expect("flood");
    }
    let mut msg = zeromq::ZmqMessage::from("quiet");
    msg.push_front(Bytes::new());
    within("quiet", quiet.send(msg)).await.expect("quiet");
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut position = None;
    for n in 0..5001 {
        let request = within("recv", router.recv()).await.expect("recv");
        if request.frames.last() == Some(&bytes("quiet")) {
            position = Some(n);
            break;
        }
    }
    let position = position.expect("the quiet peer's message never arrived");
    assert!(
        position < 10,
        "quiet peer served after {position} flood messages"
    );
}

/// Replying to a peer that disconnected never hangs. Pinned: before the ROUTER has polled
/// the closed connection the reply is queued and silently dropped (`Ok`); once `recv` has
/// seen the disconnect, the reply fails with `TransportError::Socket`.
#[tokio::test]
async fn router_reply_to_vanished_peer_is_dropped_or_an_error() {
    let (mut router, addr) = bound(RouterListener::bind("127.0.0.1:0")).await;
    let mut client = DealerClient::new(addr.to_string(), Duration::from_millis(200));
    let pending = tokio::spawn(async move {
        let result = client.request(bytes("hello")).await;
        (client, result)
    });
    let request = within("recv", router.recv()).await.expect("recv");
    let (client, result) = within("client", pending).await.expect("join");
    assert!(matches!(result, Err(TransportError::Timeout)));
    drop(client);

    let early = within("early reply", router.reply(&request.peer, bytes("x"))).await;
    assert!(
        early.is_ok(),
        "unnoticed disconnect: reply is queued and dropped"
    );

    // Let recv poll the closed connection.
    let idle = tokio::time::timeout(Duration::from_millis(200), router.recv()).await;
    assert!(idle.is_err(), "no traffic expected");
    let late = within("late reply", router.reply(&request.peer, bytes("x"))).await;
    assert!(
        matches!(late, Err(TransportError::Socket(_))),
        "noticed disconnect: reply is an error, got {late:?}"
    );
}

/// REQ to a port where nothing listens: `Timeout` within the bound (the connect is retried,
/// not failed), and once a REP server comes up on that port the same client succeeds.
#[tokio::test]
async fn req_to_dead_port_times_out_then_recovers() {
    let (hold, port) = hold_port();
    let mut client = ReqClient::new(format!("127.0.0.1:{port}"), SHORT);
    let start = Instant::now();
    let result = within("request", client.request(bytes("ping"))).await;
    let elapsed = start.elapsed();
    assert!(matches!(result, Err(TransportError::Timeout)), "{result:?}");
    // Not before the bound; how soon after it is not a test's question.
    assert!(elapsed >= SHORT, "took {elapsed:?}");

    drop(hold);
    let (mut rep, _) = bound(RepServer::bind(&format!("127.0.0.1:{port}"))).await;
    let server = tokio::spawn(async move {
        let request = rep.recv().await.expect("recv");
        assert_eq!(request, bytes("ping"));
        rep.reply(bytes("pong")).await.expect("reply");
        rep
    });
    let reply = within("request", client.request(bytes("ping")))
        .await
        .expect("request after server start");
    assert_eq!(reply, bytes("pong"));
    within("server", server).await.expect("server");
}

/// REQ whose server takes the request but never replies: `Timeout`; the next request on the
/// same client (a fresh socket underneath) gets its own reply once the server answers.
#[tokio::test]
async fn req_without_reply_times_out_then_recovers() {
    let (mut rep, addr) = bound(RepServer::bind("127.0.0.1:0")).await;
    let server = tokio::spawn(async move {
        let ignored = rep.recv().await.expect("first recv");
        assert_eq!(ignored, bytes("one"));
        let request = rep.recv().await.expect("second recv");
        assert_eq!(request, bytes("two"));
        rep.reply(bytes("reply-two")).await.expect("reply");
    });

    let mut client = ReqClient::new(addr.to_string(), SHORT);
    let first = within("first", client.request(bytes("one"))).await;
    assert!(matches!(first, Err(TransportError::Timeout)), "{first:?}");
    let second = within("second", client.request(bytes("two")))
        .await
        .expect("second request");
    assert_eq!(second, bytes("reply-two"));
    within("server", server).await.expect("server");
}

/// A request cancelled by the caller (its future dropped, as an outer `timeout` or `select!`
/// does) discards the socket: the next request opens a fresh one and gets its own reply.
#[tokio::test]
async fn cancelled_req_request_does_not_poison_the_client() {
    let (mut rep, addr) = bound(RepServer::bind("127.0.0.1:0")).await;
    let server = tokio::spawn(async move {
        let ignored = rep.recv().await.expect("first recv");
        assert_eq!(ignored, bytes("one"));
        let request = rep.recv().await.expect("second recv");
        rep.reply(request).await.expect("reply");
    });
    let mut client = ReqClient::new(addr.to_string(), Duration::from_secs(5));
    let cancelled =
        tokio::time::timeout(Duration::from_millis(200), client.request(bytes("one"))).await;
    assert!(
        cancelled.is_err(),
        "the server never replies to the first request"
    );
    let second = within("second", client.request(bytes("two")))
        .await
        .expect("second request");
    assert_eq!(second, bytes("two"));
    within("server", server).await.expect("server");
}

/// The futures of every API call are `Send`, so callers can `tokio::spawn` them. Checked at
/// compile time; never called.
#[allow(dead_code)]
fn api_futures_are_send(
    mut req: ReqClient,
    mut dealer: DealerClient,
    mut push: PushSender,
    mut rep: RepServer,
    mut pull: PullListener,
    mut router: RouterListener,
    peer: PeerId,
) {
    fn send<T: Send>(_: T) {}
    send(req.request(Bytes::new()));
    send(dealer.request(Bytes::new()));
    send(push.send(Vec::new(), SHORT));
    send(rep.recv());
    send(rep.reply(Bytes::new()));
    send(pull.recv());
    send(router.recv());
    send(router.reply(&peer, Bytes::new()));
    let (mut receiver, mut sender) = router.split();
    send(receiver.recv());
    send(sender.reply(&peer, Bytes::new()));
    send(PullListener::bind(""));
    send(RouterListener::bind(""));
    send(RepServer::bind(""));
    let limits = TransportLimits::default();
    send(PullListener::bind_with("", &limits));
    send(RouterListener::bind_with("", &limits));
    send(RepServer::bind_with("", &limits));
}

/// A DEALER whose reply comes late is rebuilt, so the late reply (sent to the old
/// connection) is never taken for the answer to the next request.
#[tokio::test]
async fn dealer_client_never_returns_a_stale_reply() {
    let (mut router, addr) = bound(RouterListener::bind("127.0.0.1:0")).await;
    let server = tokio::spawn(async move {
        let first = router.recv().await.expect("first");
        let second = router.recv().await.expect("second");
        assert_ne!(first.peer, second.peer, "a new socket has a new identity");
        let _ = router.reply(&first.peer, bytes("late")).await;
        router
            .reply(&second.peer, bytes("fresh"))
            .await
            .expect("reply");
        router
    });
    let mut client = DealerClient::new(addr.to_string(), SHORT);
    let first = within("first", client.request(bytes("one"))).await;
    assert!(matches!(first, Err(TransportError::Timeout)), "{first:?}");
    let second = within("second", client.request(bytes("two")))
        .await
        .expect("second");
    assert_eq!(second, bytes("fresh"));
    within("server", server).await.expect("server");
}

/// Connecting to a socket of an incompatible type is a `Connect` error, not a timeout.
#[tokio::test]
async fn incompatible_peer_is_a_connect_error() {
    let (_pull, addr) = bound(PullListener::bind("127.0.0.1:0")).await;
    let mut client = ReqClient::new(addr.to_string(), Duration::from_secs(5));
    let result = within("request", client.request(bytes("x"))).await;
    assert!(
        matches!(result, Err(TransportError::Connect { .. })),
        "{result:?}"
    );
}

/// A 1 MiB frame of random bytes arrives intact, and the PULL keeps working afterwards.
#[tokio::test]
async fn pull_takes_a_1_mib_frame_and_keeps_working() {
    let (mut pull, addr) = bound(PullListener::bind("127.0.0.1:0")).await;
    let mut push = PushSender::new(addr.to_string());
    let big = Bytes::from(random_bytes(1 << 20));
    within(
        "send big",
        push.send(vec![bytes("head"), big.clone()], SHORT),
    )
    .await
    .expect("send big");
    within("send small", push.send(vec![bytes("after")], SHORT))
        .await
        .expect("send small");
    let got = within("recv big", pull.recv()).await.expect("recv");
    assert_eq!(got, vec![bytes("head"), big]);
    let got = within("recv small", pull.recv()).await.expect("recv");
    assert_eq!(got, vec![bytes("after")]);
}

/// Raw TCP peers sending garbage, half a greeting, nothing, a truncated frame or an unknown
/// command, or staying connected without a word, neither stall nor kill the PULL listener.
#[tokio::test]
async fn pull_survives_broken_raw_peers() {
    let (mut pull, addr) = bound(PullListener::bind("127.0.0.1:0")).await;
    let receiver = tokio::spawn(async move {
        let mut dropped = Vec::new();
        for i in 0..20 {
            let got = recv_message(&mut pull, &mut dropped).await;
            assert_eq!(got, vec![bytes(&format!("ok-{i}"))]);
        }
    });
    let _idle = abuse_listener(addr.port(), "PUSH").await;
    let mut push = PushSender::new(addr.to_string());
    for i in 0..20 {
        send_ok(&mut push, vec![bytes(&format!("ok-{i}"))]).await;
    }
    within("receiver", receiver).await.expect("receiver");
}

/// Same abuse against the ROUTER listener; a DEALER request still gets its reply.
#[tokio::test]
async fn router_survives_broken_raw_peers() {
    let (router, addr) = bound(RouterListener::bind("127.0.0.1:0")).await;
    let server = echo_router(router, 5);
    let _idle = abuse_listener(addr.port(), "DEALER").await;
    let mut client = DealerClient::new(addr.to_string(), SHORT);
    for i in 0..5 {
        assert_echo(&mut client, &format!("ok-{i}")).await;
    }
    within("server", server).await.expect("server");
}

/// Same abuse against the REP server; a REQ request still gets its reply.
#[tokio::test]
async fn rep_survives_broken_raw_peers() {
    let (rep, addr) = bound(RepServer::bind("127.0.0.1:0")).await;
    let server = echo_rep(rep, 5);
    let _idle = abuse_listener(addr.port(), "REQ").await;
    let mut client = ReqClient::new(addr.to_string(), SHORT);
    for i in 0..5 {
        assert_echo(&mut client, &format!("ok-{i}")).await;
    }
    within("server", server).await.expect("server");
}

/// Why `RepServer` is built on a ROUTER socket: upstream, once a peer's stream ends
/// mid-frame, `zeromq`'s own REP socket returns the same error from every later `recv`,
/// forever (the broken stream stays in its fair queue), so a serving loop would spin. kvplane's
/// patch ends a peer's stream after its first error (`KVPLANE-PATCHES.md`), so the error now
/// comes once and `recv` then waits for other peers. If this fails after an upgrade, check
/// that `RepServer` still does not spin.
#[tokio::test]
async fn zeromq_rep_socket_reports_a_broken_peer_once() {
    let mut rep = zeromq::RepSocket::new();
    let endpoint = within("bind", rep.bind("tcp://127.0.0.1:0"))
        .await
        .expect("bind");
    let zeromq::Endpoint::Tcp(_, port) = endpoint else {
        panic!("not tcp: {endpoint}");
    };
    let mut truncated = zmtp_greeting();
    truncated.extend_from_slice(&zmtp_ready("REQ"));
    truncated.extend_from_slice(&[0x00, 200, 1, 2, 3]);
    let mut stream = raw_connect(port).await;
    within("write", stream.write_all(&truncated))
        .await
        .expect("write");
    within("half-close", stream.shutdown())
        .await
        .expect("half-close");
    let first = within("rep recv", rep.recv()).await;
    assert!(first.is_err(), "expected the broken peer's error");
    let second = tokio::time::timeout(Duration::from_millis(200), rep.recv()).await;
    assert!(second.is_err(), "the error repeated: {second:?}");
}

/// `recv` is cancel-safe: a loop that keeps dropping `recv` futures (as `select!` against a
/// shutdown signal or a short timeout does) loses no message and keeps their order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_recv_is_cancel_safe() {
    const MESSAGES: usize = 500;
    let (mut pull, addr) = bound(PullListener::bind("127.0.0.1:0")).await;
    let sender = tokio::spawn(async move {
        let mut push = PushSender::new(addr.to_string());
        for i in 0..MESSAGES {
            push.send(vec![Bytes::from(i.to_string())], SHORT)
                .await
                .expect("send");
            if i % 50 == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        push
    });
    let mut next = 0;
    for _ in 0..200_000 {
        if next == MESSAGES {
            break;
        }
        if let Ok(frames) = tokio::time::timeout(Duration::from_micros(50), pull.recv()).await {
            assert_eq!(frames.expect("recv"), vec![Bytes::from(next.to_string())]);
            next += 1;
        }
    }
    assert_eq!(next, MESSAGES);
    within("sender", sender).await.expect("sender");
}

/// Dropping a `PullListener` closes the connections it accepted, so a PUSH peer notices
/// (zeromq's own PULL socket keeps them open after drop).
#[tokio::test]
async fn dropping_pull_listener_closes_its_connections() {
    let (mut pull, addr) = bound(PullListener::bind("127.0.0.1:0")).await;
    let mut push = zeromq::PushSocket::new();
    within("connect", push.connect(&format!("tcp://{addr}")))
        .await
        .expect("connect");
    within("send", push.send("hello".into()))
        .await
        .expect("send");
    within("recv", pull.recv()).await.expect("recv");
    drop(pull);

    eventually("PUSH notices the PULL side was dropped", STEP, async || {
        within("send", push.send("more".into())).await.is_err()
    })
    .await;
}

/// A `PushSender` recovers when the PULL side restarts on the same port: some sends fail or
/// are lost while the old connection is torn down, then a fresh connection carries traffic.
#[tokio::test]
async fn push_sender_reconnects_after_pull_restart() {
    let (mut pull, addr) = bound(PullListener::bind("127.0.0.1:0")).await;
    let mut push = PushSender::new(addr.to_string());
    send_ok(&mut push, vec![bytes("before")]).await;
    assert_eq!(
        within("recv", pull.recv()).await.expect("recv"),
        vec![bytes("before")]
    );
    drop(pull);
    // The port is released when the accept task notices the drop, not synchronously.
    let mut pull = eventually("the port released after the drop", STEP, async || {
        PullListener::bind(&addr.to_string())
            .await
            .map(|(pull, _)| pull)
    })
    .await;

    let mut delivered = None;
    for i in 0..100 {
        let _ = within("send", push.send(vec![bytes(&format!("after-{i}"))], SHORT)).await;
        if let Ok(frames) = tokio::time::timeout(Duration::from_millis(50), pull.recv()).await {
            delivered = Some(frames.expect("recv"));
            break;
        }
    }
    let delivered = delivered.expect("no message reached the restarted PULL");
    assert!(delivered[0].starts_with(b"after-"));
}

/// Not a test: PUSH → PULL throughput through kvplane's own wrappers, printed, never asserted
/// (timings depend on the machine). Run with
/// `cargo test --release --test system transport::push_pull_throughput -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement, not a test; run by hand"]
async fn push_pull_throughput() {
    const FRAMES: usize = 50;
    for (frame_len, messages) in [(64, 40_000), (2_000, 10_000), (64 * 1024, 400)] {
        let (mut pull, addr) = bound(PullListener::bind("127.0.0.1:0")).await;
        let frames: Vec<Bytes> = (0..FRAMES)
            .map(|_| Bytes::from(random_bytes(frame_len)))
            .collect();
        let sender = tokio::spawn(async move {
            let mut push = PushSender::new(addr.to_string());
            for _ in 0..messages {
                push.send(frames.clone(), STEP).await.expect("send");
            }
            push
        });
        let start = Instant::now();
        let mut received = 0;
        for _ in 0..messages {
            received += within("recv", pull.recv()).await.expect("recv").len();
        }
        let elapsed = start.elapsed();
        within("sender", sender).await.expect("sender");
        let per_second = received as f64 / elapsed.as_secs_f64();
        println!(
            "frame {frame_len:>6} B: {received} frames in {elapsed:.2?}: {per_second:>10.0} frames/s, {:>7.1} MB/s",
            per_second * frame_len as f64 / 1e6
        );
    }
}
