//! `GET /metrics` of the coordinator: every series under the `kvplane_coordinator_` prefix,
//! rendered in the Prometheus text format from a snapshot of the model's counters, the
//! background-loop outcomes and the refusals of each limit. Owns the names and help texts;
//! keeps no state of its own (so it cannot conflict with the controller's registry).

use super::model::{Counters, Model};
use crate::coordinator::model::fleet::Instances;
use crate::coordinator::state::api_state::RefusalCounts;
use crate::coordinator::state::driver::BackgroundStats;
use crate::web::exposition::{Exposition, Kind, Kind::Counter, Kind::Gauge, SampleValue};
use std::sync::atomic::Ordering;

/// The fleet's numbers at one instant (read on the fleet owner).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FleetNumbers {
    instances: usize,
    refused: u64,
    timed_out: u64,
}

impl FleetNumbers {
    /// Reads the fleet.
    pub(crate) fn of(f: &Instances) -> Self {
        FleetNumbers {
            instances: f.len(),
            refused: f.refused,
            timed_out: f.timed_out,
        }
    }
}

/// The model's numbers at one instant.
#[derive(Clone, Debug)]
pub(crate) struct Snapshot {
    counters: Counters,
    fleet: FleetNumbers,
    tracked_keys: usize,
    tracked_placements: usize,
    l2_holders: usize,
    tracked_key_bytes: usize,
    usage_untracked: u64,
    l1_placements: usize,
    usage_bytes: Vec<(String, f64)>,
}

impl Snapshot {
    /// Reads the model; `fleet` was read just before.
    pub(crate) fn of(m: &Model, fleet: FleetNumbers) -> Self {
        let (_, rows) = m.quota_list();
        Snapshot {
            counters: m.counters.clone(),
            fleet,
            tracked_keys: m.tracked_keys(),
            tracked_placements: m.tracked_placements(),
            l2_holders: m.l2_holders(),
            tracked_key_bytes: m.tracked_key_memory(),
            usage_untracked: m.usage.untracked,
            l1_placements: m.usage.l1_placements(),
            usage_bytes: rows
                .into_iter()
                .map(|r| (r.cache_salt, r.usage_gb * super::model::GIB))
                .collect(),
        }
    }
}

fn series(out: &mut Exposition, kind: Kind, name: &str, help: &str, value: impl SampleValue) {
    out.one(
        format_args!("kvplane_coordinator_{name}"),
        kind,
        help,
        value,
    );
}

/// Writes the model's, the loops' and the limits' series.
pub(crate) fn write(
    out: &mut Exposition,
    s: &Snapshot,
    loops: &BackgroundStats,
    refused: &RefusalCounts,
    metadata: &crate::coordinator::state::metadata::Persister,
) {
    let c = &s.counters;
    let counters: [(&str, &str, u64); 19] = [
        (
            "instances_refused_total",
            "Registrations refused at the instance limit.",
            s.fleet.refused,
        ),
        (
            "instances_timed_out_total",
            "Instances removed by the health sweep.",
            s.fleet.timed_out,
        ),
        (
            "batches_applied_total",
            "Event batches applied.",
            c.batches_applied,
        ),
        (
            "batches_duplicate_total",
            "Event batches dropped as duplicates.",
            c.batches_duplicate,
        ),
        (
            "batches_stale_total",
            "Event batches dropped as stale (older incarnation).",
            c.batches_stale,
        ),
        (
            "batches_refused_total",
            "Event batches dropped at the cursor limit.",
            c.batches_refused,
        ),
        (
            "seq_gaps_total",
            "Sequence numbers skipped by event senders.",
            c.seq_gaps,
        ),
        (
            "events_applied_total",
            "L2 events applied.",
            c.events_applied,
        ),
        (
            "events_l1_ignored_total",
            "L1 events accepted but not tracked.",
            c.events_l1_ignored,
        ),
        (
            "keys_rejected_total",
            "Events whose key cannot be tracked.",
            c.keys_rejected,
        ),
        (
            "keys_refused_total",
            "New keys dropped at the tracked-key limit.",
            c.keys_refused,
        ),
        (
            "placements_refused_total",
            "L2 copies not tracked (the placement, holder or backend limit).",
            c.placements_refused,
        ),
        (
            "placements_expired_total",
            "L2 copies dropped because their server left more than an hour ago.",
            c.placements_expired,
        ),
        (
            "eviction_copies_unreachable_total",
            "Planned copies on a shared backend with no live member to send them to.",
            c.eviction_copies_unreachable,
        ),
        (
            "eviction_no_instance_total",
            "Eviction cycles with victims held by servers not registered now.",
            loops.eviction_no_instance.load(Ordering::Relaxed),
        ),
        (
            "eviction_keys_planned_total",
            "Keys planned for eviction.",
            c.eviction_keys_planned,
        ),
        (
            "capacity_declarations_total",
            "Capacity declarations (config batches) applied.",
            c.capacity_declarations,
        ),
        (
            "usage_untracked_total",
            "Placements or declarations not counted per instance (a usage limit was reached).",
            s.usage_untracked,
        ),
        (
            "eviction_cycles_capped_total",
            "Eviction cycles that hit the per-cycle victim cap.",
            c.eviction_cycles_capped,
        ),
    ];
    for (name, help, v) in counters {
        series(out, Counter, name, help, v);
    }
    let ld = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    series(
        out,
        Counter,
        "eviction_cycles_total",
        "Eviction cycles run.",
        ld(&loops.eviction_cycles),
    );
    series(
        out,
        Counter,
        "eviction_cycles_skipped_total",
        "Eviction cycles skipped while dispatches were in flight.",
        ld(&loops.eviction_cycles_skipped),
    );
    series(
        out,
        Counter,
        "dispatches_ok_total",
        "Eviction dispatches that succeeded.",
        ld(&loops.dispatches_ok),
    );
    series(
        out,
        Counter,
        "dispatches_failed_total",
        "Eviction dispatches that failed.",
        ld(&loops.dispatches_failed),
    );
    series(
        out,
        Gauge,
        "key_owner_longest_job_seconds",
        "Longest single step of the key owner task since start (events, quotas, eviction plan).",
        ld(&loops.key_owner_longest_job_us) as f64 / 1e6,
    );
    series(
        out,
        Gauge,
        "fleet_owner_longest_job_seconds",
        "Longest single step of the fleet owner task since start (registrations, heartbeats).",
        ld(&loops.fleet_owner_longest_job_us) as f64 / 1e6,
    );
    series(
        out,
        Counter,
        "metadata_saves_total",
        "Metadata files written (--metadata-path).",
        ld(&metadata.saved),
    );
    series(
        out,
        Counter,
        "metadata_save_failures_total",
        "Metadata writes that failed (logged; the change stays in memory).",
        ld(&metadata.failed),
    );
    series(
        out,
        Counter,
        "sweeps_total",
        "Health sweeps run.",
        ld(&loops.sweeps),
    );
    series(
        out,
        Counter,
        "refused_events_per_request_total",
        "Event requests over the per-request event limit.",
        ld(&refused.events_per_request),
    );
    series(
        out,
        Counter,
        "refused_instances_total",
        "Registrations refused at the instance limit (HTTP).",
        ld(&refused.instances),
    );
    series(
        out,
        Counter,
        "invalid_bodies_total",
        "Request bodies refused with 422.",
        ld(&refused.invalid_bodies),
    );
    series(
        out,
        Counter,
        "refused_body_bytes_total",
        "Request bodies over --max-body-bytes (413).",
        ld(&refused.body_bytes),
    );
    series(
        out,
        Counter,
        "refused_body_items_total",
        "Request bodies over --max-body-items JSON values (413).",
        ld(&refused.body_items),
    );
    series(
        out,
        Counter,
        "refused_connections_total",
        "Connections that waited for a slot at --max-http-connections (every slot busy).",
        ld(&refused.connections),
    );
    series(
        out,
        Counter,
        "http_idle_closed_total",
        "Idle keep-alive connections closed at --max-http-connections to admit a new one.",
        ld(&refused.idle_closed),
    );
    series(
        out,
        Counter,
        "refused_read_timeout_total",
        "Peers cut off by --http-read-timeout.",
        ld(&refused.read_timeout),
    );
    series(
        out,
        Counter,
        "refused_tls_handshake_total",
        "Failed TLS handshakes on the HTTP port (--tls-cert): plaintext clients, refused or missing client certificates.",
        ld(&refused.tls_handshake),
    );
    series(
        out,
        Gauge,
        "instances",
        "Registered MP servers.",
        s.fleet.instances,
    );
    series(
        out,
        Gauge,
        "l2_placements",
        "L2 copies tracked (per holder and backend; a shared backend's once).",
        s.tracked_placements,
    );
    series(
        out,
        Gauge,
        "l2_holders",
        "Holders of tracked L2 copies (servers, departed ones included, and the fleet).",
        s.l2_holders,
    );
    series(
        out,
        Gauge,
        "l1_placements",
        "L1 placements tracked for per-instance usage.",
        s.l1_placements,
    );
    series(
        out,
        Gauge,
        "tracked_keys",
        "L2 keys tracked.",
        s.tracked_keys,
    );
    series(
        out,
        Gauge,
        "tracked_key_memory_bytes",
        "Bytes allocated for tracked keys.",
        s.tracked_key_bytes,
    );
    let mut usage = out.family(
        "kvplane_coordinator_usage_bytes",
        Gauge,
        "Tracked L2 bytes per cache_salt.",
    );
    for (salt, bytes) in &s.usage_bytes {
        usage.sample(&[("cache_salt", salt)], *bytes);
    }
}
