//! Who holds L2 copies: the MP servers with private L2 (one per instance id) and the fleet
//! (holder 0, `""`: every `"shared": true` backend), interned as `u16`s for the key store's
//! placements, and the L2 backends (adapter names) as `u8`s.
//!
//! A holder is *live* until its server leaves (`DELETE /instances/{id}` or the timeout
//! sweep): a departed holder's placements stay (its disk still has them; a restart with the
//! same id makes them live again) but are not counted in any salt's usage and are never
//! eviction victims (no server can delete them), until they expire
//! ([`crate::config::defaults::coordinator::DEPARTED_L2_TTL_S`]). So each holder keeps its
//! bytes per salt, and leaving or coming back moves them out of or into the salts' totals in
//! O(salts it holds), without touching keys. Pure: the caller passes the time.

use hashbrown::HashMap;
use indexmap::IndexSet;

/// The fleet's holder (shared backends).
pub(crate) const FLEET: u16 = 0;
/// Most L2 backend names (distinct adapter `type_name`s).
pub(crate) const MAX_BACKENDS: usize = 255;
/// Longest backend name tracked.
pub(crate) const MAX_BACKEND_LEN: usize = 64;

/// One holder.
pub(crate) struct Holder {
    /// Instance id (`""` for the fleet).
    pub(crate) id: String,
    /// When it left (wall-clock seconds), `None` while live.
    pub(crate) departed_at: Option<f64>,
    /// Placements it holds.
    pub(crate) placements: u64,
    /// Bytes it holds per salt (entries at 0 removed).
    pub(crate) salt_bytes: HashMap<String, u64>,
    /// Shared backends it has reported (bit per backend index), so a shared backend's
    /// victims can be sent to one live member.
    pub(crate) shared_member: [u64; 4],
}

impl Holder {
    fn new(id: String) -> Self {
        Holder {
            id,
            departed_at: None,
            placements: 0,
            salt_bytes: HashMap::new(),
            shared_member: [0; 4],
        }
    }

    /// Whether it counts (the fleet always does).
    pub(crate) fn live(&self) -> bool {
        self.departed_at.is_none()
    }
}

/// The holder and backend tables.
pub(crate) struct Holders {
    slots: Vec<Option<Holder>>,
    by_id: HashMap<String, u16>,
    /// Freed indices, lowest reused first (so the choice depends on the state only).
    free: std::collections::BTreeSet<u16>,
    /// Most holders (the fleet included).
    max: usize,
    /// L2 backend names, by index.
    pub(crate) backends: IndexSet<String>,
}

/// A holder in a snapshot: `(id, departed_at, shared-member bits)` at its index.
pub(crate) type HolderDump = Option<(String, Option<f64>, [u64; 4])>;

impl Holders {
    /// The fleet alone; at most `max` holders (at least 2, at most `u16::MAX`).
    pub(crate) fn new(max: usize) -> Self {
        let mut h = Holders {
            slots: vec![Some(Holder::new(String::new()))],
            by_id: HashMap::new(),
            free: std::collections::BTreeSet::new(),
            max: max.clamp(2, usize::from(u16::MAX)),
            backends: IndexSet::new(),
        };
        h.by_id.insert(String::new(), FLEET);
        h
    }

    /// The holder at `i`.
    pub(crate) fn get(&self, i: u16) -> Option<&Holder> {
        self.slots.get(usize::from(i)).and_then(Option::as_ref)
    }

    pub(crate) fn get_mut(&mut self, i: u16) -> Option<&mut Holder> {
        self.slots.get_mut(usize::from(i)).and_then(Option::as_mut)
    }

    /// Whether holder `i` counts.
    pub(crate) fn live(&self, i: u16) -> bool {
        self.get(i).is_some_and(Holder::live)
    }

    /// The index of `id`, if it is a holder.
    pub(crate) fn find(&self, id: &str) -> Option<u16> {
        self.by_id.get(id).copied()
    }

    /// The index of `id`, interned (live) if new; `None` at the holder limit.
    pub(crate) fn intern(&mut self, id: &str) -> Option<u16> {
        if let Some(i) = self.find(id) {
            return Some(i);
        }
        let i = match self.free.pop_first() {
            Some(i) => i,
            None if self.slots.len() < self.max => {
                self.slots.push(None);
                u16::try_from(self.slots.len() - 1).ok()?
            }
            None => return None,
        };
        self.slots[usize::from(i)] = Some(Holder::new(id.to_owned()));
        self.by_id.insert(id.to_owned(), i);
        Some(i)
    }

    /// The index of backend `name`, interned if new; `None` if too long or at the limit.
    pub(crate) fn backend(&mut self, name: &str) -> Option<u8> {
        if let Some(i) = self.backends.get_index_of(name) {
            return u8::try_from(i).ok();
        }
        if name.len() > MAX_BACKEND_LEN || self.backends.len() >= MAX_BACKENDS {
            return None;
        }
        u8::try_from(self.backends.insert_full(name.to_owned()).0).ok()
    }

    /// The name of backend `i`.
    pub(crate) fn backend_name(&self, i: u8) -> &str {
        self.backends
            .get_index(usize::from(i))
            .map_or("", String::as_str)
    }

    /// Notes that instance `id` reports the shared backend `name` (bounded like placements:
    /// nothing at the holder or backend limit).
    pub(crate) fn note_shared(&mut self, id: &str, name: &str) {
        if id.is_empty() {
            return;
        }
        let (Some(b), Some(i)) = (self.backend(name), self.intern(id)) else {
            return;
        };
        if let Some(h) = self.get_mut(i) {
            h.shared_member[usize::from(b / 64)] |= 1 << (b % 64);
        }
    }

    /// A live member of shared backend `b` (the first by holder index), if any: a scan of
    /// the holders.
    pub(crate) fn shared_member(&self, b: u8) -> Option<&str> {
        let bit = |h: &&Holder| h.shared_member[usize::from(b / 64)] & (1 << (b % 64)) != 0;
        self.slots
            .iter()
            .flatten()
            .filter(|h| h.live() && !h.id.is_empty())
            .find(bit)
            .map(|h| h.id.as_str())
    }

    /// Frees holder `i` if it holds nothing, has left and is no shared member (the fleet
    /// never goes).
    pub(crate) fn release_if_unused(&mut self, i: u16) {
        let unused = i != FLEET
            && self
                .get(i)
                .is_some_and(|h| h.placements == 0 && !h.live() && h.shared_member == [0; 4]);
        if unused {
            if let Some(h) = self.slots[usize::from(i)].take() {
                self.by_id.remove(&h.id);
            }
            self.free.insert(i);
        }
    }

    /// Forgets that `i` is a shared member (it left) and frees it if unused.
    pub(crate) fn leave(&mut self, i: u16, now: f64) {
        if let Some(h) = self.get_mut(i) {
            if i != FLEET && h.departed_at.is_none() {
                h.departed_at = Some(now);
            }
            h.shared_member = [0; 4];
        }
        self.release_if_unused(i);
    }

    /// Departed holders that left at or before `cutoff`.
    pub(crate) fn departed_before(&self, cutoff: f64) -> Vec<u16> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, h)| {
                let h = h.as_ref()?;
                let gone = h.departed_at.is_some_and(|t| t <= cutoff);
                gone.then(|| u16::try_from(i).ok()).flatten()
            })
            .collect()
    }

    /// Holders in use.
    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Bytes allocated for the tables (ids, per-salt maps), approximately.
    pub(crate) fn memory_bytes(&self) -> usize {
        let per: usize = self
            .slots
            .iter()
            .flatten()
            .map(|h| h.id.capacity() + h.salt_bytes.allocation_size())
            .sum();
        per + self.slots.capacity() * std::mem::size_of::<Option<Holder>>()
            + self.by_id.allocation_size()
    }

    /// The tables for a snapshot: holders by index, backends in order.
    pub(crate) fn dump(&self) -> (Vec<HolderDump>, Vec<String>) {
        let holders = self
            .slots
            .iter()
            .map(|h| {
                h.as_ref()
                    .map(|h| (h.id.clone(), h.departed_at, h.shared_member))
            })
            .collect();
        (holders, self.backends.iter().cloned().collect())
    }

    /// Tables holding `dump`'s holders (no placements yet) and backends.
    ///
    /// # Errors
    /// When the dump does not fit `max` or names a holder twice.
    pub(crate) fn restore(
        max: usize,
        holders: Vec<HolderDump>,
        backends: Vec<String>,
    ) -> Result<Self, String> {
        let mut h = Holders::new(max);
        if holders.len() > h.max || backends.len() > MAX_BACKENDS {
            return Err(format!("more than {} holders or backends", h.max));
        }
        h.slots.clear();
        h.by_id.clear();
        for (i, d) in holders.into_iter().enumerate() {
            let i = u16::try_from(i).map_err(|_| "holder index".to_string())?;
            match d {
                Some((id, departed_at, shared_member)) => {
                    if h.by_id.insert(id.clone(), i).is_some() {
                        return Err(format!("holder {id:?} twice"));
                    }
                    let mut holder = Holder::new(id);
                    holder.departed_at = departed_at;
                    holder.shared_member = shared_member;
                    h.slots.push(Some(holder));
                }
                None => {
                    h.slots.push(None);
                    h.free.insert(i);
                }
            }
        }
        if h.find("") != Some(FLEET) {
            return Err("the fleet holder is not first".into());
        }
        h.backends = backends.into_iter().collect();
        Ok(h)
    }
}
