//! The pre-encoded vLLM KV-event stream of `kvplane bench indexer`, and the publishers that
//! send it: one ZMQ PUB per simulated engine instance plus a ROUTER that serves replays from
//! the same pre-encoded messages, both in vLLM ≥ 0.26's layouts (spec kv-indexer §4.1).
//!
//! Every message is one vLLM 0.33 `KVEventBatch` (`[ts, [events], dp_rank]`) holding the
//! prefill of one prompt: `prompt_blocks / blocks_per_event` `BlockStored` events chained by
//! their parent engine hash, each a map16-headed tagged map with the 8 fields vLLM 0.33 writes
//! (defaults omitted), exactly as `msgspec` encodes vLLM's own struct. Engine hashes are
//! arbitrary u64 values (as vLLM's, unrelated to the standard hashes), so the indexer must
//! recompute the blocks from `token_ids`.

use super::stats::mix;
use crate::transport::{Publisher, ReplayServer};
use bytes::Bytes;
use rmp::encode::{write_array_len, write_f64, write_nil, write_str, write_uint};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Shape of the stream.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    /// Tokens per block.
    pub(super) block_size: usize,
    /// Blocks per prompt.
    pub(super) prompt_blocks: usize,
    /// Blocks per `BlockStored` event.
    pub(super) blocks_per_event: usize,
    /// Seed of the token ids and engine hashes.
    pub(super) seed: u64,
}

impl Shape {
    /// The token ids of prompt `p` (ids below 65,536: msgpack uint16, like a real vocabulary).
    pub(super) fn tokens(&self, p: u64) -> Vec<u32> {
        let n = self.block_size * self.prompt_blocks;
        (0..n as u64)
            .map(|i| (mix(self.seed ^ mix(p) ^ i) % 65_536) as u32)
            .collect()
    }

    /// One message: the prefill of prompt `p`.
    pub(super) fn prompt_message(&self, p: u64, dp_rank: u64) -> Vec<u8> {
        let tokens = self.tokens(p);
        let events = self.prompt_blocks.div_ceil(self.blocks_per_event);
        let mut b = Vec::with_capacity(tokens.len() * 3 + self.prompt_blocks * 9 + events * 100);
        write_array_len(&mut b, 3).expect("vec write");
        write_f64(&mut b, 1.7e9).expect("vec write");
        write_array_len(&mut b, events as u32).expect("vec write");
        let engine = |blk: usize| mix(self.seed.rotate_left(17) ^ mix(p) ^ blk as u64);
        for e in 0..events {
            let first = e * self.blocks_per_event;
            let last = (first + self.blocks_per_event).min(self.prompt_blocks);
            b.extend_from_slice(&[0xde, 0x00, 0x08]);
            write_str(&mut b, "type").expect("vec write");
            write_str(&mut b, "BlockStored").expect("vec write");
            write_str(&mut b, "block_hashes").expect("vec write");
            write_array_len(&mut b, (last - first) as u32).expect("vec write");
            for blk in first..last {
                write_uint(&mut b, engine(blk)).expect("vec write");
            }
            write_str(&mut b, "parent_block_hash").expect("vec write");
            if first == 0 {
                write_nil(&mut b).expect("vec write");
            } else {
                write_uint(&mut b, engine(first - 1)).expect("vec write");
            }
            write_str(&mut b, "token_ids").expect("vec write");
            let toks = &tokens[first * self.block_size..last * self.block_size];
            write_array_len(&mut b, toks.len() as u32).expect("vec write");
            for t in toks {
                write_uint(&mut b, u64::from(*t)).expect("vec write");
            }
            write_str(&mut b, "block_size").expect("vec write");
            write_uint(&mut b, self.block_size as u64).expect("vec write");
            write_str(&mut b, "lora_id").expect("vec write");
            write_nil(&mut b).expect("vec write");
            write_str(&mut b, "medium").expect("vec write");
            write_str(&mut b, "GPU").expect("vec write");
            write_str(&mut b, "lora_name").expect("vec write");
            write_nil(&mut b).expect("vec write");
        }
        write_uint(&mut b, dp_rank).expect("vec write");
        b
    }
}

/// One simulated engine: its PUB socket, its replay ROUTER and its pre-encoded messages
/// (message `i` has sequence number `i`).
pub(super) struct EnginePublisher {
    socket: Publisher,
    /// `tcp://127.0.0.1:port` of the PUB socket.
    pub(super) endpoint: String,
    /// `tcp://127.0.0.1:port` of the replay ROUTER.
    pub(super) replay_endpoint: String,
    messages: Arc<Vec<Bytes>>,
    /// Messages published so far (the replay serves only those, as a real ring does).
    published: Arc<AtomicUsize>,
    next: usize,
    replay_task: tokio::task::JoinHandle<()>,
}

/// Serves vLLM's replay requests on `router` until it closes (or a reply cannot be sent): to
/// `[identity, empty, start]`, each of `entries(start)` (sequence, payload) as `[identity,
/// empty, topic, sequence (8 bytes, big-endian), payload]`, then the end marker `[identity,
/// empty, empty, 0xff × 8 (`u64::MAX`), empty]`.
pub(super) async fn serve_replays(
    mut router: ReplayServer,
    topic: Bytes,
    entries: impl Fn(u64) -> Vec<(u64, Bytes)>,
) {
    while let Ok(f) = router.recv().await {
        let [id, _empty, seq] = &f[..] else { continue };
        let Ok(start) = <[u8; 8]>::try_from(&seq[..]) else {
            continue;
        };
        let reply = |topic: &Bytes, seq: u64, payload: Bytes| {
            let seq = Bytes::copy_from_slice(&seq.to_be_bytes());
            vec![id.clone(), Bytes::new(), topic.clone(), seq, payload]
        };
        for (s, payload) in entries(u64::from_be_bytes(start)) {
            if router.send(reply(&topic, s, payload)).await.is_err() {
                return;
            }
        }
        let end = reply(&Bytes::new(), u64::MAX, Bytes::new());
        let _ = router.send(end).await;
    }
}

impl EnginePublisher {
    /// Binds both sockets on 127.0.0.1 (ephemeral ports) and starts serving replays.
    ///
    /// # Errors
    /// A bind failure.
    pub(super) async fn start(messages: Vec<Bytes>) -> Result<Self, String> {
        let (socket, pub_addr) = Publisher::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("bind PUB: {e}"))?;
        let endpoint = format!("tcp://{pub_addr}");
        let (router, router_addr) = ReplayServer::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("bind ROUTER: {e}"))?;
        let replay_endpoint = format!("tcp://{router_addr}");
        let messages = Arc::new(messages);
        let served = Arc::clone(&messages);
        let published = Arc::new(AtomicUsize::new(0));
        let upto = Arc::clone(&published);
        let replay_task = tokio::spawn(serve_replays(router, Bytes::new(), move |start| {
            let end = upto.load(Ordering::Acquire);
            served
                .iter()
                .enumerate()
                .take(end)
                .skip(start as usize)
                .map(|(s, payload)| (s as u64, payload.clone()))
                .collect()
        }));
        Ok(Self {
            socket,
            endpoint,
            replay_endpoint,
            messages,
            published,
            next: 0,
            replay_task,
        })
    }

    /// Publishes the next `n` messages (fewer at the end); returns how many were sent.
    ///
    /// # Errors
    /// A send failure.
    pub(super) async fn publish(&mut self, n: usize) -> Result<usize, String> {
        let end = (self.next + n).min(self.messages.len());
        for seq in self.next..end {
            // Counted before the send: a replay asked after the live message arrived serves it.
            self.published.store(seq + 1, Ordering::Release);
            self.send(seq).await?;
        }
        let sent = end - self.next;
        self.next = end;
        Ok(sent)
    }

    /// Sends the last published message again, same sequence number: for a probe a
    /// subscriber that joined late missed (a PUB drops what it sends before the SUB's
    /// subscription reaches it, and a replay asked before the send found nothing to serve).
    pub(super) async fn republish_last(&mut self) -> Result<(), String> {
        match self.next.checked_sub(1) {
            Some(seq) => self.send(seq).await,
            None => Ok(()),
        }
    }

    /// Sends message `seq` under its sequence number.
    async fn send(&mut self, seq: usize) -> Result<(), String> {
        let msg = vec![
            Bytes::new(),
            Bytes::copy_from_slice(&(seq as u64).to_be_bytes()),
            self.messages[seq].clone(),
        ];
        self.socket
            .send(msg)
            .await
            .map_err(|e| format!("publish: {e}"))
    }
}

impl Drop for EnginePublisher {
    fn drop(&mut self) {
        self.replay_task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_is_one_batch_of_chained_map16_block_stored_events() {
        let shape = Shape {
            block_size: 4,
            prompt_blocks: 6,
            blocks_per_event: 4,
            seed: 9,
        };
        let msg = shape.prompt_message(3, 0);
        let v: serde_json::Value = rmp_serde::from_slice(&msg).expect("msgpack");
        let events = v[1].as_array().expect("events");
        assert_eq!(v.as_array().map(Vec::len), Some(3));
        assert_eq!(events.len(), 2);
        assert_eq!(events[0]["type"], "BlockStored");
        assert_eq!(events[0]["block_hashes"].as_array().map(Vec::len), Some(4));
        assert_eq!(events[1]["parent_block_hash"], events[0]["block_hashes"][3]);
        assert!(events[0]["parent_block_hash"].is_null());
        let toks: Vec<u64> = events
            .iter()
            .flat_map(|e| e["token_ids"].as_array().expect("tokens").clone())
            .map(|t| t.as_u64().expect("u64"))
            .collect();
        let want: Vec<u64> = shape.tokens(3).into_iter().map(u64::from).collect();
        assert_eq!(toks, want);
        assert_eq!(msg[msg.len() - 1], 0, "dp_rank 0 last");
        // The map16 header vLLM 0.33 writes for its 15-field struct.
        let at = msg.windows(3).position(|w| w == [0xde, 0x00, 0x08]);
        assert!(at.is_some());
        assert_ne!(shape.tokens(3), shape.tokens(4));
    }
}
