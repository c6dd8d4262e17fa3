//! A simulated fleet of LMCache workers built on `kvplane::worker`: N instances × M workers
//! (TP ranks) serving requests whose prompts share system prompts and conversation history,
//! so their prefix-chained chunk hashes overlap across instances.
//!
//! Per request (routed to a random instance): the serving ranks look up the part of the
//! prefix they do not hold with a P2P lookup, then store every missing chunk (admit) and
//! evict least-recently-used chunks past their capacity. Workers heartbeat; now and then one
//! leaves (deregisters) and rejoins a few seconds later with an empty cache. Commands from
//! the controller (`/clear`, `/pin`, `/health` in its HTTP API or dashboard) are obeyed.
//!
//! ```sh
//! cargo run --release -- serve --port 9000      # kvplane (or LMCache's controller)
//! cargo run --release --example worker_sim -- \
//!     --pull 127.0.0.1:8300 --reply 127.0.0.1:8400 --instances 4 --workers 2 --seconds 120
//! # then open http://127.0.0.1:9000/
//! ```

use clap::Parser;
use kvplane::protocol::{ChunkHash, ClearWorkerMsg, PinWorkerMsg};
use kvplane::worker::{
    CommandHandler, CommandResult, MemoryKeys, Worker, WorkerConfig, WorkerHandle, WorkerState,
    WorkerStatus, LOCAL_CPU_BACKEND,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// LMCache's default chunk size, used to turn chunks into token counts for commands.
const TOKENS_PER_CHUNK: i64 = 256;

/// A simulated fleet of LMCache workers driving a controller.
#[derive(Debug, Parser)]
#[command(name = "worker_sim", about)]
struct Args {
    /// The controller's PULL socket.
    #[arg(long, default_value = "127.0.0.1:8300")]
    pull: String,
    /// The controller's reply (ROUTER) socket.
    #[arg(long, default_value = "127.0.0.1:8400")]
    reply: String,
    /// Instances (vLLM engines).
    #[arg(long, default_value_t = 4)]
    instances: usize,
    /// Workers (TP ranks) per instance.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// How long to run; 0 runs until Ctrl-C.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Requests per second over the whole fleet.
    #[arg(long, default_value_t = 50.0)]
    ops_per_sec: f64,
    /// Seed of the workload.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Distinct system prompts shared by requests.
    #[arg(long, default_value_t = 8)]
    system_prompts: usize,
    /// Chunks each worker holds before evicting (LRU).
    #[arg(long, default_value_t = 2000)]
    capacity: usize,
    /// Heartbeat period in seconds (0 = no heartbeats).
    #[arg(long, default_value_t = 5.0)]
    heartbeat_secs: f64,
    /// Mean seconds between a worker leaving (0 = never).
    #[arg(long, default_value_t = 30.0)]
    churn_secs: f64,
    /// Seconds between summary lines.
    #[arg(long, default_value_t = 5.0)]
    report_secs: f64,
    /// Prefix of the instance ids.
    #[arg(long, default_value = "sim")]
    prefix: String,
    /// Host put in the fake P2P URLs (`host:port`) the workers advertise.
    #[arg(long, default_value = "127.0.0.1")]
    peer_host: String,
    /// First port of the fake P2P URLs.
    #[arg(long, default_value_t = 20000)]
    peer_base_port: u16,
}

/// What the fleet did.
#[derive(Debug, Default)]
struct Totals {
    requests: AtomicU64,
    admits: AtomicU64,
    evicts: AtomicU64,
    lookups: AtomicU64,
    hits: AtomicU64,
    hit_chunks: AtomicU64,
    lookup_errors: AtomicU64,
    queue_full: AtomicU64,
    departures: AtomicU64,
    rejoins: AtomicU64,
    commands: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// Least-recently-used set of chunk hashes.
#[derive(Debug, Default)]
struct Lru {
    tick: u64,
    by_hash: HashMap<u64, u64>,
    by_tick: BTreeMap<u64, u64>,
}

impl Lru {
    /// Marks `hash` used; returns whether it was held.
    fn touch(&mut self, hash: u64) -> bool {
        self.tick += 1;
        match self.by_hash.insert(hash, self.tick) {
            Some(old) => {
                self.by_tick.remove(&old);
                self.by_tick.insert(self.tick, hash);
                true
            }
            None => {
                self.by_tick.insert(self.tick, hash);
                false
            }
        }
    }

    fn contains(&self, hash: u64) -> bool {
        self.by_hash.contains_key(&hash)
    }

    fn pop_oldest(&mut self) -> Option<u64> {
        let (_, hash) = self.by_tick.pop_first()?;
        self.by_hash.remove(&hash);
        Some(hash)
    }

    fn len(&self) -> usize {
        self.by_hash.len()
    }

    fn drain(&mut self) -> Vec<u64> {
        self.by_tick.clear();
        self.by_hash.drain().map(|(h, _)| h).collect()
    }
}

/// One simulated rank: its cache model, its key source, its worker.
struct Rank {
    name: String,
    lru: Mutex<Lru>,
    keys: MemoryKeys,
    handle: OnceLock<WorkerHandle>,
    totals: Arc<Totals>,
}

impl Rank {
    fn handle(&self) -> Option<&WorkerHandle> {
        self.handle.get()
    }

    /// Stores the request's chain: touch held chunks, admit missing ones, evict past capacity.
    fn store(&self, chain: &[u64], capacity: usize) {
        let Some(handle) = self.handle() else { return };
        let mut lru = self.lru.lock().expect("lru");
        let (mut admits, mut evicts) = (0, 0);
        for &h in chain {
            if !lru.touch(h) {
                self.keys.admit(LOCAL_CPU_BACKEND, h);
                self.report(handle.admit(LOCAL_CPU_BACKEND, h));
                admits += 1;
            }
        }
        while lru.len() > capacity {
            let Some(old) = lru.pop_oldest() else { break };
            self.keys.evict(LOCAL_CPU_BACKEND, old);
            self.report(handle.evict(LOCAL_CPU_BACKEND, old));
            evicts += 1;
        }
        bump(&self.totals.admits, admits);
        bump(&self.totals.evicts, evicts);
    }

    fn report(&self, result: Result<(), kvplane::worker::WorkerError>) {
        if result.is_err() {
            bump(&self.totals.queue_full, 1);
        }
    }

    /// Leading chunks of `chain` held here.
    fn local_prefix(&self, chain: &[u64]) -> usize {
        let lru = self.lru.lock().expect("lru");
        chain.iter().take_while(|h| lru.contains(**h)).count()
    }
}

/// Obeys the controller's commands on the rank's cache model.
struct SimHandler(Arc<Rank>);

impl CommandHandler for SimHandler {
    async fn clear(&self, req: ClearWorkerMsg) -> CommandResult<i64> {
        bump(&self.0.totals.commands, 1);
        if req.location != LOCAL_CPU_BACKEND {
            return Ok(0);
        }
        let dropped = self.0.lru.lock().expect("lru").drain();
        for &h in &dropped {
            self.0.keys.evict(LOCAL_CPU_BACKEND, h);
            if let Some(handle) = self.0.handle() {
                self.0.report(handle.evict(LOCAL_CPU_BACKEND, h));
            }
        }
        bump(&self.0.totals.evicts, dropped.len() as u64);
        println!(
            "  {}: cleared {} chunks on command",
            self.0.name,
            dropped.len()
        );
        Ok(i64::try_from(dropped.len()).unwrap_or(i64::MAX) * TOKENS_PER_CHUNK)
    }

    async fn pin(&self, req: PinWorkerMsg) -> CommandResult<i64> {
        bump(&self.0.totals.commands, 1);
        Ok(i64::try_from(req.tokens.len()).unwrap_or(i64::MAX))
    }
}

/// splitmix64 of `a` combined with `b`: a stand-in for LMCache's chained chunk hash.
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Prefix-chained hashes of a sequence of chunk contents.
fn chain(chunks: &[u64]) -> Vec<u64> {
    let mut h = 0xcbf2_9ce4_8422_2325;
    chunks
        .iter()
        .map(|&c| {
            h = mix(h, c);
            h
        })
        .collect()
}

/// Requests: a system prompt plus user turns; some continue an earlier conversation.
struct Workload {
    rng: StdRng,
    system: Vec<Vec<u64>>,
    recent: VecDeque<Vec<u64>>,
}

impl Workload {
    fn new(seed: u64, prompts: usize) -> Self {
        let system = (0..prompts.max(1) as u64)
            .map(|k| (0..2 + k % 5).map(|j| (k << 32) | j).collect())
            .collect();
        Workload {
            rng: StdRng::seed_from_u64(seed),
            system,
            recent: VecDeque::new(),
        }
    }

    /// The chunk contents of the next request.
    fn next(&mut self) -> Vec<u64> {
        let mut chunks = if !self.recent.is_empty() && self.rng.random_bool(0.3) {
            let i = self.rng.random_range(0..self.recent.len());
            self.recent[i].clone()
        } else {
            let k = self.rng.random_range(0..self.system.len());
            self.system[k].clone()
        };
        for _ in 0..self.rng.random_range(1..=8) {
            chunks.push(self.rng.random());
        }
        chunks.truncate(64);
        self.recent.push_back(chunks.clone());
        if self.recent.len() > 64 {
            self.recent.pop_front();
        }
        chunks
    }
}

struct Fleet {
    args: Args,
    totals: Arc<Totals>,
    /// `ranks[instance][rank]`, `None` while that worker is away.
    ranks: Vec<Vec<Option<Arc<Rank>>>>,
    /// Statuses of workers that left, for the totals.
    retired: Vec<WorkerStatus>,
}

impl Fleet {
    fn instance_id(&self, instance: usize) -> String {
        format!("{}-{instance}", self.args.prefix)
    }

    fn config(&self, instance: usize, rank: usize) -> WorkerConfig {
        let a = &self.args;
        let mut c = WorkerConfig::new(
            self.instance_id(instance),
            i64::try_from(rank).unwrap_or(0),
            a.pull.clone(),
            a.reply.clone(),
        );
        let port = usize::from(a.peer_base_port) + instance * a.workers + rank;
        c.peer_init_url = Some(format!("{}:{}", a.peer_host, port.min(65535)));
        c.heartbeat_interval =
            (a.heartbeat_secs > 0.0).then(|| Duration::from_secs_f64(a.heartbeat_secs));
        c.heartbeat_delay = Duration::from_secs(1);
        c.full_sync.startup_delay = Duration::from_secs(1);
        c.full_sync.poll_interval = Duration::from_secs(1);
        c
    }

    async fn start_rank(&self, instance: usize, rank: usize) -> Result<Arc<Rank>, String> {
        let r = Arc::new(Rank {
            name: format!("{}/rank{rank}", self.instance_id(instance)),
            lru: Mutex::new(Lru::default()),
            keys: MemoryKeys::new(),
            handle: OnceLock::new(),
            totals: Arc::clone(&self.totals),
        });
        let handle = Worker::start(
            self.config(instance, rank),
            SimHandler(Arc::clone(&r)),
            r.keys.clone(),
        )
        .await
        .map_err(|e| format!("{}: {e}", r.name))?;
        let _ = r.handle.set(handle);
        Ok(r)
    }

    fn up(&self) -> impl Iterator<Item = (usize, usize, &Arc<Rank>)> {
        self.ranks.iter().enumerate().flat_map(|(i, ranks)| {
            ranks
                .iter()
                .enumerate()
                .filter_map(move |(r, rank)| rank.as_ref().map(|rank| (i, r, rank)))
        })
    }

    fn statuses(&self) -> Vec<WorkerStatus> {
        self.up()
            .filter_map(|(_, _, r)| r.handle().map(WorkerHandle::status))
            .collect()
    }

    fn summary(&self, elapsed: Duration, requests_before: u64, since: Duration) -> String {
        let t = &self.totals;
        let statuses = self.statuses();
        let ready = statuses
            .iter()
            .filter(|s| s.state == WorkerState::Ready)
            .count();
        let all = statuses.iter().chain(&self.retired);
        let syncs: u64 = all.clone().map(|s| s.full_syncs_completed).sum();
        let sent: u64 = all.map(|s| s.ops_sent).sum();
        let requests = get(&t.requests);
        let rate = (requests - requests_before) as f64 / since.as_secs_f64().max(1e-3);
        let lookups = get(&t.lookups);
        let hits = get(&t.hits);
        format!(
            "[{:>6.1}s] workers {}/{} ready | requests {requests} ({rate:.0}/s) | admits {} evicts {} (sent {sent}) | \
             lookups {lookups} hits {hits} ({:.0}%) chunks {} | left {} rejoined {} | full syncs {syncs} | errors {}",
            elapsed.as_secs_f64(),
            ready,
            self.args.instances * self.args.workers,
            get(&t.admits),
            get(&t.evicts),
            100.0 * hits as f64 / lookups.max(1) as f64,
            get(&t.hit_chunks),
            get(&t.departures),
            get(&t.rejoins),
            get(&t.lookup_errors) + get(&t.queue_full),
        )
    }
}

/// Serves one request on `instance`.
fn serve(fleet: &Fleet, instance: usize, chunks: &[u64], rng: &mut StdRng) {
    let hashes = chain(chunks);
    let ranks: Vec<&Arc<Rank>> = fleet.ranks[instance].iter().flatten().collect();
    let Some(asker) = ranks.get(rng.random_range(0..ranks.len().max(1))) else {
        return;
    };
    bump(&fleet.totals.requests, 1);
    let local = asker.local_prefix(&hashes);
    if local < hashes.len() {
        if let Some(handle) = asker.handle().cloned() {
            let rest: Vec<ChunkHash> = hashes[local..]
                .iter()
                .map(|&h| ChunkHash::from(h))
                .collect();
            let totals = Arc::clone(&fleet.totals);
            tokio::spawn(async move {
                bump(&totals.lookups, 1);
                match handle.p2p_lookup(&rest).await {
                    Ok(Some(hit)) => {
                        bump(&totals.hits, 1);
                        bump(&totals.hit_chunks, hit.num_hit_chunks as u64);
                    }
                    Ok(None) => {}
                    Err(_) => bump(&totals.lookup_errors, 1),
                }
            });
        }
    }
    for rank in ranks {
        rank.store(&hashes, fleet.args.capacity);
    }
}

async fn shutdown_rank(rank: Arc<Rank>) -> Option<WorkerStatus> {
    let handle = rank.handle()?.clone();
    let observer = handle.clone();
    if let Err(e) = handle.shutdown().await {
        eprintln!("  {}: shutdown: {e}", rank.name);
    }
    Some(observer.status())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = Args::parse();
    if args.instances == 0 || args.workers == 0 || args.ops_per_sec <= 0.0 {
        return Err("--instances, --workers and --ops-per-sec must be positive".into());
    }
    println!(
        "worker_sim: {} instances x {} workers -> pull {} reply {}, {} req/s, {} system prompts, capacity {} chunks/worker, seed {}",
        args.instances, args.workers, args.pull, args.reply, args.ops_per_sec,
        args.system_prompts, args.capacity, args.seed
    );
    let mut fleet = Fleet {
        totals: Arc::new(Totals::default()),
        ranks: Vec::new(),
        retired: Vec::new(),
        args,
    };
    for i in 0..fleet.args.instances {
        let mut ranks = Vec::new();
        for r in 0..fleet.args.workers {
            ranks.push(Some(fleet.start_rank(i, r).await?));
        }
        fleet.ranks.push(ranks);
    }
    let started = Instant::now();
    let mut waiting_printed = false;
    loop {
        let statuses = fleet.statuses();
        if statuses.iter().all(|s| s.state == WorkerState::Ready) {
            break;
        }
        if !waiting_printed && started.elapsed() > Duration::from_secs(2) {
            println!("waiting for the controller (workers retry registration with backoff)…");
            waiting_printed = true;
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    println!(
        "all {} workers registered in {:.1?}",
        fleet.args.instances * fleet.args.workers,
        started.elapsed()
    );

    let mut rng = StdRng::seed_from_u64(fleet.args.seed ^ 0x5eed);
    let mut workload = Workload::new(fleet.args.seed, fleet.args.system_prompts);
    let start = Instant::now();
    let deadline =
        (fleet.args.seconds > 0).then(|| start + Duration::from_secs(fleet.args.seconds));
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / fleet.args.ops_per_sec));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let report_every = Duration::from_secs_f64(fleet.args.report_secs.max(0.1));
    let mut next_report = start + report_every;
    let (mut last_requests, mut last_report) = (0, start);
    let next_churn = |rng: &mut StdRng, secs: f64| {
        (secs > 0.0).then(|| {
            let u: f64 = rng.random_range(0.05..1.0);
            Instant::now() + Duration::from_secs_f64(-u.ln() * secs)
        })
    };
    let mut churn_at = next_churn(&mut rng, fleet.args.churn_secs);
    let mut rejoins: Vec<(Instant, usize, usize)> = Vec::new();

    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {
                println!("interrupted");
                break;
            }
            _ = ticker.tick() => {}
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            break;
        }
        let instance = rng.random_range(0..fleet.args.instances);
        let chunks = workload.next();
        serve(&fleet, instance, &chunks, &mut rng);

        if churn_at.is_some_and(|t| now >= t) {
            churn_at = next_churn(&mut rng, fleet.args.churn_secs);
            let up: Vec<(usize, usize)> = fleet.up().map(|(i, r, _)| (i, r)).collect();
            if up.len() > 1 {
                let (i, r) = up[rng.random_range(0..up.len())];
                if let Some(rank) = fleet.ranks[i][r].take() {
                    let keys = rank.keys.len(LOCAL_CPU_BACKEND);
                    println!(
                        "[{:>6.1}s] {} leaves (deregisters; its {keys} chunks leave the index)",
                        start.elapsed().as_secs_f64(),
                        rank.name
                    );
                    bump(&fleet.totals.departures, 1);
                    if let Some(status) = shutdown_rank(rank).await {
                        fleet.retired.push(status);
                    }
                    let back = Instant::now() + Duration::from_secs(rng.random_range(2..=6));
                    rejoins.push((back, i, r));
                }
            }
        }
        let mut due = Vec::new();
        rejoins.retain(|&(t, i, r)| {
            let ready = now >= t;
            if ready {
                due.push((i, r));
            }
            !ready
        });
        for (i, r) in due {
            match fleet.start_rank(i, r).await {
                Ok(rank) => {
                    println!(
                        "[{:>6.1}s] {} rejoins with an empty cache",
                        start.elapsed().as_secs_f64(),
                        rank.name
                    );
                    bump(&fleet.totals.rejoins, 1);
                    fleet.ranks[i][r] = Some(rank);
                }
                Err(e) => eprintln!("rejoin failed: {e}"),
            }
        }
        if now >= next_report {
            let requests = get(&fleet.totals.requests);
            println!(
                "{}",
                fleet.summary(start.elapsed(), last_requests, now - last_report)
            );
            (last_requests, last_report) = (requests, now);
            next_report += report_every;
        }
    }

    let elapsed = start.elapsed();
    let ranks: Vec<Arc<Rank>> = fleet
        .ranks
        .iter_mut()
        .flat_map(|ranks| ranks.iter_mut().filter_map(Option::take))
        .collect();
    let held: usize = ranks.iter().map(|r| r.keys.len(LOCAL_CPU_BACKEND)).sum();
    let mut final_statuses = Vec::new();
    for rank in ranks {
        final_statuses.extend(shutdown_rank(rank).await);
    }
    fleet.retired.extend(final_statuses);
    let all = &fleet.retired;
    let sum = |f: fn(&WorkerStatus) -> u64| all.iter().map(f).sum::<u64>();
    let t = &fleet.totals;
    println!("---");
    println!(
        "total: {:.1}s, {} instances x {} workers, {} requests ({:.0}/s)",
        elapsed.as_secs_f64(),
        fleet.args.instances,
        fleet.args.workers,
        get(&t.requests),
        get(&t.requests) as f64 / elapsed.as_secs_f64().max(1e-3)
    );
    println!(
        "  kv ops: {} admits, {} evicts; {} sent in {} batches, {} superseded by full syncs, {} refused (queue full)",
        get(&t.admits),
        get(&t.evicts),
        sum(|s| s.ops_sent),
        sum(|s| s.batches_sent),
        sum(|s| s.ops_superseded),
        sum(|s| s.ops_rejected),
    );
    println!(
        "  p2p lookups: {} ({} hits, {:.0}%, {} chunks found on peers), {} failed",
        get(&t.lookups),
        get(&t.hits),
        100.0 * get(&t.hits) as f64 / get(&t.lookups).max(1) as f64,
        get(&t.hit_chunks),
        get(&t.lookup_errors),
    );
    println!(
        "  fleet: {} departures, {} rejoins, {} registrations, {} full syncs completed ({} failed), {} heartbeats ({} failed), {} commands obeyed",
        get(&t.departures),
        get(&t.rejoins),
        sum(|s| s.registrations),
        sum(|s| s.full_syncs_completed),
        sum(|s| s.full_syncs_failed),
        sum(|s| s.heartbeats_ok),
        sum(|s| s.heartbeats_failed),
        get(&t.commands),
    );
    println!("  chunks held at the end (all workers, before deregistering): {held}");
    Ok(())
}
