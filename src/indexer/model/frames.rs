//! ZMQ message layouts of KV-event publishers (spec §4.1): which frame is the sequence
//! number, which the payload, and what ends a replay. Pure.
//!
//! Live: `[topic, seq (u64 BE), payload]` (vLLM, SGLang; Mooncake's topic may be empty).
//! Replay replies as a DEALER sees them: `[b"", seq, payload]` (vLLM ≤ 0.25) or
//! `[b"", topic, seq, payload]` (≥ 0.26); the end marker has seq `ff×8` and an empty payload.
//! Both are read from the end (`seq = frames[-2]`, `payload = frames[-1]`), so either layout
//! and any topic work.

use bytes::Bytes;

/// The sequence number vLLM's end-of-replay marker carries.
pub(crate) const END_SEQ: u64 = u64::MAX;

/// Why a message is not a KV-event message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameError {
    /// Fewer than two frames.
    #[error("a KV-event message needs a sequence frame and a payload frame")]
    TooFewFrames,
    /// The sequence frame is not 8 bytes.
    #[error("the sequence frame is not 8 bytes")]
    BadSeq,
}

impl FrameError {
    /// A short, stable label for metrics.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            FrameError::TooFewFrames => "too_few_frames",
            FrameError::BadSeq => "bad_seq",
        }
    }
}

/// A message's sequence number and payload.
pub(crate) fn split(frames: &[Bytes]) -> Result<(u64, Bytes), FrameError> {
    let [.., seq, payload] = frames else {
        return Err(FrameError::TooFewFrames);
    };
    let seq: [u8; 8] = seq.as_ref().try_into().map_err(|_| FrameError::BadSeq)?;
    Ok((u64::from_be_bytes(seq), payload.clone()))
}

/// One replay reply: a batch, or the end marker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ReplayReply {
    /// A replayed batch.
    Batch(u64, Bytes),
    /// The end of the replay.
    End,
}

/// Reads a replay reply in either layout.
pub(crate) fn replay_reply(frames: &[Bytes]) -> Result<ReplayReply, FrameError> {
    let (seq, payload) = split(frames)?;
    if seq == END_SEQ && payload.is_empty() {
        Ok(ReplayReply::End)
    } else {
        Ok(ReplayReply::Batch(seq, payload))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(parts: &[&[u8]]) -> Vec<Bytes> {
        parts.iter().map(|p| Bytes::copy_from_slice(p)).collect()
    }

    #[test]
    fn live_and_both_replay_layouts() {
        let seq1 = 1u64.to_be_bytes();
        assert_eq!(
            split(&f(&[b"kv@pod@m", &0u64.to_be_bytes(), b"P"])),
            Ok((0, Bytes::from_static(b"P")))
        );
        let old = f(&[b"", &seq1, b"P"]);
        let new = f(&[b"", b"kv@pod@m", &seq1, b"P"]);
        for frames in [old, new] {
            assert_eq!(
                replay_reply(&frames),
                Ok(ReplayReply::Batch(1, Bytes::from_static(b"P")))
            );
        }
        let ff = [0xffu8; 8];
        assert_eq!(replay_reply(&f(&[b"", &ff, b""])), Ok(ReplayReply::End));
        assert_eq!(
            replay_reply(&f(&[b"", b"", &ff, b""])),
            Ok(ReplayReply::End)
        );
    }

    #[test]
    fn malformed_messages_have_reasons() {
        assert_eq!(
            split(&f(&[b"x"])).map_err(|e| e.reason()),
            Err("too_few_frames")
        );
        assert_eq!(
            split(&f(&[b"t", b"123", b"P"])).map_err(|e| e.reason()),
            Err("bad_seq")
        );
    }
}
