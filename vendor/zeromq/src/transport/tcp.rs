use std::sync::Arc;

#[cfg(feature = "tokio-runtime")]
use tokio::net::{TcpListener, TcpStream};

#[cfg(any(feature = "async-std-runtime", feature = "async-dispatcher-runtime"))]
use async_std::net::{TcpListener, TcpStream};

use super::make_framed;
use super::AcceptStopHandle;
use crate::async_rt;
use crate::codec::FramedIo;
use crate::endpoint::{Endpoint, Host, Port};
use crate::task_handle::TaskHandle;
use crate::{PeerDropReason, ZmqResult};

use futures::{select, FutureExt};

#[cfg(feature = "tokio-runtime")]
use std::pin::Pin;
#[cfg(feature = "tokio-runtime")]
use std::sync::atomic::{AtomicUsize, Ordering};
#[cfg(feature = "tokio-runtime")]
use std::task::{Context, Poll};

#[cfg(feature = "tokio-runtime")]
const TCP_SOCKET_BUFFER_SIZE: usize = 4 * 1024 * 1024;

pub(crate) async fn connect(
    host: &Host,
    port: Port,
    options: Arc<crate::SocketOptions>,
) -> ZmqResult<(FramedIo, Endpoint)> {
    let raw_socket = TcpStream::connect((host.to_string().as_str(), port)).await?;
    // For some reason set_nodelay doesn't work on windows. See
    // https://github.com/zeromq/zmq.rs/issues/148 for details
    #[cfg(not(windows))]
    raw_socket.set_nodelay(true)?;
    tune_socket_buffers(&raw_socket);
    let peer_addr = raw_socket.peer_addr()?;

    Ok((
        make_framed(raw_socket, options),
        Endpoint::from_tcp_addr(peer_addr),
    ))
}

pub(crate) async fn begin_accept<T>(
    host: Host,
    port: Port,
    options: Arc<crate::SocketOptions>,
    cback: impl Fn(ZmqResult<(FramedIo, Endpoint)>) -> T + Send + 'static,
) -> ZmqResult<(Endpoint, AcceptStopHandle)>
where
    T: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind((host.to_string().as_str(), port)).await?;
    let resolved_addr = listener.local_addr()?;
    debug_assert_ne!(resolved_addr.port(), 0);
    let endpoint = Endpoint::Tcp(host, resolved_addr.port());
    begin_accept_bound(listener, endpoint, options, cback).await
}

pub(crate) async fn begin_accept_listener<T>(
    listener: std::net::TcpListener,
    options: Arc<crate::SocketOptions>,
    cback: impl Fn(ZmqResult<(FramedIo, Endpoint)>) -> T + Send + 'static,
) -> ZmqResult<(Endpoint, AcceptStopHandle)>
where
    T: std::future::Future<Output = ()> + Send + 'static,
{
    let resolved_addr = listener.local_addr()?;
    listener.set_nonblocking(true)?;

    #[cfg(feature = "tokio-runtime")]
    let listener = TcpListener::from_std(listener)?;
    #[cfg(any(feature = "async-std-runtime", feature = "async-dispatcher-runtime"))]
    let listener = TcpListener::from(listener);

    begin_accept_bound(
        listener,
        Endpoint::from_tcp_addr(resolved_addr),
        options,
        cback,
    )
    .await
}

async fn begin_accept_bound<T>(
    listener: TcpListener,
    endpoint: Endpoint,
    options: Arc<crate::SocketOptions>,
    cback: impl Fn(ZmqResult<(FramedIo, Endpoint)>) -> T + Send + 'static,
) -> ZmqResult<(Endpoint, AcceptStopHandle)>
where
    T: std::future::Future<Output = ()> + Send + 'static,
{
    let (stop_channel, stop_callback) = futures::channel::oneshot::channel::<()>();
    let task_handle = async_rt::task::spawn(async move {
        let mut stop_callback = stop_callback.fuse();
        #[cfg(feature = "tokio-runtime")]
        let open = Arc::new(AtomicUsize::new(0));
        loop {
            select! {
                incoming = listener.accept().fuse() => {
                    let incoming = match incoming {
                        Ok(accepted) => accepted,
                        Err(error) => {
                            // Out of file descriptors, say: report it, and pause so that a
                            // persistent failure cannot spin this loop.
                            options.peer_dropped(PeerDropReason::Io);
                            async_rt::task::spawn(cback(Err(error.into())));
                            async_rt::task::sleep(ACCEPT_ERROR_BACKOFF).await;
                            continue;
                        }
                    };
                    #[cfg(feature = "tokio-runtime")]
                    let incoming = {
                        let Some(slot) = ConnectionSlot::take(&open, options.max_connections) else {
                            // Counted before the peer can see the close.
                            options.peer_dropped(PeerDropReason::ConnectionLimit);
                            drop(incoming);
                            continue;
                        };
                        let (raw_socket, remote_addr) = incoming;
                        (Counted { stream: raw_socket, _slot: slot }, remote_addr)
                    };
                    let maybe_accepted: Result<_, _> = Ok(incoming)
                        .and_then(|(raw_socket, remote_addr)| {
                            raw_socket
                                .set_nodelay(true)
                                .map(|_| {
                                    tune_socket_buffers(&raw_socket);
                                    (raw_socket, remote_addr)
                                })
                        })
                        .map(|(raw_socket, remote_addr)| {
                            (
                                make_framed(raw_socket, Arc::clone(&options)),
                                Endpoint::from_tcp_addr(remote_addr),
                            )
                        })
                        .map_err(|err| err.into());
                    async_rt::task::spawn(cback(maybe_accepted));
                }
                _ = stop_callback => {
                    break
                }
            }
        }
        Ok(())
    });
    Ok((
        endpoint,
        AcceptStopHandle(TaskHandle::new(stop_channel, task_handle)),
    ))
}

/// Pause of the accept loop after a failed accept.
const ACCEPT_ERROR_BACKOFF: std::time::Duration = std::time::Duration::from_millis(50);

/// One of a listener's `max_connections` places, given back when dropped.
#[cfg(feature = "tokio-runtime")]
struct ConnectionSlot(Arc<AtomicUsize>);

#[cfg(feature = "tokio-runtime")]
impl ConnectionSlot {
    /// Takes a place if fewer than `max` are taken (always, when `max` is `None`).
    fn take(open: &Arc<AtomicUsize>, max: Option<usize>) -> Option<Self> {
        let max = max.unwrap_or(usize::MAX);
        open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .ok()?;
        Some(Self(Arc::clone(open)))
    }
}

#[cfg(feature = "tokio-runtime")]
impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An accepted stream that holds its listener's place until the connection
/// (both halves) is dropped.
#[cfg(feature = "tokio-runtime")]
struct Counted {
    stream: TcpStream,
    _slot: ConnectionSlot,
}

#[cfg(feature = "tokio-runtime")]
impl std::ops::Deref for Counted {
    type Target = TcpStream;

    fn deref(&self) -> &TcpStream {
        &self.stream
    }
}

#[cfg(feature = "tokio-runtime")]
impl tokio::io::AsyncRead for Counted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

#[cfg(feature = "tokio-runtime")]
impl tokio::io::AsyncWrite for Counted {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(feature = "tokio-runtime")]
fn tune_socket_buffers(raw_socket: &TcpStream) {
    let socket = socket2::SockRef::from(raw_socket);
    if let Err(error) = socket.set_recv_buffer_size(TCP_SOCKET_BUFFER_SIZE) {
        log::debug!("failed to set TCP receive buffer size: {error}");
    }
    if let Err(error) = socket.set_send_buffer_size(TCP_SOCKET_BUFFER_SIZE) {
        log::debug!("failed to set TCP send buffer size: {error}");
    }
}

#[cfg(not(feature = "tokio-runtime"))]
fn tune_socket_buffers(_raw_socket: &TcpStream) {}
