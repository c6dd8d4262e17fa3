//! `kvplane coordinator`'s flags ([`CoordinatorArgs`]) and their layers ([`layout`]): each
//! flag's `KVPLANE_COORDINATOR_<FLAG>` twin, then LMCache's documented
//! `LMCACHE_MP_COORDINATOR_<FLAG>`, then the `--config` file (by flag name), then the default
//! (`crate::service::layers` applies them). Validation into [`CoordinatorConfig`] names the
//! flag at fault and never clamps. [`embedded`] reads the same flags for the coordinator
//! that `kvplane serve --coordinator-port` runs.
//!
//! Parses nothing from the process itself: the binary's command line and `serve` call in.

use super::args_056 as v056;
use super::CoordinatorConfig;
use crate::config::{self, defaults::coordinator as d, ConfigError};
use crate::coordinator::state::resync::ResyncConfig;
use crate::service::layers::{self, Alias, Convert, Embedded, LayerError, Layout};
use clap::{Args, Command};
use std::time::Duration;

/// Flags of `kvplane coordinator` (the LMCache MP coordinator), as given.
#[derive(Debug, Clone, Args)]
#[command(
    mut_arg("api_token", |a| a.env("KVPLANE_COORDINATOR_API_TOKEN")),
    mut_arg("api_token_reads", |a| a.env("KVPLANE_COORDINATOR_API_TOKEN_READS")),
    mut_arg("api_token_peers", |a| a.env("KVPLANE_COORDINATOR_API_TOKEN_PEERS"))
)]
pub struct CoordinatorArgs {
    /// `--api-token` and its scope (the MP servers' own routes stay open without
    /// `--api-token-peers`: LMCache 0.5.6's MP server sends no token).
    #[command(flatten)]
    pub auth: crate::web::access::AuthArgs,
    /// Bind host.
    #[arg(long, default_value = config::defaults::HOST)]
    pub host: String,
    /// HTTP port; 0 picks a free one.
    #[arg(long, default_value_t = d::PORT)]
    pub port: u16,
    /// Seconds without a heartbeat before an MP server is removed.
    #[arg(long, default_value_t = d::INSTANCE_TIMEOUT_S, allow_hyphen_values = true)]
    instance_timeout: f64,
    /// Seconds between health sweeps; 0 disables.
    #[arg(long, default_value_t = d::HEALTH_CHECK_INTERVAL_S, allow_hyphen_values = true)]
    health_check_interval: f64,
    /// Seconds between eviction cycles; 0 disables.
    #[arg(long, default_value_t = d::EVICTION_CHECK_INTERVAL_S, allow_hyphen_values = true)]
    eviction_check_interval: f64,
    /// Fraction (0..=1) of an over-quota salt's keys evicted per cycle.
    #[arg(long, default_value_t = d::EVICTION_RATIO, allow_hyphen_values = true)]
    eviction_ratio: f64,
    /// Evict when usage reaches this fraction (0, 1] of the quota.
    #[arg(long, default_value_t = d::TRIGGER_WATERMARK, allow_hyphen_values = true)]
    trigger_watermark: f64,
    /// Idle keep-alive seconds (accepted; see docs/COORDINATOR.md).
    #[arg(long, default_value_t = d::TIMEOUT_KEEP_ALIVE_S)]
    timeout_keep_alive: u64,
    /// Tokens per chunk on the MP servers (prefetch noop rule) [default 256].
    #[arg(long)]
    chunk_size: Option<usize>,
    /// Startup resync on or off (1/0, true/false, yes/no, on/off).
    #[arg(
        long,
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    enable_startup_resync: bool,
    /// Seconds between registration checks of the startup resync.
    #[arg(long, default_value_t = 1.0, allow_hyphen_values = true)]
    resync_poll_interval: f64,
    /// Seconds the startup resync waits for a server.
    #[arg(long, default_value_t = 60.0, allow_hyphen_values = true)]
    resync_max_wait: f64,
    /// page_size of the resync's GET /cache/objects.
    #[arg(long, default_value_t = 1000)]
    resync_page_size: usize,
    /// Largest request body, bytes (413 beyond).
    #[arg(long, default_value_t = d::MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// Most JSON values in one request body (413 beyond).
    #[arg(long, default_value_t = d::MAX_BODY_ITEMS)]
    max_body_items: usize,
    /// Most HTTP connections served at once.
    #[arg(long, default_value_t = d::MAX_HTTP_CONNECTIONS)]
    max_http_connections: usize,
    /// Seconds to send a request's headers (also the idle keep-alive), then its body.
    #[arg(long, default_value_t = d::HTTP_READ_TIMEOUT_S, allow_hyphen_values = true)]
    http_read_timeout: f64,
    /// File where quotas and pins are kept across restarts (empty: not kept).
    #[arg(long)]
    metadata_path: Option<String>,
    /// Default quota in GiB of salts without one, at start (0: the seed document's
    /// allowlist; unset or null: exempt, as LMCache 0.5.6).
    #[arg(long, allow_hyphen_values = true)]
    default_quota_gb: Option<String>,
    /// LMCache 0.5.6's further flags (checkpoint, blend, hash, extra config, metrics,
    /// transport).
    #[command(flatten)]
    v056: Box<v056::Args056>,
    /// `--cluster`: a hot standby on NATS JetStream until it holds the coordinator lease
    /// (docs/CLUSTER.md).
    #[command(flatten)]
    pub cluster: crate::cluster::args::ClusterArgs,
}

/// The coordinator's layers: LMCache's `LMCACHE_MP_COORDINATOR_<FLAG>` for every flag,
/// after the twins (`KVPLANE_COORDINATOR_<FLAG>`), before the file.
#[must_use]
pub fn layout() -> Layout {
    let cmd = CoordinatorArgs::augment_args(Command::new("coordinator"));
    let aliases = cmd
        .get_arguments()
        .filter_map(|a| a.get_long())
        .filter(|f| *f != "help")
        .map(|flag| Alias {
            var: format!(
                "LMCACHE_MP_COORDINATOR_{}",
                flag.replace('-', "_").to_ascii_uppercase()
            ),
            flag: flag.to_string(),
            convert: Convert::Text,
            deprecated: false,
        })
        .collect();
    Layout {
        service: "COORDINATOR",
        aliases,
        ..Layout::default()
    }
}

/// The coordinator run inside `kvplane serve --coordinator-port PORT`: the same flags, read
/// from the coordinator's variables (its twins, LMCache's) and `at.file` (the
/// `coordinator:` section of serve's `--config`), on serve's host and `PORT`. `--cluster`
/// is refused: a coordinator hosted by serve is not replicated.
///
/// # Errors
/// A value is refused, naming the flag and where it came from.
pub fn embedded(at: &Embedded<'_>) -> Result<CoordinatorConfig, LayerError> {
    let (args, prov) = at.parse::<CoordinatorArgs>(&layout())?;
    let explain = |e: ConfigError| LayerError(prov.explain(&e.to_string()));
    let replicated = args.cluster.config().map_err(explain)?.is_some();
    layers::refuse_given(
        &prov,
        [(
            replicated,
            "--cluster: a coordinator run by kvplane serve is not replicated; run \
             `kvplane coordinator --cluster` on its own"
                .to_string(),
        )],
    )?;
    args.validate().map_err(explain)
}

fn off_or_period(flag: &'static str, v: f64) -> Result<Option<Duration>, ConfigError> {
    if v == 0.0 {
        Ok(None)
    } else {
        config::positive_seconds(flag, v).map(Some)
    }
}

pub(super) fn refuse(flag: &'static str, detail: impl Into<String>) -> ConfigError {
    ConfigError::Value {
        flag,
        detail: detail.into(),
    }
}

impl CoordinatorArgs {
    /// The validated configuration.
    ///
    /// # Errors
    /// [`ConfigError::Value`] naming the flag whose value is out of range.
    pub fn validate(&self) -> Result<CoordinatorConfig, ConfigError> {
        let mut c = CoordinatorConfig::with_defaults(self.host.clone(), self.port);
        c.instance_timeout = config::positive_seconds("instance-timeout", self.instance_timeout)?;
        c.health_check_interval =
            off_or_period("health-check-interval", self.health_check_interval)?;
        c.eviction_check_interval =
            off_or_period("eviction-check-interval", self.eviction_check_interval)?;
        c.model.eviction_ratio = config::fraction("eviction-ratio", self.eviction_ratio)?;
        let wm = self.trigger_watermark;
        if !(wm > 0.0 && wm <= 1.0) {
            return Err(refuse(
                "trigger-watermark",
                format!("{wm} is not in (0, 1]"),
            ));
        }
        c.model.trigger_watermark = wm;
        c.timeout_keep_alive = Duration::from_secs(config::at_least_one(
            "timeout-keep-alive",
            self.timeout_keep_alive,
        )?);
        c.chunk_size =
            config::at_least_one("chunk-size", self.chunk_size.unwrap_or(d::CHUNK_SIZE))?;
        self.v056.apply(self.chunk_size.is_some(), &mut c)?;
        c.http.max_body_bytes = config::at_least_one("max-body-bytes", self.max_body_bytes)?;
        c.http.max_body_items = config::at_least_one("max-body-items", self.max_body_items)?;
        c.http.max_connections =
            config::at_least_one("max-http-connections", self.max_http_connections)?;
        c.http.read_timeout =
            config::positive_seconds("http-read-timeout", self.http_read_timeout)?;
        let resync = ResyncConfig {
            poll_interval: config::positive_seconds(
                "resync-poll-interval",
                self.resync_poll_interval,
            )?,
            max_wait: config::seconds("resync-max-wait", self.resync_max_wait)?,
            page_size: config::at_least_one("resync-page-size", self.resync_page_size)?,
        };
        c.resync = self.enable_startup_resync.then_some(resync);
        c.metadata_path = self
            .metadata_path
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(std::path::PathBuf::from);
        c.default_quota_gb = match self.default_quota_gb.as_deref().map(str::trim) {
            None | Some("" | "null") => None,
            Some(t) => match t.parse::<f64>() {
                Ok(gb) if gb.is_finite() && (0.0..8.0e9).contains(&gb) => Some(gb),
                _ => {
                    return Err(refuse(
                        "default-quota-gb",
                        format!("{t:?} is not a limit in GiB (0 up to 8e9, or null)"),
                    ))
                }
            },
        };
        c.auth = crate::web::access::Auth::from(&self.auth);
        Ok(c)
    }
}

#[cfg(test)]
#[path = "args_tests.rs"]
mod tests;
