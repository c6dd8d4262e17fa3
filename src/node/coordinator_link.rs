//! The node as a coordinator's MP server (`--coordinator-url`): it registers
//! (`POST /instances`, the body LMCache 0.5.6's registrar sends), heartbeats
//! (`PUT /instances/{id}/heartbeat`; a 404 means the coordinator forgot it, and it registers
//! again at once), posts its L1 and L2 stores, deletes and reads (accesses) as 0.5.6
//! cache-event batches
//! (`POST /events`, per-batch sequence numbers under one incarnation), and deregisters
//! (`DELETE /instances/{id}`) when it stops.
//!
//! The data path only ever touches [`EventQueue`]: the tiers call it under their locks, it
//! pushes onto a bounded queue (full: the event is dropped and counted; the coordinator sees
//! the sequence gap). One background task does every call, each bounded by the link's timeout;
//! a failed post keeps its batches (same sequence numbers, which the coordinator deduplicates)
//! and retries them on the next flush.

use super::config::{CoordinatorLinkConfig, NodeConfig};
use super::metrics::NodeMetrics;
use super::model::keys::{encode, EncodedKey};
use super::tiers::{TierId, TierObserver};
use crate::web::client::{self, Reply};
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

/// The L2 backend name in event batches (LMCache's local file-system adapter is `fs`).
pub(crate) const L2_BACKEND: &str = "fs";
/// The L1 backend name (LMCache's `dram`), in capacity declarations and L1 events.
const L1_BACKEND: &str = "dram";
/// Every call to the coordinator, as `kvplane-node`.
const COORDINATOR: client::Caller = client::Caller("kvplane-node");

/// What happened to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CacheEventKind {
    Store,
    Delete,
    Access,
}

#[derive(Debug, Clone, PartialEq)]
struct CacheEvent {
    tier: TierId,
    kind: CacheEventKind,
    key: EncodedKey,
    bytes: u64,
}

/// The bounded queue between the tiers and the link task.
pub(crate) struct EventQueue {
    queue: Mutex<VecDeque<CacheEvent>>,
    capacity: usize,
    metrics: Arc<NodeMetrics>,
}

impl EventQueue {
    pub(crate) fn new(capacity: usize, metrics: Arc<NodeMetrics>) -> Self {
        EventQueue {
            queue: Mutex::new(VecDeque::new()),
            capacity: capacity.max(1),
            metrics,
        }
    }

    fn count(&self, outcome: &str) {
        self.metrics
            .reports
            .with_label_values(&["coordinator", outcome])
            .inc();
    }

    /// Up to `max` queued events, oldest first.
    fn take(&self, max: usize) -> Vec<CacheEvent> {
        let mut q = self.queue.lock();
        let n = q.len().min(max);
        q.drain(..n).collect()
    }
}

impl EventQueue {
    fn push(&self, tier: TierId, kind: CacheEventKind, key: &str, bytes: u64) {
        let Some(key) = encode(key) else {
            self.count("unreportable_key");
            return;
        };
        let mut q = self.queue.lock();
        if q.len() >= self.capacity {
            drop(q);
            self.count("dropped");
            return;
        }
        q.push_back(CacheEvent {
            tier,
            kind,
            key,
            bytes,
        });
        drop(q);
        self.count("queued");
    }
}

impl TierObserver for EventQueue {
    fn changed(&self, tier: TierId, key: &str, bytes: u64, admitted: bool) {
        let kind = if admitted {
            CacheEventKind::Store
        } else {
            CacheEventKind::Delete
        };
        self.push(tier, kind, key, bytes);
    }

    fn accessed(&self, tier: TierId, key: &str) {
        self.push(tier, CacheEventKind::Access, key, 0);
    }
}

/// What the link needs from the node.
struct LinkContext {
    pub(crate) config: CoordinatorLinkConfig,
    pub(crate) events: Arc<EventQueue>,
    pub(crate) metrics: Arc<NodeMetrics>,
    /// The node's HTTP port, registered for the coordinator's calls back.
    pub(crate) http_port: u16,
    /// L1 and L2 budgets, declared in `config` batches after each registration.
    pub(crate) capacity: (u64, Option<u64>),
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

struct Link {
    ctx: LinkContext,
    ip: String,
    /// Unix milliseconds at start: later than any earlier run's, so the coordinator fences
    /// the old run's state (LMCache uses whole seconds, which two quick restarts share).
    incarnation: u64,
    seq: u64,
    capacity_revision: u64,
    /// Batches numbered but not yet accepted, retried in order.
    unsent: Vec<Value>,
    registered: bool,
}

impl Link {
    async fn call(
        &self,
        what: &str,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Option<Reply> {
        let c = &self.ctx.config;
        let bytes = body.map(|b| serde_json::to_vec(b).unwrap_or_default());
        let out = COORDINATOR
            .call(&c.host, c.port, method, path, bytes.as_deref(), c.timeout)
            .await;
        let outcome = match &out {
            Ok(r) if (200..300).contains(&r.status) => "ok",
            Ok(r) if r.status == 404 => "not_found",
            Ok(r) => {
                tracing::warn!(what, status = r.status, "coordinator refused a call");
                "error"
            }
            Err(e) => {
                tracing::debug!(what, "coordinator call failed: {e}");
                "error"
            }
        };
        self.ctx
            .metrics
            .coordinator_calls
            .with_label_values(&[what, outcome])
            .inc();
        out.ok()
    }

    fn batch(&mut self, kind: &str, tier: &str, backend: &str, entries: Vec<Value>) -> Value {
        self.seq += 1;
        json!({
            "instance_id": self.ctx.config.instance_id,
            "incarnation": self.incarnation,
            "seq": self.seq,
            "event_type": kind,
            "tier": tier,
            "backend": backend,
            "entries": entries,
            "shared": false,
            "ts": unix_now(),
        })
    }

    /// A `store`, `delete` or `access` batch of one tier: L1 as `l1`/`dram` (an access:
    /// backend `""`, as 0.5.6 sends it), L2 as `l2`/`fs`.
    fn run_batch(&mut self, (tier, kind): (TierId, CacheEventKind), entries: Vec<Value>) -> Value {
        let name = match kind {
            CacheEventKind::Store => "store",
            CacheEventKind::Delete => "delete",
            CacheEventKind::Access => "access",
        };
        match (tier, kind) {
            (TierId::L1, CacheEventKind::Access) => self.batch(name, "l1", "", entries),
            (TierId::L1, _) => self.batch(name, "l1", L1_BACKEND, entries),
            (TierId::L2, _) => self.batch(name, "l2", L2_BACKEND, entries),
        }
    }

    async fn register(&mut self) {
        let body = json!({
            "instance_id": self.ctx.config.instance_id,
            "ip": self.ip,
            "http_port": self.ctx.http_port,
            "metadata": {},
            "p2p_advertised_url": "",
            "mq_port": 0,
        });
        let ok = self
            .call("register", "POST", "/instances", Some(&body))
            .await
            .is_some_and(|r| (200..300).contains(&r.status));
        if ok && !self.registered {
            tracing::info!(id = %self.ctx.config.instance_id, "registered with the coordinator");
        }
        self.registered = ok;
        if ok && self.ctx.config.event_reporting {
            // As 0.5.6 does after every (re-)registration: declare the tiers' capacities.
            self.capacity_revision += 1;
            let (l1, l2) = self.ctx.capacity;
            let rev = self.capacity_revision;
            let declare = |this: &mut Link, tier: &str, backend: &str, bytes: u64| {
                let mut b = this.batch("config", tier, backend, Vec::new());
                b["capacity_bytes"] = json!(bytes);
                b["capacity_revision"] = json!(rev);
                this.unsent.push(b);
            };
            declare(self, "l1", L1_BACKEND, l1);
            if let Some(l2) = l2 {
                declare(self, "l2", L2_BACKEND, l2);
            }
        }
    }

    async fn heartbeat(&mut self) {
        if !self.registered {
            self.register().await;
            return;
        }
        let path = format!("/instances/{}/heartbeat", self.ctx.config.instance_id);
        match self.call("heartbeat", "PUT", &path, None).await {
            Some(r) if r.status == 404 => {
                // The coordinator restarted or timed us out: register again now (0.5.6 waits
                // one more interval).
                self.registered = false;
                self.register().await;
            }
            _ => {}
        }
    }

    /// Numbers the queued events into batches (runs of one type, at most
    /// `max_batch_entries` each) and posts them with any unsent ones.
    async fn flush(&mut self) {
        let max = self.ctx.config.max_batch_entries.max(1);
        // Keep what is unsent bounded by the queue's own bound.
        let room = self
            .ctx
            .config
            .max_queued_events
            .saturating_sub(self.unsent.len() * max);
        let events = self.ctx.events.take(room);
        let mut run: Vec<Value> = Vec::new();
        let mut run_of = None;
        for e in events {
            if run_of != Some((e.tier, e.kind)) || run.len() >= max {
                if let Some(of) = run_of {
                    let b = self.run_batch(of, std::mem::take(&mut run));
                    self.unsent.push(b);
                }
                run_of = Some((e.tier, e.kind));
            }
            run.push(json!({
                "key": e.key,
                "size_bytes": if e.kind == CacheEventKind::Store { e.bytes } else { 0 },
                "token_ids": [],
                "token_offset": -1,
            }));
        }
        if let Some(of) = run_of {
            let b = self.run_batch(of, run);
            self.unsent.push(b);
        }
        while !self.unsent.is_empty() {
            // At most 100 batches per request, as the coordinator bounds request sizes.
            let n = self.unsent.len().min(100);
            let body = json!({ "batches": &self.unsent[..n] });
            match self.call("events", "POST", "/events", Some(&body)).await {
                Some(r) if (200..300).contains(&r.status) => {
                    self.unsent.drain(..n);
                }
                Some(r) if (400..500).contains(&r.status) && r.status != 404 && r.status != 408 => {
                    // Refused as invalid: retrying cannot help.
                    tracing::warn!(
                        status = r.status,
                        body = %String::from_utf8_lossy(&r.body),
                        "coordinator refused event batches; dropped"
                    );
                    self.ctx
                        .metrics
                        .reports
                        .with_label_values(&["coordinator", "refused"])
                        .inc_by(n as u64);
                    self.unsent.drain(..n);
                }
                _ => return,
            }
        }
    }
}

/// The running link: stopped after the node's data path, so its last events are posted.
pub(crate) struct CoordinatorLink {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl CoordinatorLink {
    /// Starts the link of a node whose HTTP listener is on `http_port`, declaring its L1 and
    /// L2 budgets.
    pub(crate) fn spawn(
        node: &NodeConfig,
        config: &CoordinatorLinkConfig,
        events: Arc<EventQueue>,
        metrics: Arc<NodeMetrics>,
        http_port: u16,
    ) -> Self {
        let ctx = LinkContext {
            config: config.clone(),
            events,
            metrics,
            http_port,
            capacity: (node.l1.budget, node.l2.as_ref().map(|l| l.eviction.budget)),
        };
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(ctx, stop.clone()));
        CoordinatorLink { stop, task }
    }

    /// Stops the link: a last flush and the deregistration, waited for at most `deadline`.
    pub(crate) async fn stop(self, deadline: Duration) {
        self.stop.cancel();
        if tokio::time::timeout(deadline, self.task).await.is_err() {
            tracing::warn!("the coordinator link did not stop within {deadline:?}");
        }
    }
}

/// Runs the link until `shutdown`, then flushes and deregisters (each call bounded).
async fn run(ctx: LinkContext, shutdown: CancellationToken) {
    let ip = match &ctx.config.advertise_ip {
        Some(ip) => ip.clone(),
        None => advertised_ip(&ctx.config.host, ctx.config.port).await,
    };
    let incarnation = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let (hb, flush) = (
        ctx.config.heartbeat_interval,
        ctx.config.event_flush_interval,
    );
    let mut link = Link {
        ctx,
        ip,
        incarnation,
        seq: 0,
        capacity_revision: 0,
        unsent: Vec::new(),
        registered: false,
    };
    link.register().await;
    let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + hb, hb);
    let mut flusher = tokio::time::interval(flush);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    flusher.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = heartbeat.tick() => link.heartbeat().await,
            _ = flusher.tick() => link.flush().await,
        }
    }
    link.flush().await;
    let path = format!("/instances/{}", link.ctx.config.instance_id);
    link.call("deregister", "DELETE", &path, None).await;
}

/// The local address of the route to the coordinator (`127.0.0.1` when it is on loopback).
async fn advertised_ip(host: &str, port: u16) -> String {
    route_ip(&crate::net::host_port(host, port)).await
}

/// The local address of the route to `endpoint` (`host:port`; `127.0.0.1` when it is on
/// loopback or cannot be resolved).
pub(crate) async fn route_ip(endpoint: &str) -> String {
    let peer = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::lookup_host(endpoint.to_owned()),
    )
    .await
    .ok()
    .and_then(Result::ok)
    .and_then(|mut addrs| addrs.next());
    peer.and_then(|a| crate::net::route_source(a.ip()))
        .map_or_else(|| "127.0.0.1".to_owned(), |ip| ip.to_string())
}

/// Parses `http://host:port[/]` (the scheme and port may be left out: port 9300).
///
/// # Errors
/// A message naming what is wrong.
pub(crate) fn parse_url(url: &str) -> Result<(String, u16), String> {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    if rest.contains("://") {
        return Err(format!("{url:?}: only http:// is supported"));
    }
    let rest = rest.trim_end_matches('/');
    if rest.contains('/') {
        return Err(format!("{url:?}: a base URL has no path"));
    }
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
            let port = p
                .parse::<u16>()
                .map_err(|_| format!("{url:?}: bad port {p:?}"))?;
            (h, port)
        }
        _ => (rest, 9300),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("{url:?}: no host"));
    }
    Ok((host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_coordinator_urls() {
        assert_eq!(parse_url("http://coord:9300"), Ok(("coord".into(), 9300)));
        assert_eq!(parse_url("10.0.0.1:80/"), Ok(("10.0.0.1".into(), 80)));
        assert_eq!(parse_url("http://coord"), Ok(("coord".into(), 9300)));
        assert_eq!(parse_url("http://[::1]:9"), Ok(("::1".into(), 9)));
        for bad in [
            "https://x:1",
            "http://x:1/api",
            "http://:1",
            "http://x:99999",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_queue_is_bounded_and_keeps_each_events_tier() {
        let q = EventQueue::new(3, Arc::new(NodeMetrics::new()));
        q.changed(TierId::L1, "m@1@0@aa@bf16", 5, true);
        q.changed(TierId::L2, "m@1@0@aa@bf16", 5, true);
        q.changed(TierId::L2, "not-a-key", 5, true);
        q.changed(TierId::L2, "m@1@0@ab@bf16", 5, false);
        q.accessed(TierId::L2, "m@1@0@ac@bf16");
        let taken = q.take(10);
        assert_eq!(taken.len(), 3);
        assert_eq!(
            taken.iter().map(|e| (e.tier, e.kind)).collect::<Vec<_>>(),
            [
                (TierId::L1, CacheEventKind::Store),
                (TierId::L2, CacheEventKind::Store),
                (TierId::L2, CacheEventKind::Delete)
            ]
        );
        assert_eq!(taken[2].key.chunk_hash_hex, "ab");
        let text = q.metrics.render();
        assert!(
            text.contains(r#"kvplane_node_reports_total{outcome="dropped",sink="coordinator"} 1"#),
            "{text}"
        );
        let q = EventQueue::new(3, Arc::new(NodeMetrics::new()));
        q.accessed(TierId::L1, "m@1@0@ac@bf16");
        assert_eq!(q.take(1)[0].kind, CacheEventKind::Access);
    }
}
