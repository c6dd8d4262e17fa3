//! The node as a controller's LMCache worker (`--controller-pull`, `--controller-reply`):
//! what each tier holds reported through `kvplane::worker` (`report`), the controller's
//! commands answered (`commands`), and `/move`'s PUTs to another node over `lm://` (`peer`).

pub(crate) mod commands;
mod peer;
pub(crate) mod report;

use crate::net::host_port;
use crate::node::config::NodeConfig;
use crate::node::metrics::NodeMetrics;
use crate::node::model::keys::TokenChunks;
use crate::node::tiers::{TierId, TieredStore};
use crate::service::StartError;
use crate::worker::{WorkerConfig, LOCAL_CPU_BACKEND};
use report::ControllerReporter;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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

/// The node's controller workers, one per TP rank: worker id = the rank, commands and full
/// syncs limited to that rank's keys. Rank 0 binds `--controller-command-port`, the others a
/// free port each.
pub(crate) struct RankWorkers {
    config: WorkerConfig,
    tiers: Arc<TieredStore>,
    metrics: Arc<NodeMetrics>,
    commands: Arc<commands::CommandConfig>,
    reporter: Arc<ControllerReporter>,
}

impl RankWorkers {
    /// The workers of a node whose `lm://` listener is on `lm_port`: the `peer_init_url` they
    /// register is `--peer-url`, else the advertised ip (or the local address of the route to
    /// the controller) and that port.
    pub(crate) async fn new(
        worker: &WorkerConfig,
        node: &NodeConfig,
        lm_port: u16,
        tiers: Arc<TieredStore>,
        metrics: Arc<NodeMetrics>,
        chunks: TokenChunks,
        reporter: Arc<ControllerReporter>,
    ) -> Self {
        let peer_url = match &node.peer_url {
            Some(u) => u.clone(),
            None => {
                let ip = match &worker.advertise_ip {
                    Some(ip) => ip.clone(),
                    None => crate::node::coordinator_link::route_ip(&worker.controller_reply).await,
                };
                host_port(&ip, lm_port)
            }
        };
        let mut config = worker.clone();
        config.peer_init_url = Some(peer_url.clone());
        RankWorkers {
            config,
            tiers,
            metrics,
            commands: Arc::new(commands::CommandConfig {
                chunks,
                peer_url,
                peer_timeout: node.read_timeout,
            }),
            reporter,
        }
    }

    /// Starts rank 0 always (the node registers even when empty), then every rank its keys
    /// name: those recovered from L2 now, later ones as they arrive (on `tasks`, until
    /// `shutdown`). `tp_ranks` more are registered at once.
    pub(crate) async fn start_all(
        self,
        tp_ranks: u32,
        shutdown: &CancellationToken,
        tasks: &TaskTracker,
    ) -> Result<(), StartError> {
        let failed = |e| StartError::resource("start reporting to the controller", e);
        for rank in 0..tp_ranks.clamp(1, report::MAX_RANKS) {
            self.reporter.request(rank);
            self.start(rank).await.map_err(failed)?;
        }
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for rank in self.reporter.on_new_ranks(tx) {
            self.start(rank).await.map_err(failed)?;
        }
        let stop = shutdown.clone();
        tasks.spawn(async move {
            loop {
                let rank = tokio::select! {
                    () = stop.cancelled() => return,
                    r = rx.recv() => match r { Some(r) => r, None => return },
                };
                if let Err(e) = self.start(rank).await {
                    tracing::error!(
                        rank,
                        "cannot start the controller worker of TP rank {rank}: {e}"
                    );
                }
            }
        });
        Ok(())
    }

    async fn start(&self, rank: u32) -> Result<(), crate::worker::WorkerError> {
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

/// Shuts every controller worker of `reporter` down (deregistering each rank).
pub(crate) async fn stop(reporter: &ControllerReporter) {
    for (rank, w) in reporter.workers() {
        if let Err(e) = w.shutdown().await {
            tracing::warn!(rank, "controller worker shutdown: {e}");
        }
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
