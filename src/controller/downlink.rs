//! One downlink per registered worker: a task that owns a REQ socket to the worker's REP
//! port and runs the controller's commands on it one at a time.
//!
//! LMCache shares one REQ socket between concurrent HTTP handlers (breaking REQ's strict
//! send/recv alternation) and waits forever for a dead worker. Here every command is queued
//! to the worker's task, carries a deadline, and fails with [`DownlinkError::Timeout`] when
//! the worker does not answer in time; the transport then rebuilds the socket.

use super::metrics::Metrics;
use crate::cluster::Fence;
use crate::protocol::{decode, encode, DecodeError, Msg};
use crate::transport::{ReqClient, TransportError};
use bytes::Bytes;
use std::time::Duration;
use thiserror::Error;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Commands waiting for one worker beyond this are refused at once with `Busy`.
const QUEUE_DEPTH: usize = 64;

/// Why a downlink command produced no answer.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum DownlinkError {
    /// The worker did not answer within the downlink timeout.
    #[error("worker did not answer within {0:?}")]
    Timeout(Duration),
    /// The socket failed (connection refused, reset, …).
    #[error("downlink transport error: {0}")]
    Transport(String),
    /// The worker answered with bytes that are not a message.
    #[error("worker sent an undecodable reply: {0}")]
    Decode(#[from] DecodeError),
    /// Too many commands are already queued for this worker.
    #[error("too many commands queued for this worker")]
    Busy,
    /// The worker was removed while the command waited.
    #[error("worker was removed")]
    Closed,
}

struct Job {
    msg: Msg,
    deadline: Instant,
    reply: oneshot::Sender<Result<Msg, DownlinkError>>,
}

/// Handle to one worker's downlink task. Dropping every handle ends the task and closes the
/// socket.
#[derive(Clone, Debug)]
pub struct Downlink {
    tx: mpsc::Sender<Job>,
    timeout: Duration,
    endpoint: String,
    /// A cluster leader's fence: no command goes out once the lease may have lapsed.
    fence: Option<Fence>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.msg.tag())
    }
}

impl Downlink {
    /// Starts the downlink task for the worker at `endpoint` (`host:port`, no scheme) on
    /// `tasks`. The socket is connected lazily, on the first command. The task ends when
    /// every handle is dropped or `shutdown` fires.
    pub fn spawn(
        endpoint: String,
        timeout: Duration,
        metrics: Metrics,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        let client = ReqClient::new(endpoint.clone(), timeout);
        tasks.spawn(async move {
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = run(client, rx, metrics) => {}
            }
        });
        Downlink {
            tx,
            timeout,
            endpoint,
            fence: None,
        }
    }

    /// Sends nothing unless `fence` is open (a cluster's leader: see `crate::cluster::Fence`).
    #[must_use]
    pub fn with_fence(mut self, fence: Option<Fence>) -> Self {
        self.fence = fence;
        self
    }

    /// The `host:port` this downlink dials.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Sends one command and waits for the worker's answer, at most the downlink timeout
    /// (plus a small margin for queueing).
    ///
    /// # Errors
    /// [`DownlinkError`] (a closed fence is a transport error that names it); an `ErrorMsg`
    /// from the worker is an `Ok` answer for the caller to interpret.
    pub async fn request(&self, msg: Msg) -> Result<Msg, DownlinkError> {
        if let Some(fence) = &self.fence {
            fence
                .check()
                .map_err(|e| DownlinkError::Transport(e.to_string()))?;
        }
        let (reply, rx) = oneshot::channel();
        let deadline = Instant::now() + self.timeout;
        self.tx
            .try_send(Job {
                msg,
                deadline,
                reply,
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => DownlinkError::Busy,
                mpsc::error::TrySendError::Closed(_) => DownlinkError::Closed,
            })?;
        let bound = self.timeout + Duration::from_millis(250);
        match tokio::time::timeout(bound, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(DownlinkError::Closed),
            Err(_) => Err(DownlinkError::Timeout(self.timeout)),
        }
    }
}

async fn run(mut client: ReqClient, mut rx: mpsc::Receiver<Job>, metrics: Metrics) {
    while let Some(job) = rx.recv().await {
        let command = job.msg.tag();
        let left = job.deadline.saturating_duration_since(Instant::now());
        let started = Instant::now();
        let result = if left.is_zero() {
            Err(DownlinkError::Timeout(Duration::ZERO))
        } else {
            let payload = Bytes::from(encode(&job.msg));
            match tokio::time::timeout(left, client.request(payload)).await {
                Ok(Ok(bytes)) => decode(&bytes).map_err(DownlinkError::from),
                Ok(Err(TransportError::Timeout)) | Err(_) => {
                    // The REQ socket may be mid-request: make sure the next command gets a
                    // fresh one.
                    client.reset();
                    Err(DownlinkError::Timeout(left))
                }
                Ok(Err(e)) => Err(DownlinkError::Transport(e.to_string())),
            }
        };
        let outcome = match &result {
            Ok(_) => "ok",
            Err(DownlinkError::Timeout(_)) => "timeout",
            Err(_) => "error",
        };
        metrics
            .downlink_requests
            .with_label_values(&[command, outcome])
            .inc();
        metrics
            .downlink_seconds
            .with_label_values(&[command])
            .observe(started.elapsed().as_secs_f64());
        // The caller may have given up; that is fine.
        let _ = job.reply.send(result);
    }
}
