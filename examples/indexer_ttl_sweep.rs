//! The indexer's TTL sweep: its longest index-lock hold and its whole time, as one sweep over
//! every stream and sliced one stream per lock hold (`Index::expire` vs `Index::expire_stream`),
//! over STREAMS streams of PER blocks each (chains of 64), three rounds. Figures in
//! docs/BENCHMARKS.md.
//!
//!     cargo run --release --example indexer_ttl_sweep -- 10 1000000
use kvplane::indexer::events::{KvEvent, Medium, Stored};
use kvplane::indexer::index::{Index, IndexConfig, StreamSpec};
use std::time::Instant;

fn main() {
    let streams: u32 = std::env::args().nth(1).map_or(10, |a| a.parse().unwrap());
    let per: u32 = std::env::args()
        .nth(2)
        .map_or(1_000_000, |a| a.parse().unwrap());
    let chain = 64u32;

    for round in 0..3 {
        for sliced in [false, true] {
            let mut ix = Index::new(IndexConfig {
                ttl_secs: Some(10),
                max_memberships: usize::MAX,
                ..IndexConfig::default()
            });
            let ids: Vec<_> = (0..streams)
                .map(|i| {
                    ix.add_stream(StreamSpec {
                        tenant: "t".into(),
                        instance: format!("e{i}"),
                        dp_rank: 0,
                        model: "m".into(),
                        lora: String::new(),
                        block_size: 4,
                        salt: String::new(),
                        shared: false,
                    })
                })
                .collect();
            for (si, id) in ids.iter().enumerate() {
                let mut base = (si as u64) << 40;
                for c in 0..per / chain {
                    let tokens: Vec<u32> = (0..chain * 4)
                        .map(|t| t + c * 1_000_003 + si as u32 * 7)
                        .collect();
                    let ev = KvEvent::Stored(Stored {
                        hashes: (0..u64::from(chain)).map(|h| base + h).collect(),
                        parent: None,
                        tokens,
                        block_size: 4,
                        medium: Medium::Gpu,
                        ..Stored::default()
                    });
                    ix.apply(*id, &ev, 1);
                    base += u64::from(chain);
                }
            }
            let mem = ix.memberships();
            // A sweep that drops nothing (the walk alone), then one that drops everything.
            let (wl, wt) = if sliced {
                let t0 = Instant::now();
                let mut longest = 0f64;
                for id in ix.stream_ids() {
                    let t = Instant::now();
                    ix.expire_stream(id, 10);
                    longest = longest.max(t.elapsed().as_secs_f64());
                }
                (longest, t0.elapsed().as_secs_f64())
            } else {
                let t = Instant::now();
                ix.expire(10);
                let e = t.elapsed().as_secs_f64();
                (e, e)
            };
            println!("round {round} sliced={sliced} walk only: longest lock hold {:.1} ms, whole sweep {:.1} ms", wl*1e3, wt*1e3);
            let (longest, total) = if sliced {
                let t0 = Instant::now();
                let mut longest = 0f64;
                for id in ix.stream_ids() {
                    let t = Instant::now();
                    ix.expire_stream(id, 100);
                    longest = longest.max(t.elapsed().as_secs_f64());
                }
                (longest, t0.elapsed().as_secs_f64())
            } else {
                let t = Instant::now();
                ix.expire(100);
                let e = t.elapsed().as_secs_f64();
                (e, e)
            };

            println!("round {round} sliced={sliced} memberships={mem} dropping all: longest lock hold {:.1} ms, whole sweep {:.1} ms", longest*1e3, total*1e3);
        }
    }
}
