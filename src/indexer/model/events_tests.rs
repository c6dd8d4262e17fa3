//! Event decoding against the bytes vLLM's own classes produce (spec §4.3, made by
//! `wire_examples.py` with the real structs), SGLang's and Mooncake's layouts, and garbage.

use super::*;

/// Hex with spaces, `"…"` for a fixstr with its header: `hx("92 'ab' 07")`.
fn hx(spec: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = spec;
    while let Some(c) = rest.chars().next() {
        if c.is_whitespace() {
            rest = &rest[1..];
        } else if c == '\'' {
            let end = rest[1..].find('\'').expect("closing quote") + 1;
            let s = &rest[1..end];
            assert!(s.len() < 32);
            out.push(0xa0 | s.len() as u8);
            out.extend_from_slice(s.as_bytes());
            rest = &rest[end + 1..];
        } else {
            let n = rest
                .find(|c: char| c.is_whitespace() || c == '\'')
                .unwrap_or(rest.len());
            let tok = &rest[..n];
            assert!(tok.len().is_multiple_of(2), "odd hex {tok}");
            for i in (0..tok.len()).step_by(2) {
                out.push(u8::from_str_radix(&tok[i..i + 2], 16).expect("hex"));
            }
            rest = &rest[n..];
        }
    }
    out
}

fn stored_of(batch: &Batch) -> &Stored {
    match &batch.events[..] {
        [KvEvent::Stored(s)] => s,
        other => panic!("expected one BlockStored, got {other:?}"),
    }
}

fn the_int_event() -> Stored {
    Stored {
        hashes: vec![u64::MAX, 7],
        parent: None,
        tokens: vec![1, 2, 3, 4],
        block_size: 2,
        lora: Lora::Unspecified,
        medium: Medium::Gpu,
        ..Stored::default()
    }
}

#[test]
fn vllm_0_23_positional_block_stored() {
    let bytes = hx(
        "93 cb3ff8000000000000 91 9c 'BlockStored' 92 cfffffffffffffffff 07 c0 \
                    94 01020304 02 c0 'GPU' c0 c0 c0 c0 c0 00",
    );
    let batch = decode_batch(&bytes).expect("decodes");
    assert_eq!(batch.ts, 1.5);
    assert_eq!(batch.dp_rank, Some(0));
    assert!(batch.rejected.is_empty());
    assert_eq!(stored_of(&batch), &the_int_event());
}

#[test]
fn vllm_0_11_seven_element_block_stored() {
    let bytes = hx(
        "93 cb3ff8000000000000 91 97 'BlockStored' 92 cfffffffffffffffff 07 c0 \
                    94 01020304 02 c0 'GPU' 00",
    );
    let batch = decode_batch(&bytes).expect("decodes");
    assert_eq!(stored_of(&batch), &the_int_event());
}

#[test]
fn vllm_0_33_map16_block_stored() {
    let bytes = hx(
        "93 cb3ff8000000000000 91 de0008 'type' 'BlockStored' 'block_hashes' 92 \
                    cfffffffffffffffff 07 'parent_block_hash' c0 'token_ids' 94 01020304 \
                    'block_size' 02 'lora_id' c0 'medium' 'GPU' 'lora_name' c0 00",
    );
    let batch = decode_batch(&bytes).expect("decodes");
    assert_eq!(stored_of(&batch), &the_int_event());
    // The same event under a fixmap header (vLLM 0.25.1 / 0.26.0) and with unknown keys.
    let fixmap = hx(
        "93 cb3ff8000000000000 91 8a 'type' 'BlockStored' 'block_hashes' 92 \
                     cfffffffffffffffff 07 'parent_block_hash' c0 'token_ids' 94 01020304 \
                     'block_size' 02 'lora_id' c0 'medium' 'GPU' 'lora_name' c0 \
                     'locality' 'node-a' 'future' 92 01 02 00",
    );
    assert_eq!(
        stored_of(&decode_batch(&fixmap).expect("decodes")),
        &the_int_event()
    );
}

#[test]
fn vllm_0_33_bytes_hash_parent_lora_and_salt() {
    let mut digest = "c420".to_owned();
    digest.push_str(&"00".repeat(31));
    digest.push_str("01");
    let bytes = hx(&format!(
        "93 cb3ff8000000000000 91 de0009 'type' 'BlockStored' 'block_hashes' 91 {digest} \
         'parent_block_hash' 05 'token_ids' 92 09 0a 'block_size' 02 'lora_id' 03 \
         'medium' 'GPU' 'lora_name' 'sql' 'extra_keys' 91 92 'sql' 'tenant-salt' 01"
    ));
    let batch = decode_batch(&bytes).expect("decodes");
    assert_eq!(batch.dp_rank, Some(1));
    let s = stored_of(&batch);
    assert_eq!(s.hashes, vec![1]);
    assert_eq!(s.parent, Some(5));
    assert_eq!(s.tokens, vec![9, 10]);
    assert_eq!(s.lora, Lora::Name("sql".into()));
    assert_eq!(s.cache_salt.as_deref(), Some("tenant-salt"));
    assert!(!s.opaque_extra_keys);
}

#[test]
fn removed_and_cleared_in_both_layouts() {
    let removed = Removed {
        hashes: vec![7],
        medium: Medium::Cpu,
        group: None,
    };
    let legacy = hx("93 cb3ff8000000000000 91 94 'BlockRemoved' 91 07 'CPU' c0 00");
    let map = hx(
        "93 cb3ff8000000000000 91 83 'type' 'BlockRemoved' 'block_hashes' 91 07 \
                  'medium' 'CPU' 00",
    );
    for bytes in [legacy, map] {
        let batch = decode_batch(&bytes).expect("decodes");
        assert_eq!(batch.events, vec![KvEvent::Removed(removed.clone())]);
    }
    let legacy = hx("93 cb3ff8000000000000 91 91 'AllBlocksCleared' c0");
    let map = hx("93 cb3ff8000000000000 91 81 'type' 'AllBlocksCleared' c0");
    for bytes in [legacy, map] {
        let batch = decode_batch(&bytes).expect("decodes");
        assert_eq!(batch.events, vec![KvEvent::Cleared(Some(Medium::Gpu))]);
        assert_eq!(batch.dp_rank, None);
    }
}

#[test]
fn sglang_signed_hashes_and_cache_salt() {
    // One page, a negative int64 hash (d3), parent negative fixint, cache_salt field.
    let bytes = hx("93 cb3ff8000000000000 91 86 'type' 'BlockStored' \
                    'block_hashes' 91 d3 8000000000000000 'parent_block_hash' ff \
                    'token_ids' 92 01 02 'block_size' 02 'cache_salt' 'cust-1' 02");
    let batch = decode_batch(&bytes).expect("decodes");
    let s = stored_of(&batch);
    assert_eq!(s.hashes, vec![1u64 << 63]);
    assert_eq!(s.parent, Some(u64::MAX));
    assert_eq!(s.cache_salt.as_deref(), Some("cust-1"));
    assert_eq!(s.medium, Medium::Gpu);
    assert_eq!(batch.dp_rank, Some(2));
}

#[test]
fn mooncake_standard_events() {
    let bytes = hx("93 cf0000019000000000 92 \
        87 'event_id' 01 'event_type' 'stored' 'type' 'BlockStored' 'medium' 'cpu' \
           'seq_hashes' 91 cd0102 'block_hashes' 91 d3ffffffffffffffff 'token_ids' c0 \
        83 'event_type' 'removed' 'medium' 'disk' 'seq_hashes' 91 05 \
        00");
    let batch = decode_batch(&bytes).expect("decodes");
    assert!(batch.rejected.is_empty(), "{:?}", batch.rejected);
    let s = match &batch.events[0] {
        KvEvent::Stored(s) => s,
        e => panic!("{e:?}"),
    };
    assert!(s.standard_hashes);
    assert_eq!(s.hashes, vec![0x0102]);
    assert_eq!(s.medium, Medium::Cpu);
    assert_eq!(
        batch.events[1],
        KvEvent::Removed(Removed {
            hashes: vec![5],
            medium: Medium::Disk,
            group: None
        })
    );
}

#[test]
fn a_bad_event_does_not_block_its_siblings() {
    let bytes = hx("93 01 94 \
        92 'Mystery' 01 \
        93 'BlockRemoved' 91 'not-a-hash' 'GPU' \
        93 'BlockRemoved' 91 07 'GPU' \
        94 'BlockStored' 91 01 c0 91 91 01 \
        c0");
    let batch = decode_batch(&bytes).expect("decodes");
    assert_eq!(batch.events.len(), 1);
    let reasons: Vec<_> = batch
        .rejected
        .iter()
        .map(|(i, e)| (*i, e.reason()))
        .collect();
    assert_eq!(
        reasons,
        vec![(0, "unknown_type"), (1, "bad_field"), (3, "unsupported")]
    );
}

#[test]
fn multimodal_and_embedding_keys_make_blocks_opaque() {
    let bytes = hx("93 01 91 8b 'type' 'BlockStored' 'block_hashes' 91 07 \
        'parent_block_hash' c0 'token_ids' 92 01 02 'block_size' 02 'lora_id' c0 \
        'medium' 'GPU' 'lora_name' c0 'extra_keys' 91 91 92 'img-1' 00 'group_idx' 00 \
        'kv_cache_spec_kind' 'full_attention' 00");
    let s = stored_of(&decode_batch(&bytes).expect("decodes")).clone();
    assert!(s.opaque_extra_keys);
    assert_eq!(s.group, Some(0));
}

#[test]
fn whole_payload_errors_have_stable_reasons() {
    let cases: [(&[u8], &str); 5] = [
        (&[], "malformed"),
        (&[0x01], "not_a_batch"),
        (&[0x92, 0xa1, b'x', 0x90], "not_a_batch"),
        (&[0x92, 0x01, 0x01], "not_a_batch"),
        (&[0x92, 0x01, 0x90, 0x00], "malformed"),
    ];
    for (bytes, reason) in cases {
        let err = decode_batch(bytes).expect_err("rejected");
        assert_eq!(err.reason(), reason, "{bytes:?}: {err}");
    }
}

#[test]
fn never_panics_on_truncations_and_flips_of_real_payloads() {
    let real = hx(
        "93 cb3ff8000000000000 91 de0008 'type' 'BlockStored' 'block_hashes' 92 \
                   cfffffffffffffffff 07 'parent_block_hash' c0 'token_ids' 94 01020304 \
                   'block_size' 02 'lora_id' c0 'medium' 'GPU' 'lora_name' c0 00",
    );
    for n in 0..real.len() {
        let _ = decode_batch(&real[..n]);
    }
    for i in 0..real.len() {
        for b in [
            0x00, 0x7f, 0x80, 0x9f, 0xc0, 0xc4, 0xcf, 0xd3, 0xdc, 0xde, 0xff,
        ] {
            let mut s = real.clone();
            s[i] = b;
            let _ = decode_batch(&s);
        }
    }
}
