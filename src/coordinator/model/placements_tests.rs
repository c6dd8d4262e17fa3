//! The model's usage against a naive reference over random interleavings of stores,
//! accesses and deletes (private and shared backends), server restarts (new incarnations),
//! departures and returns, expiry, eviction cycles whose victims are deleted by the servers
//! they were sent to, and coordinator restarts (a snapshot restored). After every step: each
//! salt's usage is the sum of its copies on live holders (a private copy per server, a shared
//! backend's once), each server's L2 bytes per backend are the sum of its copies, and the
//! tracked keys are those with a copy.

use super::*;
use crate::coordinator::model::events::{Batch, Op as Ev, Tier};
use crate::coordinator::model::keys::EncodedKey;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

const INSTANCES: [&str; 3] = ["a", "b", "c"];
const BACKENDS: [&str; 2] = ["fs", "s3"];
const SALTS: [&str; 2] = ["", "t"];

fn key(n: u8, salt: &str) -> EncodedKey {
    EncodedKey {
        chunk_hash_hex: format!("{n:02x}"),
        model_name: "m".into(),
        kv_rank: 16_777_472,
        object_group_id: 0,
        cache_salt: salt.into(),
    }
}

#[derive(Clone, Debug)]
enum Step {
    Store {
        inst: usize,
        shared: bool,
        backend: usize,
        salt: usize,
        keys: Vec<(u8, u32)>,
    },
    Delete {
        inst: usize,
        shared: bool,
        backend: usize,
        salt: usize,
        keys: Vec<u8>,
    },
    Access {
        inst: usize,
        l1: bool,
        salt: usize,
        key: u8,
    },
    Restart {
        inst: usize,
    },
    Leave {
        inst: usize,
    },
    Expire {
        back: u8,
    },
    Evict,
    Snapshot,
}

fn step() -> impl Strategy<Value = Step> {
    let keys = prop::collection::vec((0u8..8, 1u32..1000), 1..5);
    prop_oneof![
        // Distinct keys per batch (a server stores a chunk once per batch; the model applies
        // a batch of stores tail first, so a repeated key would keep its first size).
        5 => (0..3usize, any::<bool>(), 0..2usize, 0..2usize, keys).prop_map(
            |(inst, shared, backend, salt, mut keys)| {
                let mut seen = BTreeSet::new();
                keys.retain(|(k, _)| seen.insert(*k));
                Step::Store { inst, shared, backend, salt, keys }
            }
        ),
        3 => (0..3usize, any::<bool>(), 0..2usize, 0..2usize, prop::collection::vec(0u8..8, 1..4))
            .prop_map(|(inst, shared, backend, salt, keys)| Step::Delete {
                inst, shared, backend, salt, keys
            }),
        1 => (0..3usize, any::<bool>(), 0..2usize, 0u8..8)
            .prop_map(|(inst, l1, salt, key)| Step::Access { inst, l1, salt, key }),
        1 => (0..3usize).prop_map(|inst| Step::Restart { inst }),
        1 => (0..3usize).prop_map(|inst| Step::Leave { inst }),
        1 => (0u8..4).prop_map(|back| Step::Expire { back }),
        1 => Just(Step::Evict),
        1 => Just(Step::Snapshot),
    ]
}

/// The reference: copies per (salt, key) as (owner, backend) → size (owner "" = shared).
#[derive(Default)]
struct Reference {
    copies: BTreeMap<(String, u8), BTreeMap<(String, String), u64>>,
    departed: BTreeMap<String, f64>,
}

impl Reference {
    fn usage(&self, salt: &str) -> u64 {
        self.copies
            .iter()
            .filter(|((s, _), _)| s == salt)
            .flat_map(|(_, c)| c.iter())
            .filter(|((owner, _), _)| owner.is_empty() || !self.departed.contains_key(owner))
            .map(|(_, size)| size)
            .sum()
    }

    fn held(&self, owner: &str, backend: &str) -> u64 {
        self.copies
            .values()
            .flat_map(|c| c.iter())
            .filter(|((o, b), _)| o == owner && b == backend)
            .map(|(_, size)| size)
            .sum()
    }
}

/// Sends batches as the servers do: per instance an incarnation and a sequence.
struct Sender {
    incarnation: [u64; 3],
    seq: [u64; 3],
}

impl Sender {
    fn batch(
        &mut self,
        inst: usize,
        tier: Tier,
        backend: &str,
        shared: bool,
        ops: Vec<Ev>,
    ) -> Batch {
        self.seq[inst] += 1;
        Batch {
            instance_id: INSTANCES[inst].into(),
            incarnation: self.incarnation[inst],
            seq: self.seq[inst],
            tier,
            backend: backend.into(),
            shared,
            capacity: None,
            ops,
            tokens: Vec::new(),
        }
    }
}

fn config() -> ModelConfig {
    ModelConfig {
        max_instances: 8,
        max_tracked_keys: 10_000,
        max_quotas: 8,
        eviction_ratio: 0.5,
        trigger_watermark: 1.0,
    }
}

fn check(m: &Model, r: &Reference) -> Result<(), TestCaseError> {
    for salt in SALTS {
        prop_assert_eq!(
            m.quota_status(salt).usage_gb * GIB,
            r.usage(salt) as f64,
            "usage of salt {:?}",
            salt
        );
    }
    prop_assert_eq!(m.tracked_keys(), r.copies.len());
    let copies: usize = r.copies.values().map(BTreeMap::len).sum();
    prop_assert_eq!(m.tracked_placements(), copies);
    for inst in INSTANCES {
        let st = m.instance_usage(inst, true);
        for backend in BACKENDS {
            let used = st
                .as_ref()
                .and_then(|s| {
                    s.modules
                        .iter()
                        .find(|x| x.tier == Tier::L2 && x.backend == backend)
                })
                .map_or(0, |x| x.used_bytes);
            prop_assert_eq!(used, r.held(inst, backend), "{} in {}", inst, backend);
        }
    }
    let fleet = m.fleet_usage(Vec::new());
    for backend in BACKENDS {
        let shared = fleet
            .shared_modules
            .iter()
            .find(|x| x.backend == backend)
            .map_or(0, |x| x.used_bytes);
        prop_assert_eq!(shared, r.held("", backend), "shared {}", backend);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn usage_is_the_sum_over_holders(steps in prop::collection::vec(step(), 1..60)) {
        let mut m = Model::new(config());
        m.set_default_limit(Some(0.0)).unwrap();
        let mut r = Reference::default();
        let mut tx = Sender { incarnation: [1; 3], seq: [0; 3] };
        let mut now = 0.0;
        for s in steps {
            now += 1.0;
            match s {
                Step::Store { inst, shared, backend, salt, keys } => {
                    let ops = keys.iter().map(|&(k, size)| Ev::Store(key(k, SALTS[salt]), u64::from(size))).collect();
                    m.ingest([tx.batch(inst, Tier::L2, BACKENDS[backend], shared, ops)]);
                    r.departed.remove(INSTANCES[inst]);
                    let owner = if shared { "" } else { INSTANCES[inst] };
                    for (k, size) in keys {
                        r.copies
                            .entry((SALTS[salt].into(), k))
                            .or_default()
                            .insert((owner.into(), BACKENDS[backend].into()), u64::from(size));
                    }
                }
                Step::Delete { inst, shared, backend, salt, keys } => {
                    let ops = keys.iter().map(|&k| Ev::Delete(key(k, SALTS[salt]))).collect();
                    m.ingest([tx.batch(inst, Tier::L2, BACKENDS[backend], shared, ops)]);
                    r.departed.remove(INSTANCES[inst]);
                    let owner = if shared { "" } else { INSTANCES[inst] };
                    for k in keys {
                        let id = (SALTS[salt].to_owned(), k);
                        if let Some(c) = r.copies.get_mut(&id) {
                            c.remove(&(owner.to_owned(), BACKENDS[backend].to_owned()));
                            if c.is_empty() {
                                r.copies.remove(&id);
                            }
                        }
                    }
                }
                Step::Access { inst, l1, salt, key: k } => {
                    let (tier, backend) = if l1 { (Tier::L1, "") } else { (Tier::L2, "fs") };
                    m.ingest([tx.batch(inst, tier, backend, false, vec![Ev::Access(key(k, SALTS[salt]))])]);
                    r.departed.remove(INSTANCES[inst]);
                }
                Step::Restart { inst } => {
                    // A new incarnation from seq 1: its copies stay, re-stores update them.
                    tx.incarnation[inst] += 1;
                    tx.seq[inst] = 0;
                    m.ingest([tx.batch(inst, Tier::L2, "fs", false, Vec::new())]);
                    r.departed.remove(INSTANCES[inst]);
                }
                Step::Leave { inst } => {
                    m.forget_instance(INSTANCES[inst], now);
                    r.departed.entry(INSTANCES[inst].to_owned()).or_insert(now);
                }
                Step::Expire { back } => {
                    let cutoff = now - f64::from(back);
                    m.expire_departed(cutoff);
                    let gone: BTreeSet<String> = r
                        .departed
                        .iter()
                        .filter(|&(_, &t)| t <= cutoff)
                        .map(|(id, _)| id.clone())
                        .collect();
                    for c in r.copies.values_mut() {
                        c.retain(|(owner, _), _| !gone.contains(owner));
                    }
                    r.copies.retain(|_, c| !c.is_empty());
                    r.departed.retain(|id, _| !gone.contains(id));
                }
                Step::Evict => {
                    // Every victim goes to a live server holding it (a shared backend's to
                    // a live member), which deletes it and reports the delete.
                    for v in m.plan_evictions() {
                        let inst = INSTANCES.iter().position(|i| *i == v.instance_id);
                        prop_assert!(inst.is_some(), "a victim for {}", v.instance_id);
                        let inst = inst.unwrap_or(0);
                        prop_assert!(!r.departed.contains_key(INSTANCES[inst]));
                        let owner = if v.shared { "" } else { INSTANCES[inst] };
                        for k in &v.keys {
                            let n = u8::from_str_radix(&k.chunk_hash_hex, 16).unwrap_or(0);
                            let held = r.copies.get(&(k.cache_salt.clone(), n)).is_some_and(|c| {
                                c.contains_key(&(owner.to_owned(), v.backend.clone()))
                            });
                            prop_assert!(held, "{:?} not held by {:?} in {}", k, owner, v.backend);
                            if let Some(c) = r.copies.get_mut(&(k.cache_salt.clone(), n)) {
                                c.remove(&(owner.to_owned(), v.backend.clone()));
                            }
                        }
                        r.copies.retain(|_, c| !c.is_empty());
                        let ops = v.keys.iter().cloned().map(Ev::Delete).collect();
                        m.ingest([tx.batch(inst, Tier::L2, &v.backend, v.shared, ops)]);
                    }
                }
                Step::Snapshot => {
                    // A coordinator restart from its snapshot (a checkpoint, a standby).
                    m = Model::restore(config(), m.dump()).map_err(TestCaseError::fail)?;
                }
            }
            check(&m, &r)?;
        }
    }
}
