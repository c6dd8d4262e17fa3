//! The worker's configuration: identity, controller addresses, timers and limits.
//!
//! Every default is LMCache 0.5.6's where LMCache has one (batching, heartbeat, full sync);
//! the limits LMCache lacks (queue bound, request timeout, registration backoff) are kvplane's
//! own and documented on each field. Pure data: no I/O.

use super::WorkerError;
use rand::Rng;
use std::time::Duration;

/// Exponential backoff with jitter: attempt `n` waits a random time in `[d/2, d]` where
/// `d = min(initial · 2^(n-1), max)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Delay before the first retry.
    pub initial: Duration,
    /// Upper bound of any delay.
    pub max: Duration,
}

impl Backoff {
    /// The (jittered) delay before retry number `attempt` (1-based; 0 is treated as 1).
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(20);
        let base = self.initial.saturating_mul(1 << exp).min(self.max);
        let half = base / 2;
        let jitter = if half.is_zero() {
            Duration::ZERO
        } else {
            rand::rng().random_range(Duration::ZERO..=half)
        };
        half + jitter
    }
}

/// How a full sync runs: LMCache's `FullSyncSender` settings (extra_config keys in brackets),
/// with the same defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct FullSyncConfig {
    /// Keys per `FullSyncBatchMsg` (`full_sync_batch_size`, 2000).
    pub batch_size: usize,
    /// Pause between two batches (`full_sync_batch_interval_ms`, 5 ms).
    pub batch_interval: Duration,
    /// A sync starts after a random delay uniform in `0..=startup_delay`, so that a fleet told
    /// to resync at once does not hit the controller at once (`full_sync_startup_delay_s`, 5 s).
    pub startup_delay: Duration,
    /// Pause before each `FullSyncStatusMsg` (`full_sync_status_poll_interval_s`, 5 s).
    pub poll_interval: Duration,
    /// Attempts at `FullSyncStartMsg`, and rounds of resending missing batches
    /// (`full_sync_max_retry_count`, 3).
    pub max_retries: u32,
    /// Pause between two start attempts (`full_sync_retry_delay_s`, 1 s).
    pub retry_delay: Duration,
    /// Status polls before the sync is given up (`full_sync_max_poll_attempts`, 60).
    pub max_polls: u32,
}

impl Default for FullSyncConfig {
    fn default() -> Self {
        FullSyncConfig {
            batch_size: 2000,
            batch_interval: Duration::from_millis(5),
            startup_delay: Duration::from_secs(5),
            poll_interval: Duration::from_secs(5),
            max_retries: 3,
            retry_delay: Duration::from_secs(1),
            max_polls: 60,
        }
    }
}

impl FullSyncConfig {
    /// A random startup delay in `0..=startup_delay`.
    pub fn random_startup_delay(&self) -> Duration {
        if self.startup_delay.is_zero() {
            Duration::ZERO
        } else {
            rand::rng().random_range(Duration::ZERO..=self.startup_delay)
        }
    }
}

/// Everything a worker needs to join a controller (kvplane, or LMCache 0.5.6's).
///
/// Build it with [`WorkerConfig::new`] and change the public fields you need.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerConfig {
    /// LMCache's `lmcache_instance_id`: one vLLM instance (all its TP ranks share it).
    pub instance_id: String,
    /// The worker id: the TP rank (LMCache's `metadata.worker_id`).
    pub worker_id: i64,
    /// The controller's PULL socket, `host:port` (LMCache's `controller_pull_url`).
    pub controller_pull: String,
    /// The controller's reply ROUTER socket, `host:port` (LMCache's `controller_reply_url`).
    pub controller_reply: String,
    /// Host the command (REP) socket binds to; `0.0.0.0` (all interfaces, as LMCache's `*`)
    /// by default.
    pub command_host: String,
    /// Port of the command socket (LMCache's `lmcache_worker_ports[i]`); 0 picks a free port,
    /// see [`WorkerHandle::command_addr`](super::WorkerHandle::command_addr).
    pub command_port: u16,
    /// The ip registered for the command socket, which the controller connects to. `None`
    /// (default): the local address of the route to the controller (`127.0.0.1` for a
    /// controller on loopback), as LMCache's `get_ip()` does for its default route.
    pub advertise_ip: Option<String>,
    /// `host:port` peers fetch KV from (LMCache's `p2p_host:p2p_init_ports[i]`); returned by
    /// P2P lookups of other instances. `None` (default): this worker is never a P2P source.
    pub peer_init_url: Option<String>,
    /// Period of heartbeats. `None` (default, as LMCache's `lmcache_worker_heartbeat_time`):
    /// no periodic heartbeats; the worker still sends one as a probe after a failed request.
    /// Heartbeats are how a worker learns of a controller restart: set this in production.
    pub heartbeat_interval: Option<Duration>,
    /// Delay before the first periodic heartbeat (`lmcache_worker_heartbeat_delay_time`, 10 s).
    pub heartbeat_delay: Duration,
    /// A location's queued ops are flushed once this many are pending (`kv_msg_batch_size`,
    /// 50); also the largest number of ops in one `BatchedKVOperationMsg`.
    pub batch_size: usize,
    /// Pending ops are flushed at most this long after the first was queued
    /// (`kv_msg_batch_timeout`, 10 ms).
    pub flush_interval: Duration,
    /// Bound on every request to the controller (registration, lookup, heartbeat, full-sync
    /// start and status) and on every PUSH send, connecting included. Default 5 s (LMCache:
    /// 30 s receive, 10 s send).
    pub request_timeout: Duration,
    /// Bound on one call of the [`CommandHandler`](super::CommandHandler); the controller gets
    /// an `ErrorMsg` after it. Default 30 s.
    pub command_timeout: Duration,
    /// Capacity of the queue between [`WorkerHandle`](super::WorkerHandle) and the background
    /// task, in ops. When full, `admit`/`evict` fail fast with
    /// [`WorkerError::QueueFull`] and the worker resynchronises with a full sync. Default 65,536.
    pub queue_capacity: usize,
    /// Most ops held back while the worker (re-)registers or full-syncs; beyond it they are
    /// dropped and another full sync follows. Default 1,000,000.
    pub max_held_ops: usize,
    /// P2P lookups in flight at once (each on its own DEALER connection); more wait. Default 16.
    pub max_concurrent_lookups: usize,
    /// Backoff between registration attempts (LMCache tries once and gives up) and between
    /// failed full syncs. Default 250 ms doubling to 10 s.
    pub retry_backoff: Backoff,
    /// Full-sync settings (LMCache's defaults).
    pub full_sync: FullSyncConfig,
    /// Bound on [`WorkerHandle::shutdown`](super::WorkerHandle::shutdown). Default 5 s.
    pub shutdown_timeout: Duration,
}

impl WorkerConfig {
    /// A configuration with LMCache's defaults for worker `worker_id` of `instance_id`,
    /// talking to the controller's PULL and reply sockets (`host:port`, no scheme needed).
    pub fn new(
        instance_id: impl Into<String>,
        worker_id: i64,
        controller_pull: impl Into<String>,
        controller_reply: impl Into<String>,
    ) -> Self {
        WorkerConfig {
            instance_id: instance_id.into(),
            worker_id,
            controller_pull: controller_pull.into(),
            controller_reply: controller_reply.into(),
            command_host: "0.0.0.0".into(),
            command_port: 0,
            advertise_ip: None,
            peer_init_url: None,
            heartbeat_interval: None,
            heartbeat_delay: Duration::from_secs(10),
            batch_size: 50,
            flush_interval: Duration::from_millis(10),
            request_timeout: Duration::from_secs(5),
            command_timeout: Duration::from_secs(30),
            queue_capacity: 65_536,
            max_held_ops: 1_000_000,
            max_concurrent_lookups: 16,
            retry_backoff: Backoff {
                initial: Duration::from_millis(250),
                max: Duration::from_secs(10),
            },
            full_sync: FullSyncConfig::default(),
            shutdown_timeout: Duration::from_secs(5),
        }
    }

    /// Checks the values that would make the worker misbehave.
    ///
    /// # Errors
    /// [`WorkerError::Config`] naming the field at fault.
    pub fn validate(&self) -> Result<(), WorkerError> {
        let fail = |what: &str| Err(WorkerError::Config(what.to_owned()));
        if self.instance_id.is_empty() {
            return fail("instance_id must not be empty");
        }
        if self.controller_pull.is_empty() || self.controller_reply.is_empty() {
            return fail("controller_pull and controller_reply must be host:port");
        }
        if self.batch_size == 0 || self.full_sync.batch_size == 0 {
            return fail("batch_size and full_sync.batch_size must be at least 1");
        }
        if self.queue_capacity == 0 || self.max_concurrent_lookups == 0 {
            return fail("queue_capacity and max_concurrent_lookups must be at least 1");
        }
        if self.request_timeout.is_zero()
            || self.command_timeout.is_zero()
            || self.shutdown_timeout.is_zero()
        {
            return fail("request_timeout, command_timeout and shutdown_timeout must be > 0");
        }
        if self.flush_interval.is_zero() {
            return fail("flush_interval must be > 0");
        }
        if self.heartbeat_interval.is_some_and(|d| d.is_zero()) {
            return fail("heartbeat_interval must be > 0 (or None for off)");
        }
        if self.full_sync.max_retries == 0 || self.full_sync.max_polls == 0 {
            return fail("full_sync.max_retries and full_sync.max_polls must be at least 1");
        }
        if self.retry_backoff.initial.is_zero()
            || self.retry_backoff.max < self.retry_backoff.initial
        {
            return fail("retry_backoff needs 0 < initial <= max");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_lmcaches() {
        let c = WorkerConfig::new("i", 0, "h:1", "h:2");
        assert_eq!(
            (c.batch_size, c.flush_interval),
            (50, Duration::from_millis(10))
        );
        assert_eq!(c.heartbeat_interval, None);
        assert_eq!(c.heartbeat_delay, Duration::from_secs(10));
        let s = c.full_sync;
        assert_eq!(s.batch_size, 2000);
        assert_eq!(s.batch_interval, Duration::from_millis(5));
        assert_eq!(s.startup_delay, Duration::from_secs(5));
        assert_eq!(s.poll_interval, Duration::from_secs(5));
        assert_eq!((s.max_retries, s.max_polls), (3, 60));
        assert_eq!(s.retry_delay, Duration::from_secs(1));
    }

    #[test]
    fn validate_names_the_field() {
        let mut c = WorkerConfig::new("i", 0, "h:1", "h:2");
        assert!(c.validate().is_ok());
        c.batch_size = 0;
        let e = c.validate().expect_err("zero batch");
        assert!(e.to_string().contains("batch_size"), "{e}");
        let mut c = WorkerConfig::new("", 0, "h:1", "h:2");
        assert!(c.validate().is_err());
        c.instance_id = "i".into();
        c.heartbeat_interval = Some(Duration::ZERO);
        assert!(c.validate().is_err());
    }

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        for _ in 0..50 {
            let d1 = b.delay(1);
            assert!(d1 >= Duration::from_millis(50) && d1 <= Duration::from_millis(100));
            let d3 = b.delay(3);
            assert!(d3 >= Duration::from_millis(200) && d3 <= Duration::from_millis(400));
            let big = b.delay(u32::MAX);
            assert!(big >= Duration::from_millis(500) && big <= Duration::from_secs(1));
        }
    }
}
