//! Simulated workers for the load generator: registration, pre-encoded op streams, cleanup.

use super::stats::mix;
use crate::protocol::{
    encode, BatchedKVOperationMsg, ChunkHash, DeRegisterMsg, HeartbeatMsg, KVOpEvent, Msg, OpType,
    RegisterMsg,
};
use crate::transport::{DealerClient, PushSender};
use bytes::Bytes;
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// The location every simulated op uses (LMCache's hot CPU cache).
pub(super) const LOCATION: &str = "LocalCPUBackend";

/// Timeout of every request the load generator sends.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A simulated worker identity.
#[derive(Clone, Debug)]
pub(super) struct SimWorker {
    /// Instance id.
    pub instance_id: String,
    /// Worker id.
    pub worker_id: i64,
    /// Command port it claims (nothing listens there; no command is ever sent in a bench).
    pub port: i64,
}

impl SimWorker {
    /// `count` workers named `{prefix}-{i}`, one per instance, worker id 0.
    pub(super) fn many(prefix: &str, count: usize) -> Vec<SimWorker> {
        (0..count)
            .map(|i| SimWorker {
                instance_id: format!("{prefix}-{i}"),
                worker_id: 0,
                port: 1,
            })
            .collect()
    }

    /// The `HeartbeatMsg` of this worker, encoded.
    pub(super) fn heartbeat_frame(&self) -> Bytes {
        Bytes::from(encode(&Msg::HeartbeatMsg(HeartbeatMsg {
            instance_id: self.instance_id.clone(),
            worker_id: self.worker_id,
            ip: "127.0.0.1".into(),
            port: self.port,
            peer_init_url: None,
            distributed_url: None,
        })))
    }

    /// The `RegisterMsg` of this worker.
    pub(super) fn register_msg(&self, peer_init_url: Option<String>) -> Msg {
        Msg::RegisterMsg(RegisterMsg {
            instance_id: self.instance_id.clone(),
            worker_id: self.worker_id,
            ip: "127.0.0.1".into(),
            port: self.port,
            peer_init_url,
            distributed_url: None,
        })
    }
}

/// Registers `workers` over one DEALER; returns the `heartbeat_url` the controller gave.
///
/// # Errors
/// A message naming the worker whose registration failed.
pub(super) async fn register_all(
    reply: &str,
    workers: &[SimWorker],
) -> Result<Option<String>, String> {
    let mut dealer = DealerClient::new(reply.to_owned(), REQUEST_TIMEOUT);
    let mut heartbeat_url = None;
    for w in workers {
        let peer = Some(format!(
            "127.0.0.1:{}",
            20000 + (w.instance_id.len() % 1000)
        ));
        let answer = dealer
            .request(Bytes::from(encode(&w.register_msg(peer))))
            .await
            .map_err(|e| format!("register {}: {e}", w.instance_id))?;
        match crate::protocol::decode(&answer) {
            Ok(Msg::RegisterRetMsg(r)) => {
                heartbeat_url = r.extra_config.get("heartbeat_url").cloned()
            }
            other => {
                return Err(format!(
                    "register {}: unexpected answer {other:?}",
                    w.instance_id
                ))
            }
        }
    }
    Ok(heartbeat_url)
}

/// Sends a `DeRegisterMsg` for every worker, so repeated runs start clean, and keeps the PUSH
/// socket open until `/controller/key-stats` no longer lists them (at most 10 s): a PUSH send
/// only queues the frame locally, and dropping the socket at once could discard it.
pub(super) async fn deregister_all(pull: &str, http_base: &str, workers: &[SimWorker]) {
    let mut push = PushSender::new(pull.to_owned());
    for w in workers {
        let msg = Msg::DeRegisterMsg(DeRegisterMsg {
            instance_id: w.instance_id.clone(),
            worker_id: w.worker_id,
            ip: "127.0.0.1".into(),
            port: w.port,
        });
        let _ = push
            .send(vec![Bytes::from(encode(&msg))], REQUEST_TIMEOUT)
            .await;
    }
    let ours: HashSet<&str> = workers.iter().map(|w| w.instance_id.as_str()).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let stats =
            super::http::get_json(http_base, "/controller/key-stats", Duration::from_secs(5));
        if let Ok(v) = stats.await {
            let listed = v["instances"].as_array().map_or(0, |all| {
                all.iter()
                    .filter(|i| {
                        i["instance_id"]
                            .as_str()
                            .is_some_and(|id| ours.contains(id))
                    })
                    .count()
            });
            if listed == 0 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A synthetic chunk hash, unique per (run, worker, index), spread over the whole u64 range.
pub(super) fn key(run: u64, worker: usize, i: u64) -> ChunkHash {
    ChunkHash::from_u64(mix(run
        ^ mix(worker as u64)
        ^ i.wrapping_mul(0x1000_0000_01b3)))
}

/// One worker's pre-encoded op stream.
pub(super) struct OpStream {
    /// An empty batch of this worker, sent first to connect the socket (applies nothing).
    pub warmup: Bytes,
    /// Multipart sends, each a list of frames (each frame one batch).
    pub sends: Vec<Vec<Bytes>>,
    /// Ops in the stream.
    pub ops: u64,
    /// Net keys the stream leaves on the controller.
    pub net_keys: u64,
}

/// Builds a worker's stream of `batches` batches of `batch` ops: every batch after the first
/// evicts `evicts` keys admitted by the previous batch, so the key count grows monotonically
/// per batch and "all applied" is detectable from the count.
pub(super) fn op_stream(
    run: u64,
    worker: &SimWorker,
    worker_index: usize,
    batches: usize,
    batch: usize,
    evicts: usize,
    frames_per_send: usize,
) -> OpStream {
    let evicts = evicts.min(batch / 2);
    let mut next_key = 0u64;
    let mut seq = 0i64;
    let mut previous: Vec<ChunkHash> = Vec::new();
    let mut frames = Vec::with_capacity(batches);
    let (mut ops, mut net) = (0u64, 0u64);
    for b in 0..batches {
        let evict_now = if b == 0 { 0 } else { evicts };
        let mut operations = Vec::with_capacity(batch);
        let mut admitted = Vec::with_capacity(batch);
        for _ in 0..batch - evict_now {
            let k = key(run, worker_index, next_key);
            next_key += 1;
            admitted.push(k);
            operations.push(KVOpEvent {
                op_type: OpType::Admit,
                key: k,
                seq_num: seq,
            });
            seq += 1;
        }
        for k in previous.iter().take(evict_now) {
            operations.push(KVOpEvent {
                op_type: OpType::Evict,
                key: *k,
                seq_num: seq,
            });
            seq += 1;
        }
        ops += operations.len() as u64;
        net += (batch - 2 * evict_now) as u64;
        previous = admitted;
        let msg = Msg::BatchedKVOperationMsg(BatchedKVOperationMsg {
            instance_id: worker.instance_id.clone(),
            worker_id: worker.worker_id,
            location: LOCATION.into(),
            operations,
        });
        frames.push(Bytes::from(encode(&msg)));
    }
    let sends = frames
        .chunks(frames_per_send.max(1))
        .map(<[Bytes]>::to_vec)
        .collect();
    let warmup = Bytes::from(encode(&Msg::BatchedKVOperationMsg(BatchedKVOperationMsg {
        instance_id: worker.instance_id.clone(),
        worker_id: worker.worker_id,
        location: LOCATION.into(),
        operations: Vec::new(),
    })));
    OpStream {
        warmup,
        sends,
        ops,
        net_keys: net,
    }
}

/// [`op_stream`] for every worker of `workers`: `batches` batches each.
pub(super) fn streams(
    run: u64,
    workers: &[SimWorker],
    batches: usize,
    batch: usize,
    evicts: usize,
    frames_per_send: usize,
) -> Vec<OpStream> {
    workers
        .iter()
        .enumerate()
        .map(|(i, w)| op_stream(run, w, i, batches, batch, evicts, frames_per_send))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_stream_counts_add_up_and_the_count_never_drops() {
        let w = SimWorker::many("t", 1).remove(0);
        let s = op_stream(7, &w, 0, 10, 50, 10, 3);
        assert_eq!(s.ops, 500);
        assert_eq!(s.net_keys, 50 + 9 * 30);
        assert_eq!(s.sends.len(), 4);
        let mut held = std::collections::HashSet::new();
        let mut last = 0;
        for frame in s.sends.iter().flatten() {
            let Ok(Msg::BatchedKVOperationMsg(m)) = crate::protocol::decode(frame) else {
                panic!()
            };
            for op in m.operations {
                match op.op_type {
                    OpType::Admit => assert!(held.insert(op.key)),
                    OpType::Evict => assert!(held.remove(&op.key)),
                }
            }
            assert!(held.len() >= last);
            last = held.len();
        }
        assert_eq!(held.len() as u64, s.net_keys);
    }
}
