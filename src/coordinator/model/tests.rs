//! Unit tests of [`super::Model`]: no runtime, an injected clock.

use super::*;
use crate::coordinator::model::events::{Batch, Op, Tier};
use crate::coordinator::model::keys::EncodedKey;

fn config() -> ModelConfig {
    ModelConfig {
        max_instances: 4,
        max_tracked_keys: 1_000,
        max_quotas: 3,
        eviction_ratio: 0.2,
        trigger_watermark: 1.0,
    }
}

fn key(n: u64, salt: &str) -> EncodedKey {
    let mut hex = format!("{n:04x}");
    if hex.len() % 2 == 1 {
        hex.insert(0, '0');
    }
    EncodedKey {
        chunk_hash_hex: hex,
        model_name: "m".into(),
        kv_rank: 16_777_472,
        object_group_id: 0,
        cache_salt: salt.into(),
    }
}

fn batch(id: &str, inc: u64, seq: u64, tier: Tier, ops: Vec<Op>) -> Batch {
    Batch {
        instance_id: id.into(),
        incarnation: inc,
        seq,
        tier,
        backend: "fs".into(),
        shared: false,
        capacity: None,
        ops,
        tokens: Vec::new(),
    }
}

fn stores(salt: &str, range: std::ops::Range<u64>, size: u64) -> Vec<Op> {
    range.map(|n| Op::Store(key(n, salt), size)).collect()
}

fn instance(id: &str, port: u16) -> Instance {
    Instance {
        instance_id: id.into(),
        ip: "127.0.0.1".into(),
        http_port: port,
        registration_time: 0.0,
        metadata: Default::default(),
        p2p_advertised_url: String::new(),
        mq_port: 0,
        last_seen: std::time::Instant::now(),
    }
}

/// A model with the seed's allowlist (`--default-quota-gb 0`): salts without a quota may
/// hold nothing.
fn allowlist(config: ModelConfig) -> Model {
    let mut m = Model::new(config);
    m.set_default_limit(Some(0.0)).unwrap();
    m
}

/// A plan's keys in order (every group's, group after group).
fn hexes(plan: &[Victims]) -> Vec<String> {
    plan.iter()
        .flat_map(|v| v.keys.iter().map(|k| k.chunk_hash_hex.clone()))
        .collect()
}

fn planned(plan: &[Victims]) -> usize {
    plan.iter().map(|v| v.keys.len()).sum()
}

/// A cycle's plan, then every key released (as after failed dispatches), so the next call
/// plans afresh.
fn plan(m: &mut Model) -> Vec<Victims> {
    let p = m.plan_evictions();
    for v in &p {
        m.release(&v.keys);
    }
    p
}

#[test]
fn ingest_counts_duplicates_stale_and_gaps() {
    let mut m = Model::new(config());
    let got = m.ingest([
        batch("a", 7, 1, Tier::L2, stores("s", 0..3, 100)),
        batch("a", 7, 1, Tier::L2, stores("s", 3..4, 100)),
        batch("a", 7, 4, Tier::L2, vec![Op::Delete(key(0, "s"))]),
        batch("a", 6, 9, Tier::L2, stores("s", 9..10, 100)),
        batch("a", 7, 5, Tier::L1, stores("s", 20..25, 100)),
    ]);
    assert_eq!(
        got,
        Ingested {
            applied: 3,
            duplicates: 1,
            stale: 1,
            recorded: 9
        }
    );
    assert_eq!(m.counters.seq_gaps, 2);
    assert_eq!(m.counters.events_l1_ignored, 5);
    assert_eq!(m.quota_status("s").usage_gb * GIB, 200.0);
    // Deregistration forgets the cursor: seq 1 is accepted again.
    m.forget_instance("a", 0.0);
    assert_eq!(m.ingest([batch("a", 7, 1, Tier::L2, vec![])]).applied, 1);
}

#[test]
fn bad_keys_and_the_key_limit_are_counted_and_the_rest_applied() {
    let mut m = Model::new(ModelConfig {
        max_tracked_keys: 2,
        ..config()
    });
    let mut bad = key(1, "s");
    bad.chunk_hash_hex = "xyz".into();
    let mut ops = stores("s", 0..3, 10);
    ops.push(Op::Store(bad, 10));
    ops.push(Op::Store(key(9, "s"), u64::from(u32::MAX) + 1));
    m.ingest([batch("a", 0, 1, Tier::L2, ops)]);
    assert_eq!(m.counters.keys_rejected, 2);
    assert_eq!(m.counters.keys_refused, 1);
    assert_eq!(m.tracked_keys(), 2);
}

#[test]
fn quotas_validate_and_report_allowlist_semantics() {
    let mut m = Model::new(config());
    for bad in [-1.0, f64::NAN, f64::INFINITY, 1e300] {
        assert_eq!(m.set_quota("u", bad), Err(QuotaError::InvalidLimit));
    }
    assert_eq!(m.set_quota("a/b", 1.0), Err(QuotaError::InvalidSalt));
    m.set_quota("u", 2.0).unwrap();
    m.set_quota("", 0.5).unwrap();
    m.set_quota("v", 0.0).unwrap();
    assert_eq!(m.set_quota("w", 1.0), Err(QuotaError::Full(3)));
    m.set_quota("u", 3.0).unwrap();
    let s = m.quota_status("u");
    assert_eq!((s.quota_limit_gb, s.quota_exists), (3.0, true));
    let none = m.quota_status("nobody");
    assert_eq!(
        (none.quota_limit_gb, none.quota_exists, none.usage_gb),
        (0.0, false, 0.0)
    );
    m.ingest([batch("a", 0, 1, Tier::L2, stores("x", 0..2, 1 << 29))]);
    let (total, rows) = m.quota_list();
    assert_eq!(total, 1.0);
    let salts: Vec<_> = rows.iter().map(|r| r.cache_salt.as_str()).collect();
    assert_eq!(salts, ["", "u", "v", "x"]);
    assert!(m.remove_quota("u"));
    assert!(!m.remove_quota("u"));
}

#[test]
fn eviction_plans_lru_victims_of_salts_over_the_watermark() {
    let mut m = Model::new(ModelConfig {
        trigger_watermark: 0.5,
        ..config()
    });
    // "hot" has 10 keys of 1 KiB under a 10 KiB quota: at the 0.5 watermark, evicts 20%.
    m.set_quota("hot", 10.0 * 1024.0 / GIB).unwrap();
    // "ok" is under its quota; "free" has no quota: with the allowlist, everything goes.
    m.set_quota("ok", 1.0).unwrap();
    m.set_default_limit(Some(0.0)).unwrap();
    m.ingest([
        batch("a", 0, 1, Tier::L2, stores("hot", 0..10, 1024)),
        batch("a", 0, 2, Tier::L2, stores("ok", 0..10, 1024)),
        batch("a", 0, 3, Tier::L2, stores("free", 0..3, 1)),
        batch("a", 0, 4, Tier::L2, vec![Op::Access(key(9, "hot"))]),
    ]);
    let victims = m.plan_evictions();
    // All of them are "a"'s copies in "fs": one call to "a", naming the adapter.
    let (plan, unknown) = dispatches(victims.clone(), |id| (id == "a").then(|| instance("a", 2)));
    assert!(unknown.is_empty());
    assert_eq!(plan.len(), 1);
    assert_eq!(
        (
            plan[0].instance_id.as_str(),
            plan[0].http_port,
            plan[0].adapter.as_deref()
        ),
        ("a", 2, Some("fs"))
    );
    let got: Vec<_> = plan[0]
        .keys
        .iter()
        .map(|k| (k.cache_salt.as_str(), k.chunk_hash_hex.as_str()))
        .collect();
    // The batch was recorded tail first, so the tail chunks (9 was touched since) are oldest.
    assert_eq!(
        got,
        [
            ("hot", "0008"),
            ("hot", "0007"),
            ("free", "0002"),
            ("free", "0001"),
            ("free", "0000")
        ]
    );
    // Their deletes are in flight: the next cycle does not plan them again (Q7), only the
    // next oldest of "hot" (still over its quota as far as events say).
    let next = m.plan_evictions();
    assert_eq!(hexes(&next), ["0006", "0005"]);
    for v in &next {
        m.release(&v.keys); // (as if that dispatch had failed)
    }
    // A delete event from another server leaves "a"'s copies; "a"'s own removes them.
    let deletes: Vec<Op> = victims[0].keys.iter().cloned().map(Op::Delete).collect();
    m.ingest([batch("s2", 0, 1, Tier::L2, deletes.clone())]);
    assert_eq!(m.quota_status("hot").usage_gb * GIB, 10.0 * 1024.0);
    m.ingest([batch("a", 0, 5, Tier::L2, deletes)]);
    // 8 KiB left of a 10 KiB quota with watermark 0.5: still over, 20% of 8 = 1 key.
    assert_eq!(hexes(&m.plan_evictions()), ["0006"]);
}

#[test]
fn eviction_dispatches_are_chunked() {
    let mut m = allowlist(ModelConfig {
        max_tracked_keys: 30_000,
        ..config()
    });
    m.ingest([batch("a", 0, 1, Tier::L2, stores("z", 0..25_000, 1))]);
    let (plan, _) = dispatches(m.plan_evictions(), |_| Some(instance("s1", 1)));
    let sizes: Vec<_> = plan.iter().map(|d| d.keys.len()).collect();
    assert_eq!(sizes, [10_000, 10_000, 5_000]);
    assert_eq!(m.counters.eviction_keys_planned, 25_000);
}

#[test]
fn a_cycle_plans_at_most_the_victim_cap() {
    let n = MAX_VICTIMS_PER_CYCLE as u64 + 5;
    let mut m = allowlist(ModelConfig {
        max_tracked_keys: n as usize,
        ..config()
    });
    m.ingest([batch("a", 0, 1, Tier::L2, stores("z", 0..n, 1))]);
    assert_eq!(planned(&m.plan_evictions()), MAX_VICTIMS_PER_CYCLE);
    assert_eq!(m.counters.eviction_cycles_capped, 1);
}

#[test]
fn the_default_limit_governs_salts_without_a_quota() {
    let mut m = Model::new(config());
    m.ingest([batch("a", 0, 1, Tier::L2, stores("free", 0..4, 1024))]);
    // Boot: exempt, as 0.5.6 (a restart with no quotas never mass-evicts).
    assert_eq!(m.default_limit_gb(), None);
    assert!(plan(&mut m).is_empty());
    let s = m.quota_status("free");
    assert_eq!((s.effective_limit_gb, s.limit_source), (None, "exempt"));
    // The seed's allowlist (0 bytes): everything goes.
    m.set_default_limit(Some(0.0)).unwrap();
    assert_eq!(planned(&plan(&mut m)), 4);
    let s = m.quota_status("free");
    assert_eq!((s.quota_limit_gb, s.quota_exists), (0.0, false));
    assert_eq!(
        (s.effective_limit_gb, s.limit_source),
        (Some(0.0), "default")
    );
    // Exempt again: nothing planned.
    m.set_default_limit(None).unwrap();
    assert_eq!(m.default_limit_gb(), None);
    assert!(plan(&mut m).is_empty());
    // A positive default is a per-salt budget: 4 KiB ≥ 1 × 4 KiB → 20% of 4 keys = 1 key.
    m.set_default_limit(Some(4096.0 / GIB)).unwrap();
    assert_eq!(planned(&plan(&mut m)), 1);
    m.set_default_limit(Some(8192.0 / GIB)).unwrap();
    assert!(plan(&mut m).is_empty());
    // An explicit quota wins over the default.
    m.set_quota("free", 0.0).unwrap();
    assert_eq!(planned(&plan(&mut m)), 4);
    let s = m.quota_status("free");
    assert_eq!((s.effective_limit_gb, s.limit_source), (Some(0.0), "quota"));
    for bad in [-1.0, f64::NAN, f64::INFINITY, 1e300] {
        assert_eq!(
            m.set_default_limit(Some(bad)),
            Err(QuotaError::InvalidLimit)
        );
    }
    assert_eq!(m.default_limit_gb(), Some(8192.0 / GIB));
}

#[test]
fn pinned_keys_are_never_planned() {
    let mut m = allowlist(config());
    m.ingest([batch("a", 0, 1, Tier::L2, stores("free", 0..4, 1024))]);
    // The two oldest (recorded tail first: 3, 2) are pinned, one in another object group.
    let mut pinned = key(2, "free");
    pinned.object_group_id = 1;
    m.pins.pin(&[key(3, "free"), pinned], 10).unwrap();
    assert_eq!(hexes(&plan(&mut m)), ["0001", "0000"]);
    m.pins.drop_pins(&[key(3, "free")]);
    assert_eq!(planned(&plan(&mut m)), 3);
}

#[test]
fn large_batches_are_admitted_whole_and_applied_in_slices() {
    let n = 2 * SLICE_OPS as u64 + 7;
    let mut m = allowlist(ModelConfig {
        max_tracked_keys: 100_000,
        ..config()
    });
    let (got, slices) = m.admit([
        batch("a", 0, 1, Tier::L2, stores("s", 0..n, 1)),
        batch("a", 0, 1, Tier::L2, stores("s", 0..1, 1)),
        batch("a", 0, 2, Tier::L2, vec![Op::Access(key(0, "s"))]),
    ]);
    assert_eq!((got.applied, got.duplicates, got.recorded), (2, 1, n + 1));
    let sizes: Vec<_> = slices.iter().map(|b| b.ops.len()).collect();
    assert_eq!(sizes, [SLICE_OPS, SLICE_OPS, 7, 1]);
    // Admitted but not applied yet: nothing tracked, and the cursor has moved.
    assert_eq!(m.tracked_keys(), 0);
    assert_eq!(m.ingest([batch("a", 0, 2, Tier::L2, vec![])]).duplicates, 1);
    for b in slices {
        m.apply_slice(b);
    }
    assert_eq!(m.tracked_keys(), n as usize);
    // An all-store batch applies tail first across its slices: the last key is the oldest,
    // the first (touched again by the access) the newest.
    let oldest = hexes(&m.plan_evictions());
    assert_eq!(oldest.len(), n as usize);
    assert_eq!(oldest[0], format!("{:04x}", n - 1));
    assert_eq!(oldest.last().map(String::as_str), Some("0000"));
}

#[test]
fn usage_is_counted_per_instance_and_a_restart_fences_its_l1_bytes() {
    let mut m = Model::new(config());
    let mut declare = batch("a", 1, 1, Tier::L1, vec![]);
    declare.capacity = Some((1000, 1));
    declare.backend = "dram".into();
    let mut l1 = batch("a", 1, 2, Tier::L1, stores("s", 0..2, 100));
    l1.backend = "dram".into();
    m.ingest([
        declare,
        l1,
        batch("a", 1, 3, Tier::L2, stores("s", 0..3, 10)),
        batch("b", 1, 1, Tier::L2, vec![Op::Delete(key(0, "s"))]),
    ]);
    assert_eq!(m.counters.capacity_declarations, 1);
    let used = |m: &Model, id: &str| -> Vec<(Tier, u64)> {
        m.instance_usage(id, true)
            .unwrap()
            .modules
            .iter()
            .map(|s| (s.tier, s.used_bytes))
            .collect()
    };
    // The L2 delete came from "b", which holds no copy: "a"'s copy stays (placements are
    // per holder, as in 0.5.6).
    assert_eq!(used(&m, "a"), [(Tier::L1, 200), (Tier::L2, 30)]);
    assert_eq!(m.tracked_keys(), 3);
    // A new incarnation: the L1 bytes are void, the declaration and L2 bytes stay; its
    // re-stores of keys it holds update its copies, never count them twice (fencing).
    m.ingest([batch("a", 2, 1, Tier::L2, stores("s", 0..3, 10))]);
    assert_eq!(used(&m, "a"), [(Tier::L1, 0), (Tier::L2, 30)]);
    assert_eq!(m.quota_status("s").usage_gb * GIB, 30.0);
    assert_eq!(m.usage.l1_placements(), 0);
}

/// A server's private copies count once per holder; a shared backend's once for the fleet;
/// victims go to their holders (a shared one's to one live member); a server that left stops
/// counting until it talks again, and its copies expire after the grace.
#[test]
fn private_and_shared_copies_count_per_holder_and_are_evicted_where_they_are() {
    let mut m = allowlist(config());
    let mut shared = batch("c", 1, 1, Tier::L2, stores("s", 10..12, 100));
    shared.shared = true;
    shared.backend = "nfs".into();
    let mut shared_too = batch("d", 1, 1, Tier::L2, stores("s", 10..12, 100));
    shared_too.shared = true;
    shared_too.backend = "nfs".into();
    m.ingest([
        batch("a", 1, 1, Tier::L2, stores("s", 0..2, 10)),
        batch("b", 1, 1, Tier::L2, stores("s", 0..2, 10)),
        shared,
        shared_too,
    ]);
    // 2 × 2 private copies of 10 + 2 shared keys of 100 (once, though two servers stored them).
    assert_eq!(m.quota_status("s").usage_gb * GIB, 240.0);
    assert_eq!(m.tracked_placements(), 6);
    let usage = m.fleet_usage(vec!["a".into(), "b".into(), "c".into()]);
    assert_eq!(usage.shared_modules[0].used_bytes, 200);
    let mut plan = m.plan_evictions();
    plan.sort_by(|x, y| x.instance_id.cmp(&y.instance_id));
    let got: Vec<_> = plan
        .iter()
        .map(|v| {
            (
                v.instance_id.as_str(),
                v.backend.as_str(),
                v.shared,
                v.keys.len(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("a", "fs", false, 2),
            ("b", "fs", false, 2),
            ("c", "nfs", true, 2)
        ]
    );
    for v in &plan {
        m.release(&v.keys);
    }
    // "b" leaves: its copies stop counting and are no victims; "c" leaves: "d" takes the
    // shared backend's victims.
    m.forget_instance("b", 100.0);
    m.forget_instance("c", 100.0);
    assert_eq!(m.quota_status("s").usage_gb * GIB, 220.0);
    let mut plan = m.plan_evictions();
    plan.sort_by(|x, y| x.instance_id.cmp(&y.instance_id));
    let got: Vec<_> = plan.iter().map(|v| v.instance_id.as_str()).collect();
    assert_eq!(got, ["a", "d"]);
    // "b" talks again: counted again.
    m.ingest([batch("b", 2, 1, Tier::L2, vec![])]);
    assert_eq!(m.quota_status("s").usage_gb * GIB, 240.0);
    // It leaves for good: after the grace its copies are dropped, from usage too.
    m.forget_instance("b", 200.0);
    assert!(!m.has_departed_before(199.0));
    assert_eq!(m.expire_departed(200.0), ["b"]);
    assert_eq!(m.tracked_placements(), 4);
    assert!(m.instance_usage("b", false).is_none());
    assert_eq!(m.counters.placements_expired, 1);
}

/// An L1 hit refreshes the key's L2 recency (0.5.6 only counts L2 hits, Q3).
#[test]
fn l1_access_refreshes_l2_recency() {
    let mut m = allowlist(config());
    m.ingest([batch("a", 1, 1, Tier::L2, stores("s", 0..3, 10))]);
    // Recorded tail first: 2, 1, 0 from oldest. An L1 hit on 2 makes 1 the oldest.
    let mut hit = batch("a", 1, 2, Tier::L1, vec![Op::Access(key(2, "s"))]);
    hit.backend = String::new();
    m.ingest([hit]);
    assert_eq!(hexes(&m.plan_evictions()), ["0001", "0000", "0002"]);
}
