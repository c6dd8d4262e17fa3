//! Engines learnt from an index's registrations (docs/ROUTER.md, "Discovery"): besides
//! `--engine`'s, every instance registered in the index the router asks (`--discover index`)
//! or in a separate `kvplane indexer` (`--discover http://host:port`, its `GET /services`)
//! with the router's model, tenant and block size, at its registration's `http_endpoint` (else
//! its event endpoint's host at `--discover-http-port`). Read again every
//! `--discovery-interval`: instances come and go with their registrations. From a separate
//! indexer, each one is registered in the router's own in-process index too (and removed with
//! it), so the router scores from its own index as for `--engine`'s.
//!
//! Pure: [`plan`]. Driver: [`pass`] and [`discovery_loop`]. Must not: drop the engines it
//! has when a read fails (the indexer may restart), or route to an instance it cannot name an
//! HTTP address for (counted by reason instead).

use super::config::{Discover, EngineSpec, RouterConfig};
use super::state::RouterState;
use super::upstream;
use crate::indexer::api::{self, EngineType, Registration, Unregistration};
use axum::body::Body;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Discovered engines at most; registrations beyond are not routed to (counted
/// `over_limit`).
pub const MAX_DISCOVERED: usize = 1024;

/// What the registrations give the router.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// One engine per instance, by instance.
    pub engines: Vec<EngineSpec>,
    /// The registrations of those engines (every data-parallel rank).
    pub registrations: Vec<Registration>,
    /// Registrations not routed to, by reason: `other_model`, `other_tenant`, `block_size`,
    /// `not_an_engine` (a Mooncake store), `no_http_endpoint`, `http_endpoint_conflict` (a
    /// rank naming another address than its instance's first), `over_limit`.
    pub skipped: BTreeMap<&'static str, u64>,
}

/// The HTTP address of `reg`: its `http_endpoint`, else its event endpoint's host at `port`.
fn http_of(reg: &Registration, port: Option<u16>) -> Option<String> {
    if let Some(url) = &reg.http {
        return Some(url.clone());
    }
    let port = port?;
    let (host, _) = reg.endpoint.strip_prefix("tcp://")?.rsplit_once(':')?;
    Some(format!("http://{host}:{port}"))
}

/// The engines `regs` give a router configured as `config` (its `--engine` instances are
/// its own and left out).
pub fn plan(regs: &[Registration], config: &RouterConfig) -> Plan {
    let mut out = Plan::default();
    let mut by_instance: BTreeMap<&str, EngineSpec> = BTreeMap::new();
    let mut skip = |why| *out.skipped.entry(why).or_insert(0) += 1;
    for reg in regs {
        if config.engines.iter().any(|e| e.instance == reg.instance) {
            continue;
        }
        let why = if reg.kind == EngineType::Mooncake {
            Some("not_an_engine")
        } else if reg.model != config.model {
            Some("other_model")
        } else if reg.tenant != config.tenant {
            Some("other_tenant")
        } else if reg.block_size != config.block_size {
            Some("block_size")
        } else {
            None
        };
        if let Some(why) = why {
            skip(why);
            continue;
        }
        let Some(url) = http_of(reg, config.discover_http_port) else {
            skip("no_http_endpoint");
            continue;
        };
        match by_instance.get(reg.instance.as_str()) {
            Some(spec) if spec.url != url => {
                skip("http_endpoint_conflict");
                continue;
            }
            Some(_) => {}
            None if by_instance.len() >= MAX_DISCOVERED => {
                skip("over_limit");
                continue;
            }
            None => {
                by_instance.insert(
                    &reg.instance,
                    EngineSpec {
                        url,
                        instance: reg.instance.clone(),
                        events: Some(reg.endpoint.clone()),
                        replay: reg.replay_endpoint.clone(),
                        dp_rank: reg.dp_rank,
                        kind: reg.kind,
                        slots: None,
                    },
                );
            }
        }
        out.registrations.push(reg.clone());
    }
    out.engines = by_instance.into_values().collect();
    out
}

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
pub async fn pass(st: &RouterState, mirrored: &mut BTreeMap<String, Registration>) {
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
pub async fn discovery_loop(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(instance: &str, rank: u32, http: Option<&str>) -> Registration {
        Registration {
            endpoint: format!("tcp://10.0.0.{rank}:5557"),
            replay_endpoint: None,
            kind: EngineType::Vllm,
            model: "m".into(),
            lora: String::new(),
            tenant: "default".into(),
            instance: instance.into(),
            block_size: 16,
            dp_rank: rank,
            salt: String::new(),
            lmcache: Vec::new(),
            http: http.map(str::to_owned),
            backends: Vec::new(),
        }
    }

    #[test]
    fn registrations_become_engines_or_are_counted() {
        let mut config = RouterConfig::new("m", vec!["http://h:1,instance=fixed".parse().unwrap()]);
        let regs = vec![
            reg("b", 0, Some("http://b:8000")),
            reg("b", 1, Some("http://b:8000")),
            reg("a", 2, None),
            reg("fixed", 0, Some("http://f:1")),
            Registration {
                model: "other".into(),
                ..reg("c", 0, Some("http://c:1"))
            },
            Registration {
                block_size: 32,
                ..reg("d", 0, Some("http://d:1"))
            },
            Registration {
                kind: EngineType::Mooncake,
                ..reg("e", 0, Some("http://e:1"))
            },
            reg("g", 0, Some("http://g:1")),
            reg("g", 1, Some("http://g:2")),
        ];
        let p = plan(&regs, &config);
        let urls: Vec<(&str, &str)> = p
            .engines
            .iter()
            .map(|e| (e.instance.as_str(), e.url.as_str()))
            .collect();
        // `a` has no address without the mapping; `fixed` is --engine's own.
        assert_eq!(urls, [("b", "http://b:8000"), ("g", "http://g:1")]);
        assert_eq!(p.registrations.len(), 3);
        let skipped: Vec<(&str, u64)> = p.skipped.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(
            skipped,
            [
                ("block_size", 1),
                ("http_endpoint_conflict", 1),
                ("no_http_endpoint", 1),
                ("not_an_engine", 1),
                ("other_model", 1),
            ]
        );
        // The documented mapping: the event endpoint's host at --discover-http-port.
        config.discover_http_port = Some(8000);
        let p = plan(&regs, &config);
        assert_eq!(p.engines[0].url, "http://10.0.0.2:8000");
        assert_eq!(p.engines[0].events.as_deref(), Some("tcp://10.0.0.2:5557"));
        assert!(!p.skipped.contains_key("no_http_endpoint"));
    }

    #[test]
    fn the_discovered_engines_are_bounded() {
        let config = RouterConfig::new("m", Vec::new());
        let regs: Vec<Registration> = (0..=MAX_DISCOVERED)
            .map(|i| reg(&format!("e{i:05}"), 0, Some("http://h:1")))
            .collect();
        let p = plan(&regs, &config);
        assert_eq!(p.engines.len(), MAX_DISCOVERED);
        assert_eq!(p.skipped.get("over_limit"), Some(&1));
    }
}
