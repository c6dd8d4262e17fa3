//! One rule every service's JSON request bodies follow before serde reads them into a struct:
//! the body is a JSON object. serde's derived structs also take a JSON array of the fields in
//! order (`[null, null]`), which no service's document allows; [`is_object`] refuses it first.
//! [`read`] also takes an integral float (`2.0`) where an integer is due, as the documents'
//! `integer` does. Knows no service and decides no status: each caller answers in its own error shape.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// Whether `bytes` starts (after JSON whitespace) with `{`: a JSON object, if it parses.
#[must_use]
pub fn is_object(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .find(|b| !matches!(b, b' ' | b'\n' | b'\r' | b'\t'))
        .is_some_and(|b| *b == b'{')
}

/// The object in `bytes` as `T`: [`is_object`], then serde, then (only after a refusal, so
/// well-formed bodies pay nothing) again with integral floats read as integers.
///
/// # Errors
/// Why it is refused, as serde says it.
pub fn read<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    if !is_object(bytes) {
        return Err("expected a JSON object".into());
    }
    serde_json::from_slice(bytes).or_else(|e| {
        integral_floats_as_integers(bytes)
            .and_then(|v| serde_json::from_value(v).ok())
            .ok_or_else(|| e.to_string())
    })
}

/// `bytes` as JSON with every integral float (`2.0`, `1e17`) that a u64 or an i64 holds
/// written as an integer;
/// `None` when it is not JSON or holds none. JSON has one number type: `2.0` is the integer
/// 2 to a JSON schema's `integer` (and to LMCache's pydantic).
#[must_use]
pub fn integral_floats_as_integers(bytes: &[u8]) -> Option<Value> {
    fn walk(v: &mut Value) -> bool {
        match v {
            Value::Number(n) if n.is_f64() => {
                let f = n.as_f64().unwrap_or(f64::NAN);
                // Every whole f64 in these ranges is exactly a u64 or an i64.
                if f.fract() != 0.0 {
                    false
                } else if (0.0..18_446_744_073_709_551_616.0).contains(&f) {
                    *v = Value::from(f as u64);
                    true
                } else if f > -9_223_372_036_854_775_808.0 && f < 0.0 {
                    // Not -2^63 itself: an integer just below i64 rounds to it.
                    *v = Value::from(f as i64);
                    true
                } else {
                    false
                }
            }
            Value::Array(items) => items.iter_mut().fold(false, |c, x| walk(x) | c),
            Value::Object(map) => map.values_mut().fold(false, |c, x| walk(x) | c),
            _ => false,
        }
    }
    let mut v: Value = serde_json::from_slice(bytes).ok()?;
    walk(&mut v).then_some(v)
}

#[cfg(test)]
mod tests {
    #[test]
    fn integral_floats_are_integers() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct B {
            n: u8,
            ids: Vec<u32>,
        }
        let b: B = super::read(br#"{"n": 3.0, "ids": [1, 2.0, 3e2]}"#).unwrap();
        assert_eq!(
            b,
            B {
                n: 3,
                ids: vec![1, 2, 300]
            }
        );
        let big: Vec<u64> = serde_json::from_value(
            super::integral_floats_as_integers(b"[5.9182063106340856e16, 1.8e19]").unwrap(),
        )
        .unwrap();
        assert_eq!(big, [59_182_063_106_340_856, 18_000_000_000_000_000_000]);
        // An integer just below i64's range is parsed as -2^63 exactly: it is not taken.
        assert!(super::read::<B>(br#"{"n": -9223372036854775809, "ids": []}"#).is_err());
        assert!(super::read::<B>(br#"{"n": 3.5, "ids": []}"#).is_err());
        assert!(super::read::<B>(br#"[3, []]"#)
            .unwrap_err()
            .contains("object"));
    }

    #[test]
    fn only_objects() {
        assert!(super::is_object(b" \n{\"a\": 1}"));
        for no in [&b"[null, null]"[..], b"null", b"", b"  ", b"1", b"\"{\""] {
            assert!(!super::is_object(no), "{no:?}");
        }
    }
}
