//! The coordinator's change log, for hot standbys (`kvplane coordinator --cluster`,
//! docs/CLUSTER.md): every input that changed the leader's state, as one [`Change`], in apply
//! order, and the [`CoordinatorState`] (fleet and key model) as the replication core's
//! [`Replicated`] state: a standby applies the same changes to its own through the core
//! (`crate::cluster`), which numbers, publishes, follows, fences and snapshots them.
//!
//! The state is deterministic given its inputs: the model has no clock and no randomness, and
//! the fleet's only inputs besides the request are the times its owner passes in. So the log
//! holds the inputs — a registration with the id the leader chose, a heartbeat, a
//! deregistration, the sweep's outcome (the ids it removed), the sequence gate's input and
//! each slice of events as the leader applied it, quota, default-quota and pin changes, the
//! startup resync's seeded keys, the operator state as a whole (at takeover and every few
//! minutes) — with the leader's wall clock as `now`. A standby applying them in order through
//! the same model functions holds the same memberships (registration times included), event
//! cursors, tracked keys in the same LRU order, usage per instance and compartment, quotas and
//! pins as the leader. On the leader, every change goes through `super::logged`, which logs it
//! in the owner job that applies it.
//!
//! Not logged: the eviction cycle (it changes nothing but counters: usage drops when the
//! servers' delete events come back, and those are logged) and everything that only reads.
//! Each heartbeat's monotonic instant differs between processes; a standby stamps it at the
//! leader's wall-clock time mapped onto its own clock, and a takeover counts every instance
//! as seen at that moment anyway ([`Change::Takeover`]). Pure and synchronous: no clocks (the
//! core passes this process's), no I/O.

use super::snapshot::StateDump;
use crate::cluster::{Replicated, Stamp};
use crate::config::defaults::coordinator::MAX_PINNED_KEYS;
use crate::coordinator::model::events::{Batch, Tier};
use crate::coordinator::model::fleet::{Instances, Registration};
use crate::coordinator::model::keys::EncodedKey;
use crate::coordinator::model::metadata::Metadata;
use crate::coordinator::model::Model;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// One event batch as the sequence gate saw it (its operations follow in [`Change::Apply`]
/// records, slice by slice, as the leader applied them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Admitted {
    /// Sender.
    pub instance_id: String,
    /// Sender's incarnation.
    pub incarnation: u64,
    /// Sequence number.
    pub seq: u64,
}

impl Admitted {
    /// The gate's input of `b`.
    pub fn of(b: &Batch) -> Self {
        Admitted {
            instance_id: b.instance_id.clone(),
            incarnation: b.incarnation,
            seq: b.seq,
        }
    }

    /// A batch with this header and no operations: what the gate reads of it.
    fn as_batch(&self) -> Batch {
        Batch {
            instance_id: self.instance_id.clone(),
            incarnation: self.incarnation,
            seq: self.seq,
            tier: Tier::L2,
            backend: String::new(),
            shared: false,
            capacity: None,
            ops: Vec::new(),
            tokens: Vec::new(),
        }
    }
}

/// One change to the coordinator's state, as the leader applied it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Change {
    /// A new leader took the lease: every instance counts as seen at `now`, and the epoch's
    /// records follow.
    Takeover {
        /// Who took it (host, process).
        holder: String,
        /// Whether the log was empty when it did: the state starts from nothing, so a
        /// follower that reads from here on holds all of it.
        fresh: bool,
    },
    /// `POST /instances`, with the id the leader used (generated ones included); registered at
    /// `now`.
    Register {
        /// The registration (`instance_id` always set).
        registration: Registration,
    },
    /// A heartbeat of a registered instance.
    Heartbeat {
        /// The instance.
        instance_id: String,
    },
    /// `DELETE /instances/{id}` of a registered instance.
    Deregister {
        /// The instance.
        instance_id: String,
    },
    /// The health sweep removed these instances.
    TimedOut {
        /// The instances.
        instance_ids: Vec<String>,
    },
    /// The key model forgot these instances' event cursors and L1 bytes.
    Forget {
        /// The instances.
        instance_ids: Vec<String>,
    },
    /// Event batches went through the sequence gate (duplicates and stale ones included).
    Admit {
        /// Their headers, in order.
        batches: Vec<Admitted>,
    },
    /// One slice of an admitted batch was applied.
    Apply {
        /// The slice.
        batch: Batch,
    },
    /// `PUT /quota/config`.
    DefaultQuota {
        /// GiB (`None`: exempt).
        limit_gb: Option<f64>,
    },
    /// `PUT /quota/{salt}`.
    SetQuota {
        /// The salt.
        cache_salt: String,
        /// GiB.
        limit_gb: f64,
    },
    /// `DELETE /quota/{salt}` of an existing quota.
    RemoveQuota {
        /// The salt.
        cache_salt: String,
    },
    /// `POST /cache/pins` that succeeded.
    Pin {
        /// The keys pinned once more.
        keys: Vec<EncodedKey>,
    },
    /// `DELETE /cache/pins`.
    Unpin {
        /// The keys unpinned once.
        keys: Vec<EncodedKey>,
    },
    /// A forced `POST /cache/delete` dropped these keys' pins.
    DropPins {
        /// The keys.
        keys: Vec<EncodedKey>,
    },
    /// One page of the startup resync was seeded.
    Seed {
        /// The server listed.
        instance_id: String,
        /// Its adapter (`backend`).
        backend: String,
        /// A fleet-shared adapter.
        shared: bool,
        /// Keys and sizes.
        entries: Vec<(EncodedKey, u64)>,
    },
    /// The eviction cycle dropped the L2 copies of the servers that left at or before
    /// `cutoff` (the leader's wall clock, Unix seconds).
    Expire {
        /// The cutoff.
        cutoff: f64,
    },
    /// The operator state (quotas, default quota, pins) as a whole, or a further part of it.
    Metadata {
        /// Replace the follower's operator state (the first part) rather than add to it.
        replace: bool,
        /// The state (`saved_at` is not used).
        doc: Metadata,
    },
}

/// Two halves of `v`, if it has at least two items.
fn halves<T: Clone>(v: &[T]) -> Option<(Vec<T>, Vec<T>)> {
    (v.len() > 1).then(|| {
        let (a, b) = v.split_at(v.len() / 2);
        (a.to_vec(), b.to_vec())
    })
}

impl Change {
    /// The change's bytes (msgpack): a [`Record`](crate::cluster::Record)'s last field.
    pub fn encode(&self) -> Vec<u8> {
        // Every field is a plain value: the encoder cannot fail on it.
        rmp_serde::to_vec(self).unwrap_or_default()
    }

    /// Two changes that, applied in order, do what this one does (for a record larger than
    /// NATS takes); `None` when it cannot be cut.
    pub fn split(&self) -> Option<(Change, Change)> {
        let pair = match self {
            Change::Apply { batch } => {
                let (a, b) = halves(&batch.ops)?;
                let part = |ops: Vec<_>| Change::Apply {
                    batch: Batch {
                        tokens: crate::coordinator::model::events::for_ops(&batch.tokens, &ops),
                        instance_id: batch.instance_id.clone(),
                        incarnation: batch.incarnation,
                        seq: batch.seq,
                        tier: batch.tier,
                        backend: batch.backend.clone(),
                        shared: batch.shared,
                        capacity: batch.capacity,
                        ops,
                    },
                };
                (part(a), part(b))
            }
            Change::Admit { batches } => {
                let (a, b) = halves(batches)?;
                (Change::Admit { batches: a }, Change::Admit { batches: b })
            }
            Change::TimedOut { instance_ids } => {
                let (a, b) = halves(instance_ids)?;
                (
                    Change::TimedOut { instance_ids: a },
                    Change::TimedOut { instance_ids: b },
                )
            }
            Change::Forget { instance_ids } => {
                let (a, b) = halves(instance_ids)?;
                (
                    Change::Forget { instance_ids: a },
                    Change::Forget { instance_ids: b },
                )
            }
            Change::Pin { keys } => {
                let (a, b) = halves(keys)?;
                (Change::Pin { keys: a }, Change::Pin { keys: b })
            }
            Change::Unpin { keys } => {
                let (a, b) = halves(keys)?;
                (Change::Unpin { keys: a }, Change::Unpin { keys: b })
            }
            Change::DropPins { keys } => {
                let (a, b) = halves(keys)?;
                (Change::DropPins { keys: a }, Change::DropPins { keys: b })
            }
            Change::Seed {
                instance_id,
                backend,
                shared,
                entries,
            } => {
                let (a, b) = halves(entries)?;
                let part = |entries| Change::Seed {
                    instance_id: instance_id.clone(),
                    backend: backend.clone(),
                    shared: *shared,
                    entries,
                };
                (part(a), part(b))
            }
            Change::Metadata { replace, doc } => {
                // The first part keeps `replace` and the quotas; both set the default quota.
                let part = |replace, quotas, pins| Change::Metadata {
                    replace,
                    doc: Metadata {
                        quotas,
                        pins,
                        ..doc.clone()
                    },
                };
                if let Some((a, b)) = halves(&doc.pins) {
                    (
                        part(*replace, doc.quotas.clone(), a),
                        part(false, Default::default(), b),
                    )
                } else {
                    let quotas: Vec<(String, u64)> =
                        doc.quotas.iter().map(|(s, b)| (s.clone(), *b)).collect();
                    let (a, b) = halves(&quotas)?;
                    (
                        part(*replace, a.into_iter().collect(), doc.pins.clone()),
                        part(false, b.into_iter().collect(), Vec::new()),
                    )
                }
            }
            Change::Takeover { .. }
            | Change::Register { .. }
            | Change::Heartbeat { .. }
            | Change::Deregister { .. }
            | Change::DefaultQuota { .. }
            | Change::SetQuota { .. }
            | Change::RemoveQuota { .. }
            | Change::Expire { .. } => return None,
        };
        Some(pair)
    }
}

/// The state a standby follows: what the two owner tasks hold once it leads.
pub struct CoordinatorState {
    /// Fleet membership.
    pub fleet: Instances,
    /// Event cursors, tracked keys, usage, quotas, pins.
    pub model: Model,
}

impl CoordinatorState {
    /// An empty fleet beside `model`.
    pub fn new(model: Model) -> Self {
        CoordinatorState {
            fleet: Instances::new(model.config().max_instances),
            model,
        }
    }
}

/// `now` on the leader's wall clock (Unix seconds) as an instant of this process, given this
/// process's clock `local` (an instant and the wall-clock time read with it): as long ago as
/// the wall clocks say, never in the future.
pub(crate) fn leader_instant(now: f64, local: (Instant, f64)) -> Instant {
    let ago = local.1 - now;
    if !ago.is_finite() || ago <= 0.0 {
        return local.0;
    }
    local
        .0
        .checked_sub(Duration::from_secs_f64(ago.min(1e9)))
        .unwrap_or(local.0)
}

impl Replicated for CoordinatorState {
    const SERVICE: &'static str = "coordinator";
    type Change = Change;
    type Dump = StateDump;

    fn apply(&mut self, change: Change, at: &Stamp) {
        apply_change(self, change, at.now, leader_instant(at.now, at.local));
    }

    fn dump(&self) -> StateDump {
        StateDump {
            fleet: self.fleet.dump(),
            model: self.model.dump(),
        }
    }

    /// Within this state's limits; every restored instance counts as seen now, as at a
    /// takeover.
    fn restore(&self, dump: StateDump) -> Result<Self, String> {
        let config = self.model.config().clone();
        let fleet = Instances::restore(config.max_instances, dump.fleet, Instant::now())
            .map_err(|e| e.to_string())?;
        let model = Model::restore(config, dump.model)?;
        Ok(CoordinatorState { fleet, model })
    }

    fn takeover(holder: String, fresh: bool) -> Change {
        Change::Takeover { holder, fresh }
    }

    fn fresh(change: &Change) -> bool {
        matches!(change, Change::Takeover { fresh: true, .. })
    }

    fn split(change: &Change) -> Option<(Change, Change)> {
        change.split()
    }
}

/// Applies `change` (logged at the leader's wall-clock `now`, `at` on this process's clock)
/// through the model functions the leader used.
fn apply_change(state: &mut CoordinatorState, change: Change, now: f64, at: Instant) {
    let CoordinatorState { fleet, model } = state;
    match change {
        Change::Takeover { .. } => fleet.touch_all(at),
        Change::Register { registration } => {
            let _ = fleet.register(registration, String::new, at, now);
        }
        Change::Heartbeat { instance_id } => {
            fleet.heartbeat(&instance_id, at);
        }
        Change::Deregister { instance_id } => {
            fleet.remove(&instance_id);
        }
        Change::TimedOut { instance_ids } => fleet.time_out(&instance_ids),
        Change::Forget { instance_ids } => {
            for id in &instance_ids {
                model.forget_instance(id, now);
            }
        }
        Change::Admit { batches } => {
            let _ = model.admit(batches.iter().map(Admitted::as_batch));
        }
        Change::Apply { batch } => model.apply_slice(batch),
        Change::DefaultQuota { limit_gb } => {
            let _ = model.set_default_limit(limit_gb);
        }
        Change::SetQuota {
            cache_salt,
            limit_gb,
        } => {
            let _ = model.set_quota(&cache_salt, limit_gb);
        }
        Change::RemoveQuota { cache_salt } => {
            model.remove_quota(&cache_salt);
        }
        Change::Pin { keys } => {
            let _ = model.pins.pin(&keys, MAX_PINNED_KEYS);
        }
        Change::Unpin { keys } => model.pins.unpin(&keys),
        Change::DropPins { keys } => model.pins.drop_pins(&keys),
        Change::Seed {
            instance_id,
            backend,
            shared,
            entries,
        } => {
            model.seed(&instance_id, &backend, shared, entries);
        }
        Change::Expire { cutoff } => {
            model.expire_departed(cutoff);
        }
        Change::Metadata { replace, doc } => {
            if replace {
                model.clear_metadata();
            }
            model.restore_metadata(doc, MAX_PINNED_KEYS);
        }
    }
}

#[cfg(test)]
#[path = "changes_tests.rs"]
pub(crate) mod tests;
