//! The one record envelope of every service's log, and of its snapshots.
//!
//! A record is a msgpack array `[epoch, seq, at_ms, now, change]`: the leader's epoch (the
//! revision of its lease), its number from 1 within the epoch, the leader's wall clock when it
//! logged it (ms, for the lag a follower reports), the leader's `now` when it applied it (Unix
//! seconds, the time its state machine was given) and the service's change. The leader encodes
//! a change before it takes the log's lock ([`Body`]) and only writes the header in front of
//! it once it is numbered, without copying the change. A snapshot is `[position, dump]`.
//! [`apply_record`] is where a record's place in the log decides whether it applies (pure).
//!
//! Must not: know what a change means.

use super::log::{Applied, LogCursor, Position};
use super::replicated::{Replicated, Stamp};
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// A change with its place in the log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record<C> {
    /// The leader's epoch: the revision of its lease.
    pub epoch: u64,
    /// 1, 2, … within the epoch.
    pub seq: u64,
    /// The leader's wall clock when it logged the change, ms since the Unix epoch.
    pub at_ms: u64,
    /// The leader's clock when it applied the change (Unix seconds).
    pub now: f64,
    /// The change.
    pub change: C,
}

impl<C: Serialize> Record<C> {
    /// The bytes published for this record.
    pub fn encode(&self) -> Vec<u8> {
        // Every field is a plain value: the encoder cannot fail on it.
        rmp_serde::to_vec(self).unwrap_or_default()
    }
}

impl<C: DeserializeOwned> Record<C> {
    /// A record from published bytes.
    ///
    /// # Errors
    /// When the bytes are not a record of this change type.
    pub fn decode(bytes: &[u8]) -> Result<Self, rmp_serde::decode::Error> {
        rmp_serde::from_slice(bytes)
    }
}

/// Bytes kept in front of an encoded change for its header: the array marker, three `u64`s
/// and an `f64`, at most 1 + 3 × 9 + 9.
const HEADROOM: usize = 40;

/// A change encoded behind room for its record's header.
#[derive(Debug)]
pub struct Body(Vec<u8>);

impl Body {
    /// `change`, encoded.
    pub fn encode<C: Serialize>(change: &C) -> Body {
        let mut buf = Vec::with_capacity(HEADROOM + 256);
        buf.resize(HEADROOM, 0);
        // Writing plain values into a Vec cannot fail.
        let _ = rmp_serde::encode::write(&mut buf, change);
        Body(buf)
    }

    /// The change's bytes.
    pub fn len(&self) -> usize {
        self.0.len() - HEADROOM
    }

    /// Whether the change encoded to nothing (never for a real change).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The record's bytes: the same as [`Record::encode`] of the change with this header.
    pub fn frame(self, epoch: u64, seq: u64, at_ms: u64, now: f64) -> Bytes {
        let mut head = [0u8; HEADROOM];
        let mut w = &mut head[..];
        // The header fits in HEADROOM bytes: none of these writes can fail.
        let _ = rmp::encode::write_array_len(&mut w, 5);
        let _ = rmp::encode::write_uint(&mut w, epoch);
        let _ = rmp::encode::write_uint(&mut w, seq);
        let _ = rmp::encode::write_uint(&mut w, at_ms);
        let _ = rmp::encode::write_f64(&mut w, now);
        let used = HEADROOM - w.len();
        let start = HEADROOM - used;
        let mut buf = self.0;
        buf[start..HEADROOM].copy_from_slice(&head[..used]);
        Bytes::from(buf).slice(start..)
    }
}

/// A snapshot's bytes: the follower's position and its state's dump.
pub fn encode_snapshot<D: Serialize>(position: &Position, dump: &D) -> Vec<u8> {
    rmp_serde::to_vec(&(position, dump)).unwrap_or_default()
}

/// A snapshot from its bytes.
///
/// # Errors
/// When the bytes are not a snapshot of this dump type.
pub fn decode_snapshot<D: DeserializeOwned>(
    bytes: &[u8],
) -> Result<(Position, D), rmp_serde::decode::Error> {
    rmp_serde::from_slice(bytes)
}

/// Applies `r` to `state` if its place in the log (`cursor`) says so — the next record, a new
/// epoch's first (after [`Replicated::new_epoch`]), or one after a gap — and returns what it
/// was. `local` is this process's clock now (see [`Stamp::local`]).
pub fn apply_record<S: Replicated>(
    cursor: &mut LogCursor,
    state: &mut S,
    r: Record<S::Change>,
    local: (Instant, f64),
) -> Applied {
    apply_record_with(cursor, state, r, local, |_| {})
}

/// [`apply_record`], calling `applying` with the change just before it is applied.
pub fn apply_record_with<S: Replicated>(
    cursor: &mut LogCursor,
    state: &mut S,
    r: Record<S::Change>,
    local: (Instant, f64),
    applying: impl FnOnce(&S::Change),
) -> Applied {
    let outcome = cursor.admit(r.epoch, r.seq, r.at_ms, S::fresh(&r.change));
    if outcome == Applied::NewEpoch {
        state.new_epoch();
    }
    if outcome.applies() {
        applying(&r.change);
        let at = Stamp {
            now: r.now,
            at_ms: r.at_ms,
            local,
        };
        state.apply(r.change, &at);
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_framed_body_is_the_encoded_record_and_decodes() {
        for (epoch, seq, at_ms, now) in [
            (0, 1, 0, 0.0),
            (7, 300, 1_700_000_000_123, 1.5e9),
            (u64::MAX, u64::MAX, u64::MAX, -1.0),
        ] {
            let change = ("change".to_owned(), vec![1u8, 2, 3], Some(4.5));
            let record = Record {
                epoch,
                seq,
                at_ms,
                now,
                change: change.clone(),
            };
            let framed = Body::encode(&change).frame(epoch, seq, at_ms, now);
            assert_eq!(framed.as_ref(), record.encode().as_slice());
            assert_eq!(Record::decode(&framed).unwrap(), record);
        }
        assert!(Record::<u8>::decode(b"\x01garbage").is_err());
    }

    #[test]
    fn a_snapshot_round_trips() {
        let p = Position {
            epoch: Some(3),
            seq: 9,
            in_sync: true,
            at_ms: 12,
            stream_seq: 44,
        };
        let bytes = encode_snapshot(&p, &vec!["a".to_owned()]);
        let (q, dump): (Position, Vec<String>) = decode_snapshot(&bytes).unwrap();
        assert_eq!((q, dump), (p, vec!["a".to_owned()]));
        assert!(decode_snapshot::<Vec<String>>(b"\xc1").is_err());
    }
}
