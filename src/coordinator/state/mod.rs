//! The coordinator's state and who owns it: the pure model ([`crate::coordinator::model`])
//! held by its owners, persisted, replicated and seeded. `serve` (this file) starts the
//! owners, the startup resync and the HTTP server around a state.
//!
//! - [`driver`] — the two owner tasks (the key model, the fleet): read jobs, the sweep and
//!   eviction loops; dispatches spawned with timeouts.
//! - `logged` — the state as the owners hold it (`logged::Keys`, `logged::Members`):
//!   read freely, changed only through methods that log the change on a cluster's leader.
//! - `writes` — every state change as one [`driver::Handle`] method, a job running the
//!   owner's logged method.
//! - `changes` — `--cluster`: the change log's records (the inputs the leader applied, with
//!   its `now`) and the `changes::CoordinatorState` a standby applies them to (the
//!   replication core's `Replicated` state); `snapshot` its dump.
//! - [`metadata`] — `--metadata-path`: quotas and pins saved after each change, loaded at
//!   start (kvplane's file or LMCache 0.5.6's); `files` the atomic file writer.
//! - `checkpoint` — `--checkpoint-path`: the model's dump written periodically and at a
//!   clean stop, restored at start.
//! - [`resync`] — the startup resync over a server's `GET /cache/objects`.
//! - [`outbound`] — HTTP calls to MP servers, bounded in time and size.
//! - [`tap`] — the hook that sees every applied batch (`kvplane serve` feeds its indexer).
//! - [`api_state`] — what the routes, the metrics and the dashboard share.

pub mod api_state;
pub(crate) mod changes;
pub(crate) mod checkpoint;
pub mod driver;
pub(crate) mod files;
pub(crate) mod logged;
pub mod metadata;
pub mod outbound;
pub mod resync;
pub(crate) mod snapshot;
pub mod tap;
pub(crate) mod writes;

use crate::coordinator::{
    cluster, model, routes, Coordinator, CoordinatorConfig, CoordinatorServer,
};
use crate::service::{bind_tcp, Running, StartError};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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
    let state = api_state::ApiState::new(
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
        routes::router(Arc::clone(&state)),
        config.http,
        crate::web::limits::counting_hook("coordinator", routes::limits::refusals(&state)),
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
