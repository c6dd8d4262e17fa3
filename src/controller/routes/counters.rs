//! The cumulative counters the dashboard shows and its history samples, read from the
//! controller's metrics (atomic reads, no lock). A leaf: the feed and the history's sampler
//! (both in `dashboard.rs`) read through [`counters`].

use crate::controller::Driver;
use prometheus::core::Collector;
use prometheus::IntCounterVec;
use serde::Serialize;
use std::collections::BTreeMap;

/// The counters, cumulative since start.
#[derive(Serialize)]
pub(super) struct Counters {
    pub(super) ops_admit: u64,
    pub(super) ops_evict: u64,
    pub(super) p2p_lookup_hit: u64,
    pub(super) p2p_lookup_miss: u64,
    frames_received: u64,
    pub(super) frames_dropped: u64,
    frames_dropped_by_reason: BTreeMap<String, u64>,
    batches_discarded: u64,
    seq_discontinuities: u64,
    downlink_ok: u64,
    downlink_timeout: u64,
    downlink_error: u64,
    workers_removed: u64,
}

/// Sum of a counter vector's children whose `label` is `value` (every child if `label` is
/// empty).
fn counter_sum(vec: &IntCounterVec, label: &str, value: &str) -> u64 {
    vec.collect()
        .iter()
        .flat_map(|family| family.get_metric())
        .filter(|m| {
            label.is_empty()
                || m.get_label()
                    .iter()
                    .any(|l| l.name() == label && l.value() == value)
        })
        .map(|m| m.get_counter().get_value() as u64)
        .sum()
}

/// Per-`label` sums of a counter vector.
fn counter_by(vec: &IntCounterVec, label: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for family in vec.collect() {
        for m in family.get_metric() {
            if let Some(l) = m.get_label().iter().find(|l| l.name() == label) {
                *out.entry(l.value().to_owned()).or_insert(0) += m.get_counter().get_value() as u64;
            }
        }
    }
    out
}

/// The counters now.
pub(super) fn counters(shared: &Driver) -> Counters {
    let m = &shared.metrics;
    let frames_dropped_by_reason = counter_by(&m.frames_dropped, "reason");
    Counters {
        ops_admit: counter_sum(&m.ops_applied, "op", "admit"),
        ops_evict: counter_sum(&m.ops_applied, "op", "evict"),
        p2p_lookup_hit: counter_sum(&m.p2p_lookups, "result", "hit"),
        p2p_lookup_miss: counter_sum(&m.p2p_lookups, "result", "miss"),
        frames_received: counter_sum(&m.frames_received, "", ""),
        frames_dropped: frames_dropped_by_reason.values().sum(),
        frames_dropped_by_reason,
        batches_discarded: counter_sum(&m.batches_discarded, "", ""),
        seq_discontinuities: m.seq_discontinuities.get(),
        downlink_ok: counter_sum(&m.downlink_requests, "outcome", "ok"),
        downlink_timeout: counter_sum(&m.downlink_requests, "outcome", "timeout"),
        downlink_error: counter_sum(&m.downlink_requests, "outcome", "error"),
        workers_removed: counter_sum(&m.workers_removed, "", ""),
    }
}
