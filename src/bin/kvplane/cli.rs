//! The command line: the list of subcommands (each service's flags live in its own module)
//! and the one layered parse every service goes through ([`parse`]): the flag, its
//! `KVPLANE_<SERVICE>_<FLAG>` twin, the replaced system's variables and old names, the
//! `--config` file, the default (`kvplane::service::layers`).

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use kvplane::service::layers::{self, Alias, Convert, Layout, Provenance};
use std::ffi::OsString;

/// `kvplane`: a control plane for distributed LLM KV caches.
#[derive(Debug, Parser)]
#[command(name = "kvplane", version, about)]
pub(crate) struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the controller (LMCache 0.5.6 compatible).
    Serve(kvplane::controller::config::ServeArgs),
    /// Load-test an LMCache-compatible controller (kvplane or LMCache's own).
    Bench(kvplane::bench::BenchArgs),
    /// Run the router-facing KV indexer (Mooncake Conductor Indexer API, fed by KV events).
    Indexer(kvplane::indexer::IndexerArgs),
    /// Run the cache-aware router: an OpenAI-compatible front over vLLM/SGLang engines
    /// (docs/ROUTER.md).
    Router(kvplane::router::RouterArgs),
    /// Run the LMCache MP coordinator (fleet membership, quotas, eviction, warm prefetch).
    Coordinator(kvplane::coordinator::config::args::CoordinatorArgs),
    /// Run a cache node speaking LMCache 0.5.6's `lm://` server protocol (docs/NODE.md).
    Node(kvplane::node::config::NodeArgs),
}

/// The layered subcommands and their word in `KVPLANE_<SERVICE>_<FLAG>`.
const LAYERED: &[(&str, &str)] = &[
    ("serve", "SERVE"),
    ("indexer", "INDEXER"),
    ("router", "ROUTER"),
    ("coordinator", "COORDINATOR"),
    ("node", "NODE"),
];

/// The variable each flag of `sub` was read from before the twins (flag → variable).
fn old_vars(plain: &clap::Command, sub: &str) -> Vec<(String, String)> {
    plain
        .find_subcommand(sub)
        .map(|c| {
            c.get_arguments()
                .filter_map(|a| {
                    let var = a.get_env()?.to_str()?.to_string();
                    Some((a.get_long()?.to_string(), var))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Old variables whose name differs from the twin, as deprecated aliases, less `except`.
fn deprecated(service: &str, old: &[(String, String)], except: &[String]) -> Vec<Alias> {
    old.iter()
        .filter(|(flag, var)| *var != layers::twin(service, flag) && !except.contains(var))
        .map(|(flag, var)| Alias {
            var: var.clone(),
            flag: flag.clone(),
            convert: Convert::Text,
            deprecated: true,
        })
        .collect()
}

/// The layers of subcommand `sub`, `None` for one that has none (`bench`).
fn layout(plain: &clap::Command, sub: &str) -> Option<Layout> {
    let old = old_vars(plain, sub);
    Some(match sub {
        "serve" => kvplane::controller::config::layout(&old),
        // The node's old names that are serve's (KVPLANE_HOST, KVPLANE_PORT, …) belong to
        // serve: a node no longer reads them.
        "node" => {
            let serves: Vec<String> = old_vars(plain, "serve")
                .into_iter()
                .map(|(_, v)| v)
                .collect();
            Layout {
                service: "NODE",
                aliases: deprecated("NODE", &old, &serves),
                ..Layout::default()
            }
        }
        // LMCache's MP coordinator variables, after the old shared cluster names.
        "coordinator" => {
            let mut layout = kvplane::coordinator::config::args::layout();
            layout
                .aliases
                .splice(0..0, deprecated("COORDINATOR", &old, &[]));
            layout
        }
        "indexer" => Layout {
            service: "INDEXER",
            aliases: deprecated("INDEXER", &old, &[]),
            ..Layout::default()
        },
        "router" => kvplane::router::config::layout(),
        _ => return None,
    })
}

/// The command with every layered subcommand's flags given their twins and `--config`.
pub(crate) fn command() -> clap::Command {
    let mut cmd = Cli::command();
    for (sub, service) in LAYERED {
        cmd = cmd.mut_subcommand(sub, |c| layers::with_env_twins(c, service));
    }
    cmd
}

/// Parses the process's arguments through every layer. A usage error or `--help` exits as
/// clap does.
///
/// # Errors
/// A layer's value is refused (naming the flag and where the value came from).
pub(crate) fn parse() -> anyhow::Result<(Cli, Provenance)> {
    let args: Vec<OsString> = std::env::args_os().collect();
    parse_from(&args, &|k: &str| std::env::var(k).ok())
}

/// [`parse`] of `args`, the alias variables read through `env` (the twins through the
/// process's environment, as clap reads them).
pub(crate) fn parse_from(
    args: &[OsString],
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<(Cli, Provenance)> {
    let cmd = command();
    // The first parse lets required flags be missing: the file may hold them. The second,
    // with the layers' values, requires them.
    let mut loose = cmd.clone();
    for (sub, _) in LAYERED {
        loose = loose.mut_subcommand(sub, |c| c.mut_args(|a| a.required(false)));
    }
    let first = loose
        .try_get_matches_from(args)
        .unwrap_or_else(|e| e.exit());
    let plain = Cli::command();
    let layered = first
        .subcommand()
        .and_then(|(name, sub)| Some((name, sub, layout(&plain, name)?)));
    let Some((name, sub, layout)) = layered else {
        return Ok((Cli::from_arg_matches(&first)?, Provenance::default()));
    };
    let sub_cmd = cmd
        .find_subcommand(name)
        .ok_or_else(|| anyhow::anyhow!("no subcommand {name}"))?;
    let (words, prov) = layers::layer(sub_cmd, sub, &layout, env)?;
    let matches = cmd
        .try_get_matches_from(layers::reparse_args(args, words))
        .map_err(|e| {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            let first = first.trim_start_matches("error: ");
            let explained = prov.explain(first);
            if explained == first {
                // Not about a layered value: clap's own message, usage and exit code.
                e.exit();
            }
            anyhow::anyhow!(explained)
        })?;
    Ok((Cli::from_arg_matches(&matches)?, prov))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvplane::config::{ApiToken, MonitorPorts, ServeConfig};
    use kvplane::protocol::ChunkHash;
    use std::time::Duration;

    fn parse(args: &[&str]) -> Result<ServeConfig, String> {
        let mut full = vec!["kvplane", "serve"];
        full.extend_from_slice(args);
        let cli = Cli::try_parse_from(full).map_err(|e| e.to_string())?;
        match cli.command {
            Command::Serve(a) => a.validate().map_err(|e| e.to_string()),
            Command::Bench(_)
            | Command::Indexer(_)
            | Command::Router(_)
            | Command::Coordinator(_)
            | Command::Node(_) => Err("not serve".into()),
        }
    }

    /// Every flag of every service has its `KVPLANE_<SERVICE>_<FLAG>` twin and `--config`.
    #[test]
    fn every_service_flag_has_its_twin() {
        let cmd = command();
        for (sub, service) in LAYERED {
            let c = cmd.find_subcommand(sub).expect("subcommand");
            assert!(
                c.get_arguments().any(|a| a.get_long() == Some("config")),
                "{sub}"
            );
            for a in c.get_arguments() {
                let Some(long) = a.get_long() else { continue };
                let var = a.get_env().and_then(|v| v.to_str()).unwrap_or_default();
                assert_eq!(var, layers::twin(service, long), "{sub} --{long}");
            }
        }
        // serve's old names and the node's are aliases; the node drops serve's.
        let plain = Cli::command();
        let serve = layout(&plain, "serve").expect("serve");
        assert!(serve
            .aliases
            .iter()
            .any(|a| a.var == "KVPLANE_PORT" && a.deprecated));
        assert!(serve
            .aliases
            .iter()
            .any(|a| a.var == "LMCACHE_CONTROLLER_CONTROLLER_PORT" && !a.deprecated));
        let node = layout(&plain, "node").expect("node");
        assert!(!node
            .aliases
            .iter()
            .any(|a| a.var == "KVPLANE_HOST" || a.var == "KVPLANE_PORT"));
        let coordinator = layout(&plain, "coordinator").expect("coordinator");
        assert!(coordinator
            .aliases
            .iter()
            .any(|a| a.var == "LMCACHE_MP_COORDINATOR_PORT"));
        assert!(layout(&plain, "bench").is_none());
    }

    #[test]
    fn zmq_connection_flags_default_safe_and_parse() {
        let c = parse(&[]).expect("defaults");
        assert_eq!((c.max_zmq_connections, c.zmq_idle_timeout), (4096, None));
        let c = parse(&["--max-zmq-connections", "8", "--zmq-idle-timeout", "2.5"]).expect("valid");
        assert_eq!(
            (c.max_zmq_connections, c.zmq_idle_timeout),
            (8, Some(Duration::from_millis(2500)))
        );
        let e = parse(&["--zmq-idle-timeout", "-3"]).expect_err("negative");
        assert!(e.contains("--zmq-idle-timeout"), "{e}");
    }

    /// `--cluster-snapshot-records` is a shared cluster flag: `serve` and `coordinator` both
    /// take it (and its variable's default) into their cluster settings.
    #[test]
    fn both_cluster_subcommands_take_the_snapshot_interval() {
        let records = |sub: &str, extra: &[&str]| {
            let mut full = vec!["kvplane", sub, "--cluster", "nats://127.0.0.1:4222"];
            full.extend_from_slice(extra);
            let cluster = match Cli::try_parse_from(full).map(|c| c.command) {
                Ok(Command::Serve(a)) => a.cluster,
                Ok(Command::Coordinator(a)) => a.cluster,
                other => panic!("not serve or coordinator: {other:?}"),
            };
            let config = cluster.config().expect("valid").expect("clustered");
            config.snapshot_records
        };
        let default = kvplane::config::defaults::cluster::SNAPSHOT_RECORDS;
        for sub in ["serve", "coordinator"] {
            assert_eq!(records(sub, &[]), default, "{sub}");
            assert_eq!(
                records(sub, &["--cluster-snapshot-records", "7"]),
                7,
                "{sub}"
            );
        }
    }

    #[test]
    fn indexer_defaults_and_port_zero() {
        let indexer = |args: &[&str]| {
            let mut full = vec!["kvplane", "indexer"];
            full.extend_from_slice(args);
            match Cli::try_parse_from(full).map(|c| c.command) {
                Ok(Command::Indexer(a)) => a.config(),
                other => panic!("not indexer: {other:?}"),
            }
        };
        let c = indexer(&[]);
        assert_eq!((c.host.as_str(), c.port), ("0.0.0.0", 13333));
        assert_eq!((c.index.seed, c.index.ttl_secs), (1337, None));
        let c = indexer(&["--port", "0", "--ttl-secs", "600", "--hash-seed", "0"]);
        assert_eq!((c.port, c.index.ttl_secs, c.index.seed), (0, Some(600), 0));
        assert_eq!((c.queue_capacity, c.max_queued_bytes), (256, 16 << 20));
        // The record ids bound the memberships: a larger cap is refused, naming the range.
        let max = kvplane::indexer::index::MAX_MEMBERSHIPS;
        let c = indexer(&["--max-memberships", &max.to_string()]);
        assert_eq!(c.index.max_memberships, max);
        for bad in [(max + 1).to_string(), "0".into(), "lots".into()] {
            let err = Cli::try_parse_from(["kvplane", "indexer", "--max-memberships", &bad])
                .map(|_| ())
                .expect_err("refused");
            assert!(err.to_string().contains("from 1 to 268435453"), "{err}");
        }
    }

    /// Zero limits and bad durations are refused naming the flag, never raised silently.
    #[test]
    fn indexer_and_router_refuse_what_they_used_to_clamp() {
        for flag in [
            "--queue-capacity",
            "--max-queued-bytes",
            "--max-frame-bytes",
            "--max-services",
            "--max-body-bytes",
            "--max-http-connections",
            "--replay-timeout-ms",
            "--http-read-timeout",
        ] {
            let err = Cli::try_parse_from(["kvplane", "indexer", flag, "0"])
                .map(|_| ())
                .expect_err("refused");
            assert!(err.to_string().contains(flag), "{flag}: {err}");
        }
        let err = Cli::try_parse_from(["kvplane", "indexer", "--cluster-max-bytes", "5"])
            .map(|_| ())
            .expect_err("refused");
        assert!(err.to_string().contains("--cluster-max-bytes"), "{err}");
        for (flag, value) in [
            ("--connect-timeout", "0"),
            ("--health-interval", "-1"),
            ("--load-scale", "0.5"),
            ("--max-body-bytes", "0"),
        ] {
            let cli = Cli::try_parse_from([
                "kvplane",
                "router",
                "--model",
                "m",
                "--engine",
                "http://h:1",
                &format!("{flag}={value}"),
            ])
            .expect("parses");
            let Command::Router(a) = cli.command else {
                panic!("not router")
            };
            let err = a.config().expect_err("refused");
            assert!(err.contains(flag), "{flag}: {err}");
        }
    }

    #[test]
    fn router_engines_weights_and_refusals() {
        let router = |args: &[&str]| {
            let mut full = vec!["kvplane", "router", "--model", "m"];
            full.extend_from_slice(args);
            match Cli::try_parse_from(full).map(|c| c.command) {
                Ok(Command::Router(a)) => a.config(),
                Err(e) => Err(e.to_string()),
                other => panic!("not router: {other:?}"),
            }
        };
        let c = router(&[
            "--engine",
            "http://10.0.0.5:8000/",
            "--engine",
            "http://h:8001,instance=v1,events=tcp://h:5557,replay=tcp://h:5558,dp_rank=2,type=sglang",
        ])
        .expect("valid");
        assert_eq!((c.port, c.block_size), (9500, 16));
        assert_eq!(c.engines[0].url, "http://10.0.0.5:8000");
        assert_eq!(c.engines[0].instance, "10.0.0.5:8000");
        assert_eq!(c.engines[1].instance, "v1");
        assert_eq!(c.engines[1].events.as_deref(), Some("tcp://h:5557"));
        assert_eq!(c.engines[1].replay.as_deref(), Some("tcp://h:5558"));
        assert_eq!(c.engines[1].dp_rank, 2);
        assert_eq!(c.weights, kvplane::router::Weights::default());
        for (bad, says) in [
            (vec!["--engine", "10.0.0.5:8000"], "must start with http://"),
            (
                vec!["--engine", "http://h:1,color=red"],
                "unknown or invalid",
            ),
            (
                vec!["--engine", "http://h:1,events=h:5557"],
                "unknown or invalid",
            ),
            (
                vec!["--engine", "http://h:1", "--cpu-tier-weight", "2"],
                "within 0..=1",
            ),
            (vec!["--engine", "http://h:1", "--temperature=-1"], "≥ 0"),
            (vec!["--engine", "http://h:1", "--block-size", "0"], "> 0"),
            (vec![], "--engine"),
        ] {
            let err = router(&bad).expect_err("refused");
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }

    #[test]
    fn defaults_match_lmcache() {
        let c = parse(&[]).expect("defaults are valid");
        assert_eq!((c.host.as_str(), c.http_port), ("0.0.0.0", 9000));
        assert_eq!(
            c.monitor_ports,
            MonitorPorts {
                pull: Some(8300),
                reply: Some(8400),
                heartbeat: Some(8082)
            }
        );
        assert_eq!(c.worker_timeout, Duration::from_secs(300));
    }

    #[test]
    fn monitor_ports_subset_and_errors() {
        let c = parse(&["--monitor-ports", r#"{"pull":0,"reply":0}"#]).expect("subset");
        assert_eq!(c.monitor_ports.heartbeat, None);
        let e = parse(&["--monitor-ports", r#"{"pull":1,"bogus":2}"#]).expect_err("unknown key");
        assert!(e.contains("--monitor-ports"), "{e}");
        assert!(parse(&["--monitor-ports", "8300"]).is_err());
    }

    #[test]
    fn health_check_minus_one_is_off_and_bad_values_name_the_flag() {
        let c = parse(&["--health-check-interval", "-1"]).expect("off");
        assert_eq!(c.health_check_interval, None);
        let e = parse(&["--lmcache-worker-timeout", "0"]).expect_err("zero timeout");
        assert!(e.contains("--lmcache-worker-timeout"), "{e}");
        let e = parse(&["--health-check-interval", "-5"]).expect_err("negative");
        assert!(e.contains("--health-check-interval"), "{e}");
    }

    #[test]
    fn http_flags_defaults_and_validation() {
        let c = parse(&[]).expect("defaults");
        assert_eq!(c.api_token, None);
        assert_eq!(c.lookup_chunk_size, 256);
        assert_eq!(c.lookup_none_hash, ChunkHash::from_i64(0));
        let c = parse(&[
            "--api-token",
            "s3cret",
            "--lookup-chunk-size",
            "16",
            "--lookup-none-hash",
            "18446744073709551615",
        ])
        .expect("valid");
        assert_eq!(c.api_token, Some(ApiToken::new("s3cret")));
        assert!(
            !format!("{c:?}").contains("s3cret"),
            "the token is redacted"
        );
        assert_eq!(c.lookup_chunk_size, 16);
        assert_eq!(c.lookup_none_hash, ChunkHash::from_u64(u64::MAX));
        let c = parse(&["--lookup-none-hash", "-5", "--api-token", ""]).expect("valid");
        assert_eq!(c.lookup_none_hash, ChunkHash::from_i64(-5));
        assert_eq!(c.api_token, None, "an empty token means no token");
        let e = parse(&["--lookup-chunk-size", "0"]).expect_err("zero");
        assert!(e.contains("--lookup-chunk-size"), "{e}");
        let e = parse(&["--lookup-none-hash", "18446744073709551616"]).expect_err("too big");
        assert!(e.contains("--lookup-none-hash"), "{e}");
    }

    #[test]
    fn resource_limits_have_defaults_and_refuse_zero() {
        let c = parse(&[]).expect("defaults");
        assert_eq!(c.max_concurrent_probes, 64);
        assert_eq!(
            parse(&["--max-concurrent-probes", "8"]).map(|c| c.max_concurrent_probes),
            Ok(8)
        );
        assert_eq!(
            (
                c.max_workers,
                c.max_keys_per_worker,
                c.max_batch_ops,
                c.max_body_bytes,
                c.max_frame_bytes
            ),
            (65_536, 16_777_216, 65_536, 4 << 20, 64 << 20)
        );
        assert_eq!(
            (
                c.max_body_items,
                c.max_http_connections,
                c.http_read_timeout
            ),
            (1 << 18, 1024, Duration::from_secs(30))
        );
        let c = parse(&[
            "--max-body-items",
            "10",
            "--max-http-connections",
            "2",
            "--http-read-timeout",
            "0.5",
        ])
        .expect("valid");
        assert_eq!(
            (
                c.max_body_items,
                c.max_http_connections,
                c.http_read_timeout
            ),
            (10, 2, Duration::from_millis(500))
        );
        assert!(parse(&["--http-read-timeout", "0"])
            .expect_err("zero")
            .contains("--http-read-timeout"));
        let c = parse(&[
            "--max-workers",
            "3",
            "--max-keys-per-worker",
            "0",
            "--max-batch-ops",
            "50",
            "--max-body-bytes",
            "1024",
        ])
        .expect("valid");
        assert_eq!(
            (
                c.max_workers,
                c.max_keys_per_worker,
                c.max_batch_ops,
                c.max_body_bytes
            ),
            (3, 0, 50, 1024)
        );
        for flag in [
            "--max-workers",
            "--max-batch-ops",
            "--max-body-bytes",
            "--max-body-items",
            "--max-http-connections",
            "--max-frame-bytes",
            "--max-zmq-connections",
            "--max-concurrent-probes",
        ] {
            let e = parse(&[flag, "0"]).expect_err("zero");
            assert!(e.contains(flag), "{e}");
        }
    }
}
