//! The controller's one source of time.
//!
//! Every time the controller reads — registration and heartbeat times, liveness, full-sync
//! expiry, the command log — is [`Clock::now`]: the Unix time at start plus the
//! `tokio::time::Instant` elapsed since. Under `tokio::time::pause()` the clock stands still
//! and moves only with `tokio::time::advance`, so tests drive timeouts without sleeping.
//! [`Clock::skip`] moves one clock forward without touching tokio's (for tests over real
//! sockets, where paused time would also fire the sockets' own timeouts).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// Unix seconds since start, from a monotonic origin. Cheap to clone; clones share [`skip`].
///
/// [`skip`]: Clock::skip
#[derive(Clone, Debug)]
pub struct Clock {
    /// `None`: a clock standing still (moved only by [`Clock::skip`]).
    origin: Option<Instant>,
    unix_at_origin: f64,
    skipped_micros: Arc<AtomicU64>,
}

impl Clock {
    /// A clock reading the system's Unix time now, then advancing with tokio's clock.
    pub fn system() -> Self {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        Self::starting_at(unix)
    }

    /// A clock that reads `unix_seconds` now and then advances with tokio's clock.
    pub fn starting_at(unix_seconds: f64) -> Self {
        Clock {
            origin: Some(Instant::now()),
            unix_at_origin: unix_seconds,
            skipped_micros: Arc::default(),
        }
    }

    /// A clock standing at `unix_seconds`, moved only by [`Clock::skip`] (for tests that
    /// check exact times while using real sockets and real tokio time).
    pub fn fixed(unix_seconds: f64) -> Self {
        Clock {
            origin: None,
            unix_at_origin: unix_seconds,
            skipped_micros: Arc::default(),
        }
    }

    /// Now, in Unix seconds (the unit of LMCache's `registration_time`).
    pub fn now(&self) -> f64 {
        let skipped = Duration::from_micros(self.skipped_micros.load(Ordering::Relaxed));
        let elapsed = self.origin.map_or(Duration::ZERO, |o| o.elapsed());
        self.unix_at_origin + (elapsed + skipped).as_secs_f64()
    }

    /// Moves this clock (and its clones) forward by `by`, leaving tokio's timers alone.
    pub fn skip(&self, by: Duration) {
        let micros = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.skipped_micros.fetch_add(micros, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn follows_paused_tokio_time_and_skips() {
        let clock = Clock::starting_at(1_000.0);
        assert_eq!(clock.now(), 1_000.0);
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(clock.now(), 1_030.0);
        clock.clone().skip(Duration::from_secs(5));
        assert_eq!(clock.now(), 1_035.0);
        let fixed = Clock::fixed(7.0);
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(fixed.now(), 7.0);
        fixed.skip(Duration::from_millis(1_500));
        assert_eq!(fixed.now(), 8.5);
    }
}
