//! The HTTP server loop every kvplane service runs its router on, with the limits a hostile
//! peer must not get past:
//!
//! * at most `max_connections` connections are served at once; the accept loop stops
//!   accepting at the cap, so further peers wait in the kernel's accept queue (and are
//!   refused by the kernel once that is full); each wait is one `http_connections` hit;
//! * a request's headers must arrive within `read_timeout` of the connection waiting for
//!   them (hyper's header timer, which starts as soon as a connection is idle: it is also the
//!   keep-alive idle timeout), and its body within `read_timeout` of the headers; a peer too
//!   slow for either is cut off, one `http_read_timeout` hit (an idle keep-alive connection
//!   closed by the same timer is not a hit);
//! * on shutdown every connection finishes its request in flight and closes.
//!
//! HTTP/1.1 only (the services' clients: LMCache, curl, browsers, Prometheus).

use super::limits::{HttpLimits, LimitHit, LimitHook, WebLimit};
use axum::body::{Body, Bytes};
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// Pause after a failed `accept` (e.g. out of file descriptors) before the next one.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The error a request body yields when the peer is too slow sending it.
#[derive(Debug, thiserror::Error)]
#[error("request body not received within the read timeout")]
pub struct ReadTimedOut;

/// Whether `error` (a body extractor's rejection) comes from [`ReadTimedOut`].
pub fn is_read_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = next {
        if e.is::<ReadTimedOut>() {
            return true;
        }
        next = e.source();
    }
    false
}

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
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let connections = TaskTracker::new();
    loop {
        let permit = match Arc::clone(&slots).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                on_limit(
                    LimitHit {
                        limit: WebLimit::Connections,
                        value: limits.max_connections as u64,
                    },
                    "all connection slots busy: new connections wait in the accept queue",
                );
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    permit = Arc::clone(&slots).acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => break, // never closed
                    },
                }
            }
        };
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
        let (router, on_limit, shutdown) =
            (router.clone(), Arc::clone(&on_limit), shutdown.clone());
        connections.spawn(async move {
            connection(stream, peer, router, limits, on_limit, shutdown).await;
            drop(permit);
        });
    }
    connections.close();
    connections.wait().await;
    Ok(())
}

/// Serves one connection.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    limits: HttpLimits,
    on_limit: LimitHook,
    shutdown: CancellationToken,
) {
    // Set when request bytes arrive, cleared when a response is written: tells a peer cut
    // off mid-request (a limit hit) from an idle keep-alive connection closed by the timer.
    let mid_request = Arc::new(AtomicBool::new(false));
    let io = TokioIo::new(Watched {
        inner: stream,
        mid_request: Arc::clone(&mid_request),
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
        _ = shutdown.cancelled() => {
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
struct Watched {
    inner: TcpStream,
    mid_request: Arc<AtomicBool>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.mid_request.store(true, Ordering::Relaxed);
        }
        poll
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(poll, Poll::Ready(Ok(n)) if n > 0) {
            self.mid_request.store(false, Ordering::Relaxed);
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
            self.mid_request.store(false, Ordering::Relaxed);
        }
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
