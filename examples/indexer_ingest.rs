//! The indexer's index alone, in process, one thread: how long applying BLOCKS blocks takes
//! (vLLM-like stores of 128-block prompts over 4 streams, each prompt 8 events of 16 blocks
//! chained by parent engine hash, as `kvplane bench indexer` publishes them) and what the
//! index then holds, with no sockets, decoding or locks. For A/B runs of the index's data
//! structures: `scripts/bench-indexer.sh` is the figure that counts.
//!
//!     cargo run --release --example indexer_ingest -- 10485760 3
use kvplane::indexer::events::{KvEvent, Medium, Stored};
use kvplane::indexer::index::{Index, IndexConfig};
use std::time::Instant;

#[path = "../benches/support/indexer.rs"]
mod support;
use support::{prompt, scope, spec, BS, PROMPT};

const EVENT: u32 = 16;
const STREAMS: u32 = 4;

/// The events storing prompt `p`: engine hashes arbitrary (as vLLM's), chained by parent.
fn events(p: u32) -> Vec<KvEvent> {
    let toks = prompt(p);
    let hash = |b: u32| (u64::from(p) << 24 | u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..PROMPT / EVENT)
        .map(|e| {
            let from = e * EVENT;
            KvEvent::Stored(Stored {
                hashes: (from..from + EVENT).map(hash).collect(),
                parent: (from > 0).then(|| hash(from - 1)),
                tokens: toks[(from * BS) as usize..((from + EVENT) * BS) as usize].to_vec(),
                block_size: BS,
                medium: Medium::Gpu,
                ..Stored::default()
            })
        })
        .collect()
}

fn main() {
    let blocks: u32 = std::env::args()
        .nth(1)
        .map_or(10_485_760, |a| a.parse().expect("BLOCKS"));
    let rounds: u32 = std::env::args()
        .nth(2)
        .map_or(3, |a| a.parse().expect("ROUNDS"));
    let prompts = blocks / PROMPT;
    // Built before the clock starts, as the bench pre-encodes its stream.
    let batches: Vec<Vec<KvEvent>> = (0..prompts).map(events).collect();
    for round in 0..rounds {
        let mut ix = Index::new(IndexConfig {
            max_memberships: blocks as usize + 1,
            ..IndexConfig::default()
        });
        let ids: Vec<_> = (0..STREAMS)
            .map(|i| ix.add_stream(spec(i)).expect("a stream"))
            .collect();
        let t = Instant::now();
        for (p, evs) in batches.iter().enumerate() {
            for e in evs {
                ix.apply(ids[p % STREAMS as usize], e, 0);
            }
        }
        let secs = t.elapsed().as_secs_f64();
        let scope = scope();
        let q = Instant::now();
        let n = 20_000u32;
        let mut hits = 0u64;
        for i in 0..n {
            let p = i.wrapping_mul(7919) % prompts;
            let got = ix.query_tokens(&scope, &prompt(p));
            hits += got.values().map(|m| m.longest_matched).max().unwrap_or(0) / u64::from(BS);
        }
        let per_query = q.elapsed().as_secs_f64() / f64::from(n);
        assert_eq!(
            hits,
            u64::from(n) * u64::from(PROMPT),
            "every query a full hit"
        );
        println!(
            "round {round}: {blocks} blocks applied in {secs:.3} s ({:.0} ns a block, {:.2}M \
             blocks/s); {:.1} heap B/membership, {} chain heads; query (with hashing) {:.1} µs",
            secs * 1e9 / f64::from(blocks),
            f64::from(blocks) / secs / 1e6,
            ix.heap_bytes() as f64 / ix.memberships() as f64,
            ix.chain_heads(),
            per_query * 1e6,
        );
    }
}
