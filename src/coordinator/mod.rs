//! `kvplane coordinator`: the LMCache MP coordinator (fleet membership, per-tenant L2 quotas,
//! usage events, fleet-wide eviction, warm prefetch, startup resync) in Rust. See
//! docs/COORDINATOR.md.
//!
//! Layout, pure first (no I/O, no clock: `now` is passed in):
//! - [`objkey`] — object keys: the wire form and the compact one.
//! - [`keys`] — tracked L2 keys and their copies per holder and backend: compact 56-byte
//!   slots, per-salt usage and LRU lists.
//! - [`holders`] — the servers (live or departed) and the fleet holding copies; backends.
//! - [`fleet`] — registered MP servers, heartbeats, the timeout sweep.
//! - [`events`] — the two usage-event bodies (documented `POST /quota/events`, 0.5.6
//!   `POST /events`) and the per-instance sequence gate.
//! - [`usage`] — bytes per instance and compartment against declared capacities.
//! - [`model`] — the key state as one struct; the eviction decision as a pure function.
//!
//! - [`pins`] — token sequences to object keys (BLAKE3 chunk hashes), and the pin table.
//! - [`directory`] — the key directory (0.5.6's `/directory/*`): placements per holder,
//!   access counts, token ids once per chunk; [`blend`] its CacheBlend content index;
//!   [`tokens`] the store events' token ids as batches carry them.
//! - [`changes`] — `--cluster`: the change log's records (the inputs the leader applied, with
//!   its `now`) and the [`changes::CoordinatorState`] a standby applies them to (the
//!   replication core's `Replicated` state); [`snapshot`] its dump.
//! - [`logged`] — the state as the owners hold it ([`logged::Keys`], [`logged::Members`]):
//!   read freely, changed only through methods that log the change on a cluster's leader.
//!
//! - [`args`] — the flags and their layers, validated into [`CoordinatorConfig`]; also read
//!   for the coordinator `kvplane serve --coordinator-port` runs.
//!
//! Then the effects:
//! - [`driver`] — the two owner tasks (the key model, the fleet): read jobs, the sweep and
//!   eviction loops; dispatches spawned with timeouts.
//! - [`writes`] — every state change as one [`driver::Handle`] method, a job running the
//!   owner's logged method.
//! - [`cluster`] — `--cluster` (docs/CLUSTER.md): follow the log as a standby, take the lease,
//!   serve the followed state as the only dispatcher.
//! - [`api`] — the axum routes and their error envelope.
//! - [`cache_api`] — `/cache/pins` and `/cache/delete` (token sequences → keys → pins / a
//!   server's `DELETE /cache/objects`).
//! - [`outbound`] — HTTP calls to MP servers, bounded in time and size.
//! - [`resync`] — the startup resync over a server's `GET /cache/objects`.
//! - [`limits`] — the HTTP limits' refusals (413/408) and their counts.
//! - [`metadata`] — `--metadata-path`: quotas and pins saved after each change, loaded at start
//!   (kvplane's file or LMCache 0.5.6's); [`files`] the atomic file writer.
//! - [`checkpoint`] — `--checkpoint-path`: the model's dump written periodically and at a clean
//!   stop, restored at start.
//! - [`directory_api`] — the `/directory` routes.
//! - [`openapi`] — `GET /openapi.json`, from the route table.
//! - [`metrics`] — `GET /metrics` text, every series under `kvplane_coordinator_`.
//! - [`tap`] — the hook that sees every applied batch (`kvplane serve` feeds its indexer).
//! - [`dashboard`] — the Fleet page (`/`) and its read-only JSON feed (`/api/dashboard`).
//!
//! [`start`] binds (port 0 works) and returns a [`CoordinatorServer`] with the bound
//! address; [`cluster::run`] serves as a cluster's leader,
//! after following it as a standby. This module must not touch the controller's
//! state ([`crate::controller`]) or its index.

pub mod api;
mod api_state;
pub mod args;
pub mod blend;
pub mod cache_api;
pub mod changes;
pub mod checkpoint;
pub mod chunk_hash;
pub mod cluster;
pub mod dashboard;
pub mod directory;
pub mod directory_api;
pub mod driver;
pub mod events;
pub mod files;
pub mod fleet;
pub mod holders;
pub mod keys;
pub mod limits;
pub mod logged;
pub mod metadata;
pub mod metrics;
pub mod model;
pub mod objkey;
pub mod openapi;
pub mod outbound;
pub mod pins;
pub mod resync;
pub mod snapshot;
pub mod tap;
pub mod tokens;
pub mod usage;
pub mod writes;

use crate::service::{bind_tcp, Running, StartError};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The validated `kvplane coordinator` configuration.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// Bind host.
    pub host: String,
    /// Bind port (0 picks one).
    pub port: u16,
    /// Silence after which an instance is removed.
    pub instance_timeout: Duration,
    /// Between health sweeps (`None`: off).
    pub health_check_interval: Option<Duration>,
    /// Between eviction cycles (`None`: off).
    pub eviction_check_interval: Option<Duration>,
    /// Idle keep-alive of the HTTP server (accepted for compatibility; see docs).
    pub timeout_keep_alive: Duration,
    /// Tokens per chunk on the MP servers (prefetch `noop` rule).
    pub chunk_size: usize,
    /// Deadline of each call to an MP server.
    pub outbound_timeout: Duration,
    /// The HTTP limits: body bytes and JSON values, connections, read timeout.
    pub http: crate::web::HttpLimits,
    /// Most events in one request.
    pub max_events_per_request: usize,
    /// Limits and eviction settings of the model.
    pub model: model::ModelConfig,
    /// Startup resync (`None`: off).
    pub resync: Option<resync::ResyncConfig>,
    /// Where quotas and pins are kept across restarts (`None`: not kept).
    pub metadata_path: Option<std::path::PathBuf>,
    /// The default quota at start, GiB (`--default-quota-gb`; `None`: salts without a quota
    /// are exempt, 0.5.6's boot state; `Some(0.0)`: the seed document's allowlist). A
    /// `--metadata-path` file that holds a default quota replaces it.
    pub default_quota_gb: Option<f64>,
    /// `--enable-blend-lookup`: the probe stride (`None`: off).
    pub blend_probe_stride: Option<usize>,
    /// `--checkpoint-path` / `--checkpoint-interval` (`None`: off).
    pub checkpoint: Option<checkpoint::CheckpointConfig>,
    /// Optional parts (`--extra-config`, `--disable-metrics`).
    pub features: Features,
    /// `--api-token` and its scope (docs/COORDINATOR.md, "Authentication").
    pub auth: crate::web::access::Auth,
    /// Sees every applied batch (`kvplane serve` feeds its indexer; `None`: off).
    pub tap: Option<tap::Tap>,
}

/// Parts of the coordinator an operator can turn off, as in 0.5.6.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// The eviction loop and the `/quota*`, `/cache/pins` routes (0.5.6's
    /// `FleetEvictionController`; off with `--extra-config
    /// '{"disabled_controllers": ["FleetEvictionController"]}'`).
    pub eviction_controller: bool,
    /// `GET /metrics` (off with `--disable-metrics`).
    pub metrics: bool,
}

impl Default for Features {
    fn default() -> Self {
        Features {
            eviction_controller: true,
            metrics: true,
        }
    }
}

impl CoordinatorConfig {
    /// The documented defaults on `host:port`.
    pub fn with_defaults(host: impl Into<String>, port: u16) -> Self {
        use crate::config::defaults::coordinator as d;
        CoordinatorConfig {
            host: host.into(),
            port,
            instance_timeout: Duration::from_secs_f64(d::INSTANCE_TIMEOUT_S),
            health_check_interval: Some(Duration::from_secs_f64(d::HEALTH_CHECK_INTERVAL_S)),
            eviction_check_interval: Some(Duration::from_secs_f64(d::EVICTION_CHECK_INTERVAL_S)),
            timeout_keep_alive: Duration::from_secs(d::TIMEOUT_KEEP_ALIVE_S),
            chunk_size: d::CHUNK_SIZE,
            outbound_timeout: Duration::from_secs_f64(d::OUTBOUND_TIMEOUT_S),
            http: crate::web::HttpLimits {
                max_body_bytes: d::MAX_BODY_BYTES,
                max_body_items: d::MAX_BODY_ITEMS,
                max_connections: d::MAX_HTTP_CONNECTIONS,
                read_timeout: Duration::from_secs_f64(d::HTTP_READ_TIMEOUT_S),
            },
            max_events_per_request: d::MAX_EVENTS_PER_REQUEST,
            model: model::ModelConfig {
                max_instances: d::MAX_INSTANCES,
                max_tracked_keys: d::MAX_TRACKED_KEYS,
                max_quotas: d::MAX_QUOTAS,
                eviction_ratio: d::EVICTION_RATIO,
                trigger_watermark: d::TRIGGER_WATERMARK,
            },
            resync: Some(resync::ResyncConfig {
                poll_interval: Duration::from_secs_f64(d::RESYNC_POLL_INTERVAL_S),
                max_wait: Duration::from_secs_f64(d::RESYNC_MAX_WAIT_S),
                page_size: d::RESYNC_PAGE_SIZE,
            }),
            metadata_path: None,
            default_quota_gb: None,
            blend_probe_stride: None,
            checkpoint: None,
            features: Features::default(),
            auth: crate::web::access::Auth::default(),
            tap: None,
        }
    }
}

/// The running coordinator's state.
pub struct Coordinator {
    /// The bound HTTP address.
    pub addr: SocketAddr,
    /// The model's owner, for tests and embedding.
    pub handle: driver::Handle,
}

/// A running coordinator (`c.addr`, `c.handle` through `Deref`). Its stop stops the HTTP
/// server first and, with `--checkpoint-path`, writes a last checkpoint before the rest.
pub type CoordinatorServer = Running<Coordinator>;

/// The routes' shared state for `config` around an owner handle.
pub fn api_state(config: &CoordinatorConfig, handle: driver::Handle) -> Arc<api::ApiState> {
    state_with(config, handle, None)
}

fn state_with(
    config: &CoordinatorConfig,
    handle: driver::Handle,
    cluster: Option<Arc<crate::cluster::ClusterStatus>>,
) -> Arc<api::ApiState> {
    Arc::new_cyclic(|weak: &std::sync::Weak<api::ApiState>| api::ApiState {
        cluster,
        handle,
        chunk_size: config.chunk_size,
        outbound_timeout: config.outbound_timeout,
        http: config.http,
        max_events_per_request: config.max_events_per_request,
        refused: api_state::Refused::default(),
        metadata: metadata::Persister::new(config.metadata_path.clone()),
        checkpoint: config
            .checkpoint
            .clone()
            .map(|c| Arc::new(checkpoint::Checkpointer::new(c))),
        blend: config.blend_probe_stride.map(|s| (config.chunk_size, s)),
        features: config.features,
        auth: config.auth.clone(),
        http_metrics: Arc::new(crate::web::metrics_layer::HttpMetrics::standalone(
            "kvplane_coordinator_",
            config.http.max_body_bytes,
            limits::hook_of(weak.clone()),
        )),
    })
}

/// Binds the HTTP port and starts the owner task and the server.
///
/// # Errors
/// [`StartError::Bind`] if the port cannot be bound.
pub async fn start(config: CoordinatorConfig) -> Result<CoordinatorServer, StartError> {
    let bound = bind(&config).await?;
    let state = changes::CoordinatorState::new(initial_model(&config));
    Ok(serve(
        config,
        bound,
        state,
        None,
        CancellationToken::new(),
        TaskTracker::new(),
    ))
}

/// Binds the configured HTTP address (port 0 picks one).
pub(crate) async fn bind(
    config: &CoordinatorConfig,
) -> Result<(tokio::net::TcpListener, SocketAddr), StartError> {
    bind_tcp("http", &crate::net::host_port(&config.host, config.port)).await
}

/// A new model — the state of `--checkpoint-path` if there is one — with the quotas and
/// pins of `--metadata-path` (fresher than the checkpoint's) if there are any.
pub(crate) fn initial_model(config: &CoordinatorConfig) -> model::Model {
    let restored = config
        .checkpoint
        .as_ref()
        .and_then(|c| checkpoint_model(config, c));
    let mut model = match restored {
        Some(m) => m,
        None => {
            let mut model = model::Model::new(config.model.clone());
            if let Err(e) = model.set_default_limit(config.default_quota_gb) {
                // The flag is validated at startup; a value that still fails leaves salts
                // exempt.
                tracing::warn!(
                    "ignoring the default quota {:?}: {e}",
                    config.default_quota_gb
                );
            }
            model
        }
    };
    if let Some(path) = &config.metadata_path {
        match metadata::load_any(path) {
            Ok(None) => tracing::info!("no metadata at {}; starting empty", path.display()),
            Ok(Some(doc)) => {
                let flag = model.default_limit_gb();
                model.clear_metadata();
                let (quotas, pins) = model
                    .restore_metadata(doc, crate::config::defaults::coordinator::MAX_PINNED_KEYS);
                if model.default_limit_gb() != flag {
                    tracing::info!(
                        "default quota {:?} GiB from {} (the last PUT /quota/config) replaces {:?}",
                        model.default_limit_gb(),
                        path.display(),
                        flag
                    );
                }
                tracing::info!(quotas, pins, "restored metadata from {}", path.display());
            }
            Err(e) => tracing::warn!("ignoring the metadata file {}: {e}", path.display()),
        }
    }
    model
}

/// The model saved at `c.path`, if there is a readable one (otherwise logged: start cold).
fn checkpoint_model(
    config: &CoordinatorConfig,
    c: &checkpoint::CheckpointConfig,
) -> Option<model::Model> {
    let path = c.path.display();
    match checkpoint::load(&c.path, c.max_bytes) {
        Ok(None) => {
            tracing::info!("no checkpoint at {path}; starting cold");
            None
        }
        Ok(Some(doc)) => match model::Model::restore(config.model.clone(), doc.model) {
            Ok(m) => {
                tracing::info!(
                    keys = m.tracked_keys(),
                    directory_keys = m.directory.len(),
                    saved_at = doc.saved_at,
                    "restored the checkpoint {path}"
                );
                Some(m)
            }
            Err(e) => {
                tracing::warn!("ignoring the checkpoint {path}: {e}; starting cold");
                None
            }
        },
        Err(e) => {
            tracing::warn!("ignoring the checkpoint {path}: {e}; starting cold");
            None
        }
    }
}

/// A cluster leader's part in [`serve`].
pub(crate) struct Leading {
    /// Where every change is logged.
    pub(crate) log: Arc<logged::ChangeLog>,
    /// Reported on `/metrics`, `/coordinator/cluster` and the dashboard.
    pub(crate) status: Arc<crate::cluster::ClusterStatus>,
    /// Evictions are dispatched only while it holds.
    pub(crate) guard: Arc<crate::cluster::LeaseGuard>,
    /// Whether the startup resync runs (the followed state may be incomplete).
    pub(crate) resync: bool,
}

/// Starts the owners around `state`, the startup resync and the HTTP server on `bound`; as a
/// cluster's leader, logs the operator state first and then every change.
pub(crate) fn serve(
    config: CoordinatorConfig,
    (listener, bound): (tokio::net::TcpListener, SocketAddr),
    state: changes::CoordinatorState,
    leading: Option<Leading>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) -> CoordinatorServer {
    let mut state = state;
    if let Some(stride) = config.blend_probe_stride {
        state
            .model
            .directory
            .enable_blend(config.chunk_size, stride);
    }
    let restored_keys = state.model.tracked_keys() as u64;
    let timing = driver::Timing {
        instance_timeout: config.instance_timeout,
        health_check_interval: config.health_check_interval,
        // 0.5.6's FleetEvictionController runs the loop (`--extra-config` can disable it).
        eviction_check_interval: config
            .eviction_check_interval
            .filter(|_| config.features.eviction_controller),
    };
    let mut dispatcher = driver::http_dispatcher(config.outbound_timeout);
    if let Some(l) = &leading {
        dispatcher = cluster::fenced(
            dispatcher,
            Arc::clone(&l.guard),
            Arc::clone(l.status.dispatches_fenced()),
        );
    }
    let handle = driver::spawn_replica(
        state,
        leading.as_ref().map(|l| Arc::clone(&l.log)),
        config.tap.clone(),
        timing,
        dispatcher,
        shutdown.clone(),
        &tasks,
    );
    match (config.resync.clone(), &leading) {
        (Some(_), Some(l)) if !l.resync => tracing::info!(
            "startup resync skipped: the followed state holds every change since the cluster began"
        ),
        (Some(rc), leading) => {
            if let Some(l) = leading {
                l.status.resynced();
            }
            tasks.spawn(resync::run(
                handle.clone(),
                rc,
                config.model.max_tracked_keys,
                config.outbound_timeout,
                shutdown.clone(),
            ));
        }
        (None, _) => {}
    }
    let state = state_with(
        &config,
        handle.clone(),
        leading.as_ref().map(|l| Arc::clone(&l.status)),
    );
    if leading.is_some() {
        // The file follows the state this leader took over; every METADATA_EVERY the whole
        // operator state is logged again, for standbys that joined after the stream dropped
        // the records that set it.
        let (st, h, stop) = (Arc::clone(&state), handle.clone(), shutdown.clone());
        tasks.spawn(async move {
            st.metadata.save(h.metadata()).await;
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(cluster::METADATA_EVERY) => {}
                }
                if h.log_metadata().await.is_err() {
                    return;
                }
            }
        });
    }
    if let Some(c) = &state.checkpoint {
        if c.config().path.exists() {
            c.restored_keys
                .store(restored_keys, std::sync::atomic::Ordering::Relaxed);
        }
        if let Some(every) = c.config().interval {
            let (c, h, stop) = (Arc::clone(c), handle.clone(), shutdown.clone());
            tasks.spawn(async move {
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(every) => {}
                    }
                    c.write(h.checkpoint_doc()).await;
                }
            });
        }
    }
    let http_stop = shutdown.child_token();
    let served = crate::web::serve(
        listener,
        api::router(Arc::clone(&state)),
        config.http,
        crate::web::limits::counting_hook("coordinator", limits::refusals(&state)),
        http_stop.clone(),
    );
    tasks.spawn(async move {
        if let Err(e) = served.await {
            tracing::error!("coordinator HTTP server failed: {e}");
        }
    });
    tracing::info!("MP coordinator listening on http://{bound}");
    let checkpoint = state.checkpoint.clone();
    let last = handle.clone();
    Running::new(
        "coordinator",
        Coordinator {
            addr: bound,
            handle,
        },
        shutdown,
        tasks,
    )
    .with_addr("http", bound)
    .before_cancel(move || async move {
        // The HTTP server stops alone first, then the last checkpoint is written; a cluster
        // leader's publisher ends once every owner handle is gone (after sending what its
        // log queued), which the stop's drop of the state and of `last` brings.
        http_stop.cancel();
        if let Some(c) = checkpoint {
            c.write(last.checkpoint_doc()).await;
            tracing::info!(
                "checkpoint written to {} at stop",
                c.config().path.display()
            );
        }
    })
}
