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

/// Where a follower is in the log, as a snapshot keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Position {
    /// The epoch of the last record applied.
    pub epoch: Option<u64>,
    /// The last record applied in it.
    pub seq: u64,
    /// Whether every change since a fresh start was applied.
    pub in_sync: bool,
    /// The leader's clock of that record.
    pub at_ms: u64,
    /// The stream sequence of the last log message applied: the log is read on from the next.
    pub stream_seq: u64,
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

/// What applying one record did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// Applied in order.
    InOrder,
    /// The first record of a newer epoch (a takeover).
    NewEpoch,
    /// Records were missing before this one: applied, but the fleet may differ from the
    /// leader's (reported until a fresh epoch).
    AfterGap,
    /// Already applied (a duplicate): ignored.
    Stale,
    /// Of an older epoch than one already seen: a deposed leader's write, ignored.
    Fenced,
}

/// Where a standby's fleet is in the log; applies [`Record`]s to it.
#[derive(Debug, Default)]
pub struct Follower {
    epoch: Option<u64>,
    last_seq: u64,
    in_sync: bool,
    last_at_ms: u64,
    gaps: u64,
    fenced: u64,
    undecodable_frames: u64,
    stream_seq: u64,
}

impl Follower {
    /// At the start of the log, before any record.
    pub fn new() -> Self {
        Self::default()
    }

    /// At a snapshot's position.
    pub fn at(p: Position) -> Self {
        Self {
            epoch: p.epoch,
            last_seq: p.seq,
            in_sync: p.in_sync,
            last_at_ms: p.at_ms,
            stream_seq: p.stream_seq,
            ..Self::default()
        }
    }

    /// Where it is, for a snapshot.
    pub fn snapshot_position(&self) -> Position {
        Position {
            epoch: self.epoch,
            seq: self.last_seq,
            in_sync: self.in_sync,
            at_ms: self.last_at_ms,
            stream_seq: self.stream_seq,
        }
    }

    /// Notes the stream sequence of the log message just handled (applied or not).
    pub fn note_stream_seq(&mut self, seq: u64) {
        self.stream_seq = self.stream_seq.max(seq);
    }

    /// Whether the fleet holds every change since a fresh start (no record missing).
    pub fn in_sync(&self) -> bool {
        self.in_sync
    }

    /// The current epoch and the last record applied in it.
    pub fn position(&self) -> (Option<u64>, u64) {
        (self.epoch, self.last_seq)
    }

    /// The leader's clock of the last record applied (ms since the Unix epoch; 0: none).
    pub fn last_at_ms(&self) -> u64 {
        self.last_at_ms
    }

    /// Gaps seen since start.
    pub fn gaps(&self) -> u64 {
        self.gaps
    }

    /// Records ignored because a newer epoch had been seen.
    pub fn fenced(&self) -> u64 {
        self.fenced
    }

    /// Frames in records that did not decode (never expected: the leader applied them).
    pub fn undecodable_frames(&self) -> u64 {
        self.undecodable_frames
    }

    /// Applies one record to `fleet` (the standby's, only ever changed through this).
    pub fn apply(&mut self, fleet: &mut Fleet, r: &Record) -> Applied {
        let outcome = match self.epoch {
            Some(e) if r.epoch < e => {
                self.fenced += 1;
                return Applied::Fenced;
            }
            Some(e) if r.epoch == e && r.seq <= self.last_seq => return Applied::Stale,
            Some(e) if r.epoch == e && r.seq == self.last_seq + 1 => Applied::InOrder,
            Some(e) if r.epoch == e => self.gap(),
            _ => {
                // A newer leader, or the first record read. Its epoch must start at 1 with
                // the takeover; a fresh takeover means nothing came before it.
                let first = self.epoch.is_none();
                self.epoch = Some(r.epoch);
                let fresh = matches!(r.change, Change::Takeover { fresh: true, .. });
                if r.seq != 1 || (first && !fresh) {
                    self.gap();
                } else if fresh {
                    self.in_sync = true;
                }
                Applied::NewEpoch
            }
        };
        self.last_seq = r.seq;
        self.last_at_ms = r.at_ms;
        self.change(fleet, r.now, &r.change);
        outcome
    }

    fn gap(&mut self) -> Applied {
        self.gaps += 1;
        self.in_sync = false;
        Applied::AfterGap
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
