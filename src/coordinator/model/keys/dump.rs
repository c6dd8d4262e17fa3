//! The key store in a snapshot or checkpoint ([`KeysDump`], a child of `keys`): model names,
//! holders and backends as tables, each salt's keys in LRU order with their placements; and
//! the store rebuilt from one, every key checked to fit and re-stored within the limits. It
//! writes and reads values only: no file or wire I/O here.

use super::slots::NIL;
use super::{CompactKey, KeyStore, Limits, MAX_HASH_BYTES};
use crate::coordinator::model::holders::{HolderDump, Holders};

/// The key store's content in a snapshot: model names in interning order (keys refer to them
/// by index), the holder and backend tables, and each salt in order with its object-group
/// bits and its keys, least recently used first, each with its placements.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KeysDump {
    models: Vec<String>,
    holders: Vec<HolderDump>,
    backends: Vec<String>,
    salts: Vec<SaltDump>,
}

/// `(hash, group, model index, kv_rank, [(holder, backend, size)])`.
type KeyDump = (serde_bytes::ByteBuf, u8, u16, u32, Vec<(u16, u8, u32)>);

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct SaltDump {
    salt: String,
    groups: [u64; 4],
    /// Least recently used first.
    keys: Vec<KeyDump>,
}

impl KeyStore {
    /// The content for a snapshot ([`KeysDump`]).
    pub(crate) fn dump(&self) -> KeysDump {
        let salts = self
            .salts
            .iter()
            .map(|(salt, s)| {
                let mut keys = Vec::with_capacity(s.len);
                let mut i = s.head;
                while i != NIL {
                    let slot = self.slot(i);
                    let key = slot.key;
                    let hash = key.hash[..usize::from(key.hash_len)].to_vec();
                    let places = self
                        .placements(i)
                        .map(|p| (p.holder, p.backend, p.size))
                        .collect();
                    keys.push((
                        serde_bytes::ByteBuf::from(hash),
                        key.group,
                        key.model,
                        key.kv_rank,
                        places,
                    ));
                    i = slot.next;
                }
                SaltDump {
                    salt: salt.clone(),
                    groups: s.groups,
                    keys,
                }
            })
            .collect();
        let (holders, backends) = self.holders.dump();
        KeysDump {
            models: self.models.iter().cloned().collect(),
            holders,
            backends,
            salts,
        }
    }

    /// A store holding `dump`'s keys in its LRU order, within `limits`.
    ///
    /// # Errors
    /// A key that does not fit (a bad hash, model, holder or backend index) or a limit.
    pub(crate) fn restore(
        dump: KeysDump,
        limits: Limits,
        max_holders: usize,
    ) -> Result<Self, String> {
        let mut store = KeyStore::new(max_holders);
        store.holders = Holders::restore(max_holders, dump.holders, dump.backends)?;
        for m in dump.models {
            store.models.insert(m);
        }
        for s in dump.salts {
            for (hash, group, model, kv_rank, places) in s.keys {
                if hash.len() > MAX_HASH_BYTES || usize::from(model) >= store.models.len() {
                    return Err(format!("a key of salt {:?} does not fit", s.salt));
                }
                let mut key = CompactKey {
                    hash: [0; MAX_HASH_BYTES],
                    hash_len: u8::try_from(hash.len()).unwrap_or(0),
                    group,
                    model,
                    kv_rank,
                };
                key.hash[..hash.len()].copy_from_slice(&hash);
                for (holder, backend, size) in places {
                    let known = store.holders.get(holder).is_some()
                        && usize::from(backend) < store.holders.backends.len();
                    if !known {
                        return Err(format!("a placement of salt {:?} does not fit", s.salt));
                    }
                    store
                        .store(&s.salt, key, holder, backend, size, limits)
                        .map_err(|e| format!("{e:?} limit reached"))?;
                }
            }
            if let Some(salt) = store.salts.get_mut(&s.salt) {
                salt.groups = s.groups;
            }
        }
        Ok(store)
    }
}
