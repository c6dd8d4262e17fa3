//! The worker's side of the controller's sockets, message level: the PUSH and control DEALER
//! pair ([`Uplink`]), the pool of DEALERs for P2P lookups ([`LookupPool`]), registration,
//! and the advertised ip.
//!
//! Every request is bounded by `request_timeout` (the transport rebuilds a socket after any
//! failure); replies are decoded here, and an `ErrorMsg` becomes
//! [`WorkerError::Controller`].

use super::state::Ctx;
use super::WorkerError;
use crate::protocol::{decode, encode, DeRegisterMsg, Msg, RegisterMsg};
use crate::transport::{DealerClient, PushSender, TransportError};
use bytes::Bytes;
use parking_lot::Mutex;
use std::time::Duration;
use tokio::sync::Semaphore;

/// LMCache's push loop puts at most 50 messages in one multipart.
const FRAMES_PER_MULTIPART: usize = 50;

/// Maps a transport failure to the worker's error.
pub(crate) fn transport_error(error: TransportError, timeout: Duration) -> WorkerError {
    match error {
        TransportError::Timeout => WorkerError::Timeout(timeout),
        other => WorkerError::Transport(other),
    }
}

/// Sends one request on `client` and decodes the reply; `ErrorMsg` is an error.
pub(crate) async fn call(
    client: &mut DealerClient,
    msg: &Msg,
    timeout: Duration,
) -> Result<Msg, WorkerError> {
    let bytes = client
        .request(Bytes::from(encode(msg)))
        .await
        .map_err(|e| transport_error(e, timeout))?;
    match decode(&bytes)? {
        Msg::ErrorMsg(e) => Err(WorkerError::Controller(e.error)),
        reply => Ok(reply),
    }
}

/// The PUSH socket and the control DEALER (registration, full-sync start and status). Owned
/// by one task at a time, so that full-sync batches and replayed ops share one connection
/// and stay in order.
pub(crate) struct Uplink {
    pub push: PushSender,
    pub control: DealerClient,
}

impl Uplink {
    /// Fresh sockets (they connect on first use).
    pub(super) fn new(ctx: &Ctx) -> Self {
        Uplink {
            push: PushSender::new(ctx.config.controller_pull.clone()),
            control: DealerClient::new(
                ctx.config.controller_reply.clone(),
                ctx.config.request_timeout,
            ),
        }
    }

    /// Pushes `msgs`, at most 50 frames per multipart, each send bounded by the request
    /// timeout. Stops at the first failure and returns how many messages were handed to the
    /// socket with the error.
    pub(super) async fn push(
        &mut self,
        ctx: &Ctx,
        msgs: &[Msg],
    ) -> Result<(), (usize, WorkerError)> {
        let mut sent = 0;
        for chunk in msgs.chunks(FRAMES_PER_MULTIPART) {
            let frames = chunk.iter().map(|m| Bytes::from(encode(m))).collect();
            let timeout = ctx.config.request_timeout;
            self.push
                .send(frames, timeout)
                .await
                .map_err(|e| (sent, transport_error(e, timeout)))?;
            sent += chunk.len();
        }
        Ok(())
    }

    /// A request on the control DEALER.
    pub(super) async fn call(&mut self, ctx: &Ctx, msg: &Msg) -> Result<Msg, WorkerError> {
        call(&mut self.control, msg, ctx.config.request_timeout).await
    }

    /// Sends one `RegisterMsg` and returns the heartbeat endpoint: the controller's
    /// `heartbeat_url`, or the reply socket when it has none (both controllers accept
    /// `HeartbeatMsg` there).
    pub(super) async fn register(&mut self, ctx: &Ctx) -> Result<String, WorkerError> {
        let c = &ctx.config;
        let msg = Msg::RegisterMsg(RegisterMsg {
            instance_id: c.instance_id.clone(),
            worker_id: c.worker_id,
            ip: ctx.ip.clone(),
            port: i64::from(ctx.port),
            peer_init_url: c.peer_init_url.clone(),
            distributed_url: None,
        });
        match self.call(ctx, &msg).await? {
            Msg::RegisterRetMsg(r) => Ok(r
                .extra_config
                .get("heartbeat_url")
                .filter(|u| !u.is_empty())
                .cloned()
                .unwrap_or_else(|| c.controller_reply.clone())),
            other => Err(WorkerError::UnexpectedReply(other.tag().to_owned())),
        }
    }

    /// Pushes `DeRegisterMsg`.
    pub(super) async fn deregister(&mut self, ctx: &Ctx) -> Result<(), WorkerError> {
        let c = &ctx.config;
        let msg = Msg::DeRegisterMsg(DeRegisterMsg {
            instance_id: c.instance_id.clone(),
            worker_id: c.worker_id,
            ip: ctx.ip.clone(),
            port: i64::from(ctx.port),
        });
        self.push(ctx, &[msg]).await.map_err(|(_, e)| e)
    }
}

/// DEALER connections for P2P lookups: one request per connection at a time (LMCache
/// correlates replies by order), at most `max_concurrent_lookups` in flight, connections kept
/// for reuse until one fails (then every idle one is dropped: after a controller restart they
/// would all fail once).
pub(crate) struct LookupPool {
    endpoint: String,
    timeout: Duration,
    idle: Mutex<Vec<DealerClient>>,
    permits: Semaphore,
}

impl LookupPool {
    /// A pool for the controller's reply socket.
    pub(super) fn new(endpoint: String, timeout: Duration, max: usize) -> Self {
        LookupPool {
            endpoint,
            timeout,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(max),
        }
    }

    /// One request; waiting for a free connection counts against the timeout.
    pub(super) async fn call(&self, msg: &Msg) -> Result<Msg, WorkerError> {
        let started = tokio::time::Instant::now();
        let permit = tokio::time::timeout(self.timeout, self.permits.acquire())
            .await
            .map_err(|_| WorkerError::Timeout(self.timeout))?
            .map_err(|_| WorkerError::Closed)?;
        let mut client = self
            .idle
            .lock()
            .pop()
            .unwrap_or_else(|| DealerClient::new(self.endpoint.clone(), self.timeout));
        let left = self.timeout.saturating_sub(started.elapsed());
        let result = match tokio::time::timeout(left, call(&mut client, msg, self.timeout)).await {
            Ok(r) => r,
            Err(_) => {
                // Cancelled mid-request: the client dropped its socket, a fresh one follows.
                Err(WorkerError::Timeout(self.timeout))
            }
        };
        if matches!(
            result,
            Err(WorkerError::Timeout(_) | WorkerError::Transport(_))
        ) {
            // The controller is gone or restarted: the idle connections are stale too.
            self.idle.lock().clear();
        } else {
            self.idle.lock().push(client);
        }
        drop(permit);
        result
    }
}

/// The local ip of the route to `endpoint` (`host:port`), as LMCache's `get_ip()` does for
/// its default route; `127.0.0.1` when the controller is on loopback or the route is unknown.
/// Sends no packet.
pub(crate) async fn route_ip(endpoint: &str, timeout: Duration) -> String {
    let target = endpoint.strip_prefix("tcp://").unwrap_or(endpoint);
    let resolved = match tokio::time::timeout(timeout, tokio::net::lookup_host(target)).await {
        Ok(Ok(mut addrs)) => addrs.next(),
        _ => None,
    };
    let Some(peer) = resolved else {
        tracing::warn!(
            "cannot resolve the controller address {endpoint}: registering 127.0.0.1 \
             (set WorkerConfig::advertise_ip if the controller runs elsewhere)"
        );
        return "127.0.0.1".to_owned();
    };
    if peer.ip().is_loopback() || peer.ip().is_unspecified() {
        return "127.0.0.1".to_owned();
    }
    match crate::net::route_source(peer.ip()) {
        Some(ip) => ip.to_string(),
        None => "127.0.0.1".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn loopback_controllers_get_loopback() {
        let t = Duration::from_secs(5);
        assert_eq!(route_ip("127.0.0.1:8400", t).await, "127.0.0.1");
        assert_eq!(route_ip("tcp://localhost:8400", t).await, "127.0.0.1");
        assert_eq!(route_ip("no port here", t).await, "127.0.0.1");
    }
}
