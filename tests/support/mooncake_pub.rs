//! A Mooncake master's KV-event publisher for tests, its frames built exactly as
//! `mooncake-store/src/kv_event/kv_event_publisher.cpp` (kvcache-ai/Mooncake `main`@3b5a594)
//! packs them with its defaults (`emit_legacy_compat_fields` and `emit_object_key` on): a
//! bound PUB socket, messages `["" topic, seq u64 big-endian from 1, payload]`, the payload
//! `[timestamp_ms int64, [event map…], 0 uint32]`, one event map per object key with the
//! fields in the publisher's order. The master's PyPI wheels are built without its ZMQ
//! publisher (`MOONCAKE_ENABLE_KV_EVENTS` off: docs/INDEXER.md, "Mooncake envelope"), so no
//! real one runs here.

use super::vllm_pub::{frames_msg, tcp_addr};
use bytes::Bytes;
use rmp::encode::{write_array_len, write_map_len, write_nil, write_sint, write_str, write_uint};
use std::net::SocketAddr;
use zeromq::prelude::*;
use zeromq::PubSocket;

/// One object event as the master queues it (`PendingEvent`) with the id it is given.
pub struct ObjectEvent<'a> {
    /// `event_id`.
    pub id: u64,
    /// `stored` or `removed`.
    pub stored: bool,
    /// `backend_id` (the master's `kv_events_backend_id`).
    pub backend: &'a str,
    /// `tenant_id`.
    pub tenant: &'a str,
    /// `medium`: `cpu` or `disk`.
    pub medium: &'a str,
    /// The object key, a decimal seq hash (so `seq_hashes` is `[hash]`).
    pub hash: u64,
}

/// The event map, field for field as `PublishBatch` packs it.
pub fn event_map(e: &ObjectEvent<'_>) -> Vec<u8> {
    let mut b = Vec::new();
    // Base 13 + legacy `type` and `block_hashes` + `object_key`, then the payload fields.
    write_map_len(&mut b, if e.stored { 20 } else { 17 }).unwrap();
    let s = |b: &mut Vec<u8>, k: &str, v: &str| {
        write_str(b, k).unwrap();
        write_str(b, v).unwrap();
    };
    let nil = |b: &mut Vec<u8>, k: &str| {
        write_str(b, k).unwrap();
        write_nil(b).unwrap();
    };
    write_str(&mut b, "event_id").unwrap();
    write_uint(&mut b, e.id).unwrap();
    write_str(&mut b, "timestamp").unwrap();
    write_sint(&mut b, 1_764_200_000_000).unwrap();
    s(
        &mut b,
        "event_type",
        if e.stored { "stored" } else { "removed" },
    );
    s(
        &mut b,
        "type",
        if e.stored {
            "BlockStored"
        } else {
            "BlockRemoved"
        },
    );
    for k in ["model_name", "block_size", "additional_salt", "lora_name"] {
        nil(&mut b, k);
    }
    s(&mut b, "tenant_id", e.tenant);
    s(&mut b, "backend_id", e.backend);
    nil(&mut b, "group_id");
    s(&mut b, "medium", e.medium);
    nil(&mut b, "dp_rank");
    s(&mut b, "object_key", &e.hash.to_string());
    write_str(&mut b, "seq_hashes").unwrap();
    write_array_len(&mut b, 1).unwrap();
    write_uint(&mut b, e.hash).unwrap();
    // The legacy alias is packed as int64.
    write_str(&mut b, "block_hashes").unwrap();
    write_array_len(&mut b, 1).unwrap();
    write_sint(&mut b, e.hash as i64).unwrap();
    write_str(&mut b, "base_block_idx").unwrap();
    if e.stored {
        write_uint(&mut b, 0).unwrap();
        nil(&mut b, "parent_hash");
        nil(&mut b, "token_ids");
        nil(&mut b, "parent_block_hash");
    } else {
        write_nil(&mut b).unwrap();
    }
    b
}

/// A master's publisher: a bound PUB socket and its next ZMQ sequence number.
pub struct MasterPublisher {
    socket: PubSocket,
    next_seq: u64,
    /// The bound address (`tcp://` + this is the endpoint to register).
    pub addr: SocketAddr,
}

impl MasterPublisher {
    pub async fn bind() -> Self {
        let mut socket = PubSocket::new();
        let ep = socket.bind("tcp://127.0.0.1:0").await.expect("bind pub");
        let addr = tcp_addr(&ep);
        Self {
            socket,
            next_seq: 1,
            addr,
        }
    }

    /// Publishes one batch of pre-built event maps (a malformed one may be among them).
    pub async fn publish_maps(&mut self, maps: &[Vec<u8>]) {
        let mut payload = Vec::new();
        write_array_len(&mut payload, 3).unwrap();
        write_sint(&mut payload, 1_764_200_000_000).unwrap();
        write_array_len(&mut payload, maps.len() as u32).unwrap();
        for m in maps {
            payload.extend_from_slice(m);
        }
        write_uint(&mut payload, 0).unwrap();
        let seq = self.next_seq;
        self.next_seq += 1;
        let msg = frames_msg(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            Bytes::from(payload),
        ]);
        self.socket.send(msg).await.expect("publish");
    }

    /// Publishes one batch of object events.
    pub async fn publish(&mut self, events: &[ObjectEvent<'_>]) {
        let maps: Vec<Vec<u8>> = events.iter().map(event_map).collect();
        self.publish_maps(&maps).await;
    }
}
