//! Command-line and environment configuration, validated once.
//!
//! Flags and defaults follow LMCache's `lmcache_controller` (`--host`, `--port`,
//! `--monitor-ports`, `--health-check-interval`, `--lmcache-worker-timeout`); every flag also
//! reads `KVPLANE_<FLAG>` from the environment. kvplane's own flags come after them.

use crate::protocol::ChunkHash;
use clap::{Args, Parser, Subcommand};
use serde::Deserialize;
use std::time::Duration;
use thiserror::Error;

/// `kvplane`: a control plane for distributed LLM KV caches.
#[derive(Debug, Parser)]
#[command(name = "kvplane", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controller (LMCache 0.5.6 compatible).
    Serve(ServeArgs),
    /// Load-test an LMCache-compatible controller (kvplane or LMCache's own).
    Bench(crate::bench::BenchArgs),
}

/// Flags of `kvplane serve`, as given (see [`ServeConfig`] for the validated form).
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address every socket binds to.
    #[arg(long, env = "KVPLANE_HOST", default_value = "0.0.0.0")]
    pub host: String,
    /// HTTP port (API, dashboard, metrics). 0 picks a free port.
    #[arg(long, env = "KVPLANE_PORT", default_value_t = 9000)]
    pub port: u16,
    /// ZMQ ports as JSON, any subset of {"pull","reply","heartbeat"}; a key left out is not
    /// bound. 0 picks a free port.
    #[arg(
        long,
        env = "KVPLANE_MONITOR_PORTS",
        default_value = r#"{"pull": 8300, "reply": 8400, "heartbeat": 8082}"#
    )]
    pub monitor_ports: String,
    /// Deprecated in LMCache and ignored there too (0.5.6 always uses --monitor-ports).
    #[arg(long, env = "KVPLANE_MONITOR_PORT", hide = true)]
    pub monitor_port: Option<u16>,
    /// Seconds between liveness sweeps; -1 turns them off.
    #[arg(
        long,
        env = "KVPLANE_HEALTH_CHECK_INTERVAL",
        default_value_t = 10.0,
        allow_hyphen_values = true
    )]
    pub health_check_interval: f64,
    /// Seconds of silence after which a worker is probed, and removed if the probe fails.
    #[arg(long, env = "KVPLANE_LMCACHE_WORKER_TIMEOUT", default_value_t = 300.0)]
    pub lmcache_worker_timeout: f64,
    /// Host put in `RegisterRetMsg.heartbeat_url` (default: the bind host, or when that is
    /// 0.0.0.0, 127.0.0.1 for workers on this host and this host's outward address otherwise).
    #[arg(long, env = "KVPLANE_ADVERTISE_HOST")]
    pub advertise_host: Option<String>,
    /// Most liveness probes in flight at once; a sweep over more silent workers probes them
    /// in waves of this size.
    #[arg(long, env = "KVPLANE_MAX_CONCURRENT_PROBES", default_value_t = 64)]
    pub max_concurrent_probes: usize,
    /// Seconds a command on a worker's downlink may take before it fails with a timeout.
    #[arg(long, env = "KVPLANE_DOWNLINK_TIMEOUT", default_value_t = 5.0)]
    pub downlink_timeout: f64,
    /// Seconds without progress after which a full sync is marked failed (the worker is then
    /// told to retry on its next heartbeat).
    #[arg(long, env = "KVPLANE_FULL_SYNC_TIMEOUT", default_value_t = 300.0)]
    pub full_sync_timeout: f64,
    /// Fraction of workers whose sync must be complete before workers may leave freeze mode.
    #[arg(
        long,
        env = "KVPLANE_FULL_SYNC_COMPLETION_THRESHOLD",
        default_value_t = 0.8
    )]
    pub full_sync_completion_threshold: f64,
    /// Largest frame accepted on any ZMQ socket, in bytes; larger frames are counted and dropped.
    #[arg(long, env = "KVPLANE_MAX_FRAME_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub max_frame_bytes: usize,
    /// Most workers registered at once; registrations (and heartbeats of unknown workers)
    /// beyond are refused with an ErrorMsg.
    #[arg(long, env = "KVPLANE_MAX_WORKERS", default_value_t = 1 << 16)]
    pub max_workers: usize,
    /// Most keys one worker may hold over all its locations; admits of new keys beyond are
    /// dropped and counted (evicts always apply).
    #[arg(long, env = "KVPLANE_MAX_KEYS_PER_WORKER", default_value_t = 1 << 24)]
    pub max_keys_per_worker: u64,
    /// Most operations in one admit/evict batch (and keys in one full-sync batch); larger
    /// batches are dropped whole and counted.
    #[arg(long, env = "KVPLANE_MAX_BATCH_OPS", default_value_t = 1 << 16)]
    pub max_batch_ops: usize,
    /// Largest HTTP request body, in bytes; larger requests get 413.
    #[arg(long, env = "KVPLANE_MAX_BODY_BYTES", default_value_t = crate::http::MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Bearer token the mutating HTTP routes (/clear /pin /compress /decompress /move)
    /// require; unset, they are open to anyone who reaches the HTTP port.
    #[arg(long, env = "KVPLANE_API_TOKEN", hide_env_values = true, value_parser = ApiToken::parse)]
    pub api_token: Option<ApiToken>,
    /// Tokens per chunk when HTTP /lookup hashes tokens (LMCache's `chunk_size`).
    #[arg(long, env = "KVPLANE_LOOKUP_CHUNK_SIZE", default_value_t = 256)]
    pub lookup_chunk_size: usize,
    /// Prefix hash of the first chunk when HTTP /lookup hashes tokens (LMCache's `NONE_HASH`:
    /// 0, or vLLM's when the workers import vLLM); any integer in [-2^63, 2^64-1].
    #[arg(
        long,
        env = "KVPLANE_LOOKUP_NONE_HASH",
        default_value = "0",
        allow_hyphen_values = true
    )]
    pub lookup_none_hash: String,
}

/// A secret that never shows in `Debug` output or logs.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken(String);

impl ApiToken {
    /// Wraps a token.
    pub fn new(token: impl Into<String>) -> Self {
        ApiToken(token.into())
    }

    fn parse(s: &str) -> Result<Self, std::convert::Infallible> {
        Ok(ApiToken(s.to_owned()))
    }

    /// The token itself, for comparison.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiToken(<redacted>)")
    }
}

/// The ZMQ ports, as in LMCache's `controller_monitor_ports`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MonitorPorts {
    /// PULL socket for admit/evict batches, full-sync batches and deregistration.
    pub pull: Option<u16>,
    /// ROUTER socket for registration, P2P lookups and full-sync start/status.
    pub reply: Option<u16>,
    /// ROUTER socket for heartbeats (workers heartbeat only when it exists).
    pub heartbeat: Option<u16>,
}

/// A configuration error, reported before anything binds.
#[derive(Debug, Error, PartialEq)]
pub enum ConfigError {
    /// `--monitor-ports` is not the expected JSON.
    #[error("--monitor-ports: {0} (expected JSON like {{\"pull\": 8300, \"reply\": 8400, \"heartbeat\": 8082}})")]
    MonitorPorts(String),
    /// A duration flag is out of range.
    #[error("--{flag}: {detail}")]
    Value {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        detail: String,
    },
}

/// The validated configuration of `kvplane serve`.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Bind host.
    pub host: String,
    /// HTTP port.
    pub http_port: u16,
    /// ZMQ ports.
    pub monitor_ports: MonitorPorts,
    /// Liveness sweep period; `None` = off.
    pub health_check_interval: Option<Duration>,
    /// Silence before a probe.
    pub worker_timeout: Duration,
    /// Explicit advertised host.
    pub advertise_host: Option<String>,
    /// Most liveness probes in flight at once (≥ 1).
    pub max_concurrent_probes: usize,
    /// Downlink request timeout.
    pub downlink_timeout: Duration,
    /// Full-sync inactivity timeout.
    pub full_sync_timeout: Duration,
    /// Full-sync completion threshold (0..=1).
    pub full_sync_completion_threshold: f64,
    /// Largest accepted ZMQ frame.
    pub max_frame_bytes: usize,
    /// Most registered workers.
    pub max_workers: usize,
    /// Most keys per worker (all locations).
    pub max_keys_per_worker: u64,
    /// Most ops per admit/evict batch, keys per full-sync batch.
    pub max_batch_ops: usize,
    /// Largest HTTP request body.
    pub max_body_bytes: usize,
    /// Token the mutating HTTP routes require; `None` = open.
    pub api_token: Option<ApiToken>,
    /// Tokens per chunk for HTTP /lookup (≥ 1).
    pub lookup_chunk_size: usize,
    /// First prefix hash for HTTP /lookup.
    pub lookup_none_hash: ChunkHash,
}

fn seconds(flag: &'static str, v: f64) -> Result<Duration, ConfigError> {
    Duration::try_from_secs_f64(v).map_err(|_| ConfigError::Value {
        flag,
        detail: format!("{v} is not a non-negative number of seconds"),
    })
}

fn at_least_one(flag: &'static str, v: usize) -> Result<usize, ConfigError> {
    if v == 0 {
        return Err(ConfigError::Value {
            flag,
            detail: "0 must be ≥ 1".into(),
        });
    }
    Ok(v)
}

impl ServeArgs {
    /// Validates the flags.
    ///
    /// # Errors
    /// [`ConfigError`] naming the flag at fault.
    pub fn validate(&self) -> Result<ServeConfig, ConfigError> {
        let monitor_ports: MonitorPorts = serde_json::from_str(&self.monitor_ports)
            .map_err(|e| ConfigError::MonitorPorts(e.to_string()))?;
        let health_check_interval = match self.health_check_interval {
            v if v == -1.0 || v == 0.0 => None,
            v if v > 0.0 => Some(seconds("health-check-interval", v)?),
            v => {
                return Err(ConfigError::Value {
                    flag: "health-check-interval",
                    detail: format!("{v}: use a positive number of seconds, or -1 for off"),
                })
            }
        };
        let threshold = self.full_sync_completion_threshold;
        if !(0.0..=1.0).contains(&threshold) {
            return Err(ConfigError::Value {
                flag: "full-sync-completion-threshold",
                detail: format!("{threshold} is not in [0, 1]"),
            });
        }
        let positive = |flag, v: f64| {
            if v > 0.0 {
                seconds(flag, v)
            } else {
                Err(ConfigError::Value {
                    flag,
                    detail: format!("{v} must be > 0"),
                })
            }
        };
        Ok(ServeConfig {
            host: self.host.clone(),
            http_port: self.port,
            monitor_ports,
            health_check_interval,
            worker_timeout: positive("lmcache-worker-timeout", self.lmcache_worker_timeout)?,
            advertise_host: self.advertise_host.clone().filter(|h| !h.is_empty()),
            max_concurrent_probes: at_least_one(
                "max-concurrent-probes",
                self.max_concurrent_probes,
            )?,
            downlink_timeout: positive("downlink-timeout", self.downlink_timeout)?,
            full_sync_timeout: positive("full-sync-timeout", self.full_sync_timeout)?,
            full_sync_completion_threshold: threshold,
            max_frame_bytes: at_least_one("max-frame-bytes", self.max_frame_bytes)?,
            max_workers: at_least_one("max-workers", self.max_workers)?,
            max_keys_per_worker: self.max_keys_per_worker,
            max_batch_ops: at_least_one("max-batch-ops", self.max_batch_ops)?,
            max_body_bytes: at_least_one("max-body-bytes", self.max_body_bytes)?,
            api_token: self.api_token.clone().filter(|t| !t.0.is_empty()),
            lookup_chunk_size: match self.lookup_chunk_size {
                0 => {
                    return Err(ConfigError::Value {
                        flag: "lookup-chunk-size",
                        detail: "0 must be ≥ 1".into(),
                    })
                }
                n => n,
            },
            lookup_none_hash: self
                .lookup_none_hash
                .trim()
                .parse::<i128>()
                .ok()
                .and_then(ChunkHash::from_i128)
                .ok_or_else(|| ConfigError::Value {
                    flag: "lookup-none-hash",
                    detail: format!(
                        "{:?} is not an integer in [-2^63, 2^64-1]",
                        self.lookup_none_hash
                    ),
                })?,
        })
    }
}

impl ServeConfig {
    /// A configuration for tests: everything on 127.0.0.1 with ephemeral ports, fast timers.
    pub fn ephemeral() -> Self {
        ServeConfig {
            host: "127.0.0.1".into(),
            http_port: 0,
            monitor_ports: MonitorPorts {
                pull: Some(0),
                reply: Some(0),
                heartbeat: Some(0),
            },
            health_check_interval: None,
            worker_timeout: Duration::from_secs(300),
            advertise_host: None,
            max_concurrent_probes: 64,
            downlink_timeout: Duration::from_secs(2),
            full_sync_timeout: Duration::from_secs(300),
            full_sync_completion_threshold: 0.8,
            max_frame_bytes: 64 * 1024 * 1024,
            max_workers: 1 << 16,
            max_keys_per_worker: 1 << 24,
            max_batch_ops: 1 << 16,
            max_body_bytes: crate::http::MAX_BODY_BYTES,
            api_token: None,
            lookup_chunk_size: 256,
            lookup_none_hash: ChunkHash::from_i64(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<ServeConfig, String> {
        let mut full = vec!["kvplane", "serve"];
        full.extend_from_slice(args);
        let cli = Cli::try_parse_from(full).map_err(|e| e.to_string())?;
        match cli.command {
            Command::Serve(a) => a.validate().map_err(|e| e.to_string()),
            Command::Bench(_) => Err("not serve".into()),
        }
    }

    #[test]
    fn defaults_match_lmcache() {
        let c = parse(&[]).expect("defaults are valid");
        assert_eq!((c.host.as_str(), c.http_port), ("0.0.0.0", 9000));
        assert_eq!(
            c.monitor_ports,
            MonitorPorts {
                pull: Some(8300),
                reply: Some(8400),
                heartbeat: Some(8082)
            }
        );
        assert_eq!(c.worker_timeout, Duration::from_secs(300));
    }

    #[test]
    fn monitor_ports_subset_and_errors() {
        let c = parse(&["--monitor-ports", r#"{"pull":0,"reply":0}"#]).expect("subset");
        assert_eq!(c.monitor_ports.heartbeat, None);
        let e = parse(&["--monitor-ports", r#"{"pull":1,"bogus":2}"#]).expect_err("unknown key");
        assert!(e.contains("--monitor-ports"), "{e}");
        assert!(parse(&["--monitor-ports", "8300"]).is_err());
    }

    #[test]
    fn health_check_minus_one_is_off_and_bad_values_name_the_flag() {
        let c = parse(&["--health-check-interval", "-1"]).expect("off");
        assert_eq!(c.health_check_interval, None);
        let e = parse(&["--lmcache-worker-timeout", "0"]).expect_err("zero timeout");
        assert!(e.contains("--lmcache-worker-timeout"), "{e}");
        let e = parse(&["--health-check-interval", "-5"]).expect_err("negative");
        assert!(e.contains("--health-check-interval"), "{e}");
    }

    #[test]
    fn http_flags_defaults_and_validation() {
        let c = parse(&[]).expect("defaults");
        assert_eq!(c.api_token, None);
        assert_eq!(c.lookup_chunk_size, 256);
        assert_eq!(c.lookup_none_hash, ChunkHash::from_i64(0));
        let c = parse(&[
            "--api-token",
            "s3cret",
            "--lookup-chunk-size",
            "16",
            "--lookup-none-hash",
            "18446744073709551615",
        ])
        .expect("valid");
        assert_eq!(c.api_token, Some(ApiToken::new("s3cret")));
        assert!(
            !format!("{c:?}").contains("s3cret"),
            "the token is redacted"
        );
        assert_eq!(c.lookup_chunk_size, 16);
        assert_eq!(c.lookup_none_hash, ChunkHash::from_u64(u64::MAX));
        let c = parse(&["--lookup-none-hash", "-5", "--api-token", ""]).expect("valid");
        assert_eq!(c.lookup_none_hash, ChunkHash::from_i64(-5));
        assert_eq!(c.api_token, None, "an empty token means no token");
        let e = parse(&["--lookup-chunk-size", "0"]).expect_err("zero");
        assert!(e.contains("--lookup-chunk-size"), "{e}");
        let e = parse(&["--lookup-none-hash", "18446744073709551616"]).expect_err("too big");
        assert!(e.contains("--lookup-none-hash"), "{e}");
    }

    #[test]
    fn resource_limits_have_defaults_and_refuse_zero() {
        let c = parse(&[]).expect("defaults");
        assert_eq!(c.max_concurrent_probes, 64);
        assert_eq!(
            parse(&["--max-concurrent-probes", "8"]).map(|c| c.max_concurrent_probes),
            Ok(8)
        );
        assert_eq!(
            (
                c.max_workers,
                c.max_keys_per_worker,
                c.max_batch_ops,
                c.max_body_bytes,
                c.max_frame_bytes
            ),
            (65_536, 16_777_216, 65_536, 32 << 20, 64 << 20)
        );
        let c = parse(&[
            "--max-workers",
            "3",
            "--max-keys-per-worker",
            "0",
            "--max-batch-ops",
            "50",
            "--max-body-bytes",
            "1024",
        ])
        .expect("valid");
        assert_eq!(
            (
                c.max_workers,
                c.max_keys_per_worker,
                c.max_batch_ops,
                c.max_body_bytes
            ),
            (3, 0, 50, 1024)
        );
        for flag in [
            "--max-workers",
            "--max-batch-ops",
            "--max-body-bytes",
            "--max-frame-bytes",
            "--max-concurrent-probes",
        ] {
            let e = parse(&[flag, "0"]).expect_err("zero");
            assert!(e.contains(flag), "{e}");
        }
    }
}
