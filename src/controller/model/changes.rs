//! The controller's change log, for hot standbys (`--cluster`, docs/CLUSTER.md): every input
//! that changed the leader's [`ControllerState`], as one [`Change`], in apply order, and the
//! [`ControllerState`] as a [`Replicated`] state: a standby applies the same changes to its own fleet through the
//! replication core (`crate::cluster`), which numbers, publishes, follows and snapshots them.
//!
//! The fleet is deterministic: each change is a function of the message and the time the
//! leader passed in. So the log holds the inputs themselves — the PULL frames of one
//! multipart, a ROUTER request that changes the fleet, the liveness sweep's outcomes — with
//! the leader's `now`, and a standby that applies them in order holds the same registrations,
//! downlink records (generations included), chunk index, sequence numbers and full-sync state
//! as the leader. What it does not hold is soft state: the orchestration command log and the
//! live downlink tasks (opened at takeover from the records).
//!
//! The core's records carry the leader's epoch (fencing a deposed leader) and number; a new
//! leader's first record is [`Change::Takeover`] and the state carries over from the previous
//! epoch. Pure and synchronous: no clocks, no I/O.

use super::{ControllerDump, ControllerState, ProbeTarget, RequestContext, RouterKind, WorkerKey};
use crate::cluster::{Replicated, Stamp};
use crate::protocol::{decode, decode_batch, KVOpEvent};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

/// One change to the fleet, as the leader applied it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Change {
    /// The frames of one PULL multipart that were applied, in order (admit/evict batches,
    /// full-sync batches and ends, deregistrations), as received.
    Pull {
        /// The frames (msgpack, LMCache's wire format).
        frames: Vec<ByteBuf>,
    },
    /// A ROUTER request that may change the fleet (registration, heartbeat, full-sync start).
    Request {
        /// Whether it came in on the heartbeat socket.
        heartbeat: bool,
        /// The request (msgpack).
        frame: ByteBuf,
    },
    /// The liveness sweep marked stalled full syncs failed.
    ExpireSyncs {
        /// The full-sync timeout it used, seconds.
        timeout_s: f64,
    },
    /// A probe was answered: the worker counts as seen.
    ProbeAnswered {
        /// The worker.
        key: WorkerKey,
        /// The downlink generation probed.
        generation: u64,
    },
    /// A probe failed and the worker was removed.
    ProbeFailed {
        /// The worker.
        key: WorkerKey,
        /// The downlink generation probed.
        generation: u64,
        /// The worker timeout it used, seconds.
        timeout_s: f64,
    },
    /// The leader found its followed state incomplete (a gap): every worker is asked for a
    /// full sync at its next heartbeat.
    ResyncAll,
    /// A new leader took the lease: every worker counts as seen at `now` (a worker is not
    /// removed for the silence of a failover), and the epoch's records follow.
    Takeover {
        /// Who took it (host, process).
        holder: String,
        /// Whether the log was empty when it did: the state starts from nothing, so a
        /// follower that reads from here on holds all of it.
        fresh: bool,
    },
}

impl Replicated for ControllerState {
    const SERVICE: &'static str = "controller";
    type Change = Change;
    type Dump = ControllerDump;

    /// Applies one change at the leader's `now`, through the model functions the leader used
    /// (a frame that does not decode, never expected since the leader applied it, changes
    /// nothing).
    fn apply(&mut self, change: Change, at: &Stamp) {
        let now = at.now;
        match change {
            Change::Pull { frames } => {
                let mut ops: Vec<KVOpEvent> = Vec::new();
                for frame in &frames {
                    ops.clear();
                    if let Some(b) = decode_batch(frame, &mut ops) {
                        self.apply_batch(b.instance_id, b.worker_id, b.location, &ops, now);
                    } else if let Ok(msg) = decode(frame) {
                        let _ = self.on_push(msg, now);
                    }
                }
            }
            Change::Request { heartbeat, frame } => {
                if let Ok(msg) = decode(&frame) {
                    let kind = if heartbeat {
                        RouterKind::Heartbeat
                    } else {
                        RouterKind::Reply
                    };
                    let ctx = RequestContext {
                        now,
                        heartbeat_url: None,
                    };
                    let _ = self.on_request(kind, msg, &ctx);
                }
            }
            Change::ExpireSyncs { timeout_s } => {
                self.expire_syncs(now, timeout_s);
            }
            Change::ProbeAnswered { key, generation } => {
                let t = target(self, &key, generation);
                self.probe_answered(&t, now);
            }
            Change::ProbeFailed {
                key,
                generation,
                timeout_s,
            } => {
                let t = target(self, &key, generation);
                self.probe_failed(&t, now, timeout_s);
            }
            Change::Takeover { .. } => self.touch_all(now),
            Change::ResyncAll => self.request_resync_all(),
        }
    }

    fn dump(&self) -> ControllerDump {
        ControllerState::dump(self)
    }

    fn restore(&self, dump: ControllerDump) -> Result<Self, String> {
        ControllerState::restore(self.index().config().clone(), &dump).map_err(|e| e.to_string())
    }

    fn takeover(holder: String, fresh: bool) -> Change {
        Change::Takeover { holder, fresh }
    }

    fn fresh(change: &Change) -> bool {
        matches!(change, Change::Takeover { fresh: true, .. })
    }

    /// A multipart's frames in two halves (each frame is applied on its own).
    fn split(change: &Change) -> Option<(Change, Change)> {
        let Change::Pull { frames } = change else {
            return None;
        };
        if frames.len() < 2 {
            return None;
        }
        let (a, b) = frames.split_at(frames.len() / 2);
        Some((
            Change::Pull { frames: a.to_vec() },
            Change::Pull { frames: b.to_vec() },
        ))
    }
}

fn target(fleet: &ControllerState, key: &WorkerKey, generation: u64) -> ProbeTarget {
    ProbeTarget {
        key: key.clone(),
        generation,
        endpoint: fleet
            .downlink(&key.0, key.1)
            .map(|d| d.endpoint.clone())
            .unwrap_or_default(),
    }
}

#[cfg(test)]
#[path = "changes_tests.rs"]
mod tests;
