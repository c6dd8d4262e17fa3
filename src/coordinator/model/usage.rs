//! Per-instance memory usage (`GET /instances/usage`, `GET /instances/{id}/usage`): bytes
//! held per compartment (owner, tier, backend) joined to the capacities the servers declare
//! in `config` batches, as LMCache 0.5.6 reports them.
//!
//! Pure and bounded. The owner of a placement is the reporting instance, or `""` for a
//! fleet-shared backend (`"shared": true`), whose bytes are reported once for the fleet.
//! L2 deltas come from the model's key store (it knows a key's previous size); L1
//! placements are kept here, per owner, as 64-bit fingerprints with their size (so a
//! re-store or a delete moves the total by the right amount), at most [`MAX_L1_PER_OWNER`]
//! per owner and a budget over all owners; a placement beyond either is not counted
//! (`untracked`). An owner's L1 bytes are dropped when it leaves or restarts (a new
//! incarnation), its declaration when it leaves; L2 bytes stay until delete events remove
//! them, so a departed server still holding L2 bytes is listed with `registered: false`.

use super::events::Tier;
use super::keys::EncodedKey;
use hashbrown::HashMap;
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

/// Most compartments (tier, backend) one owner may use or declare.
pub(crate) const MAX_COMPARTMENTS: usize = 16;
/// Most L1 placements tracked for one owner.
pub(crate) const MAX_L1_PER_OWNER: usize = 1 << 20;
/// Longest backend name counted.
pub(crate) const MAX_BACKEND_LEN: usize = 64;

/// One declared compartment (a `config` batch).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Module {
    /// Tier.
    pub tier: Tier,
    /// Backend.
    pub backend: String,
    /// Declared capacity; 0 declares none.
    pub capacity_bytes: u64,
    /// A fleet-shared pool.
    pub shared: bool,
}

/// One compartment's usage joined to its capacity (`ModuleMemoryStatus`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModuleStatus {
    /// Tier.
    pub tier: Tier,
    /// Backend.
    pub backend: String,
    /// A fleet-shared pool.
    pub shared: bool,
    /// Bytes held.
    pub used_bytes: u64,
    /// Declared capacity, 0 when none.
    pub capacity_bytes: u64,
    /// `used / capacity`, `null` without a declared capacity (not clamped at 1).
    pub usage_ratio: Option<f64>,
}

impl ModuleStatus {
    fn new(tier: Tier, backend: &str, used: u64, capacity: u64, shared: bool) -> Self {
        ModuleStatus {
            tier,
            backend: backend.to_owned(),
            shared,
            used_bytes: used,
            capacity_bytes: capacity,
            usage_ratio: (capacity > 0).then(|| used as f64 / capacity as f64),
        }
    }
}

/// One server's compartments (`InstanceMemoryStatus`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InstanceStatus {
    /// The server.
    pub instance_id: String,
    /// Whether it is registered now.
    pub registered: bool,
    /// Whether it declared any capacity.
    pub declared_capacity: bool,
    /// Its own compartments, by tier then backend.
    pub modules: Vec<ModuleStatus>,
}

/// The fleet view (`FleetMemoryResponse`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FleetStatus {
    /// Every registered server, and every other one holding bytes or a declaration, by id.
    pub instances: Vec<InstanceStatus>,
    /// The fleet-shared pools, counted once.
    pub shared_modules: Vec<ModuleStatus>,
}

#[derive(Default)]
struct Owner {
    /// Bytes per (tier, backend); entries at 0 are dropped.
    used: Vec<(Tier, String, u64)>,
    /// The newest declaration's stamp `(incarnation, revision)` and its modules.
    declared: Option<((u64, u64), Vec<Module>)>,
    /// L1 placements: fingerprint of (key, backend) → size.
    l1: HashMap<u64, u32>,
}

impl Owner {
    fn is_empty(&self) -> bool {
        self.used.is_empty() && self.declared.is_none() && self.l1.is_empty()
    }
}

/// [`Usage`] in a snapshot: every owner in order, with its bytes per compartment, its
/// declaration and its L1 placements (fingerprint and size, by fingerprint).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageDump {
    owners: Vec<OwnerDump>,
    untracked: u64,
}

/// `(stamp, modules)` of a declaration.
type Declared = Option<((u64, u64), Vec<Module>)>;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct OwnerDump {
    id: String,
    used: Vec<(Tier, String, u64)>,
    declared: Declared,
    l1: Vec<(u64, u32)>,
}

/// Usage per owner and compartment, and declared capacities.
pub struct Usage {
    owners: IndexMap<String, Owner>,
    max_owners: usize,
    l1_budget: usize,
    l1_len: usize,
    /// Placements or declarations not counted (a limit above was reached).
    pub untracked: u64,
}

impl Usage {
    /// Empty; at most `max_owners` owners and `l1_budget` L1 placements over all of them.
    pub fn new(max_owners: usize, l1_budget: usize) -> Self {
        Usage {
            owners: IndexMap::new(),
            max_owners,
            l1_budget,
            l1_len: 0,
            untracked: 0,
        }
    }

    /// The content for a snapshot ([`UsageDump`]).
    pub fn dump(&self) -> UsageDump {
        let owners = self
            .owners
            .iter()
            .map(|(id, o)| {
                let mut l1: Vec<(u64, u32)> = o.l1.iter().map(|(&f, &s)| (f, s)).collect();
                l1.sort_unstable();
                OwnerDump {
                    id: id.clone(),
                    used: o.used.clone(),
                    declared: o.declared.clone(),
                    l1,
                }
            })
            .collect();
        UsageDump {
            owners,
            untracked: self.untracked,
        }
    }

    /// Usage holding `dump` ([`Usage::new`]'s limits; owners beyond `max_owners` dropped).
    pub fn restore(max_owners: usize, l1_budget: usize, dump: UsageDump) -> Self {
        let mut usage = Usage::new(max_owners, l1_budget);
        usage.untracked = dump.untracked;
        for o in dump.owners.into_iter().take(max_owners) {
            usage.l1_len += o.l1.len();
            let owner = Owner {
                used: o.used,
                declared: o.declared,
                l1: o.l1.into_iter().collect(),
            };
            usage.owners.insert(o.id, owner);
        }
        usage
    }

    /// L1 placements tracked.
    pub fn l1_placements(&self) -> usize {
        self.l1_len
    }

    fn owner_mut(&mut self, id: &str) -> Option<&mut Owner> {
        if !self.owners.contains_key(id) {
            if self.owners.len() >= self.max_owners {
                return None;
            }
            self.owners.insert(id.to_owned(), Owner::default());
        }
        self.owners.get_mut(id)
    }

    fn drop_if_empty(&mut self, id: &str) {
        if self.owners.get(id).is_some_and(Owner::is_empty) {
            self.owners.shift_remove(id);
        }
    }

    /// Adds `delta` bytes (may be negative) to a compartment; false if it cannot be counted.
    pub fn adjust(&mut self, owner: &str, tier: Tier, backend: &str, delta: i64) -> bool {
        if delta == 0 {
            return true;
        }
        if backend.len() > MAX_BACKEND_LEN {
            self.untracked += 1;
            return false;
        }
        let Some(o) = self.owner_mut(owner) else {
            self.untracked += 1;
            return false;
        };
        let i = match o
            .used
            .iter()
            .position(|(t, b, _)| *t == tier && b == backend)
        {
            Some(i) => i,
            None if delta < 0 => return true, // nothing to take from
            None if o.used.len() >= MAX_COMPARTMENTS => {
                self.untracked += 1;
                self.drop_if_empty(owner);
                return false;
            }
            None => {
                o.used.push((tier, backend.to_owned(), 0));
                o.used.len() - 1
            }
        };
        let total = o.used[i].2.saturating_add_signed(delta);
        if total == 0 {
            o.used.swap_remove(i);
        } else {
            o.used[i].2 = total;
        }
        self.drop_if_empty(owner);
        true
    }

    /// The placement's fingerprint: xxh3 of its fields, the same in every process (a
    /// snapshot carries fingerprints from one process to another).
    fn fingerprint(&self, key: &EncodedKey, backend: &str) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(key.chunk_hash_hex.to_ascii_lowercase().as_bytes());
        // 0xff never occurs in UTF-8: the fields cannot run into each other.
        h.update(&[0xff]);
        h.update(key.model_name.as_bytes());
        h.update(&[0xff]);
        h.update(&key.kv_rank.to_le_bytes());
        h.update(&key.object_group_id.to_le_bytes());
        h.update(key.cache_salt.as_bytes());
        h.update(&[0xff]);
        h.update(backend.as_bytes());
        h.digest()
    }

    /// An L1 store: the placement's size becomes `size` (the total moves by the difference).
    pub fn l1_store(&mut self, owner: &str, backend: &str, key: &EncodedKey, size: u64) {
        let fp = self.fingerprint(key, backend);
        let size = u32::try_from(size).unwrap_or(u32::MAX);
        let old = self
            .owners
            .get_mut(owner)
            .and_then(|o| o.l1.get_mut(&fp))
            .map(|s| std::mem::replace(s, size));
        if let Some(old) = old {
            self.adjust(owner, Tier::L1, backend, i64::from(size) - i64::from(old));
            return;
        }
        let room = self.l1_len < self.l1_budget
            && self
                .owners
                .get(owner)
                .is_none_or(|o| o.l1.len() < MAX_L1_PER_OWNER);
        if !room {
            self.untracked += 1;
            return;
        }
        // A 0-byte placement moves no total (and would hold an entry for nothing).
        if size == 0 || !self.adjust(owner, Tier::L1, backend, i64::from(size)) {
            return;
        }
        if let Some(o) = self.owners.get_mut(owner) {
            o.l1.insert(fp, size);
            self.l1_len += 1;
        }
    }

    /// An L1 delete: the placement's bytes leave its compartment.
    pub fn l1_delete(&mut self, owner: &str, backend: &str, key: &EncodedKey) {
        let fp = self.fingerprint(key, backend);
        let Some(size) = self.owners.get_mut(owner).and_then(|o| o.l1.remove(&fp)) else {
            return;
        };
        self.l1_len -= 1;
        self.adjust(owner, Tier::L1, backend, -i64::from(size));
        self.drop_if_empty(owner);
    }

    /// A `config` batch: a newer `(incarnation, revision)` starts a new declaration, an equal
    /// one adds to it, an older one is ignored.
    pub fn declare(&mut self, owner: &str, stamp: (u64, u64), module: Module) {
        if module.backend.len() > MAX_BACKEND_LEN {
            self.untracked += 1;
            return;
        }
        let Some(o) = self.owner_mut(owner) else {
            self.untracked += 1;
            return;
        };
        match &mut o.declared {
            Some((s, _)) if stamp < *s => {}
            Some((s, modules)) if stamp == *s => {
                if let Some(m) = modules
                    .iter_mut()
                    .find(|m| m.tier == module.tier && m.backend == module.backend)
                {
                    *m = module;
                } else if modules.len() < MAX_COMPARTMENTS {
                    modules.push(module);
                } else {
                    self.untracked += 1;
                }
            }
            _ => o.declared = Some((stamp, vec![module])),
        }
    }

    /// The instance restarted or left: its L1 bytes are void.
    pub fn fence_l1(&mut self, owner: &str) {
        let Some(o) = self.owners.get_mut(owner) else {
            return;
        };
        self.l1_len -= o.l1.len();
        o.l1 = HashMap::new();
        o.used.retain(|(t, _, _)| *t != Tier::L1);
        self.drop_if_empty(owner);
    }

    /// The instance left: its L1 bytes and its declaration go; its L2 bytes stay.
    pub fn forget(&mut self, owner: &str) {
        self.fence_l1(owner);
        if let Some(o) = self.owners.get_mut(owner) {
            o.declared = None;
        }
        self.drop_if_empty(owner);
    }

    fn declared(&self, id: &str) -> &[Module] {
        self.owners
            .get(id)
            .and_then(|o| o.declared.as_ref())
            .map_or(&[], |(_, m)| m.as_slice())
    }

    /// One server's status; `None` when it is unknown (not registered, no bytes, nothing
    /// declared).
    pub fn instance(&self, id: &str, registered: bool) -> Option<InstanceStatus> {
        let o = self.owners.get(id).filter(|_| !id.is_empty());
        if o.is_none() && !registered {
            return None;
        }
        let declared = self.declared(id);
        let capacity = |tier: Tier, backend: &str| {
            declared
                .iter()
                .find(|m| m.tier == tier && m.backend == backend)
                .map_or(0, |m| m.capacity_bytes)
        };
        let used: &[(Tier, String, u64)] = o.map_or(&[], |o| o.used.as_slice());
        let mut modules: Vec<ModuleStatus> = used
            .iter()
            .map(|(t, b, n)| ModuleStatus::new(*t, b, *n, capacity(*t, b), false))
            .collect();
        for m in declared {
            if m.shared || used.iter().any(|(t, b, _)| *t == m.tier && *b == m.backend) {
                continue;
            }
            modules.push(ModuleStatus::new(
                m.tier,
                &m.backend,
                0,
                m.capacity_bytes,
                false,
            ));
        }
        modules.sort_by(|a, b| (a.tier, &a.backend).cmp(&(b.tier, &b.backend)));
        Some(InstanceStatus {
            instance_id: id.to_owned(),
            registered,
            declared_capacity: !declared.is_empty(),
            modules,
        })
    }

    /// The fleet view for the registered ids `registered` (sorted, deduplicated here).
    pub fn fleet(&self, mut registered: Vec<String>) -> FleetStatus {
        registered.sort_unstable();
        registered.dedup();
        let mut ids: Vec<&str> = registered.iter().map(String::as_str).collect();
        ids.extend(
            self.owners
                .keys()
                .map(String::as_str)
                .filter(|k| !k.is_empty()),
        );
        ids.sort_unstable();
        ids.dedup();
        let instances = ids
            .into_iter()
            .filter_map(|id| {
                let reg = registered.binary_search_by(|r| r.as_str().cmp(id)).is_ok();
                self.instance(id, reg)
            })
            .collect();
        // A shared pool's capacity: the one value every declaring server agrees on, else 0.
        let mut claims: Vec<(Tier, &str, Option<u64>)> = Vec::new();
        for o in self.owners.values() {
            for m in o.declared.iter().flat_map(|(_, m)| m).filter(|m| m.shared) {
                match claims
                    .iter_mut()
                    .find(|(t, b, _)| *t == m.tier && *b == m.backend)
                {
                    Some((_, _, agreed)) => {
                        if *agreed != Some(m.capacity_bytes) {
                            *agreed = None;
                        }
                    }
                    None => claims.push((m.tier, &m.backend, Some(m.capacity_bytes))),
                }
            }
        }
        let mut shared_modules: Vec<ModuleStatus> = self
            .owners
            .get("")
            .map(|o| o.used.as_slice())
            .unwrap_or_default()
            .iter()
            .map(|(t, b, n)| {
                let cap = claims
                    .iter()
                    .find(|(ct, cb, _)| ct == t && cb == b)
                    .and_then(|c| c.2)
                    .unwrap_or(0);
                ModuleStatus::new(*t, b, *n, cap, true)
            })
            .collect();
        shared_modules.sort_by(|a, b| (a.tier, &a.backend).cmp(&(b.tier, &b.backend)));
        FleetStatus {
            instances,
            shared_modules,
        }
    }
}

#[cfg(test)]
#[path = "usage_tests.rs"]
mod tests;
