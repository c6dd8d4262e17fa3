//! What the coordinator's routes, metrics and dashboard share: [`ApiState`] (the owner's
//! handle, limits, token settings, metadata and checkpoint writers, the refusal counts and the
//! HTTP metrics), built once by `serve` from the configuration.

use super::driver::Handle;
use crate::coordinator::CoordinatorConfig;
use crate::web::access::Auth;
use crate::web::limits::WebLimit;
use crate::web::metrics_layer::HttpMetrics;
use crate::web::HttpLimits;
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
    pub refused: RefusalCounts,
    /// Saves quotas and pins after each change (`--metadata-path`).
    pub metadata: super::metadata::Persister,
    /// This coordinator's place in its cluster (`--cluster`; `None`: standalone).
    pub cluster: Option<Arc<crate::cluster::ClusterStatus>>,
    /// `--checkpoint-path` (`None`: off).
    pub checkpoint: Option<Arc<super::checkpoint::Checkpointer>>,
    /// `--enable-blend-lookup`: `(chunk_size, probe_stride)` (`None`: off).
    pub blend: Option<(usize, usize)>,
    /// Which optional routes are served (`--extra-config`, `--disable-metrics`).
    pub features: crate::coordinator::Features,
    /// `--api-token` and its scope.
    pub auth: Auth,
    /// Requests by route, counted and timed by the HTTP stack.
    pub http_metrics: Arc<HttpMetrics>,
}

impl ApiState {
    /// The shared state of `config`'s routes around an owner handle (`cluster`: this
    /// coordinator's place in its cluster, `None` standalone).
    pub fn new(
        config: &CoordinatorConfig,
        handle: Handle,
        cluster: Option<Arc<crate::cluster::ClusterStatus>>,
    ) -> Arc<ApiState> {
        Arc::new_cyclic(|weak: &std::sync::Weak<ApiState>| ApiState {
            cluster,
            handle,
            chunk_size: config.chunk_size,
            outbound_timeout: config.outbound_timeout,
            http: config.http,
            max_events_per_request: config.max_events_per_request,
            refused: RefusalCounts::default(),
            metadata: super::metadata::Persister::new(config.metadata_path.clone()),
            checkpoint: config
                .checkpoint
                .clone()
                .map(|c| Arc::new(super::checkpoint::Checkpointer::new(c))),
            blend: config.blend_probe_stride.map(|s| (config.chunk_size, s)),
            features: config.features,
            auth: config.auth.clone(),
            http_metrics: Arc::new(crate::web::metrics_layer::HttpMetrics::standalone(
                "kvplane_coordinator_",
                config.http.max_body_bytes,
                crate::coordinator::routes::limits::hook_of(weak.clone()),
            )),
        })
    }
}

/// Requests refused by each limit.
#[derive(Debug, Default)]
pub struct RefusalCounts {
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

impl RefusalCounts {
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
