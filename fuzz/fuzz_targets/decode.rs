//! `decode`: any bytes through the frame decoder (msgpack, and JSON when the frame starts with
//! `{`). Besides "never panics", it checks three properties on every input:
//!
//! 1. the allocation-free batch and lookup decoders, when they accept a frame, agree with the
//!    general one (same header, same operations or hashes);
//! 2. whatever decodes re-encodes (msgpack) to bytes that decode to the same message, and
//!    encoding is then a fixed point;
//! 3. the same holds through the JSON encoding, for messages JSON can carry (no NaN or
//!    infinite floats, which JSON has no form for).
#![no_main]

use kvplane::protocol::{decode, decode_batch, decode_lookup, encode, encode_json, Msg};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let decoded = decode(data);

    let mut ops = Vec::new();
    if let Some(view) = decode_batch(data, &mut ops) {
        match &decoded {
            Ok(Msg::BatchedKVOperationMsg(m)) => {
                assert_eq!(m.instance_id, view.instance_id, "fast path: instance_id");
                assert_eq!(m.worker_id, view.worker_id, "fast path: worker_id");
                assert_eq!(m.location, view.location, "fast path: location");
                assert_eq!(m.operations, ops, "fast path: operations");
            }
            other => panic!("fast path accepted a frame the decoder gives {other:?}"),
        }
    } else {
        assert!(ops.is_empty(), "a refused frame leaves no ops behind");
    }

    let mut hashes = Vec::new();
    if let Some(view) = decode_lookup(data, &mut hashes) {
        match &decoded {
            Ok(Msg::BatchedP2PLookupMsg(m)) => {
                assert_eq!(m.instance_id, view.instance_id, "lookup fast path: instance_id");
                assert_eq!(m.worker_id, view.worker_id, "lookup fast path: worker_id");
                assert_eq!(m.hashes, hashes, "lookup fast path: hashes");
            }
            other => panic!("lookup fast path accepted a frame the decoder gives {other:?}"),
        }
    }

    let Ok(msg) = decoded else { return };
    // Debug output compares NaN floats equal to themselves, unlike `PartialEq`.
    let shown = format!("{msg:?}");

    let bytes = encode(&msg);
    let again =
        decode(&bytes).unwrap_or_else(|e| panic!("re-encoded {shown} does not decode: {e}"));
    assert_eq!(
        format!("{again:?}"),
        shown,
        "msgpack round trip changed the message"
    );
    assert_eq!(encode(&again), bytes, "encoding is not a fixed point");

    if finite(&msg) {
        let json = encode_json(&msg);
        let back = decode(json.as_bytes())
            .unwrap_or_else(|e| panic!("JSON {json} of {shown} does not decode: {e}"));
        assert_eq!(
            format!("{back:?}"),
            shown,
            "JSON round trip changed the message"
        );
    }
});

/// Whether every float of the message is finite (JSON has no NaN or infinity).
fn finite(msg: &Msg) -> bool {
    match msg {
        Msg::FullSyncStatusRetMsg(m) => m.global_progress.is_finite(),
        Msg::QueryWorkerInfoRetMsg(m) => m
            .worker_infos
            .iter()
            .all(|w| w.registration_time.is_finite() && w.last_heartbeat_time.is_finite()),
        _ => true,
    }
}
