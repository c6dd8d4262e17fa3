//! `kvplane indexer`'s flags ([`IndexerArgs`], each with its `KVPLANE_INDEXER_<FLAG>` twin
//! through `crate::service::layers`, and the `--config` file by flag name) and the validated
//! [`IndexerConfig`]. A bad value is refused naming its flag (clap's value parsers), never
//! clamped. [`embedded`] reads the same flags for the indexer that `kvplane serve
//! --indexer-port` runs. Parses nothing from the process itself.

use super::central;
use crate::config::defaults::indexer as d;
use crate::indexer::model::index::IndexConfig;
use crate::service::layers::{self, Embedded, LayerError, Layout};
use std::time::Duration;

/// Flags of `kvplane indexer`, each with a `KVPLANE_*` environment twin.
#[derive(Clone, Debug, clap::Args)]
#[command(
    mut_arg("api_token", |a| a.env("KVPLANE_INDEXER_API_TOKEN")),
    mut_arg("api_token_reads", |a| a.env("KVPLANE_INDEXER_API_TOKEN_READS")),
    mut_arg("api_token_peers", |a| a.env("KVPLANE_INDEXER_API_TOKEN_PEERS"))
)]
pub struct IndexerArgs {
    /// `--api-token` and its scope (docs/INDEXER.md, "Authentication").
    #[command(flatten)]
    pub auth: crate::web::access::AuthArgs,
    /// Address the HTTP server binds to.
    #[arg(long, env = "KVPLANE_INDEXER_HOST", default_value = "0.0.0.0")]
    pub host: String,
    /// HTTP port; 0 picks a free one.
    #[arg(long, env = "KVPLANE_INDEXER_PORT", default_value_t = 13333)]
    pub port: u16,
    /// XXH3 seed of the standard block hashes (Dynamo uses 1337).
    #[arg(long, env = "KVPLANE_INDEXER_HASH_SEED", default_value_t = crate::indexer::model::hash::DEFAULT_SEED)]
    pub hash_seed: u64,
    /// At most this many (holder, block) memberships; at the limit the least recently stored
    /// are evicted (about 1/16 at a time), or with `--capacity-policy refuse` new ones are
    /// refused. Both counted.
    #[arg(
        long,
        env = "KVPLANE_INDEXER_MAX_MEMBERSHIPS",
        default_value_t = 50_000_000,
        value_parser = max_memberships
    )]
    pub max_memberships: usize,
    /// What happens at `--max-memberships`: `evict` the least recently stored, or `refuse`
    /// new memberships.
    #[arg(long, env = "KVPLANE_INDEXER_CAPACITY_POLICY", default_value = "evict", value_parser = ["evict", "refuse"])]
    pub capacity_policy: String,
    /// Drop blocks not stored again within this many seconds (0: never).
    #[arg(long, env = "KVPLANE_INDEXER_TTL_SECS", default_value_t = 0)]
    pub ttl_secs: u32,
    /// A JSON file of publishers to register at start: a list of `/register` bodies, or
    /// `{"kvevent_instance": [...]}` as the Go Conductor's config.
    #[arg(long, env = "KVPLANE_INDEXER_PUBLISHERS")]
    pub publishers: Option<std::path::PathBuf>,
    /// Per-reply timeout of a replay, in milliseconds.
    #[arg(
        long,
        env = "KVPLANE_INDEXER_REPLAY_TIMEOUT_MS",
        value_parser = clap::value_parser!(u64).range(1..),
        default_value_t = 5000
    )]
    pub replay_timeout_ms: u64,
    /// Live messages queued per publisher; when full, the publisher's socket is not read
    /// until there is room (the publisher's own send queue holds the rest; counted).
    #[arg(long, env = "KVPLANE_INDEXER_QUEUE_CAPACITY", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..), default_value_t = d::QUEUE_CAPACITY)]
    pub queue_capacity: usize,
    /// Payload bytes queued per publisher (live queue and replay buffer each) at most.
    #[arg(long, env = "KVPLANE_INDEXER_MAX_QUEUED_BYTES", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..), default_value_t = d::MAX_QUEUED_BYTES)]
    pub max_queued_bytes: usize,
    /// Largest ZMQ frame accepted from a publisher; a larger one closes that connection.
    #[arg(long, env = "KVPLANE_INDEXER_MAX_FRAME_BYTES", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..), default_value_t = d::MAX_FRAME_BYTES)]
    pub max_frame_bytes: usize,
    /// Registered services at most; more registrations get 400 `out_of_range`.
    #[arg(long, env = "KVPLANE_INDEXER_MAX_SERVICES", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..), default_value_t = d::MAX_SERVICES)]
    pub max_services: usize,
    /// Largest HTTP request body, bytes (413 beyond, before it is read when announced).
    #[arg(long, env = "KVPLANE_INDEXER_MAX_BODY_BYTES", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..), default_value_t = d::MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// HTTP connections served at once; more wait in the kernel's accept queue.
    #[arg(
        long,
        env = "KVPLANE_INDEXER_MAX_HTTP_CONNECTIONS", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..),
        default_value_t = d::MAX_HTTP_CONNECTIONS
    )]
    pub max_http_connections: usize,
    /// Seconds an HTTP client has to send a request's headers (also the keep-alive idle
    /// time), then its body.
    #[arg(
        long,
        env = "KVPLANE_INDEXER_HTTP_READ_TIMEOUT",
        value_parser = positive_seconds,
        default_value_t = d::HTTP_READ_TIMEOUT_S
    )]
    pub http_read_timeout: f64,
    /// NATS JetStream to replicate through, `nats://HOST:PORT` (docs/CLUSTER.md): an
    /// ingester publishes every change it applies; a `--replica` follows them.
    #[arg(long, env = "KVPLANE_CLUSTER")]
    pub cluster: Option<String>,
    /// The cluster's name, so several fleets can share one NATS (A-Z a-z 0-9 _ -).
    #[arg(long, env = "KVPLANE_CLUSTER_NAME", default_value = crate::config::defaults::cluster::NAME)]
    pub cluster_name: String,
    /// Most bytes the cluster's change stream keeps (oldest dropped first).
    #[arg(long, env = "KVPLANE_CLUSTER_MAX_BYTES", value_parser = clap::value_parser!(i64).range(crate::cluster::args::MIN_MAX_BYTES..), default_value_t = crate::config::defaults::cluster::MAX_BYTES)]
    pub cluster_max_bytes: i64,
    /// Run as a read replica of the cluster's ingester (needs `--cluster`): no publishers,
    /// `/register` answers 409, queries are answered from the followed changes.
    #[arg(long, env = "KVPLANE_INDEXER_REPLICA", requires = "cluster")]
    pub replica: bool,
    /// A replica publishes a snapshot of its index every this many records it applies (at
    /// most one every 10 s, only in sync; 0: never), for replicas that start later.
    #[arg(long, env = "KVPLANE_CLUSTER_SNAPSHOT_RECORDS", default_value_t = crate::config::defaults::cluster::SNAPSHOT_RECORDS)]
    pub cluster_snapshot_records: u64,
    /// Bind a SUB socket publishers connect to (`tcp://*:5556`; repeat the flag, the env
    /// twin separates them with commas): llm-d's central topology. Each message's topic names
    /// its instance (`--topic-pattern`).
    #[arg(long = "bind", env = "KVPLANE_INDEXER_BIND", value_delimiter = ',')]
    pub binds: Vec<String>,
    /// How the topic of a message on a `--bind` socket names its instance: `{address}` (the
    /// instance, matched to a registration whose endpoint is `tcp://{address}`) and
    /// `{model}` between literal text.
    #[arg(long, env = "KVPLANE_INDEXER_TOPIC_PATTERN", default_value = d::TOPIC_PATTERN, value_parser = central::TopicPattern::parse)]
    pub topic_pattern: central::TopicPattern,
    /// Tokens per block of an instance created by its topic (no registration).
    #[arg(long, env = "KVPLANE_INDEXER_TOPIC_BLOCK_SIZE", value_parser = clap::value_parser!(u32).range(1..), default_value_t = d::TOPIC_BLOCK_SIZE)]
    pub topic_block_size: u32,
    /// Instances created by their topic at most; messages of further new topics are dropped
    /// and counted (`kvplane_indexer_topic_refused_total{reason="instance_cap"}`).
    #[arg(long, env = "KVPLANE_INDEXER_MAX_TOPIC_INSTANCES", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..), default_value_t = d::MAX_TOPIC_INSTANCES)]
    pub max_topic_instances: usize,
}

/// `--max-memberships`: 1 to [`crate::indexer::model::index::MAX_MEMBERSHIPS`].
fn max_memberships(s: &str) -> Result<usize, String> {
    let max = crate::indexer::model::index::MAX_MEMBERSHIPS;
    match s.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("must be a whole number from 1 to {max}")),
    }
}

/// A positive, finite number of seconds (clap names the flag when this refuses).
fn positive_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && Duration::try_from_secs_f64(v).is_ok() => Ok(v),
        _ => Err(format!("{text:?} is not a positive number of seconds")),
    }
}

impl IndexerArgs {
    /// The validated configuration.
    pub fn config(&self) -> IndexerConfig {
        IndexerConfig {
            host: self.host.clone(),
            port: self.port,
            index: IndexConfig {
                seed: self.hash_seed,
                max_memberships: self.max_memberships,
                evict_at_capacity: self.capacity_policy != "refuse",
                ttl_secs: (self.ttl_secs > 0).then_some(self.ttl_secs),
            },
            publishers: self.publishers.clone(),
            // clap refuses 0 for each of these (their value parsers), naming the flag.
            replay_timeout: Duration::from_millis(self.replay_timeout_ms),
            queue_capacity: self.queue_capacity,
            max_frame_bytes: self.max_frame_bytes,
            max_queued_bytes: self.max_queued_bytes,
            max_services: self.max_services,
            max_body_bytes: self.max_body_bytes,
            max_http_connections: self.max_http_connections,
            // `positive_seconds` refused anything else at parse time.
            http_read_timeout: Duration::from_secs_f64(self.http_read_timeout),
            cluster: self
                .cluster
                .as_ref()
                .map(|url| crate::cluster::ClusterConfig {
                    name: self.cluster_name.clone(),
                    max_bytes: self.cluster_max_bytes,
                    snapshot_records: self.cluster_snapshot_records,
                    ..crate::cluster::ClusterConfig::new(url.clone())
                }),
            replica: self.replica,
            auth: crate::web::access::Auth::from(&self.auth),
            central: central::CentralConfig {
                binds: self.binds.clone(),
                pattern: self.topic_pattern.clone(),
                block_size: self.topic_block_size,
                max_instances: self.max_topic_instances,
            },
        }
    }
}

/// The indexer's configuration.
#[derive(Clone, Debug)]
pub struct IndexerConfig {
    /// HTTP bind host.
    pub host: String,
    /// HTTP port (0: any).
    pub port: u16,
    /// Index limits and hash seed.
    pub index: IndexConfig,
    /// Publishers to register at start.
    pub publishers: Option<std::path::PathBuf>,
    /// Per-reply replay timeout.
    pub replay_timeout: Duration,
    /// Per-publisher live queue.
    pub queue_capacity: usize,
    /// Largest ZMQ frame accepted from a publisher (a larger one closes that connection).
    pub max_frame_bytes: usize,
    /// Payload bytes queued per publisher (live queue and replay buffer each) at most.
    pub max_queued_bytes: usize,
    /// Registered services at most; more registrations are refused.
    pub max_services: usize,
    /// Largest HTTP body accepted.
    pub max_body_bytes: usize,
    /// HTTP connections served at once.
    pub max_http_connections: usize,
    /// Time to send a request's headers (and keep-alive idle time), then its body.
    pub http_read_timeout: Duration,
    /// `--cluster`: publish changes to (or, with `replica`, follow them from) NATS JetStream.
    pub cluster: Option<crate::cluster::ClusterConfig>,
    /// A read replica: follows the cluster's ingester, takes no registrations.
    pub replica: bool,
    /// `--api-token` and its scope.
    pub auth: crate::web::access::Auth,
    /// `--bind` sockets and how their topics name instances.
    pub central: central::CentralConfig,
}

impl IndexerConfig {
    /// The limits of its HTTP server (one value for the stack and the server loop).
    pub(crate) fn http_limits(&self) -> crate::web::HttpLimits {
        crate::web::HttpLimits {
            max_body_bytes: self.max_body_bytes,
            // Not enforced by the indexer: its bodies are parsed into typed requests whose
            // sizes `max_body_bytes` bounds.
            max_body_items: usize::MAX,
            max_connections: self.max_http_connections,
            read_timeout: self.http_read_timeout,
        }
    }
}

impl Default for IndexerConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 0,
            index: IndexConfig::default(),
            publishers: None,
            replay_timeout: Duration::from_secs(5),
            queue_capacity: d::QUEUE_CAPACITY,
            max_frame_bytes: d::MAX_FRAME_BYTES,
            max_queued_bytes: d::MAX_QUEUED_BYTES,
            max_services: d::MAX_SERVICES,
            max_body_bytes: d::MAX_BODY_BYTES,
            max_http_connections: d::MAX_HTTP_CONNECTIONS,
            http_read_timeout: Duration::from_secs_f64(d::HTTP_READ_TIMEOUT_S),
            cluster: None,
            replica: false,
            auth: crate::web::access::Auth::default(),
            central: central::CentralConfig::default(),
        }
    }
}

/// The indexer's layers: no other system's variables (the Conductor indexer has none);
/// `kvplane indexer` adds its old names as deprecated aliases.
#[must_use]
pub(crate) fn layout() -> Layout {
    Layout {
        service: "INDEXER",
        ..Layout::default()
    }
}

/// The indexer run inside `kvplane serve --indexer-port PORT`: the same flags, read from its
/// `KVPLANE_INDEXER_*` variables and `at.file` (the `indexer:` section of serve's
/// `--config`), on serve's host and `PORT`. `--cluster` and `--replica` are refused: an
/// indexer hosted by serve is not replicated.
///
/// # Errors
/// A value is refused, naming the flag and where it came from.
pub fn embedded(at: &Embedded<'_>) -> Result<IndexerConfig, LayerError> {
    let (args, prov) = at.parse::<IndexerArgs>(&layout())?;
    let not_replicated = |flag: &str| {
        format!(
            "--{flag}: an indexer run by kvplane serve is not replicated; run \
             `kvplane indexer --cluster` on its own"
        )
    };
    layers::refuse_given(
        &prov,
        [
            (args.cluster.is_some(), not_replicated("cluster")),
            (args.replica, not_replicated("replica")),
        ],
    )?;
    Ok(args.config())
}
