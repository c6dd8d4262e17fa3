//! The one test-support module of the integration tests: a kvplane server on 127.0.0.1 with
//! ephemeral ports, test-side worker sockets, a worker configuration with fast timers, the
//! golden vectors, key-set reads, loopback ports, and (in [`http`]) fake workers, the router
//! caller and the HTTP client. Every wait is bounded. Each test binary (`tests/<name>/main.rs`)
//! includes it once as `support` (`#[path = "../support/mod.rs"] mod support;`) and its modules
//! use what they need through `crate::support`. It holds no test of its own.

#![allow(dead_code)]
// Each test binary includes this module privately: `pub` here means "for the test files".
#![allow(unreachable_pub)]

pub mod browser;
pub mod engine;
pub mod http;
pub mod http_limits;
pub mod lmcache;
pub mod mooncake_pub;
pub mod mp_fleet;
pub mod nats;
pub mod node;
pub mod process;
pub mod vllm_pub;
pub mod wait;
pub mod zmtp;

#[allow(unused_imports)] // not every test binary uses them
pub use http::*;
pub use wait::*;

use bytes::Bytes;
use kvplane::config::ServeConfig;
use kvplane::controller::Server;
use kvplane::protocol::{decode, encode, Msg};
use kvplane::transport::{DealerClient, PushSender, RepServer};
use kvplane::worker::{Backoff, FullSyncConfig, WorkerConfig};
use serde_json::Value;
use std::collections::{BTreeSet, HashSet};
use std::net::{SocketAddr, TcpListener};
use std::sync::Mutex;
use std::time::Duration;

/// Starts a server with `tweak` applied to the ephemeral test configuration.
pub async fn server_with(tweak: impl FnOnce(&mut ServeConfig)) -> Server {
    let mut config = ServeConfig::ephemeral();
    tweak(&mut config);
    within("server start", kvplane::controller::start(config))
        .await
        .expect("server starts")
}

/// Starts a server with the ephemeral test configuration.
pub async fn server() -> Server {
    server_with(|_| {}).await
}

/// `127.0.0.1:port` of a bound address.
pub fn ep(addr: Option<std::net::SocketAddr>) -> String {
    let addr = addr.expect("socket configured");
    format!("127.0.0.1:{}", addr.port())
}

/// A test worker: a DEALER to the reply socket, a PUSH to the PULL socket.
pub struct TestWorker {
    pub instance_id: String,
    pub worker_id: i64,
    pub dealer: DealerClient,
    pub push: PushSender,
    pub seq: i64,
}

impl TestWorker {
    pub fn new(server: &Server, instance_id: &str, worker_id: i64) -> Self {
        Self::at(
            &ep(server.addrs.reply),
            &ep(server.addrs.pull),
            instance_id,
            worker_id,
        )
    }

    /// A worker of a controller at `reply` / `pull` (`host:port`).
    pub fn at(reply: &str, pull: &str, instance_id: &str, worker_id: i64) -> Self {
        TestWorker {
            instance_id: instance_id.to_owned(),
            worker_id,
            dealer: DealerClient::new(reply.to_owned(), Duration::from_secs(5)),
            push: PushSender::new(pull.to_owned()),
            seq: 0,
        }
    }

    /// A worker of `server` registered with its command socket (REP) on an ephemeral port,
    /// and that socket (the caller answers on it, or keeps it so the port stays taken).
    pub async fn registered(
        server: &Server,
        instance_id: &str,
        worker_id: i64,
        peer_init_url: Option<&str>,
    ) -> (Self, RepServer) {
        let (rep, port) = rep().await;
        let mut worker = Self::new(server, instance_id, worker_id);
        worker.register(port, peer_init_url).await;
        (worker, rep)
    }

    /// Sends a request on the reply socket and decodes the answer.
    pub async fn request(&mut self, msg: Msg) -> Msg {
        let bytes = within(
            "dealer request",
            self.dealer.request(Bytes::from(encode(&msg))),
        )
        .await
        .expect("request answered");
        decode(&bytes).expect("reply decodes")
    }

    pub async fn register(&mut self, port: u16, peer_init_url: Option<&str>) -> Msg {
        let msg = register_msg(&self.instance_id, self.worker_id, port, peer_init_url);
        self.request(msg).await
    }

    /// Pushes encoded messages as one multipart (one message per frame).
    pub async fn push(&mut self, msgs: &[Msg]) {
        let frames = msgs.iter().map(|m| Bytes::from(encode(m))).collect();
        self.push_raw(frames).await;
    }

    pub async fn push_raw(&mut self, frames: Vec<Bytes>) {
        within("push", self.push.send(frames, Duration::from_secs(5)))
            .await
            .expect("push sent");
    }

    /// A batch of ops for `location` with consecutive sequence numbers.
    pub fn batch(&mut self, location: &str, ops: &[(bool, i64)]) -> Msg {
        use kvplane::protocol::{BatchedKVOperationMsg, ChunkHash, KVOpEvent, OpType};
        let operations = ops
            .iter()
            .map(|(admit, key)| {
                let seq_num = self.seq;
                self.seq += 1;
                KVOpEvent {
                    op_type: if *admit { OpType::Admit } else { OpType::Evict },
                    key: ChunkHash::from_i64(*key),
                    seq_num,
                }
            })
            .collect();
        Msg::BatchedKVOperationMsg(BatchedKVOperationMsg {
            instance_id: self.instance_id.clone(),
            worker_id: self.worker_id,
            location: location.to_owned(),
            operations,
        })
    }
}

/// The `RegisterMsg` of worker `worker_id` of `instance` with its command socket at
/// `127.0.0.1:port` (and `peer_init_url` for P2P lookups, if any).
pub fn register_msg(instance: &str, worker_id: i64, port: u16, peer_init_url: Option<&str>) -> Msg {
    Msg::RegisterMsg(kvplane::protocol::RegisterMsg {
        instance_id: instance.to_owned(),
        worker_id,
        ip: "127.0.0.1".into(),
        port: i64::from(port),
        peer_init_url: peer_init_url.map(str::to_owned),
        distributed_url: None,
    })
}

/// A worker's command socket (REP) on an ephemeral port.
pub async fn rep() -> (RepServer, u16) {
    let (rep, addr) = within("bind rep", RepServer::bind("127.0.0.1:0"))
        .await
        .expect("rep binds");
    (rep, addr.port())
}

/// Receives one command on a REP socket and answers it with `answer(command)`.
pub async fn serve_one(rep: &mut RepServer, answer: impl FnOnce(&Msg) -> Msg) -> Msg {
    let bytes = within("rep recv", rep.recv())
        .await
        .expect("command received");
    let msg = decode(&bytes).expect("command decodes");
    let reply = Bytes::from(encode(&answer(&msg)));
    within("rep reply", rep.reply(reply))
        .await
        .expect("reply sent");
    msg
}

/// Sends one request on a DEALER and decodes the answer.
pub async fn ask(dealer: &mut DealerClient, msg: &Msg) -> Msg {
    let bytes = within("dealer request", dealer.request(Bytes::from(encode(msg))))
        .await
        .expect("answered");
    decode(&bytes).expect("reply decodes")
}

/// Binds a REP socket on a fixed port, retrying for a bounded time: the zeromq crate
/// releases a dropped socket's port asynchronously.
pub async fn rebind_rep(port: u16) -> RepServer {
    let what = format!("port {port} free to bind again");
    eventually(&what, STEP, async || {
        RepServer::bind(&format!("127.0.0.1:{port}"))
            .await
            .map(|(rep, _)| rep)
    })
    .await
}

/// Starts a server on the ZMQ ports of a stopped one (a restart), retrying for a bounded time
/// while the old sockets release their ports.
pub async fn restart_on(addrs: kvplane::controller::BoundAddrs) -> Server {
    eventually("a restart on the same ports", STEP, async || {
        let mut config = ServeConfig::ephemeral();
        config.monitor_ports.pull = addrs.pull.map(|a| a.port());
        config.monitor_ports.reply = addrs.reply.map(|a| a.port());
        config.monitor_ports.heartbeat = addrs.heartbeat.map(|a| a.port());
        kvplane::controller::start(config).await
    })
    .await
}

/// The text of a golden-vector file of `tests/conformance/lmcache-0.5.6/` (in the repository;
/// its README says how the vectors were made). `KVPLANE_CONFORMANCE_DIR` overrides the
/// directory.
pub fn conformance_file(name: &str) -> String {
    let dir = std::env::var("KVPLANE_CONFORMANCE_DIR").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/conformance/lmcache-0.5.6"
        )
        .to_owned()
    });
    let path = format!("{dir}/{name}");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("golden vectors missing at {path}: {e}"))
}

/// The token-hash vector called `name` of `lookup_token_hashes.jsonl`.
pub fn vector(name: &str) -> Value {
    conformance_file("lookup_token_hashes.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str::<Value>(l).expect("vector line is JSON"))
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no vector {name}"))
}

/// The keys the index holds for `(instance, worker)` at `LocalCPUBackend`.
pub fn keys(server: &Server, instance: &str, worker: i64) -> BTreeSet<i128> {
    server
        .shared
        .index()
        .keys_of(instance, worker, kvplane::worker::LOCAL_CPU_BACKEND)
        .into_iter()
        .map(kvplane::protocol::ChunkHash::as_i128)
        .collect()
}

/// A worker configuration against `127.0.0.1:pull` / `127.0.0.1:reply` with fast timers
/// (heartbeat 200 ms, request timeout 1 s, full-sync polls every 50 ms, at most 200).
pub fn worker_config(pull: u16, reply: u16, instance: &str, worker_id: i64) -> WorkerConfig {
    let mut c = WorkerConfig::new(
        instance,
        worker_id,
        format!("127.0.0.1:{pull}"),
        format!("127.0.0.1:{reply}"),
    );
    c.command_host = "127.0.0.1".into();
    c.heartbeat_interval = Some(Duration::from_millis(200));
    c.heartbeat_delay = Duration::from_millis(100);
    c.request_timeout = Duration::from_secs(1);
    c.retry_backoff = Backoff {
        initial: Duration::from_millis(50),
        max: Duration::from_millis(500),
    };
    c.full_sync = FullSyncConfig {
        batch_size: 100,
        batch_interval: Duration::from_millis(1),
        startup_delay: Duration::from_millis(50),
        poll_interval: Duration::from_millis(50),
        max_retries: 3,
        retry_delay: Duration::from_millis(100),
        max_polls: 200,
    };
    c.shutdown_timeout = Duration::from_secs(3);
    c
}

/// Admits (or evicts) `key` at `location` in the model `keys` first, then through `worker`.
pub fn apply(
    worker: &kvplane::worker::WorkerHandle,
    keys: &kvplane::worker::MemoryKeys,
    admit: bool,
    location: &str,
    key: i64,
) {
    if admit {
        keys.admit(location, key);
        worker.admit(location, key).expect("admit queued");
    } else {
        keys.evict(location, key);
        worker.evict(location, key).expect("evict queued");
    }
}

/// A loopback port bound (port 0, read back) but not listening: connections to it are refused,
/// as to a free port, yet nobody else can take it until the hold is dropped. For a test that
/// needs "nothing listens here yet" and binds the port itself later: drop the hold right
/// before that bind, so the port is exposed for microseconds instead of the whole test.
pub struct PortHold(tokio::net::TcpSocket);

/// Holds a fresh loopback port; see [`PortHold`].
pub fn hold_port() -> (PortHold, u16) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind(loopback(0)).expect("bind 127.0.0.1:0");
    let port = socket.local_addr().expect("bound address").port();
    (PortHold(socket), port)
}

/// A loopback port for a peer that is not up yet and must be told its port in advance (a
/// child process, a Python worker). Prefer binding port 0 and reading the bound address
/// wherever the test owns the socket, or [`hold_port`] when it binds later.
///
/// Safer than "bind port 0, then drop": the port is taken *below* the kernel's ephemeral range
/// (`ip_local_port_range`), where neither port-0 binds nor outgoing connections land, so the
/// other tests of this machine (which all bind port 0) cannot take it in between; and this
/// process never hands the same port out twice.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (from, to) = if low > 12_000 {
        (10_000, low - 1)
    } else {
        (0, 0)
    };
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let given = given.get_or_insert_with(HashSet::new);
    if to > from {
        let span = u32::from(to - from);
        // Start at a pseudo-random place so concurrent test processes spread out.
        let seed = std::process::id().wrapping_mul(2_654_435_761) % span;
        for i in 0..span {
            let port = from + ((seed + i * 7_919) % span) as u16;
            if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
                given.insert(port);
                return port;
            }
        }
    }
    // No room below the ephemeral range: fall back to the kernel's choice.
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        if given.insert(port) {
            return port;
        }
    }
}

/// Whether the peer of `s` has not hung up: reads (and drops) whatever it sent so far, and
/// answers `true` while the connection is open with nothing more to read.
pub fn still_connected(s: &tokio::net::TcpStream) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match s.try_read(&mut buf) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(e) => return e.kind() == std::io::ErrorKind::WouldBlock,
        }
    }
}

/// Fixed loopback ports for one `kvplane serve` child, chosen free beforehand ([`free_port`])
/// so that it can restart on them, or a standby can take them over.
#[derive(Clone, Copy, Debug)]
pub struct ServePorts {
    pub http: u16,
    pub pull: u16,
    pub reply: u16,
    pub heartbeat: u16,
}

impl ServePorts {
    pub fn free() -> Self {
        ServePorts {
            http: free_port(),
            pull: free_port(),
            reply: free_port(),
            heartbeat: free_port(),
        }
    }

    pub fn http_addr(&self) -> SocketAddr {
        loopback(self.http)
    }

    /// The environment that puts `kvplane serve` on these ports.
    pub fn env(&self) -> [(&'static str, String); 3] {
        let monitor = serde_json::json!({
            "pull": self.pull, "reply": self.reply, "heartbeat": self.heartbeat
        });
        [
            ("KVPLANE_SERVE_HOST", "127.0.0.1".to_owned()),
            ("KVPLANE_SERVE_PORT", self.http.to_string()),
            ("KVPLANE_SERVE_MONITOR_PORTS", monitor.to_string()),
        ]
    }

    /// Starts `kvplane serve` as a child on these ports (`RUST_LOG=warn`, then `env` on top)
    /// and waits until `/readyz` is 200. A start that exits first (a port a previous instance
    /// on them still holds) is tried again, for at most [`SLOW`].
    pub async fn serve(&self, env: &[(&str, &str)]) -> process::Process {
        let (ports, on_ports) = (*self, self.env());
        let mut tries = 0;
        eventually("kvplane serve starts on its ports", SLOW, async || {
            tries += 1;
            let mut process = process::Launch::kvplane("serve")
                .named(&format!("kvplane serve (try {tries})"))
                .envs_owned(&on_ports)
                .env("RUST_LOG", "warn")
                .envs(env)
                .spawn();
            let ready = try_eventually("/readyz is 200", STEP, async || {
                if let Some(status) = process.try_exit() {
                    return Some(Err(format!("exited ({status}):\n{}", process.tail(20))));
                }
                let probe = try_http(ports.http_addr(), "GET", "/readyz", None, &[]).await;
                probe
                    .is_ok_and(|(status, _)| status == 200)
                    .then_some(Ok(()))
            })
            .await
            .and_then(|outcome| outcome);
            ready.map(|()| process)
        })
        .await
    }
}

/// The HTTP addresses of the indexer and the MP coordinator that a `kvplane serve` child runs
/// beside the controller, read from their listening lines.
pub async fn embedded_http(kv: &process::Process) -> (SocketAddr, SocketAddr) {
    let indexer = kv.listening("kvplane indexer listening").await.addr("http");
    let coordinator = kv
        .listening("MP coordinator listening on")
        .await
        .addr("http");
    (indexer, coordinator)
}

/// `127.0.0.1:port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The value of one sample line (`name{labels} value`) in a Prometheus scrape, 0 if absent.
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}
