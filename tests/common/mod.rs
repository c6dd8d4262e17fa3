//! Shared helpers for integration tests: a kvplane server on 127.0.0.1 with ephemeral ports,
//! and test-side worker sockets. Every wait is bounded.

#![allow(dead_code)]

pub mod lmcache;

use bytes::Bytes;
use kvplane::config::ServeConfig;
use kvplane::protocol::{decode, encode, Msg};
use kvplane::transport::{DealerClient, PushSender, RepServer};
use kvplane::Server;
use std::future::Future;
use std::time::{Duration, Instant};

/// Bound on any single await in a test.
pub const STEP: Duration = Duration::from_secs(10);

/// Awaits `f`, failing the test after [`STEP`].
pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(STEP, f)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// Polls `cond` every 10 ms until it holds, failing after `limit`.
pub async fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < limit,
            "condition not reached within {limit:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Starts a server with `tweak` applied to the ephemeral test configuration.
pub async fn server_with(tweak: impl FnOnce(&mut ServeConfig)) -> Server {
    let mut config = ServeConfig::ephemeral();
    tweak(&mut config);
    within("server start", kvplane::start(config))
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
        TestWorker {
            instance_id: instance_id.to_owned(),
            worker_id,
            dealer: DealerClient::new(ep(server.addrs.reply), Duration::from_secs(5)),
            push: PushSender::new(ep(server.addrs.pull)),
            seq: 0,
        }
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
        let msg = Msg::RegisterMsg(kvplane::protocol::RegisterMsg {
            instance_id: self.instance_id.clone(),
            worker_id: self.worker_id,
            ip: "127.0.0.1".into(),
            port: i64::from(port),
            peer_init_url: peer_init_url.map(str::to_owned),
        });
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
    let start = Instant::now();
    loop {
        match RepServer::bind(&format!("127.0.0.1:{port}")).await {
            Ok((rep, _)) => return rep,
            Err(e) if start.elapsed() < STEP => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("port {port} not free after {STEP:?}: {e}"),
        }
    }
}

/// Starts a server on the ZMQ ports of a stopped one (a restart), retrying for a bounded time
/// while the old sockets release their ports.
pub async fn restart_on(addrs: kvplane::controller::BoundAddrs) -> Server {
    let start = Instant::now();
    loop {
        let mut config = ServeConfig::ephemeral();
        config.monitor_ports.pull = addrs.pull.map(|a| a.port());
        config.monitor_ports.reply = addrs.reply.map(|a| a.port());
        config.monitor_ports.heartbeat = addrs.heartbeat.map(|a| a.port());
        match within("server restart", kvplane::start(config)).await {
            Ok(server) => return server,
            Err(e) if start.elapsed() < STEP => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("restart on the same ports failed for {STEP:?}: {e}"),
        }
    }
}
