//! A dashboard's server-side history: a fixed-size ring of samples, each a time and a few
//! named values, taken every few seconds by a background sampler, so a page opened now draws
//! the last minutes at once instead of collecting them itself.
//!
//! Knows no service: what a sample holds is up to the closure given to [`spawn_sampler`]
//! (cumulative counters, which the page turns into rates, or gauges such as bytes held).
//! The set of names may change from one sample to the next (a tenant appears, another goes):
//! [`History::page`] sends one column per name seen in the samples kept, `null` where a
//! sample lacks it.
//!
//! A feed asks for the history with `?history=1` ([`HistoryQuery`]) and is answered, not to
//! be cached, by [`feed_response`].
//!
//! Memory is bounded: `capacity` samples of at most `max_series` values (16 bytes each), and
//! a name table pruned to the names still used once it holds `4 × max_series`.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use parking_lot::Mutex;
use serde::ser::{SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The dashboards' sampling period (their own poll interval).
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);

/// How far back the dashboards' histories go.
pub const SPAN: Duration = Duration::from_secs(15 * 60);

/// One sample as the sampler produces it: Unix time (seconds) and named values.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// Unix time in seconds.
    pub t: f64,
    /// `(name, value)` pairs; only the first `max_series` are kept.
    pub values: Vec<(String, f64)>,
}

impl Sample {
    /// A sample at Unix time `t`.
    pub fn at(t: f64) -> Self {
        Self {
            t,
            values: Vec::new(),
        }
    }

    /// Adds one value (builder style).
    #[must_use]
    pub fn with(mut self, name: impl Into<String>, value: f64) -> Self {
        self.values.push((name.into(), value));
        self
    }

    /// Adds one value.
    pub fn push(&mut self, name: impl Into<String>, value: f64) {
        self.values.push((name.into(), value));
    }
}

/// One kept sample: its time and its values, each under an interned name id.
type Stored = (f64, Box<[(u32, f64)]>);

/// The ring: samples with interned names.
#[derive(Debug, Default)]
struct Ring {
    samples: VecDeque<Stored>,
    names: Vec<Arc<str>>,
    ids: HashMap<Arc<str>, u32>,
}

impl Ring {
    fn id(&mut self, name: &str) -> u32 {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        let id = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        let name: Arc<str> = Arc::from(name);
        self.names.push(Arc::clone(&name));
        self.ids.insert(name, id);
        id
    }

    /// Keeps only the names the kept samples use, renumbered in their old order.
    fn prune_names(&mut self) {
        let mut used = vec![false; self.names.len()];
        for (_, values) in &self.samples {
            for (id, _) in values.iter() {
                if let Some(u) = used.get_mut(*id as usize) {
                    *u = true;
                }
            }
        }
        let mut remap = vec![u32::MAX; self.names.len()];
        let mut names = Vec::new();
        for (old, name) in self.names.iter().enumerate() {
            if used[old] {
                remap[old] = u32::try_from(names.len()).unwrap_or(u32::MAX);
                names.push(Arc::clone(name));
            }
        }
        for (_, values) in &mut self.samples {
            for (id, _) in values.iter_mut() {
                *id = remap[*id as usize];
            }
        }
        self.ids = names
            .iter()
            .enumerate()
            .map(|(i, n)| (Arc::clone(n), u32::try_from(i).unwrap_or(u32::MAX)))
            .collect();
        self.names = names;
    }
}

/// A bounded ring of samples (see the module docs).
#[derive(Debug)]
pub struct History {
    interval: Duration,
    capacity: usize,
    max_series: usize,
    ring: Mutex<Ring>,
}

/// The history as a feed sends it: `columns` are `t` then every name, `rows` one array per
/// sample, oldest first (`null` where a sample has no value for a column).
#[derive(Debug, Serialize)]
pub struct HistoryPage {
    /// Seconds between samples.
    pub interval_s: f64,
    /// `t`, then the names.
    pub columns: Vec<String>,
    /// One row per sample.
    pub rows: Vec<Row>,
}

/// One sample in column order.
#[derive(Debug)]
pub struct Row(pub Vec<Option<f64>>);

impl Serialize for Row {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for v in &self.0 {
            match v {
                // Whole numbers as integers (shorter, and what counters are).
                Some(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => {
                    seq.serialize_element(&(*x as i64))?;
                }
                Some(x) if x.is_finite() => seq.serialize_element(x)?,
                _ => seq.serialize_element(&Option::<f64>::None)?,
            }
        }
        seq.end()
    }
}

impl History {
    /// A ring of `span / interval` samples (at least one) of at most `max_series` values.
    pub fn new(interval: Duration, span: Duration, max_series: usize) -> Self {
        let capacity = (span.as_secs_f64() / interval.as_secs_f64().max(1e-3)).floor();
        Self {
            interval,
            capacity: (capacity as usize).max(1),
            max_series: max_series.max(1),
            ring: Mutex::new(Ring::default()),
        }
    }

    /// The dashboards' ring: a sample every [`SAMPLE_EVERY`] for [`SPAN`] (450 samples).
    pub fn dashboard(max_series: usize) -> Self {
        Self::new(SAMPLE_EVERY, SPAN, max_series)
    }

    /// Samples kept at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Appends a sample (its first `max_series` values), dropping the oldest when full.
    pub fn push(&self, sample: &Sample) {
        let mut ring = self.ring.lock();
        let mut values = Vec::with_capacity(sample.values.len().min(self.max_series));
        for (name, v) in sample.values.iter().take(self.max_series) {
            values.push((ring.id(name), *v));
        }
        if ring.samples.len() == self.capacity {
            ring.samples.pop_front();
        }
        let t = (sample.t * 1000.0).round() / 1000.0;
        ring.samples.push_back((t, values.into_boxed_slice()));
        if ring.names.len() > 4 * self.max_series {
            ring.prune_names();
        }
    }

    /// Every sample kept, oldest first, with the columns they use.
    pub fn page(&self) -> HistoryPage {
        let ring = self.ring.lock();
        let mut used = vec![false; ring.names.len()];
        for (_, values) in &ring.samples {
            for (id, _) in values.iter() {
                used[*id as usize] = true;
            }
        }
        let mut column_of = vec![usize::MAX; ring.names.len()];
        let mut columns = vec!["t".to_owned()];
        for (id, name) in ring.names.iter().enumerate() {
            if used[id] {
                column_of[id] = columns.len();
                columns.push(name.to_string());
            }
        }
        let rows = ring
            .samples
            .iter()
            .map(|(t, values)| {
                let mut row = vec![None; columns.len()];
                row[0] = Some(*t);
                for (id, v) in values.iter() {
                    row[column_of[*id as usize]] = Some(*v);
                }
                Row(row)
            })
            .collect();
        HistoryPage {
            interval_s: self.interval.as_secs_f64(),
            columns,
            rows,
        }
    }

    /// Samples kept.
    pub fn len(&self) -> usize {
        self.ring.lock().samples.len()
    }

    /// No sample yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Names in the table now (for tests of the pruning).
    pub fn names(&self) -> usize {
        self.ring.lock().names.len()
    }
}

/// `?history=1` on a dashboard's feed: the page asks for the history on its first poll.
#[derive(Debug, Default, Deserialize)]
pub struct HistoryQuery {
    /// `1` asks for the history; anything else, or nothing, does not.
    pub history: Option<String>,
}

impl HistoryQuery {
    /// `history`'s page, when the query asks for it.
    #[must_use]
    pub fn page(&self, history: &History) -> Option<HistoryPage> {
        (self.history.as_deref() == Some("1")).then(|| history.page())
    }
}

/// A dashboard's feed answered: `body` as JSON, never cached (`no-store`), not sniffed.
pub fn feed_response(body: &impl Serialize) -> Response {
    (
        [
            (header::CACHE_CONTROL, "no-store"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        Json(body),
    )
        .into_response()
}

/// Unix time now, in seconds.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Spawns the task that pushes `sample()` into `history` every interval (the first at once).
///
/// The task holds the history weakly and ends when its last owner (the router serving it)
/// is dropped, or when `sample` answers `None` (the service is stopping). Without a tokio
/// runtime (a router built outside one) no task is spawned and the history stays empty.
pub fn spawn_sampler<F, Fut>(history: &Arc<History>, mut sample: F)
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Option<Sample>> + Send,
{
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak: Weak<History> = Arc::downgrade(history);
    let every = history.interval;
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            if weak.strong_count() == 0 {
                return;
            }
            let Some(s) = sample().await else {
                return;
            };
            match weak.upgrade() {
                Some(h) => h.push(&s),
                None => return,
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: f64, pairs: &[(&str, f64)]) -> Sample {
        Sample {
            t,
            values: pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
        }
    }

    #[test]
    fn the_dashboard_ring_keeps_fifteen_minutes_at_two_seconds() {
        let h = History::dashboard(8);
        assert_eq!(h.capacity(), 450);
        for i in 0..460 {
            h.push(&sample(f64::from(i), &[("a", f64::from(i) * 2.0)]));
        }
        let page = h.page();
        assert_eq!(page.rows.len(), 450);
        assert_eq!(page.rows[0].0[0], Some(10.0), "the oldest ten are gone");
        assert_eq!(page.rows[0].0[1], Some(20.0));
        assert_eq!(page.interval_s, 2.0);
    }

    #[test]
    fn columns_follow_the_names_and_missing_values_are_null() {
        let h = History::new(Duration::from_secs(1), Duration::from_secs(10), 8);
        h.push(&sample(1.0, &[("usage:a", 5.0), ("quota:a", 10.0)]));
        h.push(&sample(2.0, &[("usage:a", 6.0), ("usage:b", 1.5)]));
        let v = serde_json::to_value(h.page()).expect("json");
        assert_eq!(
            v["columns"],
            serde_json::json!(["t", "usage:a", "quota:a", "usage:b"])
        );
        assert_eq!(
            v["rows"],
            serde_json::json!([[1, 5, 10, null], [2, 6, null, 1.5]])
        );
    }

    #[test]
    fn values_and_names_are_bounded() {
        let h = History::new(Duration::from_secs(1), Duration::from_secs(3), 2);
        // Three values a sample: only two kept.
        h.push(&sample(0.0, &[("a", 1.0), ("b", 2.0), ("c", 3.0)]));
        assert_eq!(h.page().columns.len(), 3, "t, a, b");
        // Names churn (a new tenant every sample): the table is pruned to those in use.
        for i in 0..100 {
            h.push(&sample(f64::from(i), &[(&format!("n{i}"), 1.0)]));
            assert!(h.names() <= 4 * 2 + 1, "{} names", h.names());
        }
        let page = h.page();
        assert_eq!(page.rows.len(), 3);
        let cols: Vec<&str> = page.columns.iter().map(String::as_str).collect();
        assert_eq!(cols, ["t", "n97", "n98", "n99"]);
        assert_eq!(page.rows[2].0, vec![Some(99.0), None, None, Some(1.0)]);
    }

    #[test]
    fn non_finite_values_are_null_and_fractions_stay() {
        let h = History::new(Duration::from_secs(1), Duration::from_secs(10), 4);
        h.push(&sample(1.2345, &[("x", f64::NAN), ("y", 0.25)]));
        let v = serde_json::to_value(h.page()).expect("json");
        assert_eq!(v["rows"], serde_json::json!([[1.235, null, 0.25]]));
    }

    #[tokio::test(start_paused = true)]
    async fn the_sampler_samples_every_interval_and_stops_with_its_history() {
        let h = Arc::new(History::new(
            Duration::from_secs(2),
            Duration::from_secs(60),
            4,
        ));
        let n = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = Arc::clone(&n);
        spawn_sampler(&h, move || {
            let v = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move { Some(Sample::at(v as f64).with("v", v as f64)) }
        });
        // The first sample at once, then one every 2 s (paused time).
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(h.len(), 6);
        drop(h);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            n.load(std::sync::atomic::Ordering::Relaxed),
            6,
            "no sample taken once the history is gone"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_sampler_stops_when_the_service_does() {
        let h = Arc::new(History::new(
            Duration::from_secs(1),
            Duration::from_secs(60),
            4,
        ));
        let n = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = Arc::clone(&n);
        spawn_sampler(&h, move || {
            let v = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move { (v < 3).then(|| Sample::at(v as f64)) }
        });
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(h.len(), 3);
        assert_eq!(n.load(std::sync::atomic::Ordering::Relaxed), 4);
    }

    #[test]
    fn no_runtime_no_sampler() {
        let h = Arc::new(History::dashboard(2));
        spawn_sampler(&h, || async { Some(Sample::at(0.0)) });
        assert!(h.is_empty());
    }
}
