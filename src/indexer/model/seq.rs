//! Per-stream sequence tracking (spec §6): when to replay, what to buffer meanwhile, and what
//! to apply, in which order. A pure state machine: the driver feeds it live messages, replay
//! replies and replay outcomes, and carries out the [`SeqStep`]s it returns.
//!
//! Rules: a live message with the next sequence number is applied; an older one is a
//! duplicate, unless it looks like a publisher restart (back to the first number, or far
//! below), which clears the stream; a jump is a gap, which starts a replay from the first
//! missing number. A (re)connect starts a replay from the first number proactively (the
//! publisher may have restarted while we were away: if its whole history ends before the
//! last number applied, it did, and the stream is cleared). While a replay runs, replies and
//! live messages are buffered together by sequence number (bounded); when it ends they are
//! applied in order, so a late replayed store never resurrects a block a newer live event
//! removed.

use std::collections::BTreeMap;

/// How a stream's publisher numbers its messages and whether it can replay.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SeqConfig {
    /// The first sequence number (vLLM: 0; Mooncake master: 1).
    pub first_seq: u64,
    /// Whether the publisher has a replay endpoint.
    pub replay: bool,
    /// A number this far below the last one applied is a restart, not a duplicate.
    pub restart_distance: u64,
    /// Messages (replies and live ones) buffered during a replay, at most.
    pub max_buffered: usize,
    /// Their [`Weighed::weight`] (payload bytes), at most.
    pub max_buffered_bytes: usize,
    /// Failed replay attempts before the stream is cleared and restarted from live.
    pub max_replay_attempts: u32,
}

impl Default for SeqConfig {
    fn default() -> Self {
        Self {
            first_seq: 0,
            replay: true,
            restart_distance: 1024,
            max_buffered: 10_000,
            max_buffered_bytes: 256 * 1024 * 1024,
            max_replay_attempts: 3,
        }
    }
}

/// What a buffered message costs (payload bytes), for [`SeqConfig::max_buffered_bytes`].
pub(crate) trait Weighed {
    /// The cost in bytes.
    fn weight(&self) -> usize;
}

impl Weighed for bytes::Bytes {
    fn weight(&self) -> usize {
        self.len()
    }
}

impl Weighed for () {
    fn weight(&self) -> usize {
        0
    }
}

impl Weighed for &str {
    fn weight(&self) -> usize {
        self.len()
    }
}

impl Weighed for u64 {
    fn weight(&self) -> usize {
        8
    }
}

/// What the driver must do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SeqStep<T> {
    /// Apply this message's events.
    Apply(u64, T),
    /// Drop every block of the stream (publisher restart, or recovery given up).
    Clear,
    /// Ask the replay endpoint for every message from this number on.
    Replay(u64),
}

/// What the tracker counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SeqCounters {
    /// Messages applied (live or replayed).
    pub applied: u64,
    /// Duplicates dropped (replay overlap, redelivery).
    pub duplicates: u64,
    /// Gaps seen in live traffic.
    pub gaps: u64,
    /// Replays started.
    pub replays: u64,
    /// Replays that failed or timed out.
    pub replay_failures: u64,
    /// Replays whose first reply was past the number asked for (the ring had wrapped).
    pub partial_replays: u64,
    /// Publisher restarts detected.
    pub restarts: u64,
    /// Live messages dropped because the replay buffer was full.
    pub buffer_overflows: u64,
    /// Gaps that could not be repaired (no replay endpoint, or a replay that fell short).
    pub unrepaired_gaps: u64,
}

#[derive(Debug)]
struct Replay<T> {
    from: u64,
    attempts: u32,
    first_reply: bool,
    /// Started by a (re)connect: the end checks for a publisher restart.
    on_connect: bool,
    /// The highest sequence number among the replies.
    max_reply: Option<u64>,
    buffered: BTreeMap<u64, T>,
    buffered_bytes: usize,
    /// A message was evicted or refused: the publisher has more than was kept.
    overflowed: bool,
}

/// The state of one stream.
#[derive(Debug)]
pub(crate) struct SeqTracker<T> {
    config: SeqConfig,
    last: Option<u64>,
    replay: Option<Replay<T>>,
    counters: SeqCounters,
}

impl<T: Weighed> SeqTracker<T> {
    /// A stream that has seen nothing.
    pub(crate) fn new(config: SeqConfig) -> Self {
        Self {
            config,
            last: None,
            replay: None,
            counters: SeqCounters::default(),
        }
    }

    /// The last sequence number applied.
    pub(crate) fn last(&self) -> Option<u64> {
        self.last
    }

    /// True while a replay runs.
    pub(crate) fn replaying(&self) -> bool {
        self.replay.is_some()
    }

    /// What was counted.
    pub(crate) fn counters(&self) -> SeqCounters {
        self.counters
    }

    fn next_expected(&self) -> u64 {
        self.last
            .map_or(self.config.first_seq, |l| l.saturating_add(1))
    }

    fn start_replay(&mut self, out: &mut Vec<SeqStep<T>>) {
        self.start_replay_from(self.next_expected(), false, out);
    }

    fn start_replay_from(&mut self, from: u64, on_connect: bool, out: &mut Vec<SeqStep<T>>) {
        self.counters.replays += 1;
        self.replay = Some(Replay {
            from,
            attempts: 0,
            first_reply: true,
            on_connect,
            max_reply: None,
            buffered: BTreeMap::new(),
            buffered_bytes: 0,
            overflowed: false,
        });
        out.push(SeqStep::Replay(from));
    }

    /// The subscriber (re)connected: replay proactively from the first number, so that a
    /// publisher that restarted meanwhile is recognised by its shorter history.
    pub(crate) fn on_connect(&mut self) -> Vec<SeqStep<T>> {
        let mut out = Vec::new();
        if self.config.replay && self.replay.is_none() {
            self.start_replay_from(self.config.first_seq, true, &mut out);
        }
        out
    }

    fn apply(&mut self, seq: u64, item: T, out: &mut Vec<SeqStep<T>>) {
        self.last = Some(seq);
        self.counters.applied += 1;
        out.push(SeqStep::Apply(seq, item));
    }

    /// A live message arrived.
    pub(crate) fn on_live(&mut self, seq: u64, item: T) -> Vec<SeqStep<T>> {
        let mut out = Vec::new();
        if self.replay.is_some() {
            self.buffer(seq, item);
            return out;
        }
        let Some(last) = self.last else {
            // The first message of a stream without a proactive replay is the baseline.
            if self.config.replay && seq > self.config.first_seq {
                self.counters.gaps += 1;
                self.start_replay(&mut out);
                self.buffer(seq, item);
            } else {
                self.apply(seq, item, &mut out);
            }
            return out;
        };
        if seq == last.saturating_add(1) {
            self.apply(seq, item, &mut out);
        } else if seq <= last {
            let restart = seq < last
                && (seq == self.config.first_seq || last - seq > self.config.restart_distance);
            if restart {
                self.counters.restarts += 1;
                out.push(SeqStep::Clear);
                self.last = None;
                if self.config.replay && seq > self.config.first_seq {
                    self.start_replay(&mut out);
                    self.buffer(seq, item);
                } else {
                    self.apply(seq, item, &mut out);
                }
            } else {
                self.counters.duplicates += 1;
            }
        } else {
            self.counters.gaps += 1;
            if self.config.replay {
                self.start_replay(&mut out);
                self.buffer(seq, item);
            } else {
                self.counters.unrepaired_gaps += 1;
                self.apply(seq, item, &mut out);
            }
        }
        out
    }

    /// Buffers a message while a replay runs (bounded; one already there is kept). When full,
    /// the lowest numbers are kept (they are the ones the next apply needs): a lower number
    /// evicts the highest; every message evicted or refused is counted.
    fn buffer(&mut self, seq: u64, item: T) {
        if let Some(r) = &mut self.replay {
            if r.buffered.contains_key(&seq) {
                return;
            }
            let w = item.weight();
            while r.buffered.len() >= self.config.max_buffered
                || r.buffered_bytes.saturating_add(w) > self.config.max_buffered_bytes
            {
                self.counters.buffer_overflows += 1;
                r.overflowed = true;
                match r.buffered.last_key_value() {
                    Some((&top, _)) if top > seq => {
                        if let Some((_, old)) = r.buffered.pop_last() {
                            r.buffered_bytes -= old.weight();
                        }
                    }
                    _ => return,
                }
            }
            r.buffered_bytes += w;
            r.buffered.insert(seq, item);
        }
    }

    /// A replay reply arrived; it is applied when the replay ends.
    pub(crate) fn on_replay(&mut self, seq: u64, item: T) -> Vec<SeqStep<T>> {
        let Some(r) = &mut self.replay else {
            return Vec::new();
        };
        if std::mem::take(&mut r.first_reply) && seq > r.from {
            self.counters.partial_replays += 1;
        }
        r.max_reply = r.max_reply.max(Some(seq));
        self.buffer(seq, item);
        Vec::new()
    }

    /// The replay's end marker arrived: apply the replies and the live messages buffered
    /// meanwhile, in order (after a [`SeqStep::Clear`] if the publisher restarted). A hole left in
    /// them (live messages lost while the replay ran), or a buffer that overflowed, starts the
    /// next replay from the first missing number, as long as this one applied something; a
    /// hole the publisher cannot fill (its ring wrapped) is counted as unrepaired and passed
    /// over.
    pub(crate) fn on_replay_end(&mut self) -> Vec<SeqStep<T>> {
        let mut out = Vec::new();
        if let Some(r) = self.replay.take() {
            let history_ends_before_last = r.on_connect
                && self
                    .last
                    .is_some_and(|last| r.max_reply.is_none_or(|m| m < last));
            if history_ends_before_last {
                self.counters.restarts += 1;
                self.last = None;
                out.push(SeqStep::Clear);
            }
            let (progressed, rest) = self.flush_contiguous(r.buffered, &mut out);
            if rest.is_empty() && !r.overflowed {
                return out;
            }
            if self.config.replay && progressed {
                self.counters.gaps += 1;
                self.start_replay(&mut out);
                for (seq, item) in rest {
                    self.buffer(seq, item);
                }
            } else {
                self.flush(rest, &mut out);
            }
        }
        out
    }

    /// Applies the buffered messages up to the first hole; returns whether any was applied
    /// and what is left from the hole on.
    fn flush_contiguous(
        &mut self,
        buffered: BTreeMap<u64, T>,
        out: &mut Vec<SeqStep<T>>,
    ) -> (bool, BTreeMap<u64, T>) {
        let mut progressed = false;
        let mut rest = BTreeMap::new();
        for (seq, item) in buffered {
            if !rest.is_empty() {
                rest.insert(seq, item);
            } else if self.last.is_some_and(|last| seq <= last) {
                self.counters.duplicates += 1;
            } else if seq == self.next_expected() {
                progressed = true;
                self.apply(seq, item, out);
            } else {
                rest.insert(seq, item);
            }
        }
        (progressed, rest)
    }

    fn flush(&mut self, buffered: BTreeMap<u64, T>, out: &mut Vec<SeqStep<T>>) {
        for (seq, item) in buffered {
            match self.last {
                Some(last) if seq <= last => self.counters.duplicates += 1,
                Some(last) if seq > last.saturating_add(1) => {
                    self.counters.unrepaired_gaps += 1;
                    self.apply(seq, item, out);
                }
                _ => self.apply(seq, item, out),
            }
        }
    }

    /// The replay failed or timed out: retry from the first missing number, or after
    /// [`SeqConfig::max_replay_attempts`] clear the stream and go on from live traffic.
    pub(crate) fn on_replay_failed(&mut self) -> Vec<SeqStep<T>> {
        let mut out = Vec::new();
        self.counters.replay_failures += 1;
        let from = self.next_expected();
        let Some(r) = &mut self.replay else {
            return out;
        };
        r.attempts += 1;
        if r.attempts < self.config.max_replay_attempts {
            if !r.on_connect {
                r.from = from;
            }
            r.first_reply = true;
            out.push(SeqStep::Replay(r.from));
            return out;
        }
        let buffered = self.replay.take().map(|r| r.buffered).unwrap_or_default();
        self.counters.unrepaired_gaps += 1;
        out.push(SeqStep::Clear);
        self.last = None;
        self.flush(buffered, &mut out);
        out
    }
}

#[cfg(test)]
#[path = "seq_tests.rs"]
mod tests;
