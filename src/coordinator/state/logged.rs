//! The coordinator's state as its two owner tasks hold it: [`Keys`] (the key model) and
//! [`Members`] (the fleet), each beside the leader's change log. Their fields are private to
//! this file: outside it the state is read (`model()`, `fleet()`) and changed only through the
//! methods below, each of which applies one change and, on a cluster's leader, logs it as a
//! [`Change`] in the same step — so the records are in apply order and a standby replays
//! exactly what was applied. A change that is not one of these methods does not compile.
//! Without `--cluster` nothing is logged and no input is copied.
//!
//! Not logged, on purpose: the eviction plan's in-flight marks ([`Keys::plan_evictions`],
//! [`Keys::release`]): which keys are being deleted is the leader's own business (a new leader
//! may plan them once more; the delete is idempotent).
//!
//! A read job cannot change the model: it gets `&Model` (nor a fleet job the fleet).
//!
//! ```compile_fail,E0596
//! # async fn unlogged(h: kvplane::coordinator::driver::Handle) {
//! let _ = h.with(|m, _, _| m.set_quota("tenant", 1.0)).await;
//! # }
//! ```
//!
//! Must not: do I/O, read clocks (the owners pass `now`), await.

use super::changes::{Admitted, Change, CoordinatorState};
use crate::coordinator::model::events::Batch;
use crate::coordinator::model::fleet::{FleetError, Instances, Registration};
use crate::coordinator::model::keys::EncodedKey;
use crate::coordinator::model::pins::PinsFull;
use crate::coordinator::model::{Ingested, Model, QuotaError, Victims};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The coordinator's change log as its leader writes it.
pub(crate) type ChangeLog = crate::cluster::ChangeLog<CoordinatorState>;

/// The leader's log, if any: logs the change `f` builds (no copy without a log).
#[derive(Clone, Default)]
struct Log(Option<Arc<ChangeLog>>);

impl Log {
    fn record(&self, wall: f64, f: impl FnOnce() -> Change) {
        if let Some(log) = &self.0 {
            log.record(wall, &f());
        }
    }

    fn on(&self) -> bool {
        self.0.is_some()
    }
}

/// The key model as the key owner holds it.
pub(crate) struct Keys {
    model: Model,
    log: Log,
    /// Sees every applied batch and every server that leaves (`kvplane serve`'s indexer).
    tap: Option<super::tap::Tap>,
}

/// The fleet as the fleet owner holds it.
pub(crate) struct Members {
    fleet: Instances,
    log: Log,
}

/// The owners' halves of `state`; with `log` (a cluster's leader) every change is logged in
/// it, starting with the whole operator state (a standby that joined after the stream
/// dropped the records that set it gets it from here).
pub(crate) fn split(
    state: CoordinatorState,
    log: Option<Arc<ChangeLog>>,
    wall: f64,
) -> (Keys, Members) {
    let CoordinatorState { fleet, model } = state;
    let log = Log(log);
    let keys = Keys {
        model,
        log: log.clone(),
        tap: None,
    };
    keys.log_metadata(wall);
    (keys, Members { fleet, log })
}

impl Members {
    /// The fleet, to read.
    pub(crate) fn fleet(&self) -> &Instances {
        &self.fleet
    }

    /// `POST /instances`: registers (`gen` names an instance that gave no id).
    ///
    /// # Errors
    /// The fleet is full.
    pub(crate) fn register(
        &mut self,
        req: Registration,
        gen: impl FnOnce() -> String,
        now: Instant,
        wall: f64,
    ) -> Result<(String, bool), FleetError> {
        let kept = self.log.on().then(|| req.clone());
        let r = self.fleet.register(req, gen, now, wall);
        if let (Some(mut registration), Ok((id, _))) = (kept, &r) {
            registration.instance_id = Some(id.clone());
            self.log.record(wall, || Change::Register { registration });
        }
        r
    }

    /// A heartbeat; false for an unknown instance.
    pub(crate) fn heartbeat(&mut self, id: String, now: Instant, wall: f64) -> bool {
        let known = self.fleet.heartbeat(&id, now);
        if known {
            self.log
                .record(wall, || Change::Heartbeat { instance_id: id });
        }
        known
    }

    /// `DELETE /instances/{id}`: leaves the fleet; whether it was registered.
    pub(crate) fn deregister(&mut self, id: String, wall: f64) -> bool {
        let gone = self.fleet.remove(&id);
        if gone {
            self.log
                .record(wall, || Change::Deregister { instance_id: id });
        }
        gone
    }

    /// The health sweep: removes the instances silent for `timeout`; returns them.
    pub(crate) fn sweep(&mut self, now: Instant, timeout: Duration, wall: f64) -> Vec<String> {
        let gone = self.fleet.sweep(now, timeout);
        if !gone.is_empty() {
            self.log.record(wall, || Change::TimedOut {
                instance_ids: gone.clone(),
            });
        }
        gone
    }
}

impl Keys {
    /// With `tap` called after every applied batch and for every server that leaves.
    pub(crate) fn with_tap(mut self, tap: Option<super::tap::Tap>) -> Self {
        self.tap = tap;
        self
    }

    /// The key model, to read.
    pub(crate) fn model(&self) -> &Model {
        &self.model
    }

    /// Instances left: their event cursors are forgotten.
    pub(crate) fn forget_instances(&mut self, ids: Vec<String>, wall: f64) {
        for id in &ids {
            self.model.forget_instance(id, wall);
            if let Some(tap) = &self.tap {
                (tap.0)(super::tap::TapEvent::Left(id));
            }
        }
        self.log
            .record(wall, || Change::Forget { instance_ids: ids });
    }

    /// Admits `batches` and applies their first slices, up to `budget` events; returns what
    /// was admitted and the slices still to apply ([`Keys::apply_slice`]), in order.
    pub(crate) fn admit(
        &mut self,
        batches: Vec<Batch>,
        budget: usize,
        wall: f64,
    ) -> (Ingested, Vec<Batch>) {
        self.log.record(wall, || Change::Admit {
            batches: batches.iter().map(Admitted::of).collect(),
        });
        let (got, slices) = self.model.admit(batches);
        let mut slices = slices.into_iter();
        let mut budget = budget;
        let mut rest = Vec::new();
        for b in slices.by_ref() {
            if b.ops.len() > budget {
                rest.push(b);
                break;
            }
            budget -= b.ops.len();
            self.apply_slice(b, wall);
        }
        rest.extend(slices);
        (got, rest)
    }

    /// Applies one slice [`Keys::admit`] left (logged first, moved into the record and back:
    /// never copied).
    pub(crate) fn apply_slice(&mut self, batch: Batch, wall: f64) {
        if let Some(tap) = &self.tap {
            (tap.0)(super::tap::TapEvent::Applied(&batch));
        }
        let Some(log) = &self.log.0 else {
            return self.model.apply_slice(batch);
        };
        let change = Change::Apply { batch };
        log.record(wall, &change);
        if let Change::Apply { batch } = change {
            self.model.apply_slice(batch);
        }
    }

    /// `PUT /quota/config`.
    ///
    /// # Errors
    /// An invalid limit.
    pub(crate) fn set_default_limit(
        &mut self,
        limit_gb: Option<f64>,
        wall: f64,
    ) -> Result<(), QuotaError> {
        let r = self.model.set_default_limit(limit_gb);
        if r.is_ok() {
            self.log.record(wall, || Change::DefaultQuota { limit_gb });
        }
        r
    }

    /// `PUT /quota/{salt}`.
    ///
    /// # Errors
    /// An invalid limit, or too many quotas.
    pub(crate) fn set_quota(
        &mut self,
        cache_salt: String,
        limit_gb: f64,
        wall: f64,
    ) -> Result<(), QuotaError> {
        let r = self.model.set_quota(&cache_salt, limit_gb);
        if r.is_ok() {
            self.log.record(wall, || Change::SetQuota {
                cache_salt,
                limit_gb,
            });
        }
        r
    }

    /// `DELETE /quota/{salt}`: true if a quota existed.
    pub(crate) fn remove_quota(&mut self, cache_salt: String, wall: f64) -> bool {
        let existed = self.model.remove_quota(&cache_salt);
        if existed {
            self.log.record(wall, || Change::RemoveQuota { cache_salt });
        }
        existed
    }

    /// `POST /cache/pins`: one more pin on each key, unless that passes `max` pinned keys.
    ///
    /// # Errors
    /// Too many pinned keys.
    pub(crate) fn pin(
        &mut self,
        keys: Vec<EncodedKey>,
        max: usize,
        wall: f64,
    ) -> Result<(), PinsFull> {
        let r = self.model.pins.pin(&keys, max);
        if r.is_ok() {
            self.log.record(wall, || Change::Pin { keys });
        }
        r
    }

    /// `DELETE /cache/pins`: one pin less on each key.
    pub(crate) fn unpin(&mut self, keys: Vec<EncodedKey>, wall: f64) {
        self.model.pins.unpin(&keys);
        self.log.record(wall, || Change::Unpin { keys });
    }

    /// A forced delete drops these keys' pins.
    pub(crate) fn drop_pins(&mut self, keys: Vec<EncodedKey>, wall: f64) {
        self.model.pins.drop_pins(&keys);
        self.log.record(wall, || Change::DropPins { keys });
    }

    /// The startup resync seeds one page of `instance_id`'s listing of `backend`; returns how
    /// many copies were added.
    pub(crate) fn seed(
        &mut self,
        instance_id: String,
        backend: String,
        shared: bool,
        entries: Vec<(EncodedKey, u64)>,
        wall: f64,
    ) -> u64 {
        let kept = self.log.on().then(|| entries.clone());
        let added = self.model.seed(&instance_id, &backend, shared, entries);
        if let Some(entries) = kept {
            self.log.record(wall, || Change::Seed {
                instance_id,
                backend,
                shared,
                entries,
            });
        }
        added
    }

    /// The eviction cycle drops the L2 copies of the servers that left at or before `cutoff`;
    /// returns those servers.
    pub(crate) fn expire_departed(&mut self, cutoff: f64, wall: f64) -> Vec<String> {
        if !self.model.has_departed_before(cutoff) {
            return Vec::new();
        }
        self.log.record(wall, || Change::Expire { cutoff });
        self.model.expire_departed(cutoff)
    }

    /// The eviction plan: victims per holder, marked in flight (not logged, see the module
    /// docs).
    pub(crate) fn plan_evictions(&mut self) -> Vec<Victims> {
        self.model.plan_evictions()
    }

    /// A failed eviction dispatch: its keys may be planned again (not logged).
    pub(crate) fn release(&mut self, keys: &[EncodedKey]) {
        self.model.release(keys);
    }

    /// Logs the whole operator state (quotas, default quota, pins), replacing a follower's.
    /// Nothing without a log.
    pub(crate) fn log_metadata(&self, wall: f64) {
        self.log.record(wall, || Change::Metadata {
            replace: true,
            doc: self.model.capture_metadata(wall),
        });
    }
}
