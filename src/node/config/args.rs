//! Flags of `kvplane node`, validated into [`crate::node::NodeConfig`] naming the flag at
//! fault. Each flag's variable is `KVPLANE_NODE_<FLAG>` (`service::layers`); the `env`
//! written below is the flag's old name, read as a deprecated alias except where it is
//! `kvplane serve`'s too (`KVPLANE_HOST`, `KVPLANE_PORT`, …). Parses nothing itself.

use super::{
    gib_to_bytes, CoordinatorLinkConfig, EvictionPolicy, L2Config, NodeConfig, PrefetchPolicy,
    StorePolicy,
};
use crate::config::{self, defaults::node as d, ConfigError};
use crate::worker::WorkerConfig;
use clap::Args;
use std::path::PathBuf;

/// Flags of `kvplane node`, as given.
#[derive(Debug, Clone, Args)]
#[command(
    mut_arg("api_token", |a| a.env("KVPLANE_NODE_API_TOKEN")),
    mut_arg("api_token_reads", |a| a.env("KVPLANE_NODE_API_TOKEN_READS")),
    mut_arg("api_token_peers", |a| a.env("KVPLANE_NODE_API_TOKEN_PEERS"))
)]
pub struct NodeArgs {
    /// `--api-token` and its scope on the HTTP listener (the coordinator's calls stay open
    /// without `--api-token-peers`: LMCache 0.5.6's coordinator sends no token).
    #[command(flatten)]
    pub auth: crate::web::access::AuthArgs,
    /// Address both listeners bind to.
    #[arg(long, env = "KVPLANE_HOST", default_value = config::defaults::HOST)]
    host: String,
    /// LMCache protocol port (workers use `remote_url: lm://HOST:PORT`). 0 picks a free port.
    #[arg(long, env = "KVPLANE_PORT", default_value_t = d::PORT)]
    port: u16,
    /// HTTP port for /metrics and /healthz. 0 picks a free port.
    #[arg(long, env = "KVPLANE_HTTP_PORT", default_value_t = d::HTTP_PORT)]
    http_port: u16,
    /// Serve no HTTP listener at all.
    #[arg(long, env = "KVPLANE_NO_HTTP")]
    no_http: bool,
    /// L1 (memory) budget in GiB.
    #[arg(long, env = "KVPLANE_L1_SIZE_GB", default_value_t = d::L1_SIZE_GB)]
    l1_size_gb: f64,
    /// GiB of L1 mapped and faulted in at start, so PUTs into a fresh node run at the speed
    /// of a bare copy (0: none; at most --l1-size-gb and the memory available). LMCache's
    /// `--l1-init-size-gb` is accepted as its name.
    #[arg(
        long,
        alias = "l1-init-size-gb",
        env = "KVPLANE_L1_PREALLOCATE",
        default_value_t = 0.0
    )]
    l1_preallocate: f64,
    /// LMCache's switch for an L1 allocated whole at start: `--no-l1-use-lazy` preallocates
    /// all of --l1-size-gb (as `--l1-preallocate` with the L1 size).
    #[arg(long = "no-l1-use-lazy", env = "KVPLANE_NO_L1_USE_LAZY")]
    no_l1_use_lazy: bool,
    /// L1 eviction policy: LRU or noop (never evict; stores that do not fit are refused).
    #[arg(long, env = "KVPLANE_EVICTION_POLICY", default_value = d::EVICTION_POLICY)]
    eviction_policy: String,
    /// Fraction of the L1 budget above which an eviction cycle runs.
    #[arg(long, env = "KVPLANE_EVICTION_TRIGGER_WATERMARK", default_value_t = d::EVICTION_TRIGGER_WATERMARK)]
    eviction_trigger_watermark: f64,
    /// Fraction of L1's used bytes one eviction cycle frees.
    #[arg(long, env = "KVPLANE_EVICTION_RATIO", default_value_t = d::EVICTION_RATIO)]
    eviction_ratio: f64,
    /// L2 directory; unset, there is no L2 and nothing survives a restart.
    #[arg(long, env = "KVPLANE_L2_PATH")]
    l2_path: Option<PathBuf>,
    /// L2 (disk) budget in GiB.
    #[arg(long, env = "KVPLANE_L2_SIZE_GB", default_value_t = d::L2_SIZE_GB)]
    l2_size_gb: f64,
    /// L2 store policy: default (keep in L1, write through to L2) or skip_l1.
    #[arg(long, env = "KVPLANE_L2_STORE_POLICY", default_value = d::L2_STORE_POLICY)]
    l2_store_policy: String,
    /// L2 prefetch policy: default (an L2 hit is served, not kept in L1) or retain.
    #[arg(long, env = "KVPLANE_L2_PREFETCH_POLICY", default_value = d::L2_PREFETCH_POLICY)]
    l2_prefetch_policy: String,
    /// L2 file reads and writes in flight at once (also accepted as LMCache's
    /// `--l2-prefetch-max-in-flight`).
    #[arg(long, alias = "l2-prefetch-max-in-flight", env = "KVPLANE_L2_MAX_IN_FLIGHT", default_value_t = d::L2_MAX_IN_FLIGHT)]
    l2_max_in_flight: usize,
    /// LMCache's L2 adapter JSON, e.g. '{"type":"fs","base_path":"/data/l2"}' (the `fs`
    /// adapter's fields and `eviction`); instead of `--l2-path`. A node has one L2: given
    /// more than once, or with another type, it is refused at start.
    #[arg(long, env = "KVPLANE_L2_ADAPTER")]
    l2_adapter: Vec<String>,
    /// L2 eviction policy: LRU or noop.
    #[arg(long, env = "KVPLANE_L2_EVICTION_POLICY", default_value = d::EVICTION_POLICY)]
    l2_eviction_policy: String,
    /// Fraction of the L2 budget above which an eviction cycle runs.
    #[arg(long, env = "KVPLANE_L2_EVICTION_TRIGGER_WATERMARK", default_value_t = d::EVICTION_TRIGGER_WATERMARK)]
    l2_eviction_trigger_watermark: f64,
    /// Fraction of L2's used bytes one eviction cycle frees.
    #[arg(long, env = "KVPLANE_L2_EVICTION_RATIO", default_value_t = d::EVICTION_RATIO)]
    l2_eviction_ratio: f64,
    /// Skip fsync of L2 files and directories (faster; a power loss may then lose recent
    /// objects, which are discarded at restart, never served torn).
    #[arg(long, env = "KVPLANE_L2_NO_FSYNC")]
    l2_no_fsync: bool,
    /// Largest PUT body in bytes; a larger PUT closes the connection (counted).
    #[arg(long, env = "KVPLANE_MAX_OBJECT_BYTES", default_value_t = d::MAX_OBJECT_BYTES)]
    max_object_bytes: usize,
    /// Most connections open at once; more are closed at accept (counted).
    #[arg(long, env = "KVPLANE_MAX_CONNECTIONS", default_value_t = d::MAX_CONNECTIONS)]
    max_connections: usize,
    /// How `lm://` connections are served: `threads` (each on an OS thread of its own with
    /// blocking socket I/O, as LMCache's server does) or `tasks` (tasks on the runtime's
    /// worker threads, one per core).
    #[arg(long, default_value = "threads", value_parser = ["threads", "tasks"])]
    lm_connection_model: String,
    /// Seconds to wait for the rest of a request once its first byte arrived.
    #[arg(long, env = "KVPLANE_READ_TIMEOUT", default_value_t = d::READ_TIMEOUT_S)]
    read_timeout: f64,
    /// Most HTTP connections served at once on `--http-port`; more wait to be accepted.
    #[arg(long, env = "KVPLANE_MAX_HTTP_CONNECTIONS", default_value_t = d::MAX_HTTP_CONNECTIONS)]
    max_http_connections: usize,
    /// Seconds an HTTP client has to send a request's headers (also the keep-alive idle
    /// time), then its body.
    #[arg(long, env = "KVPLANE_HTTP_READ_TIMEOUT", default_value_t = d::HTTP_READ_TIMEOUT_S)]
    http_read_timeout: f64,
    /// Largest LIST reply body in bytes (whole keys only).
    #[arg(long, env = "KVPLANE_MAX_LIST_BYTES", default_value_t = d::MAX_LIST_BYTES)]
    max_list_bytes: usize,
    /// The id the node registers under with the controller and the coordinator. Default:
    /// `kvplane-node-<hostname>-<port>`, stable across restarts.
    #[arg(long, env = "KVPLANE_INSTANCE_ID")]
    instance_id: Option<String>,
    /// The controller's PULL socket, HOST:PORT (LMCache's `controller_pull_url`; `kvplane
    /// serve`'s `pull` monitor port). With --controller-reply, the node reports what it holds.
    #[arg(long, env = "KVPLANE_CONTROLLER_PULL")]
    controller_pull: Option<String>,
    /// The controller's reply socket, HOST:PORT (LMCache's `controller_reply_url`).
    #[arg(long, env = "KVPLANE_CONTROLLER_REPLY")]
    controller_reply: Option<String>,
    /// Port of the node's command socket for the controller (0 picks a free port).
    #[arg(long, env = "KVPLANE_CONTROLLER_COMMAND_PORT", default_value_t = 0)]
    controller_command_port: u16,
    /// Seconds between heartbeats to the controller.
    #[arg(long, env = "KVPLANE_CONTROLLER_HEARTBEAT_INTERVAL", default_value_t = d::CONTROLLER_HEARTBEAT_INTERVAL_S)]
    controller_heartbeat_interval: f64,
    /// A coordinator's base URL (http://HOST:PORT): the node registers, heartbeats, posts
    /// its L2 usage events and deregisters, as an LMCache MP server does.
    #[arg(long, env = "KVPLANE_COORDINATOR_URL")]
    coordinator_url: Option<String>,
    /// The ip the coordinator calls back (default: the local address of the route to it).
    #[arg(long, env = "KVPLANE_COORDINATOR_ADVERTISE_IP")]
    coordinator_advertise_ip: Option<String>,
    /// Seconds between heartbeats to the coordinator.
    #[arg(long, env = "KVPLANE_COORDINATOR_HEARTBEAT_INTERVAL", default_value_t = d::COORDINATOR_HEARTBEAT_INTERVAL_S)]
    coordinator_heartbeat_interval: f64,
    /// Post cache store, access and delete events to the coordinator (LMCache's switch, off
    /// by default as in 0.5.6: without it the node only registers and heartbeats).
    #[arg(long, env = "KVPLANE_COORDINATOR_EVENT_REPORTING")]
    coordinator_event_reporting: bool,
    /// Deprecated spelling of `--coordinator-event-reporting` (LMCache before 0.5.3).
    #[arg(long, hide = true)]
    coordinator_l2_event_reporting: bool,
    /// Seconds between cache-event posts to the coordinator (also accepted as the deprecated
    /// `--coordinator-l2-event-flush-interval`).
    #[arg(long, alias = "coordinator-l2-event-flush-interval", env = "KVPLANE_COORDINATOR_EVENT_FLUSH_INTERVAL", default_value_t = d::COORDINATOR_EVENT_FLUSH_INTERVAL_S)]
    coordinator_event_flush_interval: f64,
    /// Seconds any call to the coordinator may take.
    #[arg(long, env = "KVPLANE_COORDINATOR_TIMEOUT", default_value_t = d::COORDINATOR_TIMEOUT_S)]
    coordinator_timeout: f64,
    /// Tokens per chunk (LMCache's `chunk_size`), for warm prefetch's token hashing and the
    /// controller's commands that name tokens.
    #[arg(long, env = "KVPLANE_CHUNK_SIZE", default_value_t = d::CHUNK_SIZE)]
    chunk_size: usize,
    /// Prefix hash of the first chunk when a controller command's tokens are hashed
    /// (LMCache's `NONE_HASH`; the controller's `--lookup-none-hash`).
    #[arg(
        long,
        env = "KVPLANE_LOOKUP_NONE_HASH",
        default_value_t = config::defaults::LOOKUP_NONE_HASH.to_string(),
        allow_hyphen_values = true
    )]
    lookup_none_hash: String,
    /// The `peer_init_url` registered with the controller, `HOST:PORT` of this node's
    /// LMCache listener (where another node's `/move` PUTs objects); default: the advertised
    /// ip and `--port`.
    #[arg(long, env = "KVPLANE_PEER_URL")]
    peer_url: Option<String>,
    /// TP ranks to register with the controller at start (workers 0..N); ranks its keys name
    /// register anyway as they arrive.
    #[arg(long, env = "KVPLANE_TP_RANKS", default_value_t = 1)]
    tp_ranks: u32,
}

/// `kvplane-node-<hostname>-<port>` (hostname from `HOSTNAME` or /etc/hostname).
fn default_instance_id(port: u16) -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty() && !h.contains('/'))
        .unwrap_or_else(|| "localhost".into());
    format!("kvplane-node-{host}-{port}")
}

fn size(flag: &'static str, gib: f64) -> Result<u64, ConfigError> {
    if gib.is_finite() && gib > 0.0 {
        Ok(gib_to_bytes(gib))
    } else {
        Err(ConfigError::Value {
            flag,
            detail: format!("{gib} is not a positive number of GiB"),
        })
    }
}

fn lru(flag: &'static str, v: &str) -> Result<bool, ConfigError> {
    match v.to_ascii_lowercase().as_str() {
        "lru" => Ok(true),
        "noop" => Ok(false),
        _ => Err(ConfigError::Value {
            flag,
            detail: format!("{v:?} is not LRU or noop"),
        }),
    }
}

fn ratio(flag: &'static str, v: f64) -> Result<f64, ConfigError> {
    let v = config::fraction(flag, v)?;
    if v > 0.0 {
        Ok(v)
    } else {
        Err(ConfigError::Value {
            flag,
            detail: "must be above 0".into(),
        })
    }
}

impl NodeArgs {
    /// Validates the flags.
    ///
    /// # Errors
    /// [`ConfigError`] naming the flag at fault.
    pub fn validate(&self) -> Result<NodeConfig, ConfigError> {
        let l1 = EvictionPolicy {
            budget: size("l1-size-gb", self.l1_size_gb)?,
            trigger_watermark: ratio(
                "eviction-trigger-watermark",
                self.eviction_trigger_watermark,
            )?,
            eviction_ratio: ratio("eviction-ratio", self.eviction_ratio)?,
            lru: lru("eviction-policy", &self.eviction_policy)?,
        };
        let l1_preallocate = if self.no_l1_use_lazy {
            l1.budget
        } else if self.l1_preallocate == 0.0 {
            0
        } else {
            let bytes = size("l1-preallocate", self.l1_preallocate)?;
            if bytes > l1.budget {
                return Err(ConfigError::Value {
                    flag: "l1-preallocate",
                    detail: format!(
                        "{} GiB is more than --l1-size-gb {}",
                        self.l1_preallocate, self.l1_size_gb
                    ),
                });
            }
            bytes
        };
        let store_policy = match self.l2_store_policy.as_str() {
            "default" => StorePolicy::Default,
            "skip_l1" => StorePolicy::SkipL1,
            other => {
                return Err(ConfigError::Value {
                    flag: "l2-store-policy",
                    detail: format!("{other:?} is not default or skip_l1"),
                })
            }
        };
        let prefetch_policy = match self.l2_prefetch_policy.as_str() {
            "default" => PrefetchPolicy::Default,
            "retain" => PrefetchPolicy::Retain,
            other => {
                return Err(ConfigError::Value {
                    flag: "l2-prefetch-policy",
                    detail: format!("{other:?} is not default or retain"),
                })
            }
        };
        let adapter_err = |detail: String| ConfigError::Value {
            flag: "l2-adapter",
            detail,
        };
        let adapter = match self.l2_adapter.as_slice() {
            [] => None,
            [one] => Some(super::l2_adapter::parse_l2_adapter(one).map_err(adapter_err)?),
            more => {
                return Err(adapter_err(format!(
                    "{} adapters given: a node has one L2 tier (an L2 cascade is not built)",
                    more.len()
                )))
            }
        };
        if adapter.is_some() && self.l2_path.is_some() {
            return Err(adapter_err(
                "give --l2-path or --l2-adapter, not both".into(),
            ));
        }
        let l2_path = adapter
            .as_ref()
            .map(|a| a.path.clone())
            .or_else(|| self.l2_path.clone());
        let l2 = match l2_path {
            None => None,
            Some(path) => Some(L2Config {
                path,
                eviction: EvictionPolicy {
                    budget: size("l2-size-gb", self.l2_size_gb)?,
                    trigger_watermark: ratio(
                        "l2-eviction-trigger-watermark",
                        self.l2_eviction_trigger_watermark,
                    )?,
                    eviction_ratio: ratio("l2-eviction-ratio", self.l2_eviction_ratio)?,
                    lru: lru("l2-eviction-policy", &self.l2_eviction_policy)?,
                },
                store_policy,
                prefetch_policy,
                max_in_flight: config::at_least_one("l2-max-in-flight", self.l2_max_in_flight)?,
                fsync: !self.l2_no_fsync,
            }),
        };
        let l2 = l2.map(|mut c| {
            if let Some((lru, watermark, ratio)) = adapter.as_ref().and_then(|a| a.eviction) {
                c.eviction.lru = lru;
                c.eviction.trigger_watermark = watermark;
                c.eviction.eviction_ratio = ratio;
            }
            c
        });
        let max_object_bytes = config::at_least_one("max-object-bytes", self.max_object_bytes)?;
        if i32::try_from(max_object_bytes).is_err() {
            return Err(ConfigError::Value {
                flag: "max-object-bytes",
                detail: "the protocol's length is an int32: at most 2147483647".into(),
            });
        }
        let instance_id = match &self.instance_id {
            Some(id) if id.trim().is_empty() || id.contains('/') => {
                return Err(ConfigError::Value {
                    flag: "instance-id",
                    detail: "must be non-empty and hold no '/'".into(),
                })
            }
            Some(id) => id.trim().to_owned(),
            None => default_instance_id(self.port),
        };
        // Checked whether or not a peer is set, so a bad value never waits to bite.
        let controller_heartbeat = config::positive_seconds(
            "controller-heartbeat-interval",
            self.controller_heartbeat_interval,
        )?;
        let coordinator_heartbeat = config::positive_seconds(
            "coordinator-heartbeat-interval",
            self.coordinator_heartbeat_interval,
        )?;
        let coordinator_flush = config::positive_seconds(
            "coordinator-event-flush-interval",
            self.coordinator_event_flush_interval,
        )?;
        let coordinator_timeout =
            config::positive_seconds("coordinator-timeout", self.coordinator_timeout)?;
        let controller = match (&self.controller_pull, &self.controller_reply) {
            (None, None) => None,
            (Some(pull), Some(reply)) => {
                let mut w = WorkerConfig::new(instance_id.clone(), 0, pull, reply);
                w.command_host.clone_from(&self.host);
                w.command_port = self.controller_command_port;
                w.heartbeat_interval = Some(controller_heartbeat);
                Some(w)
            }
            _ => {
                return Err(ConfigError::Value {
                    flag: "controller-pull",
                    detail: "--controller-pull and --controller-reply go together".into(),
                })
            }
        };
        let coordinator = match &self.coordinator_url {
            None => None,
            Some(url) => {
                let (host, port) =
                    crate::node::coordinator_link::parse_url(url).map_err(|detail| {
                        ConfigError::Value {
                            flag: "coordinator-url",
                            detail,
                        }
                    })?;
                let mut c = CoordinatorLinkConfig::new(host, port, instance_id.clone());
                c.advertise_ip.clone_from(&self.coordinator_advertise_ip);
                c.heartbeat_interval = coordinator_heartbeat;
                c.event_flush_interval = coordinator_flush;
                if self.coordinator_l2_event_reporting && !self.coordinator_event_reporting {
                    tracing::warn!(
                        "--coordinator-l2-event-reporting is deprecated, use \
                         --coordinator-event-reporting instead"
                    );
                }
                c.event_reporting =
                    self.coordinator_event_reporting || self.coordinator_l2_event_reporting;
                c.timeout = coordinator_timeout;
                if self.no_http {
                    return Err(ConfigError::Value {
                        flag: "coordinator-url",
                        detail: "the coordinator calls the node's HTTP port: drop --no-http".into(),
                    });
                }
                Some(c)
            }
        };
        Ok(NodeConfig {
            controller,
            coordinator,
            chunk_size: config::at_least_one("chunk-size", self.chunk_size)?,
            lookup_none_hash: config::chunk_hash("lookup-none-hash", &self.lookup_none_hash)?,
            peer_url: self.peer_url.clone(),
            tp_ranks: if (1..=256).contains(&self.tp_ranks) {
                self.tp_ranks
            } else {
                return Err(ConfigError::Value {
                    flag: "tp-ranks",
                    detail: "must be 1..=256".into(),
                });
            },
            max_prefetch_jobs: d::MAX_PREFETCH_JOBS,
            auth: crate::web::access::Auth::from(&self.auth),
            host: self.host.clone(),
            port: self.port,
            http_port: (!self.no_http).then_some(self.http_port),
            l1,
            l1_preallocate,
            l2,
            max_object_bytes,
            max_connections: config::at_least_one("max-connections", self.max_connections)?,
            connection_model: super::ConnectionModel::parse(&self.lm_connection_model).ok_or_else(
                || config::ConfigError::Value {
                    flag: "lm-connection-model",
                    detail: format!("{}: use `threads` or `tasks`", self.lm_connection_model),
                },
            )?,
            read_timeout: config::positive_seconds("read-timeout", self.read_timeout)?,
            max_list_bytes: config::at_least_one("max-list-bytes", self.max_list_bytes)?,
            http: super::http_limits(
                config::at_least_one("max-http-connections", self.max_http_connections)?,
                config::positive_seconds("http-read-timeout", self.http_read_timeout)?,
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::{NodeConfig, PrefetchPolicy, StorePolicy};
    use super::NodeArgs;
    use clap::Parser;

    /// `kvplane node`'s flags alone.
    #[derive(Parser)]
    struct Node {
        #[command(flatten)]
        args: NodeArgs,
    }

    fn parse(args: &[&str]) -> Result<NodeConfig, String> {
        let mut full = vec!["node"];
        full.extend_from_slice(args);
        let node = Node::try_parse_from(full).map_err(|e| e.to_string())?;
        node.args.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_l2_flags() {
        let c = parse(&[]).expect("defaults");
        assert_eq!(
            (c.port, c.http_port, c.l1.budget),
            (65432, Some(9091), 4 << 30)
        );
        assert!(c.l2.is_none());
        assert_eq!(c.l1_preallocate, 0);
        let c = parse(&["--l1-size-gb", "2", "--l1-preallocate", "0.5"]).expect("valid");
        assert_eq!(c.l1_preallocate, 512 << 20);
        let c = parse(&["--l1-size-gb", "2", "--l1-init-size-gb", "1"]).expect("LMCache's name");
        assert_eq!(c.l1_preallocate, 1 << 30);
        let c = parse(&["--l1-size-gb", "2", "--no-l1-use-lazy"]).expect("LMCache's switch");
        assert_eq!(c.l1_preallocate, 2 << 30);
        let c = parse(&[
            "--l2-path",
            "/tmp/x",
            "--l2-size-gb",
            "0.5",
            "--l2-store-policy",
            "skip_l1",
            "--l2-prefetch-policy",
            "retain",
            "--no-http",
        ])
        .expect("valid");
        let l2 = c.l2.expect("l2");
        assert_eq!(l2.eviction.budget, 512 << 20);
        assert_eq!(
            (l2.store_policy, l2.prefetch_policy, c.http_port),
            (StorePolicy::SkipL1, PrefetchPolicy::Retain, None)
        );
    }

    #[test]
    fn controller_and_coordinator_flags() {
        let c = parse(&[
            "--instance-id",
            "n1",
            "--controller-pull",
            "127.0.0.1:8300",
            "--controller-reply",
            "127.0.0.1:8400",
            "--coordinator-url",
            "http://127.0.0.1:9300",
            "--coordinator-heartbeat-interval",
            "0.5",
        ])
        .expect("valid");
        let w = c.controller.expect("controller");
        assert_eq!(
            (w.instance_id.as_str(), w.controller_pull.as_str()),
            ("n1", "127.0.0.1:8300")
        );
        let k = c.coordinator.expect("coordinator");
        assert_eq!(
            (k.host.as_str(), k.port, k.instance_id.as_str()),
            ("127.0.0.1", 9300, "n1")
        );
        assert_eq!(k.heartbeat_interval, std::time::Duration::from_millis(500));
        assert!(!k.event_reporting, "off unless asked, as in LMCache 0.5.6");
        let url = ["--coordinator-url", "http://c:1"];
        let on = parse(&[url[0], url[1], "--coordinator-event-reporting"]).expect("valid");
        assert!(on.coordinator.expect("coordinator").event_reporting);
        // LMCache's deprecated pre-0.5.3 spellings still work.
        let old = parse(&[
            url[0],
            url[1],
            "--coordinator-l2-event-reporting",
            "--coordinator-l2-event-flush-interval",
            "0.25",
        ])
        .expect("deprecated spellings");
        let k = old.coordinator.expect("coordinator");
        assert!(k.event_reporting);
        assert_eq!(
            k.event_flush_interval,
            std::time::Duration::from_millis(250)
        );
        let c = parse(&[]).expect("defaults");
        assert!(c.controller.is_none() && c.coordinator.is_none());
        // LMCache's MP-server forms: the fs adapter's JSON, the prefetch flag's name.
        let c = parse(&[
            "--l2-adapter",
            r#"{"type":"fs","base_path":"/tmp/l2","eviction":{"eviction_policy":"LRU","eviction_ratio":0.5}}"#,
            "--l2-prefetch-max-in-flight",
            "3",
        ])
        .expect("LMCache's forms");
        let l2 = c.l2.expect("l2");
        assert_eq!(l2.path, std::path::PathBuf::from("/tmp/l2"));
        assert_eq!((l2.max_in_flight, l2.eviction.eviction_ratio), (3, 0.5));
        let fs = r#"{"type":"fs","base_path":"/a"}"#;
        for bad in [
            vec!["--l2-adapter", r#"{"type":"s3"}"#],
            vec!["--l2-adapter", fs, "--l2-adapter", fs],
            vec!["--l2-adapter", fs, "--l2-path", "/b"],
        ] {
            let e = parse(&bad).expect_err("refused");
            assert!(e.contains("l2-adapter"), "{e}");
        }
        assert!(parse(&["--coordinator-url", "http://c:1", "--no-http"]).is_err());
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (flag, v) in [
            ("--l1-size-gb", "0"),
            ("--l1-preallocate", "5"),
            ("--l1-preallocate", "nan"),
            ("--eviction-ratio", "0"),
            ("--eviction-trigger-watermark", "1.5"),
            ("--eviction-policy", "fifo"),
            ("--l2-store-policy", "bogus"),
            ("--max-object-bytes", "4294967296"),
            ("--max-connections", "0"),
            ("--coordinator-url", "https://x:1"),
            ("--coordinator-heartbeat-interval", "0"),
            ("--controller-pull", "127.0.0.1:1"),
            ("--instance-id", "a/b"),
        ] {
            let e = parse(&["--l2-path", "/tmp/x", flag, v]).expect_err(flag);
            assert!(e.contains(flag), "{flag}: {e}");
        }
    }
}
