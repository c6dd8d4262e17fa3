//! Leases: one holder at a time per key, in the cluster's JetStream key-value bucket
//! `kvplane-<cluster>-leases`, whose entries expire `lease_ttl` after their last write.
//!
//! Taking a lease is a `create` (succeeds only when the key holds nothing: never taken, or
//! expired); renewing is an `update` that names the revision the holder last wrote, so it
//! fails once anyone else has written the key or it expired — the holder has lost it and must
//! stop. The revision is the fencing token: it only ever grows, so whatever a holder stamps
//! with it is ordered after everything an earlier holder stamped. A holder also counts the
//! lease lost by its own clock once a full TTL passed since the last renewal it sent that
//! succeeded, whether or not it can reach NATS to hear so.

use super::{Cluster, ClusterError};
use async_nats::jetstream::kv;
use bytes::Bytes;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The cluster's lease bucket.
#[derive(Clone, Debug)]
pub struct LeaseBucket {
    store: kv::Store,
    ttl: Duration,
    timeout: Duration,
}

/// A lease held.
#[derive(Clone, Debug)]
pub struct Lease {
    /// The key leased (one per service: `controller`, `coordinator`).
    pub key: String,
    /// Who holds it.
    pub holder: String,
    /// The revision of the last write: the fencing token ([`Lease::epoch`] is the first).
    pub revision: u64,
    /// The revision it was taken at.
    pub epoch: u64,
    /// When the last successful renewal (or the take) was sent.
    pub renewed: Instant,
}

/// Why a renewal failed.
#[derive(Debug, thiserror::Error)]
pub enum RenewError {
    /// Someone else wrote the key, or it expired: the lease is gone.
    #[error("lease {0:?} lost: it expired or another holder took it")]
    Lost(String),
    /// NATS did not answer; the lease may still be held until its TTL runs out.
    #[error("lease {key:?} not renewed: {reason}")]
    Unreachable {
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
}

impl Cluster {
    /// The lease bucket, created if missing (entries live `lease_ttl` without a write).
    ///
    /// # Errors
    /// JetStream disabled, or no answer within the timeout.
    pub async fn lease_bucket(&self) -> Result<LeaseBucket, ClusterError> {
        let bucket = format!("kvplane-{}-leases", self.config.name);
        let store = self.open_kv(&bucket, self.config.lease_ttl).await?;
        // The bucket's entries expire after the max age it was created with, whatever this
        // process was told: renewing or trusting a lease on another TTL would let two holders
        // overlap. The bucket's wins.
        let ttl = match store.status().await {
            Ok(status) if !status.max_age().is_zero() => status.max_age(),
            _ => self.config.lease_ttl,
        };
        if ttl != self.config.lease_ttl {
            tracing::warn!(
                "--cluster-lease-ttl {:?} differs from the {:?} the lease bucket {bucket} was \
                 created with (by the first process of cluster {:?}); using {:?}",
                self.config.lease_ttl,
                ttl,
                self.config.name,
                ttl
            );
        }
        Ok(LeaseBucket {
            store,
            ttl,
            timeout: self.config.timeout,
        })
    }
}

impl LeaseBucket {
    /// How long a lease lasts without renewal: the bucket's max age (the `lease_ttl` of the
    /// process that created it).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Who holds `key` now, and at which revision (`None`: nobody, or NATS did not answer).
    pub async fn holder(&self, key: &str) -> Option<(String, u64)> {
        let entry = tokio::time::timeout(self.timeout, self.store.entry(key))
            .await
            .ok()?
            .ok()??;
        if entry.operation != kv::Operation::Put {
            return None;
        }
        Some((
            String::from_utf8_lossy(&entry.value).into_owned(),
            entry.revision,
        ))
    }

    /// Takes `key` once it is free, trying every eighth of the TTL; `None` once `cancel`.
    /// `on_wait` is told the current holder each time the key is taken.
    pub async fn acquire(
        &self,
        key: &str,
        holder: &str,
        cancel: &CancellationToken,
        mut on_wait: impl FnMut(Option<(String, u64)>),
    ) -> Option<Lease> {
        let poll = (self.ttl / 8).max(Duration::from_millis(20));
        loop {
            let sent = Instant::now();
            let create = self.store.create(key, Bytes::from(holder.to_owned()));
            match tokio::time::timeout(self.timeout, create).await {
                Ok(Ok(revision)) => {
                    return Some(Lease {
                        key: key.to_owned(),
                        holder: holder.to_owned(),
                        revision,
                        epoch: revision,
                        renewed: sent,
                    })
                }
                Ok(Err(e)) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                    on_wait(self.holder(key).await);
                }
                Ok(Err(e)) => tracing::warn!("lease {key:?}: cannot take it: {e}"),
                Err(_) => tracing::warn!("lease {key:?}: NATS did not answer in time"),
            }
            tokio::select! {
                () = cancel.cancelled() => return None,
                () = tokio::time::sleep(poll) => {}
            }
        }
    }

    /// Renews `lease` (see the module docs).
    ///
    /// # Errors
    /// [`RenewError::Lost`] when it is gone; [`RenewError::Unreachable`] when NATS did not
    /// answer, including when the lease's TTL ran out by this process's clock meanwhile.
    pub async fn renew(&self, lease: &mut Lease) -> Result<(), RenewError> {
        let sent = Instant::now();
        let update = self.store.update(
            &lease.key,
            Bytes::from(lease.holder.clone()),
            lease.revision,
        );
        let unreachable = |reason: String| RenewError::Unreachable {
            key: lease.key.clone(),
            reason,
        };
        // Never wait past the lease's own end for an answer.
        let wait = self
            .ttl
            .saturating_sub(lease.renewed.elapsed())
            .min(self.timeout);
        match tokio::time::timeout(wait, update).await {
            Ok(Ok(revision)) => {
                lease.revision = revision;
                lease.renewed = sent;
                Ok(())
            }
            Ok(Err(e)) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                Err(RenewError::Lost(lease.key.clone()))
            }
            Ok(Err(e)) => Err(unreachable(e.to_string())),
            Err(_) => Err(unreachable(format!("no answer within {wait:?}"))),
        }
    }

    /// Whether `lease` has certainly lapsed by this process's clock (a full TTL since the
    /// last renewal that succeeded was sent).
    pub fn lapsed(&self, lease: &Lease) -> bool {
        lease.renewed.elapsed() >= self.ttl
    }

    /// Renews `lease` every quarter of the TTL until `shutdown` (then releases it) or until it
    /// is lost; `renewed` is told of each renewal that succeeded.
    ///
    /// # Errors
    /// The lease was lost (refused, or no renewal succeeded for a whole TTL): the caller must
    /// stop acting as its holder at once.
    pub async fn hold(
        &self,
        mut lease: Lease,
        shutdown: &CancellationToken,
        mut renewed: impl FnMut(&Lease),
    ) -> Result<(), String> {
        let every = self.ttl / 4;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => {
                    self.release(&lease).await;
                    return Ok(());
                }
                () = tokio::time::sleep(every) => {}
            }
            match self.renew(&mut lease).await {
                Ok(()) => renewed(&lease),
                Err(e @ RenewError::Lost(_)) => return Err(e.to_string()),
                Err(e) => {
                    if self.lapsed(&lease) {
                        return Err(format!("{e}; its TTL ran out"));
                    }
                    tracing::warn!("{e}");
                }
            }
        }
    }

    /// Writes `key` as `holder`'s, whoever held it, and returns the revision written: an
    /// epoch later than every lease and stamp before it, for a leader that takes no lease (the
    /// indexer's ingester, the only one of its cluster by configuration).
    ///
    /// # Errors
    /// NATS did not answer, or refused.
    pub async fn stamp(&self, key: &str, holder: &str) -> Result<u64, String> {
        let put = self.store.put(key, Bytes::from(holder.to_owned()));
        tokio::time::timeout(self.timeout, put)
            .await
            .map_err(|_| format!("lease {key:?}: no answer within {:?}", self.timeout))?
            .map_err(|e| format!("lease {key:?}: {e}"))
    }

    /// Gives `lease` up at once (a clean shutdown: the next holder need not wait for the
    /// TTL). Best effort.
    pub async fn release(&self, lease: &Lease) {
        let delete = self
            .store
            .delete_expect_revision(&lease.key, Some(lease.revision));
        if let Ok(Err(e)) = tokio::time::timeout(self.timeout, delete).await {
            tracing::debug!("lease {:?}: release failed: {e}", lease.key);
        }
    }
}

/// Whether this process certainly still holds its lease, by its own clock: until a TTL after
/// the last renewal that succeeded was sent (NATS expires the key no earlier). A leader checks
/// it, through its [`super::Fence`], before an action another leader must not also take (the
/// coordinator's evictions, the controller's commands to workers).
#[derive(Debug)]
pub struct LeaseGuard {
    origin: Instant,
    ttl: Duration,
    until_us: std::sync::atomic::AtomicU64,
}

impl LeaseGuard {
    /// For `lease`, just taken, of `ttl`.
    pub fn new(lease: &Lease, ttl: Duration) -> Self {
        let g = LeaseGuard {
            origin: lease.renewed,
            ttl,
            until_us: std::sync::atomic::AtomicU64::new(0),
        };
        g.renewed(lease);
        g
    }

    /// `lease` was renewed.
    pub fn renewed(&self, lease: &Lease) {
        let until = lease.renewed.saturating_duration_since(self.origin) + self.ttl;
        let us = u64::try_from(until.as_micros()).unwrap_or(u64::MAX);
        self.until_us
            .fetch_max(us, std::sync::atomic::Ordering::Relaxed);
    }

    /// The lease is gone.
    pub fn revoke(&self) {
        self.until_us.store(0, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the lease is certainly still held.
    pub fn held(&self) -> bool {
        let now = u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX);
        now < self.until_us.load(std::sync::atomic::Ordering::Relaxed)
    }
}
