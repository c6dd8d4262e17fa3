//! Validated configuration and every default value, in one place.
//!
//! The command line belongs to the binary (`src/bin/kvplane/cli.rs`): it parses the flags
//! (each also read from `KVPLANE_<FLAG>`) and builds the validated configurations defined
//! here with the parsing helpers below, which name the flag at fault. Nothing here depends
//! on a service; services, the HTTP plumbing and the binary read their defaults from
//! [`defaults`].

use crate::protocol::ChunkHash;
use serde::Deserialize;
use std::time::Duration;
use thiserror::Error;

/// Every default value of kvplane's flags and limits. The binary's flags, the test
/// configurations and the library's own fallbacks all read them from here.
pub mod defaults {
    /// Bind address of every socket (LMCache's default).
    pub const HOST: &str = "0.0.0.0";
    /// Controller HTTP port (LMCache's default).
    pub const HTTP_PORT: u16 = 9000;
    /// Controller ZMQ ports, as LMCache writes them.
    pub const MONITOR_PORTS: &str = r#"{"pull": 8300, "reply": 8400, "heartbeat": 8082}"#;
    /// Seconds between liveness sweeps.
    pub const HEALTH_CHECK_INTERVAL_S: f64 = 10.0;
    /// Seconds of silence after which a worker is probed.
    pub const WORKER_TIMEOUT_S: f64 = 300.0;
    /// Seconds a command on a worker's downlink may take.
    pub const DOWNLINK_TIMEOUT_S: f64 = 5.0;
    /// Most liveness probes in flight at once.
    pub const MAX_CONCURRENT_PROBES: usize = 64;
    /// Seconds without progress after which a full sync is marked failed.
    pub const FULL_SYNC_TIMEOUT_S: f64 = 300.0;
    /// Fraction of synced workers before workers may leave freeze mode.
    pub const FULL_SYNC_COMPLETION_THRESHOLD: f64 = 0.8;
    /// Largest ZMQ frame accepted from a peer.
    pub const MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;
    /// Most connections one ZMQ listening socket keeps open: far above one per LMCache
    /// worker, and three sockets' worth stays well under a 65,536 fd limit.
    pub const MAX_ZMQ_CONNECTIONS: usize = 4096;
    /// Seconds a ZMQ connection may go without a complete message after its handshake;
    /// 0 = no limit, because LMCache workers may be silent for hours (heartbeats are off by
    /// default in LMCache).
    pub const ZMQ_IDLE_TIMEOUT_S: f64 = 0.0;
    /// Most workers registered at once.
    pub const MAX_WORKERS: usize = 1 << 16;
    /// Most keys one worker may hold over all its locations.
    pub const MAX_KEYS_PER_WORKER: u64 = 1 << 24;
    /// Most operations in one admit/evict batch, or keys in one full-sync batch.
    pub const MAX_BATCH_OPS: usize = 1 << 16;
    /// Largest HTTP request body: 4 MiB. The largest real request is a `/lookup` by tokens:
    /// a 128k-token prompt is ~0.9 MB of JSON (a token id is at most six digits and a
    /// comma), so this fits a 256k-token prompt with room for whitespace.
    pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
    /// Most JSON values (list items and object fields) in one HTTP request body: twice a
    /// 128k-token `/lookup`. A body of this many bad values peaks the whole process at
    /// ~55 MB RSS while it is parsed and refused (`scripts/soak-ceilings.sh` holds the peak
    /// under 200 MiB).
    pub const MAX_BODY_ITEMS: usize = 1 << 18;
    /// Most HTTP connections served at once.
    pub const MAX_HTTP_CONNECTIONS: usize = 1024;
    /// Seconds to send an HTTP request's headers (counted from when the connection waits for
    /// them, so also the keep-alive idle time), and then its body.
    pub const HTTP_READ_TIMEOUT_S: f64 = 30.0;
    /// Tokens per chunk when HTTP /lookup hashes tokens (LMCache's `chunk_size`).
    pub const LOOKUP_CHUNK_SIZE: usize = 256;
    /// Prefix hash of the first chunk when HTTP /lookup hashes tokens (LMCache's `NONE_HASH`).
    pub const LOOKUP_NONE_HASH: i64 = 0;

    /// `kvplane coordinator` (the LMCache MP coordinator) defaults.
    pub mod coordinator {
        /// HTTP port (LMCache's default).
        pub const PORT: u16 = 9300;
        /// Seconds without a heartbeat before an instance is removed.
        pub const INSTANCE_TIMEOUT_S: f64 = 30.0;
        /// Seconds between health sweeps (0 disables).
        pub const HEALTH_CHECK_INTERVAL_S: f64 = 10.0;
        /// Seconds between eviction cycles (0 disables).
        pub const EVICTION_CHECK_INTERVAL_S: f64 = 5.0;
        /// Fraction of an over-quota salt's keys evicted per cycle.
        pub const EVICTION_RATIO: f64 = 0.2;
        /// Evict when usage reaches this fraction of the quota.
        pub const TRIGGER_WATERMARK: f64 = 1.0;
        /// Idle keep-alive seconds.
        pub const TIMEOUT_KEEP_ALIVE_S: u64 = 10;
        /// Tokens per chunk on the MP servers.
        pub const CHUNK_SIZE: usize = 256;
        /// Seconds each call to an MP server may take.
        pub const OUTBOUND_TIMEOUT_S: f64 = 5.0;
        /// Largest request body: 16 MiB, room for a full `POST /events` of
        /// `MAX_EVENTS_PER_REQUEST` entries (~150 bytes of JSON each).
        pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
        /// Most JSON values in one request body (an event entry is about eight).
        pub const MAX_BODY_ITEMS: usize = 1 << 20;
        /// Most HTTP connections served at once: an MP server keeps one keep-alive connection
        /// (registration, heartbeats and events share it), so 10,000 servers plus operators and
        /// routers fit with room; at the cap a new connection closes the least recently active
        /// idle one. About one open file each (`RLIMIT_NOFILE` is raised to its hard limit).
        pub const MAX_HTTP_CONNECTIONS: usize = 16_384;
        /// Seconds to send a request's headers (also the keep-alive idle time), then its body.
        pub const HTTP_READ_TIMEOUT_S: f64 = 30.0;
        /// Most events in one request.
        pub const MAX_EVENTS_PER_REQUEST: usize = 100_000;
        /// Most registered instances.
        pub const MAX_INSTANCES: usize = 10_000;
        /// Most tracked L2 keys (≤ 64 bytes each: 1 GiB at most).
        pub const MAX_TRACKED_KEYS: usize = 16 * 1024 * 1024;
        /// Most explicit quotas.
        pub const MAX_QUOTAS: usize = 100_000;
        /// Most keys pinned against eviction (`POST /cache/pins`); an eviction cycle looks
        /// past at most this many pinned candidates per salt.
        pub const MAX_PINNED_KEYS: usize = 100_000;
        /// Seconds a server that left (deregistered or timed out) keeps its private L2 copies
        /// tracked (not counted) for its return with the same id; then they are dropped.
        pub const DEPARTED_L2_TTL_S: f64 = 3_600.0;
        /// Seconds between registration checks of the startup resync.
        pub const RESYNC_POLL_INTERVAL_S: f64 = 1.0;
        /// Seconds the startup resync waits for a first server.
        pub const RESYNC_MAX_WAIT_S: f64 = 60.0;
        /// `page_size` of the startup resync's `GET /cache/objects`.
        pub const RESYNC_PAGE_SIZE: usize = 1000;
    }

    /// Defaults of `kvplane indexer` (the bounds it shares with nothing else).
    pub mod indexer {
        /// Payload bytes queued per publisher (live queue and replay buffer each). A full
        /// queue makes the publisher wait (its own send queue holds the rest), so a small
        /// one costs no throughput: 8 KB messages applied at 1.5M blocks/s drain 16 MiB in
        /// about 0.1 s.
        pub const MAX_QUEUED_BYTES: usize = 16 << 20;
        /// Live messages queued per publisher.
        pub const QUEUE_CAPACITY: usize = 256;
        /// Largest ZMQ frame from a publisher.
        pub const MAX_FRAME_BYTES: usize = 16 << 20;
        /// Registered services at most.
        pub const MAX_SERVICES: usize = 4096;
        /// Largest HTTP request body.
        pub const MAX_BODY_BYTES: usize = 64 << 20;
        /// HTTP connections served at once.
        pub const MAX_HTTP_CONNECTIONS: usize = 1024;
        /// Seconds to send a request's headers (also the keep-alive idle time), then its body.
        pub const HTTP_READ_TIMEOUT_S: f64 = 30.0;
        /// The topic of a publisher that connects to `--bind`: llm-d's convention.
        pub const TOPIC_PATTERN: &str = "kv@{address}@{model}";
        /// Tokens per block of an instance created by its topic (vLLM's default).
        pub const TOPIC_BLOCK_SIZE: u32 = 16;
        /// Instances created by their topic at most.
        pub const MAX_TOPIC_INSTANCES: usize = 1024;
    }

    /// Defaults of `kvplane router` (docs/ROUTER.md).
    pub mod router {
        /// The router's HTTP port (clear of the controller's 9000, the coordinator's 9300,
        /// the indexer's 13333, the node's 65432 and vLLM's 8000).
        pub const PORT: u16 = 9500;
        /// Tokens per KV block (vLLM's default).
        pub const BLOCK_SIZE: u32 = 16;
        /// Seconds to connect to an engine.
        pub const CONNECT_TIMEOUT_S: f64 = 2.0;
        /// Seconds to the response head (a non-streaming answer comes whole, after its last
        /// token: long generations need a long deadline).
        pub const RESPONSE_TIMEOUT_S: f64 = 600.0;
        /// Seconds between two chunks of a body passed through.
        pub const STREAM_IDLE_TIMEOUT_S: f64 = 120.0;
        /// Seconds between health probes of every engine.
        pub const HEALTH_INTERVAL_S: f64 = 5.0;
        /// Largest request body.
        pub const MAX_BODY_BYTES: usize = 32 << 20;
        /// Largest non-streaming answer read whole.
        pub const MAX_RESPONSE_BYTES: usize = 64 << 20;
        /// HTTP connections served at once.
        pub const MAX_HTTP_CONNECTIONS: usize = 4096;
        /// Seconds a shared reservation counts at most (the response timeout: an answer
        /// still streaming after it stops counting for the other replicas).
        pub const RESERVATION_TTL_S: f64 = 600.0;
        /// Seconds between scrapes of the engines' `/metrics`.
        pub const ENGINE_METRICS_INTERVAL_S: f64 = 1.0;
        /// Seconds a session is remembered after its last request.
        pub const SESSION_TTL_S: f64 = 600.0;
        /// Seconds between two reads of the registrations engines are discovered from.
        pub const DISCOVERY_INTERVAL_S: f64 = 1.0;
    }

    /// Defaults of `--cluster` (docs/CLUSTER.md).
    pub mod cluster {
        /// The cluster's name.
        pub const NAME: &str = "default";
        /// Bytes a service's change stream keeps on the NATS server.
        pub const MAX_BYTES: i64 = 1 << 30;
        /// Seconds to connect and to set the stream up.
        pub const TIMEOUT_S: f64 = 10.0;
        /// Seconds a leader's lease lasts without renewal (renewed every quarter of it): a
        /// standby takes over at most this long after the leader dies.
        pub const LEASE_TTL_S: f64 = 1.5;
        /// Records a follower applies between two snapshots of what it holds (and at least
        /// 10 s apart).
        pub const SNAPSHOT_RECORDS: u64 = 100_000;
    }

    /// Defaults of `kvplane node`.
    pub mod node {
        /// LMCache protocol port (the port LMCache's docs use for `lm://`).
        pub const PORT: u16 = 65432;
        /// HTTP port for `/metrics` and `/healthz`.
        pub const HTTP_PORT: u16 = 9091;
        /// L1 budget, GiB.
        pub const L1_SIZE_GB: f64 = 4.0;
        /// L2 budget, GiB.
        pub const L2_SIZE_GB: f64 = 16.0;
        /// Eviction policy of both tiers (LMCache's `LRU`).
        pub const EVICTION_POLICY: &str = "LRU";
        /// Fraction of the budget above which an eviction cycle runs (LMCache's 0.8).
        pub const EVICTION_TRIGGER_WATERMARK: f64 = 0.8;
        /// Fraction of used bytes one cycle frees (LMCache's 0.2).
        pub const EVICTION_RATIO: f64 = 0.2;
        /// L2 store policy.
        pub const L2_STORE_POLICY: &str = "default";
        /// L2 prefetch policy.
        pub const L2_PREFETCH_POLICY: &str = "default";
        /// L2 file operations in flight (LMCache's `--l2-prefetch-max-in-flight`).
        pub const L2_MAX_IN_FLIGHT: usize = 8;
        /// Largest PUT body, bytes.
        pub const MAX_OBJECT_BYTES: usize = 256 << 20;
        /// Most HTTP connections served at once (`--http-port`: metrics, dashboard and the
        /// coordinator's routes); more wait in the kernel's accept queue.
        pub const MAX_HTTP_CONNECTIONS: usize = 256;
        /// Seconds to send an HTTP request's headers (also the keep-alive idle time), then its
        /// body.
        pub const HTTP_READ_TIMEOUT_S: f64 = 30.0;
        /// Most connections open at once.
        pub const MAX_CONNECTIONS: usize = 4096;
        /// Seconds to wait for the rest of a started request.
        pub const READ_TIMEOUT_S: f64 = 30.0;
        /// Largest LIST reply body, bytes.
        pub const MAX_LIST_BYTES: usize = 4 << 20;
        /// Seconds between heartbeats to a coordinator (LMCache's
        /// `--coordinator-heartbeat-interval`).
        pub const COORDINATOR_HEARTBEAT_INTERVAL_S: f64 = 5.0;
        /// Seconds between event flushes to a coordinator (LMCache's
        /// `--coordinator-event-flush-interval`).
        pub const COORDINATOR_EVENT_FLUSH_INTERVAL_S: f64 = 1.0;
        /// Seconds any call to a coordinator may take.
        pub const COORDINATOR_TIMEOUT_S: f64 = 5.0;
        /// Events waiting for the coordinator at most.
        pub const COORDINATOR_MAX_QUEUED_EVENTS: usize = 100_000;
        /// Entries per posted event batch at most.
        pub const COORDINATOR_MAX_BATCH_ENTRIES: usize = 1000;
        /// Seconds between heartbeats to a controller.
        pub const CONTROLLER_HEARTBEAT_INTERVAL_S: f64 = 10.0;
        /// Tokens per chunk for warm prefetch (LMCache's `chunk_size`).
        pub const CHUNK_SIZE: usize = 256;
        /// Warm prefetch jobs remembered at once.
        pub const MAX_PREFETCH_JOBS: usize = 1024;
    }
}

/// A secret that never shows in `Debug` output or logs.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken(String);

impl ApiToken {
    /// Wraps a token.
    pub fn new(token: impl Into<String>) -> Self {
        ApiToken(token.into())
    }

    /// The token itself, for comparison.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `None` for an empty token: an empty `--api-token` means no token.
    pub fn non_empty(self) -> Option<Self> {
        (!self.0.is_empty()).then_some(self)
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

impl MonitorPorts {
    /// Parses LMCache's JSON form, e.g. `{"pull": 8300, "reply": 8400}`.
    ///
    /// # Errors
    /// [`ConfigError::MonitorPorts`] if it is not that JSON.
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        serde_json::from_str(json).map_err(|e| ConfigError::MonitorPorts(e.to_string()))
    }
}

/// A configuration error, reported before anything binds.
#[derive(Debug, Error, PartialEq)]
pub enum ConfigError {
    /// `--monitor-ports` is not the expected JSON.
    #[error("--monitor-ports: {0} (expected JSON like {{\"pull\": 8300, \"reply\": 8400, \"heartbeat\": 8082}})")]
    MonitorPorts(String),
    /// A flag's value is out of range.
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
    /// Downlink request timeout.
    pub downlink_timeout: Duration,
    /// Most liveness probes in flight at once (≥ 1).
    pub max_concurrent_probes: usize,
    /// Full-sync inactivity timeout.
    pub full_sync_timeout: Duration,
    /// Full-sync completion threshold (0..=1).
    pub full_sync_completion_threshold: f64,
    /// Largest accepted ZMQ frame.
    pub max_frame_bytes: usize,
    /// Most open connections per ZMQ listening socket.
    pub max_zmq_connections: usize,
    /// Silence allowed on a ZMQ connection after its handshake; `None` = unlimited.
    pub zmq_idle_timeout: Option<Duration>,
    /// Most registered workers.
    pub max_workers: usize,
    /// Most keys per worker (all locations).
    pub max_keys_per_worker: u64,
    /// Most ops per admit/evict batch, keys per full-sync batch.
    pub max_batch_ops: usize,
    /// Largest HTTP request body.
    pub max_body_bytes: usize,
    /// Most JSON values in an HTTP request body.
    pub max_body_items: usize,
    /// Most HTTP connections served at once.
    pub max_http_connections: usize,
    /// Time to send an HTTP request's headers (and idle keep-alive time), then its body.
    pub http_read_timeout: Duration,
    /// Token the mutating HTTP routes require; `None` = open.
    pub api_token: Option<ApiToken>,
    /// With `api_token`: the read routes (lookups, fleet reads, `/metrics`, the dashboard)
    /// need it too.
    pub api_token_reads: bool,
    /// Tokens per chunk for HTTP /lookup (≥ 1).
    pub lookup_chunk_size: usize,
    /// First prefix hash for HTTP /lookup.
    pub lookup_none_hash: ChunkHash,
}

/// A non-negative number of seconds.
///
/// # Errors
/// [`ConfigError::Value`] naming `flag` for a negative, NaN or infinite value.
pub fn seconds(flag: &'static str, v: f64) -> Result<Duration, ConfigError> {
    Duration::try_from_secs_f64(v).map_err(|_| ConfigError::Value {
        flag,
        detail: format!("{v} is not a non-negative number of seconds"),
    })
}

/// A strictly positive number of seconds.
///
/// # Errors
/// [`ConfigError::Value`] naming `flag` unless `v > 0` and finite.
pub fn positive_seconds(flag: &'static str, v: f64) -> Result<Duration, ConfigError> {
    if v > 0.0 {
        seconds(flag, v)
    } else {
        Err(ConfigError::Value {
            flag,
            detail: format!("{v} must be > 0"),
        })
    }
}

/// A period that `-1` or `0` turns off (LMCache's convention for sweeps).
///
/// # Errors
/// [`ConfigError::Value`] naming `flag` for any other non-positive value.
pub fn period_or_off(flag: &'static str, v: f64) -> Result<Option<Duration>, ConfigError> {
    match v {
        v if v == -1.0 || v == 0.0 => Ok(None),
        v if v > 0.0 => seconds(flag, v).map(Some),
        v => Err(ConfigError::Value {
            flag,
            detail: format!("{v}: use a positive number of seconds, or -1 (or 0) for off"),
        }),
    }
}

/// A count that must be at least 1.
///
/// # Errors
/// [`ConfigError::Value`] naming `flag` for 0.
pub fn at_least_one<T: PartialEq + Default>(flag: &'static str, v: T) -> Result<T, ConfigError> {
    if v == T::default() {
        return Err(ConfigError::Value {
            flag,
            detail: "0 must be ≥ 1".into(),
        });
    }
    Ok(v)
}

/// A fraction in `[0, 1]`.
///
/// # Errors
/// [`ConfigError::Value`] naming `flag` outside that range (or NaN).
pub fn fraction(flag: &'static str, v: f64) -> Result<f64, ConfigError> {
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(ConfigError::Value {
            flag,
            detail: format!("{v} is not in [0, 1]"),
        })
    }
}

/// A chunk hash written as a decimal integer in `[-2^63, 2^64-1]`.
///
/// # Errors
/// [`ConfigError::Value`] naming `flag` for anything else.
pub fn chunk_hash(flag: &'static str, text: &str) -> Result<ChunkHash, ConfigError> {
    text.trim()
        .parse::<i128>()
        .ok()
        .and_then(ChunkHash::from_i128)
        .ok_or_else(|| ConfigError::Value {
            flag,
            detail: format!("{text:?} is not an integer in [-2^63, 2^64-1]"),
        })
}

impl ServeConfig {
    /// A configuration for tests: everything on 127.0.0.1 with ephemeral ports, fast timers,
    /// the default limits.
    #[doc(hidden)]
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
            downlink_timeout: Duration::from_secs(2),
            max_concurrent_probes: defaults::MAX_CONCURRENT_PROBES,
            full_sync_timeout: Duration::from_secs(300),
            full_sync_completion_threshold: defaults::FULL_SYNC_COMPLETION_THRESHOLD,
            max_frame_bytes: defaults::MAX_FRAME_BYTES,
            max_zmq_connections: defaults::MAX_ZMQ_CONNECTIONS,
            zmq_idle_timeout: None,
            max_workers: defaults::MAX_WORKERS,
            max_keys_per_worker: defaults::MAX_KEYS_PER_WORKER,
            max_batch_ops: defaults::MAX_BATCH_OPS,
            max_body_bytes: defaults::MAX_BODY_BYTES,
            max_body_items: defaults::MAX_BODY_ITEMS,
            max_http_connections: defaults::MAX_HTTP_CONNECTIONS,
            http_read_timeout: Duration::from_secs_f64(defaults::HTTP_READ_TIMEOUT_S),
            api_token: None,
            api_token_reads: false,
            lookup_chunk_size: defaults::LOOKUP_CHUNK_SIZE,
            lookup_none_hash: ChunkHash::from_i64(defaults::LOOKUP_NONE_HASH),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_name_the_flag() {
        assert_eq!(period_or_off("f", -1.0), Ok(None));
        assert_eq!(period_or_off("f", 0.0), Ok(None));
        assert_eq!(
            period_or_off("f", 2.5),
            Ok(Some(Duration::from_millis(2500)))
        );
        for bad in [
            period_or_off("f", -5.0).map(|_| ()),
            positive_seconds("f", 0.0).map(|_| ()),
            positive_seconds("f", f64::NAN).map(|_| ()),
            seconds("f", f64::INFINITY).map(|_| ()),
            at_least_one("f", 0usize).map(|_| ()),
            fraction("f", 1.5).map(|_| ()),
            chunk_hash("f", "18446744073709551616").map(|_| ()),
        ] {
            let e = bad.expect_err("out of range");
            assert!(e.to_string().starts_with("--f:"), "{e}");
        }
        assert_eq!(chunk_hash("f", " -5 "), Ok(ChunkHash::from_i64(-5)));
        assert!(MonitorPorts::from_json(r#"{"pull":1,"bogus":2}"#).is_err());
    }

    #[test]
    fn defaults_parse() {
        let ports = MonitorPorts::from_json(defaults::MONITOR_PORTS).expect("valid default");
        assert_eq!(
            ports,
            MonitorPorts {
                pull: Some(8300),
                reply: Some(8400),
                heartbeat: Some(8082)
            }
        );
        assert!(ApiToken::new("").non_empty().is_none());
        assert!(ApiToken::new("t").non_empty().is_some());
    }
}
