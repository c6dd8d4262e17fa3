//! The two waits of the integration tests, both bounded: [`within`] (one await) and
//! [`eventually`] (poll a condition until it holds). A deadline here proves that something
//! happens at all — a liveness check — and is generous on purpose; no test asserts how fast
//! anything is (that is a benchmark's job: `kvplane bench`, benches/, docs/BENCHMARKS.md).
//! Both follow tokio's clock, so a test on paused time (`tokio::time::pause`) waits on it.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

/// Bound on any single await in a test.
pub const STEP: Duration = Duration::from_secs(10);

/// Bound on a wait that spans process starts, elections or a Python peer's work.
pub const SLOW: Duration = Duration::from_secs(60);

/// Awaits `f`, failing the test after [`STEP`].
pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(STEP, f)
        .await
        .unwrap_or_else(|_| panic!("timed out after {STEP:?}: {what}"))
}

/// What one check of [`eventually`] returns: done (with a value), or not yet (with what it
/// saw, for the failure message).
pub trait Poll {
    /// What [`eventually`] returns once the check passes.
    type Value;
    /// `Ok` when done, `Err(what was seen)` when not yet.
    fn check(self) -> Result<Self::Value, String>;
}

impl Poll for bool {
    type Value = ();
    fn check(self) -> Result<(), String> {
        if self {
            Ok(())
        } else {
            Err("false".into())
        }
    }
}

impl<T> Poll for Option<T> {
    type Value = T;
    fn check(self) -> Result<T, String> {
        self.ok_or_else(|| "None".into())
    }
}

impl<T, E: Display> Poll for Result<T, E> {
    type Value = T;
    fn check(self) -> Result<T, String> {
        self.map_err(|e| e.to_string())
    }
}

/// Runs `check` until it passes — `true`, `Some(v)` or `Ok(v)` — and returns its value; polls
/// every few milliseconds at first, backing off to 100 ms. Panics after `limit` with `what` and
/// the last thing the check saw (`Err(seen)` is the way to show it). A check that does not
/// finish is cut off at the deadline too.
pub async fn eventually<P: Poll>(
    what: &str,
    limit: Duration,
    check: impl AsyncFnMut() -> P,
) -> P::Value {
    try_eventually(what, limit, check)
        .await
        .unwrap_or_else(|why| panic!("{why}"))
}

/// [`eventually`] that returns the failure message instead of panicking (for a caller that
/// retries or adds context).
pub async fn try_eventually<P: Poll>(
    what: &str,
    limit: Duration,
    mut check: impl AsyncFnMut() -> P,
) -> Result<P::Value, String> {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(2);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let seen = match tokio::time::timeout(left, check()).await {
            Ok(outcome) => match outcome.check() {
                Ok(value) => return Ok(value),
                Err(seen) => seen,
            },
            Err(_) => "(the last check did not finish)".into(),
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(format!("not within {limit:?}: {what}; last seen: {seen}"));
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}
