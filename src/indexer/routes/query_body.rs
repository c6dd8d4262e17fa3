//! The `/query` body read in one pass: `token_ids` straight into `u32`s, every other field as a
//! JSON value. Reading the whole body as a `serde_json::Value` first made one boxed value per
//! token id and cost more than the index walk of a 2,048-token prompt.
//!
//! Only the success path is fast: a body this reader refuses (not JSON, not an object) is
//! handed back to [`api::object`], so every error is exactly the one the general path
//! gives. A `token_ids` that is not a list of u32 is kept as its first fault, reported by
//! [`QueryBody::token_ids`] with the same error as [`api::token_ids`].

use crate::indexer::api::{self, Refusal};
use crate::web::route::Documented;
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{json, Map, Value};
use std::fmt;

/// What `token_ids` held.
#[derive(Debug, PartialEq, Eq)]
enum Tokens {
    /// Absent or null.
    Missing,
    /// A list of u32.
    List(Vec<u32>),
    /// Not a list.
    NotList,
    /// A list whose element at this index is not a u32.
    OutOfRange(usize),
}

/// A parsed `/query` body.
#[derive(Debug)]
pub(crate) struct QueryBody {
    /// Every field but `token_ids`.
    pub(crate) fields: Map<String, Value>,
    tokens: Tokens,
}

impl QueryBody {
    /// Parses `bytes`; errors as [`api::object`].
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, Refusal> {
        if let Some(body) = flat::parse(bytes) {
            return Ok(body);
        }
        match serde_json::from_slice::<QueryBody>(bytes) {
            Ok(b) => Ok(b),
            Err(_) => {
                // The general reader gives the error (or, should it accept what this one
                // refused, the answer).
                let mut fields = api::object(bytes)?;
                let tokens = match fields.remove("token_ids") {
                    None | Some(Value::Null) => Tokens::Missing,
                    Some(v) => {
                        let mut one = Map::new();
                        one.insert("token_ids".into(), v);
                        match api::token_ids(&one) {
                            Ok(list) => Tokens::List(list),
                            Err(e) if e.index.is_some() => Tokens::OutOfRange(e.index.unwrap_or(0)),
                            Err(_) => Tokens::NotList,
                        }
                    }
                };
                Ok(Self { fields, tokens })
            }
        }
    }

    /// The token ids, or the error [`api::token_ids`] gives for the same field.
    pub(crate) fn token_ids(self) -> Result<Vec<u32>, Refusal> {
        let mut one = Map::new();
        match self.tokens {
            Tokens::List(list) => return Ok(list),
            Tokens::Missing => {}
            Tokens::NotList => {
                one.insert("token_ids".into(), Value::Bool(false));
            }
            Tokens::OutOfRange(i) => {
                let mut list = vec![Value::from(0u32); i];
                list.push(Value::from(-1));
                one.insert("token_ids".into(), Value::Array(list));
            }
        }
        api::token_ids(&one)
    }
}

impl Documented for QueryBody {
    fn schema() -> Value {
        let ids = json!({"type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 4294967295u64}});
        api::query_schema(("token_ids", ids))
    }
}

impl<'de> Deserialize<'de> for QueryBody {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct QueryVisitor;
        impl<'de> Visitor<'de> for QueryVisitor {
            type Value = QueryBody;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<QueryBody, A::Error> {
                let mut fields = Map::new();
                let mut tokens = Tokens::Missing;
                while let Some(key) = m.next_key::<String>()? {
                    if key == "token_ids" {
                        tokens = m.next_value::<Tokens>()?;
                    } else {
                        let v = m.next_value::<Value>()?;
                        fields.insert(key, v);
                    }
                }
                Ok(QueryBody { fields, tokens })
            }
        }
        d.deserialize_map(QueryVisitor)
    }
}

/// The byte-level reader of the common body: one flat object whose values are plain strings
/// (no escapes), non-negative integers, `true`, `false` or `null`, and whose `token_ids` is a
/// list of plain decimal u32s (or `null`). It reads the token ids with a digit loop, no
/// serde visitor per element (the serde reader below spent more time per token id than the
/// index walk spends per block).
///
/// It only ever answers what the serde reader would: anything else (an escape, a float, a
/// negative number, a nested value, an out-of-range token id, bad JSON, trailing bytes...)
/// is declined with `None`, and the body goes to the serde reader, whose errors are those of
/// [`api::object`] and [`api::token_ids`].
mod flat {
    use super::{QueryBody, Tokens};
    use serde_json::{Map, Value};

    /// Most token ids room is made for before the list is read.
    const MAX_PRESIZE: usize = 1 << 20;

    /// Digits of `u32::MAX`: a longer run of digits (no leading zeros) is out of range.
    const U32_DIGITS: usize = 10;

    struct Reader<'a> {
        b: &'a [u8],
        i: usize,
    }

    impl<'a> Reader<'a> {
        fn peek(&self) -> Option<u8> {
            self.b.get(self.i).copied()
        }

        /// Skips JSON whitespace, returns the next byte.
        fn ws(&mut self) -> Option<u8> {
            while let Some(c) = self.peek() {
                if !matches!(c, b' ' | b'\n' | b'\r' | b'\t') {
                    return Some(c);
                }
                self.i += 1;
            }
            None
        }

        fn eat(&mut self, c: u8) -> Option<()> {
            (self.ws()? == c).then(|| self.i += 1)
        }

        fn literal(&mut self, word: &[u8]) -> Option<()> {
            let end = self.i.checked_add(word.len())?;
            (self.b.get(self.i..end)? == word).then(|| self.i = end)
        }

        /// A string without escapes or control characters, valid UTF-8.
        fn string(&mut self) -> Option<&'a str> {
            self.eat(b'"')?;
            let start = self.i;
            let len = self.b[start..].iter().position(|&c| c == b'"')?;
            let raw = &self.b[start..start + len];
            if raw.iter().any(|&c| c == b'\\' || c < 0x20) {
                return None;
            }
            self.i = start + len + 1;
            std::str::from_utf8(raw).ok()
        }

        /// A non-negative integer of at most `max_digits` digits, no leading zero, not
        /// followed by a fraction or exponent.
        fn uint(&mut self, max_digits: usize) -> Option<u64> {
            let start = self.i;
            let mut n = 0u64;
            while let Some(d) = self
                .peek()
                .map(|c| c.wrapping_sub(b'0'))
                .filter(|d| *d < 10)
            {
                if self.i - start == max_digits {
                    return None;
                }
                n = n * 10 + u64::from(d);
                self.i += 1;
            }
            let digits = self.i - start;
            let clean = digits == 1 || (digits > 1 && self.b[start] != b'0');
            let after = self.peek();
            (clean && !matches!(after, Some(b'.' | b'e' | b'E'))).then_some(n)
        }

        /// A token id: a u32 without leading zeros, fraction or exponent. Up to 7 digits
        /// are read 8 bytes at a time (where 8 bytes are left): the number's length from a
        /// mask of the non-digit bytes, its value by [`eight_digits`], no branch per digit.
        fn token(&mut self) -> Option<u32> {
            let rest = &self.b[self.i..];
            if let Some(word) = rest.first_chunk::<8>() {
                let w = u64::from_le_bytes(*word);
                let len = digit_run(w);
                if (1..8).contains(&len) {
                    if (len > 1 && rest[0] == b'0') || matches!(rest[len], b'.' | b'e' | b'E') {
                        return None;
                    }
                    self.i += len;
                    return Some(digits_value(w, len));
                }
            }
            u32::try_from(self.uint(U32_DIGITS)?).ok()
        }

        /// A scalar field value.
        fn value(&mut self) -> Option<Value> {
            match self.ws()? {
                b'"' => self.string().map(|s| Value::String(s.to_owned())),
                b'0'..=b'9' => self.uint(19).map(Value::from),
                b't' => self.literal(b"true").map(|()| Value::Bool(true)),
                b'f' => self.literal(b"false").map(|()| Value::Bool(false)),
                b'n' => self.literal(b"null").map(|()| Value::Null),
                _ => None,
            }
        }

        /// `token_ids`: `null` or a list of u32.
        fn tokens(&mut self) -> Option<Tokens> {
            match self.ws()? {
                b'n' => return self.literal(b"null").map(|()| Tokens::Missing),
                b'[' => self.i += 1,
                _ => return None,
            }
            // Every element takes at least two bytes (a digit and a separator): room for
            // every id the rest of the body can hold, up to 1M ids (4 MiB) before growing.
            let mut list = Vec::with_capacity(((self.b.len() - self.i) / 2 + 1).min(MAX_PRESIZE));
            if self.ws()? == b']' {
                self.i += 1;
                return Some(Tokens::List(list));
            }
            loop {
                let (next, closed) = short_tokens(self.b, self.i, &mut list);
                self.i = next;
                if closed {
                    return Some(Tokens::List(list));
                }
                if !self.peek()?.is_ascii_digit() {
                    self.ws()?;
                }
                list.push(self.token()?);
                match self.peek() {
                    Some(b',') => self.i += 1,
                    Some(b']') => break,
                    _ => match self.ws()? {
                        b',' => self.i += 1,
                        b']' => break,
                        _ => return None,
                    },
                }
            }
            self.i += 1;
            Some(Tokens::List(list))
        }
    }

    /// The common elements of `token_ids` from `b[i..]`, one after another, each read from
    /// 8 bytes at once with no branch per digit and no call: a token id of 1 to 7 digits, no
    /// leading zero, followed right away by `,` or `]`. Returns where it stopped and whether
    /// that is just past the closing `]`; else it stopped on an element of another form
    /// (fewer than 8 bytes left, whitespace, a leading zero, a fraction, 8 digits or more,
    /// not a number...), which the caller reads with [`Reader::token`] and its checks.
    fn short_tokens(b: &[u8], mut i: usize, list: &mut Vec<u32>) -> (usize, bool) {
        while let Some(word) = b.get(i..).and_then(<[u8]>::first_chunk::<8>) {
            let w = u64::from_le_bytes(*word);
            let len = digit_run(w);
            if !(1..8).contains(&len) {
                break;
            }
            let after = (w >> (8 * len)) as u8;
            let leading_zero = len > 1 && w as u8 == b'0';
            if leading_zero || !matches!(after, b',' | b']') {
                break;
            }
            list.push(digits_value(w, len));
            i += len + 1;
            if after == b']' {
                return (i, true);
            }
        }
        (i, false)
    }

    /// How many of the 8 bytes of `w` (the first in the lowest byte) are ASCII digits before
    /// the first that is not one (8: all are).
    #[inline(always)]
    fn digit_run(w: u64) -> usize {
        const LOW7: u64 = 0x7F7F_7F7F_7F7F_7F7F;
        const TOP: u64 = 0x8080_8080_8080_8080;
        // A byte is a digit when, XORed with `0`, it is below 10: adding 0x76 to its low 7
        // bits sets its top bit from 10 on (no carry into the next byte), and a byte whose
        // top bit was set is no digit either.
        let x = w ^ ZEROS;
        let top = (((x & LOW7) + 0x7676_7676_7676_7676) | x) & TOP;
        (top.trailing_zeros() / 8) as usize
    }

    /// The value of the first `len` bytes of `w` (1 to 7 ASCII digits, the first in the
    /// lowest byte): the digit values (a digit XOR `0`) right-aligned, leading zero digits
    /// in front, what follows them shifted out.
    #[inline(always)]
    fn digits_value(w: u64, len: usize) -> u32 {
        eight_digits((w ^ ZEROS) << (8 * (8 - len)))
    }

    /// ASCII `0` in every byte.
    const ZEROS: u64 = 0x3030_3030_3030_3030;

    /// The value of 8 decimal digits, one per byte, the first in the lowest byte (Lemire's
    /// SWAR conversion: pairs, then fours, then the eight).
    #[inline(always)]
    fn eight_digits(d: u64) -> u32 {
        let d = d.wrapping_mul(10).wrapping_add(d >> 8);
        let d = (d & 0x0000_00FF_0000_00FF)
            .wrapping_mul(100 + (1_000_000 << 32))
            .wrapping_add(((d >> 16) & 0x0000_00FF_0000_00FF).wrapping_mul(1 + (10_000 << 32)));
        (d >> 32) as u32
    }

    /// The body, or `None` when it is not of the common shape (see the module docs).
    pub(super) fn parse(bytes: &[u8]) -> Option<QueryBody> {
        let mut r = Reader { b: bytes, i: 0 };
        let mut fields = Map::new();
        let mut tokens = Tokens::Missing;
        r.eat(b'{')?;
        if r.ws()? == b'}' {
            r.i += 1;
        } else {
            loop {
                let key = r.string()?;
                r.eat(b':')?;
                if key == "token_ids" {
                    tokens = r.tokens()?;
                } else {
                    let v = r.value()?;
                    fields.insert(key.to_owned(), v);
                }
                match r.ws()? {
                    b',' => r.i += 1,
                    b'}' => {
                        r.i += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        // Nothing but whitespace may follow.
        r.ws().is_none().then_some(QueryBody { fields, tokens })
    }
}

/// One element of `token_ids`: a u32, or anything else (consumed and refused).
struct Token(Option<u32>);

impl<'de> Deserialize<'de> for Token {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Token;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a token id")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Token, E> {
                Ok(Token(u32::try_from(n).ok()))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Token, E> {
                Ok(Token(u32::try_from(n).ok()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Token, E> {
                Ok(Token(api::integral(v).and_then(|n| u32::try_from(n).ok())))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Token, E> {
                Ok(Token(None))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Token, E> {
                Ok(Token(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Token, E> {
                Ok(Token(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Token, A::Error> {
                while s.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Token(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Token, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Token(None))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Tokens {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Tokens;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("token ids")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Tokens, A::Error> {
                let mut list = Vec::with_capacity(s.size_hint().unwrap_or(0).min(1 << 16));
                let mut fault = None;
                while let Some(Token(t)) = s.next_element::<Token>()? {
                    match t {
                        Some(t) if fault.is_none() => list.push(t),
                        Some(_) => {}
                        None => {
                            fault = fault.or(Some(list.len()));
                        }
                    }
                }
                Ok(fault.map_or(Tokens::List(list), Tokens::OutOfRange))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Tokens, E> {
                Ok(Tokens::Missing)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Tokens, E> {
                Ok(Tokens::NotList)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Tokens, E> {
                Ok(Tokens::NotList)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Tokens, E> {
                Ok(Tokens::NotList)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Tokens, E> {
                Ok(Tokens::NotList)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Tokens, E> {
                Ok(Tokens::NotList)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Tokens, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Tokens::NotList)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast reader and the general one agree, answer and error alike.
    #[test]
    fn agrees_with_the_general_reader() {
        let bodies = [
            r#"{"model":"m","block_size":4,"token_ids":[1,2,3,4294967295]}"#,
            r#"{"token_ids":[1,2,-3,4.5],"model":"m"}"#,
            r#"{"token_ids":[3318.0,1e3,4294967295.0],"model":"m"}"#,
            r#"{"token_ids":[4294967296.0]}"#,
            r#"{"token_ids":[1,[2],3]}"#,
            r#"{"token_ids":[1,{"a":1},3]}"#,
            r#"{"token_ids":[1,4294967296]}"#,
            r#"{"token_ids":null,"model":"m"}"#,
            r#"{"model":"m"}"#,
            r#"{"token_ids":"1,2"}"#,
            r#"{"token_ids":{"a":[1]}}"#,
            r#"{"token_ids":7}"#,
            r#"{"token_ids":[],"lora_id":3}"#,
            r#"{"token_ids":[1],"token_ids":[2,3]}"#,
            r#"[1,2]"#,
            r#"{"token_ids":[1,2"#,
            r#"not json"#,
            "",
        ];
        for b in bodies {
            assert_same(b);
        }
    }

    /// What the general reader makes of `b`: the fields but `token_ids`, and the token ids.
    fn general(b: &[u8]) -> Result<(Map<String, Value>, Vec<u32>), Refusal> {
        api::object(b).and_then(|mut m| {
            let t = api::token_ids(&m);
            m.remove("token_ids");
            t.map(|t| (m, t))
        })
    }

    /// The fast reader agrees with the general one on `b`, answer and error alike.
    fn assert_same(b: &str) {
        let fast = QueryBody::parse(b.as_bytes()).and_then(|q| {
            let fields = q.fields.clone();
            q.token_ids().map(|t| (fields, t))
        });
        assert_eq!(fast, general(b.as_bytes()), "{b}");
    }

    /// Whether the byte-level reader takes `b` itself (else the serde reader does).
    fn flat_takes(b: &str) -> bool {
        flat::parse(b.as_bytes()).is_some()
    }

    #[test]
    fn the_common_body_is_read_byte_by_byte() {
        for b in [
            r#"{"model":"bench-model","block_size":16,"token_ids":[1,2,3,65535]}"#,
            "{ \"token_ids\" : [ 0 , 4294967295 ,7\n] ,\r\n\t\"model\":\"m\" , \"lora_name\":null}  \n",
            r#"{"token_ids":[],"model":"m","block_size":4,"instance_id":"vllm-1","tenant_id":""}"#,
            r#"{"token_ids":null,"model":"m"}"#,
            r#"{"model":"m","block_size":4,"cache_salt":"s","stream":true,"x":false}"#,
            r#"{"token_ids":[1],"token_ids":[2,3],"model":"a","model":"b"}"#,
            r#"{"lora_id":9223372036854775807,"block_size":18446744073709551,"token_ids":[0]}"#,
            r#"{"modèle":"é€😀","token_ids":[5]}"#,
            r#"{}"#,
        ] {
            assert!(flat_takes(b), "{b}");
            assert_same(b);
        }
    }

    /// Everything outside the common shape goes to the serde reader, and the answer (or the
    /// 400 naming the field and index) is the general reader's.
    #[test]
    fn anything_else_is_declined_and_answered_as_before() {
        for b in [
            // token ids out of range, negative, fractional, exponents, leading zeros
            r#"{"model":"m","token_ids":[1,4294967296]}"#,
            r#"{"model":"m","token_ids":[1,99999999999999999999999]}"#,
            r#"{"model":"m","token_ids":[1,2,-3]}"#,
            r#"{"model":"m","token_ids":[-0]}"#,
            r#"{"model":"m","token_ids":[1,2.0]}"#,
            r#"{"model":"m","token_ids":[1e3]}"#,
            r#"{"model":"m","token_ids":[1E3]}"#,
            r#"{"model":"m","token_ids":[01]}"#,
            r#"{"model":"m","token_ids":[00]}"#,
            // not a list of numbers
            r#"{"token_ids":["1"]}"#,
            r#"{"token_ids":[null]}"#,
            r#"{"token_ids":[true]}"#,
            r#"{"token_ids":[[1]]}"#,
            r#"{"token_ids":"1,2"}"#,
            r#"{"token_ids":{"a":1}}"#,
            r#"{"token_ids":12}"#,
            r#"{"token_ids":true}"#,
            // broken lists
            r#"{"token_ids":[1,]}"#,
            r#"{"token_ids":[,1]}"#,
            r#"{"token_ids":[1 2]}"#,
            r#"{"token_ids":[1,,2]}"#,
            r#"{"token_ids":[1"#,
            r#"{"token_ids":[1,"#,
            r#"{"token_ids":["#,
            r#"{"token_ids":[1]"#,
            r#"{"token_ids":[1x]}"#,
            r#"{"token_ids":nul}"#,
            r#"{"token_ids":nullx}"#,
            // other fields the byte reader leaves to serde: escapes, negatives, floats,
            // nested values, huge integers, bad literals
            r#"{"model":"m\u00e9","token_ids":[1]}"#,
            r#"{"mo\"del":"m","token_ids":[1]}"#,
            r#"{"lora_id":-1,"token_ids":[1]}"#,
            r#"{"block_size":1.5,"token_ids":[1]}"#,
            r#"{"block_size":1e1,"token_ids":[1]}"#,
            r#"{"block_size":18446744073709551615,"token_ids":[1]}"#,
            r#"{"block_size":99999999999999999999999,"token_ids":[1]}"#,
            r#"{"block_size":016,"token_ids":[1]}"#,
            r#"{"extra":{"a":[1]},"token_ids":[1]}"#,
            r#"{"extra":[1,2],"token_ids":[1]}"#,
            r#"{"stream":tru,"token_ids":[1]}"#,
            r#"{"stream":truex,"token_ids":[1]}"#,
            r#"{"stream":True,"token_ids":[1]}"#,
            "{\"model\":\"a\tb\",\"token_ids\":[1]}",
            // not one object
            r#"{"token_ids":[1]} x"#,
            r#"{"token_ids":[1]}{}"#,
            r#"{"token_ids":[1],}"#,
            r#"{"token_ids":[1] "model":"m"}"#,
            r#"{"token_ids" [1]}"#,
            r#"{token_ids:[1]}"#,
            r#"{"token_ids":[1]"#,
            r#"{"#,
            r#"{"model"#,
            r#"[1,2]"#,
            r#""token_ids""#,
            "\u{feff}{}",
            "   ",
            "",
        ] {
            assert!(!flat_takes(b), "{b}");
            assert_same(b);
        }
        // Invalid UTF-8 inside a string.
        let bad = b"{\"model\":\"\xff\",\"token_ids\":[1]}";
        assert!(flat::parse(bad).is_none());
        assert_eq!(
            QueryBody::parse(bad).map(|q| q.fields),
            api::object(bad).map(|mut m| {
                m.remove("token_ids");
                m
            })
        );
    }

    /// An id written as an integral float (`7.0`, `1e3`) is the integer it writes: the
    /// document's `integer` includes it.
    #[test]
    fn integral_floats_are_token_ids() {
        let b = r#"{"model":"m","token_ids":[3318.0,1e3,7,4294967295.0]}"#;
        let ids = QueryBody::parse(b.as_bytes())
            .and_then(QueryBody::token_ids)
            .expect("integral");
        assert_eq!(ids, [3318, 1000, 7, u32::MAX]);
    }

    /// The 400s of a bad `token_ids` name the field and the first bad index.
    #[test]
    fn token_errors_name_the_field_and_index() {
        for (b, reason, index) in [
            (
                r#"{"token_ids":[1,2,4294967296,-1]}"#,
                "out_of_range",
                Some(2),
            ),
            (r#"{"token_ids":[0,-5]}"#, "out_of_range", Some(1)),
            (r#"{"token_ids":[0.5]}"#, "out_of_range", Some(0)),
            (r#"{"token_ids":"x"}"#, "invalid_type", None),
            (r#"{"model":"m"}"#, "missing", None),
            (r#"{"token_ids":null}"#, "missing", None),
        ] {
            let e = QueryBody::parse(b.as_bytes())
                .and_then(QueryBody::token_ids)
                .expect_err(b);
            assert_eq!(
                (e.reason, e.field.as_deref(), e.index),
                (reason, Some("token_ids"), index),
                "{b}"
            );
        }
        let e = QueryBody::parse(b"{\"token_ids\":[1,2").expect_err("cut");
        assert_eq!(e.reason, "invalid_json");
    }

    /// A long list is read in full without growing its buffer; a long list with one bad id
    /// far in is refused at that index.
    #[test]
    fn huge_lists() {
        let n: u32 = 1 << 20;
        let ids: Vec<u32> = (0..n).map(|i| i.wrapping_mul(2_654_435_761)).collect();
        let body = serde_json::to_string(&serde_json::json!({"model": "m", "token_ids": ids}))
            .expect("json");
        let q = flat::parse(body.as_bytes()).expect("taken");
        let got = q.token_ids().expect("ids");
        assert_eq!(got, ids);
        let mut bad = ids.iter().map(|i| i.to_string()).collect::<Vec<_>>();
        bad[n as usize - 3] = "4294967296".into();
        let body = format!("{{\"token_ids\":[{}]}}", bad.join(","));
        let e = QueryBody::parse(body.as_bytes())
            .and_then(QueryBody::token_ids)
            .expect_err("out of range");
        assert_eq!(e.index, Some(n as usize - 3));
    }

    /// Token ids of every length, followed by every kind of byte, read 8 bytes at a time
    /// or not, come out as their value (or are declined as serde would refuse them).
    #[test]
    fn token_ids_of_every_length() {
        let mut ids: Vec<u64> = (0..=1000).collect();
        for d in 1..=11u32 {
            let p = 10u64.pow(d);
            ids.extend([p - 1, p, p + 1, p / 2 + 7, p * 3 / 7]);
        }
        ids.extend([u64::from(u32::MAX), u64::from(u32::MAX) + 1]);
        for id in ids {
            for tail in ["]", ",0]", " ]", "\n,1]", "]}", ",99999999]"] {
                for pad in ["", "      "] {
                    let b = format!("{{\"token_ids\":[{id}{tail}{pad}}}");
                    assert_same(&b);
                    if id <= u64::from(u32::MAX) && !tail.ends_with("]}") {
                        let got = QueryBody::parse(b.as_bytes())
                            .and_then(QueryBody::token_ids)
                            .expect(&b);
                        assert_eq!(u64::from(got[0]), id, "{b}");
                    }
                }
            }
        }
        // Leading zeros, fractions and exponents right after up to 7 digits.
        for b in [
            "[0123]",
            "[00]",
            "[1234567.5]",
            "[12e2]",
            "[1E2,3]",
            "[7.0]",
            "[1234567e1]",
        ] {
            let b = format!("{{\"token_ids\":{b},\"model\":\"m\"}}");
            assert!(!flat_takes(&b), "{b}");
            assert_same(&b);
        }
    }

    /// Random mutations of a valid body: the two readers always agree.
    #[test]
    fn mutations_agree() {
        let base = r#"{"model":"m","block_size":16,"lora_name":"a","token_ids":[0,1,22,333,4294967295],"stream":false,"x":null}"#;
        let alphabet = b"{}[],:\"0123456789-.eE tnufalsr\\x\n";
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20_000 {
            let mut b = base.as_bytes().to_vec();
            for _ in 0..1 + next() % 3 {
                let at = (next() as usize) % (b.len() + 1);
                let c = alphabet[(next() as usize) % alphabet.len()];
                match next() % 3 {
                    0 if at < b.len() => b[at] = c,
                    1 if at < b.len() => {
                        b.remove(at);
                    }
                    _ => b.insert(at, c),
                }
            }
            let s = String::from_utf8(b).expect("ascii");
            assert_same(&s);
        }
    }
}
