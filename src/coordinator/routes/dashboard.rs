//! The coordinator's Fleet page: the shared `frontend/` app with `fleet.html` at `/`, and its
//! one JSON feed, `GET /api/dashboard[?history=1]`: the registered MP servers with their
//! heartbeat age, every tenant (cache salt) with its tracked L2 usage against its quota, the
//! eviction and ingest counters and, on request, the server-side history
//! ([`crate::web::history`]: a sample every 2 s for 15 minutes of the counters and of the
//! usage and quota of the largest tenants), so the charts are full on open; with `--cluster`,
//! the coordinator's role, lease holder and last failover.
//!
//! Read-only: no route here changes anything; the feed is one job on the fleet owner (the
//! servers) and one on the model's owner (everything else), like `GET /instances` and
//! `GET /quota`.

use crate::coordinator::model::fleet::Instances;
use crate::coordinator::model::Model;
use crate::coordinator::state::api_state::ApiState;
use crate::coordinator::state::driver::{BackgroundStats, Handle, Stopped};
use crate::web::assets::{page, Frontend};
use crate::web::history::{
    feed_response, spawn_sampler, History, HistoryPage, HistoryQuery, Sample,
};
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Tenants whose usage (and quota) the history keeps: the largest by usage at each sample.
pub(crate) const HISTORY_TENANTS: usize = 16;

/// Servers and tenants one feed lists at most (the totals count them all).
pub(crate) const FEED_ROWS: usize = 1000;

const GIB: f64 = (1u64 << 30) as f64;

#[derive(Clone)]
struct Dash {
    api: Arc<ApiState>,
    history: Arc<History>,
}

/// The page and its feed, and the history's sampler (which ends with the model's owner).
pub(crate) fn routes<S: Clone + Send + Sync + 'static>(api: &Arc<ApiState>) -> Router<S> {
    let history = Arc::new(History::dashboard(8 + 2 * HISTORY_TENANTS));
    let handle = api.handle.clone();
    spawn_sampler(&history, move || {
        let handle = handle.clone();
        async move {
            let stats = Arc::clone(&handle.stats);
            let fleet = handle
                .fleet(|f, now, _| FleetPart::of(f, 0, now))
                .await
                .ok()?;
            handle
                .with(move |m, _, wall| sample(m, &stats, &fleet, wall))
                .await
                .ok()
        }
    });
    page::<Frontend, Dash>("fleet.html")
        .route("/api/dashboard", get(feed))
        .with_state(Dash {
            api: Arc::clone(api),
            history,
        })
}

/// One MP server.
#[derive(Serialize)]
struct Server {
    instance_id: String,
    ip: String,
    http_port: u16,
    registration_time: f64,
    /// Seconds since its last heartbeat (or registration).
    heartbeat_age_s: f64,
    metadata: BTreeMap<String, String>,
}

/// One tenant (cache salt).
#[derive(Serialize)]
struct Tenant {
    /// `""` is the default salt (`_default` in the routes).
    cache_salt: String,
    usage_bytes: u64,
    /// `null` without an explicit quota.
    quota_bytes: Option<u64>,
}

/// Cumulative since start.
#[derive(Serialize)]
struct Counters {
    events_applied: u64,
    batches_applied: u64,
    batches_duplicate: u64,
    batches_stale: u64,
    seq_gaps: u64,
    keys_refused: u64,
    instances_timed_out: u64,
    eviction_cycles: u64,
    eviction_keys_planned: u64,
    eviction_no_instance: u64,
    dispatches_ok: u64,
    dispatches_failed: u64,
    dispatches_in_flight: u64,
}

/// The eviction rule the page draws on the quota bars.
#[derive(Serialize)]
struct Rule {
    trigger_watermark: f64,
    eviction_ratio: f64,
}

#[derive(Serialize)]
struct Totals {
    servers: usize,
    tenants: usize,
    quotas: usize,
    tracked_keys: usize,
    tracked_key_bytes: usize,
    usage_bytes: u64,
}

#[derive(Serialize)]
struct Feed {
    server_time: f64,
    version: &'static str,
    service: &'static str,
    eviction: Rule,
    totals: Totals,
    counters: Counters,
    /// In registration order, the first [`FEED_ROWS`].
    servers: Vec<Server>,
    /// Largest usage first, the first [`FEED_ROWS`].
    tenants: Vec<Tenant>,
    #[serde(skip_serializing_if = "Option::is_none")]
    history: Option<HistoryPage>,
    /// With `--cluster`: role, lease holder, epoch, last failover (`/coordinator/cluster`).
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<serde_json::Value>,
}

fn bytes(gb: f64) -> u64 {
    (gb * GIB).round().max(0.0) as u64
}

/// Every tenant, largest usage first (then by salt).
fn tenants(m: &Model) -> Vec<Tenant> {
    let (_, list) = m.quota_list();
    let mut out: Vec<Tenant> = list
        .into_iter()
        .map(|q| Tenant {
            usage_bytes: bytes(q.usage_gb),
            quota_bytes: q.quota_exists.then(|| bytes(q.quota_limit_gb)),
            cache_salt: q.cache_salt,
        })
        .collect();
    out.sort_by(|a, b| {
        b.usage_bytes
            .cmp(&a.usage_bytes)
            .then_with(|| a.cache_salt.cmp(&b.cache_salt))
    });
    out
}

/// What the feed and the history read on the fleet owner.
struct FleetPart {
    /// The first `rows` servers, in registration order.
    servers: Vec<Server>,
    len: usize,
    timed_out: u64,
}

impl FleetPart {
    fn of(f: &Instances, rows: usize, now: Instant) -> Self {
        let servers = f
            .iter()
            .take(rows)
            .map(|i| Server {
                instance_id: i.instance_id.clone(),
                ip: i.ip.clone(),
                http_port: i.http_port,
                registration_time: i.registration_time,
                heartbeat_age_s: now.saturating_duration_since(i.last_seen).as_secs_f64(),
                metadata: i.metadata.clone(),
            })
            .collect();
        FleetPart {
            servers,
            len: f.len(),
            timed_out: f.timed_out,
        }
    }
}

fn counters(m: &Model, f: &FleetPart, s: &BackgroundStats) -> Counters {
    let c = &m.counters;
    Counters {
        events_applied: c.events_applied,
        batches_applied: c.batches_applied,
        batches_duplicate: c.batches_duplicate,
        batches_stale: c.batches_stale,
        seq_gaps: c.seq_gaps,
        keys_refused: c.keys_refused,
        instances_timed_out: f.timed_out,
        eviction_cycles: s.eviction_cycles.load(Ordering::Relaxed),
        eviction_keys_planned: c.eviction_keys_planned,
        eviction_no_instance: s.eviction_no_instance.load(Ordering::Relaxed),
        dispatches_ok: s.dispatches_ok.load(Ordering::Relaxed),
        dispatches_failed: s.dispatches_failed.load(Ordering::Relaxed),
        dispatches_in_flight: s.dispatches_in_flight.load(Ordering::Relaxed) as u64,
    }
}

/// One history sample: counters, then usage and quota of the largest tenants.
fn sample(m: &Model, stats: &BackgroundStats, fleet: &FleetPart, wall: f64) -> Sample {
    let c = counters(m, fleet, stats);
    let mut s = Sample::at(wall)
        .with("servers", fleet.len as f64)
        .with("tracked_keys", m.tracked_keys() as f64)
        .with("events", c.events_applied as f64)
        .with("keys_planned", c.eviction_keys_planned as f64)
        .with("dispatch_ok", c.dispatches_ok as f64)
        .with("dispatch_failed", c.dispatches_failed as f64);
    for t in tenants(m).into_iter().take(HISTORY_TENANTS) {
        s.push(format!("usage:{}", t.cache_salt), t.usage_bytes as f64);
        if let Some(q) = t.quota_bytes {
            s.push(format!("quota:{}", t.cache_salt), q as f64);
        }
    }
    s
}

fn feed_of(m: &Model, stats: &BackgroundStats, fleet: FleetPart, wall: f64) -> Feed {
    let mut all = tenants(m);
    let totals = Totals {
        servers: fleet.len,
        tenants: all.len(),
        quotas: all.iter().filter(|t| t.quota_bytes.is_some()).count(),
        tracked_keys: m.tracked_keys(),
        tracked_key_bytes: m.tracked_key_memory(),
        usage_bytes: all.iter().map(|t| t.usage_bytes).sum(),
    };
    all.truncate(FEED_ROWS);
    Feed {
        server_time: (wall * 1000.0).round() / 1000.0,
        version: env!("CARGO_PKG_VERSION"),
        service: "coordinator",
        eviction: Rule {
            trigger_watermark: m.config().trigger_watermark,
            eviction_ratio: m.config().eviction_ratio,
        },
        totals,
        counters: counters(m, &fleet, stats),
        servers: fleet.servers,
        tenants: all,
        history: None,
        cluster: None,
    }
}

async fn read_feed(h: &Handle) -> Result<Feed, Stopped> {
    let stats = Arc::clone(&h.stats);
    let fleet = h
        .fleet(|f, now, _| FleetPart::of(f, FEED_ROWS, now))
        .await?;
    h.with(move |m, _, wall| feed_of(m, &stats, fleet, wall))
        .await
}

async fn feed(State(d): State<Dash>, Query(q): Query<HistoryQuery>) -> Response {
    let Ok(mut body) = read_feed(&d.api.handle).await else {
        return crate::web::error::ApiError::Unavailable("the coordinator is shutting down".into())
            .into_response();
    };
    body.history = q.page(&d.history);
    body.cluster = d.api.cluster.as_ref().map(|c| c.json());
    feed_response(&body)
}
