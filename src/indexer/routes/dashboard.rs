//! The Indexer page: the shared `frontend/` app with `indexer.html` at `/`, and its one JSON
//! feed, `GET /api/dashboard[?history=1]`: every publisher (endpoint, connection state, last
//! sequence number applied, bytes queued behind the applier, gaps, replays, restarts, blocks
//! per tier) with the services it feeds, the index totals and counters and, on request, the
//! server-side history ([`crate::web::history`]: a sample every 2 s for 15 minutes).
//!
//! Read-only. The page's query box posts to the indexer's own `POST /query` (same origin,
//! `Content-Type: application/json`); nothing here changes the index. Locks: the registry,
//! then the index for reading, as `GET /services` takes them; neither across an `.await`.

use crate::indexer::IndexerState;
use crate::web::assets::{self, Frontend};
use crate::web::history::{
    feed_response, spawn_sampler, unix_now, History, HistoryPage, HistoryQuery, Sample,
};
use axum::extract::{Query, State};
use axum::response::Response;
use axum::routing::{get, MethodRouter};
use axum::Router;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Publishers one feed lists at most (the totals count them all).
const FEED_ROWS: usize = 1000;

#[derive(Clone)]
struct Dash {
    state: Arc<IndexerState>,
    history: Arc<History>,
}

/// The page: `indexer.html` at `/` and its static files (left out of the document).
pub(super) fn page<S: Clone + Send + Sync + 'static>() -> Router<S> {
    assets::page::<Frontend, S>("indexer.html")
}

/// The feed, `GET /api/dashboard`, and the history's sampler (which ends when the route is
/// dropped, or when the indexer shuts down).
pub(super) fn feed_route<S: Clone + Send + Sync + 'static>(
    state: &Arc<IndexerState>,
) -> MethodRouter<S> {
    let history = Arc::new(History::dashboard(16));
    let st = Arc::clone(state);
    spawn_sampler(&history, move || {
        let s = (!st.shutdown.is_cancelled()).then(|| sample(&st, unix_now()));
        async move { s }
    });
    get(feed).with_state(Dash {
        state: Arc::clone(state),
        history,
    })
}

/// Blocks per tier, as `/query` names the tiers.
#[derive(Default, Serialize)]
#[allow(non_snake_case)]
struct Blocks {
    GPU: u64,
    CPU: u64,
    DISK: u64,
}

impl Blocks {
    fn add(&mut self, t: [u64; 3]) {
        self.GPU += t[0];
        self.CPU += t[1];
        self.DISK += t[2];
    }
}

/// One publisher endpoint and what it feeds.
#[derive(Serialize)]
struct PublisherRow {
    endpoint: String,
    replay_endpoint: Option<String>,
    r#type: &'static str,
    connected: bool,
    connects: u64,
    replaying: bool,
    /// The last sequence number applied (`null`: none yet).
    last_seq: Option<u64>,
    /// Payload bytes received and not yet applied (the applier's backlog).
    queued_bytes: u64,
    gaps: u64,
    unrepaired_gaps: u64,
    replays: u64,
    replay_failures: u64,
    partial_replays: u64,
    restarts: u64,
    duplicates: u64,
    queue_full: u64,
    error: Option<String>,
    blocks: Blocks,
    /// The registrations this endpoint feeds (`/register` bodies, with their blocks).
    services: Vec<Value>,
}

#[derive(Default, Serialize)]
struct Totals {
    services: usize,
    publishers: usize,
    connected: usize,
    replaying: usize,
    memberships: usize,
    max_memberships: usize,
    /// `(stream, block)` records, whatever tiers each holds.
    records: usize,
    heap_bytes: usize,
}

/// Cumulative since start: the page turns deltas into rates.
#[derive(Default, Serialize)]
struct Counters {
    events_applied: u64,
    stored: u64,
    removed: u64,
    orphans: u64,
    unknown_hashes: u64,
    shape_mismatch: u64,
    capacity_refused: u64,
    expired: u64,
    evicted: u64,
    clears: u64,
    gaps: u64,
    replays: u64,
    replay_failures: u64,
    restarts: u64,
    queue_full: u64,
}

#[derive(Serialize)]
struct Feed {
    server_time: f64,
    version: &'static str,
    service: &'static str,
    hash_seed: u64,
    totals: Totals,
    counters: Counters,
    /// By endpoint, the first [`FEED_ROWS`].
    publishers: Vec<PublisherRow>,
    /// The role in its cluster and, for a replica, its lag (`/readyz`'s body).
    cluster: serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    history: Option<HistoryPage>,
}

/// Everything but the history, under the registry lock then the index read lock.
fn snapshot(st: &IndexerState) -> (Totals, Counters, Vec<PublisherRow>) {
    let registry = st.registry.lock();
    let core = st.core.read();
    let ix = &core.index;
    let c = ix.counters();
    let mut counters = Counters {
        events_applied: st.metrics.events_applied.load(Ordering::Relaxed),
        stored: c.stored,
        removed: c.removed,
        orphans: c.orphans,
        unknown_hashes: c.unknown_hashes,
        shape_mismatch: c.shape_mismatch,
        capacity_refused: c.capacity_refused,
        expired: c.expired,
        evicted: c.evicted,
        clears: c.clears,
        ..Counters::default()
    };
    let mut by_endpoint: BTreeMap<&str, PublisherRow> = BTreeMap::new();
    for (endpoint, p) in &registry.publishers {
        let s = &p.status;
        let seq = *s.seq.lock();
        let last = s.last_seq.load(Ordering::Relaxed);
        let queue_full = s.queue_full.load(Ordering::Relaxed);
        counters.gaps += seq.gaps;
        counters.replays += seq.replays;
        counters.replay_failures += seq.replay_failures;
        counters.restarts += seq.restarts;
        counters.queue_full += queue_full;
        by_endpoint.insert(
            endpoint,
            PublisherRow {
                endpoint: endpoint.clone(),
                replay_endpoint: p.replay_endpoint.clone(),
                r#type: p.kind.name(),
                connected: s.connected.load(Ordering::Relaxed),
                connects: s.connects.load(Ordering::Relaxed),
                replaying: s.replaying.load(Ordering::Relaxed),
                last_seq: (last != u64::MAX).then_some(last),
                queued_bytes: s.queued_bytes.load(Ordering::Relaxed) as u64,
                gaps: seq.gaps,
                unrepaired_gaps: seq.unrepaired_gaps,
                replays: seq.replays,
                replay_failures: seq.replay_failures,
                partial_replays: seq.partial_replays,
                restarts: seq.restarts,
                duplicates: seq.duplicates,
                queue_full,
                error: s.error.lock().clone(),
                blocks: Blocks::default(),
                services: Vec::new(),
            },
        );
    }
    for service in registry.services.values() {
        let Some(p) = by_endpoint.get_mut(service.reg.endpoint.as_str()) else {
            continue;
        };
        let tiers = ix
            .stream_stats(service.stream)
            .unwrap_or_default()
            .tier_blocks;
        p.blocks.add(tiers);
        if p.services.len() < FEED_ROWS {
            let mut entry = service.reg.to_json();
            entry["blocks"] =
                serde_json::json!({"GPU": tiers[0], "CPU": tiers[1], "DISK": tiers[2]});
            p.services.push(entry);
        }
    }
    let publishers: Vec<PublisherRow> = by_endpoint.into_values().collect();
    let totals = Totals {
        services: registry.services.len(),
        publishers: publishers.len(),
        connected: publishers.iter().filter(|p| p.connected).count(),
        replaying: publishers.iter().filter(|p| p.replaying).count(),
        memberships: ix.memberships(),
        max_memberships: ix.config().max_memberships,
        records: ix.records(),
        heap_bytes: ix.heap_bytes(),
    };
    (
        totals,
        counters,
        publishers.into_iter().take(FEED_ROWS).collect(),
    )
}

/// One history sample: index gauges and cumulative counters.
fn sample(st: &IndexerState, now: f64) -> Sample {
    let (t, c, publishers) = snapshot(st);
    let mut tiers = Blocks::default();
    for p in &publishers {
        tiers.add([p.blocks.GPU, p.blocks.CPU, p.blocks.DISK]);
    }
    Sample::at(now)
        .with("events", c.events_applied as f64)
        .with("stored", c.stored as f64)
        .with("removed", c.removed as f64)
        .with("memberships", t.memberships as f64)
        .with("gpu", tiers.GPU as f64)
        .with("cpu", tiers.CPU as f64)
        .with("disk", tiers.DISK as f64)
        .with("gaps", c.gaps as f64)
        .with("replays", c.replays as f64)
        .with("connected", t.connected as f64)
}

async fn feed(State(d): State<Dash>, Query(q): Query<HistoryQuery>) -> Response {
    let (totals, counters, publishers) = snapshot(&d.state);
    let body = Feed {
        server_time: (unix_now() * 1000.0).round() / 1000.0,
        version: env!("CARGO_PKG_VERSION"),
        service: "indexer",
        hash_seed: d.state.core.read().index.config().seed,
        totals,
        counters,
        publishers,
        cluster: crate::indexer::cluster::readyz(&d.state).1,
        history: q.page(&d.history),
    };
    feed_response(&body)
}
