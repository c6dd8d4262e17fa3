//! Read-only views of the index for the HTTP API, metrics and the liveness sweep.
//!
//! Everything here returns owned snapshots (or `&str` borrowed from the index) and never
//! mutates; listing order is registration order throughout.

use super::registry::{Instance, WorkerEntry};
use super::sync::SyncView;
use super::ChunkIndex;
use crate::protocol::{ChunkHash, Wire};

/// Per-instance totals, as in `/controller/key-stats`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceSummary {
    /// Instance id.
    pub instance_id: String,
    /// Memberships over all its workers and locations.
    pub key_count: u64,
    /// Registered workers.
    pub worker_count: usize,
}

/// One location of a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocationView {
    /// Location (backend) name.
    pub name: String,
    /// Exact number of keys held there.
    pub key_count: u64,
    /// Last `seq_num` seen from it (cleared by re-registration and sync start).
    pub last_seq: Option<i64>,
}

/// A snapshot of one worker (LMCache's `WorkerInfo` plus key counts and sync state).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerView {
    /// Instance id.
    pub instance_id: String,
    /// Worker id (TP rank).
    pub worker_id: i64,
    /// Downlink ip.
    pub ip: String,
    /// Downlink port.
    pub port: u16,
    /// P2P address, if the worker serves peers.
    pub peer_init_url: Option<String>,
    /// First registration (Unix seconds; kept across re-registration).
    pub registration_time: f64,
    /// Last heartbeat, or registration if none (Unix seconds).
    pub last_heartbeat_time: f64,
    /// Last sign of life: registration, heartbeat, any message or a successful probe.
    pub last_seen: f64,
    /// Keys over all locations.
    pub key_count: u64,
    /// Locations in creation order.
    pub locations: Vec<LocationView>,
    /// Full-sync state.
    pub sync: SyncView,
    /// The LMCache controller-wire generation it speaks.
    pub wire: Wire,
}

/// A worker's identity and downlink address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerAddr {
    /// Instance id.
    pub instance_id: String,
    /// Worker id.
    pub worker_id: i64,
    /// Downlink ip.
    pub ip: String,
    /// Downlink port.
    pub port: u16,
}

impl ChunkIndex {
    /// Registered workers.
    pub fn worker_count(&self) -> usize {
        self.reg.worker_count()
    }

    /// Instances with at least one worker.
    pub fn instance_count(&self) -> usize {
        self.reg.instance_count()
    }

    /// Live (holder, chunk) memberships: the sum of every location's exact key count. A chunk
    /// held by two workers (or two locations) counts twice, like LMCache's key count.
    pub fn key_count(&self) -> u64 {
        self.chunks.live_members()
    }

    /// Per-instance totals in registration order.
    pub fn instances(&self) -> Vec<InstanceSummary> {
        self.reg
            .instances()
            .map(|inst| InstanceSummary {
                instance_id: inst.name.to_string(),
                key_count: self
                    .instance_workers_iter(inst)
                    .map(|w| self.worker_keys(w))
                    .sum(),
                worker_count: inst.workers.len(),
            })
            .collect()
    }

    /// Every worker in registration order.
    pub fn workers(&self) -> Vec<WorkerView> {
        self.reg
            .workers()
            .map(|(_, inst, w)| self.view(inst, w))
            .collect()
    }

    /// `limit` workers from `offset`, in registration order: only those are built, so a
    /// small page of a big fleet is cheap.
    pub fn workers_page(&self, offset: usize, limit: usize) -> Vec<WorkerView> {
        self.reg
            .workers()
            .skip(offset)
            .take(limit)
            .map(|(_, inst, w)| self.view(inst, w))
            .collect()
    }

    /// The workers of one instance in registration order; `None` for an unknown instance.
    pub fn instance_workers(&self, instance_id: &str) -> Option<Vec<WorkerView>> {
        let inst = self.reg.instance(self.reg.instance_slot(instance_id)?)?;
        Some(
            self.instance_workers_iter(inst)
                .map(|w| self.view(inst, w))
                .collect(),
        )
    }

    /// One worker.
    pub fn worker(&self, instance_id: &str, worker_id: i64) -> Option<WorkerView> {
        let w = self.worker_ref(instance_id, worker_id)?;
        Some(self.view(self.reg.instance(w.instance)?, w))
    }

    /// The first instance (registration order) with a worker at `ip` (`/query_instance`).
    pub fn instance_by_ip(&self, ip: &str) -> Option<&str> {
        self.reg
            .workers()
            .find(|(_, _, w)| w.ip == ip)
            .map(|(_, inst, _)| &*inst.name)
    }

    /// Every key of one worker location, sorted. A full scan of the reverse index: for tests
    /// and debugging only.
    pub fn keys_of(&self, instance_id: &str, worker_id: i64, location: &str) -> Vec<ChunkHash> {
        self.worker_ref(instance_id, worker_id)
            .and_then(|w| w.location(location).map(|i| w.locations[i].holder))
            .map_or_else(Vec::new, |h| self.chunks.keys_of(h))
    }

    /// Whether the worker is registered and silent: `now - last_seen > timeout_s`. O(1): the
    /// liveness sweep asks it once per failed probe instead of rebuilding
    /// [`ChunkIndex::stale_workers`].
    pub fn is_stale(&self, instance_id: &str, worker_id: i64, now: f64, timeout_s: f64) -> bool {
        self.worker_ref(instance_id, worker_id)
            .is_some_and(|w| now - w.last_seen > timeout_s)
    }

    /// Workers with `now - last_seen > timeout_s`, in registration order.
    pub fn stale_workers(&self, now: f64, timeout_s: f64) -> Vec<WorkerAddr> {
        self.reg
            .workers()
            .filter(|(_, _, w)| now - w.last_seen > timeout_s)
            .map(|(_, inst, w)| WorkerAddr {
                instance_id: inst.name.to_string(),
                worker_id: w.worker_id,
                ip: w.ip.clone(),
                port: w.port,
            })
            .collect()
    }

    fn instance_workers_iter<'a>(
        &'a self,
        inst: &'a Instance,
    ) -> impl Iterator<Item = &'a WorkerEntry> + 'a {
        inst.workers
            .iter()
            .filter_map(move |&(_, ws)| self.reg.worker(ws))
    }

    fn worker_keys(&self, w: &WorkerEntry) -> u64 {
        w.locations
            .iter()
            .map(|l| self.chunks.key_count(l.holder))
            .sum()
    }

    fn view(&self, inst: &Instance, w: &WorkerEntry) -> WorkerView {
        WorkerView {
            instance_id: inst.name.to_string(),
            worker_id: w.worker_id,
            ip: w.ip.clone(),
            port: w.port,
            peer_init_url: w.peer_init_url.clone(),
            registration_time: w.registration_time,
            last_heartbeat_time: w.last_heartbeat_time,
            last_seen: w.last_seen,
            key_count: self.worker_keys(w),
            locations: w
                .locations
                .iter()
                .map(|l| LocationView {
                    name: l.name.to_string(),
                    key_count: self.chunks.key_count(l.holder),
                    last_seq: l.last_seq,
                })
                .collect(),
            sync: w.sync.view(),
            wire: w.wire,
        }
    }
}
