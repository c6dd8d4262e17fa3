//! Every change to the coordinator's state as one [`Handle`] method: a job on the owner that
//! holds the state, running the logged method of [`Keys`] or [`Members`] (`super::logged`), so
//! a change is applied and, on a cluster's leader, logged in one step. Reads stay plain
//! [`Handle::with`] / [`Handle::fleet`] closures, which only get `&Model` / `&Instances`.

use super::driver::{Handle, Stopped};
use super::logged::Keys;
use crate::coordinator::model::events::Batch;
use crate::coordinator::model::fleet::{FleetError, Registration};
use crate::coordinator::model::keys::EncodedKey;
use crate::coordinator::model::pins::PinsFull;
use crate::coordinator::model::{Ingested, QuotaError};

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
        self.change_fleet(move |m, now, wall| m.register(req, gen, now, wall))
            .await
    }

    /// A heartbeat; false for an unknown instance.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn heartbeat(&self, id: String) -> Result<bool, Stopped> {
        self.change_fleet(move |m, now, wall| m.heartbeat(id, now, wall))
            .await
    }

    /// `DELETE /instances/{id}`: leaves the fleet, then the key model forgets its cursor.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn deregister(&self, id: String) -> Result<(), Stopped> {
        let gone = id.clone();
        self.change_fleet(move |m, _, wall| m.deregister(gone, wall))
            .await?;
        self.forget_instances(vec![id]).await
    }

    /// Instances left: the key owner forgets their event cursors.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn forget_instances(&self, ids: Vec<String>) -> Result<(), Stopped> {
        self.change_keys(move |k, _, wall| k.forget_instances(ids, wall))
            .await
    }

    /// Admits `batches` and applies their first slices, up to `budget` events, in one job;
    /// returns what was admitted and the slices still to apply ([`Handle::apply_slice`]), in
    /// order.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn admit(
        &self,
        batches: Vec<Batch>,
        budget: usize,
    ) -> Result<(Ingested, Vec<Batch>), Stopped> {
        self.change_keys(move |k, _, wall| k.admit(batches, budget, wall))
            .await
    }

    /// Applies one slice [`Handle::admit`] left.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn apply_slice(&self, batch: Batch) -> Result<(), Stopped> {
        self.change_keys(move |k, _, wall| k.apply_slice(batch, wall))
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
        self.change_keys(move |k, _, wall| k.set_default_limit(limit_gb, wall))
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
        self.change_keys(move |k, _, wall| k.set_quota(cache_salt, limit_gb, wall))
            .await
    }

    /// `DELETE /quota/{salt}`: true if a quota existed.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn remove_quota(&self, cache_salt: String) -> Result<bool, Stopped> {
        self.change_keys(move |k, _, wall| k.remove_quota(cache_salt, wall))
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
        self.change_keys(move |k, _, wall| k.pin(keys, max, wall))
            .await
    }

    /// `DELETE /cache/pins`: one pin less on each key.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn unpin(&self, keys: Vec<EncodedKey>) -> Result<(), Stopped> {
        self.change_keys(move |k, _, wall| k.unpin(keys, wall))
            .await
    }

    /// A forced delete drops these keys' pins.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn drop_pins(&self, keys: Vec<EncodedKey>) -> Result<(), Stopped> {
        self.change_keys(move |k, _, wall| k.drop_pins(keys, wall))
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
        self.change_keys(move |k, _, wall| k.seed(instance_id, backend, shared, entries, wall))
            .await
    }

    /// A failed eviction dispatch: its keys may be planned again (not logged: which keys are
    /// in flight is the leader's own).
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn release(&self, keys: Vec<EncodedKey>) -> Result<(), Stopped> {
        self.change_keys(move |k: &mut Keys, _, _| k.release(&keys))
            .await
    }

    /// Logs the whole operator state (quotas, default quota, pins), replacing a follower's: a
    /// standby that joined after the stream dropped the records that set it gets it from the
    /// next one. Nothing without a log.
    ///
    /// # Errors
    /// [`Stopped`] after shutdown.
    pub async fn log_metadata(&self) -> Result<(), Stopped> {
        self.change_keys(move |k, _, wall| k.log_metadata(wall))
            .await
    }
}
