//! The heartbeat task: `HeartbeatMsg` on its own DEALER to the controller's `heartbeat_url`
//! (or the reply socket when the controller gave none), every `heartbeat_interval` after
//! `heartbeat_delay`, plus one at once whenever another part of the worker saw a request fail
//! (a *probe*: after a controller restart, the first request on an old connection fails and
//! the controller learns of the worker again from its next heartbeat).
//!
//! It starts after the first registration. The `full_sync` commands of each reply go to the
//! engine, in order. A heartbeat that fails is retried with backoff (capped at the interval)
//! until one is answered, also when periodic heartbeats are off.

use super::state::{inc, Ctx};
use super::uplink::call;
use super::WorkerError;
use crate::protocol::{HeartbeatCommand, HeartbeatMsg, Msg};
use crate::transport::DealerClient;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What a heartbeat reply asks of the engine.
#[derive(Debug)]
pub(crate) enum Event {
    /// A `full_sync` command, with the controller's reason.
    FullSync { reason: Option<String> },
}

/// Sleeps until `at`, forever when `None`.
pub(crate) async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Runs until `cancel`. `registered` carries the heartbeat endpoint once registered.
pub(crate) async fn run(
    ctx: Arc<Ctx>,
    mut registered: watch::Receiver<Option<String>>,
    events: mpsc::UnboundedSender<Event>,
    cancel: CancellationToken,
) {
    let c = &ctx.config;
    let timeout = c.request_timeout;
    let mut endpoint = loop {
        if let Some(endpoint) = registered.borrow_and_update().clone() {
            break endpoint;
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            changed = registered.changed() => if changed.is_err() { return },
        }
    };
    let mut client = DealerClient::new(endpoint.clone(), timeout);
    let interval = c.heartbeat_interval;
    let mut next = interval.map(|_| Instant::now() + c.heartbeat_delay);
    let mut failures = 0u32;
    let msg = Msg::HeartbeatMsg(HeartbeatMsg {
        instance_id: c.instance_id.clone(),
        worker_id: c.worker_id,
        ip: ctx.ip.clone(),
        port: i64::from(ctx.port),
        peer_init_url: c.peer_init_url.clone(),
        distributed_url: None,
    });
    loop {
        tokio::select! {
            biased;
            () = cancel.cancelled() => return,
            changed = registered.changed() => {
                if changed.is_err() {
                    return;
                }
                let latest = registered.borrow_and_update().clone();
                if let Some(latest) = latest.filter(|e| *e != endpoint) {
                    tracing::info!(endpoint = %latest, "heartbeat endpoint changed");
                    endpoint = latest;
                    client = DealerClient::new(endpoint.clone(), timeout);
                }
                continue;
            }
            () = ctx.probe.notified() => {}
            () = sleep_until_opt(next) => {}
        }
        let reply = tokio::select! {
            () = cancel.cancelled() => return,
            reply = call(&mut client, &msg, timeout) => reply,
        };
        let answered = match reply {
            Ok(Msg::HeartbeatRetMsg(r)) => {
                for command in r.commands {
                    match command {
                        HeartbeatCommand::FullSync(f) => {
                            tracing::info!(reason = ?f.reason, "controller asks for a full sync");
                            if events.send(Event::FullSync { reason: f.reason }).is_err() {
                                return;
                            }
                        }
                        HeartbeatCommand::Base(_) => {
                            tracing::debug!("ignoring a base HeartbeatCommand");
                        }
                    }
                }
                true
            }
            Ok(other) => {
                tracing::warn!("unexpected heartbeat reply {}", other.tag());
                true
            }
            // The controller is there but refused or garbled the answer (an unknown command
            // type makes LMCache's own worker treat the reply as empty, too).
            Err(e @ (WorkerError::Controller(_) | WorkerError::Decode(_))) => {
                tracing::warn!("heartbeat answered with an error: {e}");
                true
            }
            Err(e) => {
                failures += 1;
                inc(&ctx.stats.heartbeats_failed);
                if failures == 1 || failures.is_multiple_of(10) {
                    tracing::warn!(failures, "heartbeat to {endpoint} failed: {e}");
                }
                false
            }
        };
        let now = Instant::now();
        next = if answered {
            if failures > 0 {
                tracing::info!(failures, "heartbeat answered again");
            }
            failures = 0;
            inc(&ctx.stats.heartbeats_ok);
            interval.map(|i| now + i)
        } else {
            let cap = interval.unwrap_or(c.retry_backoff.max);
            Some(now + c.retry_backoff.delay(failures).min(cap))
        };
    }
}
