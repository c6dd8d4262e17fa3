//! The one place that runs services until a signal: every subcommand of `kvplane` hands its
//! services (one, or several for `serve --indexer-port --coordinator-port`) to a [`Runner`].
//! SIGINT/SIGTERM cancel them all; one failing (to start or later) stops the others; the
//! first error is the result, so the exit status.
//!
//! Knows no service: a job is a name and a future.

use super::{Running, StartError};
use futures_util::future::BoxFuture;
use std::future::Future;
use tokio_util::sync::CancellationToken;

/// Services to run together until a signal.
pub struct Runner {
    shutdown: CancellationToken,
    jobs: Vec<(&'static str, BoxFuture<'static, Result<(), StartError>>)>,
}

impl Runner {
    /// A runner whose token SIGINT and SIGTERM cancel. Call inside the tokio runtime.
    #[must_use]
    pub fn new() -> Self {
        let shutdown = CancellationToken::new();
        tokio::spawn(cancel_on_signal(shutdown.clone()));
        Self {
            shutdown,
            jobs: Vec::new(),
        }
    }

    /// The token every job stops on (a signal or a failing job cancels it).
    #[must_use]
    pub fn token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Adds a job: `job(token)` runs until the token fires (or fails).
    pub fn add<F, Fut>(&mut self, name: &'static str, job: F)
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = Result<(), StartError>> + Send + 'static,
    {
        self.jobs.push((name, Box::pin(job(self.shutdown.clone()))));
    }

    /// Adds a service: `start` binds it, then it serves until the token fires and stops.
    pub fn add_service<S, Fut>(&mut self, name: &'static str, start: Fut)
    where
        S: Send + 'static,
        Fut: Future<Output = Result<Running<S>, StartError>> + Send + 'static,
    {
        self.add(name, |shutdown| async move {
            start.await?.serve_until(shutdown).await;
            Ok(())
        });
    }

    /// Runs every job until all have ended. The first job to fail cancels the others.
    ///
    /// # Errors
    /// The first job's error (prefixed with its name when several jobs run).
    pub async fn run(self) -> Result<(), RunError> {
        let several = self.jobs.len() > 1;
        let mut set = tokio::task::JoinSet::new();
        for (name, job) in self.jobs {
            set.spawn(async move { (name, job.await) });
        }
        let mut first: Option<RunError> = None;
        while let Some(joined) = set.join_next().await {
            let failed = match joined {
                Ok((_, Ok(()))) => None,
                Ok((name, Err(error))) => Some(RunError {
                    service: several.then_some(name),
                    error,
                }),
                Err(e) => Some(RunError {
                    service: None,
                    error: StartError::resource("run a service task", e),
                }),
            };
            if let Some(f) = failed {
                self.shutdown.cancel();
                // The first error is returned (and printed by the caller); later ones are
                // logged.
                if first.is_some() {
                    tracing::error!("{f}");
                } else {
                    first = Some(f);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Default for Runner {
    fn default() -> Self {
        Self::new()
    }
}

/// A job's failure, naming the service when several ran.
#[derive(Debug, thiserror::Error)]
#[error("{}{error}", service.map(|s| format!("{s}: ")).unwrap_or_default())]
pub struct RunError {
    /// The failing service, when the runner ran several.
    pub service: Option<&'static str>,
    /// Why it failed.
    #[source]
    pub error: StartError,
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
    // Cancel first: logging may fail (a closed stderr) and must not keep the process up.
    let which = tokio::select! {
        () = ctrl_c => "SIGINT",
        () = term => "SIGTERM",
    };
    token.cancel();
    tracing::info!("{which} received");
}
