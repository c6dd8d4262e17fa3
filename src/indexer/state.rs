//! The indexer's owner: [`IndexerState`], everything its tasks and routes share — the index
//! (with the `--cluster` change log) behind one lock, the registry of services and publishers
//! behind another, the LMCache tier pools and the Mooncake backends' readers — and the
//! registrations that change them. The index lock is never held across an `.await`.

use super::api::{self, EngineType, Registration, Unregistration};
use super::{backends, cluster, publisher, tier_pools, IndexerConfig, IndexerMetrics};
use crate::indexer::model::index::{StreamId, StreamSpec, SWEEP_SLICE};
use crate::indexer::model::replica::{Change, Core};
use crate::indexer::model::seq::{SeqConfig, SeqCounters};
use crate::web::json::ServiceError;
use axum::http::StatusCode;
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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
    /// The `event_id` order of each backend its standardized events name.
    pub backends: Mutex<BTreeMap<String, crate::indexer::model::mooncake::BackendOrder>>,
    /// The last subscription error.
    pub error: Mutex<Option<String>>,
}

pub(super) struct PublisherEntry {
    pub(super) id: u32,
    pub(super) replay_endpoint: Option<String>,
    pub(super) kind: EngineType,
    pub(super) status: Arc<PublisherStatus>,
    pub(super) cancel: CancellationToken,
    /// Its applier's queue.
    pub(super) feed: publisher::ApplierQueue,
    /// Stops the receiver that connects to the endpoint (kept stopped once the publisher is
    /// seen connecting to a `--bind` socket).
    pub(super) receiver: CancellationToken,
    /// The `--bind` socket (its index) the publisher's messages arrive on, once seen there.
    pub(super) bound: Option<usize>,
    /// Registered by its topic, not by `/register` (an explicit registration replaces it).
    pub(super) by_topic: bool,
}

pub(super) struct Service {
    pub(super) reg: Registration,
    pub(super) stream: StreamId,
    /// The pool of its LMCache servers' tiers (`lmcache_instance_id`), if any.
    pub(super) pool: Option<StreamId>,
    /// The pool of the Mooncake backends an engine reads (`backend_id`), if any.
    pub(super) store: Option<StreamId>,
}

#[derive(Default)]
pub(super) struct Registry {
    pub(super) services: BTreeMap<String, Service>,
    pub(super) publishers: HashMap<String, PublisherEntry>,
    next_publisher: u32,
}

/// Why a registration or an unregistration was refused: each with its status, the
/// Conductor's reason code and the field at fault ([`ServiceError`]), as `/register` and
/// `/unregister` answer it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// This is a read replica.
    #[error(
        "this indexer is a read replica (--replica): register and unregister \
         publishers on the cluster's ingester"
    )]
    ReadReplica,
    /// The service key is registered with another configuration.
    #[error("{0} is registered with another configuration")]
    KeyTaken(String),
    /// The endpoint is registered with another replay endpoint or engine type.
    #[error("{0} is registered with another replay endpoint or type")]
    EndpointTaken(String),
    /// `--max-services` are registered.
    #[error("{0} services are registered, the limit")]
    TooManyServices(usize),
    /// The index holds as many streams as it can.
    #[error("{0} services are registered, the most one indexer holds: unregister some first")]
    IndexFull(usize),
    /// No registration matches (`instance|tenant|rank`, `*` for every rank).
    #[error("service not found: {0}")]
    NotFound(String),
}

impl ServiceError for RegistryError {
    fn status(&self) -> StatusCode {
        match self {
            Self::TooManyServices(_) => StatusCode::BAD_REQUEST,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::ReadReplica | Self::KeyTaken(_) | Self::EndpointTaken(_) | Self::IndexFull(_) => {
                StatusCode::CONFLICT
            }
        }
    }

    fn reason(&self) -> &'static str {
        match self {
            Self::TooManyServices(_) => "out_of_range",
            Self::NotFound(_) => "not_found",
            _ => "conflict",
        }
    }

    fn field(&self) -> Option<&'static str> {
        match self {
            Self::EndpointTaken(_) => Some("endpoint"),
            Self::NotFound(_) => None,
            _ => Some("instance_id"),
        }
    }
}

/// Everything the indexer's tasks and routes share.
pub struct IndexerState {
    pub(super) core: RwLock<Core>,
    /// Standalone, ingester or replica (`--cluster`).
    pub(super) role: cluster::Role,
    pub(super) registry: Mutex<Registry>,
    /// The LMCache MP servers' chunks and the pools they feed (locked before `core`).
    pub(super) tiers: Mutex<crate::indexer::model::tiers::Tiers>,
    /// The backends each stream reads (`backend_id`; read under `core`, never the reverse).
    pub(super) backends: backends::Backends,
    /// Counters exposed on `/metrics`.
    pub metrics: IndexerMetrics,
    pub(super) config: IndexerConfig,
    started: tokio::time::Instant,
    pub(super) tasks: TaskTracker,
    pub(super) shutdown: CancellationToken,
}

impl IndexerState {
    pub(super) fn new(
        config: IndexerConfig,
        role: cluster::Role,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            core: RwLock::new(Core::new(config.index)),
            role,
            registry: Mutex::new(Registry::default()),
            tiers: Mutex::new(crate::indexer::model::tiers::Tiers::new(
                config.index.seed,
                tier_pools::MAX_CHUNKS,
            )),
            backends: backends::Backends::default(),
            metrics: IndexerMetrics::default(),
            config,
            started: tokio::time::Instant::now(),
            tasks,
            shutdown,
        }
    }

    pub(super) fn now_secs(&self) -> u32 {
        u32::try_from(self.started.elapsed().as_secs()).unwrap_or(u32::MAX)
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

    /// Spawns the TTL sweep: it drops what the TTL says, and without one still clamps old
    /// store times (the index keeps them in 16 bits: it must see every record every few
    /// hours). Not on a replica: its sweeps come from the ingester, in order with the rest.
    pub(super) fn spawn_sweep(self: &Arc<Self>) {
        let st = Arc::clone(self);
        let cancel = self.shutdown.clone();
        let every = Duration::from_secs(
            self.config
                .index
                .ttl_secs
                .map_or(600, |ttl| u64::from(ttl / 4).clamp(1, 60)),
        );
        self.tasks.spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    _ = tick.tick() => st.expire().await,
                }
            }
        });
    }

    /// Refused on a replica: publishers register on the ingester.
    fn writable(&self) -> Result<(), RegistryError> {
        if self.role.is_replica() {
            return Err(RegistryError::ReadReplica);
        }
        Ok(())
    }

    /// Answers a `/query` in process (an embedding router asks this instead of HTTP): every
    /// registered instance of the scope's tenant, model and block size, with its matched
    /// tokens per tier. Holds the index's read lock for the walk only.
    pub fn query_tokens(
        &self,
        scope: &crate::indexer::model::index::QueryScope<'_>,
        tokens: &[u32],
    ) -> BTreeMap<String, crate::indexer::model::index::InstanceMatch> {
        self.core.read().index.query_tokens(scope, tokens)
    }

    /// The index's counters (stored, shape mismatches, orphans, …) now.
    pub fn index_counters(&self) -> crate::indexer::model::index::Counters {
        self.core.read().index.counters()
    }

    /// The XXH3 seed of the index's standard hashes.
    pub fn hash_seed(&self) -> u64 {
        self.config.index.seed
    }

    /// Every registration, in service-key order (an embedding router discovers its engines
    /// from them).
    pub fn registrations(&self) -> Vec<Registration> {
        let registry = self.registry.lock();
        registry.services.values().map(|s| s.reg.clone()).collect()
    }

    /// Whether the publisher feeding `endpoint` is connected now (`None`: not registered).
    pub fn publisher_connected(&self, endpoint: &str) -> Option<bool> {
        let registry = self.registry.lock();
        self.publisher_connected_locked(&registry, endpoint)
    }

    pub(super) fn publisher_connected_locked(
        &self,
        registry: &Registry,
        endpoint: &str,
    ) -> Option<bool> {
        registry
            .publishers
            .get(endpoint)
            .map(|p| p.status.connected.load(Ordering::Relaxed))
    }

    /// Registers a stream (idempotent; 409 on a conflicting one).
    ///
    /// # Errors
    /// [`RegistryError`]: the key or the endpoint is registered with another configuration,
    /// a limit is reached, or this is a read replica.
    pub fn register(self: &Arc<Self>, reg: Registration) -> Result<bool, RegistryError> {
        self.register_as(reg, false)
    }

    /// Registers a stream, `by_topic` (first seen on a `--bind` socket) or explicitly. An
    /// explicit registration of an endpoint first registered by its topic replaces that
    /// instance (its blocks go; the publisher's history comes back by replay when the
    /// registration names a replay endpoint).
    pub(super) fn register_as(
        self: &Arc<Self>,
        reg: Registration,
        by_topic: bool,
    ) -> Result<bool, RegistryError> {
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
            return Err(RegistryError::KeyTaken(key));
        }
        if registry.services.len() >= self.config.max_services {
            return Err(RegistryError::TooManyServices(self.config.max_services));
        }
        if let Some(p) = registry.publishers.get(&reg.endpoint) {
            if p.replay_endpoint != reg.replay_endpoint || p.kind != reg.kind || p.by_topic {
                return Err(RegistryError::EndpointTaken(reg.endpoint));
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
                return Err(RegistryError::IndexFull(
                    crate::indexer::model::index::MAX_STREAMS,
                ));
            };
            self.role.record(Change::AddStream {
                stream: stream.0,
                spec,
            });
            core.routes.entry(pub_id).or_default().push(stream);
            stream
        };
        if reg.kind == EngineType::Mooncake {
            self.backends.declare(stream, &reg.backends);
        }
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
                PublisherEntry {
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
        let store = self.link_backends(&reg);
        let service = Service {
            reg,
            stream,
            pool,
            store,
        };
        registry.services.insert(key, service);
        Ok(true)
    }

    /// Removes the matching services and every membership they held; returns their keys.
    ///
    /// # Errors
    /// [`RegistryError::NotFound`] when nothing matches; refused on a read replica.
    pub fn unregister(&self, req: &Unregistration) -> Result<Vec<String>, RegistryError> {
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
            return Err(RegistryError::NotFound(format!(
                "{}|{}|{}",
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
    pub(super) fn drop_service(&self, registry: &mut Registry, key: &str) {
        let Some(service) = registry.services.remove(key) else {
            return;
        };
        if let Some(pool) = service.pool {
            self.unlink_tiers(pool);
        }
        if let Some(store) = service.store {
            self.unlink_backends(store);
        }
        let endpoint = service.reg.endpoint.clone();
        let Some(pub_id) = registry.publishers.get(&endpoint).map(|p| p.id) else {
            return;
        };
        let last = {
            let mut core = self.core.write();
            core.index.remove_stream(service.stream);
            self.backends.forget(service.stream);
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
