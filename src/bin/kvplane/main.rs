//! The `kvplane` binary: parse flags, start logging, run the library, map errors to exit codes.

use anyhow::Context;
mod cli;
mod tiers_link;

use cli::Command;
use kvplane::controller;
use kvplane::service::layers::{Embedded, Settings};
use kvplane::service::runner::Runner;

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // A closed stderr must not panic the task that logs (it would not stop the process).
        .log_internal_errors(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let (cli, prov) = cli::parse()?;
    for w in &prov.warnings {
        tracing::warn!("{w}");
    }
    if let Some(f) = &prov.file {
        tracing::info!("settings read from {}", f.display());
    }
    // A refused value names its flag; say where a layered one came from.
    let explain = |e: kvplane::config::ConfigError| anyhow::anyhow!(prov.explain(&e.to_string()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    match cli.command {
        Command::Serve(args) => {
            if args.monitor_port.is_some() {
                tracing::warn!("--monitor-port is deprecated and ignored (as in LMCache 0.5.6); use --monitor-ports");
            }
            let config = args.validate().map_err(explain)?;
            let cluster = args.cluster.config().map_err(explain)?;
            if args.replica {
                anyhow::ensure!(
                    args.indexer_port.is_none()
                        && args.coordinator_port.is_none()
                        && args.router_port.is_none(),
                    "--replica serves the controller's read routes only: drop --indexer-port, \
                     --coordinator-port and --router-port"
                );
                let cluster = cluster.context("--replica needs --cluster")?;
                return run(&runtime, |mut runner| {
                    runner.add("controller", |t| {
                        controller::run_replica(config, cluster, t)
                    });
                    async { Ok(runner) }
                });
            }
            // The services run in this process read their own flags' variables and their
            // section of serve's settings file.
            let file = prov.file.as_deref().map(Settings::read).transpose()?;
            let section = |name: &str| file.as_ref().map(|f| f.section(name)).transpose();
            let env = |k: &str| std::env::var(k).ok();
            let indexer = match args.indexer_port {
                Some(port) => Some(kvplane::indexer::embedded(&Embedded::new(
                    &config.host,
                    port,
                    &env,
                    section("indexer")?.flatten().as_ref(),
                ))?),
                None => None,
            };
            let router = match args.router_port {
                Some(_) if args.indexer_port.is_none() => anyhow::bail!(
                    "--router-port runs the router beside the indexer: give --indexer-port too"
                ),
                Some(port) => Some(kvplane::router::config::embedded(&Embedded::new(
                    &config.host,
                    port,
                    &env,
                    section("router")?.flatten().as_ref(),
                ))?),
                None => None,
            };
            let coordinator = match args.coordinator_port {
                Some(port) => Some(kvplane::coordinator::config::args::embedded(
                    &Embedded::new(
                        &config.host,
                        port,
                        &env,
                        section("coordinator")?.flatten().as_ref(),
                    ),
                )?),
                None => None,
            };
            run(&runtime, |mut runner| {
                let token = runner.token();
                async move {
                    // With --cluster, nothing binds until this process holds the lease.
                    let leadership = match cluster {
                        Some(c) => match controller::standby(config.clone(), c, &token).await? {
                            Some(l) => Some(l),
                            None => return Ok(runner),
                        },
                        None => None,
                    };
                    runner.add("controller", |t| async move {
                        match leadership {
                            Some(l) => controller::run_leader(l, t).await,
                            None => {
                                controller::start(config).await?.serve_until(t).await;
                                Ok(())
                            }
                        }
                    });
                    // Both: the coordinator's applied batches feed the indexer (LMCache tiers);
                    // the coordinator starts once the indexer has.
                    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
                    let (router_tx, router_rx) = tokio::sync::oneshot::channel();
                    let linked = indexer.is_some() && coordinator.is_some();
                    if let Some(c) = indexer {
                        runner.add_service("indexer", async move {
                            let server = kvplane::indexer::start(c).await?;
                            let _ = started_tx.send(std::sync::Arc::clone(&server.state));
                            let _ =
                                router_tx.send((std::sync::Arc::clone(&server.state), server.addr));
                            Ok(server)
                        });
                    }
                    // The router asks the indexer's index directly, once it has started.
                    if let Some(c) = router {
                        runner.add_service("router", async move {
                            let (index, addr) = router_rx.await.map_err(|_| {
                                kvplane::service::StartError::Config(
                                    "the indexer did not start".into(),
                                )
                            })?;
                            kvplane::router::start_beside(c, index, addr).await
                        });
                    }
                    if let Some(mut c) = coordinator {
                        runner.add_service("coordinator", async move {
                            if linked {
                                let state = started_rx.await.map_err(|_| {
                                    kvplane::service::StartError::Config(
                                        "the indexer did not start".into(),
                                    )
                                })?;
                                c.tap = Some(tiers_link::tap(state));
                            }
                            kvplane::coordinator::start(c).await
                        });
                    }
                    Ok(runner)
                }
            })?;
        }
        Command::Indexer(args) => {
            let config = args.config();
            run(&runtime, |mut runner| {
                runner.add_service("indexer", kvplane::indexer::start(config));
                async { Ok(runner) }
            })?;
        }
        Command::Router(args) => {
            let config = args
                .config()
                .map_err(|e| anyhow::anyhow!(prov.explain(&e)))?;
            if args.doctor {
                let wait =
                    std::time::Duration::try_from_secs_f64(args.doctor_wait).map_err(|_| {
                        anyhow::anyhow!(prov.explain(&format!(
                            "--doctor-wait: {} is not a number of seconds ≥ 0",
                            args.doctor_wait
                        )))
                    })?;
                let verdicts = runtime.block_on(kvplane::router::doctor(config, wait))?;
                let ok = verdicts.iter().all(kvplane::router::doctor::Verdict::ok);
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({"ok": ok, "engines": verdicts})
                    )?
                );
                if !ok {
                    for v in verdicts.iter().filter(|v| !v.ok()) {
                        eprintln!("MISMATCH {}: {} — {}", v.instance, v.status, v.detail);
                    }
                    std::process::exit(1);
                }
                return Ok(());
            }
            run(&runtime, |mut runner| {
                runner.add_service("router", kvplane::router::start(config));
                async { Ok(runner) }
            })?;
        }
        Command::Node(args) => {
            let config = args.validate().map_err(explain)?;
            run(&runtime, |mut runner| {
                runner.add_service("node", kvplane::node::start(config));
                async { Ok(runner) }
            })?;
        }
        Command::Bench(args) if args.target.is_some() => {
            use kvplane::bench::{coordinator, indexer, node, BenchTarget};
            let out = match &args.target {
                Some(BenchTarget::Coordinator(a)) => {
                    let r = runtime
                        .block_on(coordinator::run(a))
                        .map_err(anyhow::Error::msg)?;
                    if a.json {
                        serde_json::to_string_pretty(&r)? + "\n"
                    } else {
                        r.summary()
                    }
                }
                Some(BenchTarget::Node(a)) => {
                    let r = runtime.block_on(node::run(a)).map_err(anyhow::Error::msg)?;
                    if a.json {
                        serde_json::to_string_pretty(&r)? + "\n"
                    } else {
                        r.summary()
                    }
                }
                Some(BenchTarget::Indexer(a)) => {
                    let r = runtime
                        .block_on(indexer::run(a))
                        .map_err(anyhow::Error::msg)?;
                    if a.json {
                        serde_json::to_string_pretty(&r)? + "\n"
                    } else {
                        r.summary()
                    }
                }
                Some(BenchTarget::Route(a)) if a.overhead => {
                    let r = runtime
                        .block_on(kvplane::bench::route_overhead::run(
                            a,
                            a.overhead_prompt_tokens,
                        ))
                        .map_err(anyhow::Error::msg)?;
                    if a.json {
                        serde_json::to_string_pretty(&r)? + "\n"
                    } else {
                        r.summary()
                    }
                }
                Some(BenchTarget::Route(a)) => {
                    let r = runtime
                        .block_on(kvplane::bench::route::run(a))
                        .map_err(anyhow::Error::msg)?;
                    if a.json {
                        serde_json::to_string_pretty(&r)? + "\n"
                    } else {
                        r.summary()
                    }
                }
                Some(BenchTarget::SimEngine(a)) => {
                    runtime
                        .block_on(kvplane::bench::sim_engine::run(a.clone()))
                        .map_err(anyhow::Error::msg)?;
                    String::new()
                }
                None => String::new(),
            };
            print!("{out}");
        }
        Command::Bench(args) => {
            let report = runtime
                .block_on(kvplane::bench::run(&args))
                .map_err(anyhow::Error::msg)?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.summary());
            }
        }
        Command::Coordinator(args) => {
            let config = args.validate().map_err(explain)?;
            let cluster = args.cluster.config().map_err(explain)?;
            run(&runtime, |mut runner| {
                match cluster {
                    // A standby until it holds the coordinator lease: nothing binds before.
                    Some(c) => runner.add("coordinator", |t| {
                        kvplane::coordinator::cluster::run(config, c, t)
                    }),
                    None => runner.add_service("coordinator", kvplane::coordinator::start(config)),
                }
                async { Ok(runner) }
            })?;
        }
    }
    Ok(())
}

/// Runs the services `setup` adds to a [`Runner`] (and returns) until a signal, or until one fails (the
/// first error is the exit status). `setup` may wait (a `--cluster` standby) before adding.
fn run<F, Fut>(runtime: &tokio::runtime::Runtime, setup: F) -> anyhow::Result<()>
where
    F: FnOnce(Runner) -> Fut,
    Fut: std::future::Future<Output = Result<Runner, kvplane::service::StartError>>,
{
    runtime.block_on(async {
        let runner = setup(Runner::new()).await?;
        runner.run().await?;
        Ok(())
    })
}
