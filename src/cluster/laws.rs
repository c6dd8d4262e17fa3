//! The replication laws, one harness for every [`Replicated`] state (the controller's `Fleet`,
//! the coordinator's `CoordinatorState`, the indexer's `Core`): each service gives a
//! [`Subject`] — an empty state and a generator of the changes its leader logs — and
//! [`check`] runs the laws against logs drawn from it (shrunk to the smallest log that breaks
//! one). A log is the takeover record of a fresh leader (epoch [`EPOCH`]) and the generated
//! changes after it, each stamped with the leader's clock.
//!
//! 1. **Replay.** The log is the state: every record's bytes are the leader's framing of it
//!    and decode back to it, and a follower that reads the log from its start, through those
//!    bytes, on another clock, applies every record in order, is in sync at the last record
//!    and holds the leader's state (its dump). A change cut to fit a message, its parts
//!    applied in order, does what the whole does.
//! 2. **Snapshot.** At every point of the log, a follower's state dumped, encoded with its
//!    position, decoded and restored into a new process's state is the same state (the same
//!    dump), and — where the dump holds the whole state ([`Subject::whole_in_dump`]) — the
//!    rest of the log, read on from the snapshot's position, applies in order and converges
//!    on the leader's state.
//! 3. **Order.** A record already applied (a redelivery) is stale and changes nothing; a
//!    missing record is a gap, applied after but reported (not in sync); a follower whose
//!    first record is not the log's first, or is a takeover of a log that held records before
//!    (where the state carries on across epochs), is not in sync.
//! 4. **Epochs.** A new leader's takeover (a later epoch) carries the state on — or starts it
//!    over, where the state says so ([`Replicated::new_epoch`]) — and keeps the follower in
//!    sync; the deposed leader's records that come after it are fenced and change nothing;
//!    the new leader's own records apply in order.
//!
//! Service-specific tests stay beside each service's changes: that the leader's own path (a
//! request, an owner job) logs the change that replays it, and what the dump leaves out.

use super::{
    apply_record, decode_snapshot, encode_snapshot, Applied, Body, LogCursor, Record, Replicated,
    Stamp,
};
use proptest::strategy::BoxedStrategy;
use proptest::test_runner::{Config, TestRunner};
use std::fmt::Debug;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The leader's clock at its takeover (Unix seconds); record `seq` is stamped `T0 + seq`.
pub(crate) const T0: f64 = 1_700_000_000.0;

/// The epoch of the generated log; a new leader takes over at `EPOCH + 2`.
pub(crate) const EPOCH: u64 = 7;

/// A [`Replicated`] state under the laws.
pub(crate) trait Subject:
    Replicated<Change: Clone + PartialEq + Debug, Dump: PartialEq + Debug>
{
    /// A new process's state, of a configuration every generated log fits in.
    fn empty() -> Self;

    /// The changes a leader logs after its takeover record, in the order it applied them.
    fn changes() -> BoxedStrategy<Vec<Self::Change>>;

    /// What the laws compare of two states: the dump, by default. A state whose dump keeps
    /// what its replicas need not agree on compares less, and says what it leaves out.
    fn compared(&self) -> impl PartialEq + Debug + use<Self> {
        self.dump()
    }

    /// Whether the dump holds the whole state now, so that the log read on from a snapshot
    /// of it converges on the leader's (always, by default). A state whose dump leaves out
    /// soft state by design says when it holds some (the controller's full syncs in progress).
    fn whole_in_dump(&self) -> bool {
        true
    }
}

/// Runs the laws against `cases` logs drawn from [`Subject::changes`].
///
/// # Panics
/// When a law does not hold, naming the smallest log found that breaks it, or when fewer than
/// half the logs drawn moved the state (a generator of nothing).
pub(crate) fn check<S: Subject>(cases: u32) {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let moved = std::sync::atomic::AtomicU32::new(0);
    if let Err(e) = runner.run(&S::changes(), |changes| {
        obey::<S>(&changes);
        let log = written::<S>(EPOCH, "leader", T0, &changes);
        if lead::<S>(&log).compared() != lead::<S>(&log[..1]).compared() {
            moved.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }) {
        panic!("{}: a replication law does not hold: {e}", S::SERVICE);
    }
    let moved = moved.into_inner();
    assert!(
        2 * moved >= cases,
        "{}: only {moved} of {cases} logs moved the state",
        S::SERVICE
    );
}

/// Every law, on the log of `changes`.
pub(crate) fn obey<S: Subject>(changes: &[S::Change]) {
    let log = written::<S>(EPOCH, "leader", T0, changes);
    replay::<S>(&log);
    cut::<S>(&log);
    snapshot::<S>(&log);
    order::<S>(&log);
    epochs::<S>(&log, changes);
}

type Log<S> = Vec<Record<<S as Replicated>::Change>>;

/// The records of a leader of `epoch` that took over at `t0`: its takeover (fresh), then
/// `changes`, record `seq` stamped `t0 + seq`.
fn written<S: Subject>(epoch: u64, holder: &str, t0: f64, changes: &[S::Change]) -> Log<S> {
    let first = S::takeover(holder.into(), true);
    std::iter::once(first)
        .chain(changes.iter().cloned())
        .zip(1..)
        .map(|(change, seq)| record(epoch, seq, t0 + seq as f64, change))
        .collect()
}

fn record<C>(epoch: u64, seq: u64, now: f64, change: C) -> Record<C> {
    Record {
        epoch,
        seq,
        at_ms: (now * 1e3) as u64,
        now,
        change,
    }
}

/// One instant for [`T0`], so that the leader's clock maps onto instants exactly.
fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(|| Instant::now() + Duration::from_secs(3600))
}

/// The leader's stamp of `r`: applied when it was logged.
fn leader_stamp<C>(r: &Record<C>) -> Stamp {
    Stamp {
        now: r.now,
        at_ms: r.at_ms,
        local: (base() + Duration::from_secs_f64(r.now - T0), r.now),
    }
}

/// A follower's clock: an hour after the log's start, whatever the record.
fn follower_clock() -> (Instant, f64) {
    (base() + Duration::from_secs(3600), T0 + 3600.0)
}

/// The leader's state after `log`, each change applied as it was logged.
fn lead<S: Subject>(log: &[Record<S::Change>]) -> S {
    let mut s = S::empty();
    for r in log {
        s.apply(r.change.clone(), &leader_stamp(r));
    }
    s
}

/// Applies `log` through its bytes, as the core does; what each record was.
fn follow<S: Subject>(
    cursor: &mut LogCursor,
    s: &mut S,
    log: &[Record<S::Change>],
) -> Vec<Applied> {
    log.iter()
        .map(|r| {
            let read = Record::decode(&r.encode()).expect("a record decodes");
            apply_record(cursor, s, read, follower_clock())
        })
        .collect()
}

/// Law 1: the bytes are the leader's framing and decode back; a follower from the start holds
/// the leader's state.
fn replay<S: Subject>(log: &Log<S>) {
    for r in log {
        let framed = Body::encode(&r.change).frame(r.epoch, r.seq, r.at_ms, r.now);
        assert_eq!(framed.as_ref(), r.encode().as_slice(), "framing {r:?}");
        assert_eq!(&Record::decode(&framed).expect("decodes"), r, "codec");
    }
    let (mut cursor, mut s) = (LogCursor::default(), S::empty());
    let applied = follow(&mut cursor, &mut s, log);
    assert_eq!(applied[0], Applied::NewEpoch);
    assert!(
        applied[1..].iter().all(|a| *a == Applied::InOrder),
        "{applied:?}"
    );
    assert!(cursor.in_sync());
    assert_eq!(cursor.epoch_seq(), (Some(EPOCH), log.len() as u64));
    assert_eq!(
        s.compared(),
        lead::<S>(log).compared(),
        "the follower holds the leader's state"
    );
}

/// Law 1, cut: every change, its parts applied in order (cut down as far as they go), does
/// what the whole does, from the state the log had reached.
fn cut<S: Subject>(log: &Log<S>) {
    let (mut whole, mut parts) = (S::empty(), S::empty());
    for r in log {
        let at = leader_stamp(r);
        whole.apply(r.change.clone(), &at);
        let mut queue = vec![r.change.clone()];
        while let Some(c) = queue.pop() {
            match S::split(&c) {
                Some((a, b)) => {
                    queue.push(b);
                    queue.push(a);
                }
                None => parts.apply(c, &at),
            }
        }
        assert_eq!(parts.compared(), whole.compared(), "cut {:?}", r.change);
    }
}

/// Law 2: at every point, dump → bytes → restore is the same state, and the log read on from
/// the snapshot converges on the leader's state.
fn snapshot<S: Subject>(log: &Log<S>) {
    let leader = lead::<S>(log).compared();
    let (mut cursor, mut s) = (LogCursor::default(), S::empty());
    for (k, r) in log.iter().enumerate() {
        follow(&mut cursor, &mut s, std::slice::from_ref(r));
        cursor.note_stream_seq(k as u64 + 1);
        let bytes = encode_snapshot(&cursor.position(), &s.dump());
        let (position, dump) = decode_snapshot::<S::Dump>(&bytes).expect("a snapshot decodes");
        assert_eq!(position, cursor.position());
        let mut restored = S::empty().restore(dump).expect("the snapshot fits");
        assert_eq!(
            restored.compared(),
            s.compared(),
            "restored after record {}",
            r.seq
        );
        if !s.whole_in_dump() {
            continue;
        }
        let mut on = LogCursor::at(position);
        let applied = follow(&mut on, &mut restored, &log[k + 1..]);
        assert!(
            applied.iter().all(|a| *a == Applied::InOrder),
            "{applied:?}"
        );
        assert!(on.in_sync());
        assert_eq!(restored.compared(), leader, "read on from record {}", r.seq);
    }
}

/// Law 3: duplicates are stale and change nothing; a gap and a late start are reported.
fn order<S: Subject>(log: &Log<S>) {
    let (mut cursor, mut s) = (LogCursor::default(), S::empty());
    for r in log {
        follow(&mut cursor, &mut s, std::slice::from_ref(r));
        let before = s.compared();
        let again = follow(&mut cursor, &mut s, &[r.clone(), log[0].clone()]);
        assert_eq!(again, [Applied::Stale, Applied::Stale]);
        assert_eq!(s.compared(), before, "a duplicate changed the state");
    }
    assert!(cursor.in_sync());
    assert_eq!(cursor.gaps(), 0);
    if log.len() >= 3 {
        let (mut cursor, mut s) = (LogCursor::default(), S::empty());
        let mut holed = log.clone();
        holed.remove(1);
        let applied = follow(&mut cursor, &mut s, &holed);
        assert_eq!(applied[1], Applied::AfterGap);
        assert!(!cursor.in_sync());
        assert_eq!(cursor.gaps(), 1);
    }
    if log.len() >= 2 {
        let (mut cursor, mut s) = (LogCursor::default(), S::empty());
        follow(&mut cursor, &mut s, &log[1..]);
        assert!(!cursor.in_sync(), "a follower that missed the log's start");
    }
    // Nor is one whose first record is a takeover of a log that held records before, where
    // the state carries on across epochs.
    let over_older = S::takeover("later".into(), false);
    if !S::fresh(&over_older) {
        let (mut cursor, mut s) = (LogCursor::default(), S::empty());
        follow(&mut cursor, &mut s, &[record(EPOCH, 1, T0, over_older)]);
        assert!(
            !cursor.in_sync(),
            "a follower that missed the epochs before"
        );
    }
}

/// Law 4: a new leader carries the state on (or starts over), a deposed one is fenced.
fn epochs<S: Subject>(log: &Log<S>, changes: &[S::Change]) {
    let (mut cursor, mut s) = (LogCursor::default(), S::empty());
    follow(&mut cursor, &mut s, log);
    let t1 = T0 + 2.0 * log.len() as f64;
    let mut second = written::<S>(EPOCH + 2, "second", t1, changes);
    second[0].change = S::takeover("second".into(), false);
    let mut expected = lead::<S>(log);
    expected.new_epoch();
    expected.apply(second[0].change.clone(), &leader_stamp(&second[0]));
    assert_eq!(
        follow(&mut cursor, &mut s, &second[..1]),
        [Applied::NewEpoch]
    );
    assert_eq!(s.compared(), expected.compared(), "the takeover");
    assert!(cursor.in_sync(), "a takeover is no gap");
    // The deposed leader writes on after it.
    let next = log.len() as u64 + 1;
    let late: Vec<_> = changes
        .iter()
        .zip(next..)
        .map(|(c, seq)| record(EPOCH, seq, t1 + seq as f64, c.clone()))
        .collect();
    let before = s.compared();
    let fenced = follow(&mut cursor, &mut s, &late);
    assert!(fenced.iter().all(|a| *a == Applied::Fenced), "{fenced:?}");
    assert_eq!(cursor.fenced(), late.len() as u64);
    assert_eq!(s.compared(), before, "the deposed leader changed the state");
    // The new leader's own records.
    for r in &second[1..] {
        expected.apply(r.change.clone(), &leader_stamp(r));
    }
    let applied = follow(&mut cursor, &mut s, &second[1..]);
    assert!(
        applied.iter().all(|a| *a == Applied::InOrder),
        "{applied:?}"
    );
    assert!(cursor.in_sync());
    assert_eq!(cursor.gaps(), 0);
    assert_eq!(s.compared(), expected.compared(), "the new leader's state");
}
