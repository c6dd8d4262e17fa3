//! `kvplane coordinator` flags. Each flag is also read from two environment variables:
//! LMCache's documented `LMCACHE_MP_COORDINATOR_<NAME>` and kvplane's
//! `KVPLANE_COORDINATOR_<NAME>` (prefixed so that `kvplane serve`'s `KVPLANE_PORT` and
//! `KVPLANE_HOST` do not leak into the coordinator). Precedence: the flag, then
//! `KVPLANE_COORDINATOR_<NAME>`, then `LMCACHE_MP_COORDINATOR_<NAME>`, then the default
//! (clap's `env` takes one name, so the variables are read here). The `--cluster` flags are
//! `serve`'s ([`kvplane::cluster::args::ClusterArgs`]: `KVPLANE_CLUSTER`, `KVPLANE_CLUSTER_NAME`, …).

use clap::Args;
use kvplane::config::{self, defaults::coordinator as d, ConfigError};
use kvplane::coordinator::resync::ResyncConfig;
use kvplane::coordinator::CoordinatorConfig;

#[path = "coordinator_056.rs"]
mod v056;

/// Flags of `kvplane coordinator` (the LMCache MP coordinator), as given.
#[derive(Debug, Clone, Default, Args)]
#[command(
    mut_arg("api_token", |a| a.env("KVPLANE_COORDINATOR_API_TOKEN")),
    mut_arg("api_token_reads", |a| a.env("KVPLANE_COORDINATOR_API_TOKEN_READS")),
    mut_arg("api_token_peers", |a| a.env("KVPLANE_COORDINATOR_API_TOKEN_PEERS"))
)]
pub(crate) struct CoordinatorArgs {
    /// `--api-token` and its scope (the MP servers' own routes stay open without
    /// `--api-token-peers`: LMCache 0.5.6's MP server sends no token).
    #[command(flatten)]
    pub(crate) auth: kvplane::web::access::AuthArgs,
    /// Bind host [env KVPLANE_COORDINATOR_HOST, LMCACHE_MP_COORDINATOR_HOST; default 0.0.0.0].
    #[arg(long)]
    host: Option<String>,
    /// HTTP port; 0 picks a free one [env …_PORT; default 9300].
    #[arg(long, allow_hyphen_values = true)]
    port: Option<String>,
    /// Seconds without a heartbeat before an MP server is removed [env …_INSTANCE_TIMEOUT; 30].
    #[arg(long, allow_hyphen_values = true)]
    instance_timeout: Option<String>,
    /// Seconds between health sweeps; 0 disables [env …_HEALTH_CHECK_INTERVAL; 10].
    #[arg(long, allow_hyphen_values = true)]
    health_check_interval: Option<String>,
    /// Seconds between eviction cycles; 0 disables [env …_EVICTION_CHECK_INTERVAL; 5].
    #[arg(long, allow_hyphen_values = true)]
    eviction_check_interval: Option<String>,
    /// Fraction (0..=1) of an over-quota salt's keys evicted per cycle [env …_EVICTION_RATIO; 0.2].
    #[arg(long, allow_hyphen_values = true)]
    eviction_ratio: Option<String>,
    /// Evict when usage reaches this fraction (0, 1] of the quota [env …_TRIGGER_WATERMARK; 1.0].
    #[arg(long, allow_hyphen_values = true)]
    trigger_watermark: Option<String>,
    /// Idle keep-alive seconds (accepted; see docs/COORDINATOR.md) [env …_TIMEOUT_KEEP_ALIVE; 10].
    #[arg(long, allow_hyphen_values = true)]
    timeout_keep_alive: Option<String>,
    /// Tokens per chunk on the MP servers (prefetch noop rule) [env …_CHUNK_SIZE; 256].
    #[arg(long, allow_hyphen_values = true)]
    chunk_size: Option<String>,
    /// Startup resync on/off (1/true/yes/on) [env …_ENABLE_STARTUP_RESYNC; true].
    #[arg(long, allow_hyphen_values = true)]
    enable_startup_resync: Option<String>,
    /// Seconds between registration checks of the startup resync [env …_RESYNC_POLL_INTERVAL; 1].
    #[arg(long, allow_hyphen_values = true)]
    resync_poll_interval: Option<String>,
    /// Seconds the startup resync waits for a server [env …_RESYNC_MAX_WAIT; 60].
    #[arg(long, allow_hyphen_values = true)]
    resync_max_wait: Option<String>,
    /// page_size of the resync's GET /cache/objects [env …_RESYNC_PAGE_SIZE; 1000].
    #[arg(long, allow_hyphen_values = true)]
    resync_page_size: Option<String>,
    /// Largest request body, bytes (413 beyond) [env …_MAX_BODY_BYTES; 16777216].
    #[arg(long, allow_hyphen_values = true)]
    max_body_bytes: Option<String>,
    /// Most JSON values in one request body (413 beyond) [env …_MAX_BODY_ITEMS; 1048576].
    #[arg(long, allow_hyphen_values = true)]
    max_body_items: Option<String>,
    /// Most HTTP connections served at once [env …_MAX_HTTP_CONNECTIONS; 1024].
    #[arg(long, allow_hyphen_values = true)]
    max_http_connections: Option<String>,
    /// Seconds to send a request's headers (also the idle keep-alive), then its body
    /// [env …_HTTP_READ_TIMEOUT; 30].
    #[arg(long, allow_hyphen_values = true)]
    http_read_timeout: Option<String>,
    /// File where quotas and pins are kept across restarts (empty: not kept)
    /// [env …_METADATA_PATH; ""].
    #[arg(long)]
    metadata_path: Option<String>,
    /// Default quota in GiB of salts without one, at start (0: the seed document's
    /// allowlist; unset: exempt, as LMCache 0.5.6) [env …_DEFAULT_QUOTA_GB; unset].
    #[arg(long, allow_hyphen_values = true)]
    default_quota_gb: Option<String>,
    /// LMCache 0.5.6's further flags (checkpoint, blend, hash, extra config, metrics,
    /// transport).
    #[command(flatten)]
    v056: Box<v056::Args056>,
    /// `--cluster`: a hot standby on NATS JetStream until it holds the coordinator lease
    /// (docs/CLUSTER.md); read from `KVPLANE_CLUSTER*`, as `serve` reads them.
    #[command(flatten)]
    pub(crate) cluster: kvplane::cluster::args::ClusterArgs,
}

/// Startup-resync settings as given (the validated form is `CoordinatorConfig::resync`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Resync {
    pub(crate) enabled: bool,
    pub(crate) poll_interval: f64,
    pub(crate) max_wait: f64,
    pub(crate) page_size: usize,
}

struct Source<'a, E> {
    env: &'a E,
}

impl<E: Fn(&str) -> Option<String>> Source<'_, E> {
    /// The flag's text, else `KVPLANE_COORDINATOR_<NAME>`, else `LMCACHE_MP_COORDINATOR_<NAME>`.
    fn text(&self, flag: &Option<String>, name: &str) -> Option<String> {
        flag.clone()
            .or_else(|| (self.env)(&format!("KVPLANE_COORDINATOR_{name}")))
            .or_else(|| (self.env)(&format!("LMCACHE_MP_COORDINATOR_{name}")))
    }

    fn parse<T: std::str::FromStr>(
        &self,
        flag: &Option<String>,
        name: &str,
        cli: &'static str,
        default: T,
    ) -> Result<T, ConfigError> {
        match self.text(flag, name) {
            None => Ok(default),
            Some(t) => t.trim().parse().map_err(|_| ConfigError::Value {
                flag: cli,
                detail: format!("cannot parse {t:?}"),
            }),
        }
    }
}

fn off_or_period(flag: &'static str, v: f64) -> Result<Option<std::time::Duration>, ConfigError> {
    if v == 0.0 {
        Ok(None)
    } else {
        config::positive_seconds(flag, v).map(Some)
    }
}

impl CoordinatorArgs {
    /// Validates the flags with the environment `env` (the process environment in `main`).
    pub(crate) fn validate(
        &self,
        env: &impl Fn(&str) -> Option<String>,
    ) -> Result<(CoordinatorConfig, Resync), ConfigError> {
        let s = Source { env };
        let host = s
            .text(&self.host, "HOST")
            .unwrap_or_else(|| kvplane::config::defaults::HOST.to_owned());
        let port = s.parse(&self.port, "PORT", "port", d::PORT)?;
        let mut c = CoordinatorConfig::with_defaults(host, port);
        let f = |flag, name, cli, default| s.parse::<f64>(flag, name, cli, default);
        c.instance_timeout = config::positive_seconds(
            "instance-timeout",
            f(
                &self.instance_timeout,
                "INSTANCE_TIMEOUT",
                "instance-timeout",
                d::INSTANCE_TIMEOUT_S,
            )?,
        )?;
        c.health_check_interval = off_or_period(
            "health-check-interval",
            f(
                &self.health_check_interval,
                "HEALTH_CHECK_INTERVAL",
                "health-check-interval",
                d::HEALTH_CHECK_INTERVAL_S,
            )?,
        )?;
        c.eviction_check_interval = off_or_period(
            "eviction-check-interval",
            f(
                &self.eviction_check_interval,
                "EVICTION_CHECK_INTERVAL",
                "eviction-check-interval",
                d::EVICTION_CHECK_INTERVAL_S,
            )?,
        )?;
        c.model.eviction_ratio = config::fraction(
            "eviction-ratio",
            f(
                &self.eviction_ratio,
                "EVICTION_RATIO",
                "eviction-ratio",
                d::EVICTION_RATIO,
            )?,
        )?;
        let wm = f(
            &self.trigger_watermark,
            "TRIGGER_WATERMARK",
            "trigger-watermark",
            d::TRIGGER_WATERMARK,
        )?;
        if !(wm > 0.0 && wm <= 1.0) {
            return Err(ConfigError::Value {
                flag: "trigger-watermark",
                detail: format!("{wm} is not in (0, 1]"),
            });
        }
        c.model.trigger_watermark = wm;
        let keep_alive: u64 = s.parse(
            &self.timeout_keep_alive,
            "TIMEOUT_KEEP_ALIVE",
            "timeout-keep-alive",
            d::TIMEOUT_KEEP_ALIVE_S,
        )?;
        c.timeout_keep_alive =
            std::time::Duration::from_secs(config::at_least_one("timeout-keep-alive", keep_alive)?);
        c.chunk_size = config::at_least_one(
            "chunk-size",
            s.parse(&self.chunk_size, "CHUNK_SIZE", "chunk-size", d::CHUNK_SIZE)?,
        )?;
        let chunk_size_given = s.text(&self.chunk_size, "CHUNK_SIZE").is_some();
        self.v056.apply(&s, chunk_size_given, &mut c)?;
        c.http.max_body_bytes = config::at_least_one(
            "max-body-bytes",
            s.parse(
                &self.max_body_bytes,
                "MAX_BODY_BYTES",
                "max-body-bytes",
                d::MAX_BODY_BYTES,
            )?,
        )?;
        c.http.max_body_items = config::at_least_one(
            "max-body-items",
            s.parse(
                &self.max_body_items,
                "MAX_BODY_ITEMS",
                "max-body-items",
                d::MAX_BODY_ITEMS,
            )?,
        )?;
        c.http.max_connections = config::at_least_one(
            "max-http-connections",
            s.parse(
                &self.max_http_connections,
                "MAX_HTTP_CONNECTIONS",
                "max-http-connections",
                d::MAX_HTTP_CONNECTIONS,
            )?,
        )?;
        c.http.read_timeout = config::positive_seconds(
            "http-read-timeout",
            f(
                &self.http_read_timeout,
                "HTTP_READ_TIMEOUT",
                "http-read-timeout",
                d::HTTP_READ_TIMEOUT_S,
            )?,
        )?;
        let enabled = match s.text(&self.enable_startup_resync, "ENABLE_STARTUP_RESYNC") {
            None => true,
            Some(t) => matches!(
                t.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            ),
        };
        let resync = Resync {
            enabled,
            poll_interval: config::positive_seconds(
                "resync-poll-interval",
                f(
                    &self.resync_poll_interval,
                    "RESYNC_POLL_INTERVAL",
                    "resync-poll-interval",
                    1.0,
                )?,
            )?
            .as_secs_f64(),
            max_wait: config::seconds(
                "resync-max-wait",
                f(
                    &self.resync_max_wait,
                    "RESYNC_MAX_WAIT",
                    "resync-max-wait",
                    60.0,
                )?,
            )?
            .as_secs_f64(),
            page_size: config::at_least_one(
                "resync-page-size",
                s.parse(
                    &self.resync_page_size,
                    "RESYNC_PAGE_SIZE",
                    "resync-page-size",
                    1000usize,
                )?,
            )?,
        };
        c.resync = resync.enabled.then(|| ResyncConfig {
            poll_interval: std::time::Duration::from_secs_f64(resync.poll_interval),
            max_wait: std::time::Duration::from_secs_f64(resync.max_wait),
            page_size: resync.page_size,
        });
        c.metadata_path = s
            .text(&self.metadata_path, "METADATA_PATH")
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
            .map(std::path::PathBuf::from);
        c.default_quota_gb = match s.text(&self.default_quota_gb, "DEFAULT_QUOTA_GB") {
            None => None,
            Some(t) if t.trim().is_empty() || t.trim() == "null" => None,
            Some(t) => match t.trim().parse::<f64>() {
                Ok(gb) if gb.is_finite() && (0.0..8.0e9).contains(&gb) => Some(gb),
                _ => {
                    return Err(ConfigError::Value {
                        flag: "default-quota-gb",
                        detail: format!("{t:?} is not a limit in GiB (0 up to 8e9, or null)"),
                    })
                }
            },
        };
        c.auth = kvplane::web::access::Auth::from(&self.auth);
        Ok((c, resync))
    }
}

/// The coordinator run inside `kvplane serve --coordinator-port N`: the serve host, port
/// `N`, everything else from the coordinator's environment variables.
///
/// # Errors
/// [`ConfigError`] for a bad coordinator variable.
pub(crate) fn embedded(host: &str, port: u16) -> Result<CoordinatorConfig, ConfigError> {
    let args = CoordinatorArgs {
        host: Some(host.to_owned()),
        port: Some(port.to_string()),
        ..CoordinatorArgs::default()
    };
    args.validate(&|k: &str| std::env::var(k).ok())
        .map(|(c, _)| c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::collections::HashMap;
    use std::time::Duration;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: CoordinatorArgs,
    }

    pub(super) fn validate(
        argv: &[&str],
        env: &[(&str, &str)],
    ) -> Result<(CoordinatorConfig, Resync), ConfigError> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        let mut full = vec!["t"];
        full.extend_from_slice(argv);
        T::parse_from(full)
            .a
            .validate(&|k: &str| env.get(k).cloned())
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let (c, r) = validate(&[], &[]).unwrap();
        assert_eq!((c.host.as_str(), c.port), ("0.0.0.0", 9300));
        assert_eq!(c.instance_timeout, Duration::from_secs(30));
        assert_eq!(c.health_check_interval, Some(Duration::from_secs(10)));
        assert_eq!(c.eviction_check_interval, Some(Duration::from_secs(5)));
        assert_eq!(
            (c.model.eviction_ratio, c.model.trigger_watermark),
            (0.2, 1.0)
        );
        assert_eq!(c.timeout_keep_alive, Duration::from_secs(10));
        assert_eq!(
            (r.enabled, r.poll_interval, r.max_wait, r.page_size),
            (true, 1.0, 60.0, 1000)
        );
        assert_eq!(c.resync.map(|r| r.page_size), Some(1000));
        assert_eq!(c.http.max_body_bytes, 16 << 20);
        assert_eq!(c.http.max_body_items, 1 << 20);
        assert_eq!(c.http.max_connections, 16_384);
        assert_eq!(c.http.read_timeout, Duration::from_secs(30));
    }

    #[test]
    fn http_limits_from_flags_and_both_variables() {
        let env = [
            ("LMCACHE_MP_COORDINATOR_MAX_BODY_BYTES", "2048"),
            ("KVPLANE_COORDINATOR_MAX_BODY_ITEMS", "64"),
            ("LMCACHE_MP_COORDINATOR_MAX_BODY_ITEMS", "65"),
            ("KVPLANE_COORDINATOR_HTTP_READ_TIMEOUT", "2.5"),
        ];
        let (c, _) = validate(&["--max-http-connections", "8"], &env).unwrap();
        assert_eq!(c.http.max_body_bytes, 2048);
        assert_eq!(c.http.max_body_items, 64);
        assert_eq!(c.http.max_connections, 8);
        assert_eq!(c.http.read_timeout, Duration::from_millis(2500));
    }

    #[test]
    fn flag_then_kvplane_then_lmcache_variable() {
        let env = [
            ("LMCACHE_MP_COORDINATOR_PORT", "9400"),
            ("LMCACHE_MP_COORDINATOR_EVICTION_RATIO", "0.5"),
            ("KVPLANE_COORDINATOR_EVICTION_RATIO", "0.25"),
            ("LMCACHE_MP_COORDINATOR_INSTANCE_TIMEOUT", "12"),
            ("LMCACHE_MP_COORDINATOR_HEALTH_CHECK_INTERVAL", "0"),
            ("LMCACHE_MP_COORDINATOR_ENABLE_STARTUP_RESYNC", "False"),
            ("KVPLANE_COORDINATOR_RESYNC_PAGE_SIZE", "50"),
            ("KVPLANE_PORT", "1"),
        ];
        let (c, r) = validate(&["--instance-timeout", "7"], &env).unwrap();
        assert_eq!(c.port, 9400);
        assert_eq!(c.model.eviction_ratio, 0.25);
        assert_eq!(c.instance_timeout, Duration::from_secs(7));
        assert_eq!(c.health_check_interval, None);
        assert!(!r.enabled);
        assert!(c.resync.is_none());
        assert_eq!(r.page_size, 50);
        assert_eq!(c.metadata_path, None);
        let env = [("LMCACHE_MP_COORDINATOR_METADATA_PATH", "/var/lib/meta.json")];
        let (c, _) = validate(&[], &env).unwrap();
        assert_eq!(c.metadata_path, Some("/var/lib/meta.json".into()));
        let (c, _) = validate(&["--metadata-path", ""], &env).unwrap();
        assert_eq!(c.metadata_path, None);
    }

    #[test]
    fn default_quota_is_unset_unless_given() {
        assert_eq!(validate(&[], &[]).unwrap().0.default_quota_gb, None);
        let (c, _) = validate(&["--default-quota-gb", "0"], &[]).unwrap();
        assert_eq!(c.default_quota_gb, Some(0.0));
        let env = [
            ("LMCACHE_MP_COORDINATOR_DEFAULT_QUOTA_GB", "3"),
            ("KVPLANE_COORDINATOR_DEFAULT_QUOTA_GB", "1.5"),
        ];
        assert_eq!(validate(&[], &env).unwrap().0.default_quota_gb, Some(1.5));
        let env = [("LMCACHE_MP_COORDINATOR_DEFAULT_QUOTA_GB", "null")];
        assert_eq!(validate(&[], &env).unwrap().0.default_quota_gb, None);
        for bad in ["-1", "x", "NaN", "inf", "1e300"] {
            let e = validate(&["--default-quota-gb", bad], &[]).unwrap_err();
            assert!(e.to_string().starts_with("--default-quota-gb"), "{e}");
        }
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (argv, flag) in [
            (&["--trigger-watermark", "0"][..], "--trigger-watermark"),
            (&["--eviction-ratio", "1.5"], "--eviction-ratio"),
            (&["--instance-timeout", "0"], "--instance-timeout"),
            (&["--port", "x"], "--port"),
            (
                &["--eviction-check-interval", "-1"],
                "--eviction-check-interval",
            ),
            (&["--timeout-keep-alive", "0"], "--timeout-keep-alive"),
            (&["--max-body-bytes", "0"], "--max-body-bytes"),
            (&["--max-body-items", "x"], "--max-body-items"),
            (&["--max-http-connections", "0"], "--max-http-connections"),
            (&["--http-read-timeout", "0"], "--http-read-timeout"),
        ] {
            let e = validate(argv, &[]).expect_err("invalid");
            assert!(e.to_string().starts_with(flag), "{e}");
        }
        let e = validate(&[], &[("LMCACHE_MP_COORDINATOR_TRIGGER_WATERMARK", "2")]).unwrap_err();
        assert!(e.to_string().starts_with("--trigger-watermark"), "{e}");
    }
}
