//! The key directory in a snapshot or checkpoint ([`DirectoryDump`]): keys in listing order
//! with their placements and access counts, chunk token ids (little-endian `u32` bytes), the
//! instances reporting L1 keys in their order, and the counters. Names are written once
//! (tables) and referred to by index. The blend index is derived: a restore rebuilds it.

use super::{DirCounters, Directory, DirectoryConfig, Hash32, Placement};
use crate::coordinator::model::events::Tier;
use crate::coordinator::model::keys::EncodedKey;
use crate::coordinator::model::tokens::ChunkTokens;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

type PlacementRow = (u32, u64, Tier, u32, u64, bool);
type KeyRow = (ByteBuf, u8, u16, u32, u32, u32, Vec<PlacementRow>);

/// A [`Directory`]'s content.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DirectoryDump {
    models: Vec<String>,
    salts: Vec<String>,
    instances: Vec<String>,
    backends: Vec<String>,
    /// `(hash, group, model, salt, kv_rank, access count, placements)`; a placement is
    /// `(instance, incarnation, tier, backend, size, shared)`.
    keys: Vec<KeyRow>,
    /// `(hash, token offset, token ids as little-endian u32)`.
    bindings: Vec<(ByteBuf, i64, ByteBuf)>,
    /// Instances reporting L1 keys, in order (indices into `instances`).
    l1_instances: Vec<u32>,
    counters: DirCounters,
}

impl Directory {
    /// The content for a snapshot.
    pub fn dump(&self) -> DirectoryDump {
        let names = |n: &super::Names| -> Vec<String> {
            (0..)
                .map_while(|i| (i < n.names.len()).then(|| n.name(i as u32).to_owned()))
                .collect()
        };
        let mut keys = Vec::with_capacity(self.live);
        let mut bindings = Vec::new();
        let mut seen = hashbrown::HashSet::new();
        for seg in &self.segments {
            for r in seg.iter().filter(|r| !r.placements.is_empty()) {
                let k = r.key;
                let placements = r
                    .placements
                    .iter()
                    .map(|p| {
                        let b = u32::from(p.backend);
                        (p.instance, p.incarnation, p.tier, b, p.size, p.shared)
                    })
                    .collect();
                keys.push((
                    ByteBuf::from(k.hash.as_bytes().to_vec()),
                    k.group,
                    k.model,
                    k.salt,
                    k.kv_rank,
                    r.access,
                    placements,
                ));
                if let Some(b) = self.binding(&k.hash) {
                    if !b.tokens.is_empty() && seen.insert(k.hash) {
                        let raw: Vec<u8> = b.tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
                        bindings.push((
                            ByteBuf::from(k.hash.as_bytes().to_vec()),
                            b.offset,
                            ByteBuf::from(raw),
                        ));
                    }
                }
            }
        }
        DirectoryDump {
            models: self.models.iter().cloned().collect(),
            salts: names(&self.salts),
            instances: names(&self.instances),
            backends: names(&self.backends),
            keys,
            bindings,
            l1_instances: self.l1.keys().copied().collect(),
            counters: self.counters.clone(),
        }
    }

    /// A directory of `config` holding `dump` (what does not fit `config`'s limits is left
    /// out and counted, as at ingest).
    pub fn restore(config: DirectoryConfig, d: DirectoryDump) -> Self {
        let mut dir = Directory::new(config);
        let name = |v: &Vec<String>, i: u32| v.get(i as usize).cloned().unwrap_or_default();
        for &i in &d.l1_instances {
            if let Some(inst) = dir.instances.intern(&name(&d.instances, i)) {
                if !dir.l1.contains_key(&inst) {
                    dir.instances.hold(inst);
                    dir.l1.insert(inst, hashbrown::HashSet::new());
                }
            }
        }
        for (hash, group, model, salt, kv_rank, access, placements) in d.keys {
            let Some(h) = Hash32::from_bytes(&hash) else {
                continue;
            };
            let key = EncodedKey {
                chunk_hash_hex: h.hex(),
                model_name: d
                    .models
                    .get(usize::from(model))
                    .cloned()
                    .unwrap_or_default(),
                kv_rank: i64::from(kv_rank),
                object_group_id: i64::from(group),
                cache_salt: name(&d.salts, salt),
            };
            let mut slot = None;
            for (inst, incarnation, tier, backend, size, shared) in placements {
                let (Some(i), Some(b)) = (
                    dir.instances.intern(&name(&d.instances, inst)),
                    dir.backends
                        .intern(&name(&d.backends, backend))
                        .and_then(|b| u16::try_from(b).ok()),
                ) else {
                    dir.counters.names_refused += 1;
                    continue;
                };
                let p = Placement {
                    incarnation,
                    size,
                    instance: i,
                    backend: b,
                    tier,
                    shared,
                };
                dir.store(&key, p);
                dir.instances.release_if_unused(i);
                dir.backends.release_if_unused(u32::from(b));
                slot = dir.lookup_key(&key).and_then(|k| dir.find(&k));
            }
            if let Some(s) = slot {
                dir.rec_mut(s).access = access;
            }
        }
        for (hash, offset, raw) in d.bindings {
            let Some(h) = Hash32::from_bytes(&hash) else {
                continue;
            };
            let token_ids = raw
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            dir.bind_tokens(&ChunkTokens {
                chunk_hash_hex: h.hex(),
                token_offset: offset,
                token_ids,
            });
        }
        dir.counters = d.counters;
        dir
    }
}
