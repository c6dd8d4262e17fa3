//! Starting the router: the tokenizer, `--engine`'s publishers registered in the index, the
//! HTTP stack over the route table, the shared reservations (`--cluster`), and the loops
//! (discovery, health probes, engine metrics), all under the server's one shutdown token.

use super::state::RouterState;
use super::RouterConfig;
use super::{cluster, discovery, health, metrics, routes, scrape, tokenize, Router, RouterServer};
use crate::indexer::api::Registration;
use crate::service::{bind_host, Running, StartError};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Loads the tokenizer, registers every engine's publisher in `index`, binds the HTTP port
/// and starts the health probes, the scrapes and the discovery.
pub(super) async fn launch(
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
    let (listener, bound) = bind_host("http", &config.host, config.port).await?;
    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    let metrics = metrics::RouterMetrics::default();
    let shared = match &config.cluster {
        Some(cluster) => {
            let instances: Vec<String> =
                config.engines.iter().map(|e| e.instance.clone()).collect();
            let joined = cluster::SharedSlots::start(
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
    tasks.spawn(health::health_loop(Arc::clone(&state), shutdown.clone()));
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
