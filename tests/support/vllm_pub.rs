//! A vLLM-like KV-event publisher for tests: a PUB socket for live batches and a replay
//! ROUTER serving its ring in vLLM's ≥ 0.26 layout, with events encoded byte for byte as
//! vLLM's msgspec structs (`mp`). Used by the indexer's tests and by the router's engine
//! stand-in.

use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::Mutex;
use zeromq::prelude::*;
use zeromq::{PubSocket, RouterSocket, ZmqMessage};

pub const TOPIC: &[u8] = b"kv@pod1@m";

/// The publisher's replay ring: (seq, payload), oldest first.
pub type Ring = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

/// msgpack helpers: vLLM's encodings of BlockStored / BlockRemoved / AllBlocksCleared.
pub mod mp {
    use rmp::encode::*;

    pub fn batch(events: &[Vec<u8>]) -> Vec<u8> {
        let mut b = Vec::new();
        write_array_len(&mut b, 3).unwrap();
        write_f64(&mut b, 1.5).unwrap();
        write_array_len(&mut b, events.len() as u32).unwrap();
        for e in events {
            b.extend_from_slice(e);
        }
        write_uint(&mut b, 0).unwrap();
        b
    }

    fn hashes(b: &mut Vec<u8>, hs: &[u64]) {
        write_array_len(b, hs.len() as u32).unwrap();
        for h in hs {
            write_uint(b, *h).unwrap();
        }
    }

    /// vLLM ≥ 0.33: a tagged map with a map16 header (8 entries).
    pub fn stored_map(
        hs: &[u64],
        parent: Option<u64>,
        tokens: &[u32],
        bs: u32,
        medium: &str,
    ) -> Vec<u8> {
        let mut b = vec![0xde, 0x00, 0x08];
        stored_fields(&mut b, hs, parent, tokens, bs, medium, None);
        b
    }

    /// The 8 fields of a tagged `BlockStored` map, after its header.
    fn stored_fields(
        b: &mut Vec<u8>,
        hs: &[u64],
        parent: Option<u64>,
        tokens: &[u32],
        bs: u32,
        medium: &str,
        lora: Option<&str>,
    ) {
        write_str(b, "type").unwrap();
        write_str(b, "BlockStored").unwrap();
        write_str(b, "block_hashes").unwrap();
        hashes(b, hs);
        write_str(b, "parent_block_hash").unwrap();
        match parent {
            Some(p) => write_uint(b, p).map(|_| ()).unwrap(),
            None => write_nil(b).unwrap(),
        }
        write_str(b, "token_ids").unwrap();
        write_array_len(b, tokens.len() as u32).unwrap();
        for t in tokens {
            write_uint(b, u64::from(*t)).unwrap();
        }
        write_str(b, "block_size").unwrap();
        write_uint(b, u64::from(bs)).unwrap();
        write_str(b, "lora_id").unwrap();
        write_nil(b).unwrap();
        write_str(b, "medium").unwrap();
        write_str(b, medium).unwrap();
        write_str(b, "lora_name").unwrap();
        match lora {
            Some(l) => write_str(b, l).unwrap(),
            None => write_nil(b).unwrap(),
        }
    }

    /// vLLM ≥ 0.33's map with the namespace fields: `lora_name`, and the cache salt in
    /// `extra_keys[0]` (vLLM writes it only on a prompt's first block; children inherit).
    pub fn stored_ns(
        hs: &[u64],
        parent: Option<u64>,
        tokens: &[u32],
        bs: u32,
        lora: Option<&str>,
        salt: Option<&str>,
    ) -> Vec<u8> {
        let mut b = Vec::new();
        write_map_len(&mut b, 9).unwrap();
        stored_fields(&mut b, hs, parent, tokens, bs, "GPU", lora);
        write_str(&mut b, "extra_keys").unwrap();
        write_array_len(&mut b, hs.len() as u32).unwrap();
        for i in 0..hs.len() {
            let mut keys: Vec<&str> = Vec::new();
            if let Some(l) = lora {
                keys.push(l);
            }
            if i == 0 && parent.is_none() {
                keys.extend(salt);
            }
            if keys.is_empty() {
                write_nil(&mut b).unwrap();
            } else {
                write_array_len(&mut b, keys.len() as u32).unwrap();
                for k in keys {
                    write_str(&mut b, k).unwrap();
                }
            }
        }
        b
    }

    /// vLLM ≤ 0.23: a 12-element positional array.
    pub fn stored_legacy(
        hs: &[u64],
        parent: Option<u64>,
        tokens: &[u32],
        bs: u32,
        medium: &str,
    ) -> Vec<u8> {
        let mut b = Vec::new();
        write_array_len(&mut b, 12).unwrap();
        write_str(&mut b, "BlockStored").unwrap();
        hashes(&mut b, hs);
        match parent {
            Some(p) => write_uint(&mut b, p).map(|_| ()).unwrap(),
            None => write_nil(&mut b).unwrap(),
        }
        write_array_len(&mut b, tokens.len() as u32).unwrap();
        for t in tokens {
            write_uint(&mut b, u64::from(*t)).unwrap();
        }
        write_uint(&mut b, u64::from(bs)).unwrap();
        write_nil(&mut b).unwrap();
        write_str(&mut b, medium).unwrap();
        for _ in 0..5 {
            write_nil(&mut b).unwrap();
        }
        b
    }

    pub fn removed_map(hs: &[u64], medium: &str) -> Vec<u8> {
        let mut b = Vec::new();
        write_map_len(&mut b, 3).unwrap();
        write_str(&mut b, "type").unwrap();
        write_str(&mut b, "BlockRemoved").unwrap();
        write_str(&mut b, "block_hashes").unwrap();
        hashes(&mut b, hs);
        write_str(&mut b, "medium").unwrap();
        write_str(&mut b, medium).unwrap();
        b
    }

    pub fn cleared_legacy() -> Vec<u8> {
        let mut b = Vec::new();
        write_array_len(&mut b, 1).unwrap();
        write_str(&mut b, "AllBlocksCleared").unwrap();
        b
    }
}

/// A vLLM-like publisher: PUB for live batches, a ROUTER serving replays from its ring in
/// the ≥ 0.26 layout (`["", topic, seq, payload]`, end `["", "", ff×8, ""]`).
pub struct Publisher {
    pub socket: PubSocket,
    pub ring: Ring,
    pub next: u64,
    pub pub_addr: SocketAddr,
    pub replay_addr: SocketAddr,
    pub replay_task: tokio::task::JoinHandle<()>,
}

/// The address of a bound `tcp://host:port` endpoint.
pub fn tcp_addr(ep: &impl std::fmt::Display) -> SocketAddr {
    let text = ep.to_string();
    text.trim_start_matches("tcp://")
        .parse()
        .unwrap_or_else(|e| panic!("{text}: {e}"))
}

impl Publisher {
    pub async fn start() -> Self {
        let mut socket = PubSocket::new();
        let ep = socket.bind("tcp://127.0.0.1:0").await.expect("bind pub");
        let pub_addr = tcp_addr(&ep);
        let mut router = RouterSocket::new();
        let ep = router.bind("tcp://127.0.0.1:0").await.expect("bind router");
        let replay_addr = tcp_addr(&ep);
        let ring: Ring = Arc::default();
        let served = Arc::clone(&ring);
        let replay_task = tokio::spawn(async move {
            while let Ok(req) = router.recv().await {
                let frames = req.into_vec();
                let [id, empty, seq] = &frames[..] else {
                    continue;
                };
                assert!(empty.is_empty(), "the DEALER must send the empty delimiter");
                let start = u64::from_be_bytes(seq[..].try_into().expect("8-byte seq"));
                let entries: Vec<_> = served
                    .lock()
                    .await
                    .iter()
                    .filter(|(s, _)| *s >= start)
                    .cloned()
                    .collect();
                for (s, payload) in entries {
                    let msg = frames_msg(vec![
                        id.clone(),
                        Bytes::new(),
                        Bytes::from_static(TOPIC),
                        Bytes::copy_from_slice(&s.to_be_bytes()),
                        Bytes::from(payload),
                    ]);
                    if router.send(msg).await.is_err() {
                        break;
                    }
                }
                let end = frames_msg(vec![
                    id.clone(),
                    Bytes::new(),
                    Bytes::new(),
                    Bytes::from_static(&[0xff; 8]),
                    Bytes::new(),
                ]);
                let _ = router.send(end).await;
            }
        });
        Self {
            socket,
            ring,
            next: 0,
            pub_addr,
            replay_addr,
            replay_task,
        }
    }

    /// Publishes one batch live (and keeps it for replay); returns its seq.
    pub async fn publish(&mut self, events: &[Vec<u8>]) -> u64 {
        self.publish_opt(events, true).await
    }

    /// As `publish`, optionally only into the ring (a live message the subscriber lost).
    pub async fn publish_opt(&mut self, events: &[Vec<u8>], live: bool) -> u64 {
        let seq = self.next;
        self.next += 1;
        let payload = mp::batch(events);
        self.ring.lock().await.push((seq, payload.clone()));
        if live {
            let msg = frames_msg(vec![
                Bytes::from_static(TOPIC),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                Bytes::from(payload),
            ]);
            self.socket.send(msg).await.expect("publish");
        }
        seq
    }

    pub async fn send_raw(&mut self, frames: Vec<Bytes>) {
        self.socket
            .send(frames_msg(frames))
            .await
            .expect("publish raw");
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.replay_task.abort();
    }
}

pub fn frames_msg(frames: Vec<Bytes>) -> ZmqMessage {
    ZmqMessage::try_from(frames).expect("frames")
}
