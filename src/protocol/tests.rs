//! Conformance (golden vectors made by LMCache 0.5.6 + msgspec) and edge cases.

use super::*;
use proptest::prelude::*;
use serde_json::Value;

/// The text of a golden-vector file in `tests/conformance/lmcache-0.5.6/` (in the repository;
/// see the README there for how the vectors were made). `KVPLANE_CONFORMANCE_DIR` overrides
/// the directory. Shared by every unit test that reads a vector.
pub(crate) fn conformance_file(name: &str) -> String {
    let dir = std::env::var("KVPLANE_CONFORMANCE_DIR").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/conformance/lmcache-0.5.6"
        )
        .to_owned()
    });
    let path = format!("{dir}/{name}");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("golden vectors missing at {path}: {e}"))
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn vectors() -> Vec<Value> {
    conformance_file("controller_messages.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("vector line is JSON"))
        .collect()
}

#[test]
fn every_golden_vector_decodes_to_its_value_and_re_encodes_byte_identical() {
    let vectors = vectors();
    assert!(
        vectors.len() >= 38,
        "expected the full vector set, got {}",
        vectors.len()
    );
    for v in &vectors {
        let name = v["name"].as_str().expect("name");
        let bytes = unhex(v["msgpack_hex"].as_str().expect("hex"));
        let msg = decode(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(msg.tag(), v["type"].as_str().expect("type"), "{name}: tag");
        let as_json: Value = serde_json::to_value(&msg).expect("to json");
        assert_eq!(as_json, v["value"], "{name}: decoded value");
        assert_eq!(
            encode(&msg),
            bytes,
            "{name}: re-encoded bytes differ from msgspec's"
        );
    }
}

#[test]
fn every_golden_vector_is_also_accepted_as_a_json_frame() {
    for v in vectors() {
        let name = v["name"].as_str().expect("name");
        let json = serde_json::to_vec(&v["value"]).expect("json");
        let msg = decode(&json).unwrap_or_else(|e| panic!("{name}: {e}"));
        let bytes = unhex(v["msgpack_hex"].as_str().expect("hex"));
        assert_eq!(
            encode(&msg),
            bytes,
            "{name}: JSON frame decodes to a different message"
        );
    }
}

#[test]
fn the_union_has_the_51_tags_of_the_spec_and_each_one_dispatches() {
    assert_eq!(TAGS.len(), 51);
    let mut sorted = TAGS.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 51, "duplicate tags");
    for tag in TAGS {
        // A body with no fields reaches the concrete type: either it decodes (all fields
        // have defaults) or it fails naming that type — never as an unknown tag.
        let frame = encode_map(&[("type", Value::from(*tag))]);
        match decode(&frame) {
            Ok(msg) => assert_eq!(msg.tag(), *tag),
            Err(DecodeError::Field { tag: t, .. }) => assert_eq!(t, *tag),
            Err(e) => panic!("{tag}: {e}"),
        }
    }
}

/// Encodes a JSON-described map as msgpack, keys in the given order.
fn encode_map(entries: &[(&str, Value)]) -> Vec<u8> {
    let map: serde_json::Map<String, Value> = entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    rmp_serde::to_vec_named(&map).expect("encode")
}

#[test]
fn key_order_is_free_and_unknown_keys_are_ignored() {
    let frame = encode_map(&[
        ("peer_init_url", Value::Null),
        (
            "future_field",
            serde_json::json!({"nested": [1, 2, {"x": null}]}),
        ),
        ("port", 8500.into()),
        ("ip", "127.0.0.1".into()),
        ("worker_id", 2.into()),
        ("instance_id", "i".into()),
        ("type", "RegisterMsg".into()),
    ]);
    let msg = decode(&frame).expect("decodes");
    let Msg::RegisterMsg(m) = msg else {
        panic!("wrong type")
    };
    assert_eq!(
        (m.instance_id.as_str(), m.worker_id, m.port),
        ("i", 2, 8500)
    );
    assert_eq!(m.peer_init_url, None);
}

#[test]
fn hashes_cover_the_whole_i64_and_u64_range_exactly() {
    let keys = [
        ChunkHash::from_i64(i64::MIN),
        ChunkHash::from_i64(-1),
        ChunkHash::from_u64(0),
        ChunkHash::from_u64(u64::MAX),
        ChunkHash::from_u64(1 << 63),
    ];
    let msg = Msg::from(FullSyncBatchMsg {
        instance_id: "i".into(),
        worker_id: 0,
        location: "LocalCPUBackend".into(),
        sync_id: "s".into(),
        batch_id: 0,
        keys: keys.to_vec(),
    });
    let bytes = encode(&msg);
    assert_eq!(decode(&bytes).expect("decodes"), msg);
    // u64::MAX is written as uint64, like msgspec: cf ff ff ff ff ff ff ff ff.
    assert!(bytes
        .windows(9)
        .any(|w| w == [0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]));
    let json = encode_json(&msg);
    assert_eq!(decode(json.as_bytes()).expect("json decodes"), msg);
}

#[test]
fn out_of_range_hashes_in_json_are_a_field_error() {
    let frame = br#"{"type":"BatchedP2PLookupMsg","hashes":[18446744073709551616],"instance_id":"i","worker_id":0}"#;
    assert!(matches!(
        decode(frame),
        Err(DecodeError::Field {
            tag: "BatchedP2PLookupMsg",
            ..
        })
    ));
}

#[test]
fn bad_frames_give_the_right_error() {
    assert_eq!(decode(b""), Err(DecodeError::Empty));
    assert_eq!(
        decode(&[0xc1]),
        Err(DecodeError::Malformed("reserved marker 0xc1"))
    );
    assert_eq!(decode(&[0x93, 1, 2, 3]), Err(DecodeError::NotAMap));
    assert_eq!(
        decode(&encode_map(&[("x", 1.into())])),
        Err(DecodeError::MissingTag)
    );
    assert_eq!(
        decode(&encode_map(&[("type", "NopeMsg".into())])),
        Err(DecodeError::UnknownTag("NopeMsg".into()))
    );
    let mut trailing = encode(&Msg::from(ErrorMsg { error: "x".into() }));
    trailing.push(0);
    assert!(matches!(decode(&trailing), Err(DecodeError::Malformed(_))));
    // Wrong field type names the message and the field.
    let wrong = encode_map(&[
        ("type", "HealthWorkerRetMsg".into()),
        ("error_code", "zero".into()),
    ]);
    match decode(&wrong) {
        Err(DecodeError::Field { tag, .. }) => assert_eq!(tag, "HealthWorkerRetMsg"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(decode(b"{not json"), Err(DecodeError::Json(_))));
    assert_eq!(decode(b"  {\"a\":1}"), Err(DecodeError::MissingTag));
    // "ADMIT" in upper case is rejected, as by msgspec.
    let upper = br#"{"type":"BatchedKVOperationMsg","instance_id":"i","worker_id":0,"location":"L","operations":[{"op_type":"ADMIT","key":1,"seq_num":0}]}"#;
    assert!(matches!(decode(upper), Err(DecodeError::Field { .. })));
}

#[test]
fn every_truncation_of_every_vector_is_an_error_not_a_panic() {
    for v in vectors() {
        let bytes = unhex(v["msgpack_hex"].as_str().expect("hex"));
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "{} cut at {cut}", v["name"]);
        }
    }
}

#[test]
fn absurd_lengths_and_deep_nesting_are_rejected_cheaply() {
    // A map header claiming 2^32-1 entries in a 5-byte frame.
    assert!(decode(&[0xdf, 0xff, 0xff, 0xff, 0xff]).is_err());
    // A str32 claiming 4 GiB.
    assert!(decode(&[0x81, 0xa4, b't', b'y', b'p', b'e', 0xdb, 0xff, 0xff, 0xff, 0xff]).is_err());
    let mut deep = vec![0x81, 0xa1, b'x'];
    deep.extend(std::iter::repeat_n(0x91, 10_000));
    deep.push(0xc0);
    assert_eq!(
        decode(&deep),
        Err(DecodeError::Malformed("nesting too deep"))
    );
}

/// Found by `cargo fuzz run decode` (fuzz/, input `crash-e9f99a2d…`): a float64 that
/// serde_json's default (fast, not always exact) parser read back one ULP off through the JSON
/// path. Fixed by serde_json's `float_roundtrip` feature: JSON floats now parse exactly, as
/// msgspec parses them.
#[test]
fn fuzz_regression_json_floats_round_trip_exactly() {
    let frame = unhex(concat!(
        "86a474797065b446756c6c53796e635374617475735265744d7367a773796e635f6964a873796e63",
        "2d616263ab69735f636f6d706c657465c2af676c6f62616c5f70726f6772657373cbdce000000080",
        "0000af63616e5f657869745f667265657a65c2af6d6973736992955f62617463686573920104",
    ));
    let msg = decode(&frame).expect("decodes");
    let Msg::FullSyncStatusRetMsg(m) = &msg else {
        panic!("{msg:?}")
    };
    assert_eq!(m.global_progress.to_bits(), 0xdce0_0000_0080_0000);
    let json = encode_json(&msg);
    assert_eq!(
        decode(json.as_bytes()).expect("JSON decodes"),
        msg,
        "{json}"
    );
    // The same for a range of awkward floats.
    for bits in [
        0x0000_0000_0000_0001_u64,
        0x7fef_ffff_ffff_ffff,
        0x3fb9_9999_9999_999a,
        0xdce0_0000_0080_0000,
    ] {
        let f = f64::from_bits(bits);
        let back: f64 =
            serde_json::from_str(&serde_json::to_string(&f).expect("f64")).expect("parses");
        assert_eq!(back.to_bits(), bits, "{f:e}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn decode_never_panics_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode(&bytes);
    }

    #[test]
    fn decode_never_panics_on_mutated_vectors(idx in 0usize..38, pos in any::<usize>(), byte in any::<u8>()) {
        let vectors = vectors();
        let mut bytes = unhex(vectors[idx % vectors.len()]["msgpack_hex"].as_str().expect("hex"));
        let at = pos % bytes.len();
        bytes[at] = byte;
        if let Ok(msg) = decode(&bytes) {
            // Whatever decodes re-encodes to something that decodes to the same message.
            prop_assert_eq!(decode(&encode(&msg)).expect("re-decodes"), msg);
        }
    }

    #[test]
    fn batches_round_trip(ops in proptest::collection::vec((any::<bool>(), any::<i64>(), any::<u64>(), any::<bool>(), any::<i64>()), 0..60)) {
        let operations = ops.iter().map(|(admit, i, u, signed, seq)| KVOpEvent {
            op_type: if *admit { OpType::Admit } else { OpType::Evict },
            key: if *signed { ChunkHash::from_i64(*i) } else { ChunkHash::from_u64(*u) },
            seq_num: *seq,
        }).collect();
        let msg = Msg::from(BatchedKVOperationMsg {
            instance_id: "inst".into(), worker_id: 3, location: "LocalCPUBackend".into(), operations,
        });
        prop_assert_eq!(decode(&encode(&msg)).expect("decodes"), msg.clone());
        prop_assert_eq!(decode(encode_json(&msg).as_bytes()).expect("json decodes"), msg);
    }
}

/// A registration holding both peer names (as the fuzzer's seed of ≤ 0.3.9 and later frames
/// together): what decodes re-encodes to the same message, `distributed_url` included, and
/// the encoding is a fixed point, through msgpack and JSON.
#[test]
fn a_register_msg_with_distributed_url_round_trips() {
    let frame = encode_map(&[
        ("type", Value::from("RegisterMsg")),
        ("instance_id", Value::from("vllm-0")),
        ("worker_id", Value::from(3)),
        ("ip", Value::from("vllm-0")),
        ("port", Value::from(3)),
        ("peer_init_url", Value::from("127.0.0.1:7000")),
        ("distributed_url", Value::from("127.0.0.1:7000")),
    ]);
    let msg = decode(&frame).expect("decodes");
    let shown = format!("{msg:?}");
    assert!(shown.contains("distributed_url: Some"), "{shown}");
    let bytes = encode(&msg);
    let again = decode(&bytes).expect("re-encoded decodes");
    assert_eq!(format!("{again:?}"), shown);
    assert_eq!(encode(&again), bytes, "a fixed point");
    let json = encode_json(&msg);
    assert_eq!(
        format!("{:?}", decode(json.as_bytes()).expect("JSON decodes")),
        shown
    );
    // A message without the old name does not gain it.
    let modern = encode_map(&[
        ("type", Value::from("RegisterMsg")),
        ("instance_id", Value::from("vllm-0")),
        ("worker_id", Value::from(0)),
        ("ip", Value::from("10.0.0.1")),
        ("port", Value::from(1)),
        ("peer_init_url", Value::from("10.0.0.1:7000")),
    ]);
    let bytes = encode(&decode(&modern).expect("decodes"));
    assert!(!bytes.windows(15).any(|w| w == b"distributed_url"));
}
