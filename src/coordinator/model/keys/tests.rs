//! Unit tests of [`super::KeyStore`]: keys, placements, LRU order, departures, memory.

use super::*;

pub(crate) fn key(n: u64, salt: &str) -> EncodedKey {
    EncodedKey {
        chunk_hash_hex: format!("{n:064x}"),
        model_name: "m".into(),
        kv_rank: 16_777_472,
        object_group_id: 0,
        cache_salt: salt.into(),
    }
}

const ROOMY: Limits = Limits {
    keys: usize::MAX,
    extra_placements: usize::MAX,
};

fn lim(keys: usize) -> Limits {
    Limits {
        keys,
        extra_placements: keys,
    }
}

/// A store with holders "a" (1) and "b" (2) and backend "fs" (0).
fn store() -> KeyStore {
    let mut ks = KeyStore::new(100);
    assert_eq!(ks.holders.intern("a"), Some(1));
    assert_eq!(ks.holders.intern("b"), Some(2));
    assert_eq!(ks.holders.backend("fs"), Some(0));
    ks
}

fn oldest(ks: &mut KeyStore, salt: &str, n: usize) -> Vec<CompactKey> {
    ks.oldest_live(salt, n, usize::MAX, |_, _, _| false)
        .into_iter()
        .map(|(_, k, _)| k)
        .collect()
}

#[test]
fn store_touch_delete_keep_usage_and_lru_order() {
    let mut ks = store();
    for n in 0..4 {
        let k = ks.compact(&key(n, "a")).unwrap();
        assert_eq!(ks.store("a", k, 1, 0, 100, lim(10)), Ok(100));
    }
    assert_eq!(ks.salt_bytes("a"), 400);
    let k1 = ks.compact(&key(1, "a")).unwrap();
    assert!(ks.touch("a", &k1));
    let k0 = ks.compact(&key(0, "a")).unwrap();
    assert_eq!(ks.store("a", k0, 1, 0, 50, lim(10)), Ok(-50));
    assert_eq!(ks.salt_bytes("a"), 350);
    let order: Vec<_> = oldest(&mut ks, "a", 10)
        .iter()
        .map(|k| ks.encode("a", k).chunk_hash_hex)
        .collect();
    let want: Vec<_> = [2u64, 3, 1, 0]
        .iter()
        .map(|n| format!("{n:064x}"))
        .collect();
    assert_eq!(order, want);
    assert_eq!(ks.delete("a", &k1, 1, 0), Some(100));
    assert_eq!(ks.delete("a", &k1, 1, 0), None);
    assert_eq!(ks.salt_bytes("a"), 250);
    assert_eq!(oldest(&mut ks, "a", 2).len(), 2);
    // Another salt with the same key is a different key.
    assert!(!ks.touch("b", &k0));
    assert_eq!(ks.store("b", k0, 1, 0, 1, lim(10)), Ok(1));
    assert_eq!(ks.len(), 4);
    // The limit applies to new keys only.
    let mut full = store();
    let a = full.compact(&key(1, "")).unwrap();
    let b = full.compact(&key(2, "")).unwrap();
    assert_eq!(full.store("", a, 1, 0, 1, lim(1)), Ok(1));
    assert_eq!(full.store("", b, 1, 0, 1, lim(1)), Err(Untracked::Keys));
    assert_eq!(full.store("", a, 1, 0, 2, lim(1)), Ok(1));
}

#[test]
fn removing_the_last_placement_forgets_the_key_and_the_salt_and_reuses_the_slot() {
    let mut ks = store();
    let k = ks.compact(&key(7, "s")).unwrap();
    ks.store("s", k, 1, 0, 9, lim(10)).unwrap();
    ks.delete("s", &k, 1, 0);
    assert_eq!(ks.salts().count(), 0);
    ks.store("t", k, 1, 0, 9, lim(10)).unwrap();
    assert_eq!(ks.segments.iter().map(Vec::len).sum::<usize>(), 1);
    assert_eq!(oldest(&mut ks, "t", 5), vec![k]);
}

/// A private copy counts once per holder, a shared backend once for the fleet; a delete from
/// one holder leaves the others' copies.
#[test]
fn placements_count_per_holder_and_a_delete_takes_one() {
    let mut ks = store();
    let nfs = ks.holders.backend("nfs").unwrap();
    let k = ks.compact(&key(1, "s")).unwrap();
    ks.store("s", k, 1, 0, 100, lim(10)).unwrap();
    ks.store("s", k, 2, 0, 100, lim(10)).unwrap();
    ks.store("s", k, FLEET, nfs, 100, lim(10)).unwrap();
    // The same holder and backend again: an update, not a copy.
    assert_eq!(ks.store("s", k, 2, 0, 100, lim(10)), Ok(0));
    assert_eq!((ks.salt_bytes("s"), ks.placement_count()), (300, 3));
    // "b" deletes its copy: "a"'s and the shared one stay.
    assert_eq!(ks.delete("s", &k, 2, 0), Some(100));
    assert_eq!(ks.delete("s", &k, 2, 0), None);
    assert_eq!(ks.salt_bytes("s"), 200);
    // The first placement goes: the other one takes its place.
    assert_eq!(ks.delete("s", &k, 1, 0), Some(100));
    let left = ks.oldest_live("s", 1, 10, |_, _, _| false);
    assert_eq!(left[0].2.len(), 1);
    assert_eq!((left[0].2[0].holder, left[0].2[0].backend), (FLEET, nfs));
    assert_eq!(ks.delete("s", &k, FLEET, nfs), Some(100));
    assert_eq!(
        (ks.len(), ks.placement_count(), ks.salt_bytes("s")),
        (0, 0, 0)
    );
    // The extra-placement limit refuses another copy, not the key's first.
    let mut tight = store();
    let k = tight.compact(&key(1, "s")).unwrap();
    let one = Limits {
        keys: 10,
        extra_placements: 0,
    };
    tight.store("s", k, 1, 0, 5, one).unwrap();
    assert_eq!(
        tight.store("s", k, 2, 0, 5, one),
        Err(Untracked::Placements)
    );
    assert_eq!(tight.salt_bytes("s"), 5);
}

#[test]
fn a_departed_holder_stops_counting_until_it_returns_or_expires() {
    let mut ks = store();
    let (k1, k2) = (
        ks.compact(&key(1, "s")).unwrap(),
        ks.compact(&key(2, "s")).unwrap(),
    );
    ks.store("s", k1, 1, 0, 10, lim(10)).unwrap();
    ks.store("s", k2, 1, 0, 20, lim(10)).unwrap();
    ks.store("s", k2, 2, 0, 20, lim(10)).unwrap();
    ks.depart("a", 100.0);
    assert_eq!(ks.salt_bytes("s"), 20);
    // k1 is held by "a" alone: no victim; the walk moves it to the recent end.
    let live = ks.oldest_live("s", 5, 5, |_, _, _| false);
    assert_eq!(live.len(), 1);
    assert_eq!((live[0].1, live[0].2.len()), (k2, 1));
    assert_eq!(ks.oldest_live("s", 1, 1, |_, _, _| false)[0].1, k2);
    // Back: counted again.
    ks.revive("a");
    assert_eq!(ks.salt_bytes("s"), 50);
    ks.depart("a", 100.0);
    assert!(ks.expire(99.0).is_empty());
    assert_eq!(ks.expire(100.0), vec![("a".into(), "fs".into(), 30)]);
    assert_eq!(
        (ks.len(), ks.placement_count(), ks.salt_bytes("s")),
        (1, 1, 20)
    );
    // "a" held nothing more: freed, its index reused.
    assert_eq!(ks.holders.find("a"), None);
    assert_eq!(ks.holders.intern("c"), Some(1));
}

#[test]
fn dump_and_restore_keep_keys_placements_order_and_departures() {
    let mut ks = store();
    for n in 0..5 {
        let k = ks.compact(&key(n, "s")).unwrap();
        ks.store("s", k, 1, 0, 10, ROOMY).unwrap();
        if n % 2 == 0 {
            ks.store("s", k, 2, 0, 10, ROOMY).unwrap();
        }
    }
    let k3 = ks.compact(&key(3, "s")).unwrap();
    ks.touch("s", &k3);
    ks.depart("b", 5.0);
    let dump = ks.dump();
    let mut back = KeyStore::restore(dump.clone(), ROOMY, 100).unwrap();
    assert_eq!(back.dump(), dump);
    assert_eq!(back.salt_bytes("s"), ks.salt_bytes("s"));
    assert_eq!(oldest(&mut back, "s", 9), oldest(&mut ks, "s", 9));
    assert!(KeyStore::restore(dump, lim(2), 100).is_err());
}

#[test]
fn encode_round_trips_and_normalises_case() {
    let mut ks = store();
    let mut wire = key(0xABCD, "user-a");
    wire.chunk_hash_hex = "0ABCDEF1".into();
    wire.object_group_id = 3;
    let k = ks.compact(&wire).unwrap();
    let back = ks.encode("user-a", &k);
    assert_eq!(back.chunk_hash_hex, "0abcdef1");
    assert_eq!(back.object_group_id, 3);
    assert_eq!(back.kv_rank, 16_777_472);
    assert_eq!(back.model_name, "m");
    assert_eq!(back.cache_salt, "user-a");
    // The empty hash is valid.
    wire.chunk_hash_hex.clear();
    assert!(ks.compact(&wire).is_ok());
}

#[test]
fn bad_keys_are_rejected_with_the_reason() {
    let mut ks = store();
    type Case = (fn(&mut EncodedKey), KeyError);
    let cases: [Case; 7] = [
        (|k| k.chunk_hash_hex = "abc".into(), KeyError::BadHex),
        (|k| k.chunk_hash_hex = "zz".into(), KeyError::BadHex),
        (
            |k| k.chunk_hash_hex = "00".repeat(33),
            KeyError::HashTooLong,
        ),
        (|k| k.kv_rank = -1, KeyError::OutOfRange("kv_rank")),
        (
            |k| k.object_group_id = 256,
            KeyError::OutOfRange("object_group_id"),
        ),
        (
            |k| k.model_name = "a@b".into(),
            KeyError::Invalid("model_name"),
        ),
        (
            |k| k.cache_salt = "a/b".into(),
            KeyError::Invalid("cache_salt"),
        ),
    ];
    for (mutate, want) in cases {
        let mut k = key(1, "");
        mutate(&mut k);
        assert_eq!(ks.compact(&k), Err(want));
    }
}

#[test]
fn copies_in_other_object_groups_are_found() {
    let mut ks = store();
    let mut g3 = key(1, "s");
    g3.object_group_id = 3;
    let mut g200 = key(1, "s");
    g200.object_group_id = 200;
    for k in [&g200, &g3, &key(2, "s")] {
        let c = ks.compact(k).unwrap();
        ks.store("s", c, 1, 0, 1, lim(100)).unwrap();
    }
    // Key 1 in group 0 is not tracked itself; its copies are, by ascending group.
    assert_eq!(
        ks.in_other_groups(&key(1, "s")),
        vec![g3.clone(), g200.clone()]
    );
    assert_eq!(ks.in_other_groups(&g3), vec![g200]);
    assert!(ks.in_other_groups(&key(2, "s")).is_empty());
    assert!(ks.in_other_groups(&key(1, "other")).is_empty());
}

/// A salt past [`SPLIT_AT`] keys is split into [`SHARDS`] tables: every key stays
/// findable, removable and in LRU order across the split.
#[test]
fn a_large_salt_is_split_and_keeps_its_keys_and_order() {
    let mut ks = store();
    let n = (SPLIT_AT + 1_000) as u64;
    let keys: Vec<_> = (0..n)
        .map(|i| ks.compact(&key(i, "big")).unwrap())
        .collect();
    for k in &keys {
        assert_eq!(ks.store("big", *k, 1, 0, 2, ROOMY), Ok(2));
    }
    assert_eq!(ks.salts["big"].tables.len(), SHARDS);
    assert_eq!(ks.salt_len("big"), n as usize);
    assert!(ks.salts["big"].tables.iter().all(|t| !t.is_empty()));
    assert!(keys.iter().all(|k| ks.contains("big", k)));
    // Updates find the key in its shard (no duplicate); deletes shrink the salt.
    assert_eq!(ks.store("big", keys[0], 1, 0, 3, ROOMY), Ok(1));
    for k in &keys[1..1_001] {
        assert_eq!(ks.delete("big", k, 1, 0), Some(2));
    }
    assert_eq!(ks.salt_len("big"), n as usize - 1_000);
    assert_eq!(ks.salt_bytes("big"), 2 * (n - 1_001) + 3);
    // Oldest: 1_001, 1_002, … (0 was stored again last).
    assert_eq!(oldest(&mut ks, "big", 2), vec![keys[1_001], keys[1_002]]);
    assert_eq!(oldest(&mut ks, "big", n as usize).last(), Some(&keys[0]));
}

/// Bytes per tracked key, measured from the real allocations (arena segments, hash tables,
/// the side table of other placements, holder tables) at sizes just before and after table
/// resizes: with one placement each, and with every key also held by a second server.
#[test]
fn memory_per_key() {
    assert_eq!(std::mem::size_of::<Slot>(), 56);
    assert_eq!(std::mem::size_of::<Placement>(), 8);
    for holders in [1u16, 2] {
        let mut ks = store();
        let mut worst = 0.0f64;
        for n in 0..300_000u64 {
            let k = ks.compact(&key(n, "")).unwrap();
            for h in 1..=holders {
                ks.store("", k, h, 0, 1, ROOMY).unwrap();
            }
            let len = n + 1;
            if len >= 50_000 && (len % 4_096 == 1 || len % 7_919 == 0) {
                let per_key = ks.memory_bytes() as f64 / len as f64;
                worst = worst.max(per_key);
            }
        }
        eprintln!("worst bytes per tracked key with {holders} placement(s): {worst:.1}");
        let bound = if holders == 1 { 73.0 } else { 100.0 };
        assert!(worst <= bound, "{holders}: worst bytes per key {worst:.1}");
        assert!(worst > 56.0, "measured {worst:.1}: the arena alone is 56");
    }
}
