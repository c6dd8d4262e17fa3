//! The coordinator's change log, for hot standbys (`kvplane coordinator --cluster`,
//! docs/CLUSTER.md): every input that changed the leader's state, as one [`Record`], in apply
//! order, and the pure [`Follower`] that applies the same records to a standby's own
//! [`Replica`] (fleet and key model).
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
//! pins as the leader.
//!
//! Not logged: the eviction cycle (it changes nothing but counters: usage drops when the
//! servers' delete events come back, and those are logged) and everything that only reads.
//! Each heartbeat's monotonic instant differs between processes; a standby stamps it at the
//! leader's wall-clock time mapped onto its own clock, and a takeover counts every instance
//! as seen at that moment anyway ([`Change::Takeover`]).
//!
//! Records carry the leader's epoch — the revision of the lease it holds, so a later leader
//! always has a larger one — and a sequence number from 1 within it. Fencing: once a follower
//! has seen an epoch, records of an older one are ignored, so a paused old leader that
//! publishes after losing its lease changes nothing anywhere. A new leader's first record is
//! [`Change::Takeover`]; state carries over from the previous epoch. Pure and synchronous: no
//! clocks (the caller passes its own), no I/O.

use super::events::{Batch, Tier};
use super::fleet::{Fleet, Registration};
use super::keys::EncodedKey;
use super::metadata::Metadata;
use super::model::Model;
pub use crate::cluster::{Applied, LogCursor, Position};
use crate::config::defaults::coordinator::MAX_PINNED_KEYS;
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
    /// The change's bytes (msgpack): a [`Record`]'s last field.
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
                        tokens: super::tokens::for_ops(&batch.tokens, &ops),
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

/// A [`Change`] with its place in the log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The leader's epoch: the revision of its lease.
    pub epoch: u64,
    /// 1, 2, … within the epoch.
    pub seq: u64,
    /// The leader's wall clock when it logged the change, ms since the Unix epoch (for the
    /// lag a standby reports).
    pub at_ms: u64,
    /// The leader's wall clock when it applied the change, Unix seconds (a registration's
    /// time; heartbeats are mapped from it).
    pub now: f64,
    /// The change.
    pub change: Change,
}

impl Record {
    /// The bytes published for this record (msgpack).
    pub fn encode(&self) -> Vec<u8> {
        rmp_serde::to_vec(self).unwrap_or_default()
    }

    /// The bytes of a record whose change is already encoded ([`Change::encode`]): the same
    /// bytes as [`Record::encode`] (a record is a msgpack array of its five fields), so the
    /// leader encodes a change before it takes the log's lock and only numbers it under it.
    pub fn frame(epoch: u64, seq: u64, at_ms: u64, now: f64, change: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(change.len() + 32);
        // Writing into a Vec cannot fail.
        let _ = rmp::encode::write_array_len(&mut out, 5);
        let _ = rmp::encode::write_uint(&mut out, epoch);
        let _ = rmp::encode::write_uint(&mut out, seq);
        let _ = rmp::encode::write_uint(&mut out, at_ms);
        let _ = rmp::encode::write_f64(&mut out, now);
        out.extend_from_slice(change);
        out
    }

    /// A record from published bytes.
    ///
    /// # Errors
    /// When the bytes are not a record.
    pub fn decode(bytes: &[u8]) -> Result<Self, rmp_serde::decode::Error> {
        rmp_serde::from_slice(bytes)
    }
}

/// The state a standby follows: what the two owner tasks hold once it leads.
pub struct Replica {
    /// Fleet membership.
    pub fleet: Fleet,
    /// Event cursors, tracked keys, usage, quotas, pins.
    pub model: Model,
}

impl Replica {
    /// An empty fleet beside `model`.
    pub fn new(model: Model) -> Self {
        Replica {
            fleet: Fleet::new(model.config().max_instances),
            model,
        }
    }
}

/// Where a standby's state is in the log; applies [`Record`]s to it.
#[derive(Debug, Default)]
pub struct Follower {
    cursor: LogCursor,
}

/// `now` on the leader's wall clock (Unix seconds) as an instant of this process, given this
/// process's clock `local` (an instant and the wall-clock time read with it): as long ago as
/// the wall clocks say, never in the future.
pub fn leader_instant(now: f64, local: (Instant, f64)) -> Instant {
    let ago = local.1 - now;
    if !ago.is_finite() || ago <= 0.0 {
        return local.0;
    }
    local
        .0
        .checked_sub(Duration::from_secs_f64(ago.min(1e9)))
        .unwrap_or(local.0)
}

impl Follower {
    /// At the start of the log, before any record.
    pub fn new() -> Self {
        Self::default()
    }

    /// At a snapshot's position.
    pub fn at(p: Position) -> Self {
        Follower {
            cursor: LogCursor::at(p),
        }
    }

    /// Where it is in the log.
    pub fn cursor(&self) -> &LogCursor {
        &self.cursor
    }

    /// Notes the stream sequence of the log message just handled (applied or not).
    pub fn note_stream_seq(&mut self, seq: u64) {
        self.cursor.note_stream_seq(seq);
    }

    /// Applies one record to `state` (the standby's, only ever changed through this);
    /// `local` is this process's clock now (see [`leader_instant`]).
    pub fn apply(&mut self, state: &mut Replica, r: Record, local: (Instant, f64)) -> Applied {
        let fresh = matches!(r.change, Change::Takeover { fresh: true, .. });
        let outcome = self.cursor.admit(r.epoch, r.seq, r.at_ms, fresh);
        if outcome.applies() {
            apply_change(state, r.change, r.now, leader_instant(r.now, local));
        }
        outcome
    }
}

/// Applies `change` (logged at the leader's wall-clock `now`, `at` on this process's clock)
/// through the model functions the leader used.
fn apply_change(state: &mut Replica, change: Change, now: f64, at: Instant) {
    let Replica { fleet, model } = state;
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
