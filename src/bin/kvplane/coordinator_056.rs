//! The LMCache 0.5.6 coordinator flags beyond the seed's (spec §1.1), and the seed's
//! `--blend-chunk-size` alias: each honoured, or refused at startup with a message naming
//! what to do instead. Read like the others: the flag, then `KVPLANE_COORDINATOR_<NAME>`,
//! then `LMCACHE_MP_COORDINATOR_<NAME>`.

use super::Source;
use clap::Args;
use kvplane::config::{self, ConfigError};
use kvplane::coordinator::checkpoint::{self, CheckpointConfig};
use kvplane::coordinator::CoordinatorConfig;

/// 0.5.6's `--checkpoint-interval` default, seconds.
const CHECKPOINT_INTERVAL_S: f64 = 60.0;

/// The 0.5.6 flags.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct Args056 {
    /// The seed's name of --chunk-size (used when --chunk-size is not given)
    /// [env …_BLEND_CHUNK_SIZE].
    #[arg(long, allow_hyphen_values = true)]
    blend_chunk_size: Option<String>,
    /// Index stored chunks' tokens for POST /directory/blend-lookup (CacheBlend)
    /// [env …_ENABLE_BLEND_LOOKUP: 1/true/yes/on].
    #[arg(long)]
    enable_blend_lookup: bool,
    /// Query positions between blend probes (1: full recall) [env …_BLEND_PROBE_STRIDE; 1].
    #[arg(long, allow_hyphen_values = true)]
    blend_probe_stride: Option<String>,
    /// Token hash of the MP servers; kvplane supports blake3 (LMCache's default)
    /// [env …_HASH_ALGORITHM; blake3].
    #[arg(long)]
    hash_algorithm: Option<String>,
    /// File where the coordinator's state is checkpointed and restored at start (empty: off)
    /// [env …_CHECKPOINT_PATH; ""].
    #[arg(long)]
    checkpoint_path: Option<String>,
    /// Seconds between checkpoints; 0: only at a clean stop [env …_CHECKPOINT_INTERVAL; 60].
    #[arg(long, allow_hyphen_values = true)]
    checkpoint_interval: Option<String>,
    /// JSON object; `{"disabled_controllers": ["FleetEvictionController"]}` turns off the
    /// eviction loop and the /quota* and /cache/pins routes [env …_EXTRA_CONFIG; {}].
    #[arg(long, allow_hyphen_values = true)]
    extra_config: Option<String>,
    /// Do not serve GET /metrics [env …_DISABLE_METRICS: 1/true/yes/on].
    #[arg(long)]
    disable_metrics: bool,
    /// Refused: kvplane does not push OTLP metrics; scrape GET /metrics [env …_OTLP_ENDPOINT].
    #[arg(long)]
    otlp_endpoint: Option<String>,
    /// How MP servers send cache events: http (POST /events); kafka is refused
    /// [env …_EVENT_TRANSPORT; http].
    #[arg(long)]
    event_transport: Option<String>,
    /// Refused (Kafka transport) [env …_KAFKA_BOOTSTRAP_SERVERS].
    #[arg(long)]
    kafka_bootstrap_servers: Option<String>,
    /// Refused (Kafka transport) [env …_KAFKA_TOPIC].
    #[arg(long)]
    kafka_topic: Option<String>,
    /// Refused (Kafka transport) [env …_KAFKA_GROUP_ID].
    #[arg(long)]
    kafka_group_id: Option<String>,
}

fn truthy(t: &str) -> bool {
    matches!(
        t.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

fn refuse(flag: &'static str, detail: impl Into<String>) -> ConfigError {
    ConfigError::Value {
        flag,
        detail: detail.into(),
    }
}

const NO_KAFKA: &str = "kvplane takes cache events over HTTP only (POST /events): run the MP \
    servers with --coordinator-event-transport http (their default) and --coordinator-url \
    pointing here; no Kafka broker is needed";

impl Args056 {
    /// Applies the flags to `c`; `chunk_size_given`: whether `--chunk-size` (or its
    /// variables) was set, which wins over `--blend-chunk-size`.
    pub(crate) fn apply<E: Fn(&str) -> Option<String>>(
        &self,
        s: &Source<'_, E>,
        chunk_size_given: bool,
        c: &mut CoordinatorConfig,
    ) -> Result<(), ConfigError> {
        if !chunk_size_given {
            if let Some(t) = s.text(&self.blend_chunk_size, "BLEND_CHUNK_SIZE") {
                let n: usize = t
                    .trim()
                    .parse()
                    .map_err(|_| refuse("blend-chunk-size", format!("cannot parse {t:?}")))?;
                c.chunk_size = config::at_least_one("blend-chunk-size", n)?;
            }
        }
        let flag = |on: bool| on.then(|| "true".to_owned());
        let blend = s
            .text(&flag(self.enable_blend_lookup), "ENABLE_BLEND_LOOKUP")
            .is_some_and(|t| truthy(&t));
        let stride = config::at_least_one(
            "blend-probe-stride",
            s.parse(
                &self.blend_probe_stride,
                "BLEND_PROBE_STRIDE",
                "blend-probe-stride",
                1usize,
            )?,
        )?;
        c.blend_probe_stride = blend.then_some(stride);
        if let Some(h) = s.text(&self.hash_algorithm, "HASH_ALGORITHM") {
            let h = h.trim();
            if h.is_empty() {
                return Err(refuse("hash-algorithm", "must not be empty"));
            }
            if !h.eq_ignore_ascii_case("blake3") {
                return Err(refuse(
                    "hash-algorithm",
                    format!(
                        "{h:?} is not supported: kvplane resolves token ids with blake3 only \
                         (LMCache's default; other algorithms need vLLM's hasher). Run the MP \
                         servers with blake3 (their default) and drop this flag"
                    ),
                ));
            }
        }
        if let Some(path) = s
            .text(&self.checkpoint_path, "CHECKPOINT_PATH")
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
        {
            let every = s.parse(
                &self.checkpoint_interval,
                "CHECKPOINT_INTERVAL",
                "checkpoint-interval",
                CHECKPOINT_INTERVAL_S,
            )?;
            let interval = if every == 0.0 {
                None
            } else {
                Some(config::positive_seconds("checkpoint-interval", every)?)
            };
            c.checkpoint = Some(CheckpointConfig {
                path: path.into(),
                interval,
                max_bytes: checkpoint::MAX_BYTES,
            });
        } else if let Some(t) = s.text(&self.checkpoint_interval, "CHECKPOINT_INTERVAL") {
            // Validated even without a path, as 0.5.6 does.
            let v: f64 = t
                .trim()
                .parse()
                .map_err(|_| refuse("checkpoint-interval", format!("cannot parse {t:?}")))?;
            if !(v == 0.0 || v > 0.0 && v.is_finite()) {
                return Err(refuse("checkpoint-interval", format!("{v} is not >= 0")));
            }
        }
        if let Some(t) = s.text(&self.extra_config, "EXTRA_CONFIG") {
            c.features.eviction_controller = !disables_eviction(&t)?;
        }
        c.features.metrics = !s
            .text(&flag(self.disable_metrics), "DISABLE_METRICS")
            .is_some_and(|t| truthy(&t));
        if let Some(e) = s.text(&self.otlp_endpoint, "OTLP_ENDPOINT") {
            if !e.trim().is_empty() {
                return Err(refuse(
                    "otlp-endpoint",
                    "kvplane does not push OpenTelemetry metrics: scrape GET /metrics \
                     (Prometheus text) instead, e.g. with an OpenTelemetry Collector's \
                     prometheus receiver, and drop this flag",
                ));
            }
        }
        match s
            .text(&self.event_transport, "EVENT_TRANSPORT")
            .as_deref()
            .map(str::trim)
        {
            None | Some("http") => {}
            Some("kafka") => return Err(refuse("event-transport", format!("kafka: {NO_KAFKA}"))),
            Some(other) => {
                return Err(refuse(
                    "event-transport",
                    format!("{other:?} is not one of http, kafka"),
                ))
            }
        }
        for (flag, v, name) in [
            (
                "kafka-bootstrap-servers",
                &self.kafka_bootstrap_servers,
                "KAFKA_BOOTSTRAP_SERVERS",
            ),
            ("kafka-topic", &self.kafka_topic, "KAFKA_TOPIC"),
            ("kafka-group-id", &self.kafka_group_id, "KAFKA_GROUP_ID"),
        ] {
            if s.text(v, name).is_some_and(|t| !t.trim().is_empty()) {
                return Err(refuse(flag, NO_KAFKA));
            }
        }
        Ok(())
    }
}

/// Reads `--extra-config`: whether it disables the eviction controller. Refuses what kvplane
/// cannot do (Python controller packages, disabling the prefetch manager) and, as 0.5.6
/// does, names it cannot match.
fn disables_eviction(text: &str) -> Result<bool, ConfigError> {
    let bad = |d: String| refuse("extra-config", d);
    let v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| bad(format!("not JSON ({e}); expected an object such as {{}}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| bad(format!("expected a JSON object, got {v}")))?;
    let names = |key: &str| -> Result<Vec<String>, ConfigError> {
        match obj.get(key) {
            None => Ok(Vec::new()),
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .map(|n| {
                    n.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| bad(format!("{key:?} must contain strings, got {n}")))
                })
                .collect(),
            Some(other) => Err(bad(format!("{key:?} must be a list of names, got {other}"))),
        }
    };
    if !names("controller_packages")?.is_empty() {
        return Err(bad(
            "\"controller_packages\" loads Python controllers, which kvplane cannot run; \
             leave it out (kvplane's controllers are built in)"
                .into(),
        ));
    }
    let mut eviction = false;
    for n in names("disabled_controllers")? {
        match n.as_str() {
            "FleetEvictionController" => eviction = true,
            "PrefetchManager" => {
                return Err(bad(
                    "kvplane cannot disable \"PrefetchManager\": warm prefetch is built in; \
                     simply do not call /cache/prefetches"
                        .into(),
                ))
            }
            other => {
                return Err(bad(format!(
                    "\"disabled_controllers\" names {other:?}, which does not exist; \
                     available: [\"FleetEvictionController\", \"PrefetchManager\"]"
                )))
            }
        }
    }
    for key in obj.keys() {
        if key != "controller_packages" && key != "disabled_controllers" {
            tracing::warn!("--extra-config: {key:?} is not read (as in LMCache 0.5.6)");
        }
    }
    Ok(eviction)
}

#[cfg(test)]
mod tests {
    use kvplane::config::ConfigError;
    use kvplane::coordinator::CoordinatorConfig;
    use std::time::Duration;

    fn validate(argv: &[&str], env: &[(&str, &str)]) -> Result<CoordinatorConfig, ConfigError> {
        super::super::tests::validate(argv, env).map(|(c, _)| c)
    }

    #[test]
    fn defaults_match_056() {
        let c = validate(&[], &[]).unwrap();
        assert_eq!(c.chunk_size, 256);
        assert_eq!(c.blend_probe_stride, None);
        assert_eq!(c.checkpoint, None);
        assert!(c.features.eviction_controller && c.features.metrics);
    }

    #[test]
    fn blend_flags_and_the_seeds_alias() {
        let c = validate(&["--blend-chunk-size", "16", "--enable-blend-lookup"], &[]).unwrap();
        assert_eq!((c.chunk_size, c.blend_probe_stride), (16, Some(1)));
        // --chunk-size (0.5.6's name) wins over the seed's alias.
        let c = validate(&["--chunk-size", "32", "--blend-chunk-size", "16"], &[]).unwrap();
        assert_eq!(c.chunk_size, 32);
        let env = [
            ("LMCACHE_MP_COORDINATOR_BLEND_CHUNK_SIZE", "64"),
            ("LMCACHE_MP_COORDINATOR_BLEND_PROBE_STRIDE", "4"),
            ("KVPLANE_COORDINATOR_ENABLE_BLEND_LOOKUP", "yes"),
        ];
        let c = validate(&[], &env).unwrap();
        assert_eq!((c.chunk_size, c.blend_probe_stride), (64, Some(4)));
        // The stride alone does not turn the index on.
        let c = validate(&["--blend-probe-stride", "2"], &[]).unwrap();
        assert_eq!(c.blend_probe_stride, None);
    }

    #[test]
    fn checkpoint_flags() {
        let c = validate(&["--checkpoint-path", "/tmp/c.ckpt"], &[]).unwrap();
        let cp = c.checkpoint.unwrap();
        assert_eq!(cp.path, std::path::PathBuf::from("/tmp/c.ckpt"));
        assert_eq!(cp.interval, Some(Duration::from_secs(60)));
        let env = [
            ("LMCACHE_MP_COORDINATOR_CHECKPOINT_PATH", "/x"),
            ("KVPLANE_COORDINATOR_CHECKPOINT_INTERVAL", "0"),
        ];
        let c = validate(&[], &env).unwrap();
        assert_eq!(
            c.checkpoint.unwrap().interval,
            None,
            "0: only at a clean stop"
        );
        let c = validate(
            &["--checkpoint-path", "/x", "--checkpoint-interval", "2.5"],
            &[],
        )
        .unwrap();
        assert_eq!(
            c.checkpoint.unwrap().interval,
            Some(Duration::from_millis(2500))
        );
        let c = validate(&["--checkpoint-path", ""], &env).unwrap();
        assert_eq!(c.checkpoint, None);
    }

    #[test]
    fn extra_config_and_metrics() {
        let c = validate(
            &[
                "--extra-config",
                r#"{"disabled_controllers": ["FleetEvictionController"]}"#,
            ],
            &[],
        )
        .unwrap();
        assert!(!c.features.eviction_controller);
        let c = validate(&["--extra-config", "{}", "--disable-metrics"], &[]).unwrap();
        assert!(c.features.eviction_controller && !c.features.metrics);
        let c = validate(&[], &[("LMCACHE_MP_COORDINATOR_DISABLE_METRICS", "1")]).unwrap();
        assert!(!c.features.metrics);
        let c = validate(
            &["--hash-algorithm", "blake3", "--event-transport", "http"],
            &[],
        )
        .unwrap();
        assert!(c.features.metrics);
    }

    #[test]
    fn refusals_name_the_flag_and_the_alternative() {
        for (argv, env, flag, hint) in [
            (
                &["--hash-algorithm", "sha256_cbor"][..],
                &[][..],
                "--hash-algorithm",
                "blake3",
            ),
            (
                &[],
                &[("KVPLANE_COORDINATOR_HASH_ALGORITHM", "xxhash")][..],
                "--hash-algorithm",
                "blake3",
            ),
            (
                &["--otlp-endpoint", "http://otel:4317"],
                &[],
                "--otlp-endpoint",
                "GET /metrics",
            ),
            (
                &["--event-transport", "kafka"],
                &[],
                "--event-transport",
                "--coordinator-event-transport http",
            ),
            (
                &["--event-transport", "grpc"],
                &[],
                "--event-transport",
                "http, kafka",
            ),
            (
                &["--kafka-bootstrap-servers", "k:9092"],
                &[],
                "--kafka-bootstrap-servers",
                "POST /events",
            ),
            (
                &[],
                &[("LMCACHE_MP_COORDINATOR_KAFKA_TOPIC", "t")],
                "--kafka-topic",
                "POST /events",
            ),
            (
                &["--kafka-group-id", "g"],
                &[],
                "--kafka-group-id",
                "POST /events",
            ),
            (
                &["--extra-config", "[1]"],
                &[],
                "--extra-config",
                "JSON object",
            ),
            (&["--extra-config", "{"], &[], "--extra-config", "not JSON"),
            (
                &["--extra-config", r#"{"disabled_controllers": ["Nope"]}"#],
                &[],
                "--extra-config",
                "available",
            ),
            (
                &[
                    "--extra-config",
                    r#"{"disabled_controllers": "FleetEvictionController"}"#,
                ],
                &[],
                "--extra-config",
                "list of names",
            ),
            (
                &["--extra-config", r#"{"controller_packages": ["my.pkg"]}"#],
                &[],
                "--extra-config",
                "built in",
            ),
            (
                &["--checkpoint-path", "/x", "--checkpoint-interval", "-1"],
                &[],
                "--checkpoint-interval",
                "",
            ),
            (
                &["--checkpoint-interval", "x"],
                &[],
                "--checkpoint-interval",
                "parse",
            ),
            (
                &["--blend-probe-stride", "0"],
                &[],
                "--blend-probe-stride",
                "",
            ),
            (&["--blend-chunk-size", "0"], &[], "--blend-chunk-size", ""),
        ] {
            let e = validate(argv, env).expect_err("refused").to_string();
            assert!(e.starts_with(flag), "{argv:?}: {e}");
            assert!(e.contains(hint), "{argv:?}: {e}");
        }
    }
}
