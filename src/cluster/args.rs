//! `--cluster` and its settings as flags, shared by every service that replicates
//! ([`ClusterArgs`]), validated into [`ClusterConfig`] naming the flag at fault.

use super::ClusterConfig;
use crate::config::ConfigError;
use clap::Args;

/// The smallest `--cluster-max-bytes`.
pub const MIN_MAX_BYTES: i64 = 1 << 20;

/// `--cluster` and its settings, shared by `serve` and `coordinator` (each flag's variable is
/// the service's twin, `KVPLANE_SERVE_CLUSTER`…; the `env` below is the old shared name,
/// read as a deprecated alias).
#[derive(Debug, Clone, Default, Args)]
pub struct ClusterArgs {
    /// NATS JetStream for hot standby, `nats://HOST:PORT` (docs/CLUSTER.md): the process
    /// follows the leader's change log without binding any port, and serves once it holds
    /// the cluster's lease.
    #[arg(long, env = "KVPLANE_CLUSTER")]
    pub cluster: Option<String>,
    /// The cluster's name, so several fleets can share one NATS (A-Z a-z 0-9 _ -).
    #[arg(long, env = "KVPLANE_CLUSTER_NAME", default_value = crate::config::defaults::cluster::NAME)]
    pub cluster_name: String,
    /// Most bytes the cluster's change stream keeps (oldest dropped first).
    #[arg(long, env = "KVPLANE_CLUSTER_MAX_BYTES", default_value_t = crate::config::defaults::cluster::MAX_BYTES)]
    pub cluster_max_bytes: i64,
    /// Seconds the lease lasts without renewal (renewed every quarter of it): a standby takes
    /// over at most this long after the leader dies.
    #[arg(long, env = "KVPLANE_CLUSTER_LEASE_TTL", default_value_t = crate::config::defaults::cluster::LEASE_TTL_S)]
    pub cluster_lease_ttl: f64,
    /// With `--cluster`: a standby (or a controller replica) publishes a snapshot of what it
    /// follows every this many records (at most every 10 s; 0: never), so a follower starting
    /// later restores it instead of replaying the whole log.
    #[arg(long, env = "KVPLANE_CLUSTER_SNAPSHOT_RECORDS", default_value_t = crate::config::defaults::cluster::SNAPSHOT_RECORDS)]
    pub cluster_snapshot_records: u64,
}

impl ClusterArgs {
    /// The `--cluster` settings, if any.
    pub fn config(&self) -> Result<Option<ClusterConfig>, ConfigError> {
        let Some(url) = &self.cluster else {
            return Ok(None);
        };
        if !(self.cluster_lease_ttl.is_finite() && (0.1..=600.0).contains(&self.cluster_lease_ttl))
        {
            return Err(ConfigError::Value {
                flag: "cluster-lease-ttl",
                detail: format!(
                    "{} is not between 0.1 and 600 seconds",
                    self.cluster_lease_ttl
                ),
            });
        }
        // A stream smaller than 1 MiB cannot hold a snapshot part: refused, not raised.
        if self.cluster_max_bytes < MIN_MAX_BYTES {
            return Err(ConfigError::Value {
                flag: "cluster-max-bytes",
                detail: format!(
                    "{} is below the smallest stream, {MIN_MAX_BYTES} bytes",
                    self.cluster_max_bytes
                ),
            });
        }
        Ok(Some(ClusterConfig {
            name: self.cluster_name.clone(),
            max_bytes: self.cluster_max_bytes,
            lease_ttl: std::time::Duration::from_secs_f64(self.cluster_lease_ttl),
            snapshot_records: self.cluster_snapshot_records,
            ..ClusterConfig::new(url.clone())
        }))
    }
}
