//! The dashboard's history: a ring of the cumulative counters the charts draw, sampled by
//! [`sample_loop`] every [`SAMPLE_EVERY`] for [`HISTORY`], so the page has 15 minutes of data
//! the moment it opens instead of collecting them itself.
//!
//! Owns the ring only; reads the counters through [`super::counters::counters`] and nothing
//! else of the controller's state. Memory is fixed: [`CAPACITY`] samples of six numbers.

use super::counters::counters;
use crate::controller::Driver;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Time between two samples (the page's own poll interval).
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);

/// How far back the history goes.
pub const HISTORY: Duration = Duration::from_secs(15 * 60);

/// Samples kept: [`HISTORY`] / [`SAMPLE_EVERY`] = 450.
pub const CAPACITY: usize = (HISTORY.as_secs() / SAMPLE_EVERY.as_secs()) as usize;

/// Column names of a sample, sent with them.
const COLUMNS: [&str; 6] = ["t", "admit", "evict", "hit", "miss", "dropped"];

/// One sample: Unix time (seconds, ms precision), then cumulative counters in [`COLUMNS`]
/// order (ops admitted, ops evicted, P2P lookup hits, misses, frames dropped).
type Sample = (f64, u64, u64, u64, u64, u64);

/// The ring of samples.
#[derive(Debug, Default)]
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
}

/// The history as the feed sends it.
#[derive(Debug, Serialize)]
pub struct HistoryPage {
    interval_s: f64,
    columns: [&'static str; 6],
    rows: Vec<Sample>,
}

impl History {
    /// Takes one sample of `shared`'s counters at Unix time `now`, dropping the oldest once
    /// [`CAPACITY`] are kept.
    pub fn sample(&self, shared: &Driver, now: f64) {
        let c = counters(shared);
        let sample = (
            (now * 1000.0).round() / 1000.0,
            c.ops_admit,
            c.ops_evict,
            c.p2p_lookup_hit,
            c.p2p_lookup_miss,
            c.frames_dropped,
        );
        let mut samples = self.samples.lock();
        if samples.len() == CAPACITY {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// Every sample kept, oldest first.
    pub fn page(&self) -> HistoryPage {
        HistoryPage {
            interval_s: SAMPLE_EVERY.as_secs_f64(),
            columns: COLUMNS,
            rows: self.samples.lock().iter().copied().collect(),
        }
    }

    /// Samples kept.
    pub fn len(&self) -> usize {
        self.samples.lock().len()
    }

    /// No sample yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Samples `shared` into `history` every [`SAMPLE_EVERY`] until `shutdown`.
pub async fn sample_loop(shared: Arc<Driver>, history: Arc<History>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => history.sample(&shared, shared.now()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServeConfig;

    #[test]
    fn the_ring_keeps_the_last_fifteen_minutes() {
        assert_eq!(CAPACITY, 450);
        let shared = Driver::new(ServeConfig::ephemeral(), None);
        let history = History::default();
        for i in 0..CAPACITY + 10 {
            shared
                .metrics
                .ops_applied
                .with_label_values(&["admit"])
                .inc();
            history.sample(&shared, i as f64);
        }
        let page = history.page();
        assert_eq!(page.rows.len(), CAPACITY);
        assert_eq!(page.rows[0].0, 10.0, "the oldest ten are gone");
        assert_eq!(
            page.rows[0].1, 11,
            "cumulative admits at the oldest kept sample"
        );
        assert_eq!(page.rows[CAPACITY - 1].1, CAPACITY as u64 + 10);
    }

    #[tokio::test(start_paused = true)]
    async fn the_sampler_samples_every_interval_and_stops() {
        let shared = Arc::new(Driver::new(ServeConfig::ephemeral(), None));
        let history = Arc::new(History::default());
        let stop = CancellationToken::new();
        let task = tokio::spawn(sample_loop(
            Arc::clone(&shared),
            Arc::clone(&history),
            stop.clone(),
        ));
        // The first tick is immediate; then one sample per interval (paused time).
        tokio::time::sleep(SAMPLE_EVERY * 5 + SAMPLE_EVERY / 2).await;
        assert_eq!(history.len(), 6);
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .expect("the sampler stops")
            .expect("no panic");
    }
}
