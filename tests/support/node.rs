//! A Rust client of the LMCache 0.5.6 `lm://` protocol for the node's integration tests,
//! and helpers to start nodes on 127.0.0.1. Every await is bounded ([`super::within`]).

#[allow(unused_imports)] // not every test binary uses them through this module
pub use super::{lmcache::python, sample, within, STEP};
use kvplane::node::config::{L2Config, PrefetchPolicy, StorePolicy};
use kvplane::node::model::codec::{
    self, LmCommand, LmReply, LmRequest, ObjectMeta, REPLY_HEADER_LEN, REQUEST_HEADER_LEN,
};
use kvplane::node::{NodeConfig, NodeServer};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The meta LMCache's connector sends for a KV_2LTD bfloat16 chunk.
pub const META: ObjectMeta = ObjectMeta {
    fmt: 1,
    dtype: 3,
    location: 0,
    shape: [2, 4, 8, 16],
};

/// A fresh, empty directory under the system temp dir.
pub fn tempdir(name: &str) -> PathBuf {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let p = std::env::temp_dir().join(format!(
        "kvplane-node-{name}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&p);
    p
}

/// An L2 configuration at `path` with `budget` bytes.
pub fn l2(path: &Path, budget: u64, prefetch: PrefetchPolicy, store: StorePolicy) -> L2Config {
    L2Config {
        path: path.to_owned(),
        eviction: kvplane::node::config::EvictionPolicy {
            budget,
            trigger_watermark: 0.8,
            eviction_ratio: 0.2,
            lru: true,
        },
        store_policy: store,
        prefetch_policy: prefetch,
        max_in_flight: 4,
        fsync: true,
    }
}

/// [`l2`] with the default prefetch and store policies.
pub fn plain_l2(path: &Path, budget: u64) -> L2Config {
    l2(path, budget, PrefetchPolicy::Default, StorePolicy::Default)
}

/// Starts a node with `tweak` applied to the ephemeral configuration.
pub async fn node_with(tweak: impl FnOnce(&mut NodeConfig)) -> NodeServer {
    let mut c = NodeConfig::ephemeral();
    tweak(&mut c);
    within("node start", kvplane::node::start(c))
        .await
        .expect("node starts")
}

/// A node reporting to `server`'s controller as worker 0 of `instance` (`tweak` sees the
/// configuration with `controller` set), once it is registered.
#[allow(dead_code)] // not every test binary uses it
pub async fn controller_node(
    server: &kvplane::controller::Server,
    instance: &str,
    tweak: impl FnOnce(&mut NodeConfig),
) -> NodeServer {
    let port = |a: Option<std::net::SocketAddr>| a.expect("zmq socket").port();
    let w = super::worker_config(
        port(server.addrs.pull),
        port(server.addrs.reply),
        instance,
        0,
    );
    let node = node_with(|c| {
        c.controller = Some(w);
        tweak(c);
    })
    .await;
    node.controller_ready(STEP)
        .await
        .expect("the node registers with the controller");
    node
}

/// Deterministic body bytes for `seed`.
pub fn body(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// One connection speaking the protocol.
pub struct Client {
    pub stream: TcpStream,
}

impl Client {
    pub async fn connect(node: &NodeServer) -> Client {
        let stream = within("connect", TcpStream::connect(node.addrs.lm))
            .await
            .expect("connects");
        Client { stream }
    }

    pub async fn send_header(
        &mut self,
        command: LmCommand,
        key: &str,
        length: usize,
        meta: ObjectMeta,
    ) {
        let raw = codec::encode_request(&LmRequest {
            command,
            length,
            meta,
            key: key.to_owned(),
        })
        .expect("encodes");
        within("send", self.stream.write_all(&raw))
            .await
            .expect("send");
    }

    pub async fn send_raw(&mut self, raw: &[u8]) {
        within("send raw", self.stream.write_all(raw))
            .await
            .expect("send raw");
    }

    pub async fn reply(&mut self) -> LmReply {
        let mut raw = [0u8; REPLY_HEADER_LEN];
        within("reply", self.stream.read_exact(&mut raw))
            .await
            .expect("reply header");
        codec::parse_reply(&raw).expect("valid reply")
    }

    pub async fn body(&mut self, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        within("body", self.stream.read_exact(&mut b))
            .await
            .expect("body");
        b
    }

    pub async fn put(&mut self, key: &str, data: &[u8]) {
        self.send_header(LmCommand::Put, key, data.len(), META)
            .await;
        within("put body", self.stream.write_all(data))
            .await
            .expect("put body");
    }

    /// GET as LMCache's connector sends it; `None` on FAIL.
    pub async fn get(&mut self, key: &str) -> Option<(LmReply, Vec<u8>)> {
        let probe = ObjectMeta {
            fmt: 1,
            dtype: 2,
            location: 0,
            shape: [0; 4],
        };
        self.send_header(LmCommand::Get, key, 0, probe).await;
        let r = self.reply().await;
        if r.code != codec::CODE_SUCCESS {
            assert_eq!(r, LmReply::fail(), "a miss is FAIL with zeros");
            return None;
        }
        let b = self.body(r.length).await;
        Some((r, b))
    }

    pub async fn exists(&mut self, key: &str) -> bool {
        self.send_header(LmCommand::Exist, key, 0, ObjectMeta::default())
            .await;
        let r = self.reply().await;
        assert_eq!(r.length, 0);
        r.code == codec::CODE_SUCCESS
    }

    pub async fn health(&mut self) -> LmReply {
        self.send_header(LmCommand::Health, "health", 0, ObjectMeta::default())
            .await;
        self.reply().await
    }

    pub async fn list(&mut self) -> Vec<String> {
        self.send_header(LmCommand::List, "list", 0, ObjectMeta::default())
            .await;
        let r = self.reply().await;
        assert_eq!(r.code, codec::CODE_SUCCESS);
        let b = self.body(r.length).await;
        let mut keys: Vec<String> = String::from_utf8(b)
            .expect("utf8")
            .split('\n')
            .filter(|k| !k.is_empty())
            .map(str::to_owned)
            .collect();
        keys.sort();
        keys
    }

    /// Reads until EOF (bounded); returns the bytes seen before it.
    pub async fn until_closed(&mut self) -> Vec<u8> {
        let mut seen = Vec::new();
        within("server closes", self.stream.read_to_end(&mut seen))
            .await
            .ok();
        seen
    }
}

/// A raw header with arbitrary ints and key bytes (for bad input).
pub fn raw_header(ints: [i32; 9], key: &[u8]) -> [u8; REQUEST_HEADER_LEN] {
    let mut raw = [b' '; REQUEST_HEADER_LEN];
    for (i, v) in ints.iter().enumerate() {
        raw[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    raw[36..36 + key.len()].copy_from_slice(key);
    raw
}

/// `kvplane_node_requests_total` of `command` with `outcome` in the scrape `text`.
pub fn requests(text: &str, command: &str, outcome: &str) -> f64 {
    let series =
        format!(r#"kvplane_node_requests_total{{command="{command}",outcome="{outcome}"}}"#);
    super::sample(text, &series)
}

/// `GET /metrics` over plain HTTP/1.0 on the node's HTTP port.
pub async fn scrape(node: &NodeServer) -> String {
    let addr = node.addrs.http.expect("http configured");
    let mut s = within("http connect", TcpStream::connect(addr))
        .await
        .expect("http connects");
    within(
        "http send",
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n"),
    )
    .await
    .expect("send");
    let mut out = String::new();
    within("http read", s.read_to_string(&mut out))
        .await
        .expect("read");
    out
}
