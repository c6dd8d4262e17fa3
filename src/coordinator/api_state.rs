//! What the coordinator's routes share: [`ApiState`] (the owner's handle, limits, token
//! settings, metadata and checkpoint writers), and the helpers every route file uses to read
//! a body ([`parse`], [`invalid`]) and find an MP server ([`address_of`]). A leaf of the route
//! files: `api.rs` (the router), `cache_api.rs`, `directory_api.rs`, `dashboard.rs` and
//! `limits.rs` all stand on it, and it on none of them.

use super::driver::{Handle, Stopped};
use crate::web::access::Auth;
use crate::web::error::ApiError;
use crate::web::limits::WebLimit;
use crate::web::metrics_layer::HttpMetrics;
use crate::web::HttpLimits;
use serde::de::DeserializeOwned;
use serde_json::json;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// What the routes share.
pub struct ApiState {
    /// The model's owner.
    pub handle: Handle,
    /// Tokens per chunk (the MP servers' `--chunk-size`), for the prefetch noop rule.
    pub chunk_size: usize,
    /// Deadline of every call to an MP server.
    pub outbound_timeout: Duration,
    /// The HTTP limits (body bytes and values, connections, read timeout).
    pub http: HttpLimits,
    /// Most events in one request (over all its batches).
    pub max_events_per_request: usize,
    /// Requests refused by a limit, by limit name.
    pub refused: Refused,
    /// Saves quotas and pins after each change (`--metadata-path`).
    pub metadata: super::metadata::Persister,
    /// This coordinator's place in its cluster (`--cluster`; `None`: standalone).
    pub cluster: Option<Arc<crate::cluster::ClusterStatus>>,
    /// `--checkpoint-path` (`None`: off).
    pub checkpoint: Option<Arc<super::checkpoint::Checkpointer>>,
    /// `--enable-blend-lookup`: `(chunk_size, probe_stride)` (`None`: off).
    pub blend: Option<(usize, usize)>,
    /// Which optional routes are served (`--extra-config`, `--disable-metrics`).
    pub features: super::Features,
    /// `--api-token` and its scope.
    pub auth: Auth,
    /// Requests by route, counted and timed by the HTTP stack.
    pub http_metrics: Arc<HttpMetrics>,
}

impl From<Stopped> for ApiError {
    fn from(e: Stopped) -> Self {
        ApiError::Unavailable(e.to_string())
    }
}

pub(crate) type Shared = Arc<ApiState>;

/// Parses a JSON body; a failure's `loc` is the path to the offending field.
pub(crate) fn parse<T: DeserializeOwned>(state: &ApiState, bytes: &[u8]) -> Result<T, ApiError> {
    if !crate::web::body::is_object(bytes) {
        state.refused.invalid_bodies.fetch_add(1, Ordering::Relaxed);
        return Err(ApiError::value_error(
            vec![json!("body")],
            String::from("Input should be a valid dictionary"),
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de)
        .or_else(|e| {
            // JSON has one number type: `2.0` is the integer 2 to LMCache's pydantic (and to the
            // JSON schema). Tried only after a refusal, so well-formed bodies pay nothing.
            if let Some(v) = crate::web::body::integral_floats_as_integers(bytes) {
                if let Ok(t) = serde_json::from_value(v) {
                    return Ok(t);
                }
            }
            Err(e)
        })
        .map_err(|e| {
            state.refused.invalid_bodies.fetch_add(1, Ordering::Relaxed);
            let mut loc = vec![json!("body")];
            for seg in e.path().iter() {
                match seg {
                    serde_path_to_error::Segment::Seq { index } => loc.push(json!(index)),
                    serde_path_to_error::Segment::Map { key } => loc.push(json!(key)),
                    serde_path_to_error::Segment::Enum { variant } => loc.push(json!(variant)),
                    serde_path_to_error::Segment::Unknown => {}
                }
            }
            let msg = e.into_inner().to_string();
            // serde names a missing field only in its message ("missing field `ip`"): FastAPI
            // puts it in `loc`, and so do we.
            // (The path already ends at an unknown field, for a body that refuses them.)
            if let Some(field) = msg
                .strip_prefix("missing field `")
                .and_then(|rest| rest.split('`').next())
            {
                loc.push(json!(field));
            }
            ApiError::value_error(loc, msg)
        })
}

pub(crate) fn invalid(state: &ApiState, field: &'static str, msg: impl Into<String>) -> ApiError {
    state.refused.invalid_bodies.fetch_add(1, Ordering::Relaxed);
    ApiError::value_error(vec![json!("body"), json!(field)], msg.into())
}

/// The registered address of `id`, or 404.
pub(crate) async fn address_of(s: &ApiState, id: &str) -> Result<(String, u16), ApiError> {
    let key = id.to_owned();
    s.handle
        .fleet(move |f, _, _| f.get(&key).map(|i| (i.ip.clone(), i.http_port)))
        .await?
        .ok_or_else(|| {
            ApiError::NotFound(format!("no MP server registered with instance_id='{id}'"))
        })
}

/// Requests refused by each limit.
#[derive(Debug, Default)]
pub struct Refused {
    /// Event requests over `max_events_per_request`.
    pub events_per_request: AtomicU64,
    /// Registrations over the instance limit.
    pub instances: AtomicU64,
    /// Bodies that failed validation (422).
    pub invalid_bodies: AtomicU64,
    /// Bodies over `--max-body-bytes` (413).
    pub body_bytes: AtomicU64,
    /// Bodies over `--max-body-items` JSON values (413).
    pub body_items: AtomicU64,
    /// Connections that waited for a slot at `--max-http-connections` (every slot busy).
    pub connections: AtomicU64,
    /// Idle keep-alive connections closed at `--max-http-connections` to admit a new one.
    pub idle_closed: AtomicU64,
    /// Peers cut off by `--http-read-timeout`.
    pub read_timeout: AtomicU64,
    /// Failed TLS handshakes (`--tls-cert`).
    pub tls_handshake: AtomicU64,
}

impl Refused {
    /// Counts one refusal by `limit`.
    pub fn count(&self, limit: WebLimit) {
        let counter = match limit {
            WebLimit::BodyBytes => &self.body_bytes,
            WebLimit::BodyItems => &self.body_items,
            WebLimit::Connections => &self.connections,
            WebLimit::IdleClosed => &self.idle_closed,
            WebLimit::ReadTimeout => &self.read_timeout,
            WebLimit::TlsHandshake => &self.tls_handshake,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
