//! The engines' health (docs/ROUTER.md): every `--health-interval`, `GET /health` of each
//! engine; an answer brings it back into routing, a failure takes it out (as a failed request
//! does).

use super::state::RouterState;
use super::upstream;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Probes every engine's `GET /health` each interval: an answer (2xx) brings it back, a
/// failure takes it out. Probes run concurrently, each bounded by the connect timeout twice.
pub(crate) async fn health_loop(st: Arc<RouterState>, shutdown: CancellationToken) {
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
