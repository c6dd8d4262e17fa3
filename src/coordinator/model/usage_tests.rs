//! Unit tests of [`super::Usage`].

use super::*;

fn key(n: u64) -> EncodedKey {
    EncodedKey {
        chunk_hash_hex: format!("{n:04x}"),
        model_name: "m".into(),
        kv_rank: 0,
        object_group_id: 0,
        cache_salt: String::new(),
    }
}

fn module(tier: Tier, backend: &str, cap: u64, shared: bool) -> Module {
    Module {
        tier,
        backend: backend.into(),
        capacity_bytes: cap,
        shared,
    }
}

fn used(u: &Usage, id: &str) -> Vec<(Tier, String, u64, u64, Option<f64>)> {
    u.instance(id, true)
        .unwrap()
        .modules
        .into_iter()
        .map(|m| {
            (
                m.tier,
                m.backend,
                m.used_bytes,
                m.capacity_bytes,
                m.usage_ratio,
            )
        })
        .collect()
}

#[test]
fn l1_placements_move_totals_by_their_real_size() {
    let mut u = Usage::new(10, 100);
    u.l1_store("a", "dram", &key(1), 100);
    u.l1_store("a", "dram", &key(2), 50);
    // A re-store replaces the size; a delete (no size on the wire) removes what was stored.
    u.l1_store("a", "dram", &key(1), 30);
    assert_eq!(used(&u, "a"), [(Tier::L1, "dram".into(), 80, 0, None)]);
    u.l1_delete("a", "dram", &key(2));
    u.l1_delete("a", "dram", &key(2));
    u.l1_delete("a", "dram", &key(9));
    assert_eq!(used(&u, "a")[0].2, 30);
    // The same key on another backend is another placement.
    u.l1_store("a", "cxl", &key(1), 5);
    assert_eq!(u.l1_placements(), 2);
    // Fencing (restart) drops L1 bytes only.
    u.adjust("a", Tier::L2, "fs", 1000);
    u.fence_l1("a");
    assert_eq!(used(&u, "a"), [(Tier::L2, "fs".into(), 1000, 0, None)]);
    assert_eq!(u.l1_placements(), 0);
    // L2 deltas clamp at zero and an empty compartment disappears, then the owner.
    u.adjust("a", Tier::L2, "fs", -5000);
    assert!(u.instance("a", false).is_none());
    assert!(u.instance("a", true).unwrap().modules.is_empty());
}

#[test]
fn declarations_join_usage_and_newer_stamps_replace_them() {
    let mut u = Usage::new(10, 100);
    u.declare("a", (1, 1), module(Tier::L1, "dram", 400, false));
    u.declare("a", (1, 1), module(Tier::L2, "fs", 0, false));
    u.declare("a", (1, 1), module(Tier::L2, "nfs", 1000, true));
    u.l1_store("a", "dram", &key(1), 100);
    let st = u.instance("a", true).unwrap();
    assert!(st.declared_capacity);
    // Declared-but-empty private compartments are listed at 0; shared ones are not.
    assert_eq!(
        used(&u, "a"),
        [
            (Tier::L1, "dram".into(), 100, 400, Some(0.25)),
            (Tier::L2, "fs".into(), 0, 0, None)
        ]
    );
    // An older stamp is a straggler; a newer one starts a fresh set.
    u.declare("a", (0, 9), module(Tier::L1, "dram", 1, false));
    assert_eq!(used(&u, "a")[0].3, 400);
    u.declare("a", (1, 2), module(Tier::L1, "dram", 200, false));
    assert_eq!(
        used(&u, "a"),
        [(Tier::L1, "dram".into(), 100, 200, Some(0.5))]
    );
    // Leaving drops the declaration and the L1 bytes: unknown unless registered.
    u.forget("a");
    assert!(u.instance("a", false).is_none());
}

#[test]
fn the_fleet_view_lists_registered_holding_and_declaring_servers_and_shared_pools() {
    let mut u = Usage::new(10, 100);
    u.adjust("gone", Tier::L2, "fs", 10);
    u.declare("b", (1, 1), module(Tier::L2, "nfs", 1000, true));
    u.declare("c", (1, 1), module(Tier::L2, "nfs", 1000, true));
    u.declare("c", (1, 1), module(Tier::L2, "s3", 10, true));
    u.declare("b", (1, 1), module(Tier::L2, "s3", 20, true));
    u.adjust("", Tier::L2, "nfs", 250);
    u.adjust("", Tier::L2, "s3", 5);
    let f = u.fleet(vec!["z".into(), "b".into(), "b".into()]);
    let ids: Vec<_> = f
        .instances
        .iter()
        .map(|i| (i.instance_id.as_str(), i.registered, i.declared_capacity))
        .collect();
    assert_eq!(
        ids,
        [
            ("b", true, true),
            ("c", false, true),
            ("gone", false, false),
            ("z", true, false)
        ]
    );
    // Agreed capacity is reported; a disagreement reads as undeclared.
    let shared: Vec<_> = f
        .shared_modules
        .iter()
        .map(|m| (m.backend.as_str(), m.used_bytes, m.capacity_bytes, m.shared))
        .collect();
    assert_eq!(shared, [("nfs", 250, 1000, true), ("s3", 5, 0, true)]);
    assert_eq!(f.shared_modules[0].usage_ratio, Some(0.25));
}

#[test]
fn limits_bound_owners_compartments_and_placements() {
    let mut u = Usage::new(2, 3);
    assert!(u.adjust("a", Tier::L2, "fs", 1));
    assert!(u.adjust("b", Tier::L2, "fs", 1));
    assert!(!u.adjust("c", Tier::L2, "fs", 1));
    assert!(!u.adjust("a", Tier::L2, &"x".repeat(MAX_BACKEND_LEN + 1), 1));
    for i in 0..MAX_COMPARTMENTS - 1 {
        assert!(u.adjust("a", Tier::L2, &format!("b{i}"), 1));
    }
    assert!(!u.adjust("a", Tier::L2, "one-too-many", 1));
    for n in 0..5 {
        u.l1_store("b", "dram", &key(n), 10);
    }
    assert_eq!(u.l1_placements(), 3);
    assert_eq!(u.untracked, 3 + 2);
    assert!(u.instance("c", false).is_none());
}
