//! `kvplane serve`'s flags ([`ServeArgs`], each with its `KVPLANE_SERVE_<FLAG>` twin) and
//! the layers of LMCache's own controller configuration ([`layout`]): its `--config` YAML
//! keys (`controller_host`, `controller_port`, `controller_monitor_ports`,
//! `health_check_interval`, `lmcache_worker_timeout`, `extra_config`), its
//! `LMCACHE_CONTROLLER_<KEY>` variables and `LMCACHE_CONTROLLER_CONFIG_FILE`, and serve's
//! old `KVPLANE_<FLAG>` variables as deprecated aliases. Validation into
//! [`ServeConfig`] names the flag at fault.
//!
//! Parses nothing itself: `crate::service::layers` applies the layers; the binary lists the
//! subcommands.

use crate::config::{self, defaults, ApiToken, ConfigError, MonitorPorts, ServeConfig};
use crate::service::layers::{Alias, Convert, Layout};
use clap::Args;

/// Flags of `kvplane serve`, as given (see [`ServeConfig`] for the validated form). Each
/// flag's variable is `KVPLANE_SERVE_<FLAG>` (set by `service::layers::with_env_twins`); the
/// `env` written below is the flag's old variable, still read as a deprecated alias.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address every socket binds to.
    #[arg(long, env = "KVPLANE_HOST", default_value = defaults::HOST)]
    pub host: String,
    /// HTTP port (API, dashboard, metrics). 0 picks a free port.
    #[arg(long, env = "KVPLANE_PORT", default_value_t = defaults::HTTP_PORT)]
    pub port: u16,
    /// ZMQ ports as JSON, any subset of {"pull","reply","heartbeat"}; a key left out is not
    /// bound. 0 picks a free port.
    #[arg(long, env = "KVPLANE_MONITOR_PORTS", default_value = defaults::MONITOR_PORTS)]
    pub monitor_ports: String,
    /// Deprecated in LMCache and ignored there too (0.5.6 always uses --monitor-ports).
    #[arg(long, env = "KVPLANE_MONITOR_PORT", hide = true)]
    pub monitor_port: Option<u16>,
    /// Also run the LMCache MP coordinator in this process on this port (0 picks one); its
    /// other flags are `kvplane coordinator`'s, from `KVPLANE_COORDINATOR_*` /
    /// `LMCACHE_MP_COORDINATOR_*` and the `coordinator:` section of `--config`.
    #[arg(long, env = "KVPLANE_COORDINATOR_PORT")]
    pub coordinator_port: Option<u16>,
    /// Seconds between liveness sweeps; -1 (or 0) turns them off.
    #[arg(
        long,
        env = "KVPLANE_HEALTH_CHECK_INTERVAL",
        default_value_t = defaults::HEALTH_CHECK_INTERVAL_S,
        allow_hyphen_values = true
    )]
    pub health_check_interval: f64,
    /// Seconds of silence after which a worker is probed, and removed if the probe fails.
    #[arg(long, env = "KVPLANE_LMCACHE_WORKER_TIMEOUT", default_value_t = defaults::WORKER_TIMEOUT_S)]
    pub lmcache_worker_timeout: f64,
    /// Host put in `RegisterRetMsg.heartbeat_url` (default: the bind host, or when that is
    /// 0.0.0.0, 127.0.0.1 for workers on this host and this host's outward address otherwise).
    #[arg(long, env = "KVPLANE_ADVERTISE_HOST")]
    pub advertise_host: Option<String>,
    /// Most liveness probes in flight at once; a sweep over more silent workers probes them
    /// in waves of this size.
    #[arg(long, env = "KVPLANE_MAX_CONCURRENT_PROBES", default_value_t = defaults::MAX_CONCURRENT_PROBES)]
    pub max_concurrent_probes: usize,
    /// Seconds a command on a worker's downlink may take before it fails with a timeout.
    #[arg(long, env = "KVPLANE_DOWNLINK_TIMEOUT", default_value_t = defaults::DOWNLINK_TIMEOUT_S)]
    pub downlink_timeout: f64,
    /// Seconds without progress after which a full sync is marked failed (the worker is then
    /// told to retry on its next heartbeat).
    #[arg(long, env = "KVPLANE_FULL_SYNC_TIMEOUT", default_value_t = defaults::FULL_SYNC_TIMEOUT_S)]
    pub full_sync_timeout: f64,
    /// Fraction of workers whose sync must be complete before workers may leave freeze mode.
    #[arg(
        long,
        env = "KVPLANE_FULL_SYNC_COMPLETION_THRESHOLD",
        default_value_t = defaults::FULL_SYNC_COMPLETION_THRESHOLD
    )]
    pub full_sync_completion_threshold: f64,
    /// Largest frame accepted on any ZMQ socket, in bytes; a peer sending a larger one is
    /// disconnected (counted).
    #[arg(long, env = "KVPLANE_MAX_FRAME_BYTES", default_value_t = defaults::MAX_FRAME_BYTES)]
    pub max_frame_bytes: usize,
    /// Most connections each ZMQ listening socket keeps open at once; connections beyond are
    /// closed at accept and counted.
    #[arg(
        long,
        env = "KVPLANE_MAX_ZMQ_CONNECTIONS",
        default_value_t = defaults::MAX_ZMQ_CONNECTIONS
    )]
    pub max_zmq_connections: usize,
    /// Seconds a ZMQ connection may go, after its handshake, without a complete message
    /// before it is closed and counted; 0 (the default) or -1 = never, since LMCache workers
    /// may be silent for hours (their heartbeat is off by default).
    #[arg(
        long,
        env = "KVPLANE_ZMQ_IDLE_TIMEOUT",
        default_value_t = defaults::ZMQ_IDLE_TIMEOUT_S,
        allow_hyphen_values = true
    )]
    pub zmq_idle_timeout: f64,
    /// Most workers registered at once; registrations (and heartbeats of unknown workers)
    /// beyond are refused with an ErrorMsg.
    #[arg(long, env = "KVPLANE_MAX_WORKERS", default_value_t = defaults::MAX_WORKERS)]
    pub max_workers: usize,
    /// Most keys one worker may hold over all its locations; admits of new keys beyond are
    /// dropped and counted (evicts always apply).
    #[arg(long, env = "KVPLANE_MAX_KEYS_PER_WORKER", default_value_t = defaults::MAX_KEYS_PER_WORKER)]
    pub max_keys_per_worker: u64,
    /// Most operations in one admit/evict batch (and keys in one full-sync batch); larger
    /// batches are dropped whole and counted.
    #[arg(long, env = "KVPLANE_MAX_BATCH_OPS", default_value_t = defaults::MAX_BATCH_OPS)]
    pub max_batch_ops: usize,
    /// Largest HTTP request body, in bytes; larger requests get 413 (4 MiB: a 256k-token
    /// /lookup).
    #[arg(long, env = "KVPLANE_MAX_BODY_BYTES", default_value_t = defaults::MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Most JSON values (list items and fields) in one HTTP request body; bodies with more
    /// get 413 before they are parsed.
    #[arg(long, env = "KVPLANE_MAX_BODY_ITEMS", default_value_t = defaults::MAX_BODY_ITEMS)]
    pub max_body_items: usize,
    /// Most HTTP connections served at once; further connections wait in the accept queue.
    #[arg(long, env = "KVPLANE_MAX_HTTP_CONNECTIONS", default_value_t = defaults::MAX_HTTP_CONNECTIONS)]
    pub max_http_connections: usize,
    /// Seconds a client may take to send a request's headers (counted from when its
    /// connection is idle, so also the keep-alive idle timeout), and then its body; slower
    /// clients are cut off.
    #[arg(long, env = "KVPLANE_HTTP_READ_TIMEOUT", default_value_t = defaults::HTTP_READ_TIMEOUT_S)]
    pub http_read_timeout: f64,
    /// Bearer token the mutating HTTP routes (/clear /pin /compress /decompress /move)
    /// require; unset, they are open to anyone who reaches the HTTP port.
    #[arg(long, env = "KVPLANE_API_TOKEN", hide_env_values = true, value_parser = parse_token)]
    pub api_token: Option<ApiToken>,
    /// With `--api-token`: the read routes (lookups, fleet reads, `/metrics`, the dashboard)
    /// need it too (`/healthz`, `/readyz` and `/openapi.json` never do).
    #[arg(long, env = "KVPLANE_API_TOKEN_READS", requires = "api_token")]
    pub api_token_reads: bool,
    /// Tokens per chunk when HTTP /lookup hashes tokens (LMCache's `chunk_size`).
    #[arg(long, env = "KVPLANE_LOOKUP_CHUNK_SIZE", default_value_t = defaults::LOOKUP_CHUNK_SIZE)]
    pub lookup_chunk_size: usize,
    /// Prefix hash of the first chunk when HTTP /lookup hashes tokens (LMCache's `NONE_HASH`:
    /// 0, or vLLM's when the workers import vLLM); any integer in [-2^63, 2^64-1].
    #[arg(
        long,
        env = "KVPLANE_LOOKUP_NONE_HASH",
        default_value_t = defaults::LOOKUP_NONE_HASH.to_string(),
        allow_hyphen_values = true
    )]
    pub lookup_none_hash: String,
    /// Also run the KV indexer (docs/INDEXER.md) in this process, its HTTP API on this port
    /// (0 picks a free one); its other flags are `kvplane indexer`'s, from its variables and
    /// the `indexer:` section of `--config`.
    #[arg(long, env = "KVPLANE_SERVE_INDEXER_PORT")]
    pub indexer_port: Option<u16>,
    /// Also run the router (docs/ROUTER.md) in this process, its HTTP API on this port (0
    /// picks a free one), beside the indexer of `--indexer-port` (needed), whose index it
    /// asks directly; its other flags are `kvplane router`'s, from `KVPLANE_ROUTER_*` and the
    /// `router:` section of `--config` (without `engine` or `discover`: the engines
    /// registered at that indexer).
    #[arg(long, env = "KVPLANE_SERVE_ROUTER_PORT")]
    pub router_port: Option<u16>,
    /// `--cluster`: hot standby on NATS JetStream (the controller's lease; hosted services
    /// start once this process holds it).
    #[command(flatten)]
    pub cluster: crate::cluster::args::ClusterArgs,
    /// Run as a read replica of the cluster's controller (needs `--cluster`, from any of its sources: checked after the
    /// configuration layers, so `KVPLANE_CLUSTER` and a config file count): follow the
    /// leader's change log and serve the read routes on `--port` (no ZMQ socket, never the
    /// lease; commands answer 409).
    #[arg(long, env = "KVPLANE_SERVE_REPLICA")]
    pub replica: bool,
}

fn parse_token(s: &str) -> Result<ApiToken, std::convert::Infallible> {
    Ok(ApiToken::new(s))
}

impl ServeArgs {
    /// Validates the flags into the library's configuration.
    ///
    /// # Errors
    /// [`ConfigError`] naming the flag at fault.
    pub fn validate(&self) -> Result<ServeConfig, ConfigError> {
        Ok(ServeConfig {
            host: self.host.clone(),
            http_port: self.port,
            monitor_ports: MonitorPorts::from_json(&self.monitor_ports)?,
            health_check_interval: config::period_or_off(
                "health-check-interval",
                self.health_check_interval,
            )?,
            worker_timeout: config::positive_seconds(
                "lmcache-worker-timeout",
                self.lmcache_worker_timeout,
            )?,
            advertise_host: self.advertise_host.clone().filter(|h| !h.is_empty()),
            downlink_timeout: config::positive_seconds("downlink-timeout", self.downlink_timeout)?,
            max_concurrent_probes: config::at_least_one(
                "max-concurrent-probes",
                self.max_concurrent_probes,
            )?,
            full_sync_timeout: config::positive_seconds(
                "full-sync-timeout",
                self.full_sync_timeout,
            )?,
            full_sync_completion_threshold: config::fraction(
                "full-sync-completion-threshold",
                self.full_sync_completion_threshold,
            )?,
            max_frame_bytes: config::at_least_one("max-frame-bytes", self.max_frame_bytes)?,
            max_zmq_connections: config::at_least_one(
                "max-zmq-connections",
                self.max_zmq_connections,
            )?,
            zmq_idle_timeout: config::period_or_off("zmq-idle-timeout", self.zmq_idle_timeout)?,
            max_workers: config::at_least_one("max-workers", self.max_workers)?,
            max_keys_per_worker: self.max_keys_per_worker,
            max_batch_ops: config::at_least_one("max-batch-ops", self.max_batch_ops)?,
            max_body_bytes: config::at_least_one("max-body-bytes", self.max_body_bytes)?,
            max_body_items: config::at_least_one("max-body-items", self.max_body_items)?,
            max_http_connections: config::at_least_one(
                "max-http-connections",
                self.max_http_connections,
            )?,
            http_read_timeout: config::positive_seconds(
                "http-read-timeout",
                self.http_read_timeout,
            )?,
            api_token: self.api_token.clone().and_then(ApiToken::non_empty),
            api_token_reads: self.api_token_reads,
            lookup_chunk_size: config::at_least_one("lookup-chunk-size", self.lookup_chunk_size)?,
            lookup_none_hash: config::chunk_hash("lookup-none-hash", &self.lookup_none_hash)?,
        })
    }
}

/// The `LMCACHE_CONTROLLER_*` variables and config-file keys of LMCache's controller, with
/// the flag each sets and how its text is read (LMCache reads its numbers with `int()`).
const LMCACHE: &[(&str, &str, Convert)] = &[
    ("controller_host", "host", Convert::Unquoted),
    ("controller_port", "port", Convert::Int),
    (
        "controller_monitor_ports",
        "monitor-ports",
        Convert::Unquoted,
    ),
    (
        "health_check_interval",
        "health-check-interval",
        Convert::Int,
    ),
    (
        "lmcache_worker_timeout",
        "lmcache-worker-timeout",
        Convert::Int,
    ),
];

/// The sections of `serve`'s `--config` file that hold the settings of a service it runs in
/// its process (`--coordinator-port`, `--indexer-port`, `--router-port`), by that service's
/// flag names (`crate::service::layers::parse_embedded`).
pub const EMBEDDED: &[&str] = &["coordinator", "indexer", "router"];

/// `serve`'s layers: its old `KVPLANE_<FLAG>` variables (deprecated, before LMCache's),
/// then LMCache's `LMCACHE_CONTROLLER_<KEY>` variables (`_EXTRA_CONFIG` a JSON object of
/// more settings by flag name), then the file (`--config`, else
/// `LMCACHE_CONTROLLER_CONFIG_FILE`) with LMCache's keys or the flags' names.
/// `old_vars` are the variables the derive names (flag → variable).
#[must_use]
pub fn layout(old_vars: &[(String, String)]) -> Layout {
    let mut aliases: Vec<Alias> = old_vars
        .iter()
        .filter(|(flag, var)| *var != crate::service::layers::twin("SERVE", flag))
        .map(|(flag, var)| Alias {
            var: var.clone(),
            flag: flag.clone(),
            convert: Convert::Text,
            deprecated: true,
        })
        .collect();
    aliases.extend(LMCACHE.iter().map(|(key, flag, convert)| Alias {
        var: format!("LMCACHE_CONTROLLER_{}", key.to_ascii_uppercase()),
        flag: (*flag).to_string(),
        convert: *convert,
        deprecated: false,
    }));
    Layout {
        service: "SERVE",
        file_vars: vec!["LMCACHE_CONTROLLER_CONFIG_FILE".into()],
        aliases,
        file_keys: LMCACHE.iter().map(|(k, f, _)| (*k, *f)).collect(),
        nested: vec!["extra_config"],
        nested_vars: vec!["LMCACHE_CONTROLLER_EXTRA_CONFIG".into()],
        sections: EMBEDDED.to_vec(),
    }
}
