//! The Mooncake standard envelope (the Conductor's KV Events API, RFC #1527): the order of
//! each backend's `event_id`s. The standardized events (`event_type` stored / removed /
//! cleared) and their envelope fields are decoded with every other event in `super::events`.
//!
//! - `event_id` orders a backend's events. Its scope is what publishers number: Mooncake's
//!   master keeps one counter per process, from 1, over every tenant and medium
//!   (`mooncake-store/src/kv_event/kv_event_publisher.cpp`, `next_event_id_`), and a master
//!   has one `backend_id`; Dynamo's publisher numbers "per worker". So the ids are tracked per
//!   (publisher, `backend_id`) by the same [`SeqTracker`] that tracks vLLM's sequence numbers
//!   (no replay: a gap is counted and passed over, an id back at 1 or far back is a restart
//!   that clears the backend's blocks, an older id is dropped and counted as a duplicate).
//! - `base_block_idx` is the depth of the event's first block: a stored event at depth 0 must
//!   not name a parent, and one deeper than 0 without `parent_hash` cannot be hashed from its
//!   tokens, so its `seq_hashes` (standard rolling hashes) are indexed as given; with neither
//!   a parent nor `seq_hashes` it is refused.
//! - `backend_id` and `tenant_id` say whose blocks these are; the service decides which
//!   registered streams read them.
//!
//! Pure: no I/O, never panics.

use super::seq::{SeqConfig, SeqCounters, SeqStep, SeqTracker};
use std::collections::BTreeMap;

/// Backends whose `event_id`s one publisher's tracker follows at most; events of further
/// backends are refused (counted).
pub(crate) const MAX_BACKENDS: usize = 64;

/// What became of one standardized event in its backend's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ordered {
    /// Next in order (or after a gap, counted): apply it.
    Apply,
    /// The backend restarted (its id went back to the first, or far back): clear its
    /// blocks, then apply it.
    ClearThenApply,
    /// An id already passed (a duplicate, or one going backwards): dropped, counted.
    Drop,
    /// The publisher already tracks [`MAX_BACKENDS`] backends: dropped, counted.
    Refused,
}

/// One backend's order as `/services` shows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendOrder {
    /// The last `event_id` applied.
    pub last: Option<u64>,
    /// What the tracker counted (gaps, duplicates, restarts, unrepaired gaps, applied).
    pub counters: SeqCounters,
}

/// The `event_id` order of every backend one publisher carries.
#[derive(Debug, Default)]
pub(crate) struct EventOrder {
    backends: BTreeMap<String, SeqTracker<u64>>,
}

impl EventOrder {
    /// Places event `id` of `backend` (`""`: unnamed) in its backend's order.
    pub(crate) fn place(&mut self, backend: &str, id: u64) -> Ordered {
        if !self.backends.contains_key(backend) {
            if self.backends.len() >= MAX_BACKENDS {
                return Ordered::Refused;
            }
            let config = SeqConfig {
                first_seq: 1,
                replay: false,
                ..SeqConfig::default()
            };
            self.backends
                .insert(backend.to_owned(), SeqTracker::new(config));
        }
        let Some(tracker) = self.backends.get_mut(backend) else {
            return Ordered::Refused;
        };
        let steps = tracker.on_live(id, id);
        match steps.first() {
            Some(SeqStep::Clear) => Ordered::ClearThenApply,
            Some(SeqStep::Apply(..)) => Ordered::Apply,
            // No replay is configured, so a tracker never asks for one.
            Some(SeqStep::Replay(_)) | None => Ordered::Drop,
        }
    }

    /// Each backend's order, by name.
    pub(crate) fn backends(&self) -> BTreeMap<String, BackendOrder> {
        self.backends
            .iter()
            .map(|(name, t)| {
                (
                    name.clone(),
                    BackendOrder {
                        last: t.last(),
                        counters: t.counters(),
                    },
                )
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "mooncake_tests.rs"]
mod tests;
