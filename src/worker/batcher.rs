//! Admit/evict batching, as LMCache's `BatchedMessageSender` does it: one FIFO queue per
//! location, sequence numbers assigned when a batch is drained (a per-location counter from
//! 0, +1 per op), one `BatchedKVOperationMsg` per location and batch. Pure: no I/O, no clock.
//!
//! LMCache drains its whole queue into one message; here a message carries at most
//! `batch_size` ops, so a burst becomes several messages in order, never one huge frame.

use crate::protocol::{BatchedKVOperationMsg, ChunkHash, KVOpEvent, Msg, OpType};
use indexmap::IndexMap;

/// One queued operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Op {
    pub kind: OpType,
    pub location: String,
    pub key: ChunkHash,
}

#[derive(Debug, Default)]
struct Queue {
    ops: Vec<(OpType, ChunkHash)>,
    next_seq: i64,
}

/// Pending ops per location, in arrival order.
#[derive(Debug)]
pub(crate) struct Batcher {
    batch_size: usize,
    queues: IndexMap<String, Queue>,
    pending: usize,
    full: bool,
}

impl Batcher {
    /// A batcher that flushes a location at `batch_size` ops (≥ 1).
    pub(super) fn new(batch_size: usize) -> Self {
        Batcher {
            batch_size: batch_size.max(1),
            queues: IndexMap::new(),
            pending: 0,
            full: false,
        }
    }

    /// Queues `op`; returns whether some location now has a full batch waiting.
    pub(super) fn push(&mut self, op: Op) -> bool {
        let queue = match self.queues.get_mut(op.location.as_str()) {
            Some(q) => q,
            None => self.queues.entry(op.location).or_default(),
        };
        queue.ops.push((op.kind, op.key));
        self.pending += 1;
        if queue.ops.len() >= self.batch_size {
            self.full = true;
        }
        self.full
    }

    /// Ops waiting.
    pub(super) fn pending(&self) -> usize {
        self.pending
    }

    /// Takes every pending op back out, unsent (no sequence numbers consumed), each
    /// location's in FIFO order.
    pub(super) fn take_ops(&mut self) -> Vec<Op> {
        let mut out = Vec::with_capacity(self.pending);
        for (location, queue) in &mut self.queues {
            out.extend(queue.ops.drain(..).map(|(kind, key)| Op {
                kind,
                location: location.clone(),
                key,
            }));
        }
        self.pending = 0;
        self.full = false;
        out
    }

    /// Takes every pending op as messages of at most `batch_size` ops, each location's in
    /// FIFO order with consecutive sequence numbers.
    pub(super) fn drain(&mut self, instance_id: &str, worker_id: i64) -> Vec<Msg> {
        let mut out = Vec::new();
        for (location, queue) in &mut self.queues {
            if queue.ops.is_empty() {
                continue;
            }
            for chunk in queue.ops.chunks(self.batch_size) {
                let operations = chunk
                    .iter()
                    .map(|&(op_type, key)| {
                        let seq_num = queue.next_seq;
                        queue.next_seq += 1;
                        KVOpEvent {
                            op_type,
                            key,
                            seq_num,
                        }
                    })
                    .collect();
                out.push(Msg::BatchedKVOperationMsg(BatchedKVOperationMsg {
                    instance_id: instance_id.to_owned(),
                    worker_id,
                    location: location.clone(),
                    operations,
                }));
            }
            queue.ops.clear();
        }
        self.pending = 0;
        self.full = false;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(kind: OpType, location: &str, key: i64) -> Op {
        Op {
            kind,
            location: location.into(),
            key: ChunkHash::from(key),
        }
    }

    fn ops(msg: &Msg) -> (&str, Vec<(OpType, i64, i64)>) {
        match msg {
            Msg::BatchedKVOperationMsg(m) => (
                m.location.as_str(),
                m.operations
                    .iter()
                    .map(|o| {
                        let key = i64::try_from(o.key.as_i128()).expect("small");
                        (o.op_type, key, o.seq_num)
                    })
                    .collect(),
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn sequence_numbers_run_per_location_across_drains() {
        let mut b = Batcher::new(3);
        assert!(!b.push(op(OpType::Admit, "cpu", 1)));
        assert!(!b.push(op(OpType::Admit, "disk", 9)));
        assert!(!b.push(op(OpType::Evict, "cpu", 1)));
        assert!(b.push(op(OpType::Admit, "cpu", 1)), "cpu reached 3");
        assert_eq!(b.pending(), 4);
        let msgs = b.drain("i", 2);
        assert_eq!(msgs.len(), 2);
        assert_eq!(
            ops(&msgs[0]),
            (
                "cpu",
                vec![
                    (OpType::Admit, 1, 0),
                    (OpType::Evict, 1, 1),
                    (OpType::Admit, 1, 2)
                ]
            )
        );
        assert_eq!(ops(&msgs[1]), ("disk", vec![(OpType::Admit, 9, 0)]));
        assert_eq!(b.pending(), 0);

        // A burst larger than a batch is split in order; numbering continues.
        for k in 0..7 {
            b.push(op(OpType::Admit, "cpu", k));
        }
        let msgs = b.drain("i", 2);
        let seqs: Vec<Vec<i64>> = msgs
            .iter()
            .map(|m| ops(m).1.iter().map(|o| o.2).collect())
            .collect();
        assert_eq!(seqs, vec![vec![3, 4, 5], vec![6, 7, 8], vec![9]]);
    }

    #[test]
    fn ops_taken_back_consume_no_sequence_numbers() {
        let mut b = Batcher::new(50);
        b.push(op(OpType::Admit, "cpu", 1));
        b.push(op(OpType::Admit, "disk", 2));
        b.push(op(OpType::Evict, "cpu", 1));
        assert_eq!(
            b.take_ops(),
            vec![
                op(OpType::Admit, "cpu", 1),
                op(OpType::Evict, "cpu", 1),
                op(OpType::Admit, "disk", 2)
            ]
        );
        assert_eq!(b.pending(), 0);
        assert!(b.drain("i", 0).is_empty());
        b.push(op(OpType::Admit, "cpu", 2));
        assert_eq!(ops(&b.drain("i", 0)[0]).1, vec![(OpType::Admit, 2, 0)]);
    }

    #[test]
    fn messages_carry_the_identity() {
        let mut b = Batcher::new(50);
        b.push(op(OpType::Admit, "cpu", 1));
        match &b.drain("inst", 3)[0] {
            Msg::BatchedKVOperationMsg(m) => {
                assert_eq!((m.instance_id.as_str(), m.worker_id), ("inst", 3));
            }
            other => panic!("{other:?}"),
        }
    }
}
