//! One `lm://` connection: the loop that reads its requests in order, answers them in order
//! (LMCache's client holds one lock per connection and expects replies in request order) and
//! never lets bad input reach past its own connection, over an I/O trait so that a runtime
//! task (`TcpStream`) and a thread of its own (`threads`) run the same loop.
//!
//! Owns the per-request work and its metrics; must not accept connections or know which
//! model runs it.

use super::buffers::BodyPool;
use crate::node::metrics::NodeMetrics;
use crate::node::model::codec::{
    self, CodecError, LmCommand, LmReply, LmRequest, REQUEST_HEADER_LEN,
};
use crate::node::tiers::{Object, TieredStore};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::task::task_tracker::TaskTrackerToken;

/// What every connection task shares.
pub(crate) struct ConnContext {
    pub(crate) tiers: Arc<TieredStore>,
    pub(crate) metrics: Arc<NodeMetrics>,
    pub(crate) max_object_bytes: usize,
    pub(crate) read_timeout: Duration,
    pub(crate) max_list_bytes: usize,
    /// Where PUT bodies are read to.
    pub(crate) bodies: BodyPool,
}

/// A connection being served: holds its slot under the cap and keeps the node's shutdown
/// waiting; counted in `connections_open` until dropped.
pub(crate) struct OpenConnection {
    ctx: Arc<ConnContext>,
    _permit: OwnedSemaphorePermit,
    _tracked: TaskTrackerToken,
}

impl OpenConnection {
    /// Counts the connection open until the value is dropped.
    pub(crate) fn new(
        ctx: Arc<ConnContext>,
        permit: OwnedSemaphorePermit,
        tracked: TaskTrackerToken,
    ) -> Self {
        OpenConnection {
            ctx,
            _permit: permit,
            _tracked: tracked,
        }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.ctx.metrics.connections_open.dec();
    }
}

/// Why a connection stops.
pub(crate) enum Stop {
    /// The peer closed between requests.
    Clean,
    /// Closed mid-request or on a write error (label for the metric).
    Aborted(&'static str),
    /// Bad input that breaks framing.
    Bad,
}

/// How a connection's bytes travel: a runtime task on a tokio socket ([`TcpStream`]), or a
/// thread of its own on a blocking socket (`threads`). The connection loop below is
/// the same for both.
pub(crate) trait LmIo {
    /// Reads what the peer sends next, waiting as long as it takes (idle between requests
    /// is fine: LMCache keeps connections open). `Ok(0)`: the peer closed.
    async fn read_idle(&mut self, buf: &mut [u8]) -> Result<usize, Stop>;
    /// One read, given up after `timeout` (`Stop::Aborted("timeout")`).
    async fn read_within(&mut self, buf: &mut [u8], timeout: Duration) -> Result<usize, Stop>;
    /// Writes all of `buf`.
    async fn write_all(&mut self, buf: &[u8]) -> Result<(), Stop>;
    /// Closes the sending side (after a refusal that broke framing).
    async fn close(&mut self);
}

impl LmIo for TcpStream {
    async fn read_idle(&mut self, buf: &mut [u8]) -> Result<usize, Stop> {
        self.read(buf).await.map_err(|_| Stop::Aborted("io"))
    }

    async fn read_within(&mut self, buf: &mut [u8], timeout: Duration) -> Result<usize, Stop> {
        match tokio::time::timeout(timeout, self.read(buf)).await {
            Err(_) => Err(Stop::Aborted("timeout")),
            Ok(Err(_)) => Err(Stop::Aborted("io")),
            Ok(Ok(n)) => Ok(n),
        }
    }

    async fn write_all(&mut self, buf: &[u8]) -> Result<(), Stop> {
        AsyncWriteExt::write_all(self, buf)
            .await
            .map_err(|_| Stop::Aborted("io"))
    }

    async fn close(&mut self) {
        let _ = self.shutdown().await;
    }
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` if the peer closed before the first byte.
async fn read_header(
    io: &mut impl LmIo,
    buf: &mut [u8; REQUEST_HEADER_LEN],
    timeout: Duration,
) -> Result<bool, Stop> {
    // Idle between requests is fine (LMCache keeps connections open); once the first byte
    // is in, the rest must come within `timeout`.
    let mut filled = io.read_idle(&mut buf[..]).await?;
    if filled == 0 {
        return Ok(false);
    }
    let deadline = Instant::now() + timeout;
    while filled < REQUEST_HEADER_LEN {
        let left = deadline.saturating_duration_since(Instant::now());
        match io.read_within(&mut buf[filled..], left).await? {
            0 => return Err(Stop::Aborted("eof")),
            n => filled += n,
        }
    }
    Ok(true)
}

/// Serves one connection's requests in order until the peer closes or breaks framing.
pub(crate) async fn serve_connection(io: &mut impl LmIo, ctx: &ConnContext) {
    let mut header = [0u8; REQUEST_HEADER_LEN];
    let stop = loop {
        match read_header(io, &mut header, ctx.read_timeout).await {
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
                if let Err(stop) = refuse(io, &header, &e).await {
                    break stop;
                }
                continue;
            }
        };
        let started = Instant::now();
        let label = request.command.label();
        if let Err(stop) = handle(io, ctx, request).await {
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
    io: &mut impl LmIo,
    header: &[u8; REQUEST_HEADER_LEN],
    err: &CodecError,
) -> Result<(), Stop> {
    tracing::debug!("bad request: {err}");
    let is_put = header[..4] == 1i32.to_le_bytes();
    if !is_put {
        write_reply(io, &LmReply::fail()).await?;
    }
    if err.framing_intact() && !is_put {
        Ok(())
    } else {
        io.close().await;
        Err(Stop::Bad)
    }
}

async fn write_reply(io: &mut impl LmIo, reply: &LmReply) -> Result<(), Stop> {
    let raw = codec::encode_reply(reply).map_err(|_| Stop::Aborted("io"))?;
    io.write_all(&raw).await
}

fn count(ctx: &ConnContext, command: LmCommand, outcome: &str) {
    ctx.metrics
        .requests
        .with_label_values(&[command.label(), outcome])
        .inc();
}

async fn handle(io: &mut impl LmIo, ctx: &ConnContext, req: LmRequest) -> Result<(), Stop> {
    match req.command {
        LmCommand::Put => {
            // Straight into the object's final buffer: no intermediate copies.
            let mut body = ctx.bodies.take(req.length);
            while !body.is_full() {
                match io.read_within(body.unfilled(), ctx.read_timeout).await? {
                    0 => return Err(Stop::Aborted("eof")),
                    n => body.advance(n),
                }
            }
            ctx.metrics.put_bytes.inc_by(req.length as u64);
            ctx.tiers
                .put(req.key, Object::raw(req.meta, body.freeze()))
                .await;
            count(ctx, LmCommand::Put, "ok");
            Ok(())
        }
        LmCommand::Get => match ctx.tiers.get(&req.key).await {
            Some((obj, pin)) => {
                count(ctx, LmCommand::Get, "hit");
                let reply = LmReply {
                    code: codec::CODE_SUCCESS,
                    length: obj.data.len(),
                    meta: obj.meta,
                };
                write_reply(io, &reply).await?;
                io.write_all(&obj.data).await?;
                ctx.metrics.get_bytes.inc_by(obj.data.len() as u64);
                drop(pin);
                Ok(())
            }
            None => {
                count(ctx, LmCommand::Get, "miss");
                write_reply(io, &LmReply::fail()).await
            }
        },
        LmCommand::Exist => {
            let hit = ctx.tiers.exists(&req.key);
            count(ctx, LmCommand::Exist, if hit { "hit" } else { "miss" });
            let reply = if hit {
                LmReply::success()
            } else {
                LmReply::fail()
            };
            write_reply(io, &reply).await
        }
        LmCommand::List => {
            let body = ctx.tiers.list(ctx.max_list_bytes);
            count(ctx, LmCommand::List, "ok");
            let reply = LmReply {
                length: body.len(),
                ..LmReply::success()
            };
            write_reply(io, &reply).await?;
            io.write_all(&body).await
        }
        LmCommand::Health => {
            count(ctx, LmCommand::Health, "ok");
            write_reply(io, &LmReply::success()).await
        }
    }
}
