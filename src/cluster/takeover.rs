//! The part of a takeover every leader-with-standbys service shares: announce the new epoch in
//! the service's log and read the log back up to it, holding the lease meanwhile.

use super::{Cluster, Lease, LeaseBucket, RenewError};
use bytes::Bytes;
use std::time::{Duration, Instant};

/// Least time between two snapshots one follower publishes.
pub const MIN_SNAPSHOT_INTERVAL: Duration = Duration::from_secs(10);

/// When a follower publishes its next snapshot: every `every` records it handled (0: never),
/// at most every [`MIN_SNAPSHOT_INTERVAL`], only while in sync and not leading.
#[derive(Debug)]
pub struct SnapshotSchedule {
    every: u64,
    since: u64,
    last: Option<Instant>,
}

impl SnapshotSchedule {
    /// A schedule of one snapshot every `every` records (0: none).
    pub fn new(every: u64) -> Self {
        Self {
            every,
            since: 0,
            last: None,
        }
    }

    /// Counts one handled record; true when a snapshot is due now (the count and the
    /// interval then start again).
    pub fn handled(&mut self, in_sync: bool, leading: bool) -> bool {
        self.since += 1;
        let due = self.every > 0
            && self.since >= self.every
            && self
                .last
                .is_none_or(|t| t.elapsed() >= MIN_SNAPSHOT_INTERVAL)
            && in_sync
            && !leading;
        if due {
            self.since = 0;
            self.last = Some(Instant::now());
        }
        due
    }
}

/// Room for a record's fields besides its change, under the server's message size.
pub const RECORD_OVERHEAD: usize = 1024;

/// Where a follower's read-back stands: whether it applied the takeover record, and how many
/// log messages it has handled so far (progress).
#[derive(Clone, Copy, Debug)]
pub struct ReadBack {
    /// The takeover record is applied.
    pub done: bool,
    /// Log messages handled since start.
    pub handled: u64,
}

impl Cluster {
    /// Publishes the takeover record `record(fresh)` of `lease`'s epoch to `service`'s log —
    /// `fresh`: the log held nothing before — and waits until `read_back` says the follower
    /// applied it, renewing `lease` every quarter TTL meanwhile (a long backlog may take
    /// longer to read than the lease lives). Waits as long as messages keep being handled,
    /// at most the cluster's timeout without any. Returns `fresh`.
    ///
    /// # Errors
    /// The log cannot be read or written, the follower stalls, or the lease is lost.
    pub async fn announce_takeover(
        &self,
        service: &str,
        bucket: &LeaseBucket,
        lease: &mut Lease,
        record: impl FnOnce(bool) -> Vec<u8>,
        read_back: impl Fn() -> ReadBack,
    ) -> Result<bool, String> {
        let fresh = self
            .stream_is_empty(service)
            .await
            .map_err(|e| format!("cannot read the {service} stream: {e}"))?;
        self.publish_acked(service, Bytes::from(record(fresh)))
            .await
            .map_err(|e| format!("cannot publish the takeover: {e}"))?;
        let timeout = self.config.timeout;
        let every = bucket.ttl() / 4;
        let mut renew_at = Instant::now() + every;
        let mut last = (read_back().handled, Instant::now());
        loop {
            let now = read_back();
            if now.done {
                return Ok(fresh);
            }
            if now.handled != last.0 {
                last = (now.handled, Instant::now());
            } else if last.1.elapsed() >= timeout {
                return Err(format!(
                    "the takeover record was not read back: no record handled for {timeout:?}"
                ));
            }
            if Instant::now() >= renew_at {
                renew_at = Instant::now() + every;
                match bucket.renew(lease).await {
                    Ok(()) => {}
                    Err(e @ RenewError::Lost(_)) => return Err(e.to_string()),
                    Err(e) if bucket.lapsed(lease) => return Err(e.to_string()),
                    Err(e) => tracing::warn!("{e}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

#[cfg(test)]
mod schedule_tests {
    use super::SnapshotSchedule;

    #[test]
    fn a_snapshot_is_due_every_n_records_in_sync_not_leading_and_not_twice_within_the_interval() {
        let mut s = SnapshotSchedule::new(3);
        assert!(!s.handled(true, false));
        assert!(!s.handled(true, false));
        assert!(s.handled(true, false), "the third record");
        // The count starts again, and the interval holds off the next one.
        for _ in 0..5 {
            assert!(!s.handled(true, false));
        }
        let mut out_of_sync = SnapshotSchedule::new(1);
        assert!(!out_of_sync.handled(false, false));
        assert!(
            !out_of_sync.handled(true, true),
            "a leader does not snapshot"
        );
        assert!(out_of_sync.handled(true, false));
        let mut never = SnapshotSchedule::new(0);
        assert!((0..10).all(|_| !never.handled(true, false)));
    }
}
