//! Every change to the coordinator's state, as one [`Handle`] method each: it runs the model
//! (or fleet) function on its owner and, on a cluster's leader, logs the input in the same job
//! ([`Change`], `super::changes`), so records are in apply order and a standby replays exactly
//! what was applied. Reads stay plain [`Handle::with`] / [`Handle::fleet`] closures. Without
//! `--cluster` nothing is logged and no input is copied.

use super::changes::{Admitted, Change};
use super::cluster::ChangeLog;
use super::driver::{Handle, Stopped};
use super::events::Batch;
use super::fleet::{FleetError, Registration};
use super::keys::EncodedKey;
use super::model::{Ingested, Model, QuotaError};
use super::pins::PinsFull;
use std::sync::Arc;

/// Logs the change `f` builds (only when there is a log: no copy otherwise).
fn record(log: &Option<Arc<ChangeLog>>, wall: f64, f: impl FnOnce() -> Change) {
    if let Some(log) = log {
        log.record(wall, &f());
    }
}

/// Applies one slice, logged first (moved into the record and back: never copied).
fn apply_slice(m: &mut Model, log: Option<&ChangeLog>, wall: f64, batch: Batch) {
    let Some(log) = log else {
        return m.apply_slice(batch);
    };
    let change = Change::Apply { batch };
    log.record(wall, &change);
    if let Change::Apply { batch } = change {
        m.apply_slice(batch);
    }
}

impl Handle {
    /// `POST /instances`: registers (`gen` names an instance that gave no id).
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn register(
        &self,
        req: Registration,
        gen: impl FnOnce() -> String + Send + 'static,
    ) -> Result<Result<(String, bool), FleetError>, Stopped> {
        let log = self.log.clone();
        self.fleet(move |f, now, wall| {
            let kept = log.as_ref().map(|_| req.clone());
            let r = f.register(req, gen, now, wall);
            if let (Some(mut registration), Ok((id, _))) = (kept, &r) {
                registration.instance_id = Some(id.clone());
                record(&log, wall, || Change::Register { registration });
            }
            r
        })
        .await
    }

    /// A heartbeat; false for an unknown instance.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn heartbeat(&self, id: String) -> Result<bool, Stopped> {
        let log = self.log.clone();
        self.fleet(move |f, now, wall| {
            let known = f.heartbeat(&id, now);
            if known {
                record(&log, wall, || Change::Heartbeat { instance_id: id });
            }
            known
        })
        .await
    }

    /// `DELETE /instances/{id}`: leaves the fleet, then the key model forgets its cursor.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn deregister(&self, id: String) -> Result<(), Stopped> {
        let log = self.log.clone();
        let gone = id.clone();
        self.fleet(move |f, _, wall| {
            if f.remove(&gone) {
                record(&log, wall, || Change::Deregister { instance_id: gone });
            }
        })
        .await?;
        self.forget_instances(vec![id]).await
    }

    /// Instances left: the key owner forgets their event cursors.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn forget_instances(&self, ids: Vec<String>) -> Result<(), Stopped> {
        let log = self.log.clone();
        self.with(move |m, _, wall| {
            for id in &ids {
                m.forget_instance(id, wall);
            }
            record(&log, wall, || Change::Forget { instance_ids: ids });
        })
        .await
    }

    /// Admits `batches` and applies their first slices, up to `budget` events (at least the
    /// first slice is applied whole only if it fits), in one job; returns what was admitted and
    /// the slices still to apply ([`Handle::apply_slice`]), in order.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn admit(
        &self,
        batches: Vec<Batch>,
        budget: usize,
    ) -> Result<(Ingested, Vec<Batch>), Stopped> {
        let log = self.log.clone();
        self.with(move |m, _, wall| {
            record(&log, wall, || Change::Admit {
                batches: batches.iter().map(Admitted::of).collect(),
            });
            let (got, slices) = m.admit(batches);
            let mut slices = slices.into_iter();
            let mut budget = budget;
            let mut rest = Vec::new();
            for b in slices.by_ref() {
                if b.ops.len() > budget {
                    rest.push(b);
                    break;
                }
                budget -= b.ops.len();
                apply_slice(m, log.as_deref(), wall, b);
            }
            rest.extend(slices);
            (got, rest)
        })
        .await
    }

    /// Applies one slice [`Handle::admit`] left.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn apply_slice(&self, batch: Batch) -> Result<(), Stopped> {
        let log = self.log.clone();
        self.with(move |m, _, wall| apply_slice(m, log.as_deref(), wall, batch))
            .await
    }

    /// `PUT /quota/config`.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn set_default_limit(
        &self,
        limit_gb: Option<f64>,
    ) -> Result<Result<(), QuotaError>, Stopped> {
        let log = self.log.clone();
        self.with(move |m, _, wall| {
            let r = m.set_default_limit(limit_gb);
            if r.is_ok() {
                record(&log, wall, || Change::DefaultQuota { limit_gb });
            }
            r
        })
        .await
    }

    /// `PUT /quota/{salt}`.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn set_quota(
        &self,
        cache_salt: String,
        limit_gb: f64,
    ) -> Result<Result<(), QuotaError>, Stopped> {
        let log = self.log.clone();
        self.with(move |m, _, wall| {
            let r = m.set_quota(&cache_salt, limit_gb);
            if r.is_ok() {
                record(&log, wall, || Change::SetQuota {
                    cache_salt,
                    limit_gb,
                });
            }
            r
        })
        .await
    }

    /// `DELETE /quota/{salt}`: true if a quota existed.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn remove_quota(&self, cache_salt: String) -> Result<bool, Stopped> {
        let log = self.log.clone();
        self.with(move |m, _, wall| {
            let existed = m.remove_quota(&cache_salt);
            if existed {
                record(&log, wall, || Change::RemoveQuota { cache_salt });
            }
            existed
        })
        .await
    }

    /// `POST /cache/pins`: one more pin on each key, unless that passes `max` pinned keys.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn pin(
        &self,
        keys: Vec<EncodedKey>,
        max: usize,
    ) -> Result<Result<(), PinsFull>, Stopped> {
        let log = self.log.clone();
        self.with(move |m, _, wall| {
            let r = m.pins.pin(&keys, max);
            if r.is_ok() {
                record(&log, wall, || Change::Pin { keys });
            }
            r
        })
        .await
    }

    /// `DELETE /cache/pins`: one pin less on each key.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn unpin(&self, keys: Vec<EncodedKey>) -> Result<(), Stopped> {
        let log = self.log.clone();
        self.with(move |m, _, wall| {
            m.pins.unpin(&keys);
            record(&log, wall, || Change::Unpin { keys });
        })
        .await
    }

    /// A forced delete drops these keys' pins.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn drop_pins(&self, keys: Vec<EncodedKey>) -> Result<(), Stopped> {
        let log = self.log.clone();
        self.with(move |m, _, wall| {
            m.pins.drop_pins(&keys);
            record(&log, wall, || Change::DropPins { keys });
        })
        .await
    }

    /// The startup resync seeds one page of `instance_id`'s listing of `backend`; returns
    /// how many copies were added.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn seed(
        &self,
        instance_id: String,
        backend: String,
        shared: bool,
        entries: Vec<(EncodedKey, u64)>,
    ) -> Result<u64, Stopped> {
        let log = self.log.clone();
        self.with(move |m, _, wall| {
            let kept = log.as_ref().map(|_| entries.clone());
            let added = m.seed(&instance_id, &backend, shared, entries);
            if let Some(entries) = kept {
                record(&log, wall, || Change::Seed {
                    instance_id,
                    backend,
                    shared,
                    entries,
                });
            }
            added
        })
        .await
    }

    /// A failed eviction dispatch: its keys may be planned again (not logged: which keys are
    /// in flight is the leader's own).
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn release(&self, keys: Vec<EncodedKey>) -> Result<(), Stopped> {
        self.with(move |m, _, _| m.release(&keys)).await
    }

    /// Logs the whole operator state (quotas, default quota, pins), replacing a follower's: a
    /// standby that joined after the stream dropped the records that set it gets it from the
    /// next one. Nothing without a log.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn log_metadata(&self) -> Result<(), Stopped> {
        let Some(log) = self.log.clone() else {
            return Ok(());
        };
        self.with(move |m, _, wall| log.record(wall, &metadata_change(m, wall)))
            .await
    }
}

/// The whole operator state of `m`, replacing a follower's.
pub(crate) fn metadata_change(m: &Model, wall: f64) -> Change {
    Change::Metadata {
        replace: true,
        doc: m.capture_metadata(wall),
    }
}
