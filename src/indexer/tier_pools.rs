//! LMCache's tiers in the index (docs/INDEXER.md, "LMCache tiers"): a registration naming
//! `lmcache_instance_id` gets a pool stream of its instance (shared by its ranks) that the
//! named MP servers' L1 and L2 chunks feed as CPU and DISK blocks; the batches come from the
//! coordinator of the same process (`kvplane serve --indexer-port … --coordinator-port …`).
//! Owns the glue only: the mapping is [`crate::indexer::model::tiers`]. Lock order: registry, then
//! tiers, then the index.

use super::api::Registration;
use super::IndexerState;
use crate::indexer::model::events::KvEvent;
use crate::indexer::model::index::StreamId;
use crate::indexer::model::replica::Change;
use crate::indexer::model::tiers::{TierBatch, TierCounters, TierLink};
use std::sync::atomic::Ordering;

/// Chunks tracked over all MP servers at most (256 tokens each: 16M chunks is 4G tokens);
/// beyond, new chunks are counted in `refused` and not indexed.
pub(super) const MAX_CHUNKS: usize = 1 << 24;

impl IndexerState {
    /// Applies MP-server batches (in the coordinator's apply order) to the pools they feed.
    pub fn apply_tier_batches(&self, batches: &[TierBatch]) {
        let mut tiers = self.tiers.lock();
        let events: Vec<(StreamId, KvEvent)> =
            batches.iter().flat_map(|b| tiers.apply(b)).collect();
        self.apply_to_streams(events);
    }

    /// An MP server left the coordinator's fleet: its L1 chunks leave the pools.
    pub fn tier_server_left(&self, server: &str) {
        let mut tiers = self.tiers.lock();
        let events = tiers.server_left(server);
        self.apply_to_streams(events);
    }

    /// The bridge's counters.
    pub fn tier_counters(&self) -> TierCounters {
        self.tiers.lock().counters()
    }

    /// Per MP server: its incarnation and the chunks it shows on L1 and L2.
    pub(super) fn tier_servers(&self) -> Vec<(String, u64, [u64; 2])> {
        self.tiers.lock().server_chunks()
    }

    /// Creates the pool of `reg`'s LMCache servers (none named: `None`) and links it.
    pub(super) fn link_tiers(&self, reg: &Registration) -> Option<StreamId> {
        if reg.lmcache.is_empty() {
            return None;
        }
        let mut tiers = self.tiers.lock();
        let spec = super::state::stream_spec(reg, true);
        let pool = {
            let mut core = self.core.write();
            let pool = core.index.add_stream(spec.clone())?;
            self.role.record(Change::AddStream {
                stream: pool.0,
                spec,
            });
            pool
        };
        let mut events = Vec::new();
        for server in &reg.lmcache {
            events.extend(tiers.link(
                server,
                TierLink {
                    stream: pool,
                    block_size: reg.block_size,
                },
            ));
        }
        self.apply_to_streams(events);
        Some(pool)
    }

    /// Removes a pool and its blocks.
    pub(super) fn unlink_tiers(&self, pool: StreamId) {
        let mut tiers = self.tiers.lock();
        tiers.unlink_stream(pool);
        let mut core = self.core.write();
        core.index.remove_stream(pool);
        self.role.record(Change::RemoveStream { stream: pool.0 });
    }

    fn apply_to_streams(&self, events: Vec<(StreamId, KvEvent)>) {
        if events.is_empty() {
            return;
        }
        let now = self.now_secs();
        let n = events.len() as u64;
        let mut core = self.core.write();
        for (s, e) in &events {
            core.index.apply(*s, e, now);
        }
        if self.role.records() {
            for (s, e) in events {
                self.role.record(Change::Apply {
                    streams: vec![s.0],
                    events: vec![e],
                    now,
                });
            }
        }
        drop(core);
        self.metrics.events_applied.fetch_add(n, Ordering::Relaxed);
    }
}
