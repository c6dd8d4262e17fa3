//! The index against the spec: the doc's own example, tier and DP semantics, namespaces, the
//! engine-hash map, clears, unregister, capacity and TTL.

use super::*;
use crate::indexer::model::events::{Lora, Removed, Stored};

/// Tokens per block in these tests (and the replica's).
pub(crate) const BS: u32 = 4;

/// A base-model stream of `instance` at `rank`.
pub(crate) fn spec(instance: &str, rank: u32) -> StreamSpec {
    StreamSpec {
        tenant: "default".into(),
        instance: instance.into(),
        dp_rank: rank,
        model: "m".into(),
        lora: String::new(),
        block_size: BS,
        salt: String::new(),
        shared: false,
    }
}

fn tokens(n_blocks: u32) -> Vec<u32> {
    (1..=n_blocks * BS).collect()
}

/// A store of blocks `from..to` of `tokens(to)`, engine hashes `base + i`, chained to the
/// engine hash of block `from - 1`.
fn stored(from: u32, to: u32, base: u64, medium: Medium) -> KvEvent {
    let all = tokens(to);
    KvEvent::Stored(Stored {
        hashes: (from..to).map(|i| base + u64::from(i)).collect(),
        parent: (from > 0).then(|| base + u64::from(from) - 1),
        tokens: all[(from * BS) as usize..].to_vec(),
        block_size: BS,
        medium,
        ..Stored::default()
    })
}

fn removed(hashes: Vec<u64>, medium: Medium) -> KvEvent {
    KvEvent::Removed(Removed {
        hashes,
        medium,
        group: None,
    })
}

/// The scope of [`spec`]'s streams.
pub(crate) fn scope() -> QueryScope<'static> {
    QueryScope {
        tenant: "default",
        model: "m",
        lora: LoraNs::Name(String::new()),
        block_size: BS,
        salt: "",
        instance: None,
    }
}

fn row(gpu: u64, cpu: u64, disk: u64, dp: &[(u32, u64)]) -> InstanceMatch {
    InstanceMatch {
        longest_matched: dp.iter().map(|d| d.1).max().unwrap_or(0),
        gpu,
        cpu,
        disk,
        dp: dp.iter().copied().collect(),
        other: BTreeMap::new(),
    }
}

#[test]
fn reproduces_the_docs_own_example() {
    // {"longest_matched":256,"GPU":128,"DP":{"0":128,"1":256},"CPU":256,"DISK":0} at block
    // size 64: rank 0 holds 2 blocks on GPU, rank 1 holds 4 blocks on CPU.
    let mut index = Index::new(IndexConfig::default());
    let mk = |rank| StreamSpec {
        block_size: 64,
        ..spec("vllm-prefill-node1", rank)
    };
    let r0 = index.add_stream(mk(0)).expect("a stream");
    let r1 = index.add_stream(mk(1)).expect("a stream");
    let toks: Vec<u32> = (0..256).collect();
    let ev = |n: usize, medium| {
        KvEvent::Stored(Stored {
            hashes: (0..n as u64).collect(),
            tokens: toks[..n * 64].to_vec(),
            block_size: 64,
            medium,
            ..Stored::default()
        })
    };
    index.apply(r0, &ev(2, Medium::Gpu), 0);
    index.apply(r1, &ev(4, Medium::Cpu), 0);
    let q = QueryScope {
        block_size: 64,
        ..scope()
    };
    let got = index.query_tokens(&q, &toks);
    let want = row(128, 256, 0, &[(0, 128), (1, 256)]);
    assert_eq!(got.get("vllm-prefill-node1"), Some(&want));
    assert_eq!(want.longest_matched, 256);
}

#[test]
fn tiers_are_not_cumulative_and_ranks_never_join() {
    let mut index = Index::new(IndexConfig::default());
    let a0 = index.add_stream(spec("a", 0)).expect("a stream");
    let a1 = index.add_stream(spec("a", 1)).expect("a stream");
    let _b = index.add_stream(spec("b", 0)).expect("a stream");
    // Rank 0: blocks 0..2 on GPU, 2..4 on CPU. Rank 1: blocks 2..4 on GPU only.
    index.apply(a0, &stored(0, 2, 100, Medium::Gpu), 0);
    index.apply(a0, &stored(2, 4, 100, Medium::Cpu), 0);
    // The chain continues from the GPU block 1 via the engine-hash map, whatever the tier.
    index.apply(a1, &stored(0, 4, 500, Medium::Disk), 0);
    index.apply(a1, &removed(vec![500, 501], Medium::Disk), 0);
    let got = index.query_tokens(&scope(), &tokens(5));
    // a: rank 0 serves 4 blocks (GPU then CPU), GPU alone 2, CPU alone 0 (block 0 is not on
    // CPU), rank 1 serves nothing (its blocks 0 and 1 were removed). b: zeros.
    assert_eq!(got["a"], row(8, 0, 0, &[(0, 16), (1, 0)]));
    assert_eq!(got["b"], row(0, 0, 0, &[(0, 0)]));
}

#[test]
fn an_unknown_parent_is_dropped_and_counted_never_guessed() {
    let mut index = Index::new(IndexConfig::default());
    let s = index.add_stream(spec("a", 0)).expect("a stream");
    index.apply(s, &stored(2, 4, 100, Medium::Gpu), 0);
    assert_eq!(index.counters().orphans, 1);
    assert_eq!(index.memberships(), 0);
    index.apply(s, &stored(0, 2, 100, Medium::Gpu), 0);
    index.apply(s, &stored(2, 4, 100, Medium::Gpu), 0);
    assert_eq!(index.query_tokens(&scope(), &tokens(4))["a"].gpu, 16);
}

#[test]
fn removal_is_per_tier_and_offload_stores_are_refcounted() {
    let mut index = Index::new(IndexConfig::default());
    let s = index.add_stream(spec("a", 0)).expect("a stream");
    index.apply(s, &stored(0, 1, 100, Medium::Gpu), 0);
    // Token-less placeholder offload events resolve through the engine-hash map, twice.
    let placeholder = KvEvent::Stored(Stored {
        hashes: vec![100, 999],
        medium: Medium::Cpu,
        ..Stored::default()
    });
    index.apply(s, &placeholder, 0);
    index.apply(s, &placeholder, 0);
    assert_eq!(index.counters().unknown_hashes, 2, "999 was never stored");
    // A GPU eviction keeps the CPU copy; the first CPU removal keeps the second reference.
    index.apply(s, &removed(vec![100], Medium::Gpu), 0);
    index.apply(s, &removed(vec![100], Medium::Cpu), 0);
    assert_eq!(
        index.query_tokens(&scope(), &tokens(1))["a"],
        row(0, 4, 0, &[(0, 4)])
    );
    index.apply(s, &removed(vec![100], Medium::Cpu), 0);
    assert_eq!(index.memberships(), 0);
    assert_eq!(index.stream_stats(s).map(|x| x.engine_hashes), Some(0));
    // GPU stores are idempotent (vLLM re-emits stores for cache hits): one removal ends it.
    index.apply(s, &stored(0, 1, 100, Medium::Gpu), 0);
    index.apply(s, &stored(0, 1, 100, Medium::Gpu), 0);
    index.apply(s, &removed(vec![100], Medium::Gpu), 0);
    assert_eq!(index.memberships(), 0);
}

#[test]
fn clear_covers_one_tier_and_unregister_removes_everything() {
    let mut index = Index::new(IndexConfig::default());
    let a = index.add_stream(spec("a", 0)).expect("a stream");
    let b = index.add_stream(spec("b", 0)).expect("a stream");
    index.apply(a, &stored(0, 3, 100, Medium::Gpu), 0);
    index.apply(a, &stored(0, 3, 200, Medium::Disk), 0);
    index.apply(b, &stored(0, 3, 100, Medium::Gpu), 0);
    assert_eq!(index.memberships(), 9);
    index.apply(a, &KvEvent::Cleared(Some(Medium::Gpu)), 0);
    assert_eq!(
        index.query_tokens(&scope(), &tokens(3))["a"],
        row(0, 0, 12, &[(0, 12)])
    );
    assert_eq!(index.memberships(), 6);
    index.remove_stream(a);
    assert_eq!(index.memberships(), 3);
    let got = index.query_tokens(&scope(), &tokens(3));
    assert!(!got.contains_key("a"));
    assert_eq!(got["b"].gpu, 12);
    // The freed id is reused by the next stream, which starts empty.
    let c = index.add_stream(spec("c", 0)).expect("a stream");
    assert_eq!(c, a);
    assert_eq!(
        index.query_tokens(&scope(), &tokens(3))["c"],
        row(0, 0, 0, &[(0, 0)])
    );
}

#[test]
fn namespaces_come_from_each_event_and_children_inherit_them() {
    let mut index = Index::new(IndexConfig::default());
    let s = index
        .add_stream(StreamSpec {
            salt: "w8a8".into(),
            ..spec("a", 0)
        })
        .expect("a stream");
    let mut lora_root = match stored(0, 1, 100, Medium::Gpu) {
        KvEvent::Stored(s) => s,
        _ => unreachable!(),
    };
    lora_root.lora = Lora::Name("sql".into());
    lora_root.cache_salt = Some("cust".into());
    index.apply(s, &KvEvent::Stored(lora_root), 0);
    // The child carries no LoRA or salt of its own: it inherits the parent's namespace.
    index.apply(s, &stored(1, 2, 100, Medium::Gpu), 0);
    let q = |lora: &str, salt: &'static str| QueryScope {
        lora: LoraNs::Name(lora.into()),
        salt,
        ..scope()
    };
    assert_eq!(
        index.query_tokens(&q("sql", "w8a8|cust"), &tokens(2))["a"].gpu,
        8
    );
    assert_eq!(
        index.query_tokens(&q("", "w8a8|cust"), &tokens(2))["a"].gpu,
        0
    );
    assert_eq!(
        index.query_tokens(&q("sql", "w8a8"), &tokens(2))["a"].gpu,
        0
    );
    // Other tenants and models see nothing; an instance filter narrows the rows.
    let other = QueryScope {
        tenant: "t2",
        ..scope()
    };
    assert!(index.query_tokens(&other, &tokens(2)).is_empty());
    let filtered = QueryScope {
        instance: Some("zzz"),
        ..scope()
    };
    assert!(index.query_tokens(&filtered, &tokens(2)).is_empty());
}

#[test]
fn query_by_hash_takes_the_standard_rolling_hashes() {
    let mut index = Index::new(IndexConfig::default());
    let s = index.add_stream(spec("a", 0)).expect("a stream");
    index.apply(s, &stored(0, 3, 100, Medium::Gpu), 0);
    let seqs = hash::seq_hashes(&tokens(3), BS as usize, hash::DEFAULT_SEED);
    assert_eq!(index.query_hashes(&scope(), &seqs)["a"].longest_matched, 12);
    // The walk stops at the first miss, even when later hashes are present.
    let holed = [seqs[0], 12345, seqs[2]];
    assert_eq!(index.query_hashes(&scope(), &holed)["a"].longest_matched, 4);
    // The incomplete tail of a token query is ignored.
    let mut toks = tokens(3);
    toks.push(7);
    assert_eq!(index.query_tokens(&scope(), &toks)["a"].longest_matched, 12);
}

#[test]
fn shared_pools_serve_every_rank_of_their_instance() {
    let mut index = Index::new(IndexConfig::default());
    let r0 = index.add_stream(spec("a", 0)).expect("a stream");
    let r1 = index.add_stream(spec("a", 1)).expect("a stream");
    let pool = index
        .add_stream(StreamSpec {
            shared: true,
            ..spec("a", 0)
        })
        .expect("a stream");
    index.apply(r0, &stored(0, 1, 100, Medium::Gpu), 0);
    let seqs = hash::seq_hashes(&tokens(3), BS as usize, hash::DEFAULT_SEED);
    let mooncake = KvEvent::Stored(Stored {
        hashes: seqs.clone(),
        medium: Medium::Disk,
        standard_hashes: true,
        ..Stored::default()
    });
    index.apply(pool, &mooncake, 0);
    let got = index.query_tokens(&scope(), &tokens(3));
    assert_eq!(got["a"], row(4, 0, 12, &[(0, 12), (1, 12)]));
    let _ = r1;
}

#[test]
fn capacity_refuses_new_memberships_and_counts_them() {
    let mut index = Index::new(IndexConfig {
        max_memberships: 3,
        evict_at_capacity: false,
        ..IndexConfig::default()
    });
    let s = index.add_stream(spec("a", 0)).expect("a stream");
    index.apply(s, &stored(0, 5, 100, Medium::Gpu), 0);
    assert_eq!(index.memberships(), 3);
    assert_eq!(index.counters().capacity_refused, 1);
    assert_eq!(index.stream_stats(s).map(|x| x.engine_hashes), Some(3));
    assert_eq!(index.query_tokens(&scope(), &tokens(5))["a"].gpu, 12);
}

#[test]
fn capacity_evicts_the_least_recently_stored_first() {
    let mut index = Index::new(IndexConfig {
        max_memberships: 32,
        ..IndexConfig::default()
    });
    let (a, b) = (
        index.add_stream(spec("a", 0)).expect("a stream"),
        index.add_stream(spec("b", 0)).expect("a stream"),
    );
    // 16 blocks of "a" at t=10, then "b" refreshes nothing and stores 16 at t=20: full.
    index.apply(a, &stored(0, 16, 100, Medium::Gpu), 10);
    index.apply(b, &stored(0, 16, 900, Medium::Gpu), 20);
    assert_eq!(index.memberships(), 32);
    // One more at t=30: the oldest second (all of "a", half the sample) is not most of it,
    // so it may go; eviction frees about 1/256 of the memberships (here one) a call, from
    // the arena's start: "a"'s first block. "b" stays, the new block is stored.
    index.apply(b, &stored(16, 17, 900, Medium::Gpu), 30);
    let c = index.counters();
    assert_eq!((c.evicted, c.capacity_refused), (1, 0), "{c:?}");
    assert_eq!(index.memberships(), 32);
    let got = index.query_tokens(&scope(), &tokens(17));
    assert_eq!(got["a"].longest_matched, 0, "{got:?}");
    assert_eq!(got["b"].gpu, 17 * u64::from(BS));
    // 15 more: every other block of "a" goes, oldest first, and nothing of "b".
    index.apply(b, &stored(17, 32, 900, Medium::Gpu), 40);
    let c = index.counters();
    assert_eq!((c.evicted, c.capacity_refused), (16, 0), "{c:?}");
    assert_eq!(index.stream_stats(a).map(|x| x.engine_hashes), Some(0));
    assert_eq!(
        index.query_tokens(&scope(), &tokens(32))["b"].gpu,
        32 * u64::from(BS)
    );
}

#[test]
fn a_burst_filling_the_index_in_one_second_is_refused_not_wiped() {
    let mut index = Index::new(IndexConfig {
        max_memberships: 8,
        ..IndexConfig::default()
    });
    let s = index.add_stream(spec("a", 0)).expect("a stream");
    index.apply(s, &stored(0, 12, 100, Medium::Gpu), 5);
    let c = index.counters();
    // The chain stops at the first refused block (its children would have no parent).
    assert_eq!((c.evicted, c.capacity_refused), (0, 1), "{c:?}");
    assert_eq!(index.memberships(), 8);
}

#[test]
fn ttl_drops_blocks_not_stored_again() {
    let mut index = Index::new(IndexConfig {
        ttl_secs: Some(60),
        ..IndexConfig::default()
    });
    let s = index.add_stream(spec("a", 0)).expect("a stream");
    index.apply(s, &stored(0, 2, 100, Medium::Gpu), 1000);
    index.apply(s, &stored(0, 1, 100, Medium::Gpu), 1050);
    assert_eq!(index.expire(1059), 0);
    assert_eq!(index.expire(1100), 1, "block 1 was last stored at 1000");
    assert_eq!(index.counters().expired, 1);
    assert_eq!(index.query_tokens(&scope(), &tokens(2))["a"].gpu, 4);
    assert_eq!(index.expire(1200), 1);
    assert_eq!(index.memberships(), 0);
}

#[test]
fn shape_group_and_opaque_events_are_skipped_and_counted() {
    let mut index = Index::new(IndexConfig::default());
    let s = index.add_stream(spec("a", 0)).expect("a stream");
    let base = match stored(0, 2, 100, Medium::Gpu) {
        KvEvent::Stored(s) => s,
        _ => unreachable!(),
    };
    let short = Stored {
        tokens: base.tokens[..5].to_vec(),
        ..base.clone()
    };
    let other_bs = Stored {
        block_size: 8,
        ..base.clone()
    };
    let group = Stored {
        group: Some(1),
        ..base.clone()
    };
    let mm = Stored {
        opaque_extra_keys: true,
        ..base
    };
    for ev in [short, other_bs, group, mm] {
        index.apply(s, &KvEvent::Stored(ev), 0);
    }
    let c = index.counters();
    assert_eq!((c.shape_mismatch, c.other_group, c.opaque), (2, 1, 1));
    assert_eq!(index.memberships(), 0);
}

/// Measures what a membership costs with its engine-hash entry (single stream, GPU only, the
/// worst case: no block shared). Printed for the report (`--nocapture`); the bound asserted is
/// the one this layout guarantees, so a regression in the layout fails here.
#[test]
fn bytes_per_membership_with_engine_maps() {
    let mut index = Index::new(IndexConfig::default());
    let s = index.add_stream(spec("a", 0)).expect("a stream");
    let n = 200_000u32;
    let toks: Vec<u32> = (0..n * BS).collect();
    for chunk in 0..(n / 1000) {
        let from = chunk * 1000;
        index.apply(
            s,
            &KvEvent::Stored(Stored {
                hashes: (from..from + 1000).map(u64::from).collect(),
                parent: (from > 0).then(|| u64::from(from) - 1),
                tokens: toks[(from * BS) as usize..((from + 1000) * BS) as usize].to_vec(),
                block_size: BS,
                ..Stored::default()
            }),
            0,
        );
    }
    assert_eq!(index.memberships(), n as usize);
    let total = index.heap_bytes() as f64 / f64::from(n);
    eprintln!("{n} memberships: {total:.1} B/membership (records and both tables)");
    // 200k records: 2^18 buckets in each table (5 B a bucket: id and control byte) and an
    // arena of 28 B records with at most 2x spare capacity.
    assert!(
        total <= (2.0 * 5.0 * 262_144.0 + 2.0 * 28.0 * f64::from(n)) / f64::from(n) + 0.1,
        "{total}"
    );
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Store {
            stream: usize,
            from: u32,
            to: u32,
            base: u64,
            tier: usize,
            tokenless: bool,
        },
        Remove {
            stream: usize,
            hash: u64,
            tier: usize,
        },
        Clear {
            stream: usize,
            tier: Option<usize>,
        },
        Expire {
            now: u32,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..3usize, 0..4u32, 1..5u32, 0..2u64, 0..3usize, any::<bool>()).prop_map(
                |(stream, from, len, base, tier, tokenless)| Op::Store {
                    stream, from, to: from + len, base: base * 100, tier, tokenless
                }),
            3 => (0..3usize, 0..210u64, 0..3usize)
                .prop_map(|(stream, hash, tier)| Op::Remove { stream, hash, tier }),
            1 => (0..3usize, proptest::option::of(0..3usize))
                .prop_map(|(stream, tier)| Op::Clear { stream, tier }),
            1 => (0..200u32).prop_map(|now| Op::Expire { now }),
        ]
    }

    proptest! {
        /// Whatever events arrive, the per-stream tier counts add up to the table's
        /// memberships, a query's numbers are consistent (each tier and rank ≤ longest), and
        /// unregistering every stream leaves the table empty.
        #[test]
        fn memberships_stay_consistent(ops in proptest::collection::vec(op(), 1..60),
                                       cap in 3..40usize) {
            let mut index = Index::new(IndexConfig {
                max_memberships: cap,
                ttl_secs: Some(50),
                ..IndexConfig::default()
            });
            let streams: Vec<StreamId> =
                (0..3).map(|i| index.add_stream(spec(&format!("i{i}"), i)).expect("a stream")).collect();
            for (t, op) in ops.into_iter().enumerate() {
                let now = t as u32 * 10;
                match op {
                    Op::Store { stream, from, to, base, tier, tokenless } => {
                        let mut ev = match stored(from, to, base, Medium::ALL[tier]) {
                            KvEvent::Stored(s) => s,
                            _ => unreachable!(),
                        };
                        if tokenless {
                            ev.tokens.clear();
                            ev.parent = None;
                        }
                        index.apply(streams[stream], &KvEvent::Stored(ev), now);
                    }
                    Op::Remove { stream, hash, tier } => {
                        index.apply(streams[stream], &removed(vec![hash], Medium::ALL[tier]), now);
                    }
                    Op::Clear { stream, tier } => {
                        index.apply(streams[stream], &KvEvent::Cleared(tier.map(|t| Medium::ALL[t])), now);
                    }
                    Op::Expire { now } => {
                        index.expire(now);
                    }
                }
                let counted: u64 = streams
                    .iter()
                    .map(|s| index.stream_stats(*s).map_or(0, |x| x.tier_blocks.iter().sum::<u64>()))
                    .sum();
                prop_assert_eq!(counted, index.memberships() as u64);
                prop_assert!(index.memberships() <= cap);
                for m in index.query_tokens(&scope(), &tokens(8)).values() {
                    prop_assert!(m.gpu.max(m.cpu).max(m.disk) <= m.longest_matched);
                    prop_assert!(m.dp.values().all(|d| *d <= m.longest_matched));
                }
            }
            for s in streams {
                index.remove_stream(s);
            }
            prop_assert_eq!(index.memberships(), 0);
            prop_assert_eq!(index.records(), 0);
            prop_assert_eq!(index.namespaces(), 0);
        }
    }
}
