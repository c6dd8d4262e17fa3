use super::*;
use std::collections::BTreeMap;

/// Inserts through the lane of `(stream, ns)`.
#[allow(clippy::too_many_arguments)]
fn put(
    s: &mut Store,
    stream: u16,
    engine: u64,
    ns: u32,
    seq: u64,
    tier: Medium,
    now: u32,
    parent: Option<(RecId, u64)>,
) -> RecId {
    let lane = s.lane(stream, ns).expect("a lane");
    s.insert(lane, engine, seq, tier, now, parent)
        .expect("room")
}

/// Every live record is found the way a query finds it: through `by_block` when it is a
/// head, else from the record before it, which is live, in the same lane, and whose chain it
/// continues. Returns the number of heads.
fn check_reachable(s: &Store) -> usize {
    let mut heads = 0;
    for i in 0..s.arena_len() as RecId {
        let r = s.rec(i);
        if r.is_free() {
            continue;
        }
        let (ns, seq) = (s.ns_of(&r), r.seq());
        let mut found = false;
        s.for_each_head(ns, seq, |h| found |= h == i);
        if found {
            heads += 1;
            assert!(
                i == 0 || s.next_in_chain(i - 1, seq) != Some(i),
                "{i} is a head and a continuation"
            );
        } else {
            assert!(i > 0, "record 0 is not a head");
            let p = s.rec(i - 1);
            assert!(!p.is_free(), "{i} continues a free record");
            assert_eq!(p.lane(), r.lane(), "{i} continues another lane");
            assert_eq!(s.next_in_chain(i - 1, seq), Some(i), "{i} is unreachable");
        }
    }
    assert_eq!(heads, s.heads());
    heads
}

#[test]
fn records_take_22_bytes() {
    assert_eq!(std::mem::size_of::<Rec>(), 22);
    assert_eq!(std::mem::align_of::<Rec>(), 2);
}

#[test]
fn offload_references_saturate_and_gpu_is_one() {
    let mut s = Store::new(1);
    let id = put(&mut s, 0, 7, 0, 70, Medium::Cpu, 1, None);
    for _ in 0..40 {
        s.add_ref(id, Medium::Cpu, 2);
        s.add_ref(id, Medium::Gpu, 2);
    }
    assert_eq!(s.rec(id).refs(Medium::Cpu), MAX_OFFLOAD_REFS);
    assert_eq!(s.rec(id).refs(Medium::Gpu), 1);
    assert_eq!(s.rec(id).refs(Medium::Disk), 0);
    assert_eq!(s.rec(id).mask(), 0b011);
    assert_eq!(s.memberships(), 2);
    assert!(s.drop_ref(id, Medium::Gpu, false));
    assert!(!s.drop_ref(id, Medium::Cpu, false));
    assert!(s.drop_ref(id, Medium::Cpu, true));
    assert_eq!((s.memberships(), s.records(), s.heads()), (0, 0, 0));
    assert_eq!(s.find_engine(0, 7), None);
}

#[test]
fn a_chain_stored_in_one_piece_is_one_head_and_survives_its_middle_going() {
    let mut s = Store::new(1);
    let mut prev = None;
    let ids: Vec<RecId> = (0..10u64)
        .map(|i| {
            let id = put(&mut s, 3, 100 + i, 0, 1000 + i, Medium::Gpu, 0, prev);
            prev = Some((id, 1000 + i));
            id
        })
        .collect();
    assert_eq!(ids, (0..10).collect::<Vec<_>>());
    assert_eq!(check_reachable(&s), 1);
    // A continuation needs the right hash: another block's does not follow.
    assert_eq!(s.next_in_chain(4, 1005), Some(5));
    assert_eq!(s.next_in_chain(4, 1006), None);
    // The middle goes: the block after it becomes a head, the rest still follow.
    assert!(s.drop_ref(5, Medium::Gpu, true));
    assert_eq!(check_reachable(&s), 2);
    // A child of block 4 stored now takes the free slot right after it.
    let id = put(&mut s, 3, 555, 0, 2005, Medium::Gpu, 1, Some((4, 1004)));
    assert_eq!(id, 5);
    assert_eq!(s.next_in_chain(4, 2005), Some(5));
    assert_eq!(check_reachable(&s), 2);
    // Another stream's block does not continue this one's chain.
    let other = put(&mut s, 4, 100, 0, 1000, Medium::Gpu, 1, Some((9, 1009)));
    assert_eq!(other, 10);
    assert_eq!(check_reachable(&s), 3);
}

/// A model: `(stream, engine) → (ns, seq, per-tier refs)`, driven by random operations that
/// store chains (a block's parent a random record of its stream), drop references and free
/// many at once; the store must agree on every lookup and count, and keep every record
/// reachable.
#[test]
fn matches_a_model_under_random_operations() {
    type Key = (u16, u64);
    let mut s = Store::new(1);
    let mut model: BTreeMap<Key, (u32, u64, [u8; 3])> = BTreeMap::new();
    let mut x: u64 = 0x1234_5678;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut peak = 0usize;
    let mut next_engine = 1u64;
    for step in 0..20_000u32 {
        let r = rnd();
        let stream = (r % 3) as u16;
        let tier = Medium::ALL[((r >> 20) % 3) as usize];
        match (r >> 30) % 8 {
            // A new chain of 1–6 blocks, from nothing or from one of the stream's records.
            0..=2 => {
                let ns = ((r >> 40) % 2) as u32;
                let mut parent = None;
                if (r >> 44) & 1 == 1 {
                    let of_stream: Vec<_> = model
                        .iter()
                        .filter(|((st, _), m)| *st == stream && m.0 == ns)
                        .map(|((_, e), m)| (*e, m.1))
                        .collect();
                    if !of_stream.is_empty() {
                        let (e, seq) = of_stream[(r >> 50) as usize % of_stream.len()];
                        parent = s.find_engine(stream, e).map(|id| (id, seq));
                    }
                }
                for _ in 0..1 + (r >> 45) % 6 {
                    let engine = next_engine;
                    next_engine += 1;
                    let seq = mix(engine ^ u64::from(ns));
                    let id = put(&mut s, stream, engine, ns, seq, tier, step, parent);
                    let mut refs = [0; 3];
                    refs[tier.index()] = 1;
                    model.insert((stream, engine), (ns, seq, refs));
                    parent = Some((id, seq));
                }
            }
            // One more reference on an existing record.
            3 => {
                let keys: Vec<Key> = model.keys().copied().collect();
                if let Some(k) = keys.get((r >> 8) as usize % keys.len().max(1)) {
                    let id = s.find_engine(k.0, k.1).expect("live");
                    let m = model.get_mut(k).unwrap();
                    assert_eq!(s.add_ref(id, tier, step), m.2[tier.index()] == 0);
                    let cap = if tier == Medium::Gpu {
                        1
                    } else {
                        MAX_OFFLOAD_REFS
                    };
                    m.2[tier.index()] = (m.2[tier.index()] + 1).min(cap);
                }
            }
            // Free a random tenth of the records at once (the bulk path when many).
            4 if step % 50 == 0 => {
                let mut gone = Vec::new();
                for (k, m) in &mut model {
                    if rnd() % 10 == 0 {
                        let id = s.find_engine(k.0, k.1).expect("live");
                        for t in Medium::ALL {
                            s.drop_ref_deferred(id, t, true);
                        }
                        m.2 = [0; 3];
                        gone.push(id);
                    }
                }
                s.unindex_many(&gone);
                model.retain(|_, m| m.2 != [0; 3]);
            }
            // Drop references one at a time.
            _ => {
                let keys: Vec<Key> = model.keys().copied().collect();
                if let Some(k) = keys.get((r >> 8) as usize % keys.len().max(1)) {
                    let all = (r >> 40) & 1 == 0;
                    let id = s.find_engine(k.0, k.1).expect("live");
                    let m = model.get_mut(k).unwrap();
                    let before = m.2[tier.index()];
                    let ended = s.drop_ref(id, tier, all);
                    if before > 0 {
                        m.2[tier.index()] = if all { 0 } else { before - 1 };
                    }
                    assert_eq!(ended, before > 0 && m.2[tier.index()] == 0);
                    model.retain(|_, m| m.2 != [0; 3]);
                }
            }
        }
        s.collect_lanes();
        peak = peak.max(model.len());
        if step % 500 == 0 {
            check_reachable(&s);
        }
    }
    check_reachable(&s);
    let memberships: usize = model
        .values()
        .map(|m| m.2.iter().filter(|r| **r > 0).count())
        .sum();
    assert_eq!(s.memberships(), memberships);
    assert_eq!(s.records(), model.len());
    for ((st, engine), m) in &model {
        let id = s.find_engine(*st, *engine).expect("a live record");
        let r = s.rec(id);
        assert_eq!(
            (s.ns_of(&r), r.seq(), r.engine(), s.stream_of(&r)),
            (m.0, m.1, *engine, *st)
        );
        for t in Medium::ALL {
            assert_eq!(r.refs(t), m.2[t.index()]);
        }
    }
    // Freed records are reused: the arena never outgrows the peak of live records.
    assert!(s.arena_len() <= peak, "{} > {peak}", s.arena_len());
    // Lanes go with their last record.
    let lanes: std::collections::BTreeSet<(u16, u32)> =
        model.iter().map(|((st, _), m)| (*st, m.0)).collect();
    assert_eq!(s.lanes(), lanes.len());
}

/// The memory target: ≤ 32 bytes per membership at 10M memberships. A 10M-entry store is too
/// big for a unit test on a shared machine, so this fills 1M single-holder blocks (the worst
/// case: no record shares a block) in prompts of 128 blocks, and checks the allocation the
/// store reports.
#[test]
fn bytes_per_membership_at_a_million() {
    let mut s = Store::new(1);
    let n = 1_000_000u64;
    let mut prev = None;
    for i in 0..n {
        if i % 128 == 0 {
            prev = None;
        }
        let h = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let id = put(
            &mut s,
            (i / 128 % 64) as u16,
            h,
            0,
            h ^ 1,
            Medium::Gpu,
            0,
            prev,
        );
        prev = Some((id, h ^ 1));
    }
    assert_eq!(s.memberships(), n as usize);
    assert_eq!(s.heads(), n.div_ceil(128) as usize);
    let per = s.heap_bytes() as f64 / n as f64;
    // The arena's 22 B with its spare capacity (1,048,576 records), 4 B an id at 70–87.5%
    // in the engine table, and one head a prompt.
    eprintln!("{per:.1} B per membership at 1M");
    assert!(per <= 32.0, "{per} bytes per membership at 1M");
}

/// Freeing many records by rebuilding the tables leaves exactly what freeing them one by
/// one leaves: the same lookups, heads, counts and reuse order.
#[test]
fn bulk_and_one_by_one_unindexing_agree() {
    let fill = || {
        let mut s = Store::new(1);
        let mut prev = None;
        for i in 0..3_000u64 {
            // Streams 0–2 in chains of 10; some engine hashes repeat across streams.
            let stream = (i / 10 % 3) as u16;
            if i % 10 == 0 {
                prev = None;
            }
            let seq = mix(i / 30 * 10 + i % 10);
            let id = put(
                &mut s,
                stream,
                i / 2,
                (i / 10 % 2) as u32,
                seq,
                Medium::ALL[(i % 3) as usize],
                0,
                prev,
            );
            prev = Some((id, seq));
        }
        s
    };
    let (mut bulk, mut single) = (fill(), fill());
    let gone: Vec<RecId> = (0..bulk.arena_len() as RecId)
        .filter(|i| bulk.stream_of(&bulk.rec(*i)) == 1 || i % 7 == 0)
        .collect();
    assert!(gone.len() * 4 >= bulk.records(), "the bulk path runs");
    for s in [&mut bulk, &mut single] {
        for &id in &gone {
            for t in Medium::ALL {
                s.drop_ref_deferred(id, t, true);
            }
        }
    }
    bulk.unindex_many(&gone);
    for &id in &gone {
        single.unindex_many(&[id]);
    }
    assert_eq!(
        (bulk.heads(), bulk.memberships(), bulk.records()),
        (single.heads(), single.memberships(), single.records())
    );
    assert_eq!(check_reachable(&bulk), check_reachable(&single));
    for i in 0..3_000u64 {
        for st in 0..3 {
            assert_eq!(bulk.find_engine(st, i / 2), single.find_engine(st, i / 2));
        }
    }
    for i in 0..100u64 {
        let a = put(&mut bulk, 5, 1 << 40 | i, 0, i, Medium::Gpu, 1, None);
        let b = put(&mut single, 5, 1 << 40 | i, 0, i, Medium::Gpu, 1, None);
        assert_eq!(a, b, "freed records are reused in the same order");
    }
}

#[test]
fn ages_are_exact_up_to_the_clamp_and_never_wrap_once_clamped() {
    let mut s = Store::new(1);
    let id = put(&mut s, 0, 1, 0, 1, Medium::Gpu, 100, None);
    let age = |s: &Store, now: u32| s.rec(id).age(s.tick(now));
    assert_eq!(age(&s, 100), 0);
    assert_eq!(age(&s, 100 + MAX_AGE), MAX_AGE);
    assert!(!s.clamp_age(id, s.tick(100 + MAX_AGE)));
    assert!(s.clamp_age(id, s.tick(101 + MAX_AGE)));
    assert_eq!(age(&s, 101 + MAX_AGE), MAX_AGE);
    // Clamped often enough (every MAX_AGE ticks), a record never looks young again.
    for k in 2..10u32 {
        let now = 100 + k * MAX_AGE;
        s.clamp_age(id, s.tick(now));
        assert!(age(&s, now) >= MAX_AGE / 2, "{k}");
    }
    // Ticks of several seconds.
    let mut s = Store::new(4);
    let id = put(&mut s, 0, 1, 0, 1, Medium::Gpu, 8, None);
    assert_eq!(s.rec(id).age(s.tick(11)), 0);
    assert_eq!(s.rec(id).age(s.tick(12)), 1);
}

/// Freeing every other record of one long chain in one batch turns the rest into heads: the
/// rebuilt block table must have room for far more heads than it held (one).
#[test]
fn a_batch_of_frees_can_make_many_more_heads_than_there_were() {
    let mut s = Store::new(1);
    let mut prev = None;
    for i in 0..10_000u64 {
        let id = put(&mut s, 0, i, 0, mix(i), Medium::Gpu, 0, prev);
        prev = Some((id, mix(i)));
    }
    assert_eq!(s.heads(), 1);
    let gone: Vec<RecId> = (0..10_000).step_by(2).collect();
    for &id in &gone {
        s.drop_ref_deferred(id, Medium::Gpu, true);
    }
    s.unindex_many(&gone);
    assert_eq!(s.heads(), 5_000);
    assert_eq!(check_reachable(&s), 5_000);
}

/// A dump restores the same arena with tables that find every record; a dump whose links
/// point outside what it holds is refused, not a panic later.
#[test]
fn a_dump_restores_the_arena_and_a_broken_one_is_refused() {
    let mut s = Store::new(1);
    let a = put(&mut s, 0, 10, 0, 100, Medium::Gpu, 1, None);
    put(&mut s, 0, 11, 0, 101, Medium::Gpu, 1, Some((a, 100)));
    let b = put(&mut s, 1, 20, 1, 200, Medium::Cpu, 2, None);
    s.drop_ref(b, Medium::Cpu, true);
    s.collect_lanes();
    let dump = s.dump();
    let restored = Store::restore(dump.clone()).expect("restores");
    assert_eq!(restored.dump(), dump);
    assert_eq!(check_reachable(&restored), check_reachable(&s));
    assert_eq!(restored.find_engine(0, 11), s.find_engine(0, 11));
    let broken = |f: &dyn Fn(&mut StoreDump)| {
        let mut d = dump.clone();
        f(&mut d);
        Store::restore(d)
    };
    assert!(broken(&|d| d.lanes.clear()).is_err(), "a record's lane");
    assert!(broken(&|d| d.free = 999).is_err(), "a free link");
    assert!(broken(&|d| d.recs.truncate(21)).is_err(), "a torn arena");
    assert!(
        broken(&|d| d.ns_lanes.clear()).is_err(),
        "a lane's namespace"
    );
}
