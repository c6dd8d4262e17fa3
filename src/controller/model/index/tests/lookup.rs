//! Unit tests of the index's reads: P2P lookups (own instance excluded, longest prefix, ties,
//! holders without a peer url), hashes of both signs, prefix holders, and the views and counts
//! the HTTP routes show. Tests only.

use super::*;

#[test]
fn p2p_excludes_own_instance_and_prefers_longest_prefix() {
    let mut ix = ChunkIndex::new();
    reg(&mut ix, "x", 0);
    reg(&mut ix, "y", 0);
    reg(&mut ix, "z", 0);
    put(&mut ix, "x", 0, CPU, &[10, 20]);
    put(&mut ix, "y", 0, CPU, &[10, 20, 30]);
    put(&mut ix, "z", 0, CPU, &[10]);
    let q = hs(&[10, 20, 30, 40]);
    let hit = ix.p2p_lookup(&q, "z", 0).unwrap();
    assert_eq!(
        hit,
        P2PHit {
            instance_id: "y",
            worker_id: 0,
            location: CPU,
            num_hit_chunks: 3,
            peer_init_url: "y:0"
        }
    );
    // The requester's own instance is never returned, even with the longest prefix.
    let hit = ix.p2p_lookup(&q, "y", 0).unwrap();
    assert_eq!((hit.instance_id, hit.num_hit_chunks), ("x", 2));
    assert_eq!(ix.p2p_lookup(&hs(&[30]), "y", 0), None);
    assert_eq!(ix.p2p_lookup(&[], "z", 0), None);
    assert_eq!(ix.p2p_lookup(&hs(&[99]), "z", 0), None);
    // An unknown requester instance excludes nothing.
    assert_eq!(ix.p2p_lookup(&q, "new", 0).unwrap().instance_id, "y");
}

#[test]
fn p2p_tie_prefers_same_rank_then_registration_order() {
    let mut ix = ChunkIndex::new();
    for inst in ["x", "y"] {
        for wid in 0..4 {
            reg(&mut ix, inst, wid);
            put(&mut ix, inst, wid, CPU, &[1, 2]);
        }
    }
    for rank in 0..4 {
        let hit = ix.p2p_lookup(&hs(&[1, 2]), "req", rank).unwrap();
        assert_eq!((hit.instance_id, hit.worker_id), ("x", rank));
        assert_eq!(hit.peer_init_url, format!("x:{rank}"));
        let hit = ix.p2p_lookup(&hs(&[1, 2]), "x", rank).unwrap();
        assert_eq!((hit.instance_id, hit.worker_id), ("y", rank));
    }
    // No same-rank holder: first in registration order.
    let hit = ix.p2p_lookup(&hs(&[1]), "req", 7).unwrap();
    assert_eq!((hit.instance_id, hit.worker_id), ("x", 0));
    // A longer prefix beats the same rank.
    put(&mut ix, "y", 2, DISK, &[1, 2, 3]);
    let hit = ix.p2p_lookup(&hs(&[1, 2, 3]), "req", 0).unwrap();
    assert_eq!(
        (
            hit.instance_id,
            hit.worker_id,
            hit.location,
            hit.num_hit_chunks
        ),
        ("y", 2, DISK, 3)
    );
}

#[test]
fn p2p_skips_holders_without_peer_url() {
    let mut ix = ChunkIndex::new();
    ix.register("x", 0, "10.0.0.1", 9000, None, 1.0).unwrap();
    reg(&mut ix, "y", 0);
    put(&mut ix, "x", 0, CPU, &[1, 2, 3]);
    put(&mut ix, "y", 0, CPU, &[1]);
    let hit = ix.p2p_lookup(&hs(&[1, 2, 3]), "req", 0).unwrap();
    assert_eq!((hit.instance_id, hit.num_hit_chunks), ("y", 1));
    ix.deregister("y", 0);
    assert_eq!(ix.p2p_lookup(&hs(&[1]), "req", 0), None);
    // prefix_holders does not filter on the peer url.
    let all = ix.prefix_holders(&hs(&[1, 2, 3]));
    assert_eq!(all.len(), 1);
    assert_eq!((all[0].matched, all[0].peer_init_url), (3, None));
}

#[test]
fn negative_and_u64_hashes_with_the_same_bits_are_distinct() {
    let mut ix = ChunkIndex::new();
    reg(&mut ix, "x", 0);
    let neg = ChunkHash::from_i64(-16);
    let big = ChunkHash::from_u64(u64::MAX - 15);
    let ops = [KVOpEvent {
        op_type: OpType::Admit,
        key: neg,
        seq_num: 0,
    }];
    ix.apply_batch("x", 0, CPU, &ops, 1.0);
    assert!(ix.p2p_lookup(&[neg], "req", 0).is_some());
    assert_eq!(ix.p2p_lookup(&[big], "req", 0), None);
    assert_eq!(
        ix.p2p_lookup(&[neg, big], "req", 0).unwrap().num_hit_chunks,
        1
    );
    let ops = [KVOpEvent {
        op_type: OpType::Evict,
        key: big,
        seq_num: 1,
    }];
    ix.apply_batch("x", 0, CPU, &ops, 1.0);
    assert_eq!(ix.keys_of("x", 0, CPU), vec![neg]);
}

#[test]
fn prefix_holders_reports_every_holder_in_registration_order() {
    let mut ix = ChunkIndex::new();
    reg(&mut ix, "x", 0);
    reg(&mut ix, "x", 1);
    reg(&mut ix, "y", 0);
    put(&mut ix, "y", 0, CPU, &[1, 2, 3]);
    put(&mut ix, "x", 1, DISK, &[1]);
    put(&mut ix, "x", 1, CPU, &[1, 2]);
    put(&mut ix, "x", 0, CPU, &[2, 3]);
    let got: Vec<_> = ix
        .prefix_holders(&hs(&[1, 2, 3, 4]))
        .into_iter()
        .map(|p| (p.instance_id, p.worker_id, p.location, p.matched))
        .collect();
    assert_eq!(
        got,
        vec![("x", 1, DISK, 1), ("x", 1, CPU, 2), ("y", 0, CPU, 3)]
    );
    assert!(ix.prefix_holders(&[]).is_empty());
}

#[test]
fn views_and_counts() {
    let mut ix = ChunkIndex::new();
    reg(&mut ix, "b", 0);
    reg(&mut ix, "a", 0);
    reg(&mut ix, "a", 1);
    ix.register("c", 0, "10.0.0.7", 1, None, 1.0).unwrap();
    put(&mut ix, "a", 0, CPU, &[1, 2]);
    put(&mut ix, "a", 1, CPU, &[1, 2]);
    put(&mut ix, "a", 1, DISK, &[3]);
    assert_eq!(
        (ix.worker_count(), ix.instance_count(), ix.key_count()),
        (4, 3, 5)
    );
    assert_eq!(
        ix.instances(),
        vec![
            InstanceSummary {
                instance_id: "b".into(),
                key_count: 0,
                worker_count: 1
            },
            InstanceSummary {
                instance_id: "a".into(),
                key_count: 5,
                worker_count: 2
            },
            InstanceSummary {
                instance_id: "c".into(),
                key_count: 0,
                worker_count: 1
            },
        ]
    );
    let order: Vec<_> = ix
        .workers()
        .iter()
        .map(|w| (w.instance_id.clone(), w.worker_id))
        .collect();
    assert_eq!(
        order,
        vec![
            ("b".into(), 0),
            ("a".into(), 0),
            ("a".into(), 1),
            ("c".into(), 0)
        ]
    );
    let w = ix.worker("a", 1).unwrap();
    assert_eq!(w.key_count, 3);
    assert_eq!(
        w.locations,
        vec![
            LocationView {
                name: CPU.into(),
                key_count: 2,
                last_seq: Some(1)
            },
            LocationView {
                name: DISK.into(),
                key_count: 1,
                last_seq: Some(0)
            },
        ]
    );
    assert_eq!(ix.instance_workers("a").map(|v| v.len()), Some(2));
    assert_eq!(ix.instance_by_ip("10.0.0.1"), Some("b"));
    assert_eq!(ix.instance_by_ip("10.0.0.7"), Some("c"));
    assert_eq!(ix.instance_by_ip("10.9.9.9"), None);
    assert!(ix.worker("a", 9).is_none());
    assert!(ix.keys_of("a", 0, "nope").is_empty());
    let stats = ix.memory_stats();
    assert_eq!(stats.live_memberships, 5);
    assert_eq!(stats.map_entries, 3);
    assert!(stats.bytes_per_membership > 0.0);
}
