//! The `--cluster` scenarios of the controller bench (docs/CLUSTER.md): failover of a hot
//! standby, replication lag of read replicas under ingest, and HTTP `/lookup` throughput
//! spread over a leader and its replicas. Like the other scenarios they only measure; none
//! asserts on time. The processes (NATS, leader, standby, replicas) are started by
//! `scripts/bench-cluster.sh`; the bench kills the leader itself (`--leader-pid`).

use super::conn::Conn;
use super::fleet::{self, SimWorker, REQUEST_TIMEOUT};
use super::http;
use super::scenarios::{push_streams, wait_for_keys};
use super::stats::Latency;
use super::BenchArgs;
use crate::protocol::{decode, encode, BatchedP2PLookupMsg, ChunkHash, Msg};
use crate::transport::DealerClient;
use bytes::Bytes;
use serde::Serialize;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// Failover result.
#[derive(Debug, Serialize)]
pub struct Failover {
    /// Simulated workers registered.
    pub workers: usize,
    /// Keys indexed before the kill.
    pub keys: u64,
    /// Seconds from the last key applied until the leader reported every change record
    /// acknowledged by NATS.
    pub replicated_seconds: f64,
    /// Seconds from the last key applied until every `--replicas` follower was caught up
    /// (a proxy for the standby, which binds no port; equal to `replicated_seconds` without
    /// replicas).
    pub followers_caught_up_seconds: f64,
    /// Seconds from SIGKILL of the leader to the first P2P lookup answered with the full hit.
    pub failover_seconds: f64,
    /// The new leader's own figure: lease taken to sockets bound, ms.
    pub takeover_ms: Option<u64>,
    /// Workers whose first heartbeat to the new leader carried a `full_sync` command.
    pub full_syncs_requested: usize,
    /// Keys the new leader holds.
    pub keys_after: u64,
    /// Whether the new leader followed the log without a gap.
    pub in_sync: Option<bool>,
}

/// `--ops` admits spread over `workers`, in batches of `--batch`, no evicts.
fn admits(args: &BenchArgs, run: u64, workers: &[SimWorker]) -> Vec<fleet::OpStream> {
    let per_worker = (args.ops as usize)
        .div_ceil(args.batch)
        .div_ceil(workers.len())
        .max(1);
    fleet::streams(
        run,
        workers,
        per_worker,
        args.batch,
        0,
        args.frames_per_send,
    )
}

fn cluster_status(v: &serde_json::Value) -> Result<&serde_json::Value, String> {
    match v["role"].as_str() {
        Some("leader") => Ok(v),
        other => Err(format!(
            "the controller at --http is not a cluster leader (role {other:?}): start it with \
             --cluster (scripts/bench-cluster.sh)"
        )),
    }
}

/// Polls `base`'s `/controller/cluster` every 5 ms until `cond` holds, failing once `limit`
/// has passed since `since`.
async fn until_status(
    base: &str,
    since: Instant,
    limit: Duration,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> Result<(), String> {
    loop {
        let v = http::get_json(base, "/controller/cluster", limit).await?;
        if cond(&v) {
            return Ok(());
        }
        if since.elapsed() > limit {
            return Err(format!("{base}: not {what} after {limit:?}: {v}"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Registers `workers` workers, indexes `ops` keys, waits until the leader has them all in
/// NATS, SIGKILLs `--leader-pid`, and measures until a P2P lookup is answered again on the
/// same sockets; then heartbeats every worker once and counts the full syncs asked.
///
/// # Errors
/// A message naming what failed.
pub(super) async fn failover(args: &BenchArgs, run: u64) -> Result<Failover, String> {
    let pid = args
        .leader_pid
        .ok_or("the failover scenario needs --leader-pid (the leader's pid, to SIGKILL it)")?;
    let limit = Duration::from_secs_f64(args.timeout);
    let status = http::get_json(&args.http, "/controller/cluster", limit).await?;
    cluster_status(&status)?;
    let workers = SimWorker::many(&format!("bench-{run:x}-fo"), args.workers);
    let url = fleet::register_all(&args.reply, &workers).await?;
    let streams = admits(args, run, &workers);
    let keys: u64 = streams.iter().map(|s| s.net_keys).sum();
    let baseline = http::total_keys(&args.http, limit).await?;
    let (start, _) = push_streams(&args.pull, streams).await?;
    wait_for_keys(args, baseline + keys, start).await?;
    let applied = Instant::now();
    until_status(
        &args.http,
        applied,
        limit,
        "every record acknowledged",
        |v| {
            let p = &v["published"];
            let n = |k: &str| p[k].as_u64().unwrap_or(0);
            n("queued") == n("acked") + n("failed")
        },
    )
    .await?;
    let replicated_seconds = applied.elapsed().as_secs_f64();
    // The standby binds no port; replicas doing the same work tell when followers caught up.
    for base in &args.replicas {
        until_status(base, applied, limit, "the replica caught up", |v| {
            v["following"]["ready"].as_bool() == Some(true)
        })
        .await?;
    }
    let followers_caught_up_seconds = applied.elapsed().as_secs_f64();

    // Worker 0's first batch is one prefix chain: a full hit is `hashes` chunks.
    let hashes = args.lookup_hashes.min(args.batch).max(1);
    let lookup = Bytes::from(encode(&Msg::BatchedP2PLookupMsg(BatchedP2PLookupMsg {
        hashes: (0..hashes as u64).map(|i| fleet::key(run, 0, i)).collect(),
        instance_id: format!("bench-{run:x}-asker"),
        worker_id: 0,
    })));
    let killed = Instant::now();
    let kill = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .map_err(|e| format!("kill -9 {pid}: {e}"))?;
    if !kill.success() {
        return Err(format!("kill -9 {pid} failed: {kill}"));
    }
    let failover_seconds = loop {
        let mut dealer = DealerClient::new(args.reply.clone(), Duration::from_millis(100));
        if let Ok(answer) = dealer.request(lookup.clone()).await {
            match decode(&answer) {
                Ok(Msg::BatchedP2PLookupRetMsg(r))
                    if r.layout_info.first().is_some_and(|l| l.2 == hashes as i64) =>
                {
                    break killed.elapsed().as_secs_f64();
                }
                other => return Err(format!("lookup after the failover: {other:?}")),
            }
        }
        if killed.elapsed() > limit {
            return Err(format!("no lookup answered {limit:?} after the kill"));
        }
    };

    let endpoint = args
        .heartbeat
        .clone()
        .or(url)
        .ok_or("the controller has no heartbeat socket; pass --heartbeat")?;
    let full_syncs_requested = heartbeat_once(&endpoint, &workers).await?;
    let keys_after = http::total_keys(&args.http, limit)
        .await?
        .saturating_sub(baseline);
    let status = http::get_json(&args.http, "/controller/cluster", limit).await?;
    if !args.keep {
        fleet::deregister_all(&args.pull, &args.http, &workers).await;
    }
    Ok(Failover {
        workers: workers.len(),
        keys,
        replicated_seconds,
        followers_caught_up_seconds,
        failover_seconds,
        takeover_ms: status["last_failover"]["takeover_ms"].as_u64(),
        full_syncs_requested,
        keys_after,
        in_sync: status["followed"]["in_sync"].as_bool(),
    })
}

/// One heartbeat per worker (64 at a time); how many replies asked for a full sync.
async fn heartbeat_once(endpoint: &str, workers: &[SimWorker]) -> Result<usize, String> {
    let mut asked = 0;
    for group in workers.chunks(64) {
        let mut tasks = JoinSet::new();
        for w in group {
            let msg = w.heartbeat_frame();
            let endpoint = endpoint.to_owned();
            tasks.spawn(async move {
                let mut dealer = DealerClient::new(endpoint, REQUEST_TIMEOUT);
                let answer = dealer
                    .request(msg)
                    .await
                    .map_err(|e| format!("heartbeat: {e}"))?;
                match decode(&answer) {
                    Ok(Msg::HeartbeatRetMsg(r)) => Ok(!r.commands.is_empty()),
                    other => Err(format!("heartbeat answer: {other:?}")),
                }
            });
        }
        while let Some(r) = tasks.join_next().await {
            if r.map_err(|e| format!("heartbeat task: {e}"))?? {
                asked += 1;
            }
        }
    }
    Ok(asked)
}

/// Replication-lag result.
#[derive(Debug, Serialize)]
pub struct ReplicaLag {
    /// Replicas sampled.
    pub replicas: usize,
    /// Ops pushed to the leader.
    pub ops: u64,
    /// The leader's applied ingest rate (ops until key-stats shows them all).
    pub applied_ops_per_sec: f64,
    /// The lag replicas reported (`following.lag_ms` of `/controller/cluster`), sampled every
    /// 10 ms per replica from the first push until every replica caught up.
    pub lag_ms: Latency,
    /// Seconds after the leader applied the last op until every replica was ready.
    pub caught_up_seconds: f64,
}

/// Pushes `ops` ops to the leader at full speed while sampling each replica's reported lag.
///
/// # Errors
/// A message naming what failed.
pub(super) async fn replica_lag(args: &BenchArgs, run: u64) -> Result<ReplicaLag, String> {
    if args.replicas.is_empty() {
        return Err("the replica-lag scenario needs --replicas http://…[,http://…]".into());
    }
    let limit = Duration::from_secs_f64(args.timeout);
    let workers = SimWorker::many(&format!("bench-{run:x}-lag"), args.workers);
    fleet::register_all(&args.reply, &workers).await?;
    let streams = admits(args, run, &workers);
    let ops: u64 = streams.iter().map(|s| s.ops).sum();
    let baseline = http::total_keys(&args.http, limit).await?;
    let done = tokio_util::sync::CancellationToken::new();
    let mut samplers = JoinSet::new();
    for base in args.replicas.clone() {
        let done = done.clone();
        samplers.spawn(async move {
            let mut samples = Vec::new();
            let mut caught_up_at = None;
            loop {
                let v = http::get_json(&base, "/controller/cluster", REQUEST_TIMEOUT).await?;
                let f = &v["following"];
                samples.push(Duration::from_millis(f["lag_ms"].as_u64().unwrap_or(0)));
                let ready = f["ready"].as_bool() == Some(true);
                if done.is_cancelled() && ready {
                    caught_up_at = caught_up_at.or(Some(Instant::now()));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok::<_, String>((samples, caught_up_at))
        });
    }
    let (start, _) = push_streams(&args.pull, streams).await?;
    let applied_seconds = wait_for_keys(args, baseline + ops, start).await?;
    let applied = Instant::now();
    done.cancel();
    let mut samples = Vec::new();
    let mut last = applied;
    while let Some(r) = tasks_next(&mut samplers, limit).await? {
        let (s, at) = r;
        samples.extend(s);
        last = last.max(at.unwrap_or(applied));
    }
    if !args.keep {
        fleet::deregister_all(&args.pull, &args.http, &workers).await;
    }
    Ok(ReplicaLag {
        replicas: args.replicas.len(),
        ops,
        applied_ops_per_sec: ops as f64 / applied_seconds,
        lag_ms: Latency::from_samples(&mut samples),
        caught_up_seconds: (last - applied).as_secs_f64(),
    })
}

type Sampled = (Vec<Duration>, Option<Instant>);

async fn tasks_next(
    set: &mut JoinSet<Result<Sampled, String>>,
    limit: Duration,
) -> Result<Option<Sampled>, String> {
    match tokio::time::timeout(limit, set.join_next()).await {
        Err(_) => Err(format!("a replica did not catch up within {limit:?}")),
        Ok(None) => Ok(None),
        Ok(Some(r)) => Ok(Some(r.map_err(|e| format!("sampler: {e}"))??)),
    }
}

/// HTTP lookup throughput result.
#[derive(Debug, Serialize)]
pub struct HttpLookup {
    /// Servers queried (round robin).
    pub targets: usize,
    /// Concurrent clients (each a keep-alive connection).
    pub concurrency: usize,
    /// Latency of each `POST /lookup`.
    pub latency: Latency,
    /// Requests per second over all targets.
    pub requests_per_sec: f64,
}

/// Indexes chains on the leader, waits until every target holds them, then `concurrency`
/// clients send `lookup_requests` `POST /lookup {"hashes": …}` spread over `--query-http`.
///
/// # Errors
/// A message naming what failed.
pub(super) async fn http_lookup(args: &BenchArgs, run: u64) -> Result<HttpLookup, String> {
    let targets: Vec<String> = if args.query_http.is_empty() {
        vec![args.http.clone()]
    } else {
        args.query_http.clone()
    };
    let limit = Duration::from_secs_f64(args.timeout);
    let holders = SimWorker::many(&format!("bench-{run:x}-hl"), args.workers);
    fleet::register_all(&args.reply, &holders).await?;
    let hashes = args.lookup_hashes.max(1);
    let chains = (args.lookup_keys as usize / hashes / holders.len()).max(1);
    let streams = fleet::streams(run, &holders, chains, hashes, 0, args.frames_per_send);
    let indexed: u64 = streams.iter().map(|s| s.net_keys).sum();
    let baseline = http::total_keys(&args.http, limit).await?;
    let (start, _) = push_streams(&args.pull, streams).await?;
    wait_for_keys(args, baseline + indexed, start).await?;
    for t in &targets {
        let waited = Instant::now();
        while http::total_keys(t, limit).await? < baseline + indexed {
            if waited.elapsed() > limit {
                return Err(format!("{t} did not catch up within {limit:?}"));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let concurrency = args.concurrency.max(1);
    let per_task = (args.lookup_requests / concurrency).max(1);
    let n_holders = holders.len();
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for c in 0..concurrency {
        let (authority, prefix) = http::split_base(&targets[c % targets.len()])?;
        tasks.spawn(async move {
            let bodies: Vec<Vec<u8>> = (0..per_task)
                .map(|i| {
                    let pick = super::stats::mix(run ^ (c as u64) << 32 ^ i as u64);
                    let holder = (pick as usize) % n_holders;
                    let chain = ((pick >> 20) as usize) % chains;
                    let keys: Vec<i128> = (0..hashes)
                        .map(|j| {
                            let k: ChunkHash = fleet::key(run, holder, (chain * hashes + j) as u64);
                            k.as_i128()
                        })
                        .collect();
                    serde_json::json!({ "hashes": keys })
                        .to_string()
                        .into_bytes()
                })
                .collect();
            let mut conn = Conn::connect(&authority, REQUEST_TIMEOUT).await?;
            let path = format!("{prefix}/lookup");
            let mut samples = Vec::with_capacity(per_task);
            for body in bodies {
                let sent = Instant::now();
                let (status, reply) = conn
                    .request("POST", &path, Some(&body), REQUEST_TIMEOUT)
                    .await?;
                if status != 200 {
                    return Err(format!(
                        "POST /lookup: HTTP {status}: {}",
                        String::from_utf8_lossy(&reply)
                    ));
                }
                samples.push(sent.elapsed());
            }
            Ok::<_, String>(samples)
        });
    }
    let mut samples = Vec::new();
    while let Some(r) = tasks.join_next().await {
        samples.extend(r.map_err(|e| format!("lookup task: {e}"))??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    if !args.keep {
        fleet::deregister_all(&args.pull, &args.http, &holders).await;
    }
    Ok(HttpLookup {
        targets: targets.len(),
        concurrency,
        requests_per_sec: samples.len() as f64 / elapsed,
        latency: Latency::from_samples(&mut samples),
    })
}
