//! KV indexer costs in process, one thread: decoding and applying a vLLM batch that stores a
//! 128-block prompt (blocks recomputed from tokens, engine-hash map updated), and `/query`'s
//! walk for a 128-block prompt with 1M blocks indexed over 8 instances. Heap bytes per
//! membership are printed from the index's own accounting.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use kvplane::indexer::events::{decode_batch, KvEvent, Medium, Stored};
use kvplane::indexer::index::{Index, IndexConfig, StreamId};
use std::time::Duration;

#[path = "support/indexer.rs"]
mod support;
use support::{prompt, scope, spec, BS, PROMPT as BLOCKS};

const INSTANCES: u32 = 8;

fn stored(p: u32) -> KvEvent {
    KvEvent::Stored(Stored {
        hashes: (0..u64::from(BLOCKS))
            .map(|b| (u64::from(p) << 20) | b)
            .collect(),
        tokens: prompt(p),
        block_size: BS,
        medium: Medium::Gpu,
        ..Stored::default()
    })
}

/// The msgpack of a vLLM 0.33 batch storing prompt `p` (map16 header, int hashes).
fn vllm_batch(p: u32) -> Vec<u8> {
    use rmp::encode::*;
    let mut b = Vec::new();
    write_array_len(&mut b, 3).unwrap();
    write_f64(&mut b, 1.5).unwrap();
    write_array_len(&mut b, 1).unwrap();
    b.extend_from_slice(&[0xde, 0x00, 0x08]);
    write_str(&mut b, "type").unwrap();
    write_str(&mut b, "BlockStored").unwrap();
    write_str(&mut b, "block_hashes").unwrap();
    write_array_len(&mut b, BLOCKS).unwrap();
    for h in 0..u64::from(BLOCKS) {
        write_uint(&mut b, (u64::from(p) << 20) | h).unwrap();
    }
    write_str(&mut b, "parent_block_hash").unwrap();
    write_nil(&mut b).unwrap();
    write_str(&mut b, "token_ids").unwrap();
    let toks = prompt(p);
    write_array_len(&mut b, toks.len() as u32).unwrap();
    for t in toks {
        write_uint(&mut b, u64::from(t)).unwrap();
    }
    write_str(&mut b, "block_size").unwrap();
    write_uint(&mut b, u64::from(BS)).unwrap();
    for k in ["lora_id", "medium", "lora_name"] {
        write_str(&mut b, k).unwrap();
        if k == "medium" {
            write_str(&mut b, "GPU").unwrap();
        } else {
            write_nil(&mut b).unwrap();
        }
    }
    write_uint(&mut b, 0).unwrap();
    b
}

fn filled(blocks: u32) -> (Index, Vec<StreamId>) {
    let mut index = Index::new(IndexConfig::default());
    let streams: Vec<StreamId> = (0..INSTANCES)
        .map(|i| index.add_stream(spec(i)).expect("a stream"))
        .collect();
    for p in 0..blocks / BLOCKS {
        index.apply(streams[(p % INSTANCES) as usize], &stored(p), 0);
    }
    (index, streams)
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("indexer");
    g.measurement_time(Duration::from_secs(3)).sample_size(20);
    g.throughput(Throughput::Elements(u64::from(BLOCKS)));
    let (mut index, streams) = filled(1 << 20);
    println!(
        "1M blocks: {} memberships, {:.1} heap B/membership (arena and id tables)",
        index.memberships(),
        index.heap_bytes() as f64 / index.memberships() as f64
    );
    let mut p = 1_000_000u32;
    g.bench_function("decode+apply vLLM batch, 128 new blocks, at 1M", |b| {
        b.iter(|| {
            p += 1;
            let bytes = vllm_batch(p);
            let batch = decode_batch(black_box(&bytes)).expect("decodes");
            for e in &batch.events {
                index.apply(streams[0], e, 0);
            }
        })
    });
    let scope = scope();
    let hit = prompt(77);
    g.bench_function("query 128-block prompt, full hit, at 1M", |b| {
        b.iter(|| black_box(index.query_tokens(&scope, black_box(&hit))))
    });
    let miss = prompt(u32::MAX - 5);
    g.bench_function("query 128-block prompt, miss, at 1M", |b| {
        b.iter(|| black_box(index.query_tokens(&scope, black_box(&miss))))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
