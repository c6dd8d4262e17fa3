//! The core without NATS, over a toy state: the leader's log numbers records in order, cuts a
//! change too large for NATS, counts what it cannot send and leaves a gap for it; a follower
//! fed those bytes holds the leader's state, sees gaps, fences a deposed leader, starts a
//! new epoch empty where the state says so; a lapsed lease guard refuses.

use super::*;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// A list of words; with `empty_epochs`, every epoch starts from nothing (as the indexer's).
#[derive(Debug, Default, PartialEq)]
struct Words {
    words: Vec<String>,
    empty_epochs: bool,
    max: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum Change {
    Takeover { fresh: bool },
    Push(Vec<String>),
}

impl Replicated for Words {
    const SERVICE: &'static str = "words";
    type Change = Change;
    type Dump = Vec<String>;

    fn apply(&mut self, change: Change, _: &Stamp) {
        if let Change::Push(w) = change {
            self.words.extend(w);
        }
    }

    fn dump(&self) -> Vec<String> {
        self.words.clone()
    }

    fn restore(&self, dump: Vec<String>) -> Result<Self, String> {
        if dump.len() > self.max {
            return Err(format!("{} words, the limit is {}", dump.len(), self.max));
        }
        Ok(Words {
            words: dump,
            empty_epochs: self.empty_epochs,
            max: self.max,
        })
    }

    fn takeover(_: String, fresh: bool) -> Change {
        Change::Takeover { fresh }
    }

    fn fresh(change: &Change) -> bool {
        matches!(change, Change::Takeover { fresh: true })
    }

    fn split(change: &Change) -> Option<(Change, Change)> {
        match change {
            Change::Push(w) if w.len() > 1 => {
                let (a, b) = w.split_at(w.len() / 2);
                Some((Change::Push(a.to_vec()), Change::Push(b.to_vec())))
            }
            _ => None,
        }
    }

    fn new_epoch(&mut self) {
        if self.empty_epochs {
            self.words.clear();
        }
    }
}

fn words(n: std::ops::Range<usize>) -> Vec<String> {
    n.map(|i| format!("word-{i:04}")).collect()
}

/// The records queued in `rx`, decoded.
pub(crate) fn drain<C: serde::de::DeserializeOwned>(
    rx: &mut tokio::sync::mpsc::Receiver<Bytes>,
) -> Vec<Record<C>> {
    let mut out = Vec::new();
    while let Ok(b) = rx.try_recv() {
        out.push(Record::decode(&b).expect("a record"));
    }
    out
}

fn takeover(epoch: u64) -> Record<Change> {
    Record {
        epoch,
        seq: 1,
        at_ms: 0,
        now: 0.0,
        change: Change::Takeover { fresh: true },
    }
}

fn local() -> (Instant, f64) {
    (Instant::now(), 0.0)
}

#[test]
fn records_are_numbered_in_order_cut_to_fit_and_a_lost_one_is_a_gap() {
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let stats = Arc::new(LogStats::default());
    let log = ChangeLog::<Words>::new(3, 1, 2_000, tx, Arc::clone(&stats));
    let big = Change::Push(words(0..300));
    assert!(Body::encode(&big).len() > 2_000);
    log.record(1.5, &big);
    let cut = drain(&mut rx);
    let parts = cut.len() as u64;
    assert!(parts > 1);
    assert!(cut.iter().all(|r| r.encode().len() <= 2_000 + 40));
    assert_eq!(cut.first().map(|r| r.seq), Some(2));
    assert!(cut.windows(2).all(|w| w[1].seq == w[0].seq + 1));
    assert!(cut.iter().all(|r| r.epoch == 3 && r.now == 1.5));
    // Applied in order, the parts give the whole.
    let mut cursor = LogCursor::default();
    let mut follower = Words::default();
    assert_eq!(
        apply_record(&mut cursor, &mut follower, takeover(3), local()),
        Applied::NewEpoch
    );
    for r in cut {
        assert_eq!(
            apply_record(&mut cursor, &mut follower, r, local()),
            Applied::InOrder
        );
    }
    assert_eq!(follower.words, words(0..300));
    assert!(cursor.in_sync());
    // A change that cannot be cut takes its number and is not sent: the next one is a gap.
    log.record(0.0, &Change::Push(vec!["x".repeat(5_000)]));
    assert_eq!(stats.oversize.load(Ordering::Relaxed), 1);
    log.record(0.0, &Change::Push(words(0..1)));
    let next = drain(&mut rx);
    assert_eq!(next.len(), 1);
    assert_eq!(
        apply_record(&mut cursor, &mut follower, next[0].clone(), local()),
        Applied::AfterGap
    );
    assert!(!cursor.in_sync());
    assert_eq!(cursor.gaps(), 1);
    // A full queue drops (counted), never blocks; the queue's bytes are counted too.
    for _ in 0..70 {
        log.record(0.0, &Change::Push(words(0..1)));
    }
    assert_eq!(stats.queued.load(Ordering::Relaxed), parts + 1 + 64);
    assert_eq!(stats.dropped.load(Ordering::Relaxed), 70 - 64);
    assert!(stats.queued_bytes.load(Ordering::Relaxed) > 64 * 10);
}

#[test]
fn a_new_leader_carries_the_state_on_and_fences_the_deposed_one() {
    let mut cursor = LogCursor::default();
    let mut s = Words::default();
    let push = |epoch, seq, w: &[&str]| Record {
        epoch,
        seq,
        at_ms: seq,
        now: 0.0,
        change: Change::Push(w.iter().map(|w| (*w).to_owned()).collect()),
    };
    apply_record(&mut cursor, &mut s, takeover(5), local());
    apply_record(&mut cursor, &mut s, push(5, 2, &["a"]), local());
    assert_eq!(
        apply_record(&mut cursor, &mut s, push(5, 2, &["a"]), local()),
        Applied::Stale
    );
    let mut second = takeover(9);
    second.change = Change::Takeover { fresh: false };
    assert_eq!(
        apply_record(&mut cursor, &mut s, second, local()),
        Applied::NewEpoch
    );
    apply_record(&mut cursor, &mut s, push(9, 2, &["b"]), local());
    // The deposed leader of epoch 5 writes on: ignored.
    assert_eq!(
        apply_record(&mut cursor, &mut s, push(5, 3, &["stale"]), local()),
        Applied::Fenced
    );
    assert_eq!(s.words, ["a", "b"]);
    assert!(cursor.in_sync());
    assert_eq!((cursor.fenced(), cursor.gaps()), (1, 0));
    assert_eq!(cursor.epoch_seq(), (Some(9), 2));
    assert_eq!(cursor.last_at_ms(), 2);
    // A state whose epochs start empty starts over at a new epoch.
    let mut fresh = Words {
        empty_epochs: true,
        ..Words::default()
    };
    let mut c = LogCursor::default();
    apply_record(&mut c, &mut fresh, push(5, 1, &["old"]), local());
    apply_record(&mut c, &mut fresh, push(6, 1, &["new"]), local());
    assert_eq!(fresh.words, ["new"]);
    // A follower that starts after the log's start is not in sync.
    let mut late = LogCursor::default();
    apply_record(
        &mut late,
        &mut Words::default(),
        push(9, 7, &["x"]),
        local(),
    );
    assert!(!late.in_sync());
}

#[test]
fn a_snapshot_restores_within_the_limits_and_the_owned_state_is_taken_once() {
    let leader = Words {
        words: words(0..5),
        max: 10,
        ..Words::default()
    };
    let p = Position {
        epoch: Some(4),
        seq: 12,
        in_sync: true,
        at_ms: 0,
        stream_seq: 30,
    };
    let bytes = encode_snapshot(&p, &leader.dump());
    let (q, dump) = decode_snapshot::<Vec<String>>(&bytes).unwrap();
    assert_eq!(q, p);
    let small = Words {
        max: 3,
        ..Words::default()
    };
    assert!(small.restore(dump.clone()).is_err());
    let owned = Owned::new(Words {
        max: 10,
        ..Words::default()
    });
    let restored = owned.write(|s| s.restore(dump)).unwrap().unwrap();
    assert_eq!(restored.words, leader.words);
    assert_eq!(owned.read(|s| s.words.len()), Some(0));
    assert!(owned.take().is_some());
    assert!(owned.take().is_none());
    assert_eq!(owned.write(|s| s.words.push("late".into())), None);
}

#[test]
fn a_lapsed_lease_guard_refuses_until_renewed() {
    let lease = Lease {
        key: "k".into(),
        holder: "me".into(),
        revision: 4,
        epoch: 4,
        renewed: Instant::now(),
    };
    let guard = LeaseGuard::new(&lease, std::time::Duration::from_millis(200));
    assert!(guard.held());
    std::thread::sleep(std::time::Duration::from_millis(250));
    assert!(!guard.held());
    guard.renewed(&Lease {
        renewed: Instant::now(),
        ..lease
    });
    assert!(guard.held());
    guard.revoke();
    assert!(!guard.held());
}

/// The toy state obeys the replication laws, in both kinds of epoch.
mod laws {
    use super::{Change, Words};
    use crate::cluster::laws::{check, Subject};
    use crate::cluster::Replicated;
    use proptest::prelude::*;

    /// Words whose every epoch starts from nothing.
    #[derive(Debug)]
    struct Fresh(Words);

    fn pushes() -> BoxedStrategy<Vec<Change>> {
        prop::collection::vec(
            prop::collection::vec("[a-c]{1,3}", 0..4).prop_map(Change::Push),
            0..12,
        )
        .boxed()
    }

    impl Subject for Words {
        fn empty() -> Self {
            Words {
                max: 1_000,
                ..Words::default()
            }
        }

        fn changes() -> BoxedStrategy<Vec<Change>> {
            pushes()
        }
    }

    impl Replicated for Fresh {
        const SERVICE: &'static str = "fresh-words";
        type Change = Change;
        type Dump = Vec<String>;

        fn apply(&mut self, change: Change, at: &crate::cluster::Stamp) {
            self.0.apply(change, at);
        }

        fn dump(&self) -> Vec<String> {
            self.0.dump()
        }

        fn restore(&self, dump: Vec<String>) -> Result<Self, String> {
            self.0.restore(dump).map(Fresh)
        }

        fn takeover(holder: String, fresh: bool) -> Change {
            Words::takeover(holder, fresh)
        }

        fn fresh(change: &Change) -> bool {
            Words::fresh(change)
        }

        fn split(change: &Change) -> Option<(Change, Change)> {
            Words::split(change)
        }

        fn new_epoch(&mut self) {
            self.0.new_epoch();
        }
    }

    impl Subject for Fresh {
        fn empty() -> Self {
            Fresh(Words {
                empty_epochs: true,
                ..Words::empty()
            })
        }

        fn changes() -> BoxedStrategy<Vec<Change>> {
            pushes()
        }
    }

    #[test]
    fn the_toy_state_obeys_the_laws_carrying_its_state_on_or_starting_over() {
        check::<Words>(64);
        check::<Fresh>(64);
    }
}
