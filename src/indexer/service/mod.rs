//! `kvplane indexer`: the async shell around the pure model — registrations, one
//! subscriber/applier task pair per publisher endpoint (or, for publishers that connect to a
//! `--bind` socket, one applier fed by that socket's task), the TTL sweep, the HTTP API.
//!
//! Owns the shared [`IndexerState`] (the index behind one lock, the registry behind another;
//! the index lock is never held across an `.await`). Sockets are in [`crate::transport`].

pub mod api;
pub mod central;
mod cluster;
mod dashboard;
mod http;
mod metrics;
mod openapi;
mod publisher;
mod query_body;
mod tiers;
mod views;

use openapi::openapi_doc;

use crate::config::defaults::indexer as d;
use crate::indexer::events::KvEvent;
use crate::indexer::index::{IndexConfig, StreamId, StreamSpec, SWEEP_SLICE};
use crate::indexer::replica::{Change, Core};
use crate::indexer::seq::{SeqConfig, SeqCounters};
use crate::service::{bind_tcp, Running, StartError};
use api::{EngineType, Refusal, Registration, Unregistration};
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use metrics::IndexerMetrics;

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
    #[arg(long, env = "KVPLANE_INDEXER_HASH_SEED", default_value_t = crate::indexer::hash::DEFAULT_SEED)]
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

/// `--max-memberships`: 1 to [`crate::indexer::index::MAX_MEMBERSHIPS`].
fn max_memberships(s: &str) -> Result<usize, String> {
    let max = crate::indexer::index::MAX_MEMBERSHIPS;
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

/// Live state of one publisher, shared between its tasks and `/services`.
#[derive(Debug, Default)]
pub struct PublisherStatus {
    /// A connection is up.
    pub connected: AtomicBool,
    /// Connections made (the first and every reconnect).
    pub connects: AtomicU64,
    /// The last sequence number applied (`u64::MAX`: none).
    pub last_seq: AtomicU64,
    /// A replay is running.
    pub replaying: AtomicBool,
    /// Live messages that found the queue full (by count or by bytes) and waited, the
    /// socket unread meanwhile (the publisher holds what follows).
    pub queue_full: AtomicU64,
    /// Live messages from a `--bind` socket dropped because the queue was full (the socket
    /// is shared, so it is never left unread; the gap is replayed).
    pub dropped: AtomicU64,
    /// Payload bytes in the live queue now.
    pub queued_bytes: std::sync::atomic::AtomicUsize,
    /// The sequence tracker's counters.
    pub seq: Mutex<SeqCounters>,
    /// The last subscription error.
    pub error: Mutex<Option<String>>,
}

struct Publisher {
    id: u32,
    replay_endpoint: Option<String>,
    kind: EngineType,
    status: Arc<PublisherStatus>,
    cancel: CancellationToken,
    /// Its applier's queue.
    feed: publisher::Feed,
    /// Stops the receiver that connects to the endpoint (kept stopped once the publisher is
    /// seen connecting to a `--bind` socket).
    receiver: CancellationToken,
    /// The `--bind` socket (its index) the publisher's messages arrive on, once seen there.
    bound: Option<usize>,
    /// Registered by its topic, not by `/register` (an explicit registration replaces it).
    by_topic: bool,
}

struct Service {
    reg: Registration,
    stream: StreamId,
    /// The pool of its LMCache servers' tiers (`lmcache_instance_id`), if any.
    pool: Option<StreamId>,
}

#[derive(Default)]
struct Registry {
    services: BTreeMap<String, Service>,
    publishers: HashMap<String, Publisher>,
    next_publisher: u32,
}

/// Everything the indexer's tasks and routes share.
pub struct IndexerState {
    core: RwLock<Core>,
    /// Standalone, ingester or replica (`--cluster`).
    role: cluster::Role,
    registry: Mutex<Registry>,
    /// The LMCache MP servers' chunks and the pools they feed (locked before `core`).
    tiers: Mutex<crate::indexer::tiers::Tiers>,
    /// Counters exposed on `/metrics`.
    pub metrics: IndexerMetrics,
    config: IndexerConfig,
    started: tokio::time::Instant,
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

impl IndexerState {
    fn new(
        config: IndexerConfig,
        role: cluster::Role,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            core: RwLock::new(Core::new(config.index)),
            role,
            registry: Mutex::new(Registry::default()),
            tiers: Mutex::new(crate::indexer::tiers::Tiers::new(
                config.index.seed,
                tiers::MAX_CHUNKS,
            )),
            metrics: IndexerMetrics::default(),
            config,
            started: tokio::time::Instant::now(),
            tasks,
            shutdown,
        }
    }

    fn now_secs(&self) -> u32 {
        u32::try_from(self.started.elapsed().as_secs()).unwrap_or(u32::MAX)
    }

    /// Applies events from publisher `id` to every stream it feeds.
    fn apply(&self, id: u32, events: &[KvEvent]) {
        let now = self.now_secs();
        let mut core = self.core.write();
        let Core { index, routes, .. } = &mut *core;
        let Some(streams) = routes.get(&id) else {
            return;
        };
        for ev in events {
            for s in streams {
                index.apply(*s, ev, now);
            }
        }
        if self.role.records() {
            self.role.record(Change::Apply {
                streams: streams.iter().map(|s| s.0).collect(),
                events: events.to_vec(),
                now,
            });
        }
        drop(core);
        self.metrics
            .events_applied
            .fetch_add(events.len() as u64, Ordering::Relaxed);
    }

    /// Drops every block of every stream publisher `id` feeds (a restart).
    fn clear_publisher(&self, id: u32) {
        let mut core = self.core.write();
        let Core { index, routes, .. } = &mut *core;
        if let Some(streams) = routes.get(&id) {
            for s in streams {
                index.clear_stream(*s, None);
                self.role.record(Change::ClearStream {
                    stream: s.0,
                    tier: None,
                });
            }
        }
    }

    /// Runs the TTL sweep at the current time, one slice of the record arena per lock hold
    /// (queries and events go on between slices, whatever the streams' sizes).
    async fn expire(&self) {
        let now = self.now_secs();
        let mut from = Some(0);
        while let Some(start) = from {
            {
                let mut core = self.core.write();
                let (_, next) = core.index.expire_slice(start, SWEEP_SLICE, now);
                self.role.record(Change::ExpireSlice {
                    from: start as u64,
                    len: SWEEP_SLICE as u64,
                    now,
                });
                from = next;
            }
            tokio::task::yield_now().await;
        }
    }

    /// 409 on a replica: publishers register on the ingester.
    fn writable(&self) -> Result<(), Refusal> {
        if self.role.is_replica() {
            return Err(Refusal::conflict(
                "instance_id",
                "this indexer is a read replica (--replica): register and unregister \
                 publishers on the cluster's ingester",
            ));
        }
        Ok(())
    }

    /// Answers a `/query` in process (an embedding router asks this instead of HTTP): every
    /// registered instance of the scope's tenant, model and block size, with its matched
    /// tokens per tier. Holds the index's read lock for the walk only.
    pub fn query_tokens(
        &self,
        scope: &crate::indexer::index::QueryScope<'_>,
        tokens: &[u32],
    ) -> BTreeMap<String, crate::indexer::index::InstanceMatch> {
        self.core.read().index.query_tokens(scope, tokens)
    }

    /// The index's counters (stored, shape mismatches, orphans, …) now.
    pub fn index_counters(&self) -> crate::indexer::index::Counters {
        self.core.read().index.counters()
    }

    /// The XXH3 seed of the index's standard hashes.
    pub fn hash_seed(&self) -> u64 {
        self.config.index.seed
    }

    /// Whether the publisher feeding `endpoint` is connected now (`None`: not registered).
    pub fn publisher_connected(&self, endpoint: &str) -> Option<bool> {
        let registry = self.registry.lock();
        self.publisher_connected_locked(&registry, endpoint)
    }

    fn publisher_connected_locked(&self, registry: &Registry, endpoint: &str) -> Option<bool> {
        registry
            .publishers
            .get(endpoint)
            .map(|p| p.status.connected.load(Ordering::Relaxed))
    }

    /// Registers a stream (idempotent; 409 on a conflicting one).
    ///
    /// # Errors
    /// 409 when the key or the endpoint is registered with another configuration.
    pub fn register(self: &Arc<Self>, reg: Registration) -> Result<bool, Refusal> {
        self.register_as(reg, false)
    }

    /// Registers a stream, `by_topic` (first seen on a `--bind` socket) or explicitly. An
    /// explicit registration of an endpoint first registered by its topic replaces that
    /// instance (its blocks go; the publisher's history comes back by replay when the
    /// registration names a replay endpoint).
    fn register_as(self: &Arc<Self>, reg: Registration, by_topic: bool) -> Result<bool, Refusal> {
        self.writable()?;
        let mut registry = self.registry.lock();
        let mut bound = None;
        if !by_topic {
            bound = self.replace_topic_instance(&mut registry, &reg);
        }
        let key = reg.key();
        if let Some(existing) = registry.services.get(&key) {
            if existing.reg == reg {
                return Ok(false);
            }
            return Err(Refusal::conflict(
                "instance_id",
                format!("{key} is registered with another configuration"),
            ));
        }
        if registry.services.len() >= self.config.max_services {
            return Err(Refusal::field(
                "out_of_range",
                "instance_id",
                format!(
                    "{} services are registered, the limit",
                    self.config.max_services
                ),
            ));
        }
        if let Some(p) = registry.publishers.get(&reg.endpoint) {
            if p.replay_endpoint != reg.replay_endpoint || p.kind != reg.kind || p.by_topic {
                return Err(Refusal::conflict(
                    "endpoint",
                    format!(
                        "{} is registered with another replay endpoint or type",
                        reg.endpoint
                    ),
                ));
            }
        }
        let spec = stream_spec(&reg, reg.kind == EngineType::Mooncake);
        let new_publisher = !registry.publishers.contains_key(&reg.endpoint);
        let pub_id = match registry.publishers.get(&reg.endpoint) {
            Some(p) => p.id,
            None => {
                let id = registry.next_publisher;
                registry.next_publisher += 1;
                id
            }
        };
        let stream = {
            let mut core = self.core.write();
            let Some(stream) = core.index.add_stream(spec.clone()) else {
                return Err(Refusal::conflict(
                    "instance_id",
                    format!(
                        "{} services are registered, the most one indexer holds: \
                         unregister some first",
                        crate::indexer::index::MAX_STREAMS
                    ),
                ));
            };
            self.role.record(Change::AddStream {
                stream: stream.0,
                spec,
            });
            core.routes.entry(pub_id).or_default().push(stream);
            stream
        };
        if new_publisher {
            let status = Arc::new(PublisherStatus {
                last_seq: AtomicU64::new(u64::MAX),
                ..PublisherStatus::default()
            });
            let cancel = self.shutdown.child_token();
            let seq = SeqConfig {
                first_seq: u64::from(reg.kind == EngineType::Mooncake),
                replay: reg.replay_endpoint.is_some(),
                max_buffered_bytes: self.config.max_queued_bytes,
                ..SeqConfig::default()
            };
            // A publisher known to connect to a `--bind` socket gets no receiver of its own.
            let (feed, receiver) = publisher::spawn(
                self,
                publisher::PublisherTask {
                    id: pub_id,
                    endpoint: reg.endpoint.clone(),
                    replay_endpoint: reg.replay_endpoint.clone(),
                    seq,
                    status: Arc::clone(&status),
                    cancel: cancel.clone(),
                },
                !by_topic && bound.is_none(),
            );
            registry.publishers.insert(
                reg.endpoint.clone(),
                Publisher {
                    id: pub_id,
                    replay_endpoint: reg.replay_endpoint.clone(),
                    kind: reg.kind,
                    status,
                    cancel,
                    feed,
                    receiver,
                    bound,
                    by_topic,
                },
            );
        }
        let pool = self.link_tiers(&reg);
        registry.services.insert(key, Service { reg, stream, pool });
        Ok(true)
    }

    /// Removes the matching services and every membership they held; returns their keys.
    ///
    /// # Errors
    /// 404 when nothing matches.
    pub fn unregister(&self, req: &Unregistration) -> Result<Vec<String>, Refusal> {
        self.writable()?;
        let mut registry = self.registry.lock();
        let keys: Vec<String> = match req.dp_rank {
            Some(rank) => {
                let key = api::service_key(&req.instance, &req.tenant, rank);
                if registry.services.contains_key(&key) {
                    vec![key]
                } else {
                    Vec::new()
                }
            }
            None => registry
                .services
                .iter()
                .filter(|(_, s)| s.reg.instance == req.instance && s.reg.tenant == req.tenant)
                .map(|(k, _)| k.clone())
                .collect(),
        };
        if keys.is_empty() {
            return Err(Refusal::not_found(format!(
                "service not found: {}|{}|{}",
                req.instance,
                req.tenant,
                req.dp_rank.map_or("*".to_owned(), |r| r.to_string())
            )));
        }
        for key in &keys {
            self.drop_service(&mut registry, key);
        }
        Ok(keys)
    }

    /// Removes one service and its blocks; its publisher's tasks stop with its last service.
    fn drop_service(&self, registry: &mut Registry, key: &str) {
        let Some(service) = registry.services.remove(key) else {
            return;
        };
        if let Some(pool) = service.pool {
            self.unlink_tiers(pool);
        }
        let endpoint = service.reg.endpoint.clone();
        let Some(pub_id) = registry.publishers.get(&endpoint).map(|p| p.id) else {
            return;
        };
        let last = {
            let mut core = self.core.write();
            core.index.remove_stream(service.stream);
            self.role.record(Change::RemoveStream {
                stream: service.stream.0,
            });
            let streams = core.routes.entry(pub_id).or_default();
            streams.retain(|s| *s != service.stream);
            let last = streams.is_empty();
            if last {
                core.routes.remove(&pub_id);
            }
            last
        };
        if last {
            if let Some(p) = registry.publishers.remove(&endpoint) {
                p.cancel.cancel();
            }
        }
    }
}

/// The running indexer's state.
pub struct Indexer {
    /// The bound HTTP address.
    pub addr: SocketAddr,
    /// The `--bind` SUB sockets' addresses, in flag order.
    pub binds: Vec<SocketAddr>,
    /// The shared state.
    pub state: Arc<IndexerState>,
}

/// A running indexer (`server.addr`, `server.state` through `Deref`).
pub type IndexerServer = Running<Indexer>;

/// Binds the HTTP port, registers the configured publishers and starts serving.
///
/// # Errors
/// [`StartError`] when the port cannot be bound, the publishers file is invalid or
/// `--cluster` cannot be joined.
pub async fn start(config: IndexerConfig) -> Result<IndexerServer, StartError> {
    // Message bursts and table rebuilds free big blocks: hand them back, not keep them.
    crate::memory::return_freed_promptly();
    let initial = match &config.publishers {
        Some(path) => api::publishers_file(path)?,
        None => Vec::new(),
    };
    let (listener, bound) = bind_tcp("http", &format!("{}:{}", config.host, config.port)).await?;
    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    let role = cluster::Role::join(config.cluster.as_ref(), config.replica, &shutdown, &tasks)
        .await
        .map_err(|e| StartError::Cluster(e.to_string()))?;
    let state = Arc::new(IndexerState::new(
        config,
        role,
        tasks.clone(),
        shutdown.clone(),
    ));
    cluster::follow(&state, &shutdown, &tasks)
        .await
        .map_err(|e| StartError::Cluster(e.to_string()))?;
    let binds = match central::start(&state).await {
        Ok(b) => b,
        Err(e) => {
            shutdown.cancel();
            return Err(e);
        }
    };
    if state.role.is_replica() && !initial.is_empty() {
        tracing::warn!("--publishers ignored: a replica follows the ingester's registrations");
    }
    for reg in initial.into_iter().filter(|_| !state.role.is_replica()) {
        let key = reg.key();
        if let Err(e) = state.register(reg) {
            tracing::warn!(%key, "publisher from the file not registered: {}", e.message);
        }
    }
    // The sweep drops what the TTL says, and without one still clamps old store times (the
    // index keeps them in 16 bits: it must see every record every few hours). A replica's
    // sweeps come from the ingester, in order with the rest.
    if !state.role.is_replica() {
        let st = Arc::clone(&state);
        let cancel = shutdown.clone();
        let every = Duration::from_secs(
            state
                .config
                .index
                .ttl_secs
                .map_or(600, |ttl| u64::from(ttl / 4).clamp(1, 60)),
        );
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    _ = tick.tick() => st.expire().await,
                }
            }
        });
    }
    let app = http::router(Arc::clone(&state));
    let limits = crate::web::HttpLimits {
        max_body_bytes: state.config.max_body_bytes,
        // Not enforced by the indexer: its bodies are parsed into typed requests whose
        // sizes `max_body_bytes` bounds.
        max_body_items: usize::MAX,
        max_connections: state.config.max_http_connections,
        read_timeout: state.config.http_read_timeout,
    };
    let served = crate::web::serve(
        listener,
        app,
        limits,
        crate::web::limits::counting_hook("indexer", http::refusals(&state)),
        shutdown.clone(),
    );
    tasks.spawn(async move {
        if let Err(e) = served.await {
            tracing::error!("indexer HTTP server failed: {e}");
        }
    });
    tracing::info!(http = %bound, "kvplane indexer listening");
    let mut running = Running::new(
        "indexer",
        Indexer {
            addr: bound,
            binds: binds.clone(),
            state,
        },
        shutdown,
        tasks,
    )
    .with_addr("http", bound);
    for b in binds {
        running = running.with_addr("zmq", b);
    }
    Ok(running)
}

/// The index stream of `reg`'s blocks; `shared` when its blocks may be held for several
/// instances (a Mooncake store, an LMCache tier pool).
pub(super) fn stream_spec(reg: &Registration, shared: bool) -> StreamSpec {
    StreamSpec {
        tenant: reg.tenant.clone(),
        instance: reg.instance.clone(),
        dp_rank: reg.dp_rank,
        model: reg.model.clone(),
        lora: reg.lora.clone(),
        block_size: reg.block_size,
        salt: reg.salt.clone(),
        shared,
    }
}
