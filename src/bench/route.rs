//! `kvplane bench route` (issue 23): replays a Mooncake-format trace at its timestamps, sped
//! up, against N simulated engines (child processes, [`super::sim_engine`]), once per
//! policy on fresh engines: round-robin, least-loaded, the approximate router and the oracle
//! ([`super::route_policy`], applied by this client), `kvplane router` (a child process in
//! front of the engines, fed by their KV events) and `vllm-router` (when its binary runs).
//! Reports per policy the hit ratio (ratio of sums), TTFT percentiles and throughput in
//! simulated time, and kvplane's predicted against delivered cached tokens. `--overhead`
//! measures the router's decision instead ([`super::route_overhead`]).

use super::route_policy::{Local, Shared};
use super::route_trace::{self, TraceRequest};
use super::sim_engine::{words, EngineModel, SimAddrs};
use super::sim_pool::block_hashes;
use crate::router::model::score::Weights;
use axum::body::Body;
use http_body_util::BodyExt;
use serde::Serialize;
use serde_json::Value;
use std::fmt::Write as _;
use std::io::BufRead as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Flags of `kvplane bench route`.
#[derive(Debug, Clone, clap::Args)]
pub struct RouteBenchArgs {
    /// The Mooncake-format trace (JSON lines).
    #[arg(long, default_value = "benches/traces/mooncake_synthetic_trace.jsonl")]
    pub trace: PathBuf,
    /// Replay only the first N requests (0: all).
    #[arg(long, default_value_t = 0)]
    pub requests: usize,
    /// Simulated engines.
    #[arg(long, default_value_t = 8)]
    pub engines: usize,
    /// The trace's clock and every engine cost run this many times faster than wall time.
    #[arg(long, default_value_t = 20.0)]
    pub speedup: f64,
    /// Policies, in order: round-robin, least-loaded, approx, oracle, kvplane, vllm-router.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "round-robin,least-loaded,approx,oracle,kvplane,vllm-router"
    )]
    pub policies: Vec<String>,
    /// The `vllm-router` executable (`pip install vllm-router`); the policy is skipped, with
    /// the reason, when it does not start.
    #[arg(long, default_value = "target/vllm-router/venv/bin/vllm-router")]
    pub vllm_router: PathBuf,
    /// The engines' KV pool and costs (their block size is the router's too).
    #[command(flatten)]
    pub model: EngineModel,
    /// The score's overlap weight (kvplane router, approx, oracle).
    #[arg(long, default_value_t = 1.0)]
    pub overlap_weight: f64,
    /// The score's load weight.
    #[arg(long, default_value_t = 1.0)]
    pub load_weight: f64,
    /// The score's load scale.
    #[arg(long, default_value_t = 8.0)]
    pub load_scale: f64,
    /// How long the approximate router trusts a block it routed, simulated seconds (Dynamo's
    /// default: 120).
    #[arg(long, default_value_t = 120.0)]
    pub approx_ttl: f64,
    /// Measure the router's per-request decision instead of replaying the trace.
    #[arg(long)]
    pub overhead: bool,
    /// `--overhead`: decisions per second.
    #[arg(long, default_value_t = 5000.0)]
    pub overhead_rate: f64,
    /// `--overhead`: decisions measured.
    #[arg(long, default_value_t = 20_000)]
    pub overhead_requests: usize,
    /// `--overhead`: prompt tokens per decision (the trace's prompts cut to this).
    #[arg(long, default_value_t = 2048)]
    pub overhead_prompt_tokens: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// What one policy did.
#[derive(Debug, Default, Serialize)]
pub struct PolicyReport {
    /// Its name.
    pub policy: String,
    /// Why it did not run, when it did not.
    pub skipped: Option<String>,
    /// Requests sent.
    pub requests: u64,
    /// Answered with usage.
    pub answered: u64,
    /// Prompt tokens, summed over answers.
    pub prompt_tokens: u64,
    /// Cached tokens the engines reported, summed.
    pub cached_tokens: u64,
    /// `cached_tokens / prompt_tokens`.
    pub hit_ratio: f64,
    /// Time to first token, simulated seconds.
    pub ttft_p50_s: f64,
    /// 90th percentile.
    pub ttft_p90_s: f64,
    /// 99th percentile.
    pub ttft_p99_s: f64,
    /// Whole request, median, simulated seconds.
    pub e2e_p50_s: f64,
    /// First send to last answer, simulated seconds.
    pub makespan_s: f64,
    /// Answered requests per simulated second.
    pub requests_per_s: f64,
    /// Prompt tokens per simulated second.
    pub prompt_tokens_per_s: f64,
    /// kvplane router: its `/router/stats` overall totals.
    pub router_stats: Option<Value>,
}

/// The whole run.
#[derive(Debug, Default, Serialize)]
pub struct RouteReport {
    /// Trace requests replayed.
    pub requests: usize,
    /// What one never-evicting cache could reuse (the ceiling of any hit ratio).
    pub reusable_ratio: f64,
    /// Engines.
    pub engines: usize,
    /// Speed-up.
    pub speedup: f64,
    /// Per policy, in order.
    pub policies: Vec<PolicyReport>,
}

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A simulated engine child.
struct Engine {
    _proc: Proc,
    addrs: SimAddrs,
}

fn exe() -> Result<PathBuf, String> {
    std::env::current_exe().map_err(|e| format!("own executable: {e}"))
}

async fn spawn_engine(args: &RouteBenchArgs, i: usize) -> Result<Engine, String> {
    let mut cmd = Command::new(exe()?);
    cmd.args(["bench", "sim-engine", "--name", &format!("sim-{i}")])
        .args(["--block-size", &args.model.block_size.to_string()])
        .args(["--capacity-tokens", &args.model.capacity_tokens.to_string()])
        .args([
            "--prefill-us-per-token",
            &args.model.prefill_us_per_token.to_string(),
        ])
        .args(["--prefill-base-ms", &args.model.prefill_base_ms.to_string()])
        .args([
            "--decode-ms-per-token",
            &args.model.decode_ms_per_token.to_string(),
        ])
        .args(["--max-batch", &args.model.max_batch.to_string()])
        .args(["--speedup", &args.speedup.to_string()])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("start a simulated engine: {e}"))?;
    let stdout = child.stdout.take().ok_or("engine stdout")?;
    let proc = Proc(child);
    let line = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            std::io::BufReader::new(stdout)
                .read_line(&mut line)
                .map(|_| line)
        }),
    )
    .await
    .map_err(|_| "a simulated engine did not start within 30 s".to_owned())?
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())?;
    let addrs: SimAddrs = serde_json::from_str(line.trim())
        .map_err(|e| format!("simulated engine said {line:?}: {e}"))?;
    Ok(Engine { _proc: proc, addrs })
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// Waits until `GET url` answers 200 (at most `limit`).
async fn wait_ok(client: &Client, url: &str, limit: Duration) -> Result<(), String> {
    let until = Instant::now() + limit;
    loop {
        if let Ok(req) = hyper::Request::get(url).body(Body::empty()) {
            if let Ok(Ok(r)) =
                tokio::time::timeout(Duration::from_secs(2), client.request(req)).await
            {
                if r.status().is_success() {
                    return Ok(());
                }
            }
        }
        if Instant::now() > until {
            return Err(format!("{url} did not answer 200 within {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

type Client = crate::router::upstream::HttpClient;

async fn get_json(client: &Client, url: &str) -> Result<Value, String> {
    let req = hyper::Request::get(url).body(Body::empty());
    send_json(client, req).await
}

async fn post_json(client: &Client, url: String, body: Vec<u8>) -> Result<Value, String> {
    let req = hyper::Request::post(&url)
        .header("content-type", "application/json")
        .body(Body::from(body));
    send_json(client, req).await
}

/// Sends `req` (once built) and reads the reply's body as JSON.
async fn send_json(
    client: &Client,
    req: hyper::http::Result<hyper::Request<Body>>,
) -> Result<Value, String> {
    let req = req.map_err(|e| e.to_string())?;
    let resp = client.request(req).await.map_err(|e| e.to_string())?;
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    serde_json::from_slice(&body.to_bytes()).map_err(|e| e.to_string())
}

/// Where requests go during one policy's run.
enum Target {
    Local(Local, Arc<Shared>),
    /// A router process at this base URL; text prompts when true.
    Router(String, bool),
}

/// One answered request.
#[derive(Debug, Default)]
struct Done {
    ttft: Option<Duration>,
    e2e: Duration,
    prompt: u64,
    cached: u64,
    usage: bool,
}

/// Sends one streamed completion and reads it to its end.
async fn send(client: &Client, url: &str, body: Vec<u8>) -> Result<Done, String> {
    let start = Instant::now();
    let req = hyper::Request::post(url)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(600), client.request(req))
        .await
        .map_err(|_| "no answer within 600 s".to_owned())?
        .map_err(|e| format!("send: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("HTTP {}", resp.status()));
    }
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    let mut done = Done::default();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("body: {e}"))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while let Some(at) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..at + 2).collect();
            let Some(json) = event.strip_prefix(b"data: ") else {
                continue;
            };
            let json = &json[..json.len() - 2];
            if json == b"[DONE]" {
                continue;
            }
            let v: Value = serde_json::from_slice(json).map_err(|e| format!("event: {e}"))?;
            let has_choice = v["choices"].as_array().is_some_and(|c| !c.is_empty());
            if has_choice && done.ttft.is_none() {
                done.ttft = Some(start.elapsed());
            }
            if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                done.prompt = u["prompt_tokens"].as_u64().unwrap_or(0);
                done.cached = u["prompt_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .unwrap_or(0);
                done.usage = true;
            }
        }
    }
    done.e2e = start.elapsed();
    Ok(done)
}

fn request_body(tokens: &[u32], r: &TraceRequest, text: bool) -> Vec<u8> {
    let prompt = if text {
        Value::String(words(tokens))
    } else {
        Value::from(tokens.to_vec())
    };
    let v = serde_json::json!({
        "model": "sim", "prompt": prompt, "max_tokens": r.output_length.max(1),
        "stream": true, "stream_options": {"include_usage": true},
    });
    serde_json::to_vec(&v).unwrap_or_default()
}

/// Replays `trace` through `target`; returns the answers and the wall makespan.
async fn replay(
    args: &RouteBenchArgs,
    trace: &[TraceRequest],
    engines: &[Engine],
    target: Target,
    client: &Client,
) -> (Vec<Result<Done, String>>, Duration) {
    let target = Arc::new(target);
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(trace.len());
    let urls: Arc<Vec<String>> = Arc::new(engines.iter().map(|e| e.addrs.http.clone()).collect());
    for r in trace {
        let at = Duration::from_secs_f64(r.timestamp as f64 / 1e3 / args.speedup);
        let (r, target, client, urls) = (
            r.clone(),
            Arc::clone(&target),
            client.clone(),
            Arc::clone(&urls),
        );
        let bs = args.model.block_size;
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until((start + at).into()).await;
            let tokens = route_trace::request_tokens(&r);
            match &*target {
                Target::Router(base, text) => {
                    let body = request_body(&tokens, &r, *text);
                    send(&client, &format!("{base}/v1/completions"), body).await
                }
                Target::Local(policy, shared) => {
                    let hashes = block_hashes(&tokens, bs);
                    let pick = match policy {
                        Local::RoundRobin => shared.round_robin(),
                        Local::LeastLoaded => shared.least_loaded(),
                        Local::Approx => shared.approx(&hashes, tokens.len(), r.timestamp),
                        Local::Oracle => {
                            let q = serde_json::to_vec(&serde_json::json!({"hashes": hashes}))
                                .unwrap_or_default();
                            let asks = urls
                                .iter()
                                .map(|u| post_json(&client, format!("{u}/sim/match"), q.clone()));
                            let mut blocks = Vec::with_capacity(urls.len());
                            for a in futures_util::future::join_all(asks).await {
                                blocks.push(a?["blocks"].as_u64().unwrap_or(0) as usize);
                            }
                            shared.best(&blocks, tokens.len())
                        }
                    };
                    shared.in_flight[pick].fetch_add(1, Ordering::Relaxed);
                    let body = request_body(&tokens, &r, false);
                    let out = send(&client, &format!("{}/v1/completions", urls[pick]), body).await;
                    shared.in_flight[pick].fetch_sub(1, Ordering::Relaxed);
                    out
                }
            }
        }));
    }
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.unwrap_or_else(|e| Err(format!("task: {e}"))));
    }
    (out, start.elapsed())
}

/// Nearest-rank percentile of sorted `v`.
fn pct(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let rank = (q * v.len() as f64 - 1e-9).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

fn summarize(
    policy: &str,
    speedup: f64,
    answers: &[Result<Done, String>],
    makespan: Duration,
) -> PolicyReport {
    let mut rep = PolicyReport {
        policy: policy.into(),
        requests: answers.len() as u64,
        ..PolicyReport::default()
    };
    let mut ttft = Vec::new();
    let mut e2e = Vec::new();
    let mut first_error = None;
    for a in answers {
        match a {
            Ok(d) if d.usage => {
                rep.answered += 1;
                rep.prompt_tokens += d.prompt;
                rep.cached_tokens += d.cached;
                ttft.extend(d.ttft.map(|t| t.as_secs_f64() * speedup));
                e2e.push(d.e2e.as_secs_f64() * speedup);
            }
            Ok(_) => {
                first_error.get_or_insert_with(|| "an answer without usage".to_owned());
            }
            Err(e) => {
                first_error.get_or_insert_with(|| e.clone());
            }
        }
    }
    if let Some(e) = first_error {
        tracing::warn!(
            policy,
            "{} requests failed; first: {e}",
            rep.requests - rep.answered
        );
    }
    ttft.sort_by(f64::total_cmp);
    e2e.sort_by(f64::total_cmp);
    rep.hit_ratio = rep.cached_tokens as f64 / rep.prompt_tokens.max(1) as f64;
    rep.ttft_p50_s = pct(&ttft, 0.5);
    rep.ttft_p90_s = pct(&ttft, 0.9);
    rep.ttft_p99_s = pct(&ttft, 0.99);
    rep.e2e_p50_s = pct(&e2e, 0.5);
    rep.makespan_s = makespan.as_secs_f64() * speedup;
    rep.requests_per_s = rep.answered as f64 / rep.makespan_s.max(1e-9);
    rep.prompt_tokens_per_s = rep.prompt_tokens as f64 / rep.makespan_s.max(1e-9);
    rep
}

/// Runs one policy on fresh engines.
async fn run_policy(
    args: &RouteBenchArgs,
    trace: &[TraceRequest],
    policy: &str,
    client: &Client,
) -> Result<PolicyReport, String> {
    let mut engines = Vec::with_capacity(args.engines);
    for i in 0..args.engines {
        engines.push(spawn_engine(args, i).await?);
    }
    let weights = Weights {
        overlap: args.overlap_weight,
        load: args.load_weight,
        load_scale: args.load_scale,
        ..Weights::default()
    };
    let shared = || {
        Arc::new(Shared::new(
            args.engines,
            weights,
            (args.approx_ttl * 1e3) as u64,
            args.model.block_size,
        ))
    };
    let mut router: Option<(Proc, String)> = None;
    let target = match policy {
        "round-robin" => Target::Local(Local::RoundRobin, shared()),
        "least-loaded" => Target::Local(Local::LeastLoaded, shared()),
        "approx" => Target::Local(Local::Approx, shared()),
        "oracle" => Target::Local(Local::Oracle, shared()),
        "kvplane" => {
            let port = free_port()?;
            let mut cmd = Command::new(exe()?);
            cmd.args(["router", "--host", "127.0.0.1", "--port", &port.to_string()])
                .args(["--model", "sim", "--indexer-port", "0"])
                .args(["--block-size", &args.model.block_size.to_string()])
                .args(["--overlap-weight", &args.overlap_weight.to_string()])
                .args(["--load-weight", &args.load_weight.to_string()])
                .args(["--load-scale", &args.load_scale.to_string()])
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit());
            for (i, e) in engines.iter().enumerate() {
                cmd.arg("--engine").arg(format!(
                    "{},instance=sim-{i},events={},replay={}",
                    e.addrs.http, e.addrs.events, e.addrs.replay
                ));
            }
            let proc = Proc(
                cmd.spawn()
                    .map_err(|e| format!("start kvplane router: {e}"))?,
            );
            let base = format!("http://127.0.0.1:{port}");
            wait_ok(client, &format!("{base}/health"), Duration::from_secs(30)).await?;
            // Let the in-process index's subscribers connect before the first event.
            tokio::time::sleep(Duration::from_secs(1)).await;
            router = Some((proc, base.clone()));
            Target::Router(base, false)
        }
        "vllm-router" => {
            let port = free_port()?;
            let mut cmd = Command::new(&args.vllm_router);
            cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .args(["--policy", "cache_aware", "--log-level", "warning"])
                .arg("--worker-urls")
                .args(engines.iter().map(|e| e.addrs.http.clone()))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let proc = match cmd.spawn() {
                Ok(c) => Proc(c),
                Err(e) => {
                    return Ok(PolicyReport {
                        policy: policy.into(),
                        skipped: Some(format!("{}: {e}", args.vllm_router.display())),
                        ..PolicyReport::default()
                    })
                }
            };
            let base = format!("http://127.0.0.1:{port}");
            if let Err(e) =
                wait_ok(client, &format!("{base}/health"), Duration::from_secs(60)).await
            {
                return Ok(PolicyReport {
                    policy: policy.into(),
                    skipped: Some(e),
                    ..PolicyReport::default()
                });
            }
            router = Some((proc, base.clone()));
            Target::Router(base, true)
        }
        other => return Err(format!("--policies: unknown policy {other:?}")),
    };
    let (answers, makespan) = replay(args, trace, &engines, target, client).await;
    let mut rep = summarize(policy, args.speedup, &answers, makespan);
    if let (Some((_, base)), "kvplane") = (&router, policy) {
        rep.router_stats = get_json(client, &format!("{base}/router/stats")).await.ok();
    }
    drop(router);
    drop(engines);
    Ok(rep)
}

/// Runs every policy in turn.
///
/// # Errors
/// An unreadable trace, a bad flag, an engine or the kvplane router that does not start.
pub async fn run(args: &RouteBenchArgs) -> Result<RouteReport, String> {
    if args.engines == 0 || args.speedup <= 0.0 || args.model.block_size == 0 {
        return Err("--engines, --speedup and --block-size must be positive".into());
    }
    let text = std::fs::read_to_string(&args.trace)
        .map_err(|e| format!("--trace {}: {e}", args.trace.display()))?;
    let mut trace = route_trace::parse(&text).map_err(|e| e.to_string())?;
    if args.requests > 0 {
        trace.truncate(args.requests);
    }
    let client = crate::router::upstream::client(Duration::from_secs(5));
    let mut report = RouteReport {
        requests: trace.len(),
        reusable_ratio: route_trace::reuse(&trace).ratio(),
        engines: args.engines,
        speedup: args.speedup,
        policies: Vec::new(),
    };
    for p in &args.policies {
        tracing::info!(policy = %p, "replaying {} requests", trace.len());
        report
            .policies
            .push(run_policy(args, &trace, p, &client).await?);
    }
    Ok(report)
}

/// kvplane's predicted and delivered cached tokens from `/router/stats`.
pub fn predicted_delivered(stats: &Value) -> Option<(u64, u64)> {
    let o = &stats["overall"];
    Some((o["predicted"].as_u64()?, o["delivered"].as_u64()?))
}

impl RouteReport {
    /// One line per policy.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} requests, {} engines, speed-up {}, reusable at best {:.1} %",
            self.requests,
            self.engines,
            self.speedup,
            self.reusable_ratio * 100.0
        );
        let _ = writeln!(
            out,
            "{:<13} {:>8} {:>7} {:>9} {:>9} {:>9} {:>8} {:>9}  predicted/delivered",
            "policy", "answered", "hit %", "TTFT p50", "p90", "p99", "req/s", "ktok/s"
        );
        for p in &self.policies {
            if let Some(why) = &p.skipped {
                let _ = writeln!(out, "{:<13} skipped: {why}", p.policy);
                continue;
            }
            let pd = p
                .router_stats
                .as_ref()
                .and_then(predicted_delivered)
                .map_or(String::new(), |(pr, de)| {
                    format!(
                        "  {pr} / {de} ({:+.2} %)",
                        (de as f64 / pr.max(1) as f64 - 1.0) * 100.0
                    )
                });
            let _ = writeln!(
                out,
                "{:<13} {:>8} {:>7.1} {:>8.2}s {:>8.2}s {:>8.2}s {:>8.2} {:>9.1}{pd}",
                p.policy,
                format!("{}/{}", p.answered, p.requests),
                p.hit_ratio * 100.0,
                p.ttft_p50_s,
                p.ttft_p90_s,
                p.ttft_p99_s,
                p.requests_per_s,
                p.prompt_tokens_per_s / 1e3
            );
        }
        out
    }
}
