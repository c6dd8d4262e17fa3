//! `lm://` connections served on a thread each (`--lm-connection-model threads`, the
//! default), as LMCache's own server serves them: blocking reads and writes on the
//! connection's own OS thread, which the kernel schedules alone, so a reply being copied into
//! one socket never waits for another connection's turn on a shared runtime worker. The
//! requests themselves run the same loop as the runtime's tasks
//! ([`super::connection::serve_connection`]); the tiers are reached through the runtime's
//! handle.
//!
//! Owns the blocking socket and its timeouts; must not hold a tier lock across socket I/O (the
//! shared loop never does).

use super::connection::{serve_connection, ConnContext, LmIo, OpenConnection, Stop};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often a thread waiting for a connection's next request looks at the shutdown token.
const IDLE_POLL: Duration = Duration::from_millis(250);

/// A connection on a blocking socket, with the read timeout in force remembered.
struct Blocking {
    stream: TcpStream,
    shutdown: CancellationToken,
    timeout: Option<Duration>,
}

impl Blocking {
    fn set_timeout(&mut self, t: Duration) -> Result<(), Stop> {
        // A zero timeout means "none" to the socket: keep the smallest one it takes.
        let t = t.max(Duration::from_millis(1));
        if self.timeout != Some(t) {
            self.stream
                .set_read_timeout(Some(t))
                .map_err(|_| Stop::Aborted("io"))?;
            self.timeout = Some(t);
        }
        Ok(())
    }
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

impl LmIo for Blocking {
    async fn read_idle(&mut self, buf: &mut [u8]) -> Result<usize, Stop> {
        self.set_timeout(IDLE_POLL)?;
        loop {
            match self.stream.read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if timed_out(&e) => {
                    if self.shutdown.is_cancelled() {
                        return Ok(0);
                    }
                }
                Err(_) => return Err(Stop::Aborted("io")),
            }
        }
    }

    async fn read_within(&mut self, buf: &mut [u8], timeout: Duration) -> Result<usize, Stop> {
        self.set_timeout(timeout)?;
        loop {
            match self.stream.read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if timed_out(&e) => return Err(Stop::Aborted("timeout")),
                Err(_) => return Err(Stop::Aborted("io")),
            }
        }
    }

    async fn write_all(&mut self, buf: &[u8]) -> Result<(), Stop> {
        self.stream.write_all(buf).map_err(|e| {
            if timed_out(&e) {
                Stop::Aborted("timeout")
            } else {
                Stop::Aborted("io")
            }
        })
    }

    async fn close(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Write);
    }
}

/// Serves `stream` on a new thread until the peer leaves or `shutdown` (seen between
/// requests; a request in progress finishes or times out). A write that makes no progress
/// for the read timeout gives up, so a peer that stops reading cannot hold the thread.
/// `open` is dropped when the thread ends (or here, if it cannot start).
pub(crate) fn spawn(
    stream: tokio::net::TcpStream,
    ctx: Arc<ConnContext>,
    shutdown: CancellationToken,
    open: OpenConnection,
) -> std::io::Result<()> {
    let stream = stream.into_std()?;
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(ctx.read_timeout))?;
    let runtime = tokio::runtime::Handle::current();
    std::thread::Builder::new()
        .name("lm-connection".into())
        .spawn(move || {
            let mut io = Blocking {
                stream,
                shutdown,
                timeout: None,
            };
            runtime.block_on(serve_connection(&mut io, &ctx));
            drop(open);
        })?;
    Ok(())
}
