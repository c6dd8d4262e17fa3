//! `kvplane bench`: a load generator for any LMCache-compatible controller (kvplane or
//! LMCache's own).
//!
//! It speaks only the wire protocol and `GET /controller/key-stats`, so the same command
//! measures both. Op streams and requests are pre-encoded, so the client is not what is
//! measured. It reports the **applied** ingest rate (time until key-stats shows every op), P2P
//! lookup latency percentiles, full-sync time, heartbeat latency and the rate of workers coming
//! and going ([`churn`]), plus the controller's RSS when given its pid. `kvplane bench coordinator` ([`coordinator`]) and `kvplane bench node`
//! ([`node`]) measure the other services over their own wire protocols, `kvplane bench indexer`
//! ([`indexer`]) the KV indexer over vLLM's KV-event stream and the indexer HTTP API, `kvplane
//! bench route` ([`route`]) routing policies on a trace against simulated engines. Depends on `protocol`
//! and `transport`; `route` also on the router's scoring and its process.

mod churn;
pub mod cluster;
mod conn;
pub mod coordinator;
mod fleet;
mod http;
pub mod indexer;
mod indexer_stream;
pub mod node;
pub mod route;
pub mod route_overhead;
pub mod route_policy;
pub mod route_trace;
mod scenarios;
pub mod sim_engine;
pub mod sim_pool;
mod stats;

pub use stats::{rss_bytes, Latency};

/// The other services `kvplane bench` measures (without one: the controller scenarios).
#[derive(Debug, Clone, clap::Subcommand)]
pub enum BenchTarget {
    /// The LMCache MP coordinator scenario (kvplane's or `python -m lmcache.v1.mp_coordinator`).
    Coordinator(coordinator::CoordinatorBenchArgs),
    /// The cache-node scenario over the LMCache server protocol (kvplane node, LMCache's
    /// `lmcache.v1.server`, or the bare-loopback baseline).
    Node(node::NodeBenchArgs),
    /// The KV-indexer scenario (`kvplane indexer` or Dynamo's `python -m dynamo.indexer`), fed
    /// a pre-encoded vLLM event stream over ZMQ.
    Indexer(indexer::IndexerBenchArgs),
    /// The fleet simulator: a Mooncake-format trace replayed against simulated engines under
    /// each routing policy (`kvplane router` among them), or `--overhead`, the router's
    /// decision cost.
    Route(route::RouteBenchArgs),
    /// One simulated engine (started by `bench route`).
    #[command(hide = true)]
    SimEngine(sim_engine::SimEngineArgs),
}

use clap::Args;
use serde::Serialize;
use std::fmt::Write as _;

/// Flags of `kvplane bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Another service to measure; without one, the controller scenarios below run.
    #[command(subcommand)]
    pub target: Option<BenchTarget>,
    /// The controller's PULL socket.
    #[arg(long, env = "KVPLANE_BENCH_PULL", default_value = "127.0.0.1:8300")]
    pub pull: String,
    /// The controller's reply ROUTER socket.
    #[arg(long, env = "KVPLANE_BENCH_REPLY", default_value = "127.0.0.1:8400")]
    pub reply: String,
    /// The heartbeat ROUTER socket (default: the `heartbeat_url` the controller returns).
    #[arg(long, env = "KVPLANE_BENCH_HEARTBEAT")]
    pub heartbeat: Option<String>,
    /// Base URL of the controller's HTTP API (for `/controller/key-stats`).
    #[arg(
        long,
        env = "KVPLANE_BENCH_HTTP",
        default_value = "http://127.0.0.1:9000"
    )]
    pub http: String,
    /// Comma-separated scenarios: ingest, lookup, sync, heartbeat; churn (workers that
    /// register, admit and leave; run alone, against a controller nothing else changes); with
    /// `--cluster` (scripts/bench-cluster.sh) also failover, replica-lag, http-lookup.
    #[arg(
        long,
        env = "KVPLANE_BENCH_SCENARIOS",
        default_value = "ingest,lookup,sync,heartbeat",
        value_delimiter = ','
    )]
    pub scenarios: Vec<String>,
    /// Simulated workers for ingest and as lookup holders (one instance each).
    #[arg(long, env = "KVPLANE_BENCH_WORKERS", default_value_t = 10)]
    pub workers: usize,
    /// Admit/evict ops to push.
    #[arg(long, env = "KVPLANE_BENCH_OPS", default_value_t = 2_000_000)]
    pub ops: u64,
    /// Ops per `BatchedKVOperationMsg` (LMCache's worker sends up to 50).
    #[arg(long, env = "KVPLANE_BENCH_BATCH", default_value_t = 50)]
    pub batch: usize,
    /// Fraction of each batch that evicts keys of the previous batch.
    #[arg(long, env = "KVPLANE_BENCH_EVICT_RATIO", default_value_t = 0.2)]
    pub evict_ratio: f64,
    /// Batches per multipart send (LMCache's worker sends up to 50 queued messages at once).
    #[arg(long, env = "KVPLANE_BENCH_FRAMES_PER_SEND", default_value_t = 10)]
    pub frames_per_send: usize,
    /// Keys indexed before timing lookups.
    #[arg(long, env = "KVPLANE_BENCH_LOOKUP_KEYS", default_value_t = 1_000_000)]
    pub lookup_keys: u64,
    /// Hashes per lookup request.
    #[arg(long, env = "KVPLANE_BENCH_LOOKUP_HASHES", default_value_t = 100)]
    pub lookup_hashes: usize,
    /// Lookup requests in total.
    #[arg(long, env = "KVPLANE_BENCH_LOOKUP_REQUESTS", default_value_t = 20_000)]
    pub lookup_requests: usize,
    /// Concurrent lookup clients.
    #[arg(long, env = "KVPLANE_BENCH_CONCURRENCY", default_value_t = 1)]
    pub concurrency: usize,
    /// Keys in the full sync.
    #[arg(long, env = "KVPLANE_BENCH_SYNC_KEYS", default_value_t = 1_000_000)]
    pub sync_keys: u64,
    /// Workers heartbeating once a second.
    #[arg(long, env = "KVPLANE_BENCH_HEARTBEAT_WORKERS", default_value_t = 1000)]
    pub heartbeat_workers: usize,
    /// Seconds of heartbeating.
    #[arg(long, env = "KVPLANE_BENCH_HEARTBEAT_SECONDS", default_value_t = 10.0)]
    pub heartbeat_seconds: f64,
    /// Register → admit → deregister cycles of the `churn` scenario.
    #[arg(long, env = "KVPLANE_BENCH_CHURN_CYCLES", default_value_t = 10_000)]
    pub churn_cycles: usize,
    /// Concurrent connections the `churn` cycles run over.
    #[arg(long, env = "KVPLANE_BENCH_CHURN_LANES", default_value_t = 8)]
    pub churn_lanes: usize,
    /// The cluster leader's pid, which the `failover` scenario SIGKILLs.
    #[arg(long, env = "KVPLANE_BENCH_LEADER_PID")]
    pub leader_pid: Option<u32>,
    /// Read replicas whose lag the `replica-lag` scenario samples (`http://host:port`, comma
    /// separated).
    #[arg(long, env = "KVPLANE_BENCH_REPLICAS", value_delimiter = ',')]
    pub replicas: Vec<String>,
    /// Servers the `http-lookup` scenario spreads `POST /lookup` over (default: `--http`).
    #[arg(long, env = "KVPLANE_BENCH_QUERY_HTTP", value_delimiter = ',')]
    pub query_http: Vec<String>,
    /// Pid of the controller, to report its RSS.
    #[arg(long, env = "KVPLANE_BENCH_PID")]
    pub pid: Option<u32>,
    /// Seconds each scenario may take before it fails.
    #[arg(long, env = "KVPLANE_BENCH_TIMEOUT", default_value_t = 300.0)]
    pub timeout: f64,
    /// Keep the simulated workers registered (and their keys) after the run.
    #[arg(long, env = "KVPLANE_BENCH_KEEP")]
    pub keep: bool,
    /// Print the report as JSON instead of the summary.
    #[arg(long, env = "KVPLANE_BENCH_JSON")]
    pub json: bool,
}

/// RSS readings of the controller (bytes), when `--pid` is given.
#[derive(Debug, Default, Serialize)]
pub struct Rss {
    /// Before any scenario.
    pub start: Option<u64>,
    /// Right after the lookup keys were indexed and queried (the index at its fullest).
    pub after_lookup: Option<u64>,
    /// At the end.
    pub end: Option<u64>,
}

/// Everything one run measured.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// Applied ingest.
    pub ingest: Option<scenarios::Ingest>,
    /// P2P lookups.
    pub lookup: Option<scenarios::Lookup>,
    /// Full sync.
    pub full_sync: Option<scenarios::FullSync>,
    /// Heartbeats.
    pub heartbeat: Option<scenarios::Heartbeat>,
    /// Register/deregister churn.
    pub churn: Option<churn::Churn>,
    /// Failover of a cluster leader.
    pub failover: Option<cluster::Failover>,
    /// Read replicas' lag under ingest.
    pub replica_lag: Option<cluster::ReplicaLag>,
    /// `POST /lookup` throughput over the leader and replicas.
    pub http_lookup: Option<cluster::HttpLookup>,
    /// Controller RSS.
    pub rss: Rss,
}

/// Runs the selected scenarios in order.
///
/// # Errors
/// A message naming the scenario and what failed.
pub async fn run(args: &BenchArgs) -> Result<Report, String> {
    for s in &args.scenarios {
        if !matches!(
            s.as_str(),
            "ingest"
                | "lookup"
                | "sync"
                | "heartbeat"
                | "churn"
                | "failover"
                | "replica-lag"
                | "http-lookup"
        ) {
            return Err(format!(
                "--scenarios: unknown scenario {s:?} (ingest, lookup, sync, heartbeat, churn, \
                 failover, replica-lag, http-lookup)"
            ));
        }
    }
    if args.batch == 0 || args.workers == 0 {
        return Err("--batch and --workers must be at least 1".into());
    }
    let run: u64 = rand::random();
    let wants = |s: &str| args.scenarios.iter().any(|x| x == s);
    let rss = || args.pid.and_then(rss_bytes);
    let mut report = Report {
        rss: Rss {
            start: rss(),
            ..Rss::default()
        },
        ..Report::default()
    };
    if wants("ingest") {
        report.ingest = Some(
            scenarios::ingest(args, run)
                .await
                .map_err(|e| format!("ingest: {e}"))?,
        );
    }
    if wants("lookup") {
        let lookup = scenarios::lookup(args, run.wrapping_add(1)).await;
        report.lookup = Some(lookup.map_err(|e| format!("lookup: {e}"))?);
        report.rss.after_lookup = rss();
    }
    if wants("sync") {
        report.full_sync = Some(
            scenarios::full_sync(args, run.wrapping_add(2))
                .await
                .map_err(|e| format!("sync: {e}"))?,
        );
    }
    if wants("heartbeat") {
        report.heartbeat = Some(
            scenarios::heartbeat(args, run.wrapping_add(3))
                .await
                .map_err(|e| format!("heartbeat: {e}"))?,
        );
    }
    if wants("churn") {
        report.churn = Some(
            churn::churn(args, run.wrapping_add(7))
                .await
                .map_err(|e| format!("churn: {e}"))?,
        );
    }
    if wants("replica-lag") {
        let lag = cluster::replica_lag(args, run.wrapping_add(4)).await;
        report.replica_lag = Some(lag.map_err(|e| format!("replica-lag: {e}"))?);
    }
    if wants("http-lookup") {
        let l = cluster::http_lookup(args, run.wrapping_add(5)).await;
        report.http_lookup = Some(l.map_err(|e| format!("http-lookup: {e}"))?);
    }
    // Last: it kills the leader.
    if wants("failover") {
        let f = cluster::failover(args, run.wrapping_add(6)).await;
        report.failover = Some(f.map_err(|e| format!("failover: {e}"))?);
    }
    report.rss.end = rss();
    Ok(report)
}

impl Report {
    /// A readable summary, one line per measure.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        if let Some(i) = &self.ingest {
            let _ = writeln!(
                out,
                "ingest     {:>12.0} ops/s applied  ({} ops, {} workers, batch {}, sent in {:.3} s, applied in {:.3} s)",
                i.applied_ops_per_sec, i.ops, i.workers, i.batch, i.send_seconds, i.applied_seconds
            );
        }
        if let Some(l) = &self.lookup {
            let _ = writeln!(
                out,
                "lookup     p50 {:.1} µs  p99 {:.1} µs  p999 {:.1} µs  ({} req of {} hashes, {} keys indexed, concurrency {}, {:.0} req/s, {} wrong)",
                l.latency.p50_us, l.latency.p99_us, l.latency.p999_us, l.latency.count, l.hashes,
                l.indexed_keys, l.concurrency, l.requests_per_sec, l.wrong_answers
            );
        }
        if let Some(s) = &self.full_sync {
            let _ = writeln!(
                out,
                "full sync  {:.3} s for {} keys in {} batches",
                s.seconds, s.keys, s.batches
            );
        }
        if let Some(h) = &self.heartbeat {
            let _ = writeln!(
                out,
                "heartbeat  p50 {:.1} µs  p99 {:.1} µs  p999 {:.1} µs  ({} workers × {:.0} s)",
                h.latency.p50_us, h.latency.p99_us, h.latency.p999_us, h.workers, h.seconds
            );
        }
        if let Some(c) = &self.churn {
            let _ = writeln!(
                out,
                "churn      {:>12.0} cycles/s  ({} register/admit/deregister cycles over {} connections, drained in {:.3} s)",
                c.cycles_per_sec, c.cycles, c.lanes, c.seconds
            );
        }
        if let Some(l) = &self.replica_lag {
            let _ = writeln!(
                out,
                "replica lag p50 {:.0} ms  p99 {:.0} ms  max {:.0} ms  ({} replicas, {} ops at {:.0} ops/s applied; caught up {:.3} s after the leader)",
                l.lag_ms.p50_us / 1e3, l.lag_ms.p99_us / 1e3, l.lag_ms.max_us / 1e3, l.replicas,
                l.ops, l.applied_ops_per_sec, l.caught_up_seconds
            );
        }
        if let Some(h) = &self.http_lookup {
            let _ = writeln!(
                out,
                "http lookup {:.0} req/s  p50 {:.1} µs  p99 {:.1} µs  ({} targets, concurrency {})",
                h.requests_per_sec, h.latency.p50_us, h.latency.p99_us, h.targets, h.concurrency
            );
        }
        if let Some(f) = &self.failover {
            let _ = writeln!(
                out,
                "failover   {:.3} s to the first answered P2P lookup (takeover {} ms), {} full syncs asked of {} workers, {} of {} keys held (acked by NATS {:.3} s and followers caught up {:.3} s after applied, in sync {:?})",
                f.failover_seconds,
                f.takeover_ms.map_or("-".into(), |m| m.to_string()),
                f.full_syncs_requested, f.workers, f.keys_after, f.keys, f.replicated_seconds,
                f.followers_caught_up_seconds, f.in_sync
            );
        }
        let mib = |b: Option<u64>| {
            b.map_or("-".to_owned(), |b| {
                format!("{:.1} MiB", b as f64 / 1048576.0)
            })
        };
        if self.rss.start.is_some() {
            let _ = writeln!(
                out,
                "rss        start {}  after lookup keys {}  end {}",
                mib(self.rss.start),
                mib(self.rss.after_lookup),
                mib(self.rss.end)
            );
        }
        out
    }
}
