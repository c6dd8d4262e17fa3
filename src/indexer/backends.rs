//! The Mooncake standard envelope in the service: which registered streams read a backend's
//! blocks, each publisher's `event_id` order per backend, and what is dropped, counted.
//!
//! A registration may name the backends it reads (`backend_id`, a string or a list): a
//! standardized event of backend `B` from its publisher applies to the streams of that
//! publisher whose registration names `B`, or names none (they read every backend their
//! endpoint carries), and whose tenant is the event's `tenant_id` (when it names one). So a
//! shared store's blocks count for every instance registered to read it and for no other.
//! An event no stream takes is dropped and counted (`unknown_backend`, or `tenant` when a
//! stream reads the backend for another tenant). Events are placed in their backend's
//! `event_id` order ([`EventOrder`]) before they apply; an id going backwards is dropped,
//! a restart clears the blocks of the streams reading that backend.
//!
//! Must not hold the index lock across an `.await` (nothing here awaits) or decode frames.

use super::IndexerState;
use crate::indexer::model::events::{Batch, KvEvent};
use crate::indexer::model::index::{Index, StreamId};
use crate::indexer::model::mooncake::{EventOrder, Ordered};
use crate::web::exposition::{Exposition, Kind};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// The backends each Mooncake stream reads (for those whose registration names some), and
/// the engines' pools each backend feeds.
#[derive(Debug, Default)]
pub(super) struct Backends {
    declared: RwLock<HashMap<StreamId, Vec<String>>>,
    pools: RwLock<HashMap<String, Vec<StreamId>>>,
}

impl Backends {
    /// The engines' pools `backend` feeds.
    fn pools_of(&self, backend: &str) -> Vec<StreamId> {
        self.pools.read().get(backend).cloned().unwrap_or_default()
    }

    /// Stream `stream` reads only `backends` (none named: every backend of its endpoint).
    pub(super) fn declare(&self, stream: StreamId, backends: &[String]) {
        if !backends.is_empty() {
            self.declared.write().insert(stream, backends.to_vec());
        }
    }

    /// The stream is gone.
    pub(super) fn forget(&self, stream: StreamId) {
        self.declared.write().remove(&stream);
    }

    /// Whether `stream` takes `backend`'s events: a Mooncake stream that names none or names
    /// it, or an engine's pool (fed only by the backends it names).
    fn reads(&self, stream: StreamId, backend: &str) -> bool {
        self.declared
            .read()
            .get(&stream)
            .is_none_or(|b| b.iter().any(|n| n == backend))
    }
}

/// Why a standardized event was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dropped {
    /// No stream of its publisher reads its backend.
    UnknownBackend,
    /// Streams read its backend, none for its tenant.
    Tenant,
    /// Its publisher already follows the most backends.
    BackendCap,
}

impl Dropped {
    const ALL: [Dropped; 3] = [
        Dropped::UnknownBackend,
        Dropped::Tenant,
        Dropped::BackendCap,
    ];

    fn label(self) -> &'static str {
        match self {
            Dropped::UnknownBackend => "unknown_backend",
            Dropped::Tenant => "tenant",
            Dropped::BackendCap => "backend_cap",
        }
    }
}

/// The envelope's counts for `/metrics`.
#[derive(Debug, Default)]
pub struct EnvelopeCounters {
    dropped: [AtomicU64; 3],
    /// Standardized events without an `event_id`, applied unordered.
    unordered: AtomicU64,
}

impl EnvelopeCounters {
    fn count(&self, why: Dropped, backend: &str, n: usize) {
        let i = Dropped::ALL.iter().position(|d| *d == why).unwrap_or(0);
        let before = self.dropped[i].fetch_add(n as u64, Ordering::Relaxed);
        // The first of each reason, then about one in 1,000.
        if before == 0 || before / 1000 != (before + n as u64) / 1000 {
            tracing::warn!(
                backend,
                reason = why.label(),
                dropped = before + n as u64,
                "Mooncake events dropped (kvplane_indexer_mooncake_dropped_total)"
            );
        }
    }

    pub(crate) fn render(&self, out: &mut Exposition) {
        let mut family = out.family(
            "kvplane_indexer_mooncake_dropped_total",
            Kind::Counter,
            "Standardized (Mooncake) events dropped, by reason (unknown_backend: no stream of \
             the publisher reads its backend_id; tenant: none for its tenant_id; backend_cap: \
             the publisher already carries 64 backends).",
        );
        for (d, n) in Dropped::ALL.iter().zip(&self.dropped) {
            family.sample(&[("reason", d.label())], n.load(Ordering::Relaxed));
        }
        out.one(
            "kvplane_indexer_mooncake_unordered_total",
            Kind::Counter,
            "Standardized events without an event_id, applied outside any order.",
            self.unordered.load(Ordering::Relaxed),
        );
    }
}

/// Which streams of a publisher a run of events applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
enum StreamFilter {
    /// Every stream (events without an envelope).
    All,
    /// The streams reading `backend` for `tenant` (`None`: any tenant).
    Backend {
        backend: String,
        tenant: Option<String>,
    },
}

impl IndexerState {
    /// Applies a decoded batch of publisher `id` whose events carry envelopes: each event in
    /// its backend's order, to the streams reading its backend, runs of one target at a time.
    pub(super) fn apply_standard(&self, id: u32, order: &mut EventOrder, batch: Batch) {
        let counters = &self.metrics.envelope;
        let mut run: Vec<KvEvent> = Vec::new();
        let mut target = StreamFilter::All;
        for (event, envelope) in batch.events.into_iter().zip(batch.envelopes) {
            let next = match envelope {
                None => StreamFilter::All,
                Some(env) => {
                    let backend = env.backend_id.unwrap_or_default();
                    match env.event_id.map(|e| order.place(&backend, e)) {
                        None => {
                            counters.unordered.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(Ordered::Apply) => {}
                        Some(Ordered::ClearThenApply) => {
                            self.apply_run(id, &target, &mut run);
                            let pools = self.backends.pools_of(&backend);
                            self.clear_where(id, |_, s| self.backends.reads(s, &backend), &pools);
                        }
                        Some(Ordered::Drop) => continue,
                        Some(Ordered::Refused) => {
                            counters.count(Dropped::BackendCap, &backend, 1);
                            continue;
                        }
                    }
                    StreamFilter::Backend {
                        backend,
                        tenant: env.tenant_id,
                    }
                }
            };
            if next != target {
                self.apply_run(id, &target, &mut run);
                target = next;
            }
            run.push(event);
        }
        self.apply_run(id, &target, &mut run);
    }

    /// Applies (and empties) a run of events to `target`'s streams of publisher `id`.
    fn apply_run(&self, id: u32, target: &StreamFilter, run: &mut Vec<KvEvent>) {
        if run.is_empty() {
            return;
        }
        let (backend, tenant) = match target {
            StreamFilter::All => {
                self.apply_where(id, |_, _| true, &[], run);
                run.clear();
                return;
            }
            StreamFilter::Backend { backend, tenant } => (backend.as_str(), tenant.as_deref()),
        };
        let for_tenant = |index: &Index, s: StreamId| {
            tenant.is_none_or(|t| index.stream_spec(s).is_some_and(|spec| spec.tenant == t))
        };
        let pools = self.backends.pools_of(backend);
        let reads = |ix: &Index, s: StreamId| self.backends.reads(s, backend) && for_tenant(ix, s);
        let applied = self.apply_where(id, reads, &pools, run);
        if applied == 0 {
            let read_elsewhere = !pools.is_empty()
                || self
                    .core
                    .read()
                    .routes
                    .get(&id)
                    .is_some_and(|l| l.iter().any(|s| self.backends.reads(*s, backend)));
            let why = if read_elsewhere {
                Dropped::Tenant
            } else {
                Dropped::UnknownBackend
            };
            self.metrics.envelope.count(why, backend, run.len());
        }
        run.clear();
    }
}

impl IndexerState {
    /// Creates the pool of the Mooncake backends an engine's registration names (`None`:
    /// none named, or a Mooncake registration, whose own stream is its pool).
    pub(super) fn link_backends(&self, reg: &super::api::Registration) -> Option<StreamId> {
        if reg.backends.is_empty() || reg.kind == super::api::EngineType::Mooncake {
            return None;
        }
        let spec = super::state::stream_spec(reg, true);
        let pool = {
            let mut core = self.core.write();
            let pool = core.index.add_stream(spec.clone())?;
            self.role
                .record(crate::indexer::model::replica::Change::AddStream {
                    stream: pool.0,
                    spec,
                });
            pool
        };
        let mut pools = self.backends.pools.write();
        for b in &reg.backends {
            pools.entry(b.clone()).or_default().push(pool);
        }
        self.backends
            .declared
            .write()
            .insert(pool, reg.backends.clone());
        Some(pool)
    }

    /// Removes an engine's pool of Mooncake backends and its blocks.
    pub(super) fn unlink_backends(&self, pool: StreamId) {
        self.backends.pools.write().retain(|_, l| {
            l.retain(|s| *s != pool);
            !l.is_empty()
        });
        self.backends.forget(pool);
        let mut core = self.core.write();
        core.index.remove_stream(pool);
        self.role
            .record(crate::indexer::model::replica::Change::RemoveStream { stream: pool.0 });
    }
}

/// Each backend's `event_id` order of one publisher, as `/services` shows it.
pub(super) fn backends_json(status: &super::PublisherStatus) -> serde_json::Value {
    let backends = status.backends.lock();
    backends
        .iter()
        .map(|(name, o)| {
            let c = o.counters;
            (
                name.clone(),
                serde_json::json!({"last_event_id": o.last, "applied": c.applied, "gaps": c.gaps,
                    "duplicates": c.duplicates, "restarts": c.restarts}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Per publisher and backend: the `event_id` gaps, duplicates and restarts.
pub(super) fn render_backends(registry: &super::state::Registry, out: &mut Exposition) {
    type Family = (
        &'static str,
        &'static str,
        fn(&crate::indexer::model::seq::SeqCounters) -> u64,
    );
    let families: [Family; 3] = [
        (
            "gaps",
            "event_id gaps of a backend (counted and passed over: no replay).",
            |c| c.gaps,
        ),
        (
            "duplicates",
            "Events of a backend dropped: their event_id was already passed (duplicate or going backwards).",
            |c| c.duplicates,
        ),
        (
            "restarts",
            "Backend restarts (event_id back at 1 or far back): its blocks cleared.",
            |c| c.restarts,
        ),
    ];
    for (name, help, f) in families {
        let mut family = out.family(
            format_args!("kvplane_indexer_backend_{name}_total"),
            Kind::Counter,
            help,
        );
        for (endpoint, p) in &registry.publishers {
            for (backend, o) in p.status.backends.lock().iter() {
                family.sample(
                    &[("endpoint", endpoint), ("backend", backend)],
                    f(&o.counters),
                );
            }
        }
    }
}
