//! The `kvplane` binary: parse flags, start logging, run the library, map errors to exit codes.

use anyhow::Context;
use clap::Parser;
mod cli;
mod coordinator;

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
            let coordinator = match args.coordinator_port {
                Some(port) => Some(coordinator::embedded(&config.host, port)?),
                None => None,
            };
            runtime.block_on(async {
                let shutdown = CancellationToken::new();
                tokio::spawn(cancel_on_signal(shutdown.clone()));
                match coordinator {
                    None => kvplane::run(config, shutdown)
                        .await
                        .map_err(anyhow::Error::from),
                    Some(c) => {
                        let stop = shutdown.clone();
                        let (a, b) = tokio::join!(
                            async {
                                let r = kvplane::run(config, shutdown.clone()).await;
                                shutdown.cancel();
                                r
                            },
                            async {
                                let r = kvplane::coordinator::run(c, stop.clone()).await;
                                stop.cancel();
                                r
                            }
                        );
                        a?;
                        b?;
                        Ok(())
                    }
                }
            })?;
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
            runtime.block_on(async {
                let shutdown = CancellationToken::new();
                tokio::spawn(cancel_on_signal(shutdown.clone()));
                kvplane::coordinator::run(config, shutdown).await
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
