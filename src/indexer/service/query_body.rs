//! The `/query` body read in one pass: `token_ids` straight into `u32`s, every other field as a
//! JSON value. Reading the whole body as a `serde_json::Value` first made one boxed value per
//! token id and cost more than the index walk of a 2,048-token prompt.
//!
//! Only the success path is fast: a body this reader refuses (not JSON, not an object) is
//! handed back to [`super::api::object`], so every error is exactly the one the general path
//! gives. A `token_ids` that is not a list of u32 is kept as its first fault, reported by
//! [`QueryBody::token_ids`] with the same error as [`super::api::token_ids`].

use super::api::{self, ApiError};
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
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
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
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
    pub(crate) fn token_ids(self) -> Result<Vec<u32>, ApiError> {
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

impl<'de> Deserialize<'de> for QueryBody {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Body;
        impl<'de> Visitor<'de> for Body {
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
        d.deserialize_map(Body)
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
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Token, E> {
                Ok(Token(None))
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
            let general = api::object(b.as_bytes()).and_then(|mut m| {
                let t = api::token_ids(&m);
                m.remove("token_ids");
                t.map(|t| (m, t))
            });
            let fast = QueryBody::parse(b.as_bytes()).and_then(|q| {
                let fields = q.fields.clone();
                q.token_ids().map(|t| (fields, t))
            });
            assert_eq!(fast, general, "{b}");
        }
    }
}
