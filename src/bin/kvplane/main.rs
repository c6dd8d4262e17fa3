//! The `kvplane` binary: parse flags, start logging, run the library, map errors to exit codes.

use anyhow::Context;
use clap::Parser;
mod cli;
mod coordinator;
mod node;

use cli::{Cli, Command};
use tokio_util::sync::CancellationToken;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    match cli.command {
        Command::Serve(args) => {
            if args.monitor_port.is_some() {
                tracing::warn!("--monitor-port is deprecated and ignored (as in LMCache 0.5.6); use --monitor-ports");
            }
            let config = args.validate()?;
            let cluster = args.cluster.config()?;
            if args.replica {
                anyhow::ensure!(
                    args.indexer_port.is_none() && args.coordinator_port.is_none(),
                    "--replica serves the controller's read routes only: drop --indexer-port \
                     and --coordinator-port"
                );
                let cluster = cluster.context("--replica needs --cluster")?;
                runtime.block_on(async {
                    let shutdown = CancellationToken::new();
                    tokio::spawn(cancel_on_signal(shutdown.clone()));
                    kvplane::run_replica(config, cluster, shutdown).await
                })?;
                return Ok(());
            }
            let indexer = args
                .indexer_port
                .map(|port| kvplane::indexer::service::IndexerConfig {
                    host: config.host.clone(),
                    port,
                    ..Default::default()
                });
            let coordinator = match args.coordinator_port {
                Some(port) => Some(coordinator::embedded(&config.host, port)?),
                None => None,
            };
            runtime.block_on(async {
                let shutdown = CancellationToken::new();
                tokio::spawn(cancel_on_signal(shutdown.clone()));
                // With --cluster, nothing binds until this process holds the lease.
                let leadership = match cluster {
                    Some(c) => match kvplane::standby(config.clone(), c, &shutdown).await? {
                        Some(l) => Some(l),
                        None => return Ok(()),
                    },
                    None => None,
                };
                // Every service runs until the shutdown; one failing (to start or later)
                // stops the others, and the first error is the exit status.
                let stop_on_error = |r: anyhow::Result<()>| {
                    if r.is_err() {
                        shutdown.cancel();
                    }
                    r
                };
                let controller = async {
                    let served = match leadership {
                        Some(l) => kvplane::run_leader(l, shutdown.clone()).await,
                        None => kvplane::run(config, shutdown.clone()).await,
                    };
                    stop_on_error(served.map_err(anyhow::Error::from))
                };
                let indexer = async {
                    match indexer {
                        Some(c) => stop_on_error(
                            kvplane::indexer::service::run(c, shutdown.clone())
                                .await
                                .map_err(anyhow::Error::from),
                        ),
                        None => Ok(()),
                    }
                };
                let coordinator = async {
                    match coordinator {
                        Some(c) => stop_on_error(
                            kvplane::coordinator::run(c, shutdown.clone())
                                .await
                                .map_err(anyhow::Error::from),
                        ),
                        None => Ok(()),
                    }
                };
                let (a, b, c) = tokio::join!(controller, indexer, coordinator);
                a.and(b).and(c)
            })?;
        }
        Command::Indexer(args) => {
            runtime.block_on(async {
                let shutdown = CancellationToken::new();
                tokio::spawn(cancel_on_signal(shutdown.clone()));
                kvplane::indexer::service::run(args.config(), shutdown).await
            })?;
        }
        Command::Router(args) => {
            let config = args.config().map_err(anyhow::Error::msg)?;
            if args.doctor {
                let wait = std::time::Duration::try_from_secs_f64(args.doctor_wait)
                    .unwrap_or(std::time::Duration::from_secs(10));
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
            runtime.block_on(async {
                let shutdown = CancellationToken::new();
                tokio::spawn(cancel_on_signal(shutdown.clone()));
                kvplane::router::run(config, shutdown).await
            })?;
        }
        Command::Node(args) => {
            let config = args.validate()?;
            runtime.block_on(async {
                let shutdown = CancellationToken::new();
                tokio::spawn(cancel_on_signal(shutdown.clone()));
                kvplane::node::run(config, shutdown).await
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
            let (config, _) = args.validate(&|k: &str| std::env::var(k).ok())?;
            let cluster = args.cluster.config()?;
            runtime.block_on(async {
                let shutdown = CancellationToken::new();
                tokio::spawn(cancel_on_signal(shutdown.clone()));
                match cluster {
                    // A standby until it holds the coordinator lease: nothing binds before.
                    Some(c) => kvplane::coordinator::cluster::run(config, c, shutdown).await,
                    None => kvplane::coordinator::run(config, shutdown).await,
                }
            })?;
        }
    }
    Ok(())
}

/// Cancels `token` on SIGINT or SIGTERM.
async fn cancel_on_signal(token: CancellationToken) {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!("cannot listen for ctrl-c: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("SIGINT received"),
        () = term => tracing::info!("SIGTERM received"),
    }
    token.cancel();
}
