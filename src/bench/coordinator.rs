//! `kvplane bench coordinator`: the fleet coordinator scenario, against any LMCache 0.5.6
//! compatible MP coordinator (kvplane's or `python -m lmcache.v1.mp_coordinator`).
//!
//! `--servers` simulated MP servers register (`POST /instances`), each on its own keep-alive
//! connection, and heartbeat once a second (`PUT /instances/{id}/heartbeat`, phases spread over
//! the second). Phase 1 measures heartbeats alone; phase 2 measures them again while
//! `--senders` of those servers post store events as fast as the coordinator answers, for the
//! phase's seconds or exactly `--event-batches` batches each (`POST /events`, the 0.5.6
//! `CacheEventsRequest` form both coordinators accept, one batch of `--batch` entries per
//! request, each a new key of `--key-bytes`, spread over `--salts` tenants; with `--token-ids
//! N` each entry carries N token ids and its `token_offset`, as a real MP server's store
//! batches do: private `fs` L2 placements of many instances). The event rate counts only
//! **applied** events: the clock stops when `GET /quota/{salt}` shows the usage of every key
//! sent. Every call is bounded; a non-2xx answer fails the run.

use super::conn::Conn;
use super::http::split_base;
use super::stats::{mix, rss_bytes, Latency};
use clap::Args;
use serde::Serialize;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Flags of `kvplane bench coordinator`.
#[derive(Debug, Clone, Args)]
pub struct CoordinatorBenchArgs {
    /// Base URL of the coordinator.
    #[arg(
        long,
        env = "KVPLANE_BENCH_COORDINATOR_URL",
        default_value = "http://127.0.0.1:9300"
    )]
    pub url: String,
    /// Simulated MP servers (one connection each), heartbeating once a second.
    #[arg(long, env = "KVPLANE_BENCH_SERVERS", default_value_t = 1000)]
    pub servers: usize,
    /// Seconds of each phase (heartbeats alone; heartbeats with events).
    #[arg(long, env = "KVPLANE_BENCH_SECONDS", default_value_t = 10.0)]
    pub seconds: f64,
    /// Entries per event batch (one batch per request).
    #[arg(long, env = "KVPLANE_BENCH_EVENT_BATCH", default_value_t = 100)]
    pub batch: usize,
    /// Servers posting events back to back (closed loop), each on its own connection.
    #[arg(long, env = "KVPLANE_BENCH_SENDERS", default_value_t = 4)]
    pub senders: usize,
    /// Batches each sender posts in phase 2, however long that takes (default: as many as
    /// fit in `--seconds`). A fixed workload, for instruction counts (scripts/bench-callgrind.sh).
    #[arg(long, env = "KVPLANE_BENCH_EVENT_BATCHES")]
    pub event_batches: Option<u64>,
    /// Tenants (`cache_salt`s) the event keys are spread over, each with a large quota.
    #[arg(long, env = "KVPLANE_BENCH_SALTS", default_value_t = 1)]
    pub salts: usize,
    /// Token ids per stored entry (`token_ids`, with `token_offset`), as a real MP server sends
    /// them: its chunk size (0: none, the smallest body).
    #[arg(long, env = "KVPLANE_BENCH_TOKEN_IDS", default_value_t = 0)]
    pub token_ids: usize,
    /// `size_bytes` of every stored key.
    #[arg(long, env = "KVPLANE_BENCH_KEY_BYTES", default_value_t = 65536)]
    pub key_bytes: u64,
    /// Pid of the coordinator, to report its RSS.
    #[arg(long, env = "KVPLANE_BENCH_PID")]
    pub pid: Option<u32>,
    /// Seconds any single request, and the final applied check, may take.
    #[arg(long, env = "KVPLANE_BENCH_TIMEOUT", default_value_t = 120.0)]
    pub timeout: f64,
    /// Print the report as JSON instead of the summary.
    #[arg(long, env = "KVPLANE_BENCH_JSON")]
    pub json: bool,
}

/// RSS of the coordinator (bytes), when `--pid` is given.
#[derive(Debug, Default, Serialize)]
pub struct CoordinatorRss {
    /// Before the run.
    pub start: Option<u64>,
    /// After every server registered.
    pub registered: Option<u64>,
    /// After the events were applied.
    pub end: Option<u64>,
    /// Peak (VmHWM) at the end.
    pub peak: Option<u64>,
}

/// What the coordinator scenario measured.
#[derive(Debug, Default, Serialize)]
pub struct CoordinatorReport {
    /// Simulated servers.
    pub servers: usize,
    /// Seconds to register them all, one after another.
    pub register_seconds: f64,
    /// Token ids per stored entry.
    pub token_ids: usize,
    /// (RSS at end − RSS after registration) / events applied: what a tracked key costs the
    /// process, everything it grew by included.
    pub bytes_per_key: Option<f64>,
    /// Seconds per phase.
    pub seconds: f64,
    /// Heartbeat round trips with no event load.
    pub heartbeat_idle: Latency,
    /// Heartbeat round trips while events were posted at full speed.
    pub heartbeat_loaded: Latency,
    /// Events (keys stored) posted.
    pub events: u64,
    /// Entries per batch.
    pub batch: usize,
    /// Concurrent event senders.
    pub senders: usize,
    /// Seconds until the last event answer.
    pub send_seconds: f64,
    /// Seconds until `GET /quota/{salt}` showed every event's bytes.
    pub applied_seconds: f64,
    /// `events / applied_seconds`.
    pub events_per_sec: f64,
    /// Event request round trips.
    pub event_request: Latency,
    /// Coordinator RSS.
    pub rss: CoordinatorRss,
}

/// Peak resident set (VmHWM) of a process in bytes (Linux).
pub fn peak_rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Runs the scenario.
///
/// # Errors
/// A message naming the phase and what failed.
pub async fn run(args: &CoordinatorBenchArgs) -> Result<CoordinatorReport, String> {
    if args.servers == 0
        || args.batch == 0
        || args.senders == 0
        || args.senders > args.servers
        || args.event_batches == Some(0)
    {
        return Err(
            "--servers, --batch, --senders and --event-batches must be ≥ 1, and --senders ≤ --servers"
                .into(),
        );
    }
    if args.token_ids > 1 << 16 {
        return Err("--token-ids must be at most 65536".into());
    }
    // One connection per simulated server: 10,000 servers need ~10,000 descriptors here.
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) if limit < args.servers as u64 + 64 => {
            return Err(format!(
                "--servers {} needs ~{} open files; the limit is {limit} (ulimit -Hn)",
                args.servers,
                args.servers + 64
            ))
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("could not raise the open-file limit: {e}"),
    }
    if !(1..=1000).contains(&args.salts) {
        return Err("--salts must be between 1 and 1000".into());
    }
    if !(args.seconds.is_finite() && args.seconds > 0.0) {
        return Err("--seconds must be a positive number".into());
    }
    let (authority, prefix) = split_base(&args.url)?;
    let timeout = Duration::from_secs_f64(args.timeout.max(1.0));
    let run: u64 = rand::random::<u64>() >> 16;
    let rss = || args.pid.and_then(rss_bytes);
    let mut report = CoordinatorReport {
        servers: args.servers,
        seconds: args.seconds,
        batch: args.batch,
        senders: args.senders,
        token_ids: args.token_ids,
        ..CoordinatorReport::default()
    };
    report.rss.start = rss();
    let ids: Vec<String> = (0..args.servers)
        .map(|i| format!("bench-{run:x}-{i}"))
        .collect();
    let salts: Vec<String> = (0..args.salts)
        .map(|k| {
            if args.salts == 1 {
                format!("bench-{run:x}")
            } else {
                format!("bench-{run:x}-t{k}")
            }
        })
        .collect();

    // Register every server on its own connection.
    let registering = Instant::now();
    let mut conns = Vec::with_capacity(args.servers);
    for id in &ids {
        let mut c = Conn::connect(&authority, timeout).await?;
        let body = format!(r#"{{"instance_id":"{id}","ip":"127.0.0.1","http_port":9}}"#);
        let (status, reply) = c
            .request(
                "POST",
                &format!("{prefix}/instances"),
                Some(body.as_bytes()),
                timeout,
            )
            .await?;
        if status != 200 {
            return Err(format!(
                "register {id}: HTTP {status} {}",
                String::from_utf8_lossy(&reply)
            ));
        }
        conns.push(c);
    }
    report.register_seconds = registering.elapsed().as_secs_f64();
    report.rss.registered = rss();
    let mut admin = Conn::connect(&authority, timeout).await?;
    let quota_paths: Vec<String> = salts
        .iter()
        .map(|salt| format!("{prefix}/quota/{salt}"))
        .collect();
    for quota_path in &quota_paths {
        let (status, reply) = admin
            .request(
                "PUT",
                quota_path,
                Some(br#"{"limit_gb": 1000000.0}"#),
                timeout,
            )
            .await?;
        if status != 200 {
            return Err(format!(
                "PUT {quota_path}: HTTP {status} {}",
                String::from_utf8_lossy(&reply)
            ));
        }
    }

    // Phase 1: heartbeats alone.
    let period = Duration::from_secs(1);
    let beats = args.seconds.ceil().max(1.0) as usize;
    let (conns, mut idle) = heartbeats(conns, &ids, &prefix, beats, period, timeout).await?;
    report.heartbeat_idle = Latency::from_samples(&mut idle);

    // Phase 2: heartbeats while the senders post events back to back.
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut senders = Vec::new();
    for (s, id) in ids.iter().take(args.senders).enumerate() {
        let c = Conn::connect(&authority, timeout).await?;
        senders.push(tokio::spawn(send_events(
            c,
            EventStream {
                path: format!("{prefix}/events"),
                instance: id.clone(),
                incarnation: run,
                salts: salts.clone(),
                batch: args.batch,
                key_bytes: args.key_bytes,
                token_ids: args.token_ids,
                seed: mix(run ^ ((s as u64) << 48)),
                limit: args.event_batches,
            },
            stop.clone(),
            timeout,
        )));
    }
    let stopper = {
        let stop = stop.clone();
        let seconds = args.seconds;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
            stop.store(true, Ordering::Relaxed);
        })
    };
    let (_, mut loaded) = heartbeats(conns, &ids, &prefix, beats, period, timeout).await?;
    report.heartbeat_loaded = Latency::from_samples(&mut loaded);
    stopper.await.map_err(|e| format!("stopper: {e}"))?;
    let mut request_samples = Vec::new();
    for s in senders {
        let (events, mut samples) = s.await.map_err(|e| format!("sender task: {e}"))??;
        report.events += events;
        request_samples.append(&mut samples);
    }
    report.send_seconds = start.elapsed().as_secs_f64();
    report.event_request = Latency::from_samples(&mut request_samples);

    // Applied: the usage of every key sent.
    let want = report.events * args.key_bytes;
    let deadline = Instant::now() + timeout;
    loop {
        let mut usage = 0u64;
        for quota_path in &quota_paths {
            let (status, reply) = admin.request("GET", quota_path, None, timeout).await?;
            let v: serde_json::Value = serde_json::from_slice(&reply)
                .map_err(|e| format!("GET {quota_path}: HTTP {status}, body not JSON: {e}"))?;
            let usage_gb = v["usage_gb"].as_f64().unwrap_or(0.0);
            usage += (usage_gb * f64::from(1u32 << 30)).round() as u64;
        }
        if usage == want {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "applied: usage shows {usage} bytes of {want} after {timeout:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    report.applied_seconds = start.elapsed().as_secs_f64();
    report.events_per_sec = report.events as f64 / report.applied_seconds;
    report.rss.end = rss();
    report.rss.peak = args.pid.and_then(peak_rss_bytes);
    if let (Some(end), Some(registered)) = (report.rss.end, report.rss.registered) {
        if report.events > 0 {
            report.bytes_per_key =
                Some(end.saturating_sub(registered) as f64 / report.events as f64);
        }
    }

    // Leave the coordinator as found (usage stays tracked until the keys are deleted).
    for id in &ids {
        admin
            .request("DELETE", &format!("{prefix}/instances/{id}"), None, timeout)
            .await?;
    }
    for quota_path in &quota_paths {
        admin.request("DELETE", quota_path, None, timeout).await?;
    }
    Ok(report)
}

/// Every server heartbeats `beats` times, `period` apart, phases spread evenly.
async fn heartbeats(
    conns: Vec<Conn>,
    ids: &[String],
    prefix: &str,
    beats: usize,
    period: Duration,
    timeout: Duration,
) -> Result<(Vec<Conn>, Vec<Duration>), String> {
    let n = conns.len() as u32;
    let t0 = tokio::time::Instant::now() + Duration::from_millis(50);
    let mut tasks = Vec::with_capacity(conns.len());
    for (i, (mut c, id)) in conns.into_iter().zip(ids).enumerate() {
        let path = format!("{prefix}/instances/{id}/heartbeat");
        let first = t0 + period * (i as u32) / n;
        tasks.push(tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(first, period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut samples = Vec::with_capacity(beats);
            for _ in 0..beats {
                ticks.tick().await;
                let sent = Instant::now();
                let (status, _) = c.request("PUT", &path, None, timeout).await?;
                samples.push(sent.elapsed());
                if status != 200 {
                    return Err(format!("PUT {path}: HTTP {status}"));
                }
            }
            Ok::<_, String>((c, samples))
        }));
    }
    let mut conns = Vec::with_capacity(tasks.len());
    let mut samples = Vec::new();
    for t in tasks {
        let (c, mut s) = t.await.map_err(|e| format!("heartbeat task: {e}"))??;
        conns.push(c);
        samples.append(&mut s);
    }
    Ok((conns, samples))
}

/// One sender's event stream.
struct EventStream {
    path: String,
    instance: String,
    incarnation: u64,
    salts: Vec<String>,
    batch: usize,
    key_bytes: u64,
    token_ids: usize,
    seed: u64,
    /// Batches to post whatever `stop` says (`--event-batches`).
    limit: Option<u64>,
}

impl EventStream {
    /// The `CacheEventsRequest` body of batch `seq` (new keys every batch).
    fn body(&self, seq: u64, out: &mut String) {
        out.clear();
        let _ = write!(
            out,
            r#"{{"batches":[{{"instance_id":"{}","incarnation":{},"seq":{seq},"event_type":"store","tier":"l2","backend":"fs","entries":["#,
            self.instance, self.incarnation
        );
        for j in 0..self.batch as u64 {
            if j > 0 {
                out.push(',');
            }
            let hash = mix(self.seed ^ (seq << 20) ^ j);
            let salt = &self.salts[(hash % self.salts.len() as u64) as usize];
            let _ = write!(
                out,
                r#"{{"key":{{"chunk_hash_hex":"{hash:016x}","model_name":"bench","kv_rank":0,"object_group_id":0,"cache_salt":"{salt}"}},"size_bytes":{}"#,
                self.key_bytes
            );
            if self.token_ids > 0 {
                // The chunk's tokens: ids below 151,936 (a Qwen-size vocabulary), and the
                // chunk's offset in its prompt.
                out.push_str(r#","token_ids":["#);
                for t in 0..self.token_ids as u64 {
                    if t > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{}", mix(hash ^ t) % 151_936);
                }
                let _ = write!(
                    out,
                    r#"],"token_offset":{}"#,
                    (seq % 64) * self.token_ids as u64
                );
            }
            out.push('}');
        }
        out.push_str("]}]}");
    }
}

/// Posts batches back to back until `stop`, or exactly `stream.limit` batches when set;
/// returns the events sent and the round trips.
async fn send_events(
    mut conn: Conn,
    stream: EventStream,
    stop: Arc<AtomicBool>,
    timeout: Duration,
) -> Result<(u64, Vec<Duration>), String> {
    let mut body = String::with_capacity(stream.batch * (160 + 8 * stream.token_ids) + 256);
    let mut samples = Vec::new();
    let mut seq = 0u64;
    loop {
        let done = match stream.limit {
            Some(limit) => seq >= limit,
            None => stop.load(Ordering::Relaxed),
        };
        if done {
            break;
        }
        seq += 1;
        stream.body(seq, &mut body);
        let sent = Instant::now();
        let (status, reply) = conn
            .request("POST", &stream.path, Some(body.as_bytes()), timeout)
            .await?;
        samples.push(sent.elapsed());
        if status != 200 {
            return Err(format!(
                "POST {}: HTTP {status} {}",
                stream.path,
                String::from_utf8_lossy(&reply)
            ));
        }
    }
    Ok((seq * stream.batch as u64, samples))
}

impl CoordinatorReport {
    /// A readable summary, one line per measure.
    pub fn summary(&self) -> String {
        let mib = |b: Option<u64>| {
            b.map_or("-".to_owned(), |b| {
                format!("{:.1} MiB", b as f64 / 1048576.0)
            })
        };
        let mut out = String::new();
        let _ = writeln!(
            out,
            "events        {:>10.0} events/s applied  ({} events, {} senders, batch {}, {} token ids each, sent in {:.3} s, applied in {:.3} s; request p50 {:.0} µs p99 {:.0} µs)",
            self.events_per_sec, self.events, self.senders, self.batch, self.token_ids,
            self.send_seconds, self.applied_seconds, self.event_request.p50_us,
            self.event_request.p99_us
        );
        let _ = writeln!(
            out,
            "register      {} servers in {:.3} s (one keep-alive connection each)",
            self.servers, self.register_seconds
        );
        for (name, l) in [
            ("heartbeat idle", &self.heartbeat_idle),
            ("heartbeat load", &self.heartbeat_loaded),
        ] {
            let _ = writeln!(
                out,
                "{name}  p50 {:.0} µs  p99 {:.0} µs  max {:.0} µs  ({} beats, {} servers × {:.0} s)",
                l.p50_us, l.p99_us, l.max_us, l.count, self.servers, self.seconds
            );
        }
        if self.rss.start.is_some() {
            let _ = writeln!(
                out,
                "rss           start {}  registered {}  end {}  peak {}",
                mib(self.rss.start),
                mib(self.rss.registered),
                mib(self.rss.end),
                mib(self.rss.peak)
            );
            if let Some(b) = self.bytes_per_key {
                let _ = writeln!(out, "memory        {b:.0} B per tracked key");
            }
        }
        out
    }
}
