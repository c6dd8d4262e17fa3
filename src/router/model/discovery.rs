//! Which registrations become engines (docs/ROUTER.md, "Discovery"), pure: [`plan`] reads an
//! index's registrations against the router's configuration; the driver (`discovery.rs`)
//! reads them, mirrors them into the router's index and swaps the engines.

use crate::indexer::api::{EngineType, Registration};
use crate::router::config::{EngineSpec, RouterConfig};
use std::collections::BTreeMap;

/// Discovered engines at most; registrations beyond are not routed to (counted
/// `over_limit`).
pub(crate) const MAX_DISCOVERED: usize = 1024;

/// What the registrations give the router.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Discovered {
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
pub(crate) fn plan(regs: &[Registration], config: &RouterConfig) -> Discovered {
    let mut out = Discovered::default();
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
