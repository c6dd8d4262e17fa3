//! Chunk index costs in process, one thread: applying 50-op batches, and P2P lookups of 100-hash
//! prefixes with 1M and 10M keys indexed. Bytes per membership are printed from the index's own
//! accounting (`memory_stats`); RSS is measured by `kvplane bench --pid` (docs/BENCHMARKS.md).

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvplane::controller::model::index::ChunkIndex;
use kvplane::protocol::{ChunkHash, KVOpEvent, OpType};

const LOC: &str = "LocalCPUBackend";
const HOLDERS: i64 = 10;

fn key(holder: i64, i: u64) -> ChunkHash {
    let x = (holder as u64) << 40 ^ i;
    ChunkHash::from_u64(x.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (x >> 17))
}

fn admits(holder: i64, from: u64, n: u64, seq: &mut i64) -> Vec<KVOpEvent> {
    (from..from + n)
        .map(|i| {
            *seq += 1;
            KVOpEvent {
                op_type: OpType::Admit,
                key: key(holder, i),
                seq_num: *seq,
            }
        })
        .collect()
}

/// An index with `keys` keys spread over ten holders as 100-hash prefix chains.
fn filled(keys: u64) -> ChunkIndex {
    let mut index = ChunkIndex::new();
    for h in 0..HOLDERS {
        let peer = format!("127.0.0.1:{}", 7000 + h);
        index
            .register(
                &format!("inst-{h}"),
                0,
                "127.0.0.1",
                8000,
                Some(peer.as_str()),
                0.0,
            )
            .expect("register");
    }
    let per = keys / HOLDERS as u64;
    for h in 0..HOLDERS {
        let mut seq = -1;
        let mut i = 0;
        while i < per {
            let ops = admits(h, i, 50.min(per - i), &mut seq);
            index.apply_batch(&format!("inst-{h}"), 0, LOC, &ops, 0.0);
            i += 50;
        }
    }
    index
}

fn apply(c: &mut Criterion) {
    let mut g = c.benchmark_group("index/apply");
    g.throughput(Throughput::Elements(50));
    let mut index = filled(1_000_000);
    let mut seq = 1_000_000;
    let mut next = 10_000_000u64;
    let mut oldest = 0u64;
    // Steady state, like a full cache: 25 admits of new keys + 25 evicts of the oldest keys,
    // so the index stays at 1M keys however long criterion runs (a growing table would
    // measure rehashes instead).
    g.bench_function("batch50 at 1M keys (25 admits + 25 evicts)", |b| {
        b.iter_batched(
            || {
                let mut ops = admits(0, next, 25, &mut seq);
                for i in oldest..oldest + 25 {
                    seq += 1;
                    ops.push(KVOpEvent {
                        op_type: OpType::Evict,
                        key: key(0, i),
                        seq_num: seq,
                    });
                }
                next += 25;
                oldest = if oldest + 25 >= 100_000 {
                    10_000_000
                } else {
                    oldest + 25
                };
                ops
            },
            |ops| index.apply_batch("inst-0", 0, LOC, &ops, 0.0),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn lookup(c: &mut Criterion) {
    for keys in [1_000_000u64, 10_000_000] {
        let index = filled(keys);
        let stats = index.memory_stats();
        eprintln!(
            "index with {keys} keys: {:.1} bytes per membership ({} buckets, {} entries)",
            stats.bytes_per_membership, stats.map_buckets, stats.map_entries
        );
        let chains: Vec<Vec<ChunkHash>> = (0..1000u64)
            .map(|c| {
                let h = (c % HOLDERS as u64) as i64;
                let start = (c * 100) % (keys / HOLDERS as u64 - 100);
                (start..start + 100).map(|i| key(h, i)).collect()
            })
            .collect();
        print_percentiles(&index, &chains, keys);
        let mut g = c.benchmark_group(format!("index/p2p_lookup_100/{}M", keys / 1_000_000));
        let mut i = 0;
        g.bench_function("hit", |b| {
            b.iter(|| {
                i = (i + 1) % chains.len();
                black_box(
                    index
                        .p2p_lookup(&chains[i], "asker", 0)
                        .map(|h| h.num_hit_chunks),
                )
            })
        });
        g.finish();
    }
}

/// Times 200,000 lookups one by one and prints p50/p99/p999 (criterion reports means only; the
/// target is a p99). `Instant::now()` costs ~25 ns, included in each sample.
fn print_percentiles(index: &ChunkIndex, chains: &[Vec<ChunkHash>], keys: u64) {
    let mut samples = Vec::with_capacity(200_000);
    for i in 0..200_000 {
        let chain = &chains[i % chains.len()];
        let t = std::time::Instant::now();
        black_box(
            index
                .p2p_lookup(chain, "asker", 0)
                .map(|h| h.num_hit_chunks),
        );
        samples.push(t.elapsed());
    }
    samples.sort_unstable();
    let at = |q: f64| samples[((q * samples.len() as f64) as usize).min(samples.len() - 1)];
    eprintln!(
        "p2p_lookup_100 at {keys} keys, 200k samples: p50 {:?} p99 {:?} p999 {:?}",
        at(0.50),
        at(0.99),
        at(0.999)
    );
}

criterion_group!(benches, apply, lookup);
criterion_main!(benches);
