//! The node as a controller's LMCache worker (`--controller-pull`, `--controller-reply`):
//! what each tier holds reported through `kvplane::worker` (`report`), the controller's
//! commands answered (`commands`), and `/move`'s PUTs to another node over `lm://` (`peer`).

pub(crate) mod commands;
mod peer;
pub(crate) mod report;

use crate::node::metrics::NodeMetrics;
use crate::node::tiers::{TierId, TieredStore};
use crate::worker::LOCAL_CPU_BACKEND;
use std::sync::Arc;

/// LMCache's name of its local-disk backend (`str(LocalDiskBackend)`), the L2 location.
pub(crate) const LOCAL_DISK_BACKEND: &str = "LocalDiskBackend";

/// The controller location of a tier.
pub(crate) fn location(tier: TierId) -> &'static str {
    match tier {
        TierId::L1 => LOCAL_CPU_BACKEND,
        TierId::L2 => LOCAL_DISK_BACKEND,
    }
}

/// The tier a controller location names.
pub(crate) fn tier_of(loc: &str) -> Option<TierId> {
    if loc == location(TierId::L1) {
        Some(TierId::L1)
    } else if loc == location(TierId::L2) {
        Some(TierId::L2)
    } else {
        None
    }
}

/// Starts the controller worker of one TP rank: worker id = the rank, commands and full
/// syncs limited to that rank's keys. Rank 0 binds `--controller-command-port`, the others
/// a free port each.
pub(crate) struct RankWorkers {
    pub(crate) config: crate::worker::WorkerConfig,
    pub(crate) tiers: Arc<TieredStore>,
    pub(crate) metrics: Arc<NodeMetrics>,
    pub(crate) commands: Arc<commands::CommandConfig>,
    pub(crate) reporter: Arc<report::ControllerReporter>,
}

impl RankWorkers {
    pub(crate) async fn start(&self, rank: u32) -> Result<(), crate::worker::WorkerError> {
        let mut wc = self.config.clone();
        wc.worker_id = i64::from(rank);
        if rank != 0 {
            wc.command_port = 0;
        }
        let handler = commands::NodeCommands {
            tiers: Arc::clone(&self.tiers),
            metrics: Arc::clone(&self.metrics),
            config: Arc::clone(&self.commands),
            rank: Some(rank),
        };
        let keys = report::ReportedKeys {
            reporter: Arc::clone(&self.reporter),
            rank,
        };
        let worker = crate::worker::Worker::start(wc, handler, keys).await?;
        tracing::info!(rank, "controller worker started for TP rank {rank}");
        self.reporter.attach(rank, worker);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_name_one_tier_each() {
        assert_eq!(tier_of("LocalCPUBackend"), Some(TierId::L1));
        assert_eq!(tier_of("LocalDiskBackend"), Some(TierId::L2));
        assert_eq!(tier_of("GPU"), None);
        assert_eq!(tier_of(""), None);
    }
}
