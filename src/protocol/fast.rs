//! Allocation-free decoding of the two hot messages: `BatchedKVOperationMsg` (PULL) and
//! `BatchedP2PLookupMsg` (reply ROUTER).
//!
//! [`decode_batch`] and [`decode_lookup`] accept exactly the well-formed messages the general
//! decoder accepts (any key order, unknown keys skipped), borrow the strings from the frame and
//! put the ops or hashes into the caller's reused vector. On anything unusual — another type,
//! a duplicate or missing field, a wrong type, a JSON frame — they return `None` and the caller
//! uses [`super::decode`], which produces the precise error. So the fast paths change speed,
//! never behaviour (property tests check this).

use super::{ChunkHash, KVOpEvent, OpType};

/// The header of a batch decoded in place; its ops went into the caller's vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchView<'a> {
    /// Instance id.
    pub instance_id: &'a str,
    /// Worker id.
    pub worker_id: i64,
    /// Location (e.g. `LocalCPUBackend`).
    pub location: &'a str,
}

const TAG: &[u8] = b"BatchedKVOperationMsg";

/// Decodes `frame` if it is a well-formed `BatchedKVOperationMsg`, appending its operations to
/// `ops`; `None` otherwise (and `ops` is left as it was).
pub fn decode_batch<'a>(frame: &'a [u8], ops: &mut Vec<KVOpEvent>) -> Option<BatchView<'a>> {
    let mark = ops.len();
    let view = parse(frame, ops);
    if view.is_none() {
        ops.truncate(mark);
    }
    view
}

fn parse<'a>(frame: &'a [u8], ops: &mut Vec<KVOpEvent>) -> Option<BatchView<'a>> {
    let mut r = Reader { buf: frame, pos: 0 };
    let entries = r.map_len()?;
    let (mut tag, mut instance_id, mut worker_id, mut location, mut have_ops) =
        (false, None, None, None, false);
    for _ in 0..entries {
        match r.str()? {
            b"type" if !tag => {
                if r.str()? != TAG {
                    return None;
                }
                tag = true;
            }
            b"instance_id" if instance_id.is_none() => {
                instance_id = Some(std::str::from_utf8(r.str()?).ok()?)
            }
            b"worker_id" if worker_id.is_none() => worker_id = Some(r.int()?.as_i64()?),
            b"location" if location.is_none() => {
                location = Some(std::str::from_utf8(r.str()?).ok()?)
            }
            b"operations" if !have_ops => {
                let n = r.array_len()?;
                ops.reserve(n.min(frame.len()));
                for _ in 0..n {
                    ops.push(r.op()?);
                }
                have_ops = true;
            }
            b"type" | b"instance_id" | b"worker_id" | b"location" | b"operations" => return None,
            _ => r.skip()?,
        }
    }
    if !tag || !have_ops || r.pos != frame.len() {
        return None;
    }
    Some(BatchView {
        instance_id: instance_id?,
        worker_id: worker_id?,
        location: location?,
    })
}

/// The fields of a `BatchedP2PLookupMsg` decoded in place; its hashes went into the caller's
/// vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LookupView<'a> {
    /// The requester's instance id (its own holders are excluded).
    pub instance_id: &'a str,
    /// The requester's worker id (TP rank).
    pub worker_id: i64,
}

const LOOKUP_TAG: &[u8] = b"BatchedP2PLookupMsg";

/// Decodes `frame` if it is a well-formed `BatchedP2PLookupMsg`, replacing the contents of
/// `hashes` with its hashes; `None` otherwise (and `hashes` is then unspecified).
pub fn decode_lookup<'a>(frame: &'a [u8], hashes: &mut Vec<ChunkHash>) -> Option<LookupView<'a>> {
    hashes.clear();
    let mut r = Reader { buf: frame, pos: 0 };
    let entries = r.map_len()?;
    let (mut tag, mut instance_id, mut worker_id, mut have_hashes) = (false, None, None, false);
    for _ in 0..entries {
        match r.str()? {
            b"type" if !tag => {
                if r.str()? != LOOKUP_TAG {
                    return None;
                }
                tag = true;
            }
            b"instance_id" if instance_id.is_none() => {
                instance_id = Some(std::str::from_utf8(r.str()?).ok()?)
            }
            b"worker_id" if worker_id.is_none() => worker_id = Some(r.int()?.as_i64()?),
            b"hashes" if !have_hashes => {
                let n = r.array_len()?;
                hashes.reserve(n);
                for _ in 0..n {
                    hashes.push(r.int()?.hash());
                }
                have_hashes = true;
            }
            b"type" | b"instance_id" | b"worker_id" | b"hashes" => return None,
            _ => r.skip()?,
        }
    }
    if !tag || !have_hashes || r.pos != frame.len() {
        return None;
    }
    Some(LookupView {
        instance_id: instance_id?,
        worker_id: worker_id?,
    })
}

/// A msgpack integer as read: signed or unsigned.
#[derive(Clone, Copy)]
enum Int {
    Signed(i64),
    Unsigned(u64),
}

impl Int {
    fn as_i64(self) -> Option<i64> {
        match self {
            Int::Signed(v) => Some(v),
            Int::Unsigned(v) => i64::try_from(v).ok(),
        }
    }

    /// The chunk hash this integer is on the wire.
    fn hash(self) -> ChunkHash {
        match self {
            Int::Signed(v) => ChunkHash::from_i64(v),
            Int::Unsigned(v) => ChunkHash::from_u64(v),
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.buf.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }

    fn be(&mut self, n: usize) -> Option<u64> {
        Some(
            self.take(n)?
                .iter()
                .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)),
        )
    }

    /// The next `N` bytes as an array (integers are read with `from_be_bytes` on it: a hash
    /// is 8 of them, and a lookup or a batch carries hundreds).
    fn fixed<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn map_len(&mut self) -> Option<usize> {
        match self.byte()? {
            m @ 0x80..=0x8f => Some(usize::from(m & 0x0f)),
            0xde => self.be(2).map(|v| v as usize),
            0xdf => usize::try_from(self.be(4)?).ok(),
            _ => None,
        }
    }

    fn array_len(&mut self) -> Option<usize> {
        let n = match self.byte()? {
            m @ 0x90..=0x9f => usize::from(m & 0x0f),
            0xdc => self.be(2)? as usize,
            0xdd => usize::try_from(self.be(4)?).ok()?,
            _ => return None,
        };
        // Each element takes at least one byte.
        (n <= self.buf.len() - self.pos).then_some(n)
    }

    fn str(&mut self) -> Option<&'a [u8]> {
        let n = match self.byte()? {
            m @ 0xa0..=0xbf => usize::from(m & 0x1f),
            0xd9 => self.be(1)? as usize,
            0xda => self.be(2)? as usize,
            0xdb => usize::try_from(self.be(4)?).ok()?,
            _ => return None,
        };
        self.take(n)
    }

    fn int(&mut self) -> Option<Int> {
        let m = self.byte()?;
        Some(match m {
            0x00..=0x7f => Int::Unsigned(u64::from(m)),
            0xe0..=0xff => Int::Signed(i64::from(m as i8)),
            0xcc => Int::Unsigned(u64::from(self.byte()?)),
            0xcd => Int::Unsigned(u64::from(u16::from_be_bytes(self.fixed()?))),
            0xce => Int::Unsigned(u64::from(u32::from_be_bytes(self.fixed()?))),
            0xcf => Int::Unsigned(u64::from_be_bytes(self.fixed()?)),
            0xd0 => Int::Signed(i64::from(self.byte()? as i8)),
            0xd1 => Int::Signed(i64::from(i16::from_be_bytes(self.fixed()?))),
            0xd2 => Int::Signed(i64::from(i32::from_be_bytes(self.fixed()?))),
            0xd3 => Int::Signed(i64::from_be_bytes(self.fixed()?)),
            _ => return None,
        })
    }

    fn op(&mut self) -> Option<KVOpEvent> {
        let entries = self.map_len()?;
        let (mut op_type, mut key, mut seq_num) = (None, None, None);
        for _ in 0..entries {
            match self.str()? {
                b"op_type" if op_type.is_none() => {
                    op_type = Some(match self.str()? {
                        b"admit" => OpType::Admit,
                        b"evict" => OpType::Evict,
                        _ => return None,
                    })
                }
                b"key" if key.is_none() => key = Some(self.int()?.hash()),
                b"seq_num" if seq_num.is_none() => seq_num = Some(self.int()?.as_i64()?),
                b"op_type" | b"key" | b"seq_num" => return None,
                _ => self.skip()?,
            }
        }
        Some(KVOpEvent {
            op_type: op_type?,
            key: key?,
            seq_num: seq_num?,
        })
    }

    /// Skips one value of any type, nesting at most a few levels (deeper values make the fast
    /// path give up; the general decoder then decides).
    fn skip(&mut self) -> Option<()> {
        self.skip_at(0)
    }

    fn skip_at(&mut self, depth: usize) -> Option<()> {
        let m = self.byte()?;
        let (items, bytes) = match m {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0),
            0xa0..=0xbf => (0, usize::from(m & 0x1f)),
            0x90..=0x9f => (usize::from(m & 0x0f), 0),
            0x80..=0x8f => (2 * usize::from(m & 0x0f), 0),
            0xcc | 0xd0 => (0, 1),
            0xcd | 0xd1 => (0, 2),
            0xca | 0xce | 0xd2 => (0, 4),
            0xcb | 0xcf | 0xd3 => (0, 8),
            0xd9 | 0xc4 => (0, self.be(1)? as usize),
            0xda | 0xc5 => (0, self.be(2)? as usize),
            0xdb | 0xc6 => (0, usize::try_from(self.be(4)?).ok()?),
            0xdc => (self.be(2)? as usize, 0),
            0xde => (2 * self.be(2)? as usize, 0),
            _ => return None,
        };
        self.take(bytes)?;
        if items > 0 && (depth >= 4 || items > self.buf.len() - self.pos) {
            return None;
        }
        (0..items).try_for_each(|_| self.skip_at(depth + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{decode, encode, BatchedKVOperationMsg, BatchedP2PLookupMsg, Msg};
    use proptest::prelude::*;

    fn general(frame: &[u8]) -> Option<(String, i64, String, Vec<KVOpEvent>)> {
        match decode(frame) {
            Ok(Msg::BatchedKVOperationMsg(m)) => {
                Some((m.instance_id, m.worker_id, m.location, m.operations))
            }
            _ => None,
        }
    }

    fn fast(frame: &[u8]) -> Option<(String, i64, String, Vec<KVOpEvent>)> {
        let mut ops = vec![];
        decode_batch(frame, &mut ops)
            .map(|v| (v.instance_id.into(), v.worker_id, v.location.into(), ops))
    }

    #[test]
    fn the_golden_batches_take_the_fast_path() {
        let msg = Msg::BatchedKVOperationMsg(BatchedKVOperationMsg {
            instance_id: "i".into(),
            worker_id: 1,
            location: "LocalCPUBackend".into(),
            operations: vec![
                KVOpEvent {
                    op_type: OpType::Admit,
                    key: ChunkHash::from_i64(i64::MIN),
                    seq_num: -1,
                },
                KVOpEvent {
                    op_type: OpType::Evict,
                    key: ChunkHash::from_u64(u64::MAX),
                    seq_num: 1 << 40,
                },
            ],
        });
        let bytes = encode(&msg);
        assert!(fast(&bytes).is_some());
        assert_eq!(fast(&bytes), general(&bytes));
        assert_eq!(
            fast(b"{\"type\":\"BatchedKVOperationMsg\"}"),
            None,
            "JSON takes the general path"
        );
    }

    fn general_lookup(frame: &[u8]) -> Option<(String, i64, Vec<ChunkHash>)> {
        match decode(frame) {
            Ok(Msg::BatchedP2PLookupMsg(m)) => Some((m.instance_id, m.worker_id, m.hashes)),
            _ => None,
        }
    }

    fn fast_lookup(frame: &[u8]) -> Option<(String, i64, Vec<ChunkHash>)> {
        // A dirty scratch vector, as the reply loop reuses one.
        let mut hashes = vec![ChunkHash::from_u64(7); 3];
        decode_lookup(frame, &mut hashes).map(|v| (v.instance_id.into(), v.worker_id, hashes))
    }

    #[test]
    fn lookups_take_the_fast_path_and_other_messages_do_not() {
        let msg = Msg::BatchedP2PLookupMsg(BatchedP2PLookupMsg {
            hashes: vec![
                ChunkHash::from_i64(i64::MIN),
                ChunkHash::from_i64(-1),
                ChunkHash::from_u64(0),
                ChunkHash::from_u64(u64::MAX),
            ],
            instance_id: "asker".into(),
            worker_id: 3,
        });
        let bytes = encode(&msg);
        assert!(fast_lookup(&bytes).is_some());
        assert_eq!(fast_lookup(&bytes), general_lookup(&bytes));
        let batch = encode(&Msg::BatchedKVOperationMsg(BatchedKVOperationMsg {
            instance_id: "i".into(),
            worker_id: 1,
            location: "L".into(),
            operations: vec![],
        }));
        assert_eq!(fast_lookup(&batch), None, "another type");
        assert_eq!(fast(&bytes), None, "a lookup is not a batch");
        let json =
            br#"{"type":"BatchedP2PLookupMsg","hashes":[1],"instance_id":"a","worker_id":0}"#;
        assert_eq!(fast_lookup(json), None, "JSON takes the general path");
        assert!(general_lookup(json).is_some());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

        /// Whenever the lookup fast path accepts a frame, the general decoder decodes it to
        /// the same request.
        #[test]
        fn lookup_fast_path_agrees_with_the_general_decoder(
            hashes in proptest::collection::vec((any::<i64>(), any::<u64>(), any::<bool>()), 0..8),
            worker_id in any::<i64>(),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3),
            extra in any::<bool>(),
        ) {
            let hashes = hashes.iter().map(|(i, u, s)| {
                if *s { ChunkHash::from_i64(*i) } else { ChunkHash::from_u64(*u) }
            }).collect();
            let msg = Msg::BatchedP2PLookupMsg(BatchedP2PLookupMsg {
                hashes, instance_id: "inst".into(), worker_id,
            });
            let mut bytes = encode(&msg);
            if extra {
                bytes[0] += 1;
                bytes.extend_from_slice(&[0xa1, b'z', 0x92, 0x01, 0xc0]);
            }
            prop_assert!(fast_lookup(&bytes).is_some());
            prop_assert_eq!(fast_lookup(&bytes), general_lookup(&bytes));
            for (pos, byte) in flips {
                let at = pos % bytes.len();
                bytes[at] = byte;
            }
            if let Some(f) = fast_lookup(&bytes) {
                prop_assert_eq!(Some(f), general_lookup(&bytes));
            }
        }

        /// Whenever the fast path accepts a frame, the general decoder decodes it to the same
        /// batch: the fast path never changes what is accepted or how.
        #[test]
        fn fast_path_agrees_with_the_general_decoder(
            ops in proptest::collection::vec((any::<bool>(), any::<i64>(), any::<u64>(), any::<bool>(), any::<i64>()), 0..8),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3),
            extra in any::<bool>(),
        ) {
            let operations = ops.iter().map(|(a, i, u, s, q)| KVOpEvent {
                op_type: if *a { OpType::Admit } else { OpType::Evict },
                key: if *s { ChunkHash::from_i64(*i) } else { ChunkHash::from_u64(*u) },
                seq_num: *q,
            }).collect();
            let msg = Msg::BatchedKVOperationMsg(BatchedKVOperationMsg {
                instance_id: "inst".into(), worker_id: 2, location: "L".into(), operations,
            });
            let mut bytes = encode(&msg);
            if extra {
                // An unknown trailing key in the map (map header count + 1).
                bytes[0] += 1;
                bytes.extend_from_slice(&[0xa1, b'z', 0x92, 0x01, 0xc0]);
            }
            // Well-formed batches, with or without unknown keys, always take the fast path.
            prop_assert!(fast(&bytes).is_some());
            prop_assert_eq!(fast(&bytes), general(&bytes));
            for (pos, byte) in flips {
                let at = pos % bytes.len();
                bytes[at] = byte;
            }
            if let Some(f) = fast(&bytes) {
                prop_assert_eq!(Some(f), general(&bytes));
            }
        }
    }
}
