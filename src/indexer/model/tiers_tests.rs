//! The bridge against the index: LMCache chunks of 256 tokens, hashed as LMCache hashes them
//! (rolling BLAKE3), shown as CPU then DISK blocks of the linked instance in `/query`
//! answers, and gone when deleted, fenced or unlinked.

use super::*;
use crate::indexer::model::index::{Index, IndexConfig, LoraNs, QueryScope, StreamSpec};

const C: usize = 256;

/// LMCache's hash of no prefix: `blake3(0 as i64 BE ‖ 0 as u32 BE)`.
fn none_hash() -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(&0i64.to_be_bytes());
    h.update(&0u32.to_be_bytes());
    h.finalize().into()
}

/// The tokens of a prompt of `chunks` chunks, and each chunk's rolling hash.
fn prompt(chunks: usize, base: u32) -> (Vec<u32>, Vec<[u8; 32]>) {
    let tokens: Vec<u32> = (0..(chunks * C) as u32).map(|t| t * 7 + base).collect();
    let mut prefix = none_hash();
    let hashes = tokens
        .chunks_exact(C)
        .map(|c| {
            prefix = chunk_hash(&prefix, c);
            prefix
        })
        .collect();
    (tokens, hashes)
}

fn key(tokens: &[u32], hashes: &[[u8; 32]], i: usize, rank: u32, world: u32) -> ChunkKey {
    ChunkKey {
        hash: hashes[i].to_vec(),
        kv_rank: world << 24 | rank << 16 | world << 8 | rank,
        group: 0,
        salt: String::new(),
        tokens: Some(tokens[i * C..(i + 1) * C].to_vec()),
        offset: (i * C) as i64,
    }
}

fn batch(tier: Tier, op: Op, keys: Vec<ChunkKey>) -> TierBatch {
    TierBatch {
        server: "mp-1".into(),
        incarnation: 1,
        tier,
        op,
        keys,
    }
}

fn spec(shared: bool, bs: u32) -> StreamSpec {
    StreamSpec {
        tenant: "default".into(),
        instance: "vllm-a".into(),
        dp_rank: 0,
        model: "m".into(),
        lora: String::new(),
        block_size: bs,
        salt: String::new(),
        shared,
    }
}

fn scope(bs: u32) -> QueryScope<'static> {
    QueryScope {
        tenant: "default",
        model: "m",
        lora: LoraNs::Name(String::new()),
        block_size: bs,
        salt: "",
        instance: None,
    }
}

/// An index with the engine's own stream and the pool of its LMCache tiers, linked.
fn setup(bs: u32) -> (Index, Tiers, StreamId) {
    let mut index = Index::new(IndexConfig::default());
    index.add_stream(spec(false, bs)).unwrap();
    let pool = index.add_stream(spec(true, bs)).unwrap();
    let mut tiers = Tiers::new(IndexConfig::default().seed, 1000);
    assert!(tiers
        .link(
            "mp-1",
            TierLink {
                stream: pool,
                block_size: bs
            }
        )
        .is_empty());
    (index, tiers, pool)
}

fn apply(index: &mut Index, events: Vec<(StreamId, KvEvent)>) {
    for (s, e) in events {
        index.apply(s, &e, 0);
    }
}

/// `(longest, cpu, disk)` of `vllm-a` for `tokens`.
fn answer(index: &Index, bs: u32, tokens: &[u32]) -> (u64, u64, u64) {
    let m = index.query_tokens(&scope(bs), tokens);
    let a = &m["vllm-a"];
    assert_eq!(a.gpu, 0);
    (a.longest_matched, a.cpu, a.disk)
}

#[test]
fn chunks_show_as_cpu_then_disk_blocks_and_leave_when_deleted() {
    let (mut index, mut tiers, pool) = setup(16);
    let (tokens, hashes) = prompt(3, 1);
    // In reverse, as the coordinator applies a store batch (LRU order).
    let keys = |n: usize| {
        (0..n)
            .rev()
            .map(|i| key(&tokens, &hashes, i, 0, 1))
            .collect()
    };
    let ev = tiers.apply(&batch(Tier::L1, Op::Store, keys(3)));
    assert_eq!(ev.len(), 3);
    assert_eq!(tiers.counters().orphans, 0);
    // The blocks carry the index's own rolling hashes of the whole prompt.
    let want = hash::seq_hashes(&tokens, 16, IndexConfig::default().seed);
    match &ev[1] {
        (s, KvEvent::Stored(st)) => {
            assert_eq!(*s, pool);
            assert_eq!(st.hashes, want[16..32]);
            assert_eq!(st.medium, Medium::Cpu);
        }
        other => panic!("{other:?}"),
    }
    apply(&mut index, ev);
    assert_eq!(answer(&index, 16, &tokens), (768, 768, 0));
    // A longer prompt matches the stored prefix only; another prompt nothing.
    let mut longer = tokens.clone();
    longer.extend(1..=64);
    assert_eq!(answer(&index, 16, &longer), (768, 768, 0));
    assert_eq!(answer(&index, 16, &prompt(1, 2).0), (0, 0, 0));

    apply(
        &mut index,
        tiers.apply(&batch(Tier::L2, Op::Store, keys(2))),
    );
    assert_eq!(answer(&index, 16, &tokens), (768, 768, 512));
    // The middle chunk leaves L1: CPU ends before it, the disk still has two chunks, and
    // the prompt is still servable from the instance's tiers together (disk, disk, CPU).
    let mid = vec![key(&tokens, &hashes, 1, 0, 1)];
    apply(
        &mut index,
        tiers.apply(&batch(Tier::L1, Op::Delete, mid.clone())),
    );
    assert_eq!(answer(&index, 16, &tokens), (768, 256, 512));
    apply(&mut index, tiers.apply(&batch(Tier::L2, Op::Delete, mid)));
    assert_eq!(answer(&index, 16, &tokens), (256, 256, 256));
    let c = tiers.counters();
    assert_eq!((c.chunk_stores, c.chunk_removals, c.orphans), (5, 2, 0));
    // The middle chunk is on no tier: no longer tracked.
    assert_eq!(c.chunks, 2);
}

#[test]
fn every_block_size_dividing_the_chunk_maps_and_others_are_counted() {
    for bs in [16u32, 32, 64, 128, 256] {
        let (mut index, mut tiers, _) = setup(bs);
        let (tokens, hashes) = prompt(2, 3);
        let keys = (0..2).map(|i| key(&tokens, &hashes, i, 0, 1)).collect();
        apply(&mut index, tiers.apply(&batch(Tier::L1, Op::Store, keys)));
        assert_eq!(
            answer(&index, bs, &tokens),
            (512, 512, 0),
            "block size {bs}"
        );
    }
    let (mut index, mut tiers, _) = setup(48);
    let (tokens, hashes) = prompt(1, 3);
    let ev = tiers.apply(&batch(
        Tier::L1,
        Op::Store,
        vec![key(&tokens, &hashes, 0, 0, 1)],
    ));
    assert!(ev.is_empty());
    apply(&mut index, ev);
    assert_eq!(answer(&index, 48, &tokens), (0, 0, 0));
    assert!(tiers.counters().unaligned > 0);
}

#[test]
fn a_chunk_without_its_parent_or_tokens_is_counted_not_guessed() {
    let (_, mut tiers, _) = setup(16);
    let (tokens, hashes) = prompt(2, 5);
    // The second chunk alone: its parent was never seen, it waits.
    let one = vec![key(&tokens, &hashes, 1, 0, 1)];
    assert!(tiers.apply(&batch(Tier::L1, Op::Store, one)).is_empty());
    // A chunk at that position whose hash chains from no tracked chunk waits too.
    let (other, other_hashes) = prompt(2, 6);
    let wrong = vec![key(&other, &other_hashes, 1, 0, 1)];
    assert!(tiers.apply(&batch(Tier::L1, Op::Store, wrong)).is_empty());
    let mut bare = key(&tokens, &hashes, 0, 0, 1);
    bare.hash = vec![9; 32];
    bare.tokens = None;
    assert!(tiers
        .apply(&batch(Tier::L1, Op::Store, vec![bare]))
        .is_empty());
    let c = tiers.counters();
    assert_eq!((c.waiting, c.no_tokens, c.chunks), (2, 1, 0));
    // The first chunk arrives: the second applies after it; the other one, whose parent
    // (`other`'s first chunk) is not this one, still waits.
    let first = vec![key(&tokens, &hashes, 0, 0, 1)];
    assert_eq!(tiers.apply(&batch(Tier::L1, Op::Store, first)).len(), 2);
    let c = tiers.counters();
    assert_eq!((c.waiting, c.chunks, c.orphans), (1, 2, 0));
    // A restart drops what waits: counted as orphans.
    let mut next = batch(Tier::L1, Op::Store, Vec::new());
    next.incarnation = 2;
    assert_eq!(
        tiers.apply(&next).len(),
        2,
        "both chunks leave the CPU tier"
    );
    let c = tiers.counters();
    assert_eq!((c.waiting, c.orphans), (0, 1));
}

#[test]
fn a_child_stored_before_its_parent_waits_for_it() {
    let (mut index, mut tiers, _) = setup(16);
    let (tokens, hashes) = prompt(3, 12);
    // Writes complete out of order: chunks 1 and 2 are reported a batch before chunk 0.
    let late = vec![
        key(&tokens, &hashes, 2, 0, 1),
        key(&tokens, &hashes, 1, 0, 1),
    ];
    assert!(tiers.apply(&batch(Tier::L1, Op::Store, late)).is_empty());
    assert_eq!(tiers.counters().waiting, 2);
    apply(
        &mut index,
        tiers.apply(&batch(
            Tier::L1,
            Op::Store,
            vec![key(&tokens, &hashes, 0, 0, 1)],
        )),
    );
    assert_eq!(answer(&index, 16, &tokens), (768, 768, 0));
    let c = tiers.counters();
    assert_eq!((c.waiting, c.orphans, c.chunks), (0, 0, 3));
}

#[test]
fn a_chunk_counts_once_every_rank_holds_it() {
    let (mut index, mut tiers, _) = setup(64);
    let (tokens, hashes) = prompt(1, 8);
    let r0 = key(&tokens, &hashes, 0, 0, 2);
    let r1 = key(&tokens, &hashes, 0, 1, 2);
    assert!(tiers
        .apply(&batch(Tier::L1, Op::Store, vec![r0.clone()]))
        .is_empty());
    apply(
        &mut index,
        tiers.apply(&batch(Tier::L1, Op::Store, vec![r1])),
    );
    assert_eq!(answer(&index, 64, &tokens), (256, 256, 0));
    // The same key again changes nothing; one rank leaving takes the chunk off.
    assert!(tiers
        .apply(&batch(Tier::L1, Op::Store, vec![r0.clone()]))
        .is_empty());
    apply(
        &mut index,
        tiers.apply(&batch(Tier::L1, Op::Delete, vec![r0])),
    );
    assert_eq!(answer(&index, 64, &tokens), (0, 0, 0));
}

#[test]
fn a_restarted_server_loses_its_l1_and_keeps_its_l2() {
    let (mut index, mut tiers, _) = setup(16);
    let (tokens, hashes) = prompt(2, 9);
    let keys: Vec<ChunkKey> = (0..2).map(|i| key(&tokens, &hashes, i, 0, 1)).collect();
    apply(
        &mut index,
        tiers.apply(&batch(Tier::L1, Op::Store, keys.clone())),
    );
    apply(&mut index, tiers.apply(&batch(Tier::L2, Op::Store, keys)));
    assert_eq!(answer(&index, 16, &tokens), (512, 512, 512));
    let mut next = batch(Tier::L2, Op::Store, Vec::new());
    next.incarnation = 2;
    apply(&mut index, tiers.apply(&next));
    assert_eq!(answer(&index, 16, &tokens), (512, 0, 512));
    assert_eq!(tiers.counters().fences, 1);
    apply(&mut index, tiers.server_left("mp-1"));
    assert_eq!(answer(&index, 16, &tokens), (512, 0, 512));
}

#[test]
fn a_late_link_gets_what_the_server_shows_and_unlinked_servers_cost_nothing() {
    let mut index = Index::new(IndexConfig::default());
    index.add_stream(spec(false, 32)).unwrap();
    let pool = index.add_stream(spec(true, 32)).unwrap();
    let mut tiers = Tiers::new(IndexConfig::default().seed, 1000);
    let (tokens, hashes) = prompt(2, 4);
    let keys: Vec<ChunkKey> = (0..2).map(|i| key(&tokens, &hashes, i, 0, 1)).collect();
    // Not linked yet: nothing tracked.
    assert!(tiers
        .apply(&batch(Tier::L1, Op::Store, keys.clone()))
        .is_empty());
    assert_eq!(tiers.counters().unlinked_batches, 1);
    // Linked to another stream first, then to the pool: the pool gets both chunks.
    let other = index.add_stream(spec(true, 16)).unwrap();
    tiers.link(
        "mp-1",
        TierLink {
            stream: other,
            block_size: 16,
        },
    );
    apply(&mut index, tiers.apply(&batch(Tier::L1, Op::Store, keys)));
    let late = tiers.link(
        "mp-1",
        TierLink {
            stream: pool,
            block_size: 32,
        },
    );
    assert_eq!(late.len(), 2);
    apply(&mut index, late);
    assert_eq!(answer(&index, 32, &tokens), (512, 512, 0));
    tiers.unlink_stream(pool);
    index.remove_stream(pool);
    assert_eq!(answer(&index, 32, &tokens), (0, 0, 0));
}

#[test]
fn the_chunk_limit_refuses_and_counts() {
    let mut tiers = Tiers::new(1337, 1);
    tiers.link(
        "mp-1",
        TierLink {
            stream: StreamId(0),
            block_size: 16,
        },
    );
    let (tokens, hashes) = prompt(2, 4);
    let keys: Vec<ChunkKey> = (0..2).map(|i| key(&tokens, &hashes, i, 0, 1)).collect();
    assert_eq!(tiers.apply(&batch(Tier::L1, Op::Store, keys)).len(), 1);
    assert_eq!(tiers.counters().refused, 1);
}
