//! The part of a takeover every leader-with-standbys service shares: announce the new epoch in
//! the service's log and read the log back up to it, holding the lease meanwhile.

use super::{Cluster, Lease, LeaseBucket, RenewError};
use bytes::Bytes;
use std::time::{Duration, Instant};

/// Least time between two snapshots one follower publishes.
pub const MIN_SNAPSHOT_INTERVAL: Duration = Duration::from_secs(10);

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
