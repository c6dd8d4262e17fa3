//! The skeleton every service stands on: [`Running`], the handle `start()` returns (named
//! bound addresses, the service's state, a `stop()` that cancels, drains within a deadline
//! and runs the service's after-drain steps; dropped, it cancels); [`StartError`], the one
//! reason a service did not start; [`runner`], the one loop `main` runs any set of services
//! in (signals cancel, one failing stops the others, the first error is the exit status);
//! and [`layers`], the one configuration convention (the flag > its `KVPLANE_<SERVICE>_*`
//! twin > the replaced system's variables > a `--config` file > the default).
//!
//! Below every service and knows none of them: a service's names (flags, variables, file
//! keys) are handed in by the service's own `config.rs`.

pub mod layers;
pub mod runner;

use futures_util::future::BoxFuture;
use std::net::SocketAddr;
use std::time::Duration;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

/// How long [`Running::stop`] waits for a service's tasks before giving up on them.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(5);

/// Why a service did not start (or, for `--cluster`, had to stop).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener could not be bound.
    #[error("cannot bind the {what} listener on {addr}: {source}")]
    Bind {
        /// Which listener (`http`, `pull`, `lm`, …).
        what: &'static str,
        /// The address tried.
        addr: String,
        /// Why.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// `--cluster`: NATS unreachable, the takeover failed, or the lease was lost.
    #[error("cluster: {0}")]
    Cluster(String),
    /// The configuration cannot work (names the flag or file at fault).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Something the service needs at start could not be opened or started.
    #[error("cannot {what}: {source}")]
    Resource {
        /// What was being done, e.g. `open L2 at /data`.
        what: String,
        /// Why.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl StartError {
    /// A bind failure of the `what` listener on `addr`.
    pub fn bind(
        what: &'static str,
        addr: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Bind {
            what,
            addr: addr.into(),
            source: source.into(),
        }
    }

    /// A resource that could not be opened or started.
    pub fn resource(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Resource {
            what: what.into(),
            source: source.into(),
        }
    }
}

/// Binds a TCP listener for `what` on `addr` (port 0 picks one), naming both on failure.
///
/// # Errors
/// [`StartError::Bind`].
pub async fn bind_tcp(
    what: &'static str,
    addr: &str,
) -> Result<(tokio::net::TcpListener, SocketAddr), StartError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| StartError::bind(what, addr, e))?;
    let bound = listener
        .local_addr()
        .map_err(|e| StartError::bind(what, addr, e))?;
    Ok((listener, bound))
}

/// Binds a TCP listener for `what` on `host` (a name or an address, an IPv6 literal with or
/// without its brackets) at `port`, as [`bind_tcp`].
///
/// # Errors
/// [`StartError::Bind`].
pub async fn bind_host(
    what: &'static str,
    host: &str,
    port: u16,
) -> Result<(tokio::net::TcpListener, SocketAddr), StartError> {
    bind_tcp(what, &crate::net::host_port(host, port)).await
}

/// One step of a stop: an async action run once.
type Step = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

/// A running service: its state (`S`, reached through `Deref`), its bound addresses by name,
/// and its tasks. [`Running::stop`] stops it gracefully; dropping it cancels every task
/// (without waiting for them).
pub struct Running<S> {
    service: S,
    name: &'static str,
    addrs: Vec<(&'static str, SocketAddr)>,
    shutdown: CancellationToken,
    tasks: Vec<TaskTracker>,
    drain_deadline: Duration,
    before_cancel: Vec<Step>,
    after_drain: Vec<Step>,
    _cancel_on_drop: DropGuard,
}

impl<S> Running<S> {
    /// A running service `name` whose tasks are in `tasks` and stop on `shutdown`.
    pub fn new(
        name: &'static str,
        service: S,
        shutdown: CancellationToken,
        tasks: TaskTracker,
    ) -> Self {
        Self {
            service,
            name,
            addrs: Vec::new(),
            _cancel_on_drop: shutdown.clone().drop_guard(),
            shutdown,
            tasks: vec![tasks],
            drain_deadline: DRAIN_DEADLINE,
            before_cancel: Vec::new(),
            after_drain: Vec::new(),
        }
    }

    /// Records a bound address under `what` (`http`, `pull`, `lm`, …).
    #[must_use]
    pub fn with_addr(mut self, what: &'static str, addr: SocketAddr) -> Self {
        self.addrs.push((what, addr));
        self
    }

    /// Also waits for `tasks` at stop (within the same deadline): work that is not
    /// cancelled but must finish, like writes to disk.
    #[must_use]
    pub fn also_drains(mut self, tasks: TaskTracker) -> Self {
        self.tasks.push(tasks);
        self
    }

    /// Waits at most `deadline` for the tasks at stop (default [`DRAIN_DEADLINE`]).
    #[must_use]
    pub fn drain_deadline(mut self, deadline: Duration) -> Self {
        self.drain_deadline = deadline;
        self
    }

    /// A step [`Running::stop`] runs first, before anything is cancelled (e.g. stop the
    /// HTTP server alone and write a last checkpoint). Steps run in the order added.
    #[must_use]
    pub fn before_cancel<F>(mut self, step: impl FnOnce() -> F + Send + 'static) -> Self
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.before_cancel.push(Box::new(move || Box::pin(step())));
        self
    }

    /// A step [`Running::stop`] runs once the tasks have drained (or the deadline passed):
    /// e.g. deregister from a peer, stop an embedded service. Steps run in the order added.
    #[must_use]
    pub fn after_drain<F>(mut self, step: impl FnOnce() -> F + Send + 'static) -> Self
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.after_drain.push(Box::new(move || Box::pin(step())));
        self
    }

    /// The service's name (`controller`, `indexer`, …).
    #[must_use]
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The address bound for `what`, if any.
    #[must_use]
    pub fn addr(&self, what: &str) -> Option<SocketAddr> {
        self.addrs.iter().find(|(w, _)| *w == what).map(|(_, a)| *a)
    }

    /// Every bound address, by name, in the order bound.
    #[must_use]
    pub fn addrs(&self) -> &[(&'static str, SocketAddr)] {
        &self.addrs
    }

    /// The service's state.
    #[must_use]
    pub fn service(&self) -> &S {
        &self.service
    }

    /// The token that stops the service's tasks.
    #[must_use]
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Stops the service: its before-cancel steps, then the state is dropped, every task
    /// cancelled and awaited (at most the drain deadline), then its after-drain steps.
    pub async fn stop(self) {
        let Self {
            service,
            name,
            shutdown,
            tasks,
            drain_deadline,
            before_cancel,
            after_drain,
            ..
        } = self;
        for step in before_cancel {
            step().await;
        }
        // The state may hold handles whose drop ends a task (a publisher that ends once
        // every handle is gone).
        drop(service);
        shutdown.cancel();
        for t in &tasks {
            t.close();
        }
        let drained = async {
            for t in &tasks {
                t.wait().await;
            }
        };
        if tokio::time::timeout(drain_deadline, drained).await.is_err() {
            tracing::warn!("some {name} tasks did not stop within {drain_deadline:?}");
        }
        for step in after_drain {
            step().await;
        }
    }

    /// Serves until `shutdown` fires, then stops.
    pub async fn serve_until(self, shutdown: CancellationToken) {
        shutdown.cancelled().await;
        tracing::info!("{} shutting down", self.name);
        self.stop().await;
    }
}

impl<S> std::ops::Deref for Running<S> {
    type Target = S;
    fn deref(&self) -> &S {
        &self.service
    }
}
