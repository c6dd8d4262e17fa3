use super::*;
use crate::indexer::model::events::{
    bad, decode_batch, Envelope, EventError, KvEvent, Medium, MAX_ID_BYTES,
};
use rmp::encode::{write_array_len, write_map_len, write_nil, write_sint, write_str, write_uint};

/// One field's value in a test event map.
enum F<'a> {
    U(u64),
    I(i64),
    S(&'a str),
    Nil,
    Us(&'a [u64]),
}

fn event(fields: &[(&str, F<'_>)]) -> Vec<u8> {
    let mut b = Vec::new();
    write_map_len(&mut b, fields.len() as u32).unwrap();
    for (k, v) in fields {
        write_str(&mut b, k).unwrap();
        match v {
            F::U(u) => drop(write_uint(&mut b, *u).unwrap()),
            F::I(i) => drop(write_sint(&mut b, *i).unwrap()),
            F::S(s) => write_str(&mut b, s).unwrap(),
            F::Nil => write_nil(&mut b).unwrap(),
            F::Us(list) => {
                write_array_len(&mut b, list.len() as u32).unwrap();
                for u in *list {
                    write_uint(&mut b, *u).unwrap();
                }
            }
        }
    }
    b
}

/// `[timestamp_ms, [events], 0]`, as the master packs a batch.
fn batch(events: &[Vec<u8>]) -> Vec<u8> {
    let mut b = Vec::new();
    write_array_len(&mut b, 3).unwrap();
    write_sint(&mut b, 1_739_145_600_000).unwrap();
    write_array_len(&mut b, events.len() as u32).unwrap();
    for e in events {
        b.extend_from_slice(e);
    }
    write_uint(&mut b, 0).unwrap();
    b
}

/// A stored event with every field Mooncake's master writes (kv_event_publisher.cpp, legacy
/// and object-key fields on: 20 entries, in its order).
fn master_stored(id: u64, backend: &str, medium: &str, hash: u64) -> Vec<u8> {
    let key = hash.to_string();
    event(&[
        ("event_id", F::U(id)),
        ("timestamp", F::I(1_739_145_600_000)),
        ("event_type", F::S("stored")),
        ("type", F::S("BlockStored")),
        ("model_name", F::Nil),
        ("block_size", F::Nil),
        ("additional_salt", F::Nil),
        ("lora_name", F::Nil),
        ("tenant_id", F::S("default")),
        ("backend_id", F::S(backend)),
        ("group_id", F::Nil),
        ("medium", F::S(medium)),
        ("dp_rank", F::Nil),
        ("object_key", F::S(&key)),
        ("seq_hashes", F::Us(&[hash])),
        ("block_hashes", F::Us(&[hash])),
        ("base_block_idx", F::U(0)),
        ("parent_hash", F::Nil),
        ("token_ids", F::Nil),
        ("parent_block_hash", F::Nil),
    ])
}

#[test]
fn the_masters_stored_event_decodes_with_its_envelope() {
    let b = batch(&[master_stored(7, "pool-a", "cpu", 1 << 63)]);
    let batch = decode_batch(&b).expect("decodes");
    assert!(batch.rejected.is_empty(), "{:?}", batch.rejected);
    let KvEvent::Stored(s) = &batch.events[0] else {
        panic!("{:?}", batch.events);
    };
    assert!(s.standard_hashes);
    assert_eq!(s.hashes, vec![1 << 63]);
    assert_eq!(s.medium, Medium::Cpu);
    assert_eq!(
        batch.envelopes,
        vec![Some(Envelope {
            event_id: Some(7),
            backend_id: Some("pool-a".into()),
            tenant_id: Some("default".into()),
            base_block_idx: Some(0),
        })]
    );
}

#[test]
fn vllm_events_have_no_envelope() {
    let b = batch(&[event(&[
        ("type", F::S("BlockRemoved")),
        ("block_hashes", F::Us(&[5])),
    ])]);
    let batch = decode_batch(&b).expect("decodes");
    assert_eq!(batch.envelopes, vec![None]);
}

#[test]
fn base_block_idx_places_the_run() {
    let stored = |extra: Vec<(&'static str, F<'static>)>| {
        let mut fields = vec![
            ("event_id", F::U(1)),
            ("event_type", F::S("stored")),
            ("seq_hashes", F::Us(&[11, 12])),
            ("token_ids", F::Us(&[1, 2, 3, 4])),
            ("block_size", F::U(2)),
        ];
        fields.extend(extra);
        decode_batch(&batch(&[event(&fields)])).expect("decodes")
    };
    // A root with a parent: the depth and the parent disagree.
    let b = stored(vec![("base_block_idx", F::U(0)), ("parent_hash", F::U(9))]);
    assert_eq!(
        b.rejected[0].1,
        bad("base_block_idx", "0 (a root) with a parent_hash")
    );
    // Deeper, no parent: the tokens cannot be hashed, the rolling hashes are taken.
    let b = stored(vec![("base_block_idx", F::U(5))]);
    let KvEvent::Stored(s) = &b.events[0] else {
        panic!("{b:?}");
    };
    assert!(s.tokens.is_empty() && s.hashes == vec![11, 12] && s.parent.is_none());
    // Deeper with its parent: hashed from the tokens after the parent, as any child.
    let b = stored(vec![("base_block_idx", F::U(5)), ("parent_hash", F::U(9))]);
    let KvEvent::Stored(s) = &b.events[0] else {
        panic!("{b:?}");
    };
    assert_eq!((s.tokens.len(), s.parent), (4, Some(9)));
    // Deeper with neither a parent nor hashes: nothing to place.
    let b = decode_batch(&batch(&[event(&[
        ("event_type", F::S("stored")),
        ("base_block_idx", F::U(3)),
        ("token_ids", F::Us(&[1, 2])),
    ])]))
    .expect("decodes");
    assert_eq!(b.rejected[0].1.reason(), "bad_field");
    assert!(b.events.is_empty());
}

#[test]
fn malformed_envelope_fields_reject_only_their_event() {
    let long = "b".repeat(MAX_ID_BYTES + 1);
    let b = batch(&[
        event(&[("event_type", F::S("removed")), ("event_id", F::S("7"))]),
        event(&[("event_type", F::S("removed")), ("backend_id", F::S(&long))]),
        event(&[
            ("event_type", F::S("removed")),
            ("base_block_idx", F::I(-1)),
        ]),
        event(&[("event_type", F::S("cleared")), ("event_id", F::U(3))]),
    ]);
    let b = decode_batch(&b).expect("decodes");
    let fields: Vec<_> = b
        .rejected
        .iter()
        .map(|(i, e)| match e {
            EventError::BadField { field, .. } => (*i, *field),
            e => panic!("{e:?}"),
        })
        .collect();
    assert_eq!(
        fields,
        vec![(0, "event_id"), (1, "backend_id"), (2, "base_block_idx")]
    );
    assert_eq!(b.events, vec![KvEvent::Cleared(None)]);
    assert_eq!(b.envelopes[0].as_ref().and_then(|e| e.event_id), Some(3));
}

#[test]
fn each_backend_has_its_own_order_with_gaps_duplicates_and_restarts() {
    let mut o = EventOrder::default();
    // Two backends interleaved on one publisher, each numbering from 1.
    assert_eq!(o.place("pool-a", 1), Ordered::Apply);
    assert_eq!(o.place("pool-b", 1), Ordered::Apply);
    assert_eq!(o.place("pool-a", 2), Ordered::Apply);
    // A gap: counted, and the event still applies (there is no replay).
    assert_eq!(o.place("pool-a", 5), Ordered::Apply);
    // Going backwards: dropped.
    assert_eq!(o.place("pool-a", 4), Ordered::Drop);
    assert_eq!(o.place("pool-a", 5), Ordered::Drop);
    assert_eq!(o.place("pool-b", 2), Ordered::Apply);
    // Back at the first id: the backend restarted.
    assert_eq!(o.place("pool-a", 1), Ordered::ClearThenApply);
    let b = o.backends();
    let a = b["pool-a"];
    assert_eq!(a.last, Some(1));
    assert_eq!(
        (
            a.counters.gaps,
            a.counters.unrepaired_gaps,
            a.counters.duplicates,
            a.counters.restarts
        ),
        (1, 1, 2, 1)
    );
    assert_eq!(b["pool-b"].last, Some(2));
    assert_eq!(b["pool-b"].counters.gaps, 0);
}

#[test]
fn backends_are_bounded() {
    let mut o = EventOrder::default();
    for i in 0..MAX_BACKENDS {
        assert_eq!(o.place(&format!("b{i}"), 1), Ordered::Apply);
    }
    assert_eq!(o.place("one-too-many", 1), Ordered::Refused);
    assert_eq!(o.place("b0", 2), Ordered::Apply);
    assert_eq!(o.backends().len(), MAX_BACKENDS);
}
