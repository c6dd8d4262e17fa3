//! Where a follower is in a leader's change log, shared by the services that follow one (the
//! controller's and the coordinator's standbys and replicas): records carry the leader's
//! epoch (the revision of its lease, so a later leader always has a larger one) and a number
//! from 1 within it. A [`LogCursor`] decides what each record is — the next one, a newer
//! leader's first, one after a gap, a duplicate, or a deposed leader's (fenced) — and keeps the
//! position a snapshot stores. Pure: the caller applies the record when told to.

use serde::{Deserialize, Serialize};

/// Where a follower is in the log, as a snapshot keeps it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Position {
    /// The epoch of the last record applied.
    pub epoch: Option<u64>,
    /// The last record applied in it.
    pub seq: u64,
    /// Whether every change since a fresh start was applied.
    pub in_sync: bool,
    /// The leader's clock of that record (ms since the Unix epoch).
    pub at_ms: u64,
    /// The stream sequence of the last log message handled: the log is read on from the next.
    pub stream_seq: u64,
}

/// What a record is to the follower.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The next record: apply it.
    InOrder,
    /// The first record of a newer epoch (a takeover): apply it.
    NewEpoch,
    /// Records were missing before this one: apply it, but the state may differ from the
    /// leader's (reported until a fresh epoch).
    AfterGap,
    /// Already applied (a duplicate): skip it.
    Stale,
    /// Of an older epoch than one already seen: a deposed leader's write; skip it.
    Fenced,
}

impl Applied {
    /// Whether the record is to be applied.
    pub fn applies(self) -> bool {
        !matches!(self, Applied::Stale | Applied::Fenced)
    }
}

/// A follower's position in the log and what it has seen go wrong.
#[derive(Clone, Debug, Default)]
pub struct LogCursor {
    pos: Position,
    gaps: u64,
    fenced: u64,
}

impl LogCursor {
    /// At `p` (a snapshot's position; `Position::default()` is the log's start).
    pub fn at(p: Position) -> Self {
        Self {
            pos: p,
            ..Self::default()
        }
    }

    /// The position, for a snapshot.
    pub fn position(&self) -> Position {
        self.pos
    }

    /// Whether every change since a fresh start was applied (no record missing).
    pub fn in_sync(&self) -> bool {
        self.pos.in_sync
    }

    /// The current epoch and the last record applied in it.
    pub fn epoch_seq(&self) -> (Option<u64>, u64) {
        (self.pos.epoch, self.pos.seq)
    }

    /// The leader's clock of the last record applied (0: none).
    pub fn last_at_ms(&self) -> u64 {
        self.pos.at_ms
    }

    /// Gaps seen since start.
    pub fn gaps(&self) -> u64 {
        self.gaps
    }

    /// Records ignored because a newer epoch had been seen.
    pub fn fenced(&self) -> u64 {
        self.fenced
    }

    /// Notes the stream sequence of the log message just handled (applied or not).
    pub fn note_stream_seq(&mut self, seq: u64) {
        self.pos.stream_seq = self.pos.stream_seq.max(seq);
    }

    /// What record `(epoch, seq)`, stamped `at_ms`, is; when it [`applies`](Applied::applies)
    /// it is now the position. `fresh_takeover`: it is a new leader's takeover of an empty log
    /// (nothing came before it, so a follower starting there holds everything).
    pub fn admit(&mut self, epoch: u64, seq: u64, at_ms: u64, fresh_takeover: bool) -> Applied {
        let p = &mut self.pos;
        let outcome = match p.epoch {
            Some(e) if epoch < e => {
                self.fenced += 1;
                return Applied::Fenced;
            }
            Some(e) if epoch == e && seq <= p.seq => return Applied::Stale,
            Some(e) if epoch == e && seq == p.seq + 1 => Applied::InOrder,
            Some(e) if epoch == e => {
                self.gaps += 1;
                p.in_sync = false;
                Applied::AfterGap
            }
            _ => {
                // A newer leader, or the first record read. Its epoch must start at 1 with
                // the takeover; a fresh takeover means nothing came before it.
                let first = p.epoch.is_none();
                p.epoch = Some(epoch);
                if seq != 1 || (first && !fresh_takeover) {
                    self.gaps += 1;
                    p.in_sync = false;
                } else if fresh_takeover {
                    p.in_sync = true;
                }
                Applied::NewEpoch
            }
        };
        p.seq = seq;
        p.at_ms = at_ms;
        outcome
    }
}
