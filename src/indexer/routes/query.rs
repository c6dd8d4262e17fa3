//! Queries: `POST /query` (token ids, read by the one-pass `query_body` reader) and
//! `/query_by_hash` (standard sequence hashes), answered from the index under its read lock
//! in the Conductor's shape.

use super::{query_body, St};
use crate::indexer::api::{self, Refusal};
use crate::indexer::model::index::{InstanceMatch, QueryScope};
use crate::web::error::ApiError;
use crate::web::json::RawBody;
use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The `/query` and `/query_by_hash` answer, `{tenant: {instance: {"longest_matched", "GPU",
/// "CPU", "DISK", "DP": {rank: tokens}}}}` (`{}` when nothing matched), serialized straight
/// from the rows: building it as a `serde_json::Value` first cost a map, a string and a boxed
/// value per field of every row.
struct Answer<'a> {
    tenant: &'a str,
    rows: &'a BTreeMap<String, InstanceMatch>,
}

impl Serialize for Answer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Rows<'a>(&'a BTreeMap<String, InstanceMatch>);
        struct Row<'a>(&'a InstanceMatch);
        impl Serialize for Rows<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_map(self.0.iter().map(|(inst, m)| (inst, Row(m))))
            }
        }
        impl Serialize for Row<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let m = self.0;
                let mut map = s.serialize_map(Some(5 + m.other.len()))?;
                map.serialize_entry("longest_matched", &m.longest_matched)?;
                map.serialize_entry("GPU", &m.gpu)?;
                map.serialize_entry("CPU", &m.cpu)?;
                map.serialize_entry("DISK", &m.disk)?;
                // Other media under their own names (never GPU, CPU, DISK, DP or OTHER's
                // neighbours: the names are upper case and `DP` is kept apart).
                for (name, tokens) in &m.other {
                    map.serialize_entry(name, tokens)?;
                }
                map.serialize_entry("DP", &m.dp)?;
                map.end()
            }
        }
        let mut map = s.serialize_map(Some(usize::from(!self.rows.is_empty())))?;
        if !self.rows.is_empty() {
            map.serialize_entry(self.tenant, &Rows(self.rows))?;
        }
        map.end()
    }
}

/// The schema of the answer, for `/openapi.json`.
pub(super) fn answer_schema() -> Value {
    json!({"type": "object", "description": "{tenant: {instance: match}}",
      "additionalProperties": {"type": "object", "additionalProperties": {
        "type": "object", "properties": {
          "longest_matched": {"type": "integer"}, "GPU": {"type": "integer"},
          "CPU": {"type": "integer"}, "DISK": {"type": "integer"},
          "DP": {"type": "object", "additionalProperties": {"type": "integer"}}}}}})
}

/// The answer as a JSON response.
fn answer(tenant: &str, rows: &BTreeMap<String, InstanceMatch>) -> Response {
    let mut out = Vec::with_capacity(64 + rows.len() * 128);
    match serde_json::to_writer(&mut out, &Answer { tenant, rows }) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            out,
        )
            .into_response(),
        Err(e) => ApiError::Internal(format!("cannot write the answer: {e}")).into_response(),
    }
}

pub(super) async fn query(State(st): St, RawBody(body): RawBody) -> Result<Response, Refusal> {
    let body = query_body::QueryBody::parse(&body)?;
    let head = api::query_head(&body.fields)?;
    let tokens = body.token_ids()?;
    let scope = scope(&head);
    let rows = st.core.read().index.query_tokens(&scope, &tokens);
    Ok(answer(&head.tenant, &rows))
}

pub(super) async fn query_by_hash(
    State(st): St,
    RawBody(body): RawBody,
) -> Result<Response, Refusal> {
    let api::HashQuery { head, hashes } = api::hash_query(&api::object(&body)?)?;
    let rows = st.core.read().index.query_hashes(&scope(&head), &hashes);
    Ok(answer(&head.tenant, &rows))
}

fn scope(head: &api::QueryHead) -> QueryScope<'_> {
    QueryScope {
        tenant: &head.tenant,
        model: &head.model,
        lora: head.lora.clone(),
        block_size: head.block_size,
        salt: &head.salt,
        instance: head.instance.as_deref(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    /// The answer as it was built before: a `serde_json::Value`.
    fn as_value(tenant: &str, rows: BTreeMap<String, InstanceMatch>) -> Value {
        if rows.is_empty() {
            return json!({});
        }
        let mut instances = Map::new();
        for (inst, m) in rows {
            let dp: Map<String, Value> =
                m.dp.iter()
                    .map(|(r, v)| (r.to_string(), json!(v)))
                    .collect();
            instances.insert(
                inst,
                json!({"longest_matched": m.longest_matched, "GPU": m.gpu, "CPU": m.cpu,
                       "DISK": m.disk, "DP": dp}),
            );
        }
        json!({ tenant: instances })
    }

    /// The answer's bytes are those of the `Value` it replaced, key order included.
    #[test]
    fn the_answer_is_the_bytes_of_the_value() {
        let row = |n: u64, ranks: &[u32]| InstanceMatch {
            longest_matched: n,
            gpu: n / 2,
            cpu: n / 3,
            disk: 0,
            dp: ranks.iter().map(|&r| (r, n + u64::from(r))).collect(),
            other: BTreeMap::new(),
        };
        let cases: Vec<(&str, Vec<(&str, InstanceMatch)>)> = vec![
            ("default", vec![]),
            ("default", vec![("vllm-1", row(2048, &[0]))]),
            (
                "t\"\\é",
                vec![
                    ("b", row(16, &[0, 1, 2, 10, 11, 100])),
                    ("a\n\u{1}", row(u64::MAX, &[])),
                    ("", row(0, &[u32::MAX])),
                ],
            ),
        ];
        for (tenant, rows) in cases {
            let rows: BTreeMap<String, InstanceMatch> =
                rows.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            let mut bytes = Vec::new();
            serde_json::to_writer(
                &mut bytes,
                &Answer {
                    tenant,
                    rows: &rows,
                },
            )
            .expect("written");
            let want = serde_json::to_vec(&as_value(tenant, rows)).expect("written");
            assert_eq!(String::from_utf8(bytes), String::from_utf8(want));
        }
    }
}
