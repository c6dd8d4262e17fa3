//! What a service gives the replication core: its state as a deterministic machine of
//! [`Replicated::Change`]s ([`Replicated`]: apply a change, dump and restore the whole state)
//! and where that state lives ([`Host`]: the service's own lock around it). Everything else —
//! numbering, publishing, following, fencing, snapshots, takeover, status — is the core's
//! (`leader.rs`, `follower.rs`, `status.rs`).
//!
//! Must not: know any service. A service implements these two traits and nothing else.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Instant;

/// When a record was applied on the leader, and when a follower applies it.
#[derive(Clone, Copy, Debug)]
pub struct Stamp {
    /// The leader's clock when it applied the change (Unix seconds: the `now` it passed in).
    pub now: f64,
    /// The leader's wall clock when it logged the change (ms since the Unix epoch).
    pub at_ms: u64,
    /// This process's clock now: a monotonic instant and the wall-clock time read with it
    /// (a follower maps the leader's times onto its own clock from it).
    pub local: (Instant, f64),
}

/// A service's state as the replication core sees it: deterministic, so a follower that
/// applies the leader's changes in the leader's order holds the leader's state.
pub trait Replicated: Sized + Send + 'static {
    /// The service's name: its stream, lease key and metrics label.
    const SERVICE: &'static str;
    /// One change, as the leader applied it (msgpack on the wire).
    type Change: Serialize + DeserializeOwned + Send + 'static;
    /// The whole state as a value (a snapshot's body).
    type Dump: Serialize + DeserializeOwned + Send + 'static;

    /// Applies one change read from the leader's log, through the functions the leader used.
    fn apply(&mut self, change: Self::Change, at: &Stamp);

    /// The whole state as a value. A full pass: the core calls it off the async workers.
    fn dump(&self) -> Self::Dump;

    /// A state of this one's configuration (limits) holding `dump`.
    ///
    /// # Errors
    /// When this configuration's limits cannot hold it.
    fn restore(&self, dump: Self::Dump) -> Result<Self, String>;

    /// A new leader's first record of its epoch; `fresh`: the log held nothing before.
    fn takeover(holder: String, fresh: bool) -> Self::Change;

    /// Whether `change` starts its epoch from an empty state, so that a follower reading the
    /// log from it holds everything.
    fn fresh(change: &Self::Change) -> bool;

    /// Two changes that, applied in order, do what `change` does: for a record larger than
    /// NATS takes. `None` when it cannot be cut.
    fn split(change: &Self::Change) -> Option<(Self::Change, Self::Change)> {
        let _ = change;
        None
    }

    /// A new epoch begins, before its first record is applied. The state carries on by
    /// default (a takeover); a service whose every leader starts empty clears it here.
    fn new_epoch(&mut self) {}
}

/// Where a service keeps its replicated state: the lock records are applied under.
pub trait Host: Send + Sync + 'static {
    /// The state.
    type State: Replicated;

    /// Runs `f` on the state under the lock it changes under; `None` when the state is no
    /// longer followed (it was handed to the leader's owners at a takeover).
    fn write<R>(&self, f: impl FnOnce(&mut Self::State) -> R) -> Option<R>;

    /// Runs `f` on the state under a lock that keeps it from changing (a read lock where the
    /// service has one); `None` as for [`Host::write`].
    fn read<R>(&self, f: impl FnOnce(&Self::State) -> R) -> Option<R>;

    /// The clock stamped on records as their `now` (Unix seconds).
    fn now(&self) -> f64 {
        super::now_ms() as f64 / 1e3
    }

    /// `change` is about to be applied (for the service's own counters).
    fn applying(&self, change: &<Self::State as Replicated>::Change) {
        let _ = change;
    }
}

/// A state the core keeps itself until a takeover hands it to the service (the coordinator's
/// owners take theirs out).
#[derive(Debug)]
pub struct Owned<S>(parking_lot::Mutex<Option<S>>);

impl<S> Owned<S> {
    /// Holding `state`.
    pub fn new(state: S) -> Self {
        Owned(parking_lot::Mutex::new(Some(state)))
    }

    /// The state, taken out: records that come later are not applied.
    pub fn take(&self) -> Option<S> {
        self.0.lock().take()
    }
}

impl<S: Replicated> Host for Owned<S> {
    type State = S;

    fn write<R>(&self, f: impl FnOnce(&mut S) -> R) -> Option<R> {
        self.0.lock().as_mut().map(f)
    }

    fn read<R>(&self, f: impl FnOnce(&S) -> R) -> Option<R> {
        self.0.lock().as_ref().map(f)
    }
}
