//! `kvplane bench route --overhead`: the router's own cost per request, outside any HTTP:
//! parse the body, take its tokens, query the in-process index, score, reserve. The router's
//! core runs in process ([`crate::router::start`]) with its index fed real vLLM events from
//! simulated publishers (the trace's first prompts, spread over the engines); decisions are
//! then paced at `--overhead-rate`, each timed from its scheduled start, so a backlog counts.

use super::route::RouteBenchArgs;
use super::route_trace;
use super::sim_engine::{start_publisher, EngineModel, SimEngineArgs};
use super::sim_pool::{admission_batch, block_hashes, Pool};
use super::stats::Latency;
use crate::router::state::RequestKind;
use crate::router::{EngineSpec, RouterConfig};
use serde::Serialize;
use std::time::{Duration, Instant};

/// What `--overhead` measured.
#[derive(Debug, Serialize)]
pub struct Overhead {
    /// Offered decisions per second.
    pub rate: f64,
    /// Achieved decisions per second.
    pub achieved_rate: f64,
    /// Prompt tokens per decision (the trace's prompts cut to this).
    pub prompt_tokens: usize,
    /// Prompts indexed before measuring.
    pub indexed_prompts: usize,
    /// From the scheduled start to the reservation.
    pub latency: Latency,
    /// Decisions whose prediction was non-zero (the index was hit).
    pub predicted_hits: usize,
}

/// Runs it.
///
/// # Errors
/// The trace, a bind, or an index that does not fill within 60 s.
pub async fn run(args: &RouteBenchArgs, prompt_tokens: usize) -> Result<Overhead, String> {
    let text = std::fs::read_to_string(&args.trace)
        .map_err(|e| format!("--trace {}: {e}", args.trace.display()))?;
    let trace = route_trace::parse(&text).map_err(|e| e.to_string())?;
    let prompts: Vec<Vec<u32>> = trace
        .iter()
        .map(|r| {
            let mut t = route_trace::request_tokens(r);
            t.truncate(prompt_tokens.max(1));
            t
        })
        .collect();
    let bs = args.model.block_size;
    let mut engines = Vec::new();
    let mut feeds = Vec::new();
    for i in 0..args.engines {
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        let sim = SimEngineArgs {
            host: "127.0.0.1".into(),
            name: format!("sim-{i}"),
            model: EngineModel {
                block_size: bs,
                capacity_tokens: args.model.capacity_tokens,
                prefill_us_per_token: 0.0,
                prefill_base_ms: 0.0,
                decode_ms_per_token: 0.0,
                max_batch: 1,
            },
            speedup: 1.0,
            replay_ring: 16_384,
        };
        let (events, replay) = start_publisher(&sim, rx).await?;
        // Never contacted: decisions only.
        let spec: EngineSpec =
            format!("http://127.0.0.1:9,instance=sim-{i},events={events},replay={replay}")
                .parse()?;
        engines.push(spec);
        feeds.push((tx, Pool::new(args.model.capacity_tokens / bs)));
    }
    let mut config = RouterConfig::new("sim", engines);
    config.block_size = bs as u32;
    config.health_interval = Duration::from_secs(86_400);
    config.weights.overlap = args.overlap_weight;
    config.weights.load = args.load_weight;
    config.weights.load_scale = args.load_scale;
    let router = crate::router::start(config)
        .await
        .map_err(|e| format!("start the router core: {e}"))?;
    let st = std::sync::Arc::clone(&router.state);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Index the first prompts, engine by engine in turn.
    let indexed = prompts.len().min(1000);
    for (i, t) in prompts.iter().take(indexed).enumerate() {
        let (tx, pool) = &mut feeds[i % args.engines];
        let hashes = block_hashes(t, bs);
        let a = pool.admit(&hashes);
        if let Some(batch) = admission_batch(&a, &hashes, t, bs, 0.0) {
            tx.send(batch).await.map_err(|e| e.to_string())?;
        }
    }
    let last = &prompts[indexed - 1];
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, d) = st.query(Some(last), "", "");
        if d.predicted.iter().any(|&p| p > 0) {
            break;
        }
        if Instant::now() > until {
            return Err("the index did not take the events within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let bodies: Vec<Vec<u8>> = prompts
        .iter()
        .map(|t| {
            serde_json::to_vec(&serde_json::json!({"model": "sim", "prompt": t, "max_tokens": 1}))
                .unwrap_or_default()
        })
        .collect();
    let (n, rate) = (args.overhead_requests, args.overhead_rate.max(1.0));
    let handle = tokio::runtime::Handle::current();
    let (mut samples, hits, elapsed) = tokio::task::spawn_blocking(move || {
        let mut samples = Vec::with_capacity(n);
        let mut hits = 0;
        let start = Instant::now();
        for i in 0..n {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            while Instant::now() < due {
                std::hint::spin_loop();
            }
            let body = &bodies[i % bodies.len()];
            let map: serde_json::Map<String, serde_json::Value> =
                serde_json::from_slice(body).unwrap_or_default();
            let tokens = handle.block_on(st.tokens(RequestKind::Completion, &map));
            let (matched, d) = st.query(tokens.as_deref(), "", "");
            let prompt = tokens.as_ref().map_or(0, |t| t.len() as u64);
            let routed = handle.block_on(st.route(&d, &matched, prompt, 0.0, &[], None));
            samples.push(due.elapsed());
            if let Ok((e, reservation)) = routed {
                hits += usize::from(d.predicted[e] > 0);
                drop(reservation);
            }
        }
        (samples, hits, start.elapsed())
    })
    .await
    .map_err(|e| e.to_string())?;
    router.stop().await;
    Ok(Overhead {
        rate,
        achieved_rate: n as f64 / elapsed.as_secs_f64(),
        prompt_tokens,
        indexed_prompts: indexed,
        latency: Latency::from_samples(&mut samples),
        predicted_hits: hits,
    })
}

impl Overhead {
    /// One line.
    pub fn summary(&self) -> String {
        format!(
            "router decision (parse, tokens, index query, score, reserve) at {:.0}/s offered, {:.0}/s achieved, {}-token prompts, {} prompts indexed: p50 {:.1} µs  p99 {:.1} µs  p999 {:.1} µs  max {:.1} µs  ({} of {} decisions predicted a hit)\n",
            self.rate, self.achieved_rate, self.prompt_tokens, self.indexed_prompts,
            self.latency.p50_us, self.latency.p99_us, self.latency.p999_us, self.latency.max_us,
            self.predicted_hits, self.latency.count
        )
    }
}
