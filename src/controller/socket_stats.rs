//! Live counters of the three socket loops (serving, messages in hand, backlog), updated by
//! the loops and read by `/metrics` and `/readyz`. Plain atomics; owns nothing else.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// Live state of one socket loop, updated by the loop and read by `/metrics` and `/readyz`.
///
/// LMCache reads `has_pending` from libzmq's `ZMQ_EVENTS`, which the `zeromq` crate does not
/// expose. Here it is sampled by the loop itself: each time it comes back for the next message
/// it records whether one was already waiting (the receive completed on its first poll) —
/// a backlog — or whether it had to wait.
#[derive(Debug, Default)]
pub struct SocketLoopStats {
    configured: bool,
    serving: AtomicBool,
    active: AtomicI64,
    backlog: AtomicBool,
}

/// Marks a loop as serving until dropped.
#[derive(Debug)]
#[must_use = "the loop is serving only while the guard lives"]
pub struct ServingGuard<'a>(&'a SocketLoopStats);

impl Drop for ServingGuard<'_> {
    fn drop(&mut self) {
        self.0.serving.store(false, Ordering::Relaxed);
    }
}

/// Counts `n` messages as being handled until dropped.
#[derive(Debug)]
#[must_use = "the messages count as active only while the guard lives"]
pub struct ActiveGuard<'a>(&'a SocketLoopStats, i64);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(self.1, Ordering::Relaxed);
    }
}

impl SocketLoopStats {
    /// Stats of a loop that runs when `configured` (its port was given).
    pub fn new(configured: bool) -> Self {
        SocketLoopStats {
            configured,
            ..SocketLoopStats::default()
        }
    }

    /// The loop's port was configured.
    pub fn configured(&self) -> bool {
        self.configured
    }

    /// The loop is running and receiving.
    pub fn serving(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }

    /// Messages (frames, on PULL) received and not yet fully handled.
    pub fn active(&self) -> i64 {
        self.active.load(Ordering::Relaxed)
    }

    /// The last receive found a message already waiting.
    pub fn backlog(&self) -> bool {
        self.backlog.load(Ordering::Relaxed)
    }

    /// Called by the loop when it starts receiving; it stops counting as serving when the
    /// guard drops (loop exit, shutdown).
    pub fn start_serving(&self) -> ServingGuard<'_> {
        self.serving.store(true, Ordering::Relaxed);
        ServingGuard(self)
    }

    /// Counts `n` messages as in hand while the guard lives.
    pub fn handling(&self, n: usize) -> ActiveGuard<'_> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        self.active.fetch_add(n, Ordering::Relaxed);
        ActiveGuard(self, n)
    }

    /// Awaits `receive` (a socket receive), recording whether it was ready at once.
    pub async fn observe<F: Future>(&self, receive: F) -> F::Output {
        let mut receive = std::pin::pin!(receive);
        let mut first = true;
        std::future::poll_fn(|cx| {
            let poll = receive.as_mut().poll(cx);
            if first {
                first = false;
                self.backlog.store(poll.is_ready(), Ordering::Relaxed);
            }
            poll
        })
        .await
    }
}

/// The three socket loops' stats.
#[derive(Debug, Default)]
pub struct SocketStats {
    /// PULL loop.
    pub pull: SocketLoopStats,
    /// Reply ROUTER loop.
    pub reply: SocketLoopStats,
    /// Heartbeat ROUTER loop.
    pub heartbeat: SocketLoopStats,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn loop_stats_record_backlog_and_active_messages() {
        let stats = SocketLoopStats::new(true);
        assert!(stats.configured() && !stats.serving());
        {
            let _serving = stats.start_serving();
            assert!(stats.serving());
            assert_eq!(stats.observe(async { 1 }).await, 1);
            assert!(stats.backlog(), "ready at once: a message was waiting");
            stats
                .observe(tokio::time::sleep(std::time::Duration::from_millis(5)))
                .await;
            assert!(!stats.backlog(), "had to wait: no backlog");
            let _a = stats.handling(50);
            assert_eq!(stats.active(), 50);
        }
        assert_eq!(stats.active(), 0);
        assert!(!stats.serving());
    }
}
