//! The eviction decision of the [`Model`]: which keys of which over-quota salts go, and to
//! which servers (the holders of their copies), as [`Victims`]; and the calls the driver makes
//! of them ([`dispatches`]). Pure: no I/O, no clock.

use super::*;

/// One eviction call for the driver: `DELETE http://ip:port/cache/objects {"keys": [...],
/// "tier": "l2", "adapter": ...}`.
#[derive(Clone, Debug, PartialEq)]
pub struct Dispatch {
    /// Target instance.
    pub instance_id: String,
    /// Its host.
    pub ip: String,
    /// Its HTTP port.
    pub http_port: u16,
    /// The L2 adapter (`type_name`, the events' `backend`); `None` for the documented
    /// form's `default` backend (the server's primary adapter).
    pub adapter: Option<String>,
    /// The victims, at most [`MAX_KEYS_PER_DISPATCH`].
    pub keys: Vec<EncodedKey>,
}

/// A cycle's victims held by one server in one backend (a shared backend's: sent to one of
/// its live members).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Victims {
    /// The server to send them to.
    pub instance_id: String,
    /// The backend (adapter) they are in.
    pub backend: String,
    /// A fleet-shared backend.
    pub shared: bool,
    /// The keys, oldest first.
    pub keys: Vec<EncodedKey>,
}

impl Model {
    /// A failed dispatch: its keys may be planned again at once.
    pub fn release(&mut self, keys: &[EncodedKey]) {
        for key in keys {
            if let Ok(Some(k)) = self.keys.find_compact(key) {
                if let Some(i) = self.keys.slot_of(&key.cache_salt, &k) {
                    self.in_flight.remove(&i);
                }
            }
        }
    }

    /// The eviction decision: every salt whose usage (its copies on live holders) is at
    /// least `trigger_watermark` × its quota (no quota: the default quota; exempt when that
    /// is `None`) gives up its least recently used keys (`eviction_ratio` of them, all of
    /// them at a 0 quota, at least one), at most [`MAX_VICTIMS_PER_CYCLE`] keys per cycle.
    /// Each victim's copies go to the servers holding them, per backend: a private copy to
    /// its server, a shared backend's to one live member. A key planned in the last
    /// [`IN_FLIGHT_CYCLES`] cycles is not planned again (its delete is in flight) unless its
    /// dispatch failed ([`Model::release`]). Usage drops when the servers' delete events come
    /// back. The cost grows with the victims (and the pinned, in-flight and departed keys
    /// the walk passes), not with the salt's keys.
    pub fn plan_evictions(&mut self) -> Vec<Victims> {
        self.cycle += 1;
        let cycle = self.cycle;
        self.in_flight
            .retain(|_, planned| cycle - *planned < IN_FLIGHT_CYCLES + 1);
        let mut groups: indexmap::IndexMap<(String, u8, bool), Victims> = indexmap::IndexMap::new();
        let mut planned = 0usize;
        let mut members: hashbrown::HashMap<u8, Option<String>> = hashbrown::HashMap::new();
        let over: Vec<(String, u64)> = self
            .keys
            .salts()
            .filter(|&(_, used)| used > 0)
            .map(|(s, used)| (s.to_owned(), used))
            .collect();
        for (salt, used) in over {
            let Some(limit) = self.quotas.get(&salt).copied().or(self.default_limit) else {
                continue; // no quota and no default: exempt
            };
            if (used as f64) < self.config.trigger_watermark * limit as f64 {
                continue;
            }
            let ratio = if limit == 0 {
                1.0
            } else {
                self.config.eviction_ratio
            };
            let tracked = self.keys.salt_len(&salt);
            let want = ((tracked as f64 * ratio) as usize).clamp(1, tracked);
            let room = MAX_VICTIMS_PER_CYCLE - planned;
            if want > room {
                self.counters.eviction_cycles_capped += 1;
            }
            let n = want.min(room);
            if n == 0 {
                break;
            }
            // Pinned and in-flight keys are passed over; keys whose holders left move out of
            // the way. The walk looks at most at n, the pins, the keys in flight and n more.
            let budget = 2 * n + self.pins.len() + self.in_flight.len();
            let (pins, in_flight) = (&self.pins, &self.in_flight);
            let skip =
                |keys: &KeyStore, i: u32, k: &crate::coordinator::model::keys::CompactKey| {
                    in_flight.contains_key(&i)
                        || (!pins.is_empty() && pins.contains(&keys.encode(&salt, k)))
                };
            let found = self.keys.oldest_live(&salt, n, budget, skip);
            for (i, k, placements) in found {
                let key = self.keys.encode(&salt, &k);
                self.in_flight.insert(i, cycle);
                planned += 1;
                for p in placements {
                    let target = if p.holder == FLEET {
                        // One member per shared backend and cycle (looked up once: a scan of
                        // the holders).
                        let holders = &self.keys.holders;
                        members
                            .entry(p.backend)
                            .or_insert_with(|| holders.shared_member(p.backend).map(str::to_owned))
                            .as_deref()
                    } else {
                        self.keys.holders.get(p.holder).map(|h| h.id.as_str())
                    };
                    let Some(target) = target else {
                        self.counters.eviction_copies_unreachable += 1;
                        continue;
                    };
                    let group = groups
                        .entry((target.to_owned(), p.backend, p.holder == FLEET))
                        .or_insert_with(|| Victims {
                            instance_id: target.to_owned(),
                            backend: self.keys.holders.backend_name(p.backend).to_owned(),
                            shared: p.holder == FLEET,
                            keys: Vec::new(),
                        });
                    group.keys.push(key.clone());
                }
            }
        }
        self.counters.eviction_keys_planned += planned as u64;
        groups.into_values().collect()
    }
}

/// The eviction calls for `victims`, each group to its server as `find` knows it, at most
/// [`MAX_KEYS_PER_DISPATCH`] keys each; the groups whose server `find` does not know are
/// returned apart (not registered now).
pub fn dispatches(
    victims: Vec<Victims>,
    find: impl Fn(&str) -> Option<Instance>,
) -> (Vec<Dispatch>, Vec<Victims>) {
    let mut out = Vec::new();
    let mut unknown = Vec::new();
    for v in victims {
        let Some(target) = find(&v.instance_id) else {
            unknown.push(v);
            continue;
        };
        // The documented form has no backend: its copies are in the server's primary adapter.
        let adapter = (v.backend != "default").then(|| v.backend.clone());
        for keys in v.keys.chunks(MAX_KEYS_PER_DISPATCH) {
            out.push(Dispatch {
                instance_id: target.instance_id.clone(),
                ip: target.ip.clone(),
                http_port: target.http_port,
                adapter: adapter.clone(),
                keys: keys.to_vec(),
            });
        }
    }
    (out, unknown)
}
