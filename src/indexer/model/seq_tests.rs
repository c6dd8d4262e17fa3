//! The sequence state machine: unit cases for each rule, and a randomized simulation of a
//! lossy, duplicating live channel with a replay ring, checking that every message is
//! applied exactly once and in order.

use super::*;

fn applied<T: Clone>(steps: &[SeqStep<T>]) -> Vec<u64> {
    steps
        .iter()
        .filter_map(|s| match s {
            SeqStep::Apply(seq, _) => Some(*seq),
            _ => None,
        })
        .collect()
}

fn no_replay() -> SeqConfig {
    SeqConfig {
        replay: false,
        ..SeqConfig::default()
    }
}

#[test]
fn in_order_live_messages_apply_and_duplicates_drop() {
    let mut t = SeqTracker::new(no_replay());
    assert!(
        t.on_connect().is_empty(),
        "no replay endpoint: nothing to ask"
    );
    for s in 0..3 {
        assert_eq!(applied(&t.on_live(s, ())), vec![s]);
    }
    assert!(t.on_live(1, ()).is_empty());
    assert_eq!(t.counters().duplicates, 1);
    assert_eq!(t.last(), Some(2));
}

#[test]
fn connect_replays_proactively_and_buffers_live_traffic() {
    let mut t = SeqTracker::new(SeqConfig::default());
    assert_eq!(t.on_connect(), vec![SeqStep::Replay(0)]);
    assert!(t.on_live(5, "L5").is_empty());
    assert!(t.on_live(6, "L6").is_empty());
    let mut got = Vec::new();
    for s in 0..=5 {
        got.extend(applied(&t.on_replay(s, "R")));
    }
    got.extend(applied(&t.on_replay_end()));
    assert_eq!(got, vec![0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(applied(&t.on_live(7, "L7")), vec![7]);
}

#[test]
fn reconnecting_to_a_restarted_publisher_clears_the_stream() {
    let mut t = SeqTracker::new(SeqConfig::default());
    t.on_connect();
    for s in 0..100 {
        t.on_replay(s, ());
    }
    assert_eq!(applied(&t.on_replay_end()).len(), 100);
    // The connection drops; the engine restarts and publishes 5 batches before we are back.
    assert_eq!(t.on_connect(), vec![SeqStep::Replay(0)]);
    for s in 0..5 {
        t.on_replay(s, ());
    }
    let steps = t.on_replay_end();
    assert_eq!(steps.first(), Some(&SeqStep::Clear));
    assert_eq!(applied(&steps), vec![0, 1, 2, 3, 4]);
    assert_eq!(t.counters().restarts, 1);
    // Reconnecting to the same publisher, which went on counting, is not a restart.
    t.on_connect();
    for s in 0..7 {
        t.on_replay(s, ());
    }
    assert_eq!(applied(&t.on_replay_end()), vec![5, 6]);
    assert_eq!(t.counters().restarts, 1);
}

#[test]
fn a_gap_replays_from_the_first_missing_number() {
    let mut t = SeqTracker::new(SeqConfig::default());
    t.on_connect();
    t.on_replay_end();
    for s in 0..4 {
        t.on_live(s, ());
    }
    assert_eq!(t.on_live(6, ()), vec![SeqStep::Replay(4)]);
    assert_eq!(t.counters().gaps, 1);
    let mut got = Vec::new();
    for s in 4..=6 {
        got.extend(applied(&t.on_replay(s, ())));
    }
    assert!(t.on_live(7, ()).is_empty(), "buffered while replaying");
    got.extend(applied(&t.on_replay_end()));
    assert_eq!(got, vec![4, 5, 6, 7]);
}

#[test]
fn a_wrapped_ring_is_counted_as_partial() {
    let mut t = SeqTracker::new(SeqConfig::default());
    t.on_connect();
    assert!(
        applied(&t.on_replay(40, ())).is_empty(),
        "applied at the end"
    );
    assert_eq!(applied(&t.on_replay_end()), vec![40]);
    assert_eq!(t.counters().partial_replays, 1);
}

#[test]
fn a_publisher_restart_clears_the_stream() {
    let mut t = SeqTracker::new(no_replay());
    for s in 0..50 {
        t.on_live(s, ());
    }
    assert_eq!(
        t.on_live(0, ()),
        vec![SeqStep::Clear, SeqStep::Apply(0, ())]
    );
    assert_eq!(t.counters().restarts, 1);
    // Far below the last number also counts, and with replay the missed start is fetched.
    let mut t = SeqTracker::new(SeqConfig::default());
    t.on_connect();
    t.on_replay_end();
    for s in 0..5000 {
        t.on_live(s, ());
    }
    assert_eq!(t.on_live(3, ()), vec![SeqStep::Clear, SeqStep::Replay(0)]);
    let mut got = Vec::new();
    for s in 0..=3 {
        got.extend(applied(&t.on_replay(s, ())));
    }
    got.extend(applied(&t.on_replay_end()));
    assert_eq!(got, vec![0, 1, 2, 3]);
}

#[test]
fn failed_replays_retry_then_clear_and_go_on_live() {
    let mut t = SeqTracker::new(SeqConfig {
        max_replay_attempts: 2,
        ..SeqConfig::default()
    });
    t.on_connect();
    t.on_live(3, ());
    assert_eq!(t.on_replay_failed(), vec![SeqStep::Replay(0)]);
    assert_eq!(
        t.on_replay_failed(),
        vec![SeqStep::Clear, SeqStep::Apply(3, ())]
    );
    assert!(!t.replaying());
    assert_eq!(t.counters().replay_failures, 2);
}

#[test]
fn the_replay_buffer_is_bounded() {
    let mut t = SeqTracker::new(SeqConfig {
        max_buffered: 2,
        ..SeqConfig::default()
    });
    t.on_connect();
    for s in 10..15 {
        t.on_live(s, ());
    }
    assert_eq!(t.counters().buffer_overflows, 3);
    // Bounded by bytes too.
    let mut t = SeqTracker::new(SeqConfig {
        max_buffered_bytes: 10,
        ..SeqConfig::default()
    });
    t.on_connect();
    t.on_live(10, "123456");
    t.on_live(11, "123456");
    assert_eq!(t.counters().buffer_overflows, 1);
    assert_eq!(applied(&t.on_replay_end()), vec![10]);
}

#[test]
fn mooncake_streams_start_at_one_and_flag_unrepaired_gaps() {
    let mut t = SeqTracker::new(SeqConfig {
        first_seq: 1,
        replay: false,
        ..SeqConfig::default()
    });
    assert_eq!(applied(&t.on_live(1, ())), vec![1]);
    assert_eq!(applied(&t.on_live(3, ())), vec![3]);
    assert_eq!(t.counters().unrepaired_gaps, 1);
}

/// A publisher with a full replay ring, a live channel that drops and duplicates, and replays
/// that complete after a random delay: every message is applied once, in order.
#[test]
fn lossy_live_channel_with_replay_applies_everything_once_in_order() {
    for seed in 1..=40u64 {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        // Failures retry (the simulation never gives up, so no Clear is expected).
        let mut t = SeqTracker::new(SeqConfig {
            max_replay_attempts: u32::MAX,
            ..SeqConfig::default()
        });
        let mut applied_seqs = Vec::new();
        let mut pending: Option<(u64, u64)> = None; // (from, live messages until it runs)
        let mut steps = t.on_connect();
        let total = 300u64;
        let mut published = 0u64;
        for _round in 0..10_000 {
            for s in steps.drain(..) {
                match s {
                    SeqStep::Apply(seq, v) => {
                        assert_eq!(seq, v);
                        applied_seqs.push(seq);
                    }
                    SeqStep::Clear => panic!("seed {seed}: no restart happened"),
                    SeqStep::Replay(from) => pending = Some((from, rnd(5))),
                }
            }
            if let Some((from, 0)) = pending {
                pending = None;
                if rnd(8) == 0 {
                    steps.extend(t.on_replay_failed());
                } else {
                    for s in from..published {
                        steps.extend(t.on_replay(s, s));
                    }
                    steps.extend(t.on_replay_end());
                }
                continue;
            }
            if let Some((_, n)) = &mut pending {
                *n -= 1;
            }
            if published == total {
                if pending.is_none() && t.last() == Some(total - 1) {
                    break;
                }
                // Nudge: a duplicate of the last message keeps the loop going.
                steps.extend(t.on_live(total - 1, total - 1));
                continue;
            }
            let seq = published;
            published += 1;
            match rnd(10) {
                0 | 1 => {} // dropped
                2 => {
                    steps.extend(t.on_live(seq, seq));
                    steps.extend(t.on_live(seq, seq)); // duplicated
                }
                _ => steps.extend(t.on_live(seq, seq)),
            }
        }
        // A tail lost with nothing after it is only found by the next message; send it.
        if t.last() != Some(total - 1) {
            steps.extend(t.on_live(total, total));
            for s in steps.drain(..) {
                if let SeqStep::Replay(from) = s {
                    for s in from..=total {
                        for st in t.on_replay(s, s) {
                            if let SeqStep::Apply(q, _) = st {
                                applied_seqs.push(q);
                            }
                        }
                    }
                    for st in t.on_replay_end() {
                        if let SeqStep::Apply(q, _) = st {
                            applied_seqs.push(q);
                        }
                    }
                } else if let SeqStep::Apply(q, _) = s {
                    applied_seqs.push(q);
                }
            }
        }
        let want: Vec<u64> = (0..applied_seqs.len() as u64).collect();
        assert_eq!(applied_seqs, want, "seed {seed}");
        assert!(applied_seqs.len() as u64 >= total, "seed {seed}");
    }
}

#[test]
fn an_overflowing_replay_goes_on_from_the_first_message_it_could_not_keep() {
    let mut t = SeqTracker::new(SeqConfig {
        max_buffered: 4,
        ..SeqConfig::default()
    });
    t.on_connect();
    t.on_replay_end();
    let mut got = applied(&t.on_live(0, ()));
    got.extend(applied(&t.on_live(1, ())));
    // A flood: 2..=4 lost, 5..=8 buffered while the gap's replay runs.
    assert_eq!(t.on_live(5, ()), vec![SeqStep::Replay(2)]);
    for s in 6..=8 {
        t.on_live(s, ());
    }
    // The replay brings 2..=8; the buffer keeps the lowest four.
    for s in 2..=8 {
        t.on_replay(s, ());
    }
    let steps = t.on_replay_end();
    assert_eq!(steps.last(), Some(&SeqStep::Replay(6)), "{steps:?}");
    got.extend(applied(&steps));
    for s in 6..=8 {
        t.on_replay(s, ());
    }
    got.extend(applied(&t.on_replay_end()));
    assert_eq!(got, (0..=8).collect::<Vec<_>>());
    assert!(!t.replaying());
    assert_eq!(t.counters().unrepaired_gaps, 0);
    // A live message lost while a replay ran leaves a hole after it: replayed as well.
    assert_eq!(t.on_live(10, ()), vec![SeqStep::Replay(9)]);
    t.on_live(12, ());
    t.on_replay(9, ());
    t.on_replay(10, ());
    let steps = t.on_replay_end();
    assert_eq!(applied(&steps), vec![9, 10]);
    assert_eq!(steps.last(), Some(&SeqStep::Replay(11)));
    t.on_replay(11, ());
    t.on_replay(12, ());
    assert_eq!(applied(&t.on_replay_end()), vec![11, 12]);
    assert_eq!(t.counters().unrepaired_gaps, 0);
}
