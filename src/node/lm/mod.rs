//! The LMCache protocol listener: the accept loop with its connection cap, which hands each
//! connection to a runtime task or to a thread of its own (`threads`), both running
//! [`connection`]'s loop.

pub(crate) mod arena;
pub(crate) mod buffers;
pub(crate) mod connection;
mod threads;

use crate::node::config::{ConnectionModel, NodeConfig};
use crate::node::metrics::NodeMetrics;
use crate::node::tiers::TieredStore;
use crate::service::StartError;
use connection::{serve_connection, ConnContext, OpenConnection};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Accepts until `shutdown`; a connection beyond `max_connections` is closed at once. Each
/// connection is served as `model` says.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    ctx: Arc<ConnContext>,
    model: ConnectionModel,
    max_connections: usize,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) {
    let slots = Arc::new(Semaphore::new(max_connections));
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            ctx.metrics.connections_refused.inc();
            drop(stream);
            continue;
        };
        ctx.metrics.connections_total.inc();
        ctx.metrics.connections_open.inc();
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%peer, "cannot set TCP_NODELAY: {e}");
        }
        let open = OpenConnection::new(Arc::clone(&ctx), permit, tasks.token());
        let (ctx, shutdown) = (Arc::clone(&ctx), shutdown.clone());
        match model {
            ConnectionModel::Tasks => {
                tasks.spawn(async move {
                    let mut stream = stream;
                    tokio::select! {
                        () = shutdown.cancelled() => {}
                        () = serve_connection(&mut stream, &ctx) => {}
                    }
                    drop(open);
                });
            }
            ConnectionModel::Threads => {
                if let Err(e) = threads::spawn(stream, ctx, shutdown, open) {
                    tracing::warn!(%peer, "cannot start a connection thread: {e}");
                }
            }
        }
    }
}

/// `--l1-preallocate`: maps `bytes` and faults them in on a blocking thread, after checking
/// them against the memory the system has available (a preallocation the kernel cannot back
/// would only move the failure to the OOM killer).
pub(crate) async fn preallocate(
    bytes: u64,
    metrics: &NodeMetrics,
) -> Result<Option<arena::Arena>, StartError> {
    if bytes == 0 {
        return Ok(None);
    }
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    if let Some(available) = arena::available_memory() {
        if bytes > available {
            return Err(StartError::Config(format!(
                "--l1-preallocate {:.2} GiB is more than the {:.2} GiB of memory available \
                 (MemAvailable in /proc/meminfo); lower it or --l1-size-gb",
                gib(bytes),
                gib(available)
            )));
        }
    }
    let started = std::time::Instant::now();
    let arena = tokio::task::spawn_blocking(move || arena::Arena::populate(bytes))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
        .map_err(|e| {
            StartError::resource(
                format!("preallocate {:.2} GiB of L1 (--l1-preallocate)", gib(bytes)),
                e,
            )
        })?;
    metrics.l1_preallocated_bytes.set(arena.len() as i64);
    tracing::info!(
        bytes = arena.len(),
        seconds = started.elapsed().as_secs_f64(),
        "L1 preallocated and faulted in"
    );
    Ok(Some(arena))
}

/// Serves `lm://` on `listener` until `shutdown`: connections on `tasks`, bodies carved from
/// `preallocation` while it lasts.
pub(crate) fn serve(
    listener: TcpListener,
    config: &NodeConfig,
    tiers: Arc<TieredStore>,
    metrics: Arc<NodeMetrics>,
    preallocation: Option<arena::Arena>,
    shutdown: &CancellationToken,
    tasks: &TaskTracker,
) {
    let ctx = Arc::new(ConnContext {
        tiers,
        metrics: Arc::clone(&metrics),
        max_object_bytes: config.max_object_bytes,
        read_timeout: config.read_timeout,
        max_list_bytes: config.max_list_bytes,
        bodies: buffers::BodyPool::new(
            buffers::PoolGauges {
                spare: metrics.body_pool_spare_bytes.clone(),
                preallocated_unused: metrics.l1_preallocated_unused_bytes.clone(),
                sources: metrics.body_buffers.clone(),
            },
            preallocation,
        ),
    });
    tasks.spawn(accept_loop(
        listener,
        ctx,
        config.connection_model,
        config.max_connections,
        shutdown.clone(),
        tasks.clone(),
    ));
}
