//! The node's answers to a controller's commands, through `kvplane::worker`: `clear` empties
//! the tier named by the location (`LocalCPUBackend` = L1, `LocalDiskBackend` = L2) and
//! answers the tokens removed, as LMCache 0.5.6's `StorageManager.clear` does; `health`
//! answers 0 (the worker's default). Pin, compress, decompress and move answer
//! "not implemented": a node stores objects for workers, it holds no engine.

use super::report::location;
use super::tiers::{TierId, TierSet, Tiers};
use crate::protocol::ClearWorkerMsg;
use crate::worker::{CommandError, CommandHandler, CommandResult};
use std::sync::Arc;

/// The node's [`CommandHandler`].
pub(crate) struct NodeCommands {
    pub(crate) tiers: Arc<Tiers>,
}

/// The tiers a controller location names.
fn tiers_of(loc: &str) -> Option<TierSet> {
    if loc == location(TierId::L1) {
        Some(TierSet {
            l1: true,
            l2: false,
        })
    } else if loc == location(TierId::L2) {
        Some(TierSet {
            l1: false,
            l2: true,
        })
    } else {
        None
    }
}

impl CommandHandler for NodeCommands {
    /// Removes every object of the tier (pinned L1 objects being read and L2 files still being
    /// written stay, as LMCache's clear skips objects it cannot evict); the removals reach the
    /// controller as evicts, like any other.
    async fn clear(&self, req: ClearWorkerMsg) -> CommandResult<i64> {
        let which = tiers_of(&req.location).ok_or_else(|| {
            CommandError::new(format!(
                "unknown location {:?}: a node has {} and {}",
                req.location,
                location(TierId::L1),
                location(TierId::L2)
            ))
        })?;
        let removed = self.tiers.delete_in(which, |_| true);
        tracing::info!(
            location = req.location,
            objects = removed.keys,
            tokens = removed.tokens,
            "cleared by the controller"
        );
        Ok(i64::try_from(removed.tokens).unwrap_or(i64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_name_one_tier_each() {
        assert_eq!(
            tiers_of("LocalCPUBackend"),
            Some(TierSet {
                l1: true,
                l2: false
            })
        );
        assert_eq!(
            tiers_of("LocalDiskBackend"),
            Some(TierSet {
                l1: false,
                l2: true
            })
        );
        assert_eq!(tiers_of("GPU"), None);
        assert_eq!(tiers_of(""), None);
    }
}
