//! `kvplane bench node`: the cache-node scenario over LMCache 0.5.6's server protocol
//! (`lm://`), against `kvplane node` or `python -m lmcache.v1.server HOST PORT cpu`, and a
//! bare-loopback baseline.
//!
//! For each object size, `--clients` connections each PUT `--objects` objects (keys unique to
//! the run) and then GET them all back. PUT has no reply in the protocol, so a PUT's latency is
//! the time to hand its header and body to the socket, and the PUT phase ends when each client's
//! EXIST of its last key is answered (a connection is served in order, so every PUT before it
//! was taken in). A GET's latency is request → last body byte; its length and the first and last
//! 4 KiB of its body are checked. Throughput is stored (or fetched) bytes over the phase's wall
//! time. With `--pid`, RSS before and after the PUTs gives the memory per stored GiB.
//!
//! `--baseline` runs the same client against an in-process server on its own thread and
//! runtime that speaks the same framing but stores nothing: a PUT body is read into a reused
//! buffer and dropped, a GET is answered with as many bytes as that connection last PUT. That
//! is a bare loopback TCP copy each way, the physical limit of this machine.
//!
//! `--baseline-keep` is the same server, except that it keeps every PUT body in memory it has
//! not touched before (one anonymous mapping per body, faulted in at once, as `kvplane node`
//! does): the physical limit of a server that stores what it receives, since fresh memory
//! must be faulted in and zeroed by the kernel before it can be written.

use super::stats::{mix, rss_bytes, Latency};
use clap::Args;
use serde::Serialize;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const REQ_HEADER: usize = 186;
const REPLY_HEADER: usize = 36;
const KEY_FIELD: usize = 150;
const PUT: i32 = 1;
const GET: i32 = 2;
const EXIST: i32 = 3;
const SUCCESS: i32 = 200;
/// Bytes checked at each end of a GET body.
const CHECK: usize = 4096;

/// Flags of `kvplane bench node`.
#[derive(Debug, Clone, Args)]
pub struct NodeBenchArgs {
    /// The node's `lm://` address (host:port).
    #[arg(
        long,
        env = "KVPLANE_BENCH_NODE_ADDR",
        default_value = "127.0.0.1:65432"
    )]
    pub addr: String,
    /// Concurrent client connections.
    #[arg(long, env = "KVPLANE_BENCH_CLIENTS", default_value_t = 4)]
    pub clients: usize,
    /// Object sizes in bytes, comma-separated.
    #[arg(
        long,
        env = "KVPLANE_BENCH_SIZES",
        default_value = "262144,2097152",
        value_delimiter = ','
    )]
    pub sizes: Vec<usize>,
    /// Bytes stored per size, split evenly between the clients (rounded down to whole objects).
    #[arg(long, env = "KVPLANE_BENCH_BYTES_PER_SIZE", default_value_t = 512 << 20)]
    pub bytes_per_size: u64,
    /// Measure the bare-loopback baseline (in-process, stores nothing) instead of `--addr`.
    #[arg(long, env = "KVPLANE_BENCH_BASELINE")]
    pub baseline: bool,
    /// Measure the storing baseline (in-process, keeps every body in fresh memory) instead of
    /// `--addr`.
    #[arg(long, env = "KVPLANE_BENCH_BASELINE_KEEP", conflicts_with = "baseline")]
    pub baseline_keep: bool,
    /// Seed of the run's keys and bodies (default: random). Two runs with the same seed use
    /// the same keys, so the second replaces every object the first stored.
    #[arg(long, env = "KVPLANE_BENCH_SEED")]
    pub seed: Option<u64>,
    /// Pid of the node, to report RSS per stored GiB.
    #[arg(long, env = "KVPLANE_BENCH_PID")]
    pub pid: Option<u32>,
    /// Seconds any single operation may take.
    #[arg(long, env = "KVPLANE_BENCH_TIMEOUT", default_value_t = 60.0)]
    pub timeout: f64,
    /// Print the report as JSON instead of the summary.
    #[arg(long, env = "KVPLANE_BENCH_JSON")]
    pub json: bool,
}

/// One phase (all PUTs or all GETs of one size).
#[derive(Debug, Default, Serialize)]
pub struct Phase {
    /// Operations.
    pub ops: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Wall time of the phase.
    pub seconds: f64,
    /// `bytes / seconds / 1e9`.
    pub gb_per_sec: f64,
    /// Per-operation latency.
    pub latency: Latency,
}

/// Everything measured for one object size.
#[derive(Debug, Default, Serialize)]
pub struct SizeReport {
    /// Object size in bytes.
    pub size: usize,
    /// Objects per client.
    pub objects_per_client: usize,
    /// PUT phase.
    pub put: Phase,
    /// GET phase.
    pub get: Phase,
    /// Node RSS before the PUTs.
    pub rss_before: Option<u64>,
    /// Node RSS after the PUTs.
    pub rss_after_put: Option<u64>,
    /// `(rss_after_put − rss_before) / stored GiB`, in MiB per GiB.
    pub rss_mib_per_stored_gib: Option<f64>,
    /// `(rss_after_put − rss_before − stored) / stored` (0.01 = 1%).
    pub memory_overhead: Option<f64>,
}

/// What the node scenario measured.
#[derive(Debug, Default, Serialize)]
pub struct NodeReport {
    /// What was measured (`--addr` or `baseline`).
    pub target: String,
    /// Client connections.
    pub clients: usize,
    /// One entry per size.
    pub sizes: Vec<SizeReport>,
}

/// Runs the scenario.
///
/// # Errors
/// A message naming the size, the client and what failed.
pub async fn run(args: &NodeBenchArgs) -> Result<NodeReport, String> {
    if args.clients == 0 || args.sizes.is_empty() || args.sizes.iter().any(|s| *s < 2 * CHECK) {
        return Err(format!(
            "--clients must be ≥ 1 and every --sizes value ≥ {} bytes",
            2 * CHECK
        ));
    }
    if args.sizes.iter().any(|s| *s > i32::MAX as usize) {
        return Err("--sizes: the protocol's length field is an int32".into());
    }
    let timeout = Duration::from_secs_f64(args.timeout.max(1.0));
    let (addr, _server) = if args.baseline || args.baseline_keep {
        let (addr, server) = spawn_baseline(args.baseline_keep).await?;
        (addr, Some(server))
    } else {
        (args.addr.clone(), None)
    };
    let run: u64 = args.seed.unwrap_or_else(|| rand::random::<u64>() >> 16);
    let mut report = NodeReport {
        target: if args.baseline {
            "baseline".into()
        } else if args.baseline_keep {
            "baseline-keep".into()
        } else {
            args.addr.clone()
        },
        clients: args.clients,
        sizes: Vec::new(),
    };
    for &size in &args.sizes {
        let per_client = (args.bytes_per_size / args.clients as u64 / size as u64).max(1) as usize;
        let rss = || args.pid.and_then(rss_bytes);
        let mut sr = SizeReport {
            size,
            objects_per_client: per_client,
            rss_before: rss(),
            ..SizeReport::default()
        };
        let mut conns = Vec::new();
        for _ in 0..args.clients {
            let s = tokio::time::timeout(timeout, TcpStream::connect(&addr))
                .await
                .map_err(|_| format!("connect {addr}: timed out"))?
                .map_err(|e| format!("connect {addr}: {e}"))?;
            s.set_nodelay(true).map_err(|e| format!("nodelay: {e}"))?;
            conns.push(s);
        }
        let bodies: Vec<Arc<Vec<u8>>> = (0..args.clients)
            .map(|c| Arc::new(pattern(size, mix(run ^ (c as u64) << 32 ^ size as u64))))
            .collect();
        // LMCache's server parses keys as `CacheEngineKey` strings
        // (`model@world_size@worker_id@chunk_hash_hex@dtype`).
        let key = move |c: usize, k: usize| {
            let hash = mix(run ^ (size as u64) << 20 ^ (c as u64) << 40 ^ k as u64);
            format!("bench@1@{c}@{hash:016x}@bfloat16")
        };

        // PUT phase.
        let start = Instant::now();
        let mut tasks = Vec::new();
        for (c, mut s) in conns.into_iter().enumerate() {
            let body = bodies[c].clone();
            tasks.push(tokio::spawn(async move {
                let mut samples = Vec::with_capacity(per_client);
                for k in 0..per_client {
                    let header = request_header(PUT, body.len(), &key(c, k))?;
                    let sent = Instant::now();
                    tokio::time::timeout(timeout, async {
                        s.write_all(&header).await?;
                        s.write_all(&body).await
                    })
                    .await
                    .map_err(|_| format!("PUT {}: timed out", key(c, k)))?
                    .map_err(|e| format!("PUT {}: {e}", key(c, k)))?;
                    samples.push(sent.elapsed());
                }
                let last = key(c, per_client - 1);
                let (code, _) = exchange(&mut s, EXIST, &last, timeout, None).await?;
                if code != SUCCESS {
                    return Err(format!("EXIST {last} after the PUTs: code {code}"));
                }
                Ok::<_, String>((s, samples))
            }));
        }
        let mut conns = Vec::new();
        let mut samples = Vec::new();
        for t in tasks {
            let (s, mut l) = t.await.map_err(|e| format!("client task: {e}"))??;
            conns.push(s);
            samples.append(&mut l);
        }
        sr.put = phase(start.elapsed(), size, &mut samples);
        sr.rss_after_put = rss();
        if let (Some(before), Some(after)) = (sr.rss_before, sr.rss_after_put) {
            let stored = sr.put.bytes as f64;
            let grown = after as f64 - before as f64;
            sr.rss_mib_per_stored_gib = Some(grown / 1048576.0 / (stored / 1073741824.0));
            sr.memory_overhead = Some((grown - stored) / stored);
        }

        // GET phase.
        let start = Instant::now();
        let mut tasks = Vec::new();
        let check = !args.baseline && !args.baseline_keep;
        for (c, mut s) in conns.into_iter().enumerate() {
            let body = bodies[c].clone();
            tasks.push(tokio::spawn(async move {
                let mut samples = Vec::with_capacity(per_client);
                let mut buf = vec![0u8; body.len()];
                for k in 0..per_client {
                    let name = key(c, k);
                    let sent = Instant::now();
                    let (code, len) = exchange(&mut s, GET, &name, timeout, Some(&mut buf)).await?;
                    samples.push(sent.elapsed());
                    if code != SUCCESS || len != body.len() {
                        return Err(format!("GET {name}: code {code}, {len} bytes"));
                    }
                    let n = body.len();
                    if check
                        && (buf[..CHECK] != body[..CHECK] || buf[n - CHECK..] != body[n - CHECK..])
                    {
                        return Err(format!("GET {name}: the bytes differ from the PUT"));
                    }
                }
                Ok::<_, String>(samples)
            }));
        }
        let mut samples = Vec::new();
        for t in tasks {
            samples.append(&mut t.await.map_err(|e| format!("client task: {e}"))??);
        }
        sr.get = phase(start.elapsed(), size, &mut samples);
        report.sizes.push(sr);
    }
    Ok(report)
}

fn phase(wall: Duration, size: usize, samples: &mut [Duration]) -> Phase {
    let ops = samples.len() as u64;
    let bytes = ops * size as u64;
    let seconds = wall.as_secs_f64();
    Phase {
        ops,
        bytes,
        seconds,
        gb_per_sec: bytes as f64 / seconds / 1e9,
        latency: Latency::from_samples(samples),
    }
}

/// Bytes that differ per client and per position.
fn pattern(size: usize, seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(size);
    let mut i = 0u64;
    while v.len() < size {
        v.extend_from_slice(&mix(seed ^ i).to_le_bytes());
        i += 1;
    }
    v.truncate(size);
    v
}

/// A `ClientMetaMessage` header (`iiiiiiiii150s`, key space-padded); zero fields and shape.
fn request_header(command: i32, length: usize, key: &str) -> Result<[u8; REQ_HEADER], String> {
    if key.len() > KEY_FIELD {
        return Err(format!("key {key:?} over {KEY_FIELD} bytes"));
    }
    let length = i32::try_from(length).map_err(|_| "length over i32".to_owned())?;
    // fmt 1 (KV_2LTD), dtype 3 (bfloat16), location 1, shape [elements, 0, 0, 0]: fields
    // LMCache's server parses (and its dtype table accepts) and returns unchanged.
    let ints = [command, length, 1, 3, 1, (length / 2).max(1), 0, 0, 0];
    let mut out = [b' '; REQ_HEADER];
    for (i, v) in ints.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    out[36..36 + key.len()].copy_from_slice(key.as_bytes());
    Ok(out)
}

/// Sends a body-less request and reads the reply header (and a GET body into `buf`, which
/// must be at least as long): `(code, body length)`.
async fn exchange(
    s: &mut TcpStream,
    command: i32,
    key: &str,
    timeout: Duration,
    buf: Option<&mut Vec<u8>>,
) -> Result<(i32, usize), String> {
    let header = request_header(command, 0, key)?;
    let call = async {
        s.write_all(&header).await.map_err(|e| e.to_string())?;
        let mut reply = [0u8; REPLY_HEADER];
        s.read_exact(&mut reply).await.map_err(|e| e.to_string())?;
        let int = |i: usize| {
            i32::from_le_bytes([
                reply[4 * i],
                reply[4 * i + 1],
                reply[4 * i + 2],
                reply[4 * i + 3],
            ])
        };
        let (code, len) = (int(0), int(1));
        let len = usize::try_from(len).map_err(|_| format!("negative length {len}"))?;
        if len > 0 {
            let buf = buf.ok_or("a body where none was expected")?;
            if len > buf.len() {
                return Err(format!("a {len}-byte body, larger than any object put"));
            }
            s.read_exact(&mut buf[..len])
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok((code, len))
    };
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| format!("command {command} {key}: timed out"))?
        .map_err(|e: String| format!("command {command} {key}: {e}"))
}

/// The baseline server: its own thread and two-worker runtime, stopped when the guard drops.
async fn spawn_baseline(keep: bool) -> Result<(String, BaselineGuard), String> {
    let std_listener =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("baseline bind: {e}"))?;
    std_listener
        .set_nonblocking(true)
        .map_err(|e| format!("baseline: {e}"))?;
    let addr = std_listener
        .local_addr()
        .map_err(|e| format!("baseline: {e}"))?
        .to_string();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async move {
            let Ok(listener) = TcpListener::from_std(std_listener) else {
                return;
            };
            let accept = async {
                while let Ok((s, _)) = listener.accept().await {
                    tokio::spawn(baseline_conn(s, keep));
                }
            };
            tokio::select! {
                () = accept => {}
                _ = stop_rx => {}
            }
        });
    });
    Ok((
        addr,
        BaselineGuard {
            stop: Some(stop_tx),
            thread: Some(thread),
        },
    ))
}

/// Stops the baseline server.
struct BaselineGuard {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for BaselineGuard {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One baseline connection: the protocol's framing, no storage (or, with `keep`, every body
/// kept in a fresh mapping until the connection ends).
async fn baseline_conn(mut s: TcpStream, keep: bool) {
    let _ = s.set_nodelay(true);
    let mut header = [0u8; REQ_HEADER];
    let mut body: Vec<u8> = Vec::new();
    let mut last_put = 0usize;
    let mut kept: Vec<memmap2::MmapMut> = Vec::new();
    while s.read_exact(&mut header).await.is_ok() {
        let int = |i: usize| {
            i32::from_le_bytes([
                header[4 * i],
                header[4 * i + 1],
                header[4 * i + 2],
                header[4 * i + 3],
            ])
        };
        let (command, len) = (
            int(0),
            usize::try_from(int(1)).unwrap_or(0).min(i32::MAX as usize),
        );
        let mut reply = [0u8; REPLY_HEADER];
        reply[..4].copy_from_slice(&SUCCESS.to_le_bytes());
        match command {
            PUT if keep => {
                let Ok(mut map) = memmap2::MmapOptions::new()
                    .len(len.max(1))
                    .populate()
                    .map_anon()
                else {
                    return;
                };
                if s.read_exact(&mut map[..len]).await.is_err() {
                    return;
                }
                kept.push(map);
                last_put = len;
            }
            GET if keep => {
                let body = kept.last().map_or(&[][..], |m| &m[..last_put]);
                reply[4..8].copy_from_slice(&(body.len() as i32).to_le_bytes());
                if s.write_all(&reply).await.is_err() || s.write_all(body).await.is_err() {
                    return;
                }
            }
            PUT => {
                if body.len() < len {
                    body.resize(len, 0);
                }
                if s.read_exact(&mut body[..len]).await.is_err() {
                    return;
                }
                last_put = len;
            }
            GET => {
                if body.len() < last_put {
                    body.resize(last_put, 0);
                }
                reply[4..8].copy_from_slice(&(last_put as i32).to_le_bytes());
                if s.write_all(&reply).await.is_err()
                    || s.write_all(&body[..last_put]).await.is_err()
                {
                    return;
                }
            }
            _ => {
                if s.write_all(&reply).await.is_err() {
                    return;
                }
            }
        }
    }
}

impl NodeReport {
    /// A readable summary, one line per size and operation.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        for s in &self.sizes {
            for (op, p) in [("PUT", &s.put), ("GET", &s.get)] {
                let _ = writeln!(
                    out,
                    "{:<10} {:>8} KiB {op}  {:>6.2} GB/s  p50 {:>8.0} µs  p99 {:>8.0} µs  ({} ops, {} clients, {:.3} s)",
                    self.target, s.size / 1024, p.gb_per_sec, p.latency.p50_us, p.latency.p99_us,
                    p.ops, self.clients, p.seconds
                );
            }
            if let (Some(per_gib), Some(over)) = (s.rss_mib_per_stored_gib, s.memory_overhead) {
                let _ = writeln!(
                    out,
                    "{:<10} {:>8} KiB RSS  {per_gib:.1} MiB per stored GiB (overhead {:.2}% of stored bytes)",
                    self.target, s.size / 1024, over * 100.0
                );
            }
        }
        out
    }
}
