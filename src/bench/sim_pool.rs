//! The paged KV pool of a simulated engine (`kvplane bench route`), pure: whole blocks keyed
//! by a chained block hash (the engine's own, as vLLM's), prefix caching, LRU eviction that
//! frees a prompt's tail first (vLLM frees a request's blocks in reverse order), and the vLLM
//! KV events each admission causes, encoded as vLLM 0.33's msgspec structs (`BlockStored`
//! tagged map16 with its 8 fields, `BlockRemoved`, the `[ts, [events], dp_rank]` batch). No
//! I/O, no clock: the engine process ([`super::sim_engine`]) owns the sockets and the time.

use super::stats::mix;
use rmp::encode::{write_array_len, write_f64, write_map_len, write_nil, write_str, write_uint};
use std::collections::{BTreeMap, HashMap};

/// The engine hashes of a prompt's whole blocks: block `i`'s hash is a fixed function of
/// block `i − 1`'s hash and its own tokens, so equal hashes mean equal prefixes.
pub fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<u64> {
    let bs = block_size.max(1);
    let mut parent = 0x6b76_706c_616e_6500_u64;
    tokens
        .chunks_exact(bs)
        .map(|block| {
            let mut h = mix(parent);
            for &t in block {
                h = mix(h ^ u64::from(t));
            }
            parent = h;
            h
        })
        .collect()
}

/// What vLLM reuses of a prompt of `prompt_tokens` whose first `blocks` blocks are cached:
/// whole blocks, never the last token (it computes one to sample).
pub fn cached_tokens(blocks: usize, prompt_tokens: usize, block_size: usize) -> usize {
    let bs = block_size.max(1);
    (blocks * bs).min(prompt_tokens.saturating_sub(1) / bs * bs)
}

/// What one admission did to the pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Admission {
    /// Leading blocks found cached.
    pub hit_blocks: usize,
    /// Runs of newly stored blocks: (first block index, one past the last).
    pub stored: Vec<(usize, usize)>,
    /// Engine hashes evicted to make room.
    pub evicted: Vec<u64>,
}

/// A pool of `capacity` blocks with LRU eviction.
#[derive(Debug)]
pub struct Pool {
    capacity: usize,
    /// Hash → its LRU stamp.
    blocks: HashMap<u64, u64>,
    /// LRU stamp → hash, oldest first.
    order: BTreeMap<u64, u64>,
    clock: u64,
    /// Blocks evicted since the start.
    pub evictions: u64,
}

impl Pool {
    /// An empty pool of `capacity` blocks (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            blocks: HashMap::new(),
            order: BTreeMap::new(),
            clock: 0,
            evictions: 0,
        }
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// True when no block is held.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Leading blocks of `hashes` held now (reads only).
    pub fn prefix(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.blocks.contains_key(h))
            .count()
    }

    fn stamp(&mut self, h: u64, stamp: u64) {
        if let Some(old) = self.blocks.insert(h, stamp) {
            self.order.remove(&old);
        }
        self.order.insert(stamp, h);
    }

    /// Admits a prompt's blocks: counts the cached prefix, stores the rest (at most
    /// `capacity` blocks of the prompt), evicting the least recently used. The prompt's
    /// blocks are stamped so its first block is the most recent: its tail goes first.
    pub fn admit(&mut self, hashes: &[u64]) -> Admission {
        let hit_blocks = self.prefix(hashes);
        let keep = hashes.len().min(self.capacity);
        let base = self.clock;
        self.clock += keep as u64 + 1;
        let mut out = Admission {
            hit_blocks,
            ..Admission::default()
        };
        let mut run: Option<usize> = None;
        for (i, &h) in hashes.iter().enumerate().take(keep) {
            let stamp = base + (keep - i) as u64;
            if self.blocks.contains_key(&h) {
                if let Some(start) = run.take() {
                    out.stored.push((start, i));
                }
                self.stamp(h, stamp);
                continue;
            }
            while self.blocks.len() >= self.capacity {
                let Some((_, victim)) = self.order.pop_first() else {
                    break;
                };
                self.blocks.remove(&victim);
                self.evictions += 1;
                out.evicted.push(victim);
            }
            self.stamp(h, stamp);
            run.get_or_insert(i);
        }
        if let Some(start) = run {
            out.stored.push((start, keep));
        }
        out
    }
}

/// One vLLM 0.33 `BlockStored` event (tagged map16, 8 fields) for blocks `hashes` of
/// `block_size` tokens `tokens`, chained to `parent`.
pub fn block_stored(
    hashes: &[u64],
    parent: Option<u64>,
    tokens: &[u32],
    block_size: usize,
) -> Vec<u8> {
    let mut b = Vec::with_capacity(tokens.len() * 3 + hashes.len() * 9 + 128);
    b.extend_from_slice(&[0xde, 0x00, 0x08]);
    write_str(&mut b, "type").expect("vec write");
    write_str(&mut b, "BlockStored").expect("vec write");
    write_str(&mut b, "block_hashes").expect("vec write");
    write_array_len(&mut b, hashes.len() as u32).expect("vec write");
    for &h in hashes {
        write_uint(&mut b, h).expect("vec write");
    }
    write_str(&mut b, "parent_block_hash").expect("vec write");
    match parent {
        Some(p) => {
            write_uint(&mut b, p).expect("vec write");
        }
        None => write_nil(&mut b).expect("vec write"),
    }
    write_str(&mut b, "token_ids").expect("vec write");
    write_array_len(&mut b, tokens.len() as u32).expect("vec write");
    for &t in tokens {
        write_uint(&mut b, u64::from(t)).expect("vec write");
    }
    write_str(&mut b, "block_size").expect("vec write");
    write_uint(&mut b, block_size as u64).expect("vec write");
    write_str(&mut b, "lora_id").expect("vec write");
    write_nil(&mut b).expect("vec write");
    write_str(&mut b, "medium").expect("vec write");
    write_str(&mut b, "GPU").expect("vec write");
    write_str(&mut b, "lora_name").expect("vec write");
    write_nil(&mut b).expect("vec write");
    b
}

/// One vLLM `BlockRemoved` event for GPU blocks `hashes`.
pub fn block_removed(hashes: &[u64]) -> Vec<u8> {
    let mut b = Vec::with_capacity(hashes.len() * 9 + 48);
    write_map_len(&mut b, 3).expect("vec write");
    write_str(&mut b, "type").expect("vec write");
    write_str(&mut b, "BlockRemoved").expect("vec write");
    write_str(&mut b, "block_hashes").expect("vec write");
    write_array_len(&mut b, hashes.len() as u32).expect("vec write");
    for &h in hashes {
        write_uint(&mut b, h).expect("vec write");
    }
    write_str(&mut b, "medium").expect("vec write");
    write_str(&mut b, "GPU").expect("vec write");
    b
}

/// The events of one admission, as one `KVEventBatch` (`[ts, [events], dp_rank 0]`):
/// removals first, then one `BlockStored` per run of new blocks. `None` when nothing changed.
pub fn admission_batch(
    a: &Admission,
    hashes: &[u64],
    tokens: &[u32],
    block_size: usize,
    ts: f64,
) -> Option<Vec<u8>> {
    let mut events = Vec::new();
    if !a.evicted.is_empty() {
        events.push(block_removed(&a.evicted));
    }
    for &(start, end) in &a.stored {
        let parent = start.checked_sub(1).map(|p| hashes[p]);
        let toks = &tokens[start * block_size..end * block_size];
        events.push(block_stored(&hashes[start..end], parent, toks, block_size));
    }
    if events.is_empty() {
        return None;
    }
    let mut b = Vec::with_capacity(events.iter().map(Vec::len).sum::<usize>() + 16);
    write_array_len(&mut b, 3).expect("vec write");
    write_f64(&mut b, ts).expect("vec write");
    write_array_len(&mut b, events.len() as u32).expect("vec write");
    for e in &events {
        b.extend_from_slice(e);
    }
    write_uint(&mut b, 0).expect("vec write");
    Some(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_chain_and_reuse_counts_whole_blocks_short_of_the_last_token() {
        let a: Vec<u32> = (0..40).collect();
        let mut b = a.clone();
        b[20] = 999;
        let (ha, hb) = (block_hashes(&a, 8), block_hashes(&b, 8));
        assert_eq!(ha.len(), 5);
        assert_eq!(ha[..2], hb[..2]);
        assert!(ha[2..].iter().zip(&hb[2..]).all(|(x, y)| x != y));
        assert_eq!(cached_tokens(5, 40, 8), 32, "never the last token");
        assert_eq!(cached_tokens(2, 40, 8), 16);
        assert_eq!(cached_tokens(5, 41, 8), 40);
    }

    #[test]
    fn lru_evicts_the_oldest_prompts_tail_first_and_reports_runs() {
        let mut p = Pool::new(6);
        let a = admit_ids(&mut p, &[1, 2, 3]);
        assert_eq!((a.hit_blocks, a.stored.clone()), (0, vec![(0, 3)]));
        let b = admit_ids(&mut p, &[1, 2, 7, 8]);
        assert_eq!((b.hit_blocks, b.stored.clone()), (2, vec![(2, 4)]));
        assert!(b.evicted.is_empty());
        assert_eq!(p.len(), 5);
        // Three new blocks, one free: the least recent go, prompt a's tail (3), then b's (8).
        let c = admit_ids(&mut p, &[9, 10, 11]);
        assert_eq!(c.evicted, vec![3, 8]);
        assert_eq!(p.prefix(&[1, 2, 7]), 3);
        assert_eq!(p.prefix(&[1, 2, 3]), 2);
        assert_eq!(p.evictions, 2);
        // A prompt larger than the pool keeps its first `capacity` blocks.
        let big: Vec<u64> = (100..110).collect();
        let d = admit_ids(&mut p, &big);
        assert_eq!(d.stored, vec![(0, 6)]);
        assert_eq!(p.prefix(&big), 6);
    }

    fn admit_ids(p: &mut Pool, ids: &[u64]) -> Admission {
        p.admit(ids)
    }

    #[test]
    fn an_admission_is_one_vllm_batch_of_removals_and_chained_stores() {
        let tokens: Vec<u32> = (0..16).collect();
        let hashes = block_hashes(&tokens, 4);
        let a = Admission {
            hit_blocks: 1,
            stored: vec![(1, 4)],
            evicted: vec![42],
        };
        let msg = admission_batch(&a, &hashes, &tokens, 4, 1.5).expect("events");
        let v: serde_json::Value = rmp_serde::from_slice(&msg).expect("msgpack");
        let events = v[1].as_array().expect("events");
        assert_eq!(events.len(), 2);
        assert_eq!(events[0]["type"], "BlockRemoved");
        assert_eq!(events[0]["block_hashes"][0], 42);
        assert_eq!(events[1]["type"], "BlockStored");
        assert_eq!(events[1]["parent_block_hash"], hashes[0]);
        assert_eq!(events[1]["token_ids"].as_array().map(Vec::len), Some(12));
        assert_eq!(events[1]["block_size"], 4);
        assert!(admission_batch(&Admission::default(), &hashes, &tokens, 4, 0.0).is_none());
    }
}
