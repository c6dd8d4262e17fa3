//! Starting the controller (`kvplane serve`): bind its ZMQ sockets and HTTP port and spawn
//! its loops ([`start`], [`serve_shared`]), or with `--cluster` follow as a standby until
//! the lease is held ([`standby`], [`run_leader`]) or serve reads as a replica
//! ([`run_replica`]). Every path returns or runs a [`crate::service::Running`].
//!
//! Owns no state of its own: the state is [`Driver`]; the loops are in `loops`, `liveness`,
//! `routes`.

use super::{loops, BoundAddrs, Clock, Driver, RouterKind};
use crate::config::{MonitorPorts, ServeConfig};
use crate::net::host_port;
use crate::service::{bind_tcp, Running, StartError};
use crate::transport;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The running controller's state: its bound addresses and its driver.
pub struct Controller {
    /// The addresses actually bound.
    pub addrs: BoundAddrs,
    /// The controller's state and its driver, for tests and embedding.
    pub shared: Arc<Driver>,
}

/// A running controller (`server.addrs`, `server.shared` through `Deref`).
pub type Server = Running<Controller>;

/// Binds every socket and starts serving, on the system clock.
///
/// # Errors
/// [`StartError::Bind`] if a socket cannot be bound.
pub async fn start(config: ServeConfig) -> Result<Server, StartError> {
    start_with_clock(config, Clock::system()).await
}

/// Binds every socket and starts serving; every time the controller reads comes from `clock`.
///
/// # Errors
/// [`StartError::Bind`] if a socket cannot be bound.
pub async fn start_with_clock(config: ServeConfig, clock: Clock) -> Result<Server, StartError> {
    serve_shared(Arc::new(Driver::with_clock(config, None, clock))).await
}

/// Binds every socket of `shared`'s configuration and starts serving its state (a standby
/// taking over serves the state it followed).
///
/// # Errors
/// [`StartError::Bind`] if a socket cannot be bound.
pub async fn serve_shared(shared: Arc<Driver>) -> Result<Server, StartError> {
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
                .map_err(|e| StartError::bind("pull", addr, e))?;
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
                .map_err(|e| StartError::bind(kind.label(), addr, e))?;
            routers.push((kind, bound));
        }
    }
    let (listener, http) = bind_tcp("http", &host_port(&config.host, config.http_port)).await?;

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
        tasks.spawn(super::liveness::liveness_loop(
            Arc::clone(&shared),
            interval,
            shutdown.clone(),
        ));
    }
    let app = super::routes::serving_router(Arc::clone(&shared));
    let served = crate::web::serve(
        listener,
        app,
        super::routes::http_limits(&shared),
        super::routes::limit_hook(&shared),
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
    super::routes::log_policy(&shared);
    let mut running = Running::new(
        "controller",
        Controller {
            addrs,
            shared: Arc::clone(&shared),
        },
        shutdown,
        tasks,
    )
    .with_addr("http", addrs.http);
    for (what, addr) in [
        ("pull", addrs.pull),
        ("reply", addrs.reply),
        ("heartbeat", addrs.heartbeat),
    ] {
        if let Some(a) = addr {
            running = running.with_addr(what, a);
        }
    }
    Ok(running)
}

/// A controller that took the cluster's lease (`--cluster`), not yet serving: see
/// [`standby`] and [`run_leader`].
pub struct Leadership {
    shared: Arc<Driver>,
    elected: crate::cluster::Elected<super::model::ControllerState>,
}

/// Runs a controller as a hot standby of its cluster (docs/CLUSTER.md): follows the leader's
/// change log without binding any port, and returns once it holds the lease and the state
/// the old leader published. `None` if `shutdown` comes first.
///
/// # Errors
/// [`StartError::Cluster`] when NATS cannot be reached (a takeover that fails is retried).
pub async fn standby(
    config: ServeConfig,
    cluster: crate::cluster::ClusterConfig,
    shutdown: &CancellationToken,
) -> Result<Option<Leadership>, StartError> {
    let shared = Arc::new(Driver::new(config, None));
    let candidate = super::cluster::standby(cluster, &shared)
        .await
        .map_err(|e| StartError::Cluster(e.to_string()))?;
    let elected = super::cluster::take_over(candidate, &shared, shutdown).await;
    Ok(elected.map(|elected| Leadership { shared, elected }))
}

/// Serves as the cluster's leader until `shutdown` (serving stops, then the lease is
/// released) or until the lease is lost (an error: the process must stop; restarted, it is a
/// standby), on the cluster's one leader loop ([`crate::cluster::Elected::lead`]): binding is
/// retried while the lease holds, for a deposed leader that still holds the ports.
///
/// # Errors
/// [`StartError::Cluster`] when the lease is lost.
pub async fn run_leader(
    leadership: Leadership,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    let Leadership { shared, elected } = leadership;
    elected
        .lead(super::cluster::Binds(shared), &shutdown)
        .await
        .map_err(StartError::Cluster)
}

/// Runs a read replica of the cluster's controller (`serve --cluster --replica`,
/// docs/CLUSTER.md): follows the leader's change log and serves the read routes
/// (`/lookup`, `/query_worker_info`, `/controller/*`, the dashboard) on its own HTTP port,
/// binding no ZMQ socket and never taking the lease. Commands answer 409. Until `shutdown`.
///
/// # Errors
/// [`StartError::Cluster`] when NATS cannot be reached; [`StartError::Bind`] when the port
/// cannot be bound.
pub async fn run_replica(
    mut config: ServeConfig,
    cluster: crate::cluster::ClusterConfig,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    config.monitor_ports = MonitorPorts {
        pull: None,
        reply: None,
        heartbeat: None,
    };
    config.health_check_interval = None;
    let shared = Arc::new(Driver::new(config, None));
    let stop_on_error = shared.shutdown_token().clone().drop_guard();
    let _replica = super::cluster::replica(cluster, &shared)
        .await
        .map_err(|e| StartError::Cluster(e.to_string()))?;
    let server = serve_shared(shared).await?;
    stop_on_error.disarm();
    server.serve_until(shutdown).await;
    Ok(())
}
