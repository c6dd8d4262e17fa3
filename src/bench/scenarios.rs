//! The four measurements: applied ingest rate, P2P lookup latency, full-sync time, heartbeat
//! latency. Each returns a serialisable result; none asserts on time.

use super::fleet::{self, SimWorker, LOCATION, REQUEST_TIMEOUT};
use super::http;
use super::stats::Latency;
use super::BenchArgs;
use crate::protocol::{
    decode, encode, BatchedP2PLookupMsg, ChunkHash, FullSyncBatchMsg, FullSyncEndMsg,
    FullSyncStartMsg, FullSyncStatusMsg, Msg,
};
use crate::transport::{DealerClient, PushSender};
use bytes::Bytes;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

/// Applied-ingest result.
#[derive(Debug, Serialize)]
pub struct Ingest {
    /// Simulated workers.
    pub workers: usize,
    /// Ops per batch.
    pub batch: usize,
    /// Ops sent.
    pub ops: u64,
    /// Seconds until the last send returned.
    pub send_seconds: f64,
    /// Seconds until `/controller/key-stats` showed every op applied.
    pub applied_seconds: f64,
    /// `ops / applied_seconds`.
    pub applied_ops_per_sec: f64,
    /// Keys the run left on the controller.
    pub net_keys: u64,
}

pub(super) async fn wait_for_keys(
    args: &BenchArgs,
    target: u64,
    start: Instant,
) -> Result<f64, String> {
    let limit = Duration::from_secs_f64(args.timeout);
    loop {
        // A controller busy applying may answer its HTTP API late (LMCache's single asyncio
        // loop can take over 10 s under ingest): keep asking until the scenario's limit.
        let left = limit
            .saturating_sub(start.elapsed())
            .max(Duration::from_secs(1));
        let now = http::total_keys(&args.http, left).await?;
        if now >= target {
            return Ok(start.elapsed().as_secs_f64());
        }
        if start.elapsed() > limit {
            return Err(format!(
                "only {now} of {target} keys applied after {limit:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Pushes pre-encoded streams from one PUSH socket per worker. Every socket first connects
/// and delivers its empty warm-up batch; only then does the clock start, so connection set-up
/// is not counted as ingest. Returns the start instant and the seconds until the last send.
pub(super) async fn push_streams(
    pull: &str,
    streams: Vec<fleet::OpStream>,
) -> Result<(Instant, f64), String> {
    let barrier = Arc::new(Barrier::new(streams.len() + 1));
    let mut tasks = JoinSet::new();
    for stream in streams {
        let pull = pull.to_owned();
        let barrier = Arc::clone(&barrier);
        tasks.spawn(async move {
            let mut push = PushSender::new(pull);
            let warm = push.send(vec![stream.warmup], REQUEST_TIMEOUT).await;
            barrier.wait().await;
            warm.map_err(|e| format!("push (warm-up): {e}"))?;
            for frames in stream.sends {
                push.send(frames, REQUEST_TIMEOUT)
                    .await
                    .map_err(|e| format!("push: {e}"))?;
            }
            Ok::<(), String>(())
        });
    }
    barrier.wait().await;
    let start = Instant::now();
    while let Some(r) = tasks.join_next().await {
        r.map_err(|e| format!("sender task: {e}"))??;
    }
    Ok((start, start.elapsed().as_secs_f64()))
}

/// Registers `workers` and pushes `ops` ops in batches; measures until applied.
///
/// # Errors
/// A message naming what failed.
pub(super) async fn ingest(args: &BenchArgs, run: u64) -> Result<Ingest, String> {
    let workers = SimWorker::many(&format!("bench-{run:x}-ingest"), args.workers);
    fleet::register_all(&args.reply, &workers).await?;
    let batches_total = (args.ops as usize).div_ceil(args.batch).max(1);
    let per_worker = batches_total.div_ceil(workers.len()).max(1);
    let evicts = (args.batch as f64 * args.evict_ratio).round() as usize;
    let streams = fleet::streams(
        run,
        &workers,
        per_worker,
        args.batch,
        evicts,
        args.frames_per_send,
    );
    let ops: u64 = streams.iter().map(|s| s.ops).sum();
    let net_keys: u64 = streams.iter().map(|s| s.net_keys).sum();
    let baseline = http::total_keys(&args.http, Duration::from_secs(30)).await?;
    let (start, send_seconds) = push_streams(&args.pull, streams).await?;
    let applied_seconds = wait_for_keys(args, baseline + net_keys, start).await?;
    if !args.keep {
        fleet::deregister_all(&args.pull, &args.http, &workers).await;
    }
    Ok(Ingest {
        workers: workers.len(),
        batch: args.batch,
        ops,
        send_seconds,
        applied_seconds,
        applied_ops_per_sec: ops as f64 / applied_seconds,
        net_keys,
    })
}

/// P2P lookup result.
#[derive(Debug, Serialize)]
pub struct Lookup {
    /// Keys indexed for the run (prefix chains of `hashes` hashes).
    pub indexed_keys: u64,
    /// Hashes per request.
    pub hashes: usize,
    /// Concurrent requesters.
    pub concurrency: usize,
    /// Round-trip latency.
    pub latency: Latency,
    /// Requests per second over the run.
    pub requests_per_sec: f64,
    /// Replies whose hit count was not the full chain (should be 0).
    pub wrong_answers: u64,
}

/// Indexes `lookup_keys` keys as prefix chains on `workers` holders, then times lookups of
/// whole chains from another instance.
///
/// # Errors
/// A message naming what failed.
pub(super) async fn lookup(args: &BenchArgs, run: u64) -> Result<Lookup, String> {
    let holders = SimWorker::many(&format!("bench-{run:x}-holder"), args.workers);
    fleet::register_all(&args.reply, &holders).await?;
    let hashes = args.lookup_hashes.max(1);
    let chains_per_holder = (args.lookup_keys as usize / hashes / holders.len()).max(1);
    // Each chain is one batch of `hashes` admits: chain c of holder h = keys h, c*H..(c+1)*H.
    let streams = fleet::streams(
        run,
        &holders,
        chains_per_holder,
        hashes,
        0,
        args.frames_per_send,
    );
    let indexed: u64 = streams.iter().map(|s| s.net_keys).sum();
    let baseline = http::total_keys(&args.http, Duration::from_secs(30)).await?;
    let (start, _) = push_streams(&args.pull, streams).await?;
    wait_for_keys(args, baseline + indexed, start).await?;

    let per_task = (args.lookup_requests / args.concurrency.max(1)).max(1);
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for t in 0..args.concurrency.max(1) {
        let reply = args.reply.clone();
        let n_holders = holders.len();
        tasks.spawn(async move {
            let mut dealer = DealerClient::new(reply, REQUEST_TIMEOUT);
            let mut samples = Vec::with_capacity(per_task);
            let mut wrong = 0u64;
            // Pre-encode every request so the client measures the controller, not itself.
            let requests: Vec<Bytes> = (0..per_task)
                .map(|i| {
                    let pick = super::stats::mix(run ^ (t as u64) << 32 ^ i as u64);
                    let holder = (pick as usize) % n_holders;
                    let chain = ((pick >> 20) as usize) % chains_per_holder;
                    let keys: Vec<ChunkHash> = (0..hashes)
                        .map(|j| fleet::key(run, holder, (chain * hashes + j) as u64))
                        .collect();
                    Bytes::from(encode(&Msg::BatchedP2PLookupMsg(BatchedP2PLookupMsg {
                        hashes: keys,
                        instance_id: format!("bench-{run:x}-asker"),
                        worker_id: 0,
                    })))
                })
                .collect();
            for request in requests {
                let sent = Instant::now();
                let answer = dealer
                    .request(request)
                    .await
                    .map_err(|e| format!("lookup: {e}"))?;
                samples.push(sent.elapsed());
                match decode(&answer) {
                    Ok(Msg::BatchedP2PLookupRetMsg(r))
                        if r.layout_info.first().is_some_and(|l| l.2 == hashes as i64) => {}
                    _ => wrong += 1,
                }
            }
            Ok::<_, String>((samples, wrong))
        });
    }
    let mut samples = Vec::new();
    let mut wrong_answers = 0;
    while let Some(r) = tasks.join_next().await {
        let (s, w) = r.map_err(|e| format!("lookup task: {e}"))??;
        samples.extend(s);
        wrong_answers += w;
    }
    let elapsed = start.elapsed().as_secs_f64();
    if !args.keep {
        fleet::deregister_all(&args.pull, &args.http, &holders).await;
    }
    Ok(Lookup {
        indexed_keys: indexed,
        hashes,
        concurrency: args.concurrency,
        requests_per_sec: samples.len() as f64 / elapsed,
        latency: Latency::from_samples(&mut samples),
        wrong_answers,
    })
}

/// Full-sync result.
#[derive(Debug, Serialize)]
pub struct FullSync {
    /// Keys synced.
    pub keys: u64,
    /// Batches (2,000 keys each, LMCache's default).
    pub batches: u64,
    /// Seconds from `FullSyncStartMsg` until the status says complete.
    pub seconds: f64,
}

/// One worker full-syncs `sync_keys` keys the way LMCache's `FullSyncSender` does (minus its
/// pacing): start, batches over PUSH, end, status polling.
///
/// # Errors
/// A message naming what failed.
pub(super) async fn full_sync(args: &BenchArgs, run: u64) -> Result<FullSync, String> {
    const BATCH: usize = 2000;
    let worker = SimWorker::many(&format!("bench-{run:x}-sync"), 1).remove(0);
    fleet::register_all(&args.reply, std::slice::from_ref(&worker)).await?;
    let keys = args.sync_keys;
    let batch_count = (keys as usize).div_ceil(BATCH).max(1);
    let sync_id = format!("{}_0_{run:08x}", worker.instance_id);
    let frames: Vec<Bytes> = (0..batch_count)
        .map(|b| {
            let lo = (b * BATCH) as u64;
            let hi = ((b + 1) * BATCH).min(keys as usize) as u64;
            Bytes::from(encode(&Msg::FullSyncBatchMsg(FullSyncBatchMsg {
                instance_id: worker.instance_id.clone(),
                worker_id: 0,
                location: LOCATION.into(),
                sync_id: sync_id.clone(),
                batch_id: b as i64,
                keys: (lo..hi).map(|i| fleet::key(run, usize::MAX, i)).collect(),
            })))
        })
        .collect();
    let end = Bytes::from(encode(&Msg::FullSyncEndMsg(FullSyncEndMsg {
        instance_id: worker.instance_id.clone(),
        worker_id: 0,
        location: LOCATION.into(),
        sync_id: sync_id.clone(),
        actual_total_keys: keys as i64,
    })));
    let mut dealer = DealerClient::new(args.reply.clone(), REQUEST_TIMEOUT);
    let mut push = PushSender::new(args.pull.clone());
    let start_msg = Bytes::from(encode(&Msg::FullSyncStartMsg(FullSyncStartMsg {
        instance_id: worker.instance_id.clone(),
        worker_id: 0,
        location: LOCATION.into(),
        sync_id: sync_id.clone(),
        total_keys: keys as i64,
        batch_count: batch_count as i64,
    })));
    let status_msg = Bytes::from(encode(&Msg::FullSyncStatusMsg(FullSyncStatusMsg {
        instance_id: worker.instance_id.clone(),
        worker_id: 0,
        sync_id: sync_id.clone(),
    })));
    let started = Instant::now();
    match decode(
        &dealer
            .request(start_msg)
            .await
            .map_err(|e| format!("sync start: {e}"))?,
    ) {
        Ok(Msg::FullSyncStartRetMsg(r)) if r.accepted => {}
        other => return Err(format!("sync start refused: {other:?}")),
    }
    for chunk in frames.chunks(args.frames_per_send.max(1)) {
        push.send(chunk.to_vec(), REQUEST_TIMEOUT)
            .await
            .map_err(|e| format!("sync push: {e}"))?;
    }
    push.send(vec![end], REQUEST_TIMEOUT)
        .await
        .map_err(|e| format!("sync end: {e}"))?;
    let limit = Duration::from_secs_f64(args.timeout);
    loop {
        let answer = dealer
            .request(status_msg.clone())
            .await
            .map_err(|e| format!("sync status: {e}"))?;
        if let Ok(Msg::FullSyncStatusRetMsg(s)) = decode(&answer) {
            if s.is_complete {
                break;
            }
        }
        if started.elapsed() > limit {
            return Err(format!("full sync not complete after {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    if !args.keep {
        fleet::deregister_all(&args.pull, &args.http, std::slice::from_ref(&worker)).await;
    }
    Ok(FullSync {
        keys,
        batches: batch_count as u64,
        seconds,
    })
}

/// Heartbeat result.
#[derive(Debug, Serialize)]
pub struct Heartbeat {
    /// Workers heartbeating.
    pub workers: usize,
    /// Seconds each worker heartbeats (one beat per second, phases spread).
    pub seconds: f64,
    /// Round-trip latency of every beat.
    pub latency: Latency,
}

/// `heartbeat_workers` workers each send one `HeartbeatMsg` per second on the heartbeat socket.
///
/// # Errors
/// A message naming what failed.
pub(super) async fn heartbeat(args: &BenchArgs, run: u64) -> Result<Heartbeat, String> {
    let workers = SimWorker::many(&format!("bench-{run:x}-hb"), args.heartbeat_workers);
    let url = fleet::register_all(&args.reply, &workers).await?;
    let endpoint = args
        .heartbeat
        .clone()
        .or(url)
        .ok_or("the controller has no heartbeat socket (no heartbeat_url); pass --heartbeat")?;
    let beats = args.heartbeat_seconds.max(1.0) as usize;
    let n = workers.len();
    let mut tasks = JoinSet::new();
    for (i, w) in workers.iter().enumerate() {
        let endpoint = endpoint.clone();
        let msg = w.heartbeat_frame();
        tasks.spawn(async move {
            let mut dealer = DealerClient::new(endpoint, REQUEST_TIMEOUT);
            // Spread the phases over the first second.
            tokio::time::sleep(Duration::from_secs_f64(i as f64 / n as f64)).await;
            let mut ticker = tokio::time::interval(Duration::from_secs(1));
            let mut samples = Vec::with_capacity(beats);
            for _ in 0..beats {
                ticker.tick().await;
                let sent = Instant::now();
                dealer
                    .request(msg.clone())
                    .await
                    .map_err(|e| format!("heartbeat: {e}"))?;
                samples.push(sent.elapsed());
            }
            Ok::<_, String>(samples)
        });
    }
    let mut samples = Vec::new();
    while let Some(r) = tasks.join_next().await {
        samples.extend(r.map_err(|e| format!("heartbeat task: {e}"))??);
    }
    if !args.keep {
        fleet::deregister_all(&args.pull, &args.http, &workers).await;
    }
    Ok(Heartbeat {
        workers: n,
        seconds: beats as f64,
        latency: Latency::from_samples(&mut samples),
    })
}
