//! The engines' own metrics in the load term (docs/ROUTER.md, "Engine metrics"): every
//! `--engine-metrics-interval`, `GET /metrics` of each engine (bounded in time and size), the
//! request counts and KV cache usage read from its Prometheus text, kept on the engine for
//! three intervals. [`parse`] is pure (`model/scrape.rs`); [`scrape_loop`] is the driver.
//!
//! Must not: block a request (the loop runs beside them), or keep a figure past its freshness.

use super::model::score::Reported;
use super::model::scrape::parse;
use super::state::RouterState;
use super::upstream;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Largest `/metrics` body read (a bigger one is not used, counted `too_large`).
pub(super) const MAX_METRICS_BYTES: usize = 4 << 20;

/// Scrapes every engine each interval until `shutdown` (the first scrape at once).
pub(super) async fn scrape_loop(st: Arc<RouterState>, shutdown: CancellationToken) {
    let Some(every) = st.config.engine_metrics_interval else {
        return;
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let engines = st.engines();
        let scrapes = engines.iter().filter(|e| e.is_up()).map(|e| {
            let st = Arc::clone(&st);
            let e = Arc::clone(e);
            async move {
                let outcome = match scrape(&st, &e.spec.url, every).await {
                    Ok(Some(r)) => {
                        e.set_reported(r);
                        "ok"
                    }
                    Ok(None) => "no_series",
                    Err(why) => why,
                };
                st.metrics
                    .scrapes
                    .with_label_values(&[&e.spec.instance, outcome])
                    .inc();
            }
        });
        futures_util::future::join_all(scrapes).await;
    }
}

/// One engine's figures; the failure's label when none.
async fn scrape(
    st: &RouterState,
    url: &str,
    every: std::time::Duration,
) -> Result<Option<Reported>, &'static str> {
    let deadline =
        (st.config.connect_timeout * 2).min(every.max(std::time::Duration::from_millis(100)));
    let req = hyper::Request::get(format!("{url}/metrics"))
        .body(axum::body::Body::empty())
        .map_err(|_| "failed")?;
    let resp = upstream::send(&st.client, req, deadline)
        .await
        .map_err(|_| "failed")?;
    if !resp.status().is_success() {
        return Err("failed");
    }
    let body = upstream::read_body(resp.into_body(), MAX_METRICS_BYTES, deadline)
        .await
        .map_err(|f| {
            if f == upstream::Failure::TooLarge {
                "too_large"
            } else {
                "failed"
            }
        })?;
    Ok(parse(&String::from_utf8_lossy(&body)))
}
