//! `kvplane router` (issue 23, docs/ROUTER.md): an OpenAI-compatible front in front of N
//! vLLM or SGLang engines that sends each request to the engine holding the most of its
//! prompt's KV cache, weighed against the load it tracks.
//!
//! Flags and their validated form: [`config`]. Pure: [`score`] (the decision) and
//! [`accounting`] (predicted against delivered cached tokens). Driver: [`state`] (engines and their load, the in-process index, the tokenizer,
//! reservations), [`tokenize`] (tokenizer.json and the chat template), [`upstream`] (engine
//! calls with timeouts). Routes: [`routes`]. The index is the indexer's own
//! ([`crate::indexer`]), run in process and fed by the engines' KV events.

pub mod accounting;
pub mod config;
pub mod discovery;
pub mod doctor;
mod metrics;
pub mod routes;
pub mod score;
pub mod scrape;
pub mod sessions;
pub mod shared;
pub mod slots;
pub mod state;
pub mod tokenize;
pub mod upstream;

use crate::indexer::api::Registration;
use crate::indexer::IndexerConfig;
use crate::service::{bind_tcp, Running, StartError};
use state::RouterState;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::{EngineSpec, RouterArgs, RouterConfig};

/// The running router's state.
pub struct Router {
    /// The bound HTTP address.
    pub addr: SocketAddr,
    /// The in-process indexer's HTTP address.
    pub indexer_addr: SocketAddr,
    /// The shared state.
    pub state: Arc<RouterState>,
}

/// A running router (`server.addr`, `server.state` through `Deref`); stopping it stops the
/// in-process indexer after the router's own tasks.
pub type RouterServer = Running<Router>;

/// Starts the in-process indexer (on 127.0.0.1, `--indexer-port`), then the router over its
/// index ([`start_beside`]); stopping the router stops that indexer after the router's own
/// tasks.
///
/// # Errors
/// [`StartError`]: a port cannot be bound, the model directory cannot be loaded, an
/// engine's publisher cannot be registered.
pub async fn start(config: RouterConfig) -> Result<RouterServer, StartError> {
    let index = crate::indexer::index::IndexConfig {
        seed: config.hash_seed,
        ..Default::default()
    };
    let indexer = crate::indexer::start(IndexerConfig {
        host: "127.0.0.1".into(),
        port: config.indexer_port,
        index,
        ..IndexerConfig::default()
    })
    .await?;
    match launch(config, Arc::clone(&indexer.state), indexer.addr).await {
        Ok(router) => Ok(router.after_drain(move || indexer.stop())),
        Err(e) => {
            indexer.stop().await;
            Err(e)
        }
    }
}

/// Starts the router over an indexer that runs beside it in this process (`kvplane serve
/// --router-port` with `--indexer-port`), at `index_addr`: the router asks its index directly,
/// registers `--engine`'s publishers there, and hashes with its seed. Stopping the router
/// leaves the indexer running.
///
/// # Errors
/// As [`start`].
pub async fn start_beside(
    mut config: RouterConfig,
    index: Arc<crate::indexer::IndexerState>,
    index_addr: SocketAddr,
) -> Result<RouterServer, StartError> {
    config.hash_seed = index.hash_seed();
    launch(config, index, index_addr).await
}

/// Loads the tokenizer, registers every engine's publisher in `index`, binds the HTTP port
/// and starts the health probes, the scrapes and the discovery.
async fn launch(
    config: RouterConfig,
    index: Arc<crate::indexer::IndexerState>,
    index_addr: SocketAddr,
) -> Result<RouterServer, StartError> {
    let tokenizer = match &config.model_dir {
        Some(dir) => Some(
            tokenize::ModelTokenizer::load(dir)
                .map_err(|e| StartError::resource("load the model directory", e))?,
        ),
        None => None,
    };
    for e in &config.engines {
        let Some(events) = &e.events else { continue };
        let reg = Registration {
            endpoint: events.clone(),
            replay_endpoint: e.replay.clone(),
            kind: e.kind,
            model: config.model.clone(),
            lora: String::new(),
            tenant: config.tenant.clone(),
            instance: e.instance.clone(),
            block_size: config.block_size,
            dp_rank: e.dp_rank,
            salt: String::new(),
            lmcache: Vec::new(),
            http: Some(e.url.clone()),
            backends: Vec::new(),
        };
        index
            .register(reg)
            .map_err(|err| StartError::Config(format!("--engine {}: {err}", e.instance)))?;
    }
    let (listener, bound) = bind_tcp("http", &format!("{}:{}", config.host, config.port)).await?;
    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    let metrics = metrics::RouterMetrics::default();
    let shared = match &config.cluster {
        Some(cluster) => {
            let instances: Vec<String> =
                config.engines.iter().map(|e| e.instance.clone()).collect();
            let joined = shared::Shared::start(
                cluster.clone(),
                &instances,
                config.reservation_ttl,
                metrics.shared.clone(),
                &shutdown,
                &tasks,
            )
            .await;
            match joined {
                Ok(s) => Some(s),
                Err(e) => {
                    shutdown.cancel();
                    tasks.close();
                    tasks.wait().await;
                    return Err(StartError::resource("join --cluster", e));
                }
            }
        }
        None => None,
    };
    let state = Arc::new(RouterState::new(config, index, tokenizer, shared, metrics));
    // The engines registered by then are routed to from the first request.
    let mut mirrored = std::collections::BTreeMap::new();
    discovery::pass(&state, &mut mirrored).await;
    tasks.spawn(discovery::discovery_loop(
        Arc::clone(&state),
        mirrored,
        shutdown.clone(),
    ));
    tasks.spawn(health_loop(Arc::clone(&state), shutdown.clone()));
    tasks.spawn(scrape::scrape_loop(Arc::clone(&state), shutdown.clone()));
    let count = {
        let st = Arc::clone(&state);
        Arc::new(move |limit: crate::web::limits::WebLimit| {
            st.metrics
                .limits_hit
                .with_label_values(&[limit.label()])
                .inc();
        }) as crate::web::limits::RefusalCounter
    };
    let limits = crate::web::HttpLimits {
        max_body_bytes: state.config.max_body_bytes,
        max_body_items: usize::MAX,
        max_connections: state.config.max_http_connections,
        // Clients of a router wait on long generations between requests; the read timeout
        // covers sending a request, not waiting for the answer.
        read_timeout: Duration::from_secs(30),
    };
    let stack = crate::web::stack::Stack {
        policy: Arc::new(routes::policy(state.config.auth.clone())),
        limits,
        metrics: Arc::new(crate::web::metrics_layer::HttpMetrics::standalone(
            "kvplane_router_",
            limits.max_body_bytes,
            crate::web::limits::counting_hook("router", Arc::clone(&count)),
        )),
        // OpenAI clients always send JSON; only the doctor is a write.
        guard: crate::web::stack::Guard::JsonWrites,
        style: crate::web::json::ErrorStyle::FastApi,
    };
    stack.policy.log();
    let app = routes::router(Arc::clone(&state), &stack);
    let served = crate::web::serve(
        listener,
        app,
        limits,
        crate::web::limits::counting_hook("router", count),
        shutdown.clone(),
    );
    tasks.spawn(async move {
        if let Err(e) = served.await {
            tracing::error!("router HTTP server failed: {e}");
        }
    });
    tracing::info!(http = %bound, indexer = %index_addr, engines = state.engines().len(), "kvplane router listening");
    let indexer_addr = index_addr;
    Ok(Running::new(
        "router",
        Router {
            addr: bound,
            indexer_addr,
            state,
        },
        shutdown,
        tasks,
    )
    .with_addr("http", bound)
    .with_addr("indexer", indexer_addr))
}

/// Probes every engine's `GET /health` each interval: an answer (2xx) brings it back, a
/// failure takes it out. Probes run concurrently, each bounded by the connect timeout twice.
async fn health_loop(st: Arc<RouterState>, shutdown: CancellationToken) {
    // Engines start up; the first probe comes one interval in (a dead engine found sooner
    // costs one refused connect, and the request goes to the next engine).
    let every = st.config.health_interval;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let engines = st.engines();
        let probes = engines.iter().map(|e| {
            let st = Arc::clone(&st);
            let e = Arc::clone(e);
            async move {
                let req = hyper::Request::get(format!("{}/health", e.spec.url))
                    .body(axum::body::Body::empty());
                let ok = match req {
                    Ok(req) => upstream::send(&st.client, req, st.config.connect_timeout * 2)
                        .await
                        .is_ok_and(|r| r.status().is_success()),
                    Err(_) => false,
                };
                if e.set_up(ok) != ok {
                    tracing::info!(engine = %e.spec.instance, up = ok, "engine health changed");
                }
            }
        });
        futures_util::future::join_all(probes).await;
    }
}

/// `--doctor`: starts the router's parts (bound as configured), waits for the engines'
/// publishers to connect (at most `wait`), probes every engine, stops.
///
/// # Errors
/// [`StartError`] as [`start`].
pub async fn doctor(
    config: RouterConfig,
    wait: Duration,
) -> Result<Vec<doctor::Verdict>, StartError> {
    let server = start(config).await?;
    let st = Arc::clone(&server.state);
    let begin = tokio::time::Instant::now();
    let connected = |st: &RouterState| {
        st.engines().iter().all(|e| {
            e.spec
                .events
                .as_deref()
                .is_none_or(|ep| st.indexer.publisher_connected(ep) == Some(true))
        })
    };
    while !connected(&st) && begin.elapsed() < wait {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let verdicts = doctor::run(&st, wait).await;
    drop(st);
    server.stop().await;
    Ok(verdicts)
}
