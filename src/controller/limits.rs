//! What happens when a resource limit refuses something: one metric increment per refusal
//! (`kvplane_limit_hits_total{limit}`) and a warning naming the flag, at most one per limit
//! every [`LOG_EVERY`], with the number of refusals it stands for — so a peer hammering a
//! limit cannot flood the log.
//!
//! The limits themselves are enforced where the data is: the index (workers, keys per worker,
//! ops per batch), the socket loops and the transport (frame size), the HTTP layer
//! ([`crate::web`]: body size and items, connections, read time).
//!
//! [`LogThrottle`] is the throttle itself; the socket loops also use one for frames they drop,
//! so that a peer sending garbage cannot flood the log either.

use super::metrics::Metrics;
use crate::web::limits::WebLimit;
use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// Shortest interval between two log lines for the same limit.
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(10);

/// A resource limit of `kvplane serve`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `--max-workers`: a registration or a heartbeat from an unknown worker was refused.
    Workers,
    /// `--max-keys-per-worker`: admits of new keys were refused.
    KeysPerWorker,
    /// `--max-batch-ops`: an admit/evict or full-sync batch was refused whole.
    BatchOps,
    /// `--max-frame-bytes`: a ZMQ frame was dropped.
    FrameBytes,
    /// `--max-body-bytes`: an HTTP request got 413.
    HttpBodyBytes,
    /// The full-sync range budget (built in, `ChunkIndexConfig::max_sync_ranges` and
    /// `max_sync_ranges_per_worker`): an out-of-order full-sync batch was refused.
    SyncRanges,
    /// `--max-body-items`: an HTTP request got 413 before its body was parsed.
    HttpBodyItems,
    /// `--max-http-connections`: a connection waited for a free slot.
    HttpConnections,
    /// `--max-http-connections`: an idle keep-alive connection was closed to admit a new one.
    HttpIdleClosed,
    /// `--http-read-timeout`: a client too slow sending a request was cut off.
    HttpReadTimeout,
    /// `--tls-cert`: a TLS handshake failed and the connection was closed.
    HttpTlsHandshake,
}

const ALL: [Limit; 11] = [
    Limit::Workers,
    Limit::KeysPerWorker,
    Limit::BatchOps,
    Limit::FrameBytes,
    Limit::HttpBodyBytes,
    Limit::SyncRanges,
    Limit::HttpBodyItems,
    Limit::HttpConnections,
    Limit::HttpIdleClosed,
    Limit::HttpReadTimeout,
    Limit::HttpTlsHandshake,
];

impl From<WebLimit> for Limit {
    fn from(limit: WebLimit) -> Self {
        match limit {
            WebLimit::BodyBytes => Limit::HttpBodyBytes,
            WebLimit::BodyItems => Limit::HttpBodyItems,
            WebLimit::Connections => Limit::HttpConnections,
            WebLimit::IdleClosed => Limit::HttpIdleClosed,
            WebLimit::ReadTimeout => Limit::HttpReadTimeout,
            WebLimit::TlsHandshake => Limit::HttpTlsHandshake,
        }
    }
}

impl Limit {
    /// The `limit` label of `kvplane_limit_hits_total`.
    pub fn label(self) -> &'static str {
        match self {
            Limit::Workers => "workers",
            Limit::KeysPerWorker => "keys_per_worker",
            Limit::BatchOps => "batch_ops",
            Limit::FrameBytes => "frame_bytes",
            Limit::SyncRanges => "sync_ranges",
            Limit::HttpBodyBytes
            | Limit::HttpBodyItems
            | Limit::HttpConnections
            | Limit::HttpIdleClosed
            | Limit::HttpReadTimeout
            | Limit::HttpTlsHandshake => self.web().label(),
        }
    }

    /// The flag that sets it.
    pub fn flag(self) -> &'static str {
        match self {
            Limit::Workers => "--max-workers",
            Limit::KeysPerWorker => "--max-keys-per-worker",
            Limit::BatchOps => "--max-batch-ops",
            Limit::FrameBytes => "--max-frame-bytes",
            Limit::SyncRanges => "full-sync ranges (built in)",
            Limit::HttpBodyBytes
            | Limit::HttpBodyItems
            | Limit::HttpConnections
            | Limit::HttpIdleClosed
            | Limit::HttpReadTimeout
            | Limit::HttpTlsHandshake => self.web().flag(),
        }
    }

    /// The HTTP layer's name for an HTTP limit (labels and flags are defined there).
    fn web(self) -> WebLimit {
        match self {
            Limit::HttpBodyItems => WebLimit::BodyItems,
            Limit::HttpConnections => WebLimit::Connections,
            Limit::HttpIdleClosed => WebLimit::IdleClosed,
            Limit::HttpReadTimeout => WebLimit::ReadTimeout,
            Limit::HttpTlsHandshake => WebLimit::TlsHandshake,
            _ => WebLimit::BodyBytes,
        }
    }

    fn slot(self) -> usize {
        ALL.iter().position(|l| *l == self).unwrap_or(0)
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct ThrottleState {
    last_log: Option<Instant>,
    suppressed: u64,
}

/// Lets one log line through every [`LOG_EVERY`] and counts the ones it holds back.
#[derive(Debug, Default)]
pub struct LogThrottle {
    slot: Mutex<ThrottleState>,
}

impl LogThrottle {
    /// `Some(lines held back since the last one)` if a line may be logged now, else `None`
    /// (and the line is counted as held back).
    pub fn admit(&self) -> Option<u64> {
        let now = Instant::now();
        let mut slot = self.slot.lock();
        match slot.last_log {
            Some(t) if now.duration_since(t) < LOG_EVERY => {
                slot.suppressed += 1;
                None
            }
            _ => {
                slot.last_log = Some(now);
                Some(std::mem::take(&mut slot.suppressed))
            }
        }
    }
}

/// Per-limit log throttle (see the module docs).
#[derive(Debug, Default)]
pub struct LimitLog {
    slots: [LogThrottle; ALL.len()],
}

impl LimitLog {
    /// Counts one refusal by `limit` (`n` items refused, e.g. keys) and logs it unless the
    /// same limit was logged less than [`LOG_EVERY`] ago. `detail` says who hit it.
    pub fn hit(&self, metrics: &Metrics, limit: Limit, value: u64, detail: &dyn Fn() -> String) {
        metrics.limit_hit(limit.label());
        let Some(suppressed) = self.slots[limit.slot()].admit() else {
            return;
        };
        tracing::warn!(
            limit = limit.label(),
            value,
            suppressed,
            "resource limit {} ({value}) reached: {}; further hits within {LOG_EVERY:?} are only counted (kvplane_limit_hits_total)",
            limit.flag(),
            detail(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hit_is_counted_but_logs_are_throttled() {
        let metrics = Metrics::new();
        let log = LimitLog::default();
        let detail = || "worker a/0".to_owned();
        for _ in 0..5 {
            log.hit(&metrics, Limit::Workers, 2, &detail);
        }
        log.hit(&metrics, Limit::BatchOps, 50, &detail);
        let hits = |l: Limit| metrics.limit_hits.with_label_values(&[l.label()]).get();
        assert_eq!((hits(Limit::Workers), hits(Limit::BatchOps)), (5, 1));
        let slot = |l: Limit| *log.slots[l.slot()].slot.lock();
        let (workers, batches) = (slot(Limit::Workers), slot(Limit::BatchOps));
        // One line logged per limit; the four later hits wait for the next line.
        assert!(workers.last_log.is_some() && batches.last_log.is_some());
        assert_eq!((workers.suppressed, batches.suppressed), (4, 0));
        assert!(slot(Limit::FrameBytes).last_log.is_none());
    }

    #[test]
    fn the_throttle_reports_what_it_held_back() {
        let t = LogThrottle::default();
        assert_eq!(t.admit(), Some(0));
        assert_eq!((t.admit(), t.admit()), (None, None));
        t.slot.lock().last_log = Instant::now().checked_sub(LOG_EVERY);
        assert_eq!(t.admit(), Some(2));
    }
}
