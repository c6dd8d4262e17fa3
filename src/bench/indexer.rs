//! `kvplane bench indexer`: the KV-indexer scenario, against `kvplane indexer` or Dynamo's
//! standalone indexer (`python -m dynamo.indexer`, ai-dynamo-runtime 1.6.1), fed the same
//! pre-encoded vLLM 0.33 event stream ([`super::indexer_stream`]).
//!
//! `--instances` simulated engines each bind a ZMQ PUB and a replay ROUTER on 127.0.0.1 and are
//! registered with the indexer (`POST /register`, in the indexer's own body shape). Each first
//! publishes one probe prompt, and the bench waits until `/query` sees it: the subscriptions
//! are up. Then the clock starts and every engine publishes its share of `--blocks` (prompts of
//! `--prompt-blocks` blocks, one message per prompt, `--blocks-per-event` blocks per
//! `BlockStored`); the **applied** rate counts the time until `/query` sees the last prompt of
//! every engine in full. Then `--queries` `/query` calls for stored prompts (one keep-alive
//! connection, closed loop) give the latency percentiles, each answer checked. With `--pid`,
//! the indexer's RSS before and after the ingest gives the bytes per (holder, block)
//! membership. Every call is bounded; a wrong answer is counted, a failed call fails the run.

use super::conn::Conn;
use super::http::split_base;
use super::indexer_stream::{EnginePublisher, Shape};
use super::stats::{mix, rss_bytes, Latency};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use serde::Serialize;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Which indexer is measured (their `/register` and `/query` bodies differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexerFlavor {
    /// `kvplane indexer` (the Mooncake Conductor document's JSON).
    Kvplane,
    /// `python -m dynamo.indexer` (u64 `instance_id`, `model_name`, `instances` answer).
    Dynamo,
}

/// Flags of `kvplane bench indexer`.
#[derive(Debug, Clone, Args)]
pub struct IndexerBenchArgs {
    /// Base URL of the indexer.
    #[arg(
        long,
        env = "KVPLANE_BENCH_INDEXER_URL",
        default_value = "http://127.0.0.1:13333"
    )]
    pub url: String,
    /// The indexer's API: kvplane or dynamo.
    #[arg(
        long,
        env = "KVPLANE_BENCH_INDEXER_FLAVOR",
        value_enum,
        default_value = "kvplane"
    )]
    pub flavor: IndexerFlavor,
    /// Blocks published in total (rounded up to whole prompts).
    #[arg(long, env = "KVPLANE_BENCH_INDEXER_BLOCKS", default_value_t = 1 << 20)]
    pub blocks: u64,
    /// Simulated engine instances (one PUB + replay ROUTER each); prompts are dealt round robin.
    #[arg(long, env = "KVPLANE_BENCH_INDEXER_INSTANCES", default_value_t = 4)]
    pub instances: usize,
    /// Tokens per block.
    #[arg(long, env = "KVPLANE_BENCH_INDEXER_BLOCK_SIZE", default_value_t = 16)]
    pub block_size: usize,
    /// Blocks per prompt (one message per prompt; the queried prompts have this length).
    #[arg(
        long,
        env = "KVPLANE_BENCH_INDEXER_PROMPT_BLOCKS",
        default_value_t = 128
    )]
    pub prompt_blocks: usize,
    /// Blocks per `BlockStored` event (a prompt's events are chained by parent hash).
    #[arg(
        long,
        env = "KVPLANE_BENCH_INDEXER_BLOCKS_PER_EVENT",
        default_value_t = 16
    )]
    pub blocks_per_event: usize,
    /// `/query` calls timed after the ingest.
    #[arg(long, env = "KVPLANE_BENCH_INDEXER_QUERIES", default_value_t = 2000)]
    pub queries: usize,
    /// Model name registered and queried.
    #[arg(
        long,
        env = "KVPLANE_BENCH_INDEXER_MODEL",
        default_value = "bench-model"
    )]
    pub model: String,
    /// Pid of the indexer, to report its RSS.
    #[arg(long, env = "KVPLANE_BENCH_PID")]
    pub pid: Option<u32>,
    /// Seconds any single request, and the applied check, may take.
    #[arg(long, env = "KVPLANE_BENCH_TIMEOUT", default_value_t = 300.0)]
    pub timeout: f64,
    /// Print the report as JSON instead of the summary.
    #[arg(long, env = "KVPLANE_BENCH_JSON")]
    pub json: bool,
}

/// What the indexer scenario measured.
#[derive(Debug, Serialize)]
pub struct IndexerReport {
    /// The indexer measured.
    pub flavor: IndexerFlavor,
    /// Engine instances.
    pub instances: usize,
    /// Blocks published (= memberships: every block is on one instance).
    pub blocks: u64,
    /// `BlockStored` events published.
    pub events: u64,
    /// ZMQ messages (one per prompt) published.
    pub messages: u64,
    /// Bytes of msgpack payload published.
    pub payload_bytes: u64,
    /// Tokens per block.
    pub block_size: usize,
    /// Blocks per prompt.
    pub prompt_blocks: usize,
    /// Seconds to hand every message to the PUB sockets.
    pub send_seconds: f64,
    /// Seconds until `/query` saw the last prompt of every instance.
    pub applied_seconds: f64,
    /// `events / applied_seconds`.
    pub applied_events_per_sec: f64,
    /// `blocks / applied_seconds`.
    pub applied_blocks_per_sec: f64,
    /// `/query` calls made while waiting for the last prompts.
    pub applied_polls: u64,
    /// `/query` latency for stored prompts of `prompt_blocks` blocks.
    pub query: Latency,
    /// Answers that did not show the prompt in full on its instance.
    pub wrong_answers: u64,
    /// Indexer RSS after the probes, before the timed ingest (bytes).
    pub rss_before: Option<u64>,
    /// Indexer RSS after the queries (bytes).
    pub rss_after: Option<u64>,
    /// Indexer peak RSS (VmHWM) at the end (bytes).
    pub rss_peak: Option<u64>,
    /// `(rss_after - rss_before) / blocks`.
    pub rss_bytes_per_membership: Option<f64>,
    /// kvplane only: gaps, replays and queue-full waits over all streams (`GET /services`).
    pub kvplane_gaps_replays_waits: Option<[u64; 3]>,
    /// `/proc/loadavg` (1-minute) before and after the run.
    pub loadavg: [Option<f64>; 2],
}

fn loadavg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn hwm_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The flavor-specific request bodies and answer reading.
struct Api {
    flavor: IndexerFlavor,
    model: String,
    block_size: usize,
}

impl Api {
    fn name(&self, i: usize) -> String {
        match self.flavor {
            IndexerFlavor::Kvplane => format!("bench-{i}"),
            IndexerFlavor::Dynamo => (i + 1).to_string(),
        }
    }

    fn register(&self, i: usize, p: &EnginePublisher) -> Value {
        match self.flavor {
            IndexerFlavor::Kvplane => json!({"endpoint": p.endpoint,
                "replay_endpoint": p.replay_endpoint, "type": "vLLM", "modelname": self.model,
                "instance_id": self.name(i), "block_size": self.block_size, "dp_rank": 0}),
            IndexerFlavor::Dynamo => json!({"endpoint": p.endpoint,
                "replay_endpoint": p.replay_endpoint, "model_name": self.model,
                "instance_id": i as u64 + 1, "block_size": self.block_size, "dp_rank": 0}),
        }
    }

    fn query(&self, tokens: &[u32]) -> Bytes {
        let body = match self.flavor {
            IndexerFlavor::Kvplane => {
                json!({"model": self.model, "block_size": self.block_size, "token_ids": tokens})
            }
            IndexerFlavor::Dynamo => json!({"model_name": self.model, "token_ids": tokens}),
        };
        Bytes::from(body.to_string())
    }

    /// `longest_matched` (tokens) of instance `i` in a `/query` answer (0 when absent).
    fn longest(&self, answer: &[u8], i: usize) -> u64 {
        let Ok(v) = serde_json::from_slice::<Value>(answer) else {
            return 0;
        };
        let row = match self.flavor {
            IndexerFlavor::Kvplane => &v["default"][self.name(i)],
            IndexerFlavor::Dynamo => &v["instances"][self.name(i)],
        };
        row["longest_matched"].as_u64().unwrap_or(0)
    }
}

/// Runs the scenario once.
///
/// # Errors
/// A message naming the step that failed.
pub async fn run(a: &IndexerBenchArgs) -> Result<IndexerReport, String> {
    if a.instances == 0 || a.block_size == 0 || a.prompt_blocks == 0 || a.blocks_per_event == 0 {
        return Err(
            "--instances, --block-size, --prompt-blocks and --blocks-per-event must be at least 1"
                .into(),
        );
    }
    if a.blocks == 0 || a.queries == 0 {
        return Err("--blocks and --queries must be at least 1".into());
    }
    let timeout = Duration::from_secs_f64(a.timeout);
    let load_start = loadavg();
    let (authority, prefix) = split_base(&a.url)?;
    let shape = Shape {
        block_size: a.block_size,
        prompt_blocks: a.prompt_blocks,
        blocks_per_event: a.blocks_per_event,
        seed: rand::random(),
    };
    let api = Api {
        flavor: a.flavor,
        model: a.model.clone(),
        block_size: a.block_size,
    };
    let prompts = a.blocks.div_ceil(a.prompt_blocks as u64);
    let n = a.instances as u64;
    // Prompt p is on instance p % n; prompts `prompts + i` are the probes.
    let encode = move || {
        (0..n)
            .map(|i| {
                std::iter::once(prompts + i)
                    .chain((i..prompts).step_by(n as usize))
                    .map(|p| Bytes::from(shape.prompt_message(p, 0)))
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    };
    let streams = tokio::task::spawn_blocking(encode)
        .await
        .map_err(|e| format!("encoding the stream: {e}"))?;
    let payload_bytes: u64 = streams
        .iter()
        .flat_map(|s| s.iter().skip(1))
        .map(|m| m.len() as u64)
        .sum();
    let mut engines = Vec::with_capacity(a.instances);
    for s in streams {
        engines.push(EnginePublisher::start(s).await?);
    }
    let mut conn = Conn::connect(&authority, timeout).await?;
    let path = |p: &str| format!("{prefix}{p}");
    for (i, e) in engines.iter().enumerate() {
        let body = api.register(i, e).to_string();
        let (status, reply) = conn
            .request("POST", &path("/register"), Some(body.as_bytes()), timeout)
            .await?;
        if !(200..300).contains(&status) {
            return Err(format!(
                "register {}: HTTP {status} {}",
                api.name(i),
                String::from_utf8_lossy(&reply)
            ));
        }
    }
    let full = (a.prompt_blocks * a.block_size) as u64;
    // A PUB drops what it sends before a subscriber has joined, and Dynamo replays only when
    // the next live message shows the gap: give the SUB sockets time to connect.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The probes: one prompt per engine, until each is visible (live or by replay).
    for e in &mut engines {
        e.publish(1).await?;
    }
    let mut polls = 0u64;
    for (i, engine) in engines.iter_mut().enumerate() {
        let body = api.query(&shape.tokens(prompts + i as u64));
        // On a loaded machine a SUB can join after its probe went out: send it again every
        // few seconds (the same sequence number) until it shows, within the timeout.
        let started = Instant::now();
        let step = PROBE_RESEND.min(timeout);
        loop {
            let seen = until_seen(
                &mut conn,
                &api,
                &path("/query"),
                &body,
                i,
                full,
                step,
                &mut polls,
            )
            .await;
            match seen {
                Err(e) if e.contains(NOT_SHOWN) && started.elapsed() + step < timeout => {
                    engine.republish_last().await?;
                }
                other => break other?,
            }
        }
    }
    let rss_before = a.pid.and_then(rss_bytes);

    // The timed ingest: engines publish in turns of 64 messages, as concurrent engines would.
    let start = Instant::now();
    loop {
        let mut sent = 0;
        for e in &mut engines {
            sent += e.publish(64).await?;
        }
        if sent == 0 {
            break;
        }
    }
    let send_seconds = start.elapsed().as_secs_f64();
    polls = 0;
    for i in 0..a.instances {
        let last = (0..prompts).rev().find(|p| p % n == i as u64);
        if let Some(p) = last {
            let body = api.query(&shape.tokens(p));
            until_seen(
                &mut conn,
                &api,
                &path("/query"),
                &body,
                i,
                full,
                timeout,
                &mut polls,
            )
            .await?;
        }
    }
    let applied_seconds = start.elapsed().as_secs_f64();

    // Query latency: stored prompts, pseudo-random, each answer checked.
    let distinct = a.queries.min(1024);
    let bodies: Vec<(usize, Bytes)> = (0..distinct as u64)
        .map(|q| {
            let p = mix(q ^ 0x5eed) % prompts;
            ((p % n) as usize, api.query(&shape.tokens(p)))
        })
        .collect();
    let mut samples = Vec::with_capacity(a.queries);
    let mut wrong = 0u64;
    for q in 0..a.queries + 50 {
        let (i, body) = &bodies[q % distinct];
        let t = Instant::now();
        let (status, reply) = conn
            .request("POST", &path("/query"), Some(body), timeout)
            .await?;
        let took = t.elapsed();
        if status != 200 || api.longest(&reply, *i) != full {
            wrong += 1;
        }
        if q >= 50 {
            samples.push(took);
        }
    }
    let rss_after = a.pid.and_then(rss_bytes);
    let kvplane_gaps_replays_waits = match a.flavor {
        IndexerFlavor::Kvplane => {
            let (_, reply) = conn
                .request("GET", &path("/services"), None, timeout)
                .await?;
            let v: Value = serde_json::from_slice(&reply).unwrap_or_default();
            let mut sums = [0u64; 3];
            for s in v["services"].as_array().into_iter().flatten() {
                for (k, name) in ["gaps", "replays", "queue_full"].iter().enumerate() {
                    sums[k] += s["connection"][name].as_u64().unwrap_or(0);
                }
            }
            Some(sums)
        }
        IndexerFlavor::Dynamo => None,
    };
    let blocks = prompts * a.prompt_blocks as u64;
    let events = prompts * a.prompt_blocks.div_ceil(a.blocks_per_event) as u64;
    Ok(IndexerReport {
        flavor: a.flavor,
        instances: a.instances,
        blocks,
        events,
        messages: prompts,
        payload_bytes,
        block_size: a.block_size,
        prompt_blocks: a.prompt_blocks,
        send_seconds,
        applied_seconds,
        applied_events_per_sec: events as f64 / applied_seconds,
        applied_blocks_per_sec: blocks as f64 / applied_seconds,
        applied_polls: polls,
        query: Latency::from_samples(&mut samples),
        wrong_answers: wrong,
        rss_before,
        rss_after,
        rss_peak: a.pid.and_then(hwm_bytes),
        rss_bytes_per_membership: match (rss_before, rss_after) {
            (Some(b), Some(e)) => Some((e as f64 - b as f64) / blocks as f64),
            _ => None,
        },
        kvplane_gaps_replays_waits,
        loadavg: [load_start, loadavg()],
    })
}

/// How often a probe nobody saw is sent again.
const PROBE_RESEND: Duration = Duration::from_secs(5);
/// The words of [`until_seen`]'s timeout error.
const NOT_SHOWN: &str = "did not show its prompt";

/// Polls `/query` with `body` until instance `i` matches `full` tokens.
#[allow(clippy::too_many_arguments)]
async fn until_seen(
    conn: &mut Conn,
    api: &Api,
    path: &str,
    body: &[u8],
    i: usize,
    full: u64,
    timeout: Duration,
    polls: &mut u64,
) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let (status, reply) = conn.request("POST", path, Some(body), timeout).await?;
        *polls += 1;
        // Dynamo answers 404 until the model's first block arrives.
        if status == 200 && api.longest(&reply, i) == full {
            return Ok(());
        }
        if status != 200 && status != 404 {
            return Err(format!(
                "query: HTTP {status} {}",
                String::from_utf8_lossy(&reply)
            ));
        }
        if start.elapsed() > timeout {
            return Err(format!(
                "instance {} {NOT_SHOWN} within {timeout:?}: {}",
                api.name(i),
                String::from_utf8_lossy(&reply)
            ));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

impl IndexerReport {
    /// A readable summary, one line per measure.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "indexer    {:?}: {} blocks over {} instances ({} events, {} messages, {:.1} MiB), block size {}",
            self.flavor, self.blocks, self.instances, self.events, self.messages,
            self.payload_bytes as f64 / 1048576.0, self.block_size
        );
        let _ = writeln!(
            out,
            "ingest     {:>10.0} events/s applied  ({:.0} blocks/s; sent in {:.3} s, applied in {:.3} s, {} polls)",
            self.applied_events_per_sec, self.applied_blocks_per_sec, self.send_seconds,
            self.applied_seconds, self.applied_polls
        );
        let _ = writeln!(
            out,
            "query      p50 {:.1} µs  p99 {:.1} µs  p999 {:.1} µs  ({} queries of {} blocks, {} wrong)",
            self.query.p50_us, self.query.p99_us, self.query.p999_us, self.query.count,
            self.prompt_blocks, self.wrong_answers
        );
        let mib = |b: Option<u64>| {
            b.map_or("-".to_owned(), |b| {
                format!("{:.1} MiB", b as f64 / 1048576.0)
            })
        };
        if self.rss_before.is_some() {
            let _ = writeln!(
                out,
                "rss        before {}  after {}  peak {}  → {:.1} B per membership",
                mib(self.rss_before),
                mib(self.rss_after),
                mib(self.rss_peak),
                self.rss_bytes_per_membership.unwrap_or(f64::NAN)
            );
        }
        if let Some([g, r, d]) = self.kvplane_gaps_replays_waits {
            let _ = writeln!(
                out,
                "streams    {g} gaps, {r} replays, {d} queue-full waits"
            );
        }
        let _ = writeln!(
            out,
            "loadavg    {:?} → {:?}",
            self.loadavg[0], self.loadavg[1]
        );
        out
    }
}
