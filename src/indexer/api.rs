//! The JSON contract of the indexer's HTTP API (spec §1): request bodies read tolerantly
//! (aliases, unknown fields ignored) and validated into typed requests, each with its schema
//! for `/openapi.json` beside it ([`Documented`]); a refusal is a
//! [`crate::web::error::Refusal`], the one error shape's Conductor form (`error`, `reason`
//! with the C++ Conductor's codes, `field`, `index`). Pure: no axum here.

use crate::indexer::model::index::LoraNs;
pub(crate) use crate::web::error::Refusal;
use crate::web::route::Documented;
use serde_json::{json, Map, Value};

/// A port, 0 to 65535 in 1 to 5 digits, as the schemas' patterns write it ([`port`] reads it
/// alike).
const PORT: &str =
    "(?:[0-9]{1,4}|[0-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])";

/// The schema of `block_size` and of every `u32` the bodies carry.
fn u32_schema(minimum: u32) -> Value {
    json!({"type": "integer", "minimum": minimum, "maximum": 4294967295u64})
}

/// Parses a body as a JSON object, whatever the Content-Type says.
pub(crate) fn object(bytes: &[u8]) -> Result<Map<String, Value>, Refusal> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(Refusal::invalid_json("the body must be a JSON object")),
        Err(e) => Err(Refusal::invalid_json(format!("invalid JSON: {e}"))),
    }
}

/// The first present, non-null value among `names`, with the name it was found under.
fn pick<'a>(body: &'a Map<String, Value>, names: &[&'static str]) -> Option<&'a Value> {
    names
        .iter()
        .find_map(|n| body.get(*n).filter(|v| !v.is_null()))
}

fn string(
    body: &Map<String, Value>,
    names: &[&'static str],
    required: bool,
) -> Result<Option<String>, Refusal> {
    match pick(body, names) {
        None if required => Err(Refusal::field("missing", names[0], "required")),
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(Refusal::field("invalid_type", names[0], "must be a string")),
    }
}

/// A non-negative integer; JSON has one number type, so `2.0` is the integer 2.
fn whole(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| f.fract() == 0.0 && (0.0..=9_007_199_254_740_992.0).contains(f))
            .map(|f| f as u64)
    })
}

fn uint(
    body: &Map<String, Value>,
    name: &'static str,
    required: bool,
    max: u64,
) -> Result<Option<u64>, Refusal> {
    match pick(body, &[name]) {
        None if required => Err(Refusal::field("missing", name, "required")),
        None => Ok(None),
        Some(v) => match whole(v) {
            Some(n) if n <= max => Ok(Some(n)),
            Some(_) => Err(Refusal::field(
                "out_of_range",
                name,
                format!("must be ≤ {max}"),
            )),
            None if v.is_number() => Err(Refusal::field(
                "out_of_range",
                name,
                "must be a non-negative integer",
            )),
            None => Err(Refusal::field("invalid_type", name, "must be an integer")),
        },
    }
}

fn tenant(body: &Map<String, Value>) -> Result<String, Refusal> {
    Ok(string(body, &["tenant_id"], false)?
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "default".to_owned()))
}

/// The engine that publishes a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineType {
    /// vLLM (any version from 0.10).
    Vllm,
    /// SGLang.
    Sglang,
    /// The standardized Mooncake events (a shared pool).
    Mooncake,
}

impl EngineType {
    /// The name as the API writes it.
    pub fn name(self) -> &'static str {
        match self {
            EngineType::Vllm => "vLLM",
            EngineType::Sglang => "SGLang",
            EngineType::Mooncake => "Mooncake",
        }
    }
}

/// A validated `/register` body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    /// The PUB endpoint.
    pub endpoint: String,
    /// The replay ROUTER endpoint (`None`: no replay).
    pub replay_endpoint: Option<String>,
    /// The engine type.
    pub kind: EngineType,
    /// The model.
    pub model: String,
    /// The default LoRA namespace.
    pub lora: String,
    /// The tenant.
    pub tenant: String,
    /// The instance.
    pub instance: String,
    /// Tokens per block.
    pub block_size: u32,
    /// The data-parallel rank.
    pub dp_rank: u32,
    /// The deployment salt.
    pub salt: String,
    /// The LMCache MP servers (their coordinator instance ids) whose L1 and L2 chunks are
    /// this instance's CPU and DISK tiers (`lmcache_instance_id`, a string or a list).
    pub lmcache: Vec<String>,
    /// The instance's OpenAI HTTP server, `http://host:port` (`http_endpoint`, a kvplane
    /// extension): where a `kvplane router` that discovers engines here sends requests.
    pub http: Option<String>,
    /// The Mooncake backends (`backend_id`, a string or a list) whose standardized events
    /// this stream reads; empty: every backend its endpoint carries.
    pub backends: Vec<String>,
}

impl Registration {
    /// The service key, `instance|tenant|dp_rank`.
    pub fn key(&self) -> String {
        service_key(&self.instance, &self.tenant, self.dp_rank)
    }

    /// The registration as `/services` shows it.
    pub fn to_json(&self) -> Value {
        json!({
            "endpoint": self.endpoint,
            "replay_endpoint": self.replay_endpoint.clone().unwrap_or_default(),
            "type": self.kind.name(),
            "modelname": self.model,
            "lora_name": self.lora,
            "tenant_id": self.tenant,
            "instance_id": self.instance,
            "block_size": self.block_size,
            "dp_rank": self.dp_rank,
            "lmcache_instance_id": self.lmcache,
            "backend_id": self.backends,
            "additionalsalt": self.salt,
            "http_endpoint": self.http.clone().unwrap_or_default(),
        })
    }
}

impl Documented for Registration {
    fn schema() -> Value {
        let id = json!({"type": "string", "minLength": 1, "maxLength": 256});
        json!({"type": "object",
            "required": ["endpoint", "type", "modelname", "instance_id", "block_size", "dp_rank"],
            "properties": {
              "endpoint": {"type": "string", "example": "tcp://10.0.0.5:5557",
                           "pattern": format!("^tcp://[^*]+:{PORT}$")},
              "replay_endpoint": {"type": ["string", "null"],
                                  "pattern": format!("^(tcp://[^*]+:{PORT})?$")},
              "type": {"type": "string", "enum": ["vLLM", "SGLang", "Mooncake"]},
              "modelname": {"type": "string"}, "lora_name": {"type": ["string", "null"]},
              "tenant_id": {"type": ["string", "null"]},
              "instance_id": {"type": "string", "minLength": 1},
              "block_size": u32_schema(1),
              "dp_rank": u32_schema(0),
              "additionalsalt": {"type": ["string", "null"]},
              "http_endpoint": {"type": ["string", "null"], "example": "http://10.0.0.5:8000",
                                "pattern": format!("^(http://[^*/]+:{PORT}/*)?$")},
              "backend_id": {"oneOf": [{"type": "null"}, id.clone(),
                  {"type": "array", "maxItems": 64, "items": id}]}}})
    }
}

/// `instance|tenant|dp_rank`, the Go service's key.
pub(crate) fn service_key(instance: &str, tenant: &str, dp_rank: u32) -> String {
    format!("{instance}|{tenant}|{dp_rank}")
}

/// A port as the schemas' pattern writes it ([`PORT`]): 1 to 5 digits, at most 65535.
fn port(p: &str) -> bool {
    p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok()
}

fn endpoint(value: String, field: &'static str) -> Result<String, Refusal> {
    let rest = value
        .strip_prefix("tcp://")
        .ok_or_else(|| Refusal::field("invalid_value", field, "must be tcp://host:port"))?;
    match rest.rsplit_once(':') {
        Some((host, p)) if port(p) && !host.is_empty() && !host.contains('*') => Ok(value),
        _ => Err(Refusal::field(
            "invalid_value",
            field,
            "must be tcp://host:port with a connectable host",
        )),
    }
}

/// Validates a `/register` body.
///
/// # Errors
/// 400 [`Refusal`]s naming the field.
pub(crate) fn registration(body: &Map<String, Value>) -> Result<Registration, Refusal> {
    let ep = string(body, &["endpoint"], true)?.unwrap_or_default();
    let replay = string(body, &["replay_endpoint"], false)?.filter(|s| !s.is_empty());
    let kind = match string(body, &["type"], true)?
        .unwrap_or_default()
        .to_ascii_lowercase()
        .as_str()
    {
        "vllm" => EngineType::Vllm,
        "sglang" => EngineType::Sglang,
        "mooncake" => EngineType::Mooncake,
        _ => {
            return Err(Refusal::field(
                "invalid_value",
                "type",
                "must be \"vLLM\", \"SGLang\" or \"Mooncake\"",
            ))
        }
    };
    let model = string(body, &["modelname", "model", "model_name"], true)?.unwrap_or_default();
    let instance = string(body, &["instance_id"], true)?.unwrap_or_default();
    if instance.is_empty() {
        return Err(Refusal::field(
            "invalid_value",
            "instance_id",
            "must not be empty",
        ));
    }
    let block_size = uint(body, "block_size", true, u64::from(u32::MAX))?.unwrap_or(0);
    if block_size == 0 {
        return Err(Refusal::field("out_of_range", "block_size", "must be > 0"));
    }
    Ok(Registration {
        endpoint: endpoint(ep, "endpoint")?,
        replay_endpoint: replay.map(|r| endpoint(r, "replay_endpoint")).transpose()?,
        kind,
        model,
        lora: string(body, &["lora_name"], false)?.unwrap_or_default(),
        tenant: tenant(body)?,
        instance,
        block_size: block_size as u32,
        dp_rank: uint(body, "dp_rank", true, u64::from(u32::MAX))?.unwrap_or(0) as u32,
        salt: string(body, &["additionalsalt", "additional_salt"], false)?.unwrap_or_default(),
        lmcache: id_list(body, "lmcache_instance_id")?,
        backends: id_list(body, "backend_id")?,
        http: string(body, &["http_endpoint"], false)?
            .filter(|s| !s.is_empty())
            .map(http_endpoint)
            .transpose()?,
    })
}

/// `http_endpoint`: `http://host:port` (no path), trailing slashes dropped.
fn http_endpoint(value: String) -> Result<String, Refusal> {
    const F: &str = "http_endpoint";
    let url = value.trim_end_matches('/');
    let authority = url.strip_prefix("http://").unwrap_or_default();
    match authority.rsplit_once(':') {
        Some((host, p)) if port(p) && !host.is_empty() && !host.contains(['/', '*']) => {
            Ok(url.to_owned())
        }
        _ => Err(Refusal::field(
            "invalid_value",
            F,
            "must be http://host:port with a connectable host",
        )),
    }
}

/// `lmcache_instance_id` (MP servers) or `backend_id` (Mooncake backends): one id or a list
/// of them (absent: none), each non-empty and at most 256 bytes, at most 64.
fn id_list(body: &Map<String, Value>, field: &'static str) -> Result<Vec<String>, Refusal> {
    let bad = || {
        Refusal::field(
            "invalid_type",
            field,
            "must be a string or a list of strings",
        )
    };
    let mut out: Vec<String> = match body.get(field) {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(l)) if l.len() <= 64 => l
            .iter()
            .map(|v| v.as_str().map(str::to_owned).ok_or_else(bad))
            .collect::<Result<_, _>>()?,
        Some(Value::Array(_)) => {
            return Err(Refusal::field("out_of_range", field, "at most 64 ids"));
        }
        Some(_) => return Err(bad()),
    };
    if out.iter().any(|s| s.is_empty() || s.chars().count() > 256) {
        return Err(Refusal::field(
            "invalid_value",
            field,
            "each id must be 1 to 256 bytes",
        ));
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// A validated `/unregister` body: which keys to remove.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unregistration {
    /// The instance.
    pub instance: String,
    /// The tenant.
    pub tenant: String,
    /// The rank; `None` removes every rank of the instance (Dynamo's extension).
    pub dp_rank: Option<u32>,
}

impl Documented for Unregistration {
    fn schema() -> Value {
        json!({"type": "object", "required": ["instance_id"], "properties": {
            "instance_id": {"type": "string"}, "tenant_id": {"type": ["string", "null"]},
            "dp_rank": {"type": ["integer", "null"], "minimum": 0, "maximum": 4294967295u64}}})
    }
}

/// Validates an `/unregister` body (the doc's extra fields are accepted and ignored).
///
/// # Errors
/// 400 [`Refusal`]s naming the field.
pub(crate) fn unregistration(body: &Map<String, Value>) -> Result<Unregistration, Refusal> {
    Ok(Unregistration {
        instance: string(body, &["instance_id"], true)?.unwrap_or_default(),
        tenant: tenant(body)?,
        dp_rank: uint(body, "dp_rank", false, u64::from(u32::MAX))?.map(|r| r as u32),
    })
}

/// A validated `/query` or `/query_by_hash` body, without the blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct QueryHead {
    /// The model.
    pub model: String,
    /// The LoRA namespace.
    pub lora: LoraNs,
    /// The tenant.
    pub tenant: String,
    /// Only this instance.
    pub instance: Option<String>,
    /// Tokens per block.
    pub block_size: u32,
    /// The effective salt asked for.
    pub salt: String,
}

/// The schema of a `/query` or `/query_by_hash` body: the fields they share and `blocks`,
/// the list naming the prompt's blocks (its name and schema).
pub(crate) fn query_schema(blocks: (&str, Value)) -> Value {
    let mut props = json!({
        "model": {"type": "string"}, "lora_name": {"type": ["string", "null"]},
        "lora_id": {"type": ["integer", "null"], "deprecated": true},
        "tenant_id": {"type": ["string", "null"], "default": "default"},
        "instance_id": {"type": ["string", "null"]}, "block_size": u32_schema(1),
        "cache_salt": {"type": ["string", "null"]}});
    props[blocks.0] = blocks.1;
    json!({"type": "object", "required": ["model", "block_size", blocks.0], "properties": props,
        // lora_id is the deprecated form of lora_name: never both.
        "not": {"required": ["lora_name", "lora_id"], "properties": {
            "lora_name": {"type": "string"}, "lora_id": {"type": "integer"}}}})
}

/// Validates the fields `/query` and `/query_by_hash` share.
///
/// # Errors
/// 400 [`Refusal`]s naming the field.
pub(crate) fn query_head(body: &Map<String, Value>) -> Result<QueryHead, Refusal> {
    let lora_name = string(body, &["lora_name"], false)?;
    let lora_id = match body.get("lora_id").filter(|v| !v.is_null()) {
        None => None,
        Some(v) => Some(
            v.as_i64()
                .ok_or_else(|| Refusal::field("invalid_type", "lora_id", "must be an integer"))?,
        ),
    };
    let lora = match (lora_name, lora_id) {
        (Some(_), Some(_)) => {
            return Err(Refusal::field(
                "invalid_value",
                "lora_id",
                "lora_id is deprecated and must not be sent with lora_name",
            ))
        }
        (Some(n), None) => LoraNs::Name(n),
        (None, Some(i)) => LoraNs::Id(i),
        (None, None) => LoraNs::Name(String::new()),
    };
    let block_size = uint(body, "block_size", true, u64::from(u32::MAX))?.unwrap_or(0);
    if block_size == 0 {
        return Err(Refusal::field("out_of_range", "block_size", "must be > 0"));
    }
    Ok(QueryHead {
        model: string(body, &["model", "modelname", "model_name"], true)?.unwrap_or_default(),
        lora,
        tenant: tenant(body)?,
        instance: string(body, &["instance_id"], false)?.filter(|s| !s.is_empty()),
        block_size: block_size as u32,
        salt: string(body, &["cache_salt"], false)?.unwrap_or_default(),
    })
}

/// `token_ids`: u32 each.
///
/// # Errors
/// 400 naming the index of the first bad element.
pub(crate) fn token_ids(body: &Map<String, Value>) -> Result<Vec<u32>, Refusal> {
    let list = match body.get("token_ids") {
        None | Some(Value::Null) => return Err(Refusal::field("missing", "token_ids", "required")),
        Some(Value::Array(list)) => list,
        Some(_) => {
            return Err(Refusal::field(
                "invalid_type",
                "token_ids",
                "must be a list",
            ))
        }
    };
    list.iter()
        .enumerate()
        .map(|(i, v)| {
            // A u32, also when written as an integral float (`7.0`, `1e3`): JSON Schema's
            // `integer` in the OpenAPI document includes those. `query_body.rs` reads them alike
            // (the two must agree).
            v.as_u64()
                .or_else(|| v.as_f64().and_then(integral))
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| Refusal {
                    index: Some(i),
                    ..Refusal::field("out_of_range", "token_ids", "token ids are u32")
                })
        })
        .collect()
}

/// `v` as a whole non-negative number, if it is one that fits a u64 (`7.0`, `1e3`).
pub(crate) fn integral(v: f64) -> Option<u64> {
    // 2^64 as f64: every whole f64 below it fits a u64 exactly.
    (v.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&v)).then_some(v as u64)
}

/// `seq_hashes` (alias `block_hash`, `block_hashes`): u64, negative i64 (two's complement),
/// or decimal / `0x` hex strings.
///
/// # Errors
/// 400 naming the index of the first bad element.
pub(crate) fn seq_hashes(body: &Map<String, Value>) -> Result<Vec<u64>, Refusal> {
    let list = match pick(body, &["seq_hashes", "block_hash", "block_hashes"]) {
        None => return Err(Refusal::field("missing", "seq_hashes", "required")),
        Some(Value::Array(list)) => list,
        Some(_) => {
            return Err(Refusal::field(
                "invalid_type",
                "seq_hashes",
                "must be a list",
            ))
        }
    };
    list.iter()
        .enumerate()
        .map(|(i, v)| {
            let parsed = match v {
                Value::Number(n) => {
                    n.as_u64()
                        .or_else(|| n.as_i64().map(|x| x as u64))
                        .or_else(|| {
                            // JSON has one number type: `-2.0` is the integer -2.
                            n.as_f64()
                                .filter(|f| f.fract() == 0.0 && f.abs() <= 9_007_199_254_740_992.0)
                                .map(|f| f as i64 as u64)
                        })
                }
                Value::String(s) => match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
                    Some(hex) => u64::from_str_radix(hex, 16).ok(),
                    None => s
                        .parse::<u64>()
                        .ok()
                        .or_else(|| s.parse::<i64>().ok().map(|x| x as u64)),
                },
                _ => None,
            };
            parsed.ok_or_else(|| Refusal {
                index: Some(i),
                ..Refusal::field(
                    "invalid_value",
                    "seq_hashes",
                    "a hash is a u64, an i64, or a decimal or 0x string",
                )
            })
        })
        .collect()
}

/// A validated `/query_by_hash` body: the shared fields and the blocks' standard sequence
/// hashes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HashQuery {
    /// The shared fields.
    pub(crate) head: QueryHead,
    /// The hashes, as [`seq_hashes`] reads them.
    pub(crate) hashes: Vec<u64>,
}

impl Documented for HashQuery {
    fn schema() -> Value {
        let hashes = json!({"type": "array", "items": {"oneOf": [
            {"type": "integer", "minimum": -9223372036854775808i64,
             "maximum": 18446744073709551615u64},
            {"type": "string", "pattern": "^(0[xX][0-9a-fA-F]{1,16}|-?[0-9]{1,18})$"}]}});
        query_schema(("seq_hashes", hashes))
    }
}

/// Validates a `/query_by_hash` body: its shared fields, then its hashes.
///
/// # Errors
/// 400 [`Refusal`]s naming the field (and the index of a bad hash).
pub(crate) fn hash_query(body: &Map<String, Value>) -> Result<HashQuery, Refusal> {
    Ok(HashQuery {
        head: query_head(body)?,
        hashes: seq_hashes(body)?,
    })
}

/// Reads `--publishers`: a list of `/register` bodies, or `{"kvevent_instance": [...]}`.
///
/// # Errors
/// The file cannot be read or parsed, or an entry is not a valid registration.
pub(crate) fn publishers_file(
    path: &std::path::Path,
) -> Result<Vec<Registration>, crate::service::StartError> {
    let err = |message: String| {
        crate::service::StartError::Config(format!("--publishers {}: {message}", path.display()))
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
    let list = match &value {
        serde_json::Value::Array(l) => l.clone(),
        serde_json::Value::Object(o) => match o.get("kvevent_instance") {
            Some(serde_json::Value::Array(l)) => l.clone(),
            Some(serde_json::Value::Object(m)) => m.values().cloned().collect(),
            _ => {
                return Err(err(
                    "expected a list or {\"kvevent_instance\": [...]}".into()
                ))
            }
        },
        _ => {
            return Err(err(
                "expected a list or {\"kvevent_instance\": [...]}".into()
            ))
        }
    };
    list.iter()
        .enumerate()
        .map(|(i, v)| {
            let body = v
                .as_object()
                .ok_or_else(|| err(format!("entry {i} is not an object")))?;
            registration(body).map_err(|e| err(format!("entry {i}: {}", e.message)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    /// A port is what the document's pattern says: 1 to 5 digits, at most 65535.
    #[test]
    fn ports_as_the_document_writes_them() {
        let whole = format!("^{PORT}$");
        let pattern = regex::Regex::new(&whole).unwrap();
        for (p, ok) in [
            ("0", true),
            ("8000", true),
            ("30000", true),
            ("65535", true),
            ("00080", true),
            ("65536", false),
            ("99999", false),
            ("+80", false),
            ("080000", false),
            ("", false),
        ] {
            assert_eq!(port(p), ok, "{p:?}");
            assert_eq!(pattern.is_match(p), ok, "{p:?} against the pattern");
        }
    }

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    #[test]
    fn the_docs_register_body_validates_with_aliases_and_extras() {
        let body = obj(
            json!({"endpoint":"tcp://1.1.1.1:5557","replay_endpoint":"tcp://1.1.1.1:5558",
            "type":"vLLM","modelname":"deepseek","lora_name":"sql-adapter","tenant_id":"",
            "instance_id":"vllm-prefill-node1","block_size":128,"dp_rank":0,"additionalsalt":"w8a8",
            "unknown":"ignored"}),
        );
        let r = registration(&body).expect("valid");
        assert_eq!(r.key(), "vllm-prefill-node1|default|0");
        assert_eq!(r.salt, "w8a8");
        assert_eq!(r.http, None);
        let mut with_http = body.clone();
        with_http.insert("http_endpoint".into(), json!("http://10.0.0.5:8000/"));
        let r = registration(&with_http).expect("valid");
        assert_eq!(r.http.as_deref(), Some("http://10.0.0.5:8000"));
        // As /services shows it, it reads back the same.
        assert_eq!(registration(&obj(r.to_json())), Ok(r));
        let alias = obj(
            json!({"endpoint":"tcp://h:1","type":"sglang","model_name":"m",
            "instance_id":"i","block_size":4,"dp_rank":2,"additional_salt":"s"}),
        );
        let r = registration(&alias).expect("valid");
        assert_eq!(
            (r.model.as_str(), r.salt.as_str(), r.kind),
            ("m", "s", EngineType::Sglang)
        );
    }

    #[test]
    fn bad_registrations_name_the_field() {
        let base = json!({"endpoint":"tcp://h:1","type":"vLLM","modelname":"m",
            "instance_id":"i","block_size":4,"dp_rank":0});
        let cases = [
            ("endpoint", json!("h:1"), "invalid_value"),
            ("endpoint", json!("tcp://*:5557"), "invalid_value"),
            ("type", json!("TensorRT"), "invalid_value"),
            ("block_size", json!(0), "out_of_range"),
            ("dp_rank", json!(-1), "out_of_range"),
            ("dp_rank", json!("0"), "invalid_type"),
            ("modelname", Value::Null, "missing"),
            ("http_endpoint", json!("10.0.0.5:8000"), "invalid_value"),
            ("http_endpoint", json!("http://h:8000/v1"), "invalid_value"),
            ("http_endpoint", json!("http://h"), "invalid_value"),
        ];
        for (field, value, reason) in cases {
            let mut b = obj(base.clone());
            b.insert(field.into(), value);
            let e = registration(&b).expect_err(field);
            assert_eq!(
                (e.reason, e.field.as_deref()),
                (reason, Some(field)),
                "{field}"
            );
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn query_fields_and_hash_forms() {
        let both = obj(json!({"model":"m","block_size":4,"lora_name":"a","lora_id":1}));
        assert_eq!(
            query_head(&both).map_err(|e| e.field.map(String::from)),
            Err(Some("lora_id".into()))
        );
        let q = obj(json!({"model":"m","block_size":4,"token_ids":[0, 4294967295u64]}));
        assert_eq!(token_ids(&q), Ok(vec![0, u32::MAX]));
        let big = obj(json!({"token_ids":[1, 4294967296u64]}));
        assert_eq!(token_ids(&big).map_err(|e| e.index), Err(Some(1)));
        let h = obj(json!({"block_hash":[18446744073709551615u64, -1, "0x10", "42", "-2"]}));
        assert_eq!(
            seq_hashes(&h),
            Ok(vec![u64::MAX, u64::MAX, 16, 42, u64::MAX - 1])
        );
        let bad = obj(json!({"seq_hashes":[1, "zz"]}));
        assert_eq!(seq_hashes(&bad).map_err(|e| e.index), Err(Some(1)));
    }
}
