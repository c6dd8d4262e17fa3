//! The indexer's index-lock holds when memberships go in bulk, over STREAMS streams of PER
//! blocks each (chains of 64), three rounds:
//! - the TTL sweep as one call (`Index::expire`) and sliced as the service runs it
//!   (`Index::expire_slice` over `SWEEP_SLICE` records per lock hold), first walking only
//!   (nothing old enough), then dropping every membership;
//! - clearing one stream (`Index::clear_stream`: an unregister or a publisher restart).
//!
//! Figures in docs/BENCHMARKS.md.
//!
//!     cargo run --release --example indexer_ttl_sweep -- 10 1000000
//!     cargo run --release --example indexer_ttl_sweep -- 1 10000000   # one huge stream
use kvplane::indexer::events::{KvEvent, Medium, Stored};
use kvplane::indexer::index::{Index, IndexConfig, StreamId, StreamSpec, SWEEP_SLICE};
use std::time::Instant;

fn main() {
    let streams: u32 = std::env::args().nth(1).map_or(10, |a| a.parse().unwrap());
    let per: u32 = std::env::args()
        .nth(2)
        .map_or(1_000_000, |a| a.parse().unwrap());
    for round in 0..3 {
        for sliced in [false, true] {
            let (mut ix, _) = build(streams, per);
            let mem = ix.memberships();
            let (wl, wt) = sweep(&mut ix, 10, sliced);
            println!(
                "round {round} sliced={sliced} memberships={mem} walk only: longest lock hold \
                 {:.1} ms, whole sweep {:.1} ms",
                wl * 1e3,
                wt * 1e3
            );
            let (dl, dt) = sweep(&mut ix, 100, sliced);
            println!(
                "round {round} sliced={sliced} memberships={mem} dropping all: longest lock \
                 hold {:.1} ms, whole sweep {:.1} ms",
                dl * 1e3,
                dt * 1e3
            );
        }
        let (mut ix, ids) = build(streams, per);
        let mut longest = 0f64;
        for id in ids {
            let t = Instant::now();
            ix.clear_stream(id, None);
            longest = longest.max(t.elapsed().as_secs_f64());
        }
        println!(
            "round {round} clear of one stream of {per} blocks: longest {:.1} ms",
            longest * 1e3
        );
    }
}

/// An index with `streams` streams of `per` GPU blocks each, all stored at t=1.
fn build(streams: u32, per: u32) -> (Index, Vec<StreamId>) {
    let chain = 64u32;
    let mut ix = Index::new(IndexConfig {
        ttl_secs: Some(10),
        max_memberships: usize::MAX,
        ..IndexConfig::default()
    });
    let ids: Vec<StreamId> = (0..streams)
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
            .expect("a stream")
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
    (ix, ids)
}

/// One TTL sweep at `now`: whole, or slice by slice; (longest lock hold, whole time) in s.
fn sweep(ix: &mut Index, now: u32, sliced: bool) -> (f64, f64) {
    let t0 = Instant::now();
    if !sliced {
        ix.expire(now);
        let e = t0.elapsed().as_secs_f64();
        return (e, e);
    }
    let mut longest = 0f64;
    let mut from = Some(0);
    while let Some(start) = from {
        let t = Instant::now();
        from = ix.expire_slice(start, SWEEP_SLICE, now).1;
        longest = longest.max(t.elapsed().as_secs_f64());
    }
    (longest, t0.elapsed().as_secs_f64())
}
