//! The LMCache 0.5.6 coordinator flags beyond the seed's (spec §1.1), and the seed's
//! `--blend-chunk-size` alias: each honoured, or refused at startup with a message naming
//! what to do instead. Layered like the others (`super::args`).

use super::args::refuse;
use crate::config::{self, ConfigError};
use crate::coordinator::state::checkpoint::{self, CheckpointConfig};
use crate::coordinator::CoordinatorConfig;
use clap::Args;

/// 0.5.6's `--checkpoint-interval` default, seconds.
const CHECKPOINT_INTERVAL_S: f64 = 60.0;

/// The 0.5.6 flags.
#[derive(Debug, Clone, Args)]
pub(crate) struct Args056 {
    /// The seed's name of --chunk-size (used when --chunk-size is not given).
    #[arg(long)]
    blend_chunk_size: Option<usize>,
    /// Index stored chunks' tokens for POST /directory/blend-lookup (CacheBlend).
    #[arg(long)]
    enable_blend_lookup: bool,
    /// Query positions between blend probes (1: full recall).
    #[arg(long, default_value_t = 1)]
    blend_probe_stride: usize,
    /// Token hash of the MP servers; kvplane supports blake3 (LMCache's default).
    #[arg(long)]
    hash_algorithm: Option<String>,
    /// File where the coordinator's state is checkpointed and restored at start (empty: off).
    #[arg(long)]
    checkpoint_path: Option<String>,
    /// Seconds between checkpoints; 0: only at a clean stop.
    #[arg(long, default_value_t = CHECKPOINT_INTERVAL_S, allow_hyphen_values = true)]
    checkpoint_interval: f64,
    /// JSON object; `{"disabled_controllers": ["FleetEvictionController"]}` turns off the
    /// eviction loop and the /quota* and /cache/pins routes [default {}].
    #[arg(long, allow_hyphen_values = true)]
    extra_config: Option<String>,
    /// Do not serve GET /metrics.
    #[arg(long)]
    disable_metrics: bool,
    /// Refused: kvplane does not push OTLP metrics; scrape GET /metrics.
    #[arg(long)]
    otlp_endpoint: Option<String>,
    /// How MP servers send cache events: http (POST /events); kafka is refused.
    #[arg(long, default_value = "http")]
    event_transport: String,
    /// Refused (Kafka transport).
    #[arg(long)]
    kafka_bootstrap_servers: Option<String>,
    /// Refused (Kafka transport).
    #[arg(long)]
    kafka_topic: Option<String>,
    /// Refused (Kafka transport).
    #[arg(long)]
    kafka_group_id: Option<String>,
}

const NO_KAFKA: &str = "kvplane takes cache events over HTTP only (POST /events): run the MP \
    servers with --coordinator-event-transport http (their default) and --coordinator-url \
    pointing here; no Kafka broker is needed";

impl Args056 {
    /// Applies the flags to `c`; `chunk_size_given`: whether `--chunk-size` was set, which
    /// wins over `--blend-chunk-size`.
    pub(crate) fn apply(
        &self,
        chunk_size_given: bool,
        c: &mut CoordinatorConfig,
    ) -> Result<(), ConfigError> {
        if let (false, Some(n)) = (chunk_size_given, self.blend_chunk_size) {
            c.chunk_size = config::at_least_one("blend-chunk-size", n)?;
        }
        let stride = config::at_least_one("blend-probe-stride", self.blend_probe_stride)?;
        c.blend_probe_stride = self.enable_blend_lookup.then_some(stride);
        if let Some(h) = &self.hash_algorithm {
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
        // Validated even without a path, as 0.5.6 does.
        let every = self.checkpoint_interval;
        let interval = if every == 0.0 {
            None
        } else {
            Some(config::positive_seconds("checkpoint-interval", every)?)
        };
        c.checkpoint = self
            .checkpoint_path
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|path| CheckpointConfig {
                path: path.into(),
                interval,
                max_bytes: checkpoint::MAX_BYTES,
            });
        if let Some(t) = &self.extra_config {
            c.features.eviction_controller = !disables_eviction(t)?;
        }
        c.features.metrics = !self.disable_metrics;
        if self
            .otlp_endpoint
            .as_deref()
            .is_some_and(|e| !e.trim().is_empty())
        {
            return Err(refuse(
                "otlp-endpoint",
                "kvplane does not push OpenTelemetry metrics: scrape GET /metrics \
                 (Prometheus text) instead, e.g. with an OpenTelemetry Collector's \
                 prometheus receiver, and drop this flag",
            ));
        }
        match self.event_transport.trim() {
            "http" => {}
            "kafka" => return Err(refuse("event-transport", format!("kafka: {NO_KAFKA}"))),
            other => {
                return Err(refuse(
                    "event-transport",
                    format!("{other:?} is not one of http, kafka"),
                ))
            }
        }
        for (flag, v) in [
            ("kafka-bootstrap-servers", &self.kafka_bootstrap_servers),
            ("kafka-topic", &self.kafka_topic),
            ("kafka-group-id", &self.kafka_group_id),
        ] {
            if v.as_deref().is_some_and(|t| !t.trim().is_empty()) {
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
