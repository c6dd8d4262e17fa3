//! The controller's shared state: the index behind one lock, the downlinks, the metrics.

use super::downlink::Downlink;
use crate::config::ServeConfig;
use crate::index::{Index, IndexConfig};
use crate::metrics::Metrics;
use dashmap::DashMap;
use parking_lot::RwLock;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// `(instance_id, worker_id)`: how LMCache names a worker.
pub type WorkerKey = (String, i64);

/// A worker's downlink and the registration it belongs to.
#[derive(Clone, Debug)]
pub struct DownlinkEntry {
    /// Bumped at every (re-)registration; a probe only removes the registration it probed.
    pub generation: u64,
    /// The command channel.
    pub downlink: Downlink,
}

/// Addresses the server actually bound (port 0 resolved).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoundAddrs {
    /// HTTP API.
    pub http: SocketAddr,
    /// PULL socket, if configured.
    pub pull: Option<SocketAddr>,
    /// Reply ROUTER, if configured.
    pub reply: Option<SocketAddr>,
    /// Heartbeat ROUTER, if configured.
    pub heartbeat: Option<SocketAddr>,
}

/// Everything the socket loops, the liveness sweep and the HTTP handlers share.
pub struct Shared {
    /// The registry and chunk index. Never held across an `.await`.
    pub index: RwLock<Index>,
    /// One downlink per registered worker.
    pub downlinks: DashMap<WorkerKey, DownlinkEntry>,
    /// Metrics registry.
    pub metrics: Metrics,
    /// Validated configuration.
    pub config: ServeConfig,
    /// Heartbeat ROUTER port, once bound (for `heartbeat_url`).
    pub heartbeat_port: Option<u16>,
    generation: AtomicU64,
}

impl Shared {
    /// Creates the state for a server with this configuration.
    pub fn new(config: ServeConfig, heartbeat_port: Option<u16>) -> Self {
        let index = Index::with_config(IndexConfig {
            sync_completion_threshold: config.full_sync_completion_threshold,
            ..IndexConfig::default()
        });
        Shared {
            index: RwLock::new(index),
            downlinks: DashMap::new(),
            metrics: Metrics::new(),
            config,
            heartbeat_port,
            generation: AtomicU64::new(0),
        }
    }

    /// (Re)opens the downlink of a worker at `ip:port`.
    pub fn open_downlink(&self, key: WorkerKey, ip: &str, port: u16) {
        let endpoint = host_port(ip, port);
        let downlink =
            Downlink::spawn(endpoint, self.config.downlink_timeout, self.metrics.clone());
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        self.downlinks.insert(
            key,
            DownlinkEntry {
                generation,
                downlink,
            },
        );
    }

    /// The downlink of a worker, if it is registered.
    pub fn downlink(&self, instance_id: &str, worker_id: i64) -> Option<DownlinkEntry> {
        self.downlinks
            .get(&(instance_id.to_owned(), worker_id))
            .map(|e| e.value().clone())
    }

    /// Closes a worker's downlink (its task ends once in-flight commands finish).
    pub fn close_downlink(&self, instance_id: &str, worker_id: i64) {
        self.downlinks.remove(&(instance_id.to_owned(), worker_id));
    }

    /// Refreshes the gauges that mirror the index.
    pub fn refresh_gauges(&self) {
        let workers = self.index.read().worker_count();
        self.metrics
            .workers
            .set(i64::try_from(workers).unwrap_or(i64::MAX));
    }
}

/// `host:port`, with IPv6 hosts in brackets.
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Wall-clock Unix seconds (the unit of LMCache's `registration_time`).
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
