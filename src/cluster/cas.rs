//! Compare-and-set entries in a JetStream key-value bucket, shared by every process of a
//! cluster: read an entry with its revision, write it only if nobody wrote it since
//! (`update` naming that revision, `create` when it has none), and watch every entry's
//! changes. One history per key (the latest value), no expiry: whoever writes an entry keeps
//! what it means (deadlines, counts) inside its value.
//!
//! Here: the bucket (also the lease bucket's opener, [`Cluster::open_kv`]), bounded calls,
//! the watcher. Must not: know what an entry means.

use super::{Cluster, ClusterError};
use async_nats::jetstream::{kv, stream};
use bytes::Bytes;
use futures_util::StreamExt;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A bucket of compare-and-set entries.
#[derive(Clone, Debug)]
pub struct CasBucket {
    store: kv::Store,
    timeout: Duration,
    name: String,
}

/// Why a write did not happen.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CasError {
    /// Someone wrote the entry since the revision named: read it again.
    #[error("the entry changed since it was read")]
    Conflict,
    /// NATS did not answer in time, or refused for another reason.
    #[error("NATS: {0}")]
    Unreachable(String),
}

/// One entry's value at one revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CasEntry {
    /// Its key.
    pub key: String,
    /// Its value (empty when deleted).
    pub value: Bytes,
    /// The bucket revision that wrote it.
    pub revision: u64,
}

impl Cluster {
    /// Opens key-value bucket `bucket`, creating it when missing: one value per key, file
    /// storage, entries dropped `max_age` after their last write (`ZERO`: kept).
    ///
    /// # Errors
    /// JetStream disabled, or no answer within the timeout.
    pub(crate) async fn open_kv(
        &self,
        bucket: &str,
        max_age: Duration,
    ) -> Result<kv::Store, ClusterError> {
        let err = |reason: String| ClusterError::Stream {
            stream: format!("KV_{bucket}"),
            reason,
        };
        let open = async {
            match self.js.get_key_value(bucket.to_owned()).await {
                Ok(store) => Ok(store),
                Err(_) => {
                    // The bucket's stream, made as JetStream's key-value convention says
                    // (async-nats' own create_key_value first reads account fields that
                    // servers before 2.10, Debian's 2.9 among them, do not send).
                    self.js
                        .get_or_create_stream(stream::Config {
                            name: format!("KV_{bucket}"),
                            subjects: vec![format!("$KV.{bucket}.>")],
                            max_messages_per_subject: 1,
                            max_age,
                            storage: stream::StorageType::File,
                            allow_rollup: true,
                            deny_delete: true,
                            allow_direct: true,
                            discard: stream::DiscardPolicy::New,
                            ..Default::default()
                        })
                        .await
                        .map_err(|e| e.to_string())?;
                    self.js.get_key_value(bucket.to_owned()).await
                }
            }
            .map_err(|e| e.to_string())
        };
        tokio::time::timeout(self.config.timeout, open)
            .await
            .map_err(|_| err(format!("no answer within {:?}", self.config.timeout)))?
            .map_err(err)
    }

    /// The cluster's compare-and-set bucket `kvplane-<cluster>-<suffix>`, created if missing.
    ///
    /// # Errors
    /// JetStream disabled, or no answer within the timeout.
    pub async fn cas_bucket(&self, suffix: &str) -> Result<CasBucket, ClusterError> {
        let name = format!("kvplane-{}-{suffix}", self.config.name);
        let store = self.open_kv(&name, Duration::ZERO).await?;
        Ok(CasBucket {
            store,
            timeout: self.config.timeout,
            name,
        })
    }
}

impl CasBucket {
    /// The same bucket whose calls wait at most `timeout` (the cluster's timeout otherwise).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The bucket's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `key`'s value and revision now (`None`: never written).
    ///
    /// # Errors
    /// NATS did not answer in time.
    pub async fn get(&self, key: &str) -> Result<Option<CasEntry>, CasError> {
        let read = self.store.entry(key);
        let entry = tokio::time::timeout(self.timeout, read)
            .await
            .map_err(|_| CasError::Unreachable(format!("no answer within {:?}", self.timeout)))?
            .map_err(|e| CasError::Unreachable(e.to_string()))?;
        Ok(entry.map(|e| CasEntry {
            key: e.key,
            value: if e.operation == kv::Operation::Put {
                e.value
            } else {
                Bytes::new()
            },
            revision: e.revision,
        }))
    }

    /// Writes `value` to `key` only if its revision is still `revision` (`None`: only if it
    /// was never written); the new revision.
    ///
    /// # Errors
    /// [`CasError::Conflict`] when someone wrote it since; [`CasError::Unreachable`] when
    /// NATS did not answer in time (the write may or may not have happened).
    pub async fn put_if(
        &self,
        key: &str,
        value: Bytes,
        revision: Option<u64>,
    ) -> Result<u64, CasError> {
        let late = || CasError::Unreachable(format!("no answer within {:?}", self.timeout));
        match revision {
            Some(rev) => {
                match tokio::time::timeout(self.timeout, self.store.update(key, value, rev)).await {
                    Ok(Ok(r)) => Ok(r),
                    Ok(Err(e)) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                        Err(CasError::Conflict)
                    }
                    Ok(Err(e)) => Err(CasError::Unreachable(e.to_string())),
                    Err(_) => Err(late()),
                }
            }
            None => match tokio::time::timeout(self.timeout, self.store.create(key, value)).await {
                Ok(Ok(r)) => Ok(r),
                Ok(Err(e)) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                    Err(CasError::Conflict)
                }
                Ok(Err(e)) => Err(CasError::Unreachable(e.to_string())),
                Err(_) => Err(late()),
            },
        }
    }

    /// Sends every entry's latest value, then each change as it happens, into `tx` until
    /// `cancel` (or `tx` closes). A broken watch (NATS down, the consumer lost) starts again
    /// after a pause, with every entry's latest value first.
    pub fn watch(
        &self,
        tx: mpsc::Sender<CasEntry>,
        cancel: CancellationToken,
        tasks: &tokio_util::task::TaskTracker,
    ) {
        let store = self.store.clone();
        let name = self.name.clone();
        tasks.spawn(async move {
            loop {
                let watched = async {
                    let mut watch = store
                        .watch_with_history(">")
                        .await
                        .map_err(|e| e.to_string())?;
                    while let Some(entry) = watch.next().await {
                        let e = entry.map_err(|e| e.to_string())?;
                        let value = if e.operation == kv::Operation::Put {
                            e.value
                        } else {
                            Bytes::new()
                        };
                        let sent = tx.send(CasEntry {
                            key: e.key,
                            value,
                            revision: e.revision,
                        });
                        if sent.await.is_err() {
                            return Ok(());
                        }
                    }
                    Err("the watch ended".to_owned())
                };
                let result = tokio::select! {
                    () = cancel.cancelled() => return,
                    r = watched => r,
                };
                if tx.is_closed() {
                    return;
                }
                if let Err(e) = result {
                    tracing::warn!("watch of bucket {name}: {e}; retrying");
                }
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        });
    }
}
