use super::*;

/// The golden vectors, read at test time (test data is not part of the crate's sources, so the
/// Docker build context does not need it).
fn vectors() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/conformance/lmcache-0.5.6-server/vectors.txt"
        );
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
    })
}
const KEY: &str = "mymodel@1@0@00000000deadbeef@bfloat16";

fn vector(name: &str) -> Vec<u8> {
    let line = vectors()
        .lines()
        .find(|l| l.split(' ').next() == Some(name))
        .unwrap_or_else(|| panic!("vector {name} missing"));
    let hex = line.split(' ').nth(1).expect("hex column");
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

fn header(name: &str) -> [u8; REQUEST_HEADER_LEN] {
    vector(name).try_into().expect("186 bytes")
}

fn meta(fmt: i32, dtype: i32, location: i32, shape: [i32; 4]) -> ObjectMeta {
    ObjectMeta {
        fmt,
        dtype,
        location,
        shape,
    }
}

#[test]
fn parses_and_reencodes_every_lmcache_request_vector() {
    let cases = [
        (
            "put",
            LmCommand::Put,
            4096,
            meta(1, 3, 0, [2, 32, 256, 1024]),
            KEY,
        ),
        ("get", LmCommand::Get, 0, meta(1, 2, 0, [0; 4]), KEY),
        ("exist", LmCommand::Exist, 0, meta(1, 2, 0, [0; 4]), KEY),
        ("list", LmCommand::List, 0, meta(0, 0, 0, [0; 4]), "x"),
        (
            "health",
            LmCommand::Health,
            0,
            meta(0, 0, 0, [0; 4]),
            "health",
        ),
        (
            "put_3d_located",
            LmCommand::Put,
            12,
            meta(4, 6, 2, [3, 2, 2, 0]),
            KEY,
        ),
    ];
    for (name, command, length, m, key) in cases {
        let raw = header(name);
        assert!(request_complete(&raw));
        assert!(!request_complete(&raw[..REQUEST_HEADER_LEN - 1]));
        let req = parse_request(&raw, 1 << 20).unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = LmRequest {
            command,
            length,
            meta: m,
            key: key.to_owned(),
        };
        assert_eq!(req, want, "{name}");
        assert_eq!(encode_request(&req).expect("encodes"), raw, "{name} bytes");
    }
    let long = parse_request(&header("put_150_byte_key"), 16).expect("150-byte key");
    assert_eq!(long.key, "m".repeat(150));
    assert_eq!(
        encode_request(&long).expect("encodes"),
        header("put_150_byte_key")
    );
}

#[test]
fn encodes_replies_byte_identical_to_lmcache() {
    let cases = [
        (
            "reply_get_hit",
            LmReply {
                code: CODE_SUCCESS,
                length: 4096,
                meta: meta(1, 3, 1, [2, 32, 256, 1024]),
            },
        ),
        ("reply_fail", LmReply::fail()),
        ("reply_success_empty", LmReply::success()),
        (
            "reply_3d",
            LmReply {
                code: CODE_SUCCESS,
                length: 12,
                meta: meta(4, 6, 2, [3, 2, 2, 0]),
            },
        ),
    ];
    for (name, reply) in cases {
        let raw = encode_reply(&reply).expect("encodes");
        assert_eq!(raw.to_vec(), vector(name), "{name}");
        assert_eq!(parse_reply(&raw), Ok(reply), "{name} round trip");
    }
}

fn with_ints(ints: [i32; 9], key: &[u8]) -> [u8; REQUEST_HEADER_LEN] {
    let mut raw = [b' '; REQUEST_HEADER_LEN];
    for (i, v) in ints.iter().enumerate() {
        raw[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    raw[36..36 + key.len()].copy_from_slice(key);
    raw
}

#[test]
fn bad_headers_are_typed_errors_with_stable_reasons() {
    let cases: [([i32; 9], &[u8], &str, bool); 8] = [
        ([0, 0, 0, 0, 0, 0, 0, 0, 0], b"k", "unknown_command", false),
        ([6, 0, 0, 0, 0, 0, 0, 0, 0], b"k", "unknown_command", false),
        ([-1, 0, 0, 0, 0, 0, 0, 0, 0], b"k", "unknown_command", false),
        ([1, -5, 0, 0, 0, 0, 0, 0, 0], b"k", "negative_length", false),
        ([1, i32::MAX, 0, 0, 0, 0, 0, 0, 0], b"k", "too_large", false),
        ([2, 10, 0, 0, 0, 0, 0, 0, 0], b"k", "unexpected_body", false),
        ([2, 0, 0, 0, 0, 0, 0, 0, 0], b"\xff\xfe", "bad_utf8", true),
        ([3, 0, 0, 0, 0, 0, 0, 0, 0], b"", "empty_key", true),
    ];
    for (ints, key, reason, intact) in cases {
        let err = parse_request(&with_ints(ints, key), 1024).expect_err(reason);
        assert_eq!(err.reason(), reason, "{err}");
        assert_eq!(err.framing_intact(), intact, "{reason}");
    }
    // A PUT exactly at the limit is fine; one byte over is not.
    assert!(parse_request(&with_ints([1, 1024, 0, 0, 0, 0, 0, 0, 0], b"k"), 1024).is_ok());
    let too_long = LmRequest {
        command: LmCommand::Get,
        length: 0,
        meta: ObjectMeta::default(),
        key: "k".repeat(151),
    };
    assert_eq!(
        encode_request(&too_long).map_err(|e| e.reason()),
        Err("key_too_long")
    );
}

#[test]
fn key_padding_is_stripped_like_python_strip() {
    let mut raw = with_ints([5, 0, 0, 0, 0, 0, 0, 0, 0], b"  abc");
    assert_eq!(parse_request(&raw, 0).expect("ok").key, "abc");
    raw[39..].fill(0);
    assert_eq!(parse_request(&raw, 0).expect("ok").key, "a");
}
