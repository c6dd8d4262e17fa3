//! The coordinator's configuration: [`CoordinatorConfig`], what `start` runs, with the
//! documented defaults ([`CoordinatorConfig::with_defaults`]); [`args`] its flags and their
//! layers, validated into it (LMCache 0.5.6's further flags in `args_056.rs`).

pub mod args;
mod args_056;

use crate::coordinator::model::ModelConfig;
use crate::coordinator::state::checkpoint::CheckpointConfig;
use crate::coordinator::state::resync::ResyncConfig;
use crate::coordinator::state::tap::Tap;
use std::time::Duration;

/// The validated `kvplane coordinator` configuration.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// Bind host.
    pub host: String,
    /// Bind port (0 picks one).
    pub port: u16,
    /// Silence after which an instance is removed.
    pub instance_timeout: Duration,
    /// Between health sweeps (`None`: off).
    pub health_check_interval: Option<Duration>,
    /// Between eviction cycles (`None`: off).
    pub eviction_check_interval: Option<Duration>,
    /// Idle keep-alive of the HTTP server (accepted for compatibility; see docs).
    pub timeout_keep_alive: Duration,
    /// Tokens per chunk on the MP servers (prefetch `noop` rule).
    pub chunk_size: usize,
    /// Deadline of each call to an MP server.
    pub outbound_timeout: Duration,
    /// The HTTP limits: body bytes and JSON values, connections, read timeout.
    pub http: crate::web::HttpLimits,
    /// Most events in one request.
    pub max_events_per_request: usize,
    /// Limits and eviction settings of the model.
    pub model: ModelConfig,
    /// Startup resync (`None`: off).
    pub resync: Option<ResyncConfig>,
    /// Where quotas and pins are kept across restarts (`None`: not kept).
    pub metadata_path: Option<std::path::PathBuf>,
    /// The default quota at start, GiB (`--default-quota-gb`; `None`: salts without a quota
    /// are exempt, 0.5.6's boot state; `Some(0.0)`: the seed document's allowlist). A
    /// `--metadata-path` file that holds a default quota replaces it.
    pub default_quota_gb: Option<f64>,
    /// `--enable-blend-lookup`: the probe stride (`None`: off).
    pub blend_probe_stride: Option<usize>,
    /// `--checkpoint-path` / `--checkpoint-interval` (`None`: off).
    pub checkpoint: Option<CheckpointConfig>,
    /// Optional parts (`--extra-config`, `--disable-metrics`).
    pub features: Features,
    /// `--api-token` and its scope (docs/COORDINATOR.md, "Authentication").
    pub auth: crate::web::access::Auth,
    /// Sees every applied batch (`kvplane serve` feeds its indexer; `None`: off).
    pub tap: Option<Tap>,
}

/// Parts of the coordinator an operator can turn off, as in 0.5.6.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// The eviction loop and the `/quota*`, `/cache/pins` routes (0.5.6's
    /// `FleetEvictionController`; off with `--extra-config
    /// '{"disabled_controllers": ["FleetEvictionController"]}'`).
    pub eviction_controller: bool,
    /// `GET /metrics` (off with `--disable-metrics`).
    pub metrics: bool,
}

impl Default for Features {
    fn default() -> Self {
        Features {
            eviction_controller: true,
            metrics: true,
        }
    }
}

impl CoordinatorConfig {
    /// The documented defaults on `host:port`.
    pub fn with_defaults(host: impl Into<String>, port: u16) -> Self {
        use crate::config::defaults::coordinator as d;
        CoordinatorConfig {
            host: host.into(),
            port,
            instance_timeout: Duration::from_secs_f64(d::INSTANCE_TIMEOUT_S),
            health_check_interval: Some(Duration::from_secs_f64(d::HEALTH_CHECK_INTERVAL_S)),
            eviction_check_interval: Some(Duration::from_secs_f64(d::EVICTION_CHECK_INTERVAL_S)),
            timeout_keep_alive: Duration::from_secs(d::TIMEOUT_KEEP_ALIVE_S),
            chunk_size: d::CHUNK_SIZE,
            outbound_timeout: Duration::from_secs_f64(d::OUTBOUND_TIMEOUT_S),
            http: crate::web::HttpLimits {
                max_body_bytes: d::MAX_BODY_BYTES,
                max_body_items: d::MAX_BODY_ITEMS,
                max_connections: d::MAX_HTTP_CONNECTIONS,
                read_timeout: Duration::from_secs_f64(d::HTTP_READ_TIMEOUT_S),
            },
            max_events_per_request: d::MAX_EVENTS_PER_REQUEST,
            model: ModelConfig {
                max_instances: d::MAX_INSTANCES,
                max_tracked_keys: d::MAX_TRACKED_KEYS,
                max_quotas: d::MAX_QUOTAS,
                eviction_ratio: d::EVICTION_RATIO,
                trigger_watermark: d::TRIGGER_WATERMARK,
            },
            resync: Some(ResyncConfig {
                poll_interval: Duration::from_secs_f64(d::RESYNC_POLL_INTERVAL_S),
                max_wait: Duration::from_secs_f64(d::RESYNC_MAX_WAIT_S),
                page_size: d::RESYNC_PAGE_SIZE,
            }),
            metadata_path: None,
            default_quota_gb: None,
            blend_probe_stride: None,
            checkpoint: None,
            features: Features::default(),
            auth: crate::web::access::Auth::default(),
            tap: None,
        }
    }
}
