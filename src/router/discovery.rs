//! Engines learnt from an index's registrations (docs/ROUTER.md, "Discovery"): besides
//! `--engine`'s, every instance registered in the index the router asks (`--discover index`)
//! or in a separate `kvplane indexer` (`--discover http://host:port`, its `GET /services`)
//! with the router's model, tenant and block size, at its registration's `http_endpoint` (else
//! its event endpoint's host at `--discover-http-port`). Read again every
//! `--discovery-interval`: instances come and go with their registrations. From a separate
//! indexer, each one is registered in the router's own in-process index too (and removed with
//! it), so the router scores from its own index as for `--engine`'s.
//!
//! Pure: [`plan`] (`model/discovery.rs`). Driver: [`pass`] and [`discovery_loop`]. Must not:
//! drop the engines it has when a read fails (the indexer may restart), or route to an
//! instance it cannot name an HTTP address for (counted by reason instead).

use super::config::Discover;
use super::model::discovery::plan;
use super::state::RouterState;
use super::upstream;
use crate::indexer::api::{self, Registration, Unregistration};
use axum::body::Body;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Reads a separate indexer's registrations (`GET /services`).
async fn fetch(st: &RouterState, url: &str) -> Result<Vec<Registration>, String> {
    let mut req = hyper::Request::get(format!("{url}/services"));
    if let Some(token) = &st.config.discover_token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    let req = req.body(Body::empty()).map_err(|e| e.to_string())?;
    let deadline = st.config.connect_timeout * 2;
    let resp = upstream::send(&st.client, req, deadline)
        .await
        .map_err(|f| format!("GET {url}/services: {}", f.label()))?;
    let status = resp.status();
    let body = upstream::read_body(resp.into_body(), st.config.max_response_bytes, deadline)
        .await
        .map_err(|f| format!("GET {url}/services: body {}", f.label()))?;
    if !status.is_success() {
        return Err(format!("GET {url}/services answered {status}"));
    }
    let v: Value = serde_json::from_slice(&body).map_err(|e| format!("{url}/services: {e}"))?;
    let list = v
        .get("services")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("{url}/services: no `services` list"))?;
    let mut regs = Vec::with_capacity(list.len());
    for entry in list {
        match entry.as_object().map(api::registration) {
            Some(Ok(reg)) => regs.push(reg),
            _ => st
                .metrics
                .discovery_skipped
                .with_label_values(&["unreadable"])
                .inc(),
        }
    }
    Ok(regs)
}

/// Keeps the router's own index registered with exactly `wanted` (registrations found at a
/// separate indexer); `mirrored` is what earlier passes registered.
fn mirror(
    st: &RouterState,
    wanted: &[Registration],
    mirrored: &mut BTreeMap<String, Registration>,
) {
    let wanted: BTreeMap<String, Registration> = wanted
        .iter()
        .map(|r| {
            // The LMCache tiers are fed by a coordinator the router does not hear.
            let reg = Registration {
                lmcache: Vec::new(),
                ..r.clone()
            };
            (reg.key(), reg)
        })
        .collect();
    mirrored.retain(|key, reg| {
        if wanted.get(key) == Some(reg) {
            return true;
        }
        let gone = Unregistration {
            instance: reg.instance.clone(),
            tenant: reg.tenant.clone(),
            dp_rank: Some(reg.dp_rank),
        };
        if let Err(e) = st.indexer.unregister(&gone) {
            tracing::debug!(%key, "discovered registration already gone: {e}");
        }
        false
    });
    for (key, reg) in wanted {
        if mirrored.contains_key(&key) {
            continue;
        }
        match st.indexer.register(reg.clone()) {
            Ok(_) => {
                mirrored.insert(key, reg);
            }
            Err(e) => {
                tracing::warn!(%key, "discovered engine's events not subscribed: {e}");
                st.metrics
                    .discovery_skipped
                    .with_label_values(&["subscribe_refused"])
                    .inc();
            }
        }
    }
}

/// One read of the registrations: the engines beyond `--engine`'s become the ones found.
/// A failed read changes nothing (counted).
pub(super) async fn pass(st: &RouterState, mirrored: &mut BTreeMap<String, Registration>) {
    let Some(source) = &st.config.discover else {
        return;
    };
    let regs = match source {
        Discover::Index => Ok(st.indexer.registrations()),
        Discover::Indexer(url) => fetch(st, url).await,
    };
    let regs = match regs {
        Ok(r) => r,
        Err(e) => {
            st.metrics
                .discovery_reads
                .with_label_values(&["failed"])
                .inc();
            tracing::warn!("discovery: {e}; the engines found before are kept");
            return;
        }
    };
    st.metrics.discovery_reads.with_label_values(&["ok"]).inc();
    let plan = plan(&regs, &st.config);
    if matches!(source, Discover::Indexer(_)) {
        mirror(st, &plan.registrations, mirrored);
    }
    st.metrics.discovery_unrouted.reset();
    for (why, n) in &plan.skipped {
        st.metrics
            .discovery_unrouted
            .with_label_values(&[why])
            .set(i64::try_from(*n).unwrap_or(i64::MAX));
    }
    let count = plan.engines.len();
    let (added, removed) = st.set_discovered(plan.engines);
    for (change, list) in [("added", &added), ("removed", &removed)] {
        if !list.is_empty() {
            tracing::info!(engines = ?list, "discovered engines {change}");
            st.metrics
                .discovery_changes
                .with_label_values(&[change])
                .inc_by(list.len() as u64);
        }
    }
    st.metrics
        .discovered
        .set(i64::try_from(count).unwrap_or(i64::MAX));
}

/// Reads the registrations every `--discovery-interval` until `shutdown` (`mirrored`: what
/// a first [`pass`] registered); registrations made for a separate indexer's engines are
/// removed from the router's index at the end.
pub(super) async fn discovery_loop(
    st: Arc<RouterState>,
    mut mirrored: BTreeMap<String, Registration>,
    shutdown: CancellationToken,
) {
    if st.config.discover.is_none() {
        return;
    }
    let every = st.config.discovery_interval;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        pass(&st, &mut mirrored).await;
    }
    mirror(&st, &[], &mut mirrored);
}
