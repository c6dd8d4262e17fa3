//! # kvplane
//!
//! A control plane for distributed LLM KV caches, wire-compatible with the LMCache 0.5.6
//! controller: a real LMCache worker pointed at `kvplane serve` works unchanged.
//!
//! ## Layout
//!
//! Read the modules in this order; dependencies point one way, down this list:
//!
//! - [`protocol`] — the 51 LMCache message types, msgspec-identical encoding, tolerant
//!   decoding, [`protocol::ChunkHash`] (the whole `i64 ∪ u64` range). Pure.
//! - [`index`] — the registry (instance → worker → location) and the one reverse index
//!   chunk hash → holders, with the sequence check and the full-sync tracker. Pure and
//!   synchronous: tested without a runtime.
//! - [`transport`] — the only code that touches the `zeromq` crate: PULL, ROUTER and REQ
//!   wrappers with timeouts, fresh sockets after failures.
//! - [`controller`] — the controller's state as a plain model (`Fleet`: index, downlink
//!   registry, command log; one function per message returning the effects to perform), its
//!   driver (`Shared`: one lock over the model and the live downlink tasks), its HTTP routes
//!   and the async tasks: the PULL loop, the two ROUTER loops, one downlink per worker, the
//!   liveness sweep.
//! - [`web`] — HTTP plumbing shared by every service (errors, body schemas, auth, the CSRF
//!   guard, request metrics, static assets, the server loop and its limits). Knows no service.
//! - [`coordinator`] — `kvplane coordinator`, the LMCache MP coordinator (fleet membership,
//!   quotas, usage events, eviction, warm prefetch): a pure model driven by one task, its
//!   axum routes and its calls to MP servers (see docs/COORDINATOR.md).
//! - [`config`] — the `kvplane serve` flags, each also read from `KVPLANE_<FLAG>`.
//! - [`metrics`] — every metric name and help text, in one place.
//! - [`bench`] — `kvplane bench`, a load generator for any LMCache-compatible controller
//!   (protocol + transport only).
//! - [`indexer`] — `kvplane indexer`, the router-facing KV indexer (docs/INDEXER.md): a pure
//!   model (standard XXH3 hashing, vLLM/SGLang/Mooncake event decoding, the prefix index,
//!   replay state machine) and `indexer::service` (publisher tasks, HTTP API).
//! - [`node`] — `kvplane node`, a cache node speaking LMCache 0.5.6's `lm://` server
//!   protocol with L1 memory and L2 disk tiers (see docs/NODE.md).
//! - [`router`] — `kvplane router`, the cache-aware OpenAI-compatible router in front of
//!   vLLM/SGLang engines (see docs/ROUTER.md); it runs the indexer's index in process.
//! - [`worker`] — the library workers link to join a kvplane or LMCache controller
//!   (protocol + transport only; see docs/WORKER.md).
//!
//! [`start`] binds every socket and returns a [`Server`] with the bound addresses (port 0
//! works everywhere); [`run`] serves until a cancellation token fires.

// Below everything: wire types, sockets, configuration. The worker library needs only these.
pub mod config;
#[cfg(feature = "worker")]
mod net;
pub mod protocol;
pub mod transport;
#[cfg(feature = "worker")]
pub mod worker;

// The server side (feature `server`, on by default).
#[cfg(feature = "server")]
pub mod bench;
#[cfg(feature = "server")]
pub mod cluster;
#[cfg(feature = "server")]
pub mod controller;
#[cfg(feature = "server")]
pub mod coordinator;
#[cfg(feature = "server")]
pub mod index;
#[cfg(feature = "server")]
pub mod indexer;
#[cfg(feature = "server")]
pub mod memory;
#[cfg(feature = "server")]
pub mod metrics;
#[cfg(feature = "server")]
pub mod node;
#[cfg(feature = "server")]
pub mod router;
#[cfg(feature = "server")]
pub mod web;

#[cfg(feature = "server")]
use config::ServeConfig;
#[cfg(feature = "server")]
use controller::{loops, BoundAddrs, Clock, RouterKind, Shared};
#[cfg(feature = "server")]
use net::host_port;
#[cfg(feature = "server")]
use std::sync::Arc;
#[cfg(feature = "server")]
use std::time::Duration;
#[cfg(feature = "server")]
use thiserror::Error;
#[cfg(feature = "server")]
use tokio_util::sync::{CancellationToken, DropGuard};
#[cfg(feature = "server")]
use tokio_util::task::TaskTracker;

#[cfg(feature = "server")]
/// How long shutdown waits for tasks to drain before giving up on them.
const DRAIN_DEADLINE: Duration = Duration::from_secs(5);

#[cfg(feature = "server")]
/// Why the server could not start.
#[derive(Debug, Error)]
pub enum StartError {
    /// A ZMQ socket could not be bound.
    #[error("cannot bind the {socket} socket on {addr}: {source}")]
    Zmq {
        /// Which socket.
        socket: &'static str,
        /// The address tried.
        addr: String,
        /// The transport error.
        source: transport::TransportError,
    },
    /// `--cluster`: NATS unreachable, the takeover failed, or the lease was lost.
    #[error("{0}")]
    Cluster(String),
    /// The HTTP port could not be bound.
    #[error("cannot bind the HTTP server on {addr}: {source}")]
    Http {
        /// The address tried.
        addr: String,
        /// The IO error.
        source: std::io::Error,
    },
}

#[cfg(feature = "server")]
/// A running kvplane server. Dropping it without [`Server::stop`] cancels every task (without
/// waiting for them).
pub struct Server {
    /// The addresses actually bound.
    pub addrs: BoundAddrs,
    /// The controller's state and its driver, for tests and embedding.
    pub shared: Arc<Shared>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    _cancel_on_drop: DropGuard,
}

#[cfg(feature = "server")]
impl Server {
    /// Stops every loop and waits (at most a few seconds) for them to finish.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.tasks.close();
        if tokio::time::timeout(DRAIN_DEADLINE, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("some tasks did not stop within {DRAIN_DEADLINE:?}");
        }
    }
}

#[cfg(feature = "server")]
/// Binds every socket and starts serving, on the system clock.
///
/// # Errors
/// [`StartError`] if a socket cannot be bound.
pub async fn start(config: ServeConfig) -> Result<Server, StartError> {
    start_with_clock(config, Clock::system()).await
}

#[cfg(feature = "server")]
/// Binds every socket and starts serving; every time the controller reads comes from `clock`.
///
/// # Errors
/// [`StartError`] if a socket cannot be bound.
pub async fn start_with_clock(config: ServeConfig, clock: Clock) -> Result<Server, StartError> {
    serve_shared(Arc::new(Shared::with_clock(config, None, clock))).await
}

#[cfg(feature = "server")]
/// Binds every socket of `shared`'s configuration and starts serving its state (a standby
/// taking over serves the state it followed).
///
/// # Errors
/// [`StartError`] if a socket cannot be bound.
pub async fn serve_shared(shared: Arc<Shared>) -> Result<Server, StartError> {
    let config = &shared.config;
    let ports = config.monitor_ports;
    let zmq_addr = |port: u16| host_port(&config.host, port);
    let peer_drops = &shared.peer_drops;
    let limits = |stats: &Arc<transport::TransportStats>| transport::TransportLimits {
        max_connections: Some(config.max_zmq_connections),
        idle_timeout: config.zmq_idle_timeout,
        stats: Some(Arc::clone(stats)),
        ..transport::TransportLimits::with_max_frame_bytes(config.max_frame_bytes)
    };

    let pull = match ports.pull {
        Some(port) => {
            let addr = zmq_addr(port);
            let bound = transport::PullListener::bind_with(&addr, &limits(&peer_drops.pull))
                .await
                .map_err(|source| StartError::Zmq {
                    socket: "pull",
                    addr,
                    source,
                })?;
            Some(bound)
        }
        None => None,
    };
    let mut routers = Vec::new();
    for (kind, port) in [
        (RouterKind::Reply, ports.reply),
        (RouterKind::Heartbeat, ports.heartbeat),
    ] {
        if let Some(port) = port {
            let addr = zmq_addr(port);
            let stats = match kind {
                RouterKind::Reply => &peer_drops.reply,
                RouterKind::Heartbeat => &peer_drops.heartbeat,
            };
            let bound = transport::RouterListener::bind_with(&addr, &limits(stats))
                .await
                .map_err(|source| StartError::Zmq {
                    socket: kind.label(),
                    addr,
                    source,
                })?;
            routers.push((kind, bound));
        }
    }
    let http_addr = host_port(&config.host, config.http_port);
    let listener = tokio::net::TcpListener::bind(&http_addr)
        .await
        .map_err(|source| StartError::Http {
            addr: http_addr.clone(),
            source,
        })?;
    let http = listener.local_addr().map_err(|source| StartError::Http {
        addr: http_addr,
        source,
    })?;

    let addr_of = |kind| {
        routers
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, (_, a))| *a)
    };
    let addrs = BoundAddrs {
        http,
        pull: pull.as_ref().map(|(_, a)| *a),
        reply: addr_of(RouterKind::Reply),
        heartbeat: addr_of(RouterKind::Heartbeat),
    };
    let health_interval = config.health_check_interval;
    if let Some(a) = addrs.heartbeat {
        shared.set_heartbeat_port(a.port());
    }
    let shutdown = shared.shutdown_token().clone();
    let tasks = shared.tasks().clone();

    if let Some((socket, _)) = pull {
        tasks.spawn(loops::pull_loop(
            Arc::clone(&shared),
            socket,
            shutdown.clone(),
        ));
    }
    for (kind, (socket, _)) in routers {
        tasks.spawn(loops::router_loop(
            Arc::clone(&shared),
            socket,
            kind,
            shutdown.clone(),
        ));
    }
    if let Some(interval) = health_interval {
        tasks.spawn(controller::liveness::liveness_loop(
            Arc::clone(&shared),
            interval,
            shutdown.clone(),
        ));
    }
    let history = Arc::new(controller::routes::history::History::default());
    tasks.spawn(controller::routes::history::sample_loop(
        Arc::clone(&shared),
        Arc::clone(&history),
        shutdown.clone(),
    ));
    let app = controller::routes::router_with(Arc::clone(&shared), history);
    let served = web::serve(
        listener,
        app,
        controller::routes::http_limits(&shared),
        controller::routes::limit_hook(&shared),
        shutdown.clone(),
    );
    tasks.spawn(async move {
        if let Err(e) = served.await {
            tracing::error!("HTTP server failed: {e}");
        }
    });
    tracing::info!(
        http = %addrs.http,
        pull = ?addrs.pull,
        reply = ?addrs.reply,
        heartbeat = ?addrs.heartbeat,
        "kvplane controller listening"
    );
    if addrs.heartbeat.is_none() && !shared.cluster().is_some_and(|c| c.is_replica()) {
        tracing::warn!("no heartbeat port configured: LMCache workers will not heartbeat");
    }
    controller::routes::log_policy(&shared);
    Ok(Server {
        addrs,
        shared,
        _cancel_on_drop: shutdown.clone().drop_guard(),
        shutdown,
        tasks,
    })
}

#[cfg(feature = "server")]
/// Serves until `shutdown` is cancelled, then drains.
///
/// # Errors
/// [`StartError`] if a socket cannot be bound.
pub async fn run(config: ServeConfig, shutdown: CancellationToken) -> Result<(), StartError> {
    let server = start(config).await?;
    shutdown.cancelled().await;
    tracing::info!("shutting down");
    server.stop().await;
    Ok(())
}

#[cfg(feature = "server")]
/// A controller that took the cluster's lease (`--cluster`), not yet serving: see
/// [`standby`] and [`run_leader`].
pub struct Leadership {
    shared: Arc<Shared>,
    standby: controller::cluster::Standby,
    lease: cluster::Lease,
}

#[cfg(feature = "server")]
/// Runs a controller as a hot standby of its cluster (docs/CLUSTER.md): follows the leader's
/// change log without binding any port, and returns once it holds the lease and the state
/// the old leader published. `None` if `shutdown` comes first.
///
/// # Errors
/// [`StartError::Cluster`] when NATS cannot be reached (a takeover that fails is retried).
pub async fn standby(
    config: ServeConfig,
    cluster: cluster::ClusterConfig,
    shutdown: &CancellationToken,
) -> Result<Option<Leadership>, StartError> {
    let shared = Arc::new(Shared::new(config, None));
    let stop = shared.shutdown_token().clone();
    // Any error below stops the tasks started so far.
    let stop_on_error = stop.clone().drop_guard();
    let standby = controller::cluster::Standby::join(cluster, &shared, false)
        .await
        .map_err(|e| StartError::Cluster(e.to_string()))?;
    let Some(lease) = standby.take_over(&shared, shutdown).await else {
        stop.cancel();
        shared.tasks().close();
        let _ = tokio::time::timeout(DRAIN_DEADLINE, shared.tasks().wait()).await;
        return Ok(None);
    };
    stop_on_error.disarm();
    Ok(Some(Leadership {
        shared,
        standby,
        lease,
    }))
}

#[cfg(feature = "server")]
/// Serves as the cluster's leader until `shutdown` (the lease is released) or until the lease
/// is lost (an error: the process must stop; restarted, it is a standby). Binding is retried
/// while the lease holds, for a deposed leader that still holds the ports.
///
/// # Errors
/// [`StartError::Cluster`] when the lease is lost.
pub async fn run_leader(
    leadership: Leadership,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    let Leadership {
        shared,
        standby,
        lease,
    } = leadership;
    let hold = standby.hold(lease, &shutdown);
    tokio::pin!(hold);
    let bind = async {
        loop {
            match serve_shared(Arc::clone(&shared)).await {
                Ok(server) => return server,
                Err(e) => {
                    tracing::warn!("leader cannot bind yet ({e}); retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    };
    let server = tokio::select! {
        server = bind => server,
        held = &mut hold => {
            shared.shutdown_token().cancel();
            return held.map_err(StartError::Cluster);
        }
    };
    let held = hold.await;
    if held.is_err() {
        tracing::error!("the controller lease was lost: stopping at once");
        shutdown.cancel();
    } else {
        tracing::info!("shutting down");
    }
    server.stop().await;
    held.map_err(StartError::Cluster)
}

#[cfg(feature = "server")]
/// Runs a read replica of the cluster's controller (`serve --cluster --replica`,
/// docs/CLUSTER.md): follows the leader's change log and serves the read routes
/// (`/lookup`, `/query_worker_info`, `/controller/*`, the dashboard) on its own HTTP port,
/// binding no ZMQ socket and never taking the lease. Commands answer 409. Until `shutdown`.
///
/// # Errors
/// [`StartError::Cluster`] when NATS cannot be reached; [`StartError::Http`] when the port
/// cannot be bound.
pub async fn run_replica(
    mut config: ServeConfig,
    cluster: cluster::ClusterConfig,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    config.monitor_ports = config::MonitorPorts {
        pull: None,
        reply: None,
        heartbeat: None,
    };
    config.health_check_interval = None;
    let shared = Arc::new(Shared::new(config, None));
    let stop_on_error = shared.shutdown_token().clone().drop_guard();
    let _standby = controller::cluster::Standby::join(cluster, &shared, true)
        .await
        .map_err(|e| StartError::Cluster(e.to_string()))?;
    let server = serve_shared(shared).await?;
    stop_on_error.disarm();
    shutdown.cancelled().await;
    tracing::info!("shutting down");
    server.stop().await;
    Ok(())
}
