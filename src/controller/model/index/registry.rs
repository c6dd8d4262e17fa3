//! The registry: instances → workers → per-location state, in registration order.
//!
//! Owns worker records (endpoint, timestamps, locations with their holder ids and sequence
//! trackers, sync state). It does not touch the reverse index: the facade in `mod.rs` kills and
//! allocates holders around registry changes. Lookups by `(&str, i64)` never allocate.

use super::chunks::HolderId;
use super::sync_state::SyncState;
use super::IndexError;
use crate::protocol::Wire;
use hashbrown::HashMap;

/// A vector of optional records with a free list: stable `u32` slots, reused after removal.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<u32>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    fn insert(&mut self, value: T) -> Result<u32, IndexError> {
        if let Some(i) = self.free.pop() {
            self.items[i as usize] = Some(value);
            return Ok(i);
        }
        let i = u32::try_from(self.items.len())
            .ok()
            .filter(|&i| i < u32::MAX)
            .ok_or(IndexError::CapacityExceeded)?;
        self.items.push(Some(value));
        Ok(i)
    }

    fn remove(&mut self, i: u32) -> Option<T> {
        let v = self.items.get_mut(i as usize)?.take()?;
        self.free.push(i);
        Some(v)
    }

    fn get(&self, i: u32) -> Option<&T> {
        self.items.get(i as usize)?.as_ref()
    }

    fn get_mut(&mut self, i: u32) -> Option<&mut T> {
        self.items.get_mut(i as usize)?.as_mut()
    }
}

/// One location (storage backend) of a worker: its holder id and sequence tracker.
#[derive(Debug)]
pub(crate) struct Location {
    pub(crate) name: Box<str>,
    pub(crate) holder: HolderId,
    pub(crate) last_seq: Option<i64>,
}

/// One registered worker.
#[derive(Debug)]
pub(crate) struct WorkerEntry {
    pub(crate) instance: u32,
    pub(crate) worker_id: i64,
    /// Global registration sequence number (tie-breaks, listing order).
    pub(crate) seq: u64,
    pub(crate) ip: String,
    pub(crate) port: u16,
    pub(crate) peer_init_url: Option<String>,
    pub(crate) registration_time: f64,
    pub(crate) last_heartbeat_time: f64,
    pub(crate) last_seen: f64,
    /// Locations in creation order (tiny; scanned linearly).
    pub(crate) locations: Vec<Location>,
    pub(crate) sync: SyncState,
    /// A full sync to ask for at the next heartbeat, with its reason (a controller that took
    /// over with incomplete state).
    pub(crate) resync: Option<&'static str>,
    /// The LMCache controller-wire generation it speaks (set by the controller).
    pub(crate) wire: Wire,
}

impl WorkerEntry {
    /// Raises `last_seen` to `now` (never lowers it).
    pub(crate) fn touch(&mut self, now: f64) {
        self.last_seen = self.last_seen.max(now);
    }

    /// Updates the endpoint; returns whether ip or port changed.
    pub(crate) fn set_endpoint(
        &mut self,
        ip: &str,
        port: u16,
        peer_init_url: Option<&str>,
    ) -> bool {
        let changed = self.ip != ip || self.port != port;
        if self.ip != ip {
            ip.clone_into(&mut self.ip);
        }
        self.port = port;
        if self.peer_init_url.as_deref() != peer_init_url {
            self.peer_init_url = peer_init_url.map(str::to_owned);
        }
        changed
    }

    /// Index of location `name`, if present.
    pub(crate) fn location(&self, name: &str) -> Option<usize> {
        self.locations.iter().position(|l| &*l.name == name)
    }

    /// Position of the location owning `holder` (for tie-breaks).
    pub(crate) fn location_of(&self, holder: HolderId) -> Option<&Location> {
        self.locations.iter().find(|l| l.holder == holder)
    }
}

/// One instance: its workers in registration order.
#[derive(Debug)]
pub(crate) struct Instance {
    pub(crate) name: Box<str>,
    pub(crate) seq: u64,
    /// `(worker_id, worker slot)` in registration order.
    pub(crate) workers: Vec<(i64, u32)>,
}

/// Instances and workers, each kept in registration order.
#[derive(Debug, Default)]
pub(crate) struct WorkerRegistry {
    by_name: HashMap<Box<str>, u32>,
    instances: Slab<Instance>,
    /// Instance slots in registration order.
    order: Vec<u32>,
    workers: Slab<WorkerEntry>,
    worker_count: usize,
    next_seq: u64,
}

impl WorkerRegistry {
    /// Slot of instance `name`.
    pub(crate) fn instance_slot(&self, name: &str) -> Option<u32> {
        self.by_name.get(name).copied()
    }

    /// Slot of worker `(instance, worker_id)`; never allocates.
    pub(crate) fn find(&self, instance: &str, worker_id: i64) -> Option<u32> {
        let inst = self.instances.get(self.instance_slot(instance)?)?;
        inst.workers
            .iter()
            .find(|(id, _)| *id == worker_id)
            .map(|&(_, ws)| ws)
    }

    pub(crate) fn worker(&self, ws: u32) -> Option<&WorkerEntry> {
        self.workers.get(ws)
    }

    pub(crate) fn worker_mut(&mut self, ws: u32) -> Option<&mut WorkerEntry> {
        self.workers.get_mut(ws)
    }

    pub(crate) fn instance(&self, is: u32) -> Option<&Instance> {
        self.instances.get(is)
    }

    pub(crate) fn worker_count(&self) -> usize {
        self.worker_count
    }

    pub(crate) fn instance_count(&self) -> usize {
        self.order.len()
    }

    /// Adds a new worker (creating its instance if needed) with
    /// `registration_time = last_heartbeat_time = last_seen = now`.
    pub(crate) fn insert(
        &mut self,
        instance: &str,
        worker_id: i64,
        ip: &str,
        port: u16,
        peer_init_url: Option<&str>,
        now: f64,
    ) -> Result<u32, IndexError> {
        let is = match self.instance_slot(instance) {
            Some(is) => is,
            None => {
                let seq = self.bump_seq();
                let is = self.instances.insert(Instance {
                    name: instance.into(),
                    seq,
                    workers: Vec::new(),
                })?;
                self.by_name.insert(instance.into(), is);
                self.order.push(is);
                is
            }
        };
        let seq = self.bump_seq();
        let inserted = self.workers.insert(WorkerEntry {
            instance: is,
            worker_id,
            seq,
            ip: ip.to_owned(),
            port,
            peer_init_url: peer_init_url.map(str::to_owned),
            registration_time: now,
            last_heartbeat_time: now,
            last_seen: now,
            locations: Vec::new(),
            sync: SyncState::Idle,
            resync: None,
            wire: Wire::default(),
        });
        let ws = match inserted {
            Ok(ws) => ws,
            Err(e) => {
                self.drop_instance_if_empty(is);
                return Err(e);
            }
        };
        if let Some(inst) = self.instances.get_mut(is) {
            inst.workers.push((worker_id, ws));
        }
        self.worker_count += 1;
        Ok(ws)
    }

    /// Removes worker slot `ws` (dropping its instance when empty) and returns the record.
    pub(crate) fn remove(&mut self, ws: u32) -> Option<WorkerEntry> {
        let w = self.workers.remove(ws)?;
        self.worker_count = self.worker_count.saturating_sub(1);
        if let Some(inst) = self.instances.get_mut(w.instance) {
            inst.workers.retain(|&(_, s)| s != ws);
        }
        self.drop_instance_if_empty(w.instance);
        Some(w)
    }

    fn drop_instance_if_empty(&mut self, is: u32) {
        if self.instances.get(is).is_some_and(|i| i.workers.is_empty()) {
            if let Some(inst) = self.instances.remove(is) {
                self.by_name.remove(&*inst.name);
            }
            self.order.retain(|&s| s != is);
        }
    }

    /// Restores registration order numbers (a snapshot): the instance's and worker `ws`'s.
    pub(crate) fn set_seqs(&mut self, ws: u32, instance_seq: u64, worker_seq: u64) {
        if let Some(w) = self.workers.get_mut(ws) {
            w.seq = worker_seq;
            if let Some(inst) = self.instances.get_mut(w.instance) {
                inst.seq = instance_seq;
            }
        }
    }

    /// The last registration order number handed out.
    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Restores the last registration order number handed out (a snapshot).
    pub(crate) fn set_next_seq(&mut self, seq: u64) {
        self.next_seq = seq;
    }

    fn bump_seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    /// Instances in registration order.
    pub(crate) fn instances(&self) -> impl Iterator<Item = &Instance> + '_ {
        self.order.iter().filter_map(|&is| self.instances.get(is))
    }

    /// Workers in registration order (instances first, then workers within each), with slots.
    pub(crate) fn workers(&self) -> impl Iterator<Item = (u32, &Instance, &WorkerEntry)> + '_ {
        self.instances().flat_map(move |inst| {
            inst.workers
                .iter()
                .filter_map(move |&(_, ws)| Some((ws, inst, self.workers.get(ws)?)))
        })
    }

    /// The registration-order key of worker `w`: (instance seq, worker seq).
    pub(crate) fn order_key(&self, w: &WorkerEntry) -> (u64, u64) {
        (
            self.instances.get(w.instance).map_or(u64::MAX, |i| i.seq),
            w.seq,
        )
    }
}
