//! Codec throughput: encode and decode of 50-op `BatchedKVOperationMsg` batches (what an LMCache
//! worker sends), reported as ops/s (elements) and bytes/s.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use kvplane::protocol::{
    decode, decode_batch, encode, BatchedKVOperationMsg, ChunkHash, KVOpEvent, Msg, OpType,
};

fn batch(ops: usize, seed: u64) -> Msg {
    let operations = (0..ops as u64)
        .map(|i| KVOpEvent {
            op_type: if i % 5 == 4 {
                OpType::Evict
            } else {
                OpType::Admit
            },
            // Spread over the u64 range like digest-style hashes (9-byte msgpack ints).
            key: ChunkHash::from_u64((seed ^ i).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            seq_num: i as i64 + 1_000,
        })
        .collect();
    Msg::BatchedKVOperationMsg(BatchedKVOperationMsg {
        instance_id: "vllm-instance-0".into(),
        worker_id: 3,
        location: "LocalCPUBackend".into(),
        operations,
    })
}

fn codec(c: &mut Criterion) {
    let msg = batch(50, 7);
    let bytes = encode(&msg);
    let mut g = c.benchmark_group("codec/batch50");
    g.throughput(Throughput::Elements(50));
    g.bench_function("decode (ops)", |b| b.iter(|| decode(black_box(&bytes))));
    let mut ops = Vec::with_capacity(64);
    g.bench_function("decode_batch fast path (ops)", |b| {
        b.iter(|| {
            ops.clear();
            decode_batch(black_box(&bytes), &mut ops).map(|v| v.worker_id)
        })
    });
    g.bench_function("encode (ops)", |b| b.iter(|| encode(black_box(&msg))));
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    g.bench_function("decode (bytes)", |b| b.iter(|| decode(black_box(&bytes))));
    g.bench_function("decode_batch fast path (bytes)", |b| {
        b.iter(|| {
            ops.clear();
            decode_batch(black_box(&bytes), &mut ops).map(|v| v.worker_id)
        })
    });
    g.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);
