//! The LMCache protocol listener: the accept loop with its connection cap, and one task per
//! connection that reads requests in order, answers them in order (LMCache's client holds
//! one lock per connection and expects replies in request order) and never lets bad input
//! reach past its own connection.

use super::buffers::BodyPool;
use super::codec::{self, CodecError, Command, Reply, Request, REQUEST_HEADER_LEN};
use super::metrics::NodeMetrics;
use super::tiers::{Object, Tiers};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What every connection task shares.
pub(crate) struct ConnContext {
    pub(crate) tiers: Arc<Tiers>,
    pub(crate) metrics: Arc<NodeMetrics>,
    pub(crate) max_object_bytes: usize,
    pub(crate) read_timeout: Duration,
    pub(crate) max_list_bytes: usize,
    /// Where PUT bodies are read to.
    pub(crate) bodies: BodyPool,
}

/// Accepts until `shutdown`; a connection beyond `max_connections` is closed at once.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    ctx: Arc<ConnContext>,
    max_connections: usize,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) {
    let slots = Arc::new(Semaphore::new(max_connections));
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            ctx.metrics.connections_refused.inc();
            drop(stream);
            continue;
        };
        ctx.metrics.connections_total.inc();
        ctx.metrics.connections_open.inc();
        let (ctx, shutdown) = (Arc::clone(&ctx), shutdown.clone());
        tasks.spawn(async move {
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(%peer, "cannot set TCP_NODELAY: {e}");
            }
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = serve_connection(stream, &ctx) => {}
            }
            ctx.metrics.connections_open.dec();
            drop(permit);
        });
    }
}

/// Why a connection stops.
enum Stop {
    /// The peer closed between requests.
    Clean,
    /// Closed mid-request or on a write error (label for the metric).
    Aborted(&'static str),
    /// Bad input that breaks framing.
    Bad,
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` if the peer closed before the first byte.
async fn read_header(
    stream: &mut TcpStream,
    buf: &mut [u8; REQUEST_HEADER_LEN],
    timeout: Duration,
) -> Result<bool, Stop> {
    // Idle between requests is fine (LMCache keeps connections open); once the first byte
    // is in, the rest must come within `timeout`.
    let first = stream
        .read(&mut buf[..])
        .await
        .map_err(|_| Stop::Aborted("io"))?;
    if first == 0 {
        return Ok(false);
    }
    if first < REQUEST_HEADER_LEN {
        match tokio::time::timeout(timeout, stream.read_exact(&mut buf[first..])).await {
            Err(_) => return Err(Stop::Aborted("timeout")),
            Ok(Err(_)) => return Err(Stop::Aborted("eof")),
            Ok(Ok(_)) => {}
        }
    }
    Ok(true)
}

async fn serve_connection(mut stream: TcpStream, ctx: &ConnContext) {
    let mut header = [0u8; REQUEST_HEADER_LEN];
    let stop = loop {
        match read_header(&mut stream, &mut header, ctx.read_timeout).await {
            Ok(true) => {}
            Ok(false) => break Stop::Clean,
            Err(stop) => break stop,
        }
        debug_assert!(codec::request_complete(&header));
        let request = match codec::parse_request(&header, ctx.max_object_bytes) {
            Ok(r) => r,
            Err(e) => {
                ctx.metrics
                    .bad_requests
                    .with_label_values(&[e.reason()])
                    .inc();
                if let Err(stop) = refuse(&mut stream, &header, &e).await {
                    break stop;
                }
                continue;
            }
        };
        let started = Instant::now();
        let label = request.command.label();
        if let Err(stop) = handle(&mut stream, ctx, request).await {
            break stop;
        }
        ctx.metrics
            .request_seconds
            .with_label_values(&[label])
            .observe(started.elapsed().as_secs_f64());
    };
    match stop {
        Stop::Clean | Stop::Bad => {}
        Stop::Aborted(why) => ctx
            .metrics
            .connections_aborted
            .with_label_values(&[why])
            .inc(),
    }
}

/// Answers a bad header: a FAIL reply (unless the command was PUT, which LMCache reads no
/// reply for); the connection stays open only if framing is intact.
async fn refuse(
    stream: &mut TcpStream,
    header: &[u8; REQUEST_HEADER_LEN],
    err: &CodecError,
) -> Result<(), Stop> {
    tracing::debug!("bad request: {err}");
    let is_put = header[..4] == 1i32.to_le_bytes();
    if !is_put {
        write_reply(stream, &Reply::fail()).await?;
    }
    if err.framing_intact() && !is_put {
        Ok(())
    } else {
        let _ = stream.shutdown().await;
        Err(Stop::Bad)
    }
}

async fn write_reply(stream: &mut TcpStream, reply: &Reply) -> Result<(), Stop> {
    let raw = codec::encode_reply(reply).map_err(|_| Stop::Aborted("io"))?;
    stream
        .write_all(&raw)
        .await
        .map_err(|_| Stop::Aborted("io"))
}

fn count(ctx: &ConnContext, command: Command, outcome: &str) {
    ctx.metrics
        .requests
        .with_label_values(&[command.label(), outcome])
        .inc();
}

async fn handle(stream: &mut TcpStream, ctx: &ConnContext, req: Request) -> Result<(), Stop> {
    match req.command {
        Command::Put => {
            // Straight into the object's final buffer: no intermediate copies.
            let mut body = ctx.bodies.take(req.length);
            while !body.is_full() {
                match tokio::time::timeout(ctx.read_timeout, stream.read(body.unfilled())).await {
                    Err(_) => return Err(Stop::Aborted("timeout")),
                    Ok(Err(_)) => return Err(Stop::Aborted("io")),
                    Ok(Ok(0)) => return Err(Stop::Aborted("eof")),
                    Ok(Ok(n)) => body.advance(n),
                }
            }
            ctx.metrics.put_bytes.inc_by(req.length as u64);
            ctx.tiers
                .put(req.key, Object::raw(req.meta, body.freeze()))
                .await;
            count(ctx, Command::Put, "ok");
            Ok(())
        }
        Command::Get => match ctx.tiers.get(&req.key).await {
            Some((obj, pin)) => {
                count(ctx, Command::Get, "hit");
                let reply = Reply {
                    code: codec::CODE_SUCCESS,
                    length: obj.data.len(),
                    meta: obj.meta,
                };
                write_reply(stream, &reply).await?;
                stream
                    .write_all(&obj.data)
                    .await
                    .map_err(|_| Stop::Aborted("io"))?;
                ctx.metrics.get_bytes.inc_by(obj.data.len() as u64);
                drop(pin);
                Ok(())
            }
            None => {
                count(ctx, Command::Get, "miss");
                write_reply(stream, &Reply::fail()).await
            }
        },
        Command::Exist => {
            let hit = ctx.tiers.exists(&req.key);
            count(ctx, Command::Exist, if hit { "hit" } else { "miss" });
            let reply = if hit { Reply::success() } else { Reply::fail() };
            write_reply(stream, &reply).await
        }
        Command::List => {
            let body = ctx.tiers.list(ctx.max_list_bytes);
            count(ctx, Command::List, "ok");
            let reply = Reply {
                length: body.len(),
                ..Reply::success()
            };
            write_reply(stream, &reply).await?;
            stream
                .write_all(&body)
                .await
                .map_err(|_| Stop::Aborted("io"))
        }
        Command::Health => {
            count(ctx, Command::Health, "ok");
            write_reply(stream, &Reply::success()).await
        }
    }
}
