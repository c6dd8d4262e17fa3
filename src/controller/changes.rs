//! The controller's change log, for hot standbys (`--cluster`, docs/CLUSTER.md): every input
//! that changed the leader's [`Fleet`], as one [`Record`], in apply order, and the pure
//! [`Follower`] that applies the same records to a standby's own fleet.
//!
//! The fleet is deterministic: each change is a function of the message and the time the
//! leader passed in. So the log holds the inputs themselves — the PULL frames of one
//! multipart, a ROUTER request that changes the fleet, the liveness sweep's outcomes — with
//! the leader's `now`, and a standby that applies them in order holds the same registrations,
//! downlink records (generations included), chunk index, sequence numbers and full-sync state
//! as the leader. What it does not hold is soft state: the orchestration command log and the
//! live downlink tasks (opened at takeover from the records).
//!
//! Records carry the leader's epoch — the revision of the lease it holds, so a later leader
//! always has a larger one — and a sequence number from 1 within it. Fencing: once a follower
//! has seen an epoch, records of an older one are ignored, so a paused old leader that
//! publishes after losing its lease changes nothing anywhere. A new leader's first record is
//! [`Change::Takeover`]; state carries over from the previous epoch (unlike the indexer's log,
//! where a new epoch is a fresh index). Pure and synchronous: no clocks, no I/O.

use super::model::{Fleet, ProbeTarget, RequestContext, RouterKind, WorkerKey};
pub use crate::cluster::{Applied, LogCursor, Position};
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

/// A [`Change`] with its place in the log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The leader's epoch: the revision of its lease.
    pub epoch: u64,
    /// 1, 2, … within the epoch.
    pub seq: u64,
    /// The leader's wall clock when it applied the change, ms since the Unix epoch (for the
    /// lag a standby reports).
    pub at_ms: u64,
    /// The `now` the leader applied it at (the controller's clock, Unix seconds).
    pub now: f64,
    /// The change.
    pub change: Change,
}

impl Record {
    /// The bytes published for this record (msgpack).
    pub fn encode(&self) -> Vec<u8> {
        // Every field is a plain value: the encoder cannot fail on it.
        rmp_serde::to_vec(self).unwrap_or_default()
    }

    /// A record from published bytes.
    ///
    /// # Errors
    /// When the bytes are not a record.
    pub fn decode(bytes: &[u8]) -> Result<Self, rmp_serde::decode::Error> {
        rmp_serde::from_slice(bytes)
    }
}

/// A follower's fleet and its place in the log: restored by a follower that starts later, which
/// then reads the log from `position.stream_seq + 1`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The log position the fleet reflects.
    pub position: Position,
    /// The fleet.
    pub fleet: super::model::FleetDump,
}

impl Snapshot {
    /// The bytes published (msgpack).
    pub fn encode(&self) -> Vec<u8> {
        rmp_serde::to_vec(self).unwrap_or_default()
    }

    /// A snapshot from published bytes.
    ///
    /// # Errors
    /// When the bytes are not a snapshot.
    pub fn decode(bytes: &[u8]) -> Result<Self, rmp_serde::decode::Error> {
        rmp_serde::from_slice(bytes)
    }
}

/// Where a standby's fleet is in the log; applies [`Record`]s to it.
#[derive(Debug, Default)]
pub struct Follower {
    cursor: LogCursor,
    undecodable_frames: u64,
}

impl Follower {
    /// At the start of the log, before any record.
    pub fn new() -> Self {
        Self::default()
    }

    /// At a snapshot's position.
    pub fn at(p: Position) -> Self {
        Self {
            cursor: LogCursor::at(p),
            ..Self::default()
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

    /// Frames in records that did not decode (never expected: the leader applied them).
    pub fn undecodable_frames(&self) -> u64 {
        self.undecodable_frames
    }

    /// Applies one record to `fleet` (the standby's, only ever changed through this).
    pub fn apply(&mut self, fleet: &mut Fleet, r: &Record) -> Applied {
        let fresh = matches!(r.change, Change::Takeover { fresh: true, .. });
        let outcome = self.cursor.admit(r.epoch, r.seq, r.at_ms, fresh);
        if outcome.applies() {
            self.change(fleet, r.now, &r.change);
        }
        outcome
    }

    fn change(&mut self, fleet: &mut Fleet, now: f64, change: &Change) {
        match change {
            Change::Pull { frames } => {
                let mut ops: Vec<KVOpEvent> = Vec::new();
                for frame in frames {
                    ops.clear();
                    if let Some(b) = decode_batch(frame, &mut ops) {
                        fleet.apply_batch(b.instance_id, b.worker_id, b.location, &ops, now);
                    } else if let Ok(msg) = decode(frame) {
                        let _ = fleet.on_push(msg, now);
                    } else {
                        self.undecodable_frames += 1;
                    }
                }
            }
            Change::Request { heartbeat, frame } => match decode(frame) {
                Ok(msg) => {
                    let kind = if *heartbeat {
                        RouterKind::Heartbeat
                    } else {
                        RouterKind::Reply
                    };
                    let ctx = RequestContext {
                        now,
                        heartbeat_url: None,
                    };
                    let _ = fleet.on_request(kind, msg, &ctx);
                }
                Err(_) => self.undecodable_frames += 1,
            },
            Change::ExpireSyncs { timeout_s } => {
                fleet.expire_syncs(now, *timeout_s);
            }
            Change::ProbeAnswered { key, generation } => {
                fleet.probe_answered(&target(fleet, key, *generation), now);
            }
            Change::ProbeFailed {
                key,
                generation,
                timeout_s,
            } => {
                fleet.probe_failed(&target(fleet, key, *generation), now, *timeout_s);
            }
            Change::Takeover { .. } => fleet.touch_all(now),
            Change::ResyncAll => fleet.request_resync_all(),
        }
    }
}

fn target(fleet: &Fleet, key: &WorkerKey, generation: u64) -> ProbeTarget {
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
