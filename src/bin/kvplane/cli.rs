//! The command line: every subcommand's flags, each also read from `KVPLANE_<FLAG>`, turned
//! into the library's validated configurations. Defaults come from
//! [`kvplane::config::defaults`].

use clap::{Args, Parser, Subcommand};
use kvplane::config::{self, defaults, ApiToken, ConfigError, MonitorPorts, ServeConfig};

/// `kvplane`: a control plane for distributed LLM KV caches.
#[derive(Debug, Parser)]
#[command(name = "kvplane", version, about)]
pub(crate) struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the controller (LMCache 0.5.6 compatible).
    Serve(ServeArgs),
    /// Load-test an LMCache-compatible controller (kvplane or LMCache's own).
    Bench(kvplane::bench::BenchArgs),
    /// Run the router-facing KV indexer (Mooncake Conductor Indexer API, fed by KV events).
    Indexer(kvplane::indexer::service::IndexerArgs),
    /// Run the cache-aware router: an OpenAI-compatible front over vLLM/SGLang engines
    /// (docs/ROUTER.md).
    Router(kvplane::router::RouterArgs),
    /// Run the LMCache MP coordinator (fleet membership, quotas, eviction, warm prefetch).
    Coordinator(crate::coordinator::CoordinatorArgs),
    /// Run a cache node speaking LMCache 0.5.6's `lm://` server protocol (docs/NODE.md).
    Node(crate::node::NodeArgs),
}

/// Flags of `kvplane serve`, as given (see [`ServeConfig`] for the validated form).
#[derive(Debug, Clone, Args)]
pub(crate) struct ServeArgs {
    /// Address every socket binds to.
    #[arg(long, env = "KVPLANE_HOST", default_value = defaults::HOST)]
    host: String,
    /// HTTP port (API, dashboard, metrics). 0 picks a free port.
    #[arg(long, env = "KVPLANE_PORT", default_value_t = defaults::HTTP_PORT)]
    port: u16,
    /// ZMQ ports as JSON, any subset of {"pull","reply","heartbeat"}; a key left out is not
    /// bound. 0 picks a free port.
    #[arg(long, env = "KVPLANE_MONITOR_PORTS", default_value = defaults::MONITOR_PORTS)]
    monitor_ports: String,
    /// Deprecated in LMCache and ignored there too (0.5.6 always uses --monitor-ports).
    #[arg(long, env = "KVPLANE_MONITOR_PORT", hide = true)]
    pub(crate) monitor_port: Option<u16>,
    /// Also run the LMCache MP coordinator in this process on this port (0 picks one); its
    /// other settings come from `KVPLANE_COORDINATOR_*` / `LMCACHE_MP_COORDINATOR_*`.
    #[arg(long, env = "KVPLANE_COORDINATOR_PORT")]
    pub(crate) coordinator_port: Option<u16>,
    /// Seconds between liveness sweeps; -1 (or 0) turns them off.
    #[arg(
        long,
        env = "KVPLANE_HEALTH_CHECK_INTERVAL",
        default_value_t = defaults::HEALTH_CHECK_INTERVAL_S,
        allow_hyphen_values = true
    )]
    health_check_interval: f64,
    /// Seconds of silence after which a worker is probed, and removed if the probe fails.
    #[arg(long, env = "KVPLANE_LMCACHE_WORKER_TIMEOUT", default_value_t = defaults::WORKER_TIMEOUT_S)]
    lmcache_worker_timeout: f64,
    /// Host put in `RegisterRetMsg.heartbeat_url` (default: the bind host, or when that is
    /// 0.0.0.0, 127.0.0.1 for workers on this host and this host's outward address otherwise).
    #[arg(long, env = "KVPLANE_ADVERTISE_HOST")]
    advertise_host: Option<String>,
    /// Most liveness probes in flight at once; a sweep over more silent workers probes them
    /// in waves of this size.
    #[arg(long, env = "KVPLANE_MAX_CONCURRENT_PROBES", default_value_t = defaults::MAX_CONCURRENT_PROBES)]
    max_concurrent_probes: usize,
    /// Seconds a command on a worker's downlink may take before it fails with a timeout.
    #[arg(long, env = "KVPLANE_DOWNLINK_TIMEOUT", default_value_t = defaults::DOWNLINK_TIMEOUT_S)]
    downlink_timeout: f64,
    /// Seconds without progress after which a full sync is marked failed (the worker is then
    /// told to retry on its next heartbeat).
    #[arg(long, env = "KVPLANE_FULL_SYNC_TIMEOUT", default_value_t = defaults::FULL_SYNC_TIMEOUT_S)]
    full_sync_timeout: f64,
    /// Fraction of workers whose sync must be complete before workers may leave freeze mode.
    #[arg(
        long,
        env = "KVPLANE_FULL_SYNC_COMPLETION_THRESHOLD",
        default_value_t = defaults::FULL_SYNC_COMPLETION_THRESHOLD
    )]
    full_sync_completion_threshold: f64,
    /// Largest frame accepted on any ZMQ socket, in bytes; a peer sending a larger one is
    /// disconnected (counted).
    #[arg(long, env = "KVPLANE_MAX_FRAME_BYTES", default_value_t = defaults::MAX_FRAME_BYTES)]
    max_frame_bytes: usize,
    /// Most connections each ZMQ listening socket keeps open at once; connections beyond are
    /// closed at accept and counted.
    #[arg(
        long,
        env = "KVPLANE_MAX_ZMQ_CONNECTIONS",
        default_value_t = defaults::MAX_ZMQ_CONNECTIONS
    )]
    max_zmq_connections: usize,
    /// Seconds a ZMQ connection may go, after its handshake, without a complete message
    /// before it is closed and counted; 0 (the default) or -1 = never, since LMCache workers
    /// may be silent for hours (their heartbeat is off by default).
    #[arg(
        long,
        env = "KVPLANE_ZMQ_IDLE_TIMEOUT",
        default_value_t = defaults::ZMQ_IDLE_TIMEOUT_S,
        allow_hyphen_values = true
    )]
    zmq_idle_timeout: f64,
    /// Most workers registered at once; registrations (and heartbeats of unknown workers)
    /// beyond are refused with an ErrorMsg.
    #[arg(long, env = "KVPLANE_MAX_WORKERS", default_value_t = defaults::MAX_WORKERS)]
    max_workers: usize,
    /// Most keys one worker may hold over all its locations; admits of new keys beyond are
    /// dropped and counted (evicts always apply).
    #[arg(long, env = "KVPLANE_MAX_KEYS_PER_WORKER", default_value_t = defaults::MAX_KEYS_PER_WORKER)]
    max_keys_per_worker: u64,
    /// Most operations in one admit/evict batch (and keys in one full-sync batch); larger
    /// batches are dropped whole and counted.
    #[arg(long, env = "KVPLANE_MAX_BATCH_OPS", default_value_t = defaults::MAX_BATCH_OPS)]
    max_batch_ops: usize,
    /// Largest HTTP request body, in bytes; larger requests get 413 (4 MiB: a 256k-token
    /// /lookup).
    #[arg(long, env = "KVPLANE_MAX_BODY_BYTES", default_value_t = defaults::MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// Most JSON values (list items and fields) in one HTTP request body; bodies with more
    /// get 413 before they are parsed.
    #[arg(long, env = "KVPLANE_MAX_BODY_ITEMS", default_value_t = defaults::MAX_BODY_ITEMS)]
    max_body_items: usize,
    /// Most HTTP connections served at once; further connections wait in the accept queue.
    #[arg(long, env = "KVPLANE_MAX_HTTP_CONNECTIONS", default_value_t = defaults::MAX_HTTP_CONNECTIONS)]
    max_http_connections: usize,
    /// Seconds a client may take to send a request's headers (counted from when its
    /// connection is idle, so also the keep-alive idle timeout), and then its body; slower
    /// clients are cut off.
    #[arg(long, env = "KVPLANE_HTTP_READ_TIMEOUT", default_value_t = defaults::HTTP_READ_TIMEOUT_S)]
    http_read_timeout: f64,
    /// Bearer token the mutating HTTP routes (/clear /pin /compress /decompress /move)
    /// require; unset, they are open to anyone who reaches the HTTP port.
    #[arg(long, env = "KVPLANE_API_TOKEN", hide_env_values = true, value_parser = parse_token)]
    api_token: Option<ApiToken>,
    /// With `--api-token`: the read routes (lookups, fleet reads, `/metrics`, the dashboard)
    /// need it too (`/healthz`, `/readyz` and `/openapi.json` never do).
    #[arg(long, env = "KVPLANE_API_TOKEN_READS", requires = "api_token")]
    api_token_reads: bool,
    /// Tokens per chunk when HTTP /lookup hashes tokens (LMCache's `chunk_size`).
    #[arg(long, env = "KVPLANE_LOOKUP_CHUNK_SIZE", default_value_t = defaults::LOOKUP_CHUNK_SIZE)]
    lookup_chunk_size: usize,
    /// Prefix hash of the first chunk when HTTP /lookup hashes tokens (LMCache's `NONE_HASH`:
    /// 0, or vLLM's when the workers import vLLM); any integer in [-2^63, 2^64-1].
    #[arg(
        long,
        env = "KVPLANE_LOOKUP_NONE_HASH",
        default_value_t = defaults::LOOKUP_NONE_HASH.to_string(),
        allow_hyphen_values = true
    )]
    lookup_none_hash: String,
    /// Also run the KV indexer (docs/INDEXER.md) in this process, its HTTP API on this port
    /// (0 picks a free one), with the `kvplane indexer` defaults otherwise.
    #[arg(long, env = "KVPLANE_SERVE_INDEXER_PORT")]
    pub(crate) indexer_port: Option<u16>,
    /// `--cluster`: hot standby on NATS JetStream (the controller's lease; hosted services
    /// start once this process holds it).
    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,
    /// Run as a read replica of the cluster's controller (needs `--cluster`): follow the
    /// leader's change log and serve the read routes on `--port` (no ZMQ socket, never the
    /// lease; commands answer 409).
    #[arg(long, env = "KVPLANE_SERVE_REPLICA", requires = "cluster")]
    pub(crate) replica: bool,
}

/// `--cluster` and its settings, shared by `serve` and `coordinator` (the same flags and
/// `KVPLANE_CLUSTER*` variables).
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct ClusterArgs {
    /// NATS JetStream for hot standby, `nats://HOST:PORT` (docs/CLUSTER.md): the process
    /// follows the leader's change log without binding any port, and serves once it holds
    /// the cluster's lease.
    #[arg(long, env = "KVPLANE_CLUSTER")]
    pub(crate) cluster: Option<String>,
    /// The cluster's name, so several fleets can share one NATS (A-Z a-z 0-9 _ -).
    #[arg(long, env = "KVPLANE_CLUSTER_NAME", default_value = kvplane::config::defaults::cluster::NAME)]
    pub(crate) cluster_name: String,
    /// Most bytes the cluster's change stream keeps (oldest dropped first).
    #[arg(long, env = "KVPLANE_CLUSTER_MAX_BYTES", default_value_t = kvplane::config::defaults::cluster::MAX_BYTES)]
    pub(crate) cluster_max_bytes: i64,
    /// Seconds the lease lasts without renewal (renewed every quarter of it): a standby takes
    /// over at most this long after the leader dies.
    #[arg(long, env = "KVPLANE_CLUSTER_LEASE_TTL", default_value_t = kvplane::config::defaults::cluster::LEASE_TTL_S)]
    pub(crate) cluster_lease_ttl: f64,
    /// With `--cluster`: a standby (or a controller replica) publishes a snapshot of what it
    /// follows every this many records (at most every 10 s; 0: never), so a follower starting
    /// later restores it instead of replaying the whole log.
    #[arg(long, env = "KVPLANE_CLUSTER_SNAPSHOT_RECORDS", default_value_t = kvplane::config::defaults::cluster::SNAPSHOT_RECORDS)]
    pub(crate) cluster_snapshot_records: u64,
}

impl ClusterArgs {
    /// The `--cluster` settings, if any.
    pub(crate) fn config(&self) -> Result<Option<kvplane::cluster::ClusterConfig>, ConfigError> {
        let Some(url) = &self.cluster else {
            return Ok(None);
        };
        if !(self.cluster_lease_ttl.is_finite() && (0.1..=600.0).contains(&self.cluster_lease_ttl))
        {
            return Err(ConfigError::Value {
                flag: "cluster-lease-ttl",
                detail: format!(
                    "{} is not between 0.1 and 600 seconds",
                    self.cluster_lease_ttl
                ),
            });
        }
        Ok(Some(kvplane::cluster::ClusterConfig {
            name: self.cluster_name.clone(),
            max_bytes: self.cluster_max_bytes.max(1 << 20),
            lease_ttl: std::time::Duration::from_secs_f64(self.cluster_lease_ttl),
            snapshot_records: self.cluster_snapshot_records,
            ..kvplane::cluster::ClusterConfig::new(url.clone())
        }))
    }
}

fn parse_token(s: &str) -> Result<ApiToken, std::convert::Infallible> {
    Ok(ApiToken::new(s))
}

impl ServeArgs {
    /// Validates the flags into the library's configuration.
    ///
    /// # Errors
    /// [`ConfigError`] naming the flag at fault.
    pub(crate) fn validate(&self) -> Result<ServeConfig, ConfigError> {
        Ok(ServeConfig {
            host: self.host.clone(),
            http_port: self.port,
            monitor_ports: MonitorPorts::from_json(&self.monitor_ports)?,
            health_check_interval: config::period_or_off(
                "health-check-interval",
                self.health_check_interval,
            )?,
            worker_timeout: config::positive_seconds(
                "lmcache-worker-timeout",
                self.lmcache_worker_timeout,
            )?,
            advertise_host: self.advertise_host.clone().filter(|h| !h.is_empty()),
            downlink_timeout: config::positive_seconds("downlink-timeout", self.downlink_timeout)?,
            max_concurrent_probes: config::at_least_one(
                "max-concurrent-probes",
                self.max_concurrent_probes,
            )?,
            full_sync_timeout: config::positive_seconds(
                "full-sync-timeout",
                self.full_sync_timeout,
            )?,
            full_sync_completion_threshold: config::fraction(
                "full-sync-completion-threshold",
                self.full_sync_completion_threshold,
            )?,
            max_frame_bytes: config::at_least_one("max-frame-bytes", self.max_frame_bytes)?,
            max_zmq_connections: config::at_least_one(
                "max-zmq-connections",
                self.max_zmq_connections,
            )?,
            zmq_idle_timeout: config::period_or_off("zmq-idle-timeout", self.zmq_idle_timeout)?,
            max_workers: config::at_least_one("max-workers", self.max_workers)?,
            max_keys_per_worker: self.max_keys_per_worker,
            max_batch_ops: config::at_least_one("max-batch-ops", self.max_batch_ops)?,
            max_body_bytes: config::at_least_one("max-body-bytes", self.max_body_bytes)?,
            max_body_items: config::at_least_one("max-body-items", self.max_body_items)?,
            max_http_connections: config::at_least_one(
                "max-http-connections",
                self.max_http_connections,
            )?,
            http_read_timeout: config::positive_seconds(
                "http-read-timeout",
                self.http_read_timeout,
            )?,
            api_token: self.api_token.clone().and_then(ApiToken::non_empty),
            api_token_reads: self.api_token_reads,
            lookup_chunk_size: config::at_least_one("lookup-chunk-size", self.lookup_chunk_size)?,
            lookup_none_hash: config::chunk_hash("lookup-none-hash", &self.lookup_none_hash)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvplane::protocol::ChunkHash;
    use std::time::Duration;

    fn parse(args: &[&str]) -> Result<ServeConfig, String> {
        let mut full = vec!["kvplane", "serve"];
        full.extend_from_slice(args);
        let cli = Cli::try_parse_from(full).map_err(|e| e.to_string())?;
        match cli.command {
            Command::Serve(a) => a.validate().map_err(|e| e.to_string()),
            Command::Bench(_)
            | Command::Indexer(_)
            | Command::Router(_)
            | Command::Coordinator(_)
            | Command::Node(_) => Err("not serve".into()),
        }
    }

    #[test]
    fn zmq_connection_flags_default_safe_and_parse() {
        let c = parse(&[]).expect("defaults");
        assert_eq!((c.max_zmq_connections, c.zmq_idle_timeout), (4096, None));
        let c = parse(&["--max-zmq-connections", "8", "--zmq-idle-timeout", "2.5"]).expect("valid");
        assert_eq!(
            (c.max_zmq_connections, c.zmq_idle_timeout),
            (8, Some(Duration::from_millis(2500)))
        );
        let e = parse(&["--zmq-idle-timeout", "-3"]).expect_err("negative");
        assert!(e.contains("--zmq-idle-timeout"), "{e}");
    }

    /// `--cluster-snapshot-records` is a shared cluster flag: `serve` and `coordinator` both
    /// take it (and its variable's default) into their cluster settings.
    #[test]
    fn both_cluster_subcommands_take_the_snapshot_interval() {
        let records = |sub: &str, extra: &[&str]| {
            let mut full = vec!["kvplane", sub, "--cluster", "nats://127.0.0.1:4222"];
            full.extend_from_slice(extra);
            let cluster = match Cli::try_parse_from(full).map(|c| c.command) {
                Ok(Command::Serve(a)) => a.cluster,
                Ok(Command::Coordinator(a)) => a.cluster,
                other => panic!("not serve or coordinator: {other:?}"),
            };
            let config = cluster.config().expect("valid").expect("clustered");
            config.snapshot_records
        };
        let default = kvplane::config::defaults::cluster::SNAPSHOT_RECORDS;
        for sub in ["serve", "coordinator"] {
            assert_eq!(records(sub, &[]), default, "{sub}");
            assert_eq!(
                records(sub, &["--cluster-snapshot-records", "7"]),
                7,
                "{sub}"
            );
        }
    }

    #[test]
    fn indexer_defaults_and_port_zero() {
        let indexer = |args: &[&str]| {
            let mut full = vec!["kvplane", "indexer"];
            full.extend_from_slice(args);
            match Cli::try_parse_from(full).map(|c| c.command) {
                Ok(Command::Indexer(a)) => a.config(),
                other => panic!("not indexer: {other:?}"),
            }
        };
        let c = indexer(&[]);
        assert_eq!((c.host.as_str(), c.port), ("0.0.0.0", 13333));
        assert_eq!((c.index.seed, c.index.ttl_secs), (1337, None));
        let c = indexer(&["--port", "0", "--ttl-secs", "600", "--hash-seed", "0"]);
        assert_eq!((c.port, c.index.ttl_secs, c.index.seed), (0, Some(600), 0));
        assert_eq!((c.queue_capacity, c.max_queued_bytes), (256, 16 << 20));
        // The record ids bound the memberships: a larger cap is refused, naming the range.
        let max = kvplane::indexer::index::MAX_MEMBERSHIPS;
        let c = indexer(&["--max-memberships", &max.to_string()]);
        assert_eq!(c.index.max_memberships, max);
        for bad in [(max + 1).to_string(), "0".into(), "lots".into()] {
            let err = Cli::try_parse_from(["kvplane", "indexer", "--max-memberships", &bad])
                .map(|_| ())
                .expect_err("refused");
            assert!(err.to_string().contains("from 1 to 268435453"), "{err}");
        }
    }

    #[test]
    fn router_engines_weights_and_refusals() {
        let router = |args: &[&str]| {
            let mut full = vec!["kvplane", "router", "--model", "m"];
            full.extend_from_slice(args);
            match Cli::try_parse_from(full).map(|c| c.command) {
                Ok(Command::Router(a)) => a.config(),
                Err(e) => Err(e.to_string()),
                other => panic!("not router: {other:?}"),
            }
        };
        let c = router(&[
            "--engine",
            "http://10.0.0.5:8000/",
            "--engine",
            "http://h:8001,instance=v1,events=tcp://h:5557,replay=tcp://h:5558,dp_rank=2,type=sglang",
        ])
        .expect("valid");
        assert_eq!((c.port, c.block_size), (9500, 16));
        assert_eq!(c.engines[0].url, "http://10.0.0.5:8000");
        assert_eq!(c.engines[0].instance, "10.0.0.5:8000");
        assert_eq!(c.engines[1].instance, "v1");
        assert_eq!(c.engines[1].events.as_deref(), Some("tcp://h:5557"));
        assert_eq!(c.engines[1].replay.as_deref(), Some("tcp://h:5558"));
        assert_eq!(c.engines[1].dp_rank, 2);
        assert_eq!(c.weights, kvplane::router::score::Weights::default());
        for (bad, says) in [
            (vec!["--engine", "10.0.0.5:8000"], "must start with http://"),
            (
                vec!["--engine", "http://h:1,color=red"],
                "unknown or invalid",
            ),
            (
                vec!["--engine", "http://h:1,events=h:5557"],
                "unknown or invalid",
            ),
            (
                vec!["--engine", "http://h:1", "--cpu-tier-weight", "2"],
                "within 0..=1",
            ),
            (vec!["--engine", "http://h:1", "--temperature=-1"], "≥ 0"),
            (vec!["--engine", "http://h:1", "--block-size", "0"], "> 0"),
            (vec![], "--engine"),
        ] {
            let err = router(&bad).expect_err("refused");
            assert!(err.contains(says), "{bad:?}: {err}");
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
            (65_536, 16_777_216, 65_536, 4 << 20, 64 << 20)
        );
        assert_eq!(
            (
                c.max_body_items,
                c.max_http_connections,
                c.http_read_timeout
            ),
            (1 << 18, 1024, Duration::from_secs(30))
        );
        let c = parse(&[
            "--max-body-items",
            "10",
            "--max-http-connections",
            "2",
            "--http-read-timeout",
            "0.5",
        ])
        .expect("valid");
        assert_eq!(
            (
                c.max_body_items,
                c.max_http_connections,
                c.http_read_timeout
            ),
            (10, 2, Duration::from_millis(500))
        );
        assert!(parse(&["--http-read-timeout", "0"])
            .expect_err("zero")
            .contains("--http-read-timeout"));
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
            "--max-body-items",
            "--max-http-connections",
            "--max-frame-bytes",
            "--max-zmq-connections",
            "--max-concurrent-probes",
        ] {
            let e = parse(&[flag, "0"]).expect_err("zero");
            assert!(e.contains(flag), "{e}");
        }
    }
}
