//! The router's flags ([`RouterArgs`], each with its `KVPLANE_ROUTER_<FLAG>` twin through
//! `crate::service::layers`, and `--config`) and their validated form ([`RouterConfig`]),
//! with the engine list's syntax ([`EngineSpec`]). Defaults are in
//! [`crate::config::defaults::router`].
//!
//! [`layout`] names the router's layers; [`embedded`] reads the flags of a router that
//! `kvplane serve --router-port` runs beside its indexer. Parses no command line itself (the
//! binary's layered parse does) and starts nothing.

use super::model::score;
use crate::config::defaults::router as d;
use crate::indexer::api::EngineType;
use crate::service::layers::{self, Alias, Convert, Embedded, LayerError, Layout};
use std::path::PathBuf;
use std::time::Duration;

/// One engine: its OpenAI server and, optionally, its KV-event publisher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineSpec {
    /// `http://host:port`, no trailing slash.
    pub url: String,
    /// Its instance id in the index (default: `host:port` of the URL).
    pub instance: String,
    /// Its KV-event PUB endpoint (`tcp://host:port`), registered in the in-process index.
    pub events: Option<String>,
    /// Its replay endpoint.
    pub replay: Option<String>,
    /// Its data-parallel rank.
    pub dp_rank: u32,
    /// `vLLM` or `SGLang` (its events' format).
    pub kind: EngineType,
    /// Requests it takes at once from every router replica together (`None`:
    /// `--engine-slots`).
    pub slots: Option<u64>,
}

impl std::str::FromStr for EngineSpec {
    type Err = String;

    /// `URL[,instance=ID][,events=tcp://H:P][,replay=tcp://H:P][,dp_rank=N][,type=vLLM|SGLang][,slots=N]`.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = s.split(',');
        let url = parts.next().unwrap_or_default().trim_end_matches('/');
        let authority = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("{url}: the engine URL must start with http://"))?;
        if authority.is_empty() || authority.contains('/') {
            return Err(format!("{url}: expected http://host:port"));
        }
        let mut spec = EngineSpec {
            url: url.to_owned(),
            instance: authority.to_owned(),
            events: None,
            replay: None,
            dp_rank: 0,
            kind: EngineType::Vllm,
            slots: None,
        };
        for part in parts {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("{part}: expected key=value"))?;
            match k {
                "instance" if !v.is_empty() => spec.instance = v.to_owned(),
                "events" if v.starts_with("tcp://") => spec.events = Some(v.to_owned()),
                "replay" if v.starts_with("tcp://") => spec.replay = Some(v.to_owned()),
                "dp_rank" => spec.dp_rank = v.parse().map_err(|_| format!("dp_rank={v}"))?,
                "slots" => {
                    spec.slots = Some(
                        v.parse()
                            .ok()
                            .filter(|n| *n > 0)
                            .ok_or_else(|| format!("slots={v}: a number > 0"))?,
                    )
                }
                "type" => {
                    spec.kind = match v.to_ascii_lowercase().as_str() {
                        "vllm" => EngineType::Vllm,
                        "sglang" => EngineType::Sglang,
                        _ => return Err(format!("type={v}: vLLM or SGLang")),
                    }
                }
                _ => return Err(format!("{part}: unknown or invalid engine option")),
            }
        }
        Ok(spec)
    }
}

/// Where the router learns engines beyond `--engine` (docs/ROUTER.md, "Discovery").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Discover {
    /// The registrations of the index the router asks: its in-process indexer's (`/register`
    /// on `--indexer-port`), or in `kvplane serve` the indexer beside it.
    Index,
    /// A separate `kvplane indexer` (`http://host:port`), read through its `GET /services`;
    /// each engine found is registered in the router's own in-process index too.
    Indexer(String),
}

impl std::str::FromStr for Discover {
    type Err = String;

    /// `index`, or `http://host:port` of a `kvplane indexer`.
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "index" {
            return Ok(Self::Index);
        }
        let url = s.trim_end_matches('/');
        match url.strip_prefix("http://") {
            Some(a) if !a.is_empty() && !a.contains('/') => Ok(Self::Indexer(url.to_owned())),
            _ => Err(format!(
                "{s}: `index` or a kvplane indexer's http://host:port"
            )),
        }
    }
}

/// Flags of `kvplane router`, each with a `KVPLANE_ROUTER_*` environment twin.
#[derive(Clone, Debug, clap::Args)]
#[command(
    mut_arg("api_token", |a| a.env("KVPLANE_ROUTER_API_TOKEN")),
    mut_arg("api_token_reads", |a| a.env("KVPLANE_ROUTER_API_TOKEN_READS")),
    mut_arg("api_token_peers", |a| a.env("KVPLANE_ROUTER_API_TOKEN_PEERS"))
)]
pub struct RouterArgs {
    /// `--api-token` and its scope: the doctor always needs it once set; with
    /// `--api-token-reads` the OpenAI routes too (OpenAI clients send `Authorization:
    /// Bearer`).
    #[command(flatten)]
    pub auth: crate::web::access::AuthArgs,
    /// Address the HTTP server binds to.
    #[arg(long, env = "KVPLANE_ROUTER_HOST", default_value = "0.0.0.0")]
    pub host: String,
    /// HTTP port; 0 picks a free one.
    #[arg(long, env = "KVPLANE_ROUTER_PORT", default_value_t = d::PORT)]
    pub port: u16,
    /// An engine (repeat the flag; `KVPLANE_ROUTER_ENGINES` separates them with spaces);
    /// required without `--discover`:
    /// `http://host:port[,instance=ID][,events=tcp://host:port][,replay=tcp://host:port][,dp_rank=N][,type=vLLM|SGLang][,slots=N]`.
    #[arg(long = "engine", env = "KVPLANE_ROUTER_ENGINES", value_delimiter = ' ')]
    pub engines: Vec<EngineSpec>,
    /// Also route to the engines registered in an index (docs/ROUTER.md, "Discovery"):
    /// `index` (the registrations of the router's own index: `/register` on
    /// `--indexer-port`, or `kvplane serve`'s indexer), or a `kvplane indexer`'s
    /// `http://host:port`. An instance's HTTP server is its registration's `http_endpoint`,
    /// else its event endpoint's host at `--discover-http-port`.
    #[arg(long, env = "KVPLANE_ROUTER_DISCOVER")]
    pub discover: Option<Discover>,
    /// The HTTP port of a discovered instance registered without `http_endpoint`, on its
    /// event endpoint's host (vLLM's `--port`); without it such an instance is not routed to
    /// (counted).
    #[arg(long, env = "KVPLANE_ROUTER_DISCOVER_HTTP_PORT")]
    pub discover_http_port: Option<u16>,
    /// Seconds between two reads of the registrations (`--discover`).
    #[arg(long, env = "KVPLANE_ROUTER_DISCOVERY_INTERVAL", default_value_t = d::DISCOVERY_INTERVAL_S)]
    pub discovery_interval: f64,
    /// The bearer token `GET /services` of a separate indexer needs (its
    /// `--api-token`, when it requires one for reads).
    #[arg(long, env = "KVPLANE_ROUTER_DISCOVER_TOKEN")]
    pub discover_token: Option<String>,
    /// The served model name (the engines' `--served-model-name`); a request naming another
    /// model names a LoRA adapter.
    #[arg(long, env = "KVPLANE_ROUTER_MODEL")]
    pub model: String,
    /// The model directory holding tokenizer.json (and tokenizer_config.json with the chat
    /// template); without it every prompt is tokenized by an engine's `/tokenize`.
    #[arg(long, env = "KVPLANE_ROUTER_MODEL_DIR")]
    pub model_dir: Option<PathBuf>,
    /// Tokens per KV block (the engines' `--block-size`).
    #[arg(long, env = "KVPLANE_ROUTER_BLOCK_SIZE", default_value_t = d::BLOCK_SIZE)]
    pub block_size: u32,
    /// XXH3 seed of the index's standard block hashes.
    #[arg(long, env = "KVPLANE_ROUTER_HASH_SEED", default_value_t = crate::indexer::hash::DEFAULT_SEED)]
    pub hash_seed: u64,
    /// Weight of the cached fraction of the prompt in the score.
    #[arg(long, env = "KVPLANE_ROUTER_OVERLAP_WEIGHT", default_value_t = 1.0)]
    pub overlap_weight: f64,
    /// Weight of the relative load in the score.
    #[arg(long, env = "KVPLANE_ROUTER_LOAD_WEIGHT", default_value_t = 1.0)]
    pub load_weight: f64,
    /// Value of a cached token only in the CPU tier, relative to one in GPU memory.
    #[arg(long, env = "KVPLANE_ROUTER_CPU_TIER_WEIGHT", default_value_t = 0.8)]
    pub cpu_tier_weight: f64,
    /// Value of a cached token only on disk, relative to one in GPU memory.
    #[arg(long, env = "KVPLANE_ROUTER_DISK_TIER_WEIGHT", default_value_t = 0.5)]
    pub disk_tier_weight: f64,
    /// Load units (requests in flight, waiting ones twice) that weigh as much as a whole
    /// prompt's overlap, unless an engine is busier (then the busiest one's units).
    #[arg(long, env = "KVPLANE_ROUTER_LOAD_SCALE", default_value_t = 8.0)]
    pub load_scale: f64,
    /// Seconds between scrapes of every engine's Prometheus `/metrics` (its running and
    /// waiting requests and KV cache usage, blended into the load); 0: never.
    #[arg(long, env = "KVPLANE_ROUTER_ENGINE_METRICS_INTERVAL", default_value_t = d::ENGINE_METRICS_INTERVAL_S)]
    pub engine_metrics_interval: f64,
    /// Weight of the engine's own request counts beyond those the router tracks, in load
    /// units (0: the engines' counts are not used).
    #[arg(
        long,
        env = "KVPLANE_ROUTER_ENGINE_METRICS_WEIGHT",
        default_value_t = 1.0
    )]
    pub engine_metrics_weight: f64,
    /// Weight of the engine's KV cache usage (0..1) in the score.
    #[arg(long, env = "KVPLANE_ROUTER_KV_USAGE_WEIGHT", default_value_t = 0.25)]
    pub kv_usage_weight: f64,
    /// Added to the score of the engine that served the request's session last (the
    /// `x-session-id` header, else the body's `user`); 0: no affinity.
    #[arg(long, env = "KVPLANE_ROUTER_SESSION_WEIGHT", default_value_t = 0.5)]
    pub session_weight: f64,
    /// Seconds a session is remembered after its last request.
    #[arg(long, env = "KVPLANE_ROUTER_SESSION_TTL", default_value_t = d::SESSION_TTL_S)]
    pub session_ttl: f64,
    /// Softmax temperature over the scores; 0 picks the best.
    #[arg(long, env = "KVPLANE_ROUTER_TEMPERATURE", default_value_t = 0.0)]
    pub temperature: f64,
    /// Seconds to connect to an engine (a refused or timed-out connect goes to the next).
    #[arg(long, env = "KVPLANE_ROUTER_CONNECT_TIMEOUT", default_value_t = d::CONNECT_TIMEOUT_S)]
    pub connect_timeout: f64,
    /// Seconds to an engine's response head (504 beyond).
    #[arg(long, env = "KVPLANE_ROUTER_RESPONSE_TIMEOUT", default_value_t = d::RESPONSE_TIMEOUT_S)]
    pub response_timeout: f64,
    /// Seconds between two chunks of an engine's body (the stream is cut beyond).
    #[arg(long, env = "KVPLANE_ROUTER_STREAM_IDLE_TIMEOUT", default_value_t = d::STREAM_IDLE_TIMEOUT_S)]
    pub stream_idle_timeout: f64,
    /// Seconds between health probes (`GET /health`) of every engine.
    #[arg(long, env = "KVPLANE_ROUTER_HEALTH_INTERVAL", default_value_t = d::HEALTH_INTERVAL_S)]
    pub health_interval: f64,
    /// Largest request body, bytes (413 beyond).
    #[arg(long, env = "KVPLANE_ROUTER_MAX_BODY_BYTES", default_value_t = d::MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Largest non-streaming engine answer, bytes (502 beyond).
    #[arg(long, env = "KVPLANE_ROUTER_MAX_RESPONSE_BYTES", default_value_t = d::MAX_RESPONSE_BYTES)]
    pub max_response_bytes: usize,
    /// HTTP connections served at once.
    #[arg(long, env = "KVPLANE_ROUTER_MAX_HTTP_CONNECTIONS", default_value_t = d::MAX_HTTP_CONNECTIONS)]
    pub max_http_connections: usize,
    /// Port of the in-process indexer's HTTP API (`/register`, `/query`, its dashboard) on
    /// 127.0.0.1; 0 picks a free one (logged).
    #[arg(long, env = "KVPLANE_ROUTER_INDEXER_PORT", default_value_t = 0)]
    pub indexer_port: u16,
    /// Requests an engine takes at once from every replica together (an engine's own
    /// `slots=N` wins); 0: unlimited. A request finding every engine full is answered 429.
    #[arg(long, env = "KVPLANE_ROUTER_ENGINE_SLOTS", default_value_t = 0)]
    pub engine_slots: u64,
    /// NATS JetStream (`nats://HOST:PORT[,…]`) through which router replicas share their
    /// reservations, so two replicas routing at once see each other's choice
    /// (docs/ROUTER.md, "Replicas that do not herd").
    #[arg(long, env = "KVPLANE_ROUTER_CLUSTER")]
    pub cluster: Option<String>,
    /// The cluster's name (replicas of one fleet share it; A-Z a-z 0-9 _ -).
    #[arg(long, env = "KVPLANE_ROUTER_CLUSTER_NAME", default_value = crate::config::defaults::cluster::NAME)]
    pub cluster_name: String,
    /// Share the blocks a routed request will add with the other replicas (in its
    /// reservation, a sample of its prompt's block hashes), so two replicas routing one
    /// prefix at once send it to the same engine (docs/ROUTER.md, "Replicas that do not
    /// herd"); `false`: share the load only.
    #[arg(long, env = "KVPLANE_ROUTER_SHARE_BLOCKS", default_value_t = true, action = clap::ArgAction::Set)]
    pub share_blocks: bool,
    /// Seconds a shared reservation counts at most: one whose release never came (a replica
    /// that died, NATS down at the release) stops counting then (counted as expired).
    #[arg(long, env = "KVPLANE_ROUTER_RESERVATION_TTL", default_value_t = d::RESERVATION_TTL_S)]
    pub reservation_ttl: f64,
    /// Check hash parity with every engine and exit (0: all agree; 1: a mismatch, named):
    /// a probe prompt per engine, its published blocks against the index's key, its reuse.
    #[arg(long)]
    pub doctor: bool,
    /// Seconds the doctor waits for an engine's probe blocks to reach the index.
    #[arg(long, env = "KVPLANE_ROUTER_DOCTOR_WAIT", default_value_t = 10.0)]
    pub doctor_wait: f64,
}

/// `v` seconds, refused (naming `flag`) unless positive and finite.
fn secs(flag: &str, v: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(v)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{flag} must be a positive number of seconds, not {v}"))
}

/// `v`, refused (naming `flag`) when 0.
fn at_least_one(flag: &str, v: usize) -> Result<usize, String> {
    if v == 0 {
        return Err(format!("{flag} must be > 0"));
    }
    Ok(v)
}

impl RouterArgs {
    /// The validated configuration.
    ///
    /// # Errors
    /// A weight out of range, or no engine.
    pub fn config(&self) -> Result<RouterConfig, String> {
        for (name, v) in [
            ("--cpu-tier-weight", self.cpu_tier_weight),
            ("--disk-tier-weight", self.disk_tier_weight),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{name} must be within 0..=1"));
            }
        }
        for (name, v) in [
            ("--overlap-weight", self.overlap_weight),
            ("--load-weight", self.load_weight),
            ("--temperature", self.temperature),
            ("--load-scale", self.load_scale),
            ("--engine-metrics-interval", self.engine_metrics_interval),
            ("--engine-metrics-weight", self.engine_metrics_weight),
            ("--kv-usage-weight", self.kv_usage_weight),
            ("--session-weight", self.session_weight),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(format!("{name} must be a number ≥ 0"));
            }
        }
        if self.engines.is_empty() && self.discover.is_none() {
            return Err("no engine: give --engine (repeated) or --discover".into());
        }
        if self.block_size == 0 {
            return Err("--block-size must be > 0".into());
        }
        if self.load_scale < 1.0 {
            return Err(format!("--load-scale must be ≥ 1, not {}", self.load_scale));
        }
        Ok(RouterConfig {
            host: self.host.clone(),
            port: self.port,
            engines: self.engines.clone(),
            discover: self.discover.clone(),
            discover_http_port: self.discover_http_port,
            discovery_interval: secs("--discovery-interval", self.discovery_interval)?,
            discover_token: self.discover_token.clone().filter(|t| !t.is_empty()),
            model: self.model.clone(),
            model_dir: self.model_dir.clone(),
            tenant: "default".into(),
            block_size: self.block_size,
            hash_seed: self.hash_seed,
            weights: score::Weights {
                overlap: self.overlap_weight,
                load: self.load_weight,
                cpu_tier: self.cpu_tier_weight,
                disk_tier: self.disk_tier_weight,
                temperature: self.temperature,
                load_scale: self.load_scale,
                engine_metrics: self.engine_metrics_weight,
                kv_usage: self.kv_usage_weight,
                session: self.session_weight,
            },
            connect_timeout: secs("--connect-timeout", self.connect_timeout)?,
            response_timeout: secs("--response-timeout", self.response_timeout)?,
            stream_idle_timeout: secs("--stream-idle-timeout", self.stream_idle_timeout)?,
            health_interval: secs("--health-interval", self.health_interval)?,
            max_body_bytes: at_least_one("--max-body-bytes", self.max_body_bytes)?,
            max_response_bytes: at_least_one("--max-response-bytes", self.max_response_bytes)?,
            max_http_connections: at_least_one(
                "--max-http-connections",
                self.max_http_connections,
            )?,
            indexer_port: self.indexer_port,
            auth: crate::web::access::Auth::from(&self.auth),
            engine_slots: (self.engine_slots > 0).then_some(self.engine_slots),
            cluster: self
                .cluster
                .as_ref()
                .map(|url| crate::cluster::ClusterConfig {
                    name: self.cluster_name.clone(),
                    ..crate::cluster::ClusterConfig::new(url.clone())
                }),
            reservation_ttl: secs("--reservation-ttl", self.reservation_ttl)?,
            share_blocks: self.share_blocks,
            session_ttl: secs("--session-ttl", self.session_ttl)?,
            engine_metrics_interval: if self.engine_metrics_interval == 0.0 {
                None
            } else {
                Some(secs(
                    "--engine-metrics-interval",
                    self.engine_metrics_interval,
                )?)
            },
        })
    }
}

/// The router's configuration.
#[derive(Clone, Debug)]
pub struct RouterConfig {
    /// HTTP bind host.
    pub host: String,
    /// HTTP port (0: any).
    pub port: u16,
    /// The engines of `--engine`.
    pub engines: Vec<EngineSpec>,
    /// Where more engines are discovered (`None`: only `--engine`'s).
    pub discover: Option<Discover>,
    /// The HTTP port of a discovered instance without `http_endpoint`.
    pub discover_http_port: Option<u16>,
    /// Time between two reads of the registrations.
    pub discovery_interval: Duration,
    /// The bearer token of a separate indexer's `GET /services`.
    pub discover_token: Option<String>,
    /// The served model name (the index's model).
    pub model: String,
    /// Where tokenizer.json is.
    pub model_dir: Option<PathBuf>,
    /// The index tenant the engines are registered under.
    pub tenant: String,
    /// Tokens per block.
    pub block_size: u32,
    /// The index's hash seed.
    pub hash_seed: u64,
    /// The score's weights and temperature.
    pub weights: score::Weights,
    /// Connect timeout per engine call.
    pub connect_timeout: Duration,
    /// Deadline for a response head.
    pub response_timeout: Duration,
    /// Most time between two chunks of a body.
    pub stream_idle_timeout: Duration,
    /// Time between health probes.
    pub health_interval: Duration,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Largest non-streaming answer.
    pub max_response_bytes: usize,
    /// HTTP connections served at once.
    pub max_http_connections: usize,
    /// The in-process indexer's HTTP port on 127.0.0.1 (0: any).
    pub indexer_port: u16,
    /// `--api-token` and its scope (docs/ROUTER.md, "Authentication").
    pub auth: crate::web::access::Auth,
    /// Slots of an engine without its own `slots=N` (`None`: unlimited).
    pub engine_slots: Option<u64>,
    /// The cluster through which replicas share reservations (`None`: local only).
    pub cluster: Option<crate::cluster::ClusterConfig>,
    /// How long a shared reservation counts at most.
    pub reservation_ttl: Duration,
    /// Whether reservations carry the blocks their request will add.
    pub share_blocks: bool,
    /// Time between scrapes of the engines' `/metrics` (`None`: never).
    pub engine_metrics_interval: Option<Duration>,
    /// How long a session is remembered after its last request.
    pub session_ttl: Duration,
}

impl RouterConfig {
    /// A configuration with the defaults for `engines` serving `model` (tests, embedding).
    pub fn new(model: &str, engines: Vec<EngineSpec>) -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 0,
            engines,
            discover: None,
            discover_http_port: None,
            discovery_interval: Duration::from_secs_f64(d::DISCOVERY_INTERVAL_S),
            discover_token: None,
            model: model.into(),
            model_dir: None,
            tenant: "default".into(),
            block_size: d::BLOCK_SIZE,
            hash_seed: crate::indexer::hash::DEFAULT_SEED,
            weights: score::Weights::default(),
            connect_timeout: Duration::from_secs_f64(d::CONNECT_TIMEOUT_S),
            response_timeout: Duration::from_secs_f64(d::RESPONSE_TIMEOUT_S),
            stream_idle_timeout: Duration::from_secs_f64(d::STREAM_IDLE_TIMEOUT_S),
            health_interval: Duration::from_secs_f64(d::HEALTH_INTERVAL_S),
            max_body_bytes: d::MAX_BODY_BYTES,
            max_response_bytes: d::MAX_RESPONSE_BYTES,
            max_http_connections: d::MAX_HTTP_CONNECTIONS,
            indexer_port: 0,
            auth: crate::web::access::Auth::default(),
            engine_slots: None,
            cluster: None,
            reservation_ttl: Duration::from_secs_f64(d::RESERVATION_TTL_S),
            share_blocks: true,
            engine_metrics_interval: Some(Duration::from_secs_f64(d::ENGINE_METRICS_INTERVAL_S)),
            session_ttl: Duration::from_secs_f64(d::SESSION_TTL_S),
        }
    }
}

/// The router's layers: its `KVPLANE_ROUTER_<FLAG>` twins (given by `service::layers`), and
/// `KVPLANE_ROUTER_ENGINES` (engines separated by spaces) for `--engine`.
#[must_use]
pub fn layout() -> Layout {
    Layout {
        service: "ROUTER",
        aliases: vec![Alias {
            var: "KVPLANE_ROUTER_ENGINES".into(),
            flag: "engine".into(),
            convert: Convert::Text,
            deprecated: false,
        }],
        ..Layout::default()
    }
}

/// The router run inside `kvplane serve --router-port PORT` beside serve's indexer: the
/// same flags, read from `KVPLANE_ROUTER_*` (through `at.env`) and `at.file` (the `router:`
/// section of serve's `--config`), on serve's host and `PORT`. Without `--engine` or
/// `--discover` it discovers the engines registered at that indexer (`--discover index`).
/// `--indexer-port` (serve's indexer is the router's index) and `--doctor` are refused.
///
/// # Errors
/// A value is refused, naming the flag and where it came from.
pub fn embedded(at: &Embedded<'_>) -> Result<RouterConfig, LayerError> {
    let (mut args, prov) = at.parse::<RouterArgs>(&layout())?;
    let not_here =
        |flag: &str, why: &str| format!("--{flag}: not for a router run by kvplane serve ({why})");
    layers::refuse_given(
        &prov,
        [
            (
                args.indexer_port != 0,
                not_here(
                    "indexer-port",
                    "serve's --indexer-port is the router's index",
                ),
            ),
            (
                args.doctor,
                not_here("doctor", "run `kvplane router --doctor` on its own"),
            ),
        ],
    )?;
    if args.engines.is_empty() && args.discover.is_none() {
        args.discover = Some(Discover::Index);
    }
    args.config().map_err(|e| LayerError(prov.explain(&e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::layers::Settings;

    fn settings(yaml: &str) -> Settings {
        let dir = std::env::temp_dir().join(format!("kvplane-router-{}", rand::random::<u64>()));
        std::fs::write(&dir, yaml).expect("write settings");
        let s = Settings::read(&dir).expect("settings");
        let _ = std::fs::remove_file(&dir);
        s
    }

    #[test]
    fn serve_runs_it_from_its_variables_and_section() {
        let vars = |k: &str| match k {
            "KVPLANE_ROUTER_MODEL" => Some("m".to_owned()),
            "KVPLANE_ROUTER_LOAD_WEIGHT" => Some("2".to_owned()),
            _ => None,
        };
        let c = embedded(&Embedded::new("10.0.0.1", 9501, &vars, None)).expect("valid");
        assert_eq!((c.host.as_str(), c.port), ("10.0.0.1", 9501));
        assert_eq!(c.weights.load, 2.0);
        // No engine named: the ones registered at serve's indexer.
        assert_eq!(c.discover, Some(Discover::Index));
        let file = settings("block_size: 32\nengine: [\"http://e:8000\"]\nmodel: f\n");
        let c = embedded(&Embedded::new("h", 0, &|_| None, Some(&file))).expect("valid");
        assert_eq!((c.model.as_str(), c.block_size), ("f", 32));
        assert_eq!((c.engines.len(), c.discover), (1, None));
        let spaced = |k: &str| match k {
            "KVPLANE_ROUTER_MODEL" => Some("m".to_owned()),
            "KVPLANE_ROUTER_ENGINES" => Some("http://a:1 http://b:2".to_owned()),
            _ => None,
        };
        assert_eq!(
            embedded(&Embedded::new("h", 0, &spaced, None))
                .expect("valid")
                .engines
                .len(),
            2
        );
    }

    #[test]
    fn serve_refuses_what_it_decides_and_names_where_it_came_from() {
        let file = settings("model: m\nport: 1\n");
        let e =
            embedded(&Embedded::new("h", 0, &|_| None, Some(&file))).expect_err("port is serve's");
        assert!(e.0.contains("--port"), "{e}");
        let file = settings("model: m\nindexer_port: 7\n");
        let e =
            embedded(&Embedded::new("h", 0, &|_| None, Some(&file))).expect_err("serve's indexer");
        assert!(
            e.0.contains("--indexer-port") && e.0.contains("config file"),
            "{e}"
        );
        let bad = |k: &str| match k {
            "KVPLANE_ROUTER_MODEL" => Some("m".to_owned()),
            "KVPLANE_ROUTER_TEMPERATURE" => Some("-1".to_owned()),
            _ => None,
        };
        let e = embedded(&Embedded::new("h", 0, &bad, None)).expect_err("refused");
        assert!(
            e.0.contains("--temperature") && e.0.contains("KVPLANE_ROUTER_TEMPERATURE"),
            "{e}"
        );
    }
}
