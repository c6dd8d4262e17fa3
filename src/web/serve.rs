//! The HTTP server loop every kvplane service runs its router on, with the limits a hostile
//! peer must not get past:
//!
//! * at most `max_connections` connections are served at once. A new connection at the cap
//!   is admitted by closing the least recently active *idle* one (a keep-alive connection
//!   waiting for its next request's headers: hyper's graceful shutdown, so a request that
//!   races in is still answered), one `http_idle_closed` hit; only when every slot is busy
//!   with a request does the new one wait for a slot (further peers wait in the kernel's
//!   accept queue), one `http_connections` hit. So an idle keep-alive connection (an MP server
//!   between heartbeats) never blocks a new one;
//! * at the first start the process's `RLIMIT_NOFILE` soft limit is raised to its hard limit
//!   (logged): a server needs about one descriptor per connection plus a few dozen.
//! * a request's headers must arrive within `read_timeout` of the connection waiting for
//!   them (hyper's header timer, which starts as soon as a connection is idle: it is also the
//!   keep-alive idle timeout), and its body within `read_timeout` of the headers; a peer too
//!   slow for either is cut off, one `http_read_timeout` hit (an idle keep-alive connection
//!   closed by the same timer is not a hit);
//! * on shutdown every connection finishes its request in flight and closes.
//!
//! HTTP/1.1 only (the services' clients: LMCache, curl, browsers, Prometheus); over TLS with
//! [`serve_tls`] (see [`super::tls`]).

pub use super::limits::is_read_timeout;
use super::limits::{HttpLimits, LimitHit, LimitHook, ReadTimedOut, WebLimit};
use super::tls::ServerTls;
use axum::body::{Body, Bytes};
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// Pause after a failed `accept` (e.g. out of file descriptors) before the next one.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `router` on `listener` under `limits` until `shutdown`, then lets each connection
/// finish its request in flight. Refusals are reported to `on_limit`.
///
/// # Errors
/// Never in practice: a failed `accept` is logged and retried after a pause.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    on_limit: LimitHook,
    shutdown: CancellationToken,
) -> io::Result<()> {
    serve_tls(listener, router, limits, on_limit, shutdown, None).await
}

/// [`serve`], speaking HTTPS only when `tls` is given ([`super::tls`]): each connection's
/// handshake must finish within `read_timeout`; a failed one (a plaintext client, a wrong or
/// missing client certificate) is one `http_tls_handshake` hit and the connection is closed.
/// The certificate files are watched for a change until `shutdown`.
///
/// # Errors
/// Never in practice: a failed `accept` is logged and retried after a pause.
pub async fn serve_tls(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    on_limit: LimitHook,
    shutdown: CancellationToken,
    tls: Option<ServerTls>,
) -> io::Result<()> {
    if let Some(tls) = &tls {
        tls.watch("HTTP listener", shutdown.clone());
    }
    raise_fd_limit(limits.max_connections);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let idle = Arc::new(IdleSet::default());
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("HTTP accept failed: {e}; retrying in {ACCEPT_BACKOFF:?}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Some(permit) = admit(&slots, &idle, peer, &limits, &on_limit, &shutdown).await else {
            break;
        };
        let tracked = Tracked::new(Arc::clone(&idle), shutdown.child_token());
        let (router, on_limit) = (router.clone(), Arc::clone(&on_limit));
        let tls = tls.as_ref().map(ServerTls::config);
        connections.spawn(async move {
            match tls {
                None => connection(stream, peer, router, limits, on_limit, tracked).await,
                Some(config) => {
                    let acceptor = tokio_rustls::TlsAcceptor::from(config);
                    let handshake =
                        tokio::time::timeout(limits.read_timeout, acceptor.accept(stream)).await;
                    match handshake {
                        Ok(Ok(stream)) => {
                            connection(stream, peer, router, limits, on_limit, tracked).await;
                        }
                        failed => {
                            let why = match failed {
                                Ok(Err(e)) => e.to_string(),
                                _ => "no handshake within --http-read-timeout".into(),
                            };
                            on_limit(
                                LimitHit {
                                    limit: WebLimit::TlsHandshake,
                                    value: limits.read_timeout.as_secs(),
                                },
                                &format!("TLS handshake with {peer} failed: {why}"),
                            );
                        }
                    }
                }
            }
            drop(permit);
        });
    }
    connections.close();
    connections.wait().await;
    Ok(())
}

/// A slot for a new connection from `peer`: a free one, else the one of the least recently
/// active idle connection (closed for it), else (every slot busy with a request) the first
/// that frees or turns idle. `None` on shutdown.
async fn admit(
    slots: &Arc<Semaphore>,
    idle: &IdleSet,
    peer: SocketAddr,
    limits: &HttpLimits,
    on_limit: &LimitHook,
    shutdown: &CancellationToken,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    if let Ok(permit) = Arc::clone(slots).try_acquire_owned() {
        return Some(permit);
    }
    let hit = |limit, detail: &str| {
        on_limit(
            LimitHit {
                limit,
                value: limits.max_connections as u64,
            },
            detail,
        );
    };
    let mut waited = false;
    loop {
        if idle.close_oldest() {
            hit(
                WebLimit::IdleClosed,
                &format!(
                    "all connection slots taken: closed the least recently active idle \
                     keep-alive connection to admit {peer}"
                ),
            );
            // Its slot frees once it has closed (at once when idle; a request that raced
            // in is answered first).
            return tokio::select! {
                _ = shutdown.cancelled() => None,
                permit = Arc::clone(slots).acquire_owned() => permit.ok(),
            };
        }
        if !waited {
            waited = true;
            hit(
                WebLimit::Connections,
                &format!(
                    "all connection slots busy with requests: {peer} waits for one (later \
                     peers wait in the accept queue)"
                ),
            );
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            permit = Arc::clone(slots).acquire_owned() => return permit.ok(),
            () = idle.turned_idle.notified() => {}
        }
    }
}

/// The idle connections (waiting for a request's headers), oldest first, so that a new
/// connection at the cap can close the least recently active one. Each connection moves in
/// and out once per request (a lock and a B-tree insert or removal, well under a
/// microsecond), and a close costs O(log n).
#[derive(Default)]
struct IdleSet {
    inner: Mutex<IdleInner>,
    /// Signalled when a connection turns idle (for a new connection waiting at the cap).
    turned_idle: tokio::sync::Notify,
}

#[derive(Default)]
struct IdleInner {
    /// Stamps only grow: the smallest key is the connection idle the longest.
    next_stamp: u64,
    idle: BTreeMap<u64, CancellationToken>,
}

impl IdleSet {
    fn lock(&self) -> std::sync::MutexGuard<'_, IdleInner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Enters `close` as idle from now; returns its stamp (never 0).
    fn enter(&self, close: &CancellationToken) -> u64 {
        let mut inner = self.lock();
        inner.next_stamp += 1;
        let stamp = inner.next_stamp;
        inner.idle.insert(stamp, close.clone());
        drop(inner);
        self.turned_idle.notify_one();
        stamp
    }

    fn leave(&self, stamp: u64) {
        if stamp != 0 {
            self.lock().idle.remove(&stamp);
        }
    }

    /// Asks the connection idle the longest to close; false when none is idle.
    fn close_oldest(&self) -> bool {
        let oldest = self.lock().idle.pop_first();
        match oldest {
            Some((_, close)) => {
                close.cancel();
                true
            }
            None => false,
        }
    }
}

/// One connection's place in the [`IdleSet`] and the token that closes it (a child of the
/// server's shutdown token).
struct Tracked {
    set: Arc<IdleSet>,
    close: CancellationToken,
    /// Its stamp in the set while idle, 0 while a request is being read or answered.
    stamp: AtomicU64,
}

impl Tracked {
    /// A new connection: idle (it has not sent its first request yet).
    fn new(set: Arc<IdleSet>, close: CancellationToken) -> Arc<Self> {
        let stamp = AtomicU64::new(set.enter(&close));
        Arc::new(Tracked { set, close, stamp })
    }

    fn busy(&self) {
        self.set.leave(self.stamp.swap(0, Ordering::Relaxed));
    }

    fn idle(&self) {
        let stamp = self.set.enter(&self.close);
        self.set.leave(self.stamp.swap(stamp, Ordering::Relaxed));
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.set.leave(*self.stamp.get_mut());
    }
}

/// Raises `RLIMIT_NOFILE`'s soft limit to its hard limit, once per process, and logs it: a
/// server with `max_connections` slots needs about that many descriptors plus a few dozen
/// (listeners, files, outbound connections). Warns when even the hard limit is lower.
pub fn raise_fd_limit(max_connections: usize) {
    static RAISED: OnceLock<u64> = OnceLock::new();
    let limit = *RAISED.get_or_init(|| {
        let before = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(0, |(soft, _)| soft);
        match rlimit::increase_nofile_limit(u64::MAX) {
            Ok(soft) => {
                tracing::info!("open-file limit (RLIMIT_NOFILE): soft {soft} (was {before})");
                soft
            }
            Err(e) => {
                tracing::warn!("could not raise the open-file limit (RLIMIT_NOFILE {before}): {e}");
                before
            }
        }
    });
    let need = max_connections as u64 + FD_RESERVE;
    if limit != 0 && limit < need {
        tracing::warn!(
            "open-file limit {limit} is below what --max-http-connections {max_connections} \
             needs (~{need}): past it new connections fail to be accepted; raise the hard \
             limit (ulimit -Hn, LimitNOFILE=) or lower --max-http-connections"
        );
    }
}

/// Descriptors a server needs besides its HTTP connections (listeners, outbound clients,
/// files), for [`raise_fd_limit`]'s warning.
const FD_RESERVE: u64 = 64;

/// Serves one connection.
async fn connection<T: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    stream: T,
    peer: SocketAddr,
    router: Router,
    limits: HttpLimits,
    on_limit: LimitHook,
    tracked: Arc<Tracked>,
) {
    // Set when request bytes arrive, cleared when a response is written: tells a peer cut
    // off mid-request (a limit hit) from an idle keep-alive connection closed by the timer,
    // and keeps the connection's place in the idle set.
    let mid_request = Arc::new(AtomicBool::new(false));
    let close = tracked.close.clone();
    let io = TokioIo::new(Watched {
        inner: stream,
        mid_request: Arc::clone(&mid_request),
        tracked,
    });
    let body_hook = Arc::clone(&on_limit);
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let hook = Arc::clone(&body_hook);
        let request = request.map(|incoming| {
            Body::new(TimedBody {
                incoming: Some(incoming),
                deadline: Box::pin(tokio::time::sleep_until(
                    Instant::now() + limits.read_timeout,
                )),
                on_timeout: Some(Box::new(move || {
                    hook(
                        LimitHit {
                            limit: WebLimit::ReadTimeout,
                            value: limits.read_timeout.as_secs(),
                        },
                        &format!("{peer} did not send its request body in time"),
                    )
                })),
            })
        });
        router.clone().oneshot(request)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.read_timeout);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        // Server shutdown, or closed to admit a new connection: an idle connection closes at
        // once, a request in flight is answered first.
        _ = close.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.as_mut().await
        }
    };
    if let Err(e) = result {
        if e.is_timeout() && mid_request.load(Ordering::Relaxed) {
            on_limit(
                LimitHit {
                    limit: WebLimit::ReadTimeout,
                    value: limits.read_timeout.as_secs(),
                },
                &format!("{peer} did not send its request headers in time"),
            );
        } else {
            tracing::debug!(%peer, "HTTP connection ended: {e}");
        }
    }
}

/// A request body that fails with [`ReadTimedOut`] once its deadline passes.
struct TimedBody {
    incoming: Option<Incoming>,
    deadline: Pin<Box<Sleep>>,
    on_timeout: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl hyper::body::Body for TimedBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let Some(incoming) = this.incoming.as_mut() else {
            return Poll::Ready(None);
        };
        if let Poll::Ready(frame) = Pin::new(incoming).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            if let Some(hit) = this.on_timeout.take() {
                hit();
            }
            this.incoming = None;
            return Poll::Ready(Some(Err(Box::new(ReadTimedOut))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.as_ref().is_none_or(|i| i.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |i| i.size_hint())
    }
}

/// The connection's socket, noting whether a request is being read.
struct Watched<T> {
    inner: T,
    mid_request: Arc<AtomicBool>,
    tracked: Arc<Tracked>,
}

impl<T> Watched<T> {
    fn started_request(&self) {
        if !self.mid_request.swap(true, Ordering::Relaxed) {
            self.tracked.busy();
        }
    }

    fn answered(&self) {
        if self.mid_request.swap(false, Ordering::Relaxed) {
            self.tracked.idle();
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.started_request();
        }
        poll
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(poll, Poll::Ready(Ok(n)) if n > 0) {
            self.answered();
        }
        poll
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(poll, Poll::Ready(Ok(n)) if n > 0) {
            self.answered();
        }
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
