use super::*;
use crate::coordinator::model::tokens::ChunkTokens;

fn config(blend: Option<(usize, usize)>) -> DirectoryConfig {
    DirectoryConfig {
        max_keys: 1000,
        max_token_ids: 1 << 20,
        max_names: 64,
        blend,
    }
}

fn key(hex: &str, rank: i64, group: i64, salt: &str) -> EncodedKey {
    EncodedKey {
        chunk_hash_hex: hex.into(),
        model_name: "m".into(),
        kv_rank: rank,
        object_group_id: group,
        cache_salt: salt.into(),
    }
}

fn batch(id: &str, inc: u64, tier: Tier, backend: &str, shared: bool, ops: Vec<Op>) -> Batch {
    Batch {
        instance_id: id.into(),
        incarnation: inc,
        seq: 1,
        tier,
        backend: backend.into(),
        shared,
        capacity: None,
        ops,
        tokens: Vec::new(),
    }
}

fn tokens(hex: &str, offset: i64, ids: Vec<u32>) -> ChunkTokens {
    ChunkTokens {
        chunk_hash_hex: hex.into(),
        token_offset: offset,
        token_ids: ids,
    }
}

#[test]
fn placements_per_holder_and_shared_pools_once() {
    let mut d = Directory::new(config(None));
    let k = key("aa", 0, 0, "s");
    d.apply(&batch(
        "b",
        1,
        Tier::L2,
        "fs",
        false,
        vec![Op::Store(k.clone(), 5)],
    ));
    d.apply(&batch(
        "a",
        1,
        Tier::L2,
        "fs",
        false,
        vec![Op::Store(k.clone(), 10)],
    ));
    d.apply(&batch(
        "a",
        1,
        Tier::L1,
        "dram",
        false,
        vec![Op::Store(k.clone(), 10)],
    ));
    d.apply(&batch(
        "a",
        1,
        Tier::L2,
        "nfs",
        true,
        vec![Op::Store(k.clone(), 7)],
    ));
    // A shared pool's placement is one, whoever reports it.
    d.apply(&batch(
        "b",
        1,
        Tier::L2,
        "nfs",
        true,
        vec![Op::Store(k.clone(), 8)],
    ));
    let v = &d.lookup(std::slice::from_ref(&k))[0];
    let who: Vec<(&str, Tier, &str, u64)> = v
        .placements
        .iter()
        .map(|p| {
            (
                p.instance_id.as_str(),
                p.tier,
                p.backend.as_str(),
                p.size_bytes,
            )
        })
        .collect();
    assert_eq!(
        who,
        [
            ("a", Tier::L1, "dram", 10),
            ("a", Tier::L2, "fs", 10),
            ("b", Tier::L2, "fs", 5),
            ("b", Tier::L2, "nfs", 8)
        ]
    );
    let st = d.stats();
    assert_eq!((st.num_keys, st.num_placements), (1, 4));
    assert_eq!((st.l2_count, st.l2_size_bytes), (3, 23));
    // One holder's delete leaves the others.
    d.apply(&batch(
        "b",
        1,
        Tier::L2,
        "fs",
        false,
        vec![Op::Delete(k.clone())],
    ));
    assert_eq!(d.lookup(std::slice::from_ref(&k))[0].placements.len(), 3);
    // A restart of `a` fences its L1 placement only.
    d.fence("a");
    assert_eq!(d.lookup(std::slice::from_ref(&k))[0].placements.len(), 2);
    assert!(!d.stats().l1_keys_by_instance.contains_key("a"));
    d.apply(&batch(
        "a",
        1,
        Tier::L2,
        "fs",
        false,
        vec![Op::Delete(k.clone())],
    ));
    d.apply(&batch(
        "x",
        1,
        Tier::L2,
        "nfs",
        true,
        vec![Op::Delete(k.clone())],
    ));
    assert!(d.is_empty());
    assert_eq!(d.stats().num_placements, 0);
    assert_eq!(d.stats().l2_size_bytes, 0);
}

#[test]
fn tokens_are_kept_once_per_chunk_and_dropped_with_its_last_key() {
    let mut d = Directory::new(config(None));
    let mut b = batch(
        "a",
        1,
        Tier::L2,
        "fs",
        false,
        vec![
            Op::Store(key("aa", 1, 0, ""), 4),
            Op::Store(key("aa", 2, 0, ""), 4),
            Op::Store(key("aa", 1, 3, ""), 4),
        ],
    );
    b.tokens = vec![tokens("aa", 0, vec![1, 2, 3]), tokens("bb", 0, vec![9])];
    d.apply(&b);
    assert_eq!(
        d.token_ids(),
        3,
        "one copy for three keys; none for an unstored chunk"
    );
    let v = d.lookup(&[key("AA", 2, 0, ""), key("aa", 9, 0, "")]);
    assert_eq!(v[0].token_ids, [1, 2, 3]);
    // A key never stored still shows its chunk's tokens (0.5.6 looks them up by hash).
    assert!(v[1].placements.is_empty());
    assert_eq!(v[1].token_ids, [1, 2, 3]);
    let expanded = d.across_groups(vec![key("aa", 1, 0, "")], 10);
    let groups: Vec<i64> = expanded.iter().map(|k| k.object_group_id).collect();
    assert_eq!(groups, [0, 3]);
    for (rank, group) in [(1, 0), (2, 0), (1, 3)] {
        d.apply(&batch(
            "a",
            1,
            Tier::L2,
            "fs",
            false,
            vec![Op::Delete(key("aa", rank, group, ""))],
        ));
    }
    assert_eq!(d.token_ids(), 0);
    assert!(d.is_empty());
}

#[test]
fn limits_are_counted() {
    let mut d = Directory::new(DirectoryConfig {
        max_keys: 2,
        max_token_ids: 2,
        max_names: 64,
        blend: None,
    });
    let mut b = batch(
        "a",
        1,
        Tier::L2,
        "fs",
        false,
        (0..3)
            .map(|i| Op::Store(key(&format!("{i:02x}"), 0, 0, ""), 1))
            .collect(),
    );
    // A batch of stores arrives tail first (the model's order): "00" comes last, refused.
    b.tokens = vec![tokens("01", 0, vec![1, 2, 3])];
    d.apply(&b);
    assert_eq!(d.len(), 2);
    assert!(d.lookup(&[key("00", 0, 0, "")])[0].placements.is_empty());
    assert_eq!(d.counters.keys_refused, 1);
    assert_eq!(d.counters.tokens_refused, 1);
    d.apply(&batch(
        "a",
        1,
        Tier::L2,
        "fs",
        false,
        vec![Op::Store(key("abc", 0, 0, ""), 1)],
    ));
    assert_eq!(d.counters.keys_rejected, 1);
}

#[test]
fn scan_pages_and_filters() {
    let mut d = Directory::new(config(None));
    for i in 0..5u8 {
        let id = if i % 2 == 0 { "a" } else { "b" };
        d.apply(&batch(
            id,
            1,
            Tier::L2,
            "fs",
            false,
            vec![Op::Store(key(&format!("{i:02x}"), 0, 0, ""), 1)],
        ));
    }
    let all = KeyFilter::default();
    let mut st = Scan::default();
    while !d.scan(&all, 1, 2, 2, &mut st) {}
    assert_eq!(st.total, 5);
    let hexes: Vec<&str> = st
        .page
        .iter()
        .map(|k| k.key.chunk_hash_hex.as_str())
        .collect();
    assert_eq!(hexes, ["01", "02"]);
    let only_b = KeyFilter {
        instance_id: "b".into(),
        ..KeyFilter::default()
    };
    let mut st = Scan::default();
    while !d.scan(&only_b, 0, 10, 1000, &mut st) {}
    assert_eq!(st.total, 2);
    let mut st = Scan::default();
    let none = KeyFilter {
        instance_id: "zz".into(),
        ..KeyFilter::default()
    };
    assert!(d.scan(&none, 0, 10, 1000, &mut st));
    assert_eq!(st.total, 0);
}

#[test]
fn blend_finds_chunks_anywhere_in_its_namespace() {
    let mut d = Directory::new(config(Some((4, 1))));
    let content = vec![7, 8, 9, 10];
    let mut b = batch(
        "a",
        1,
        Tier::L2,
        "fs",
        false,
        vec![Op::Store(key("aa", 1 << 24, 0, "t"), 4)],
    );
    b.tokens = vec![tokens("aa", 12, content.clone())];
    d.apply(&b);
    let st = d.stats().blend;
    assert_eq!(
        (
            st.num_contents,
            st.num_chunks,
            st.num_claims,
            st.num_namespaces
        ),
        (1, 1, 1, 1)
    );
    let query = vec![1, 2, 3, 7, 8, 9, 10, 4];
    let probes = BlendIndex::probes(4, 1, &query);
    assert_eq!(
        d.blend_match(&query, &probes, ("m", "t", 1)),
        [("aa".to_owned(), 12, 3)]
    );
    // Another namespace (salt, world size) sees nothing.
    assert!(d.blend_match(&query, &probes, ("m", "", 1)).is_empty());
    assert!(d.blend_match(&query, &probes, ("m", "t", 2)).is_empty());
    // A stride that skips position 3 misses it.
    let probes = BlendIndex::probes(4, 2, &query);
    assert!(d.blend_match(&query, &probes, ("m", "t", 1)).is_empty());
    // Unknown offset: kept for lookups, not indexed.
    let mut b = batch(
        "a",
        1,
        Tier::L2,
        "fs",
        false,
        vec![Op::Store(key("bb", 1 << 24, 0, "t"), 4)],
    );
    b.tokens = vec![tokens("bb", -1, vec![1, 2, 3, 4])];
    d.apply(&b);
    assert_eq!(d.stats().blend.num_chunks, 1);
    // The last key going takes the chunk out of the index.
    d.apply(&batch(
        "a",
        1,
        Tier::L2,
        "fs",
        false,
        vec![Op::Delete(key("aa", 1 << 24, 0, "t"))],
    ));
    assert_eq!(
        d.stats().blend,
        blend::BlendStats {
            table_size: 1024,
            ..Default::default()
        }
    );
}

#[test]
fn dump_and_restore_keep_everything_and_rebuild_the_blend_index() {
    let mut d = Directory::new(config(Some((2, 1))));
    let mut b = batch(
        "a",
        7,
        Tier::L2,
        "fs",
        false,
        vec![
            Op::Store(key("aa", 0, 0, "s"), 3),
            Op::Store(key("bb", 0, 1, ""), 4),
        ],
    );
    b.tokens = vec![tokens("aa", 0, vec![5, 6])];
    d.apply(&b);
    d.apply(&batch(
        "b",
        2,
        Tier::L1,
        "dram",
        false,
        vec![Op::Store(key("aa", 0, 0, "s"), 3)],
    ));
    d.apply(&batch(
        "b",
        2,
        Tier::L2,
        "fs",
        false,
        vec![Op::Access(key("aa", 0, 0, "s"))],
    ));
    d.apply(&batch("c", 1, Tier::L1, "dram", false, vec![]));
    let dump = d.dump();
    let bytes = rmp_serde::to_vec(&dump).unwrap();
    let back: DirectoryDump = rmp_serde::from_slice(&bytes).unwrap();
    let mut r = Directory::restore(config(None), back);
    let keys = [key("aa", 0, 0, "s"), key("bb", 0, 1, "")];
    assert_eq!(r.lookup(&keys), d.lookup(&keys));
    assert_eq!(r.dump(), dump);
    let (a, b) = (r.stats(), d.stats());
    assert_eq!(a.l1_keys_by_instance, b.l1_keys_by_instance);
    assert_eq!(
        (a.num_keys, a.num_placements, a.l1_size_bytes),
        (b.num_keys, b.num_placements, b.l1_size_bytes)
    );
    r.enable_blend(2, 1);
    assert_eq!(r.stats().blend, d.stats().blend);
    // The restored fence still finds b's L1 placement.
    r.fence("b");
    assert_eq!(r.stats().l1_count, 0);
}

/// Bytes per key from the real allocations (`memory_bytes`), 60k keys: one L2 placement
/// each, without tokens, then with 256 token ids per chunk (world size 1: one chunk per key),
/// then world size 4 (four keys share a chunk's tokens). Printed with `--nocapture`.
#[test]
fn memory_per_key() {
    let n = 60_000u32;
    for (ranks, with_tokens, bound) in [(1u32, false, 280.0), (1, true, 1_350.0), (4, true, 560.0)]
    {
        let mut d = Directory::new(DirectoryConfig {
            max_keys: 1 << 24,
            max_token_ids: usize::MAX,
            max_names: 64,
            blend: None,
        });
        for chunk in 0..n / ranks {
            let hex = format!("{:064x}", u64::from(chunk) * 0x9E37_79B9 + 1);
            let ops = (0..ranks)
                .map(|r| {
                    Op::Store(
                        key(
                            &hex,
                            i64::from(ranks << 24 | r << 16 | ranks << 8 | r),
                            0,
                            "",
                        ),
                        16384,
                    )
                })
                .collect();
            let mut b = batch("mp-a", 1, Tier::L2, "fs", false, ops);
            if with_tokens {
                b.tokens = vec![tokens(&hex, 0, (chunk..chunk + 256).collect())];
            }
            d.apply(&b);
        }
        assert_eq!(d.len(), n as usize);
        let per_key = d.memory_bytes() as f64 / f64::from(n);
        println!(
            "directory: {per_key:.0} bytes per key (world size {ranks}, tokens: {with_tokens})"
        );
        assert!(per_key < bound, "{per_key} bytes per key");
    }
}
