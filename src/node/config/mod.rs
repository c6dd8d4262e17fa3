//! The validated configuration of `kvplane node` (the binary's flags build it; defaults are
//! in [`crate::config::defaults::node`]).

mod args;
mod l2_adapter;
pub use args::NodeArgs;

use crate::config::defaults::node as d;
use crate::web::HttpLimits;
use crate::worker::WorkerConfig;
use std::path::PathBuf;
use std::time::Duration;

pub use super::model::lru::EvictionPolicy;

/// Most keys one `DELETE /cache/objects` may name (more: 413).
pub(crate) const MAX_DELETE_KEYS: usize = 10_000;
/// Largest `DELETE /cache/objects` body.
pub(crate) const MAX_DELETE_BODY: usize = 4 << 20;

/// Where a PUT goes (`--l2-store-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorePolicy {
    /// Keep in L1 and write through to L2.
    Default,
    /// Write to L2, then drop from L1 (L1 only buffers while the write is in flight).
    SkipL1,
}

/// What an L2 hit does to L1 (`--l2-prefetch-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefetchPolicy {
    /// Served from the read buffer and not kept in L1 (temporary).
    Default,
    /// Loaded into L1 (promoted), subject to L1 eviction.
    Retain,
}

/// The L2 disk tier.
#[derive(Debug, Clone)]
pub struct L2Config {
    /// Directory holding `objects/` and `tmp/`.
    pub path: PathBuf,
    /// Budget and eviction knobs (bytes counted on disk: header + key + body).
    pub eviction: EvictionPolicy,
    /// Store policy.
    pub store_policy: StorePolicy,
    /// Prefetch policy.
    pub prefetch_policy: PrefetchPolicy,
    /// File reads and writes in flight at once.
    pub max_in_flight: usize,
    /// fsync each object file and its directory before a write counts as done.
    pub fsync: bool,
}

/// How the `lm://` listener serves its connections (`--lm-connection-model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConnectionModel {
    /// Each connection on an OS thread of its own with blocking socket I/O, as LMCache's
    /// server does: the kernel schedules every connection alone, so a reply being copied
    /// into one socket never waits for another connection's turn on a shared worker (the
    /// cause of the GET tail with LMCache's client, docs/NODE.md).
    #[default]
    Threads,
    /// Each connection a task on the runtime's worker threads (one per core).
    Tasks,
}

impl ConnectionModel {
    /// The flag's words: `threads`, `tasks`.
    #[must_use]
    pub fn parse(word: &str) -> Option<Self> {
        match word {
            "threads" => Some(ConnectionModel::Threads),
            "tasks" => Some(ConnectionModel::Tasks),
            _ => None,
        }
    }
}

/// The validated configuration of `kvplane node`.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Bind host of both listeners.
    pub host: String,
    /// LMCache protocol port (0 picks a free port).
    pub port: u16,
    /// HTTP port for `/metrics` and `/healthz` (0 picks one); `None` = no HTTP listener.
    pub http_port: Option<u16>,
    /// L1 budget and eviction knobs.
    pub l1: EvictionPolicy,
    /// Bytes of L1 mapped and faulted in at start (`--l1-preallocate`), at most the L1
    /// budget; 0: none, bodies are mapped as they arrive.
    pub l1_preallocate: u64,
    /// L2, if any.
    pub l2: Option<L2Config>,
    /// Largest PUT body accepted.
    pub max_object_bytes: usize,
    /// Most connections open at once; more are closed at accept (counted).
    pub max_connections: usize,
    /// How `lm://` connections are served: runtime tasks, or a thread each.
    pub connection_model: ConnectionModel,
    /// Longest wait for the rest of a request once its first byte arrived.
    pub read_timeout: Duration,
    /// Largest LIST reply body (whole keys only; the rest is left out).
    pub max_list_bytes: usize,
    /// Limits of the HTTP listener: connections served at once and the read timeout
    /// (`max_body_bytes` is the DELETE body limit, `max_body_items` its key count).
    pub http: HttpLimits,
    /// Report admits and evicts to a controller as this LMCache worker (`--controller-pull`,
    /// `--controller-reply`); `None`: no controller.
    pub controller: Option<WorkerConfig>,
    /// Register with a coordinator and post L2 usage events to it (`--coordinator-url`).
    pub coordinator: Option<CoordinatorLinkConfig>,
    /// Tokens per chunk (LMCache's `chunk_size`), for warm prefetch's token → key hashing.
    pub chunk_size: usize,
    /// The chain's starting hash when the controller's commands name tokens (LMCache's
    /// `NONE_HASH`; the controller's `--lookup-none-hash`).
    pub lookup_none_hash: crate::protocol::ChunkHash,
    /// The `peer_init_url` registered with the controller (`host:port` of the `lm://`
    /// listener, where other nodes PUT what a `/move` sends); `None`: the advertised ip and
    /// the bound port.
    pub peer_url: Option<String>,
    /// TP ranks registered with the controller at start, `0..tp_ranks` (more register as
    /// their keys arrive); 0 or 1: rank 0 only.
    pub tp_ranks: u32,
    /// Warm prefetch jobs remembered at once (running and completed, oldest completed
    /// forgotten first).
    pub max_prefetch_jobs: usize,
    /// `--api-token` and its scope on the HTTP listener (docs/NODE.md, "Authentication").
    pub auth: crate::web::access::Auth,
}

/// How the node joins a coordinator (as an LMCache 0.5.6 MP server does).
#[derive(Debug, Clone)]
pub struct CoordinatorLinkConfig {
    /// The coordinator's host.
    pub host: String,
    /// The coordinator's port.
    pub port: u16,
    /// The id registered (`POST /instances`) and put in every event batch.
    pub instance_id: String,
    /// The ip registered, which the coordinator calls back; `None`: the local address of the
    /// route to the coordinator.
    pub advertise_ip: Option<String>,
    /// Period of `PUT /instances/{id}/heartbeat` (and of registration retries).
    pub heartbeat_interval: Duration,
    /// Post cache events (`POST /events`); `false`: register and heartbeat only (LMCache's
    /// `--coordinator-event-reporting`, which the binary leaves off by default as 0.5.6 does).
    pub event_reporting: bool,
    /// Period of `POST /events` flushes.
    pub event_flush_interval: Duration,
    /// Bound on every call to the coordinator.
    pub timeout: Duration,
    /// Most events waiting to be posted; past it new events are dropped (counted) and the
    /// coordinator sees a gap.
    pub max_queued_events: usize,
    /// Most entries in one posted batch.
    pub max_batch_entries: usize,
}

impl CoordinatorLinkConfig {
    /// A link to `host:port` as `instance_id` with LMCache's timings (heartbeat 5 s, flush
    /// 1 s), event reporting on, and kvplane's bounds.
    #[must_use]
    pub fn new(host: impl Into<String>, port: u16, instance_id: impl Into<String>) -> Self {
        CoordinatorLinkConfig {
            host: host.into(),
            port,
            instance_id: instance_id.into(),
            advertise_ip: None,
            heartbeat_interval: Duration::from_secs_f64(d::COORDINATOR_HEARTBEAT_INTERVAL_S),
            event_reporting: true,
            event_flush_interval: Duration::from_secs_f64(d::COORDINATOR_EVENT_FLUSH_INTERVAL_S),
            timeout: Duration::from_secs_f64(d::COORDINATOR_TIMEOUT_S),
            max_queued_events: d::COORDINATOR_MAX_QUEUED_EVENTS,
            max_batch_entries: d::COORDINATOR_MAX_BATCH_ENTRIES,
        }
    }
}

impl NodeConfig {
    /// 127.0.0.1, ephemeral ports, small tiers, no L2: for tests.
    #[must_use]
    pub fn ephemeral() -> Self {
        NodeConfig {
            host: "127.0.0.1".into(),
            port: 0,
            http_port: Some(0),
            l1: EvictionPolicy {
                budget: 64 << 20,
                trigger_watermark: d::EVICTION_TRIGGER_WATERMARK,
                eviction_ratio: d::EVICTION_RATIO,
                lru: true,
            },
            l2: None,
            max_object_bytes: d::MAX_OBJECT_BYTES,
            max_connections: d::MAX_CONNECTIONS,
            connection_model: ConnectionModel::default(),
            read_timeout: Duration::from_secs_f64(d::READ_TIMEOUT_S),
            max_list_bytes: d::MAX_LIST_BYTES,
            l1_preallocate: 0,
            http: http_limits(
                d::MAX_HTTP_CONNECTIONS,
                Duration::from_secs_f64(d::HTTP_READ_TIMEOUT_S),
            ),
            controller: None,
            coordinator: None,
            chunk_size: d::CHUNK_SIZE,
            lookup_none_hash: crate::protocol::ChunkHash::from_i64(
                crate::config::defaults::LOOKUP_NONE_HASH,
            ),
            peer_url: None,
            tp_ranks: 1,
            max_prefetch_jobs: d::MAX_PREFETCH_JOBS,
            auth: crate::web::access::Auth::default(),
        }
    }
}

/// The node's HTTP limits: `max_connections` and `read_timeout` as given, bodies as the
/// coordinator's routes need (a DELETE of at most `MAX_DELETE_KEYS` keys).
#[must_use]
pub fn http_limits(max_connections: usize, read_timeout: Duration) -> HttpLimits {
    HttpLimits {
        max_body_bytes: MAX_DELETE_BODY,
        max_body_items: MAX_DELETE_KEYS + 16,
        max_connections,
        read_timeout,
    }
}

/// Gigabytes (GiB, fractional) to bytes.
#[must_use]
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]
pub fn gib_to_bytes(gib: f64) -> u64 {
    (gib * (1u64 << 30) as f64) as u64
}
