//! One full sync of one location, as LMCache's `FullSyncSender` runs it (protocol spec §3.5):
//! `FullSyncStartMsg` on the DEALER until accepted (≤ `max_retries` attempts, `retry_delay`
//! apart); the keys in `FullSyncBatchMsg`s of `batch_size` on the PUSH socket,
//! `batch_interval` apart; `FullSyncEndMsg`; then a `FullSyncStatusMsg` every
//! `poll_interval` (≤ `max_polls`), resending the batches the controller reports missing and
//! a new end (≤ `max_retries` rounds).
//!
//! The startup delay and the freeze are the engine's business (it holds ops back while this
//! runs). One difference from LMCache: the sync is done when the controller reports *this*
//! sync complete (`is_complete`), not when the fleet passes the completion threshold
//! (`can_exit_freeze`): held ops only need this worker's sync to be over, and LMCache's exit
//! on `can_exit_freeze` can leave batches missing. Polls exhausted is a failure (LMCache leaves
//! freeze and carries on); the engine then retries after a backoff.

use super::state::{inc, Ctx};
use super::uplink::Uplink;
use super::WorkerError;
use crate::protocol::{
    ChunkHash, FullSyncBatchMsg, FullSyncEndMsg, FullSyncStartMsg, FullSyncStatusMsg, Msg,
};
use rand::Rng;

/// Why a sync did not complete.
#[derive(Debug)]
pub(crate) struct SyncFailure {
    pub reason: String,
    /// The sync id the controller may still consider in progress (start accepted, never
    /// completed). Reusing it for the next attempt restarts that sync instead of being refused
    /// as "already syncing with a different sync_id" (LMCache keeps sync state across
    /// re-registration, spec §7.3).
    pub unfinished: Option<String>,
}

/// `max(1, ceil(total / batch_size))`, as LMCache counts batches.
pub(crate) fn batch_count(total: usize, batch_size: usize) -> usize {
    total.div_ceil(batch_size.max(1)).max(1)
}

/// The keys of batch `batch_id` (empty for the single batch of an empty key set, and for ids
/// out of range).
pub(crate) fn batch_keys(keys: &[ChunkHash], batch_id: usize, batch_size: usize) -> &[ChunkHash] {
    let start = batch_id.saturating_mul(batch_size).min(keys.len());
    let end = start.saturating_add(batch_size).min(keys.len());
    &keys[start..end]
}

/// `"{instance_id}_{worker_id}_{8 hex}"`, LMCache's sync id format.
pub(crate) fn new_sync_id(instance_id: &str, worker_id: i64) -> String {
    let tag: u32 = rand::rng().random();
    format!("{instance_id}_{worker_id}_{tag:08x}")
}

fn as_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Pushes one sync message. A lost batch is reported missing by the status poll and resent,
/// so a failure is only counted and logged.
async fn push(ctx: &Ctx, uplink: &mut Uplink, msg: Msg) {
    if let Err((_, e)) = uplink.push(ctx, &[msg]).await {
        inc(&ctx.stats.push_failures);
        ctx.probe.notify_one();
        tracing::warn!("full-sync push failed (the status poll tells what is missing): {e}");
    }
}

/// Runs one full sync of `location` with the snapshot `keys`, under `sync_id`.
pub(crate) async fn run(
    ctx: &Ctx,
    uplink: &mut Uplink,
    location: &str,
    keys: &[ChunkHash],
    sync_id: String,
) -> Result<(), SyncFailure> {
    let c = &ctx.config;
    let s = &c.full_sync;
    let total = keys.len();
    let batches = batch_count(total, s.batch_size);
    inc(&ctx.stats.full_syncs_started);
    tracing::info!(
        instance = %c.instance_id, worker = c.worker_id, location, %sync_id,
        keys = total, batches, "full sync starting"
    );

    // Start, with retries.
    let start = Msg::FullSyncStartMsg(FullSyncStartMsg {
        instance_id: c.instance_id.clone(),
        worker_id: c.worker_id,
        location: location.to_owned(),
        sync_id: sync_id.clone(),
        total_keys: as_i64(total),
        batch_count: as_i64(batches),
    });
    let mut last_error = String::new();
    let mut accepted = false;
    for attempt in 1..=s.max_retries {
        match uplink.call(ctx, &start).await {
            Ok(Msg::FullSyncStartRetMsg(r)) if r.accepted => {
                accepted = true;
                break;
            }
            Ok(Msg::FullSyncStartRetMsg(r)) => {
                last_error = r.error_msg.unwrap_or_else(|| "not accepted".into());
            }
            Ok(other) => last_error = format!("unexpected reply {}", other.tag()),
            Err(e) => {
                if matches!(e, WorkerError::Timeout(_) | WorkerError::Transport(_)) {
                    ctx.probe.notify_one();
                }
                last_error = e.to_string();
            }
        }
        tracing::warn!(
            instance = %c.instance_id, worker = c.worker_id, %sync_id,
            "FullSyncStart not accepted, attempt {attempt}/{}: {last_error}", s.max_retries
        );
        if attempt < s.max_retries {
            tokio::time::sleep(s.retry_delay).await;
        }
    }
    if !accepted {
        return Err(SyncFailure {
            reason: format!(
                "start not accepted after {} attempts: {last_error}",
                s.max_retries
            ),
            unfinished: None,
        });
    }
    let fail = |reason: String| SyncFailure {
        reason,
        unfinished: Some(sync_id.clone()),
    };

    // Batches, then the end.
    let batch = |batch_id: usize| {
        Msg::FullSyncBatchMsg(FullSyncBatchMsg {
            instance_id: c.instance_id.clone(),
            worker_id: c.worker_id,
            location: location.to_owned(),
            sync_id: sync_id.clone(),
            batch_id: as_i64(batch_id),
            keys: batch_keys(keys, batch_id, s.batch_size).to_vec(),
        })
    };
    let end = Msg::FullSyncEndMsg(FullSyncEndMsg {
        instance_id: c.instance_id.clone(),
        worker_id: c.worker_id,
        location: location.to_owned(),
        sync_id: sync_id.clone(),
        actual_total_keys: as_i64(total),
    });
    for batch_id in 0..batches {
        push(ctx, uplink, batch(batch_id)).await;
        if !s.batch_interval.is_zero() && batch_id + 1 < batches {
            tokio::time::sleep(s.batch_interval).await;
        }
    }
    push(ctx, uplink, end.clone()).await;

    // Poll until complete, resending what is missing.
    let status = Msg::FullSyncStatusMsg(FullSyncStatusMsg {
        instance_id: c.instance_id.clone(),
        worker_id: c.worker_id,
        sync_id: sync_id.clone(),
    });
    let mut resends = 0;
    for poll in 1..=s.max_polls {
        tokio::time::sleep(s.poll_interval).await;
        let st = match uplink.call(ctx, &status).await {
            Ok(Msg::FullSyncStatusRetMsg(st)) => st,
            Ok(other) => {
                tracing::warn!(%sync_id, "unexpected status reply {}", other.tag());
                continue;
            }
            Err(e) => {
                if matches!(e, WorkerError::Timeout(_) | WorkerError::Transport(_)) {
                    ctx.probe.notify_one();
                }
                tracing::warn!(%sync_id, "sync status poll {poll} failed: {e}");
                continue;
            }
        };
        tracing::debug!(
            %sync_id, is_complete = st.is_complete, progress = st.global_progress,
            can_exit_freeze = st.can_exit_freeze, missing = st.missing_batches.len(), "sync status"
        );
        if st.is_complete {
            inc(&ctx.stats.full_syncs_completed);
            tracing::info!(
                instance = %c.instance_id, worker = c.worker_id, location, %sync_id,
                keys = total, "full sync complete"
            );
            return Ok(());
        }
        if st.missing_batches.is_empty() {
            continue;
        }
        if resends >= s.max_retries {
            tracing::error!(%sync_id, missing = ?st.missing_batches, "max resend rounds reached");
            continue;
        }
        resends += 1;
        tracing::warn!(
            %sync_id, missing = ?st.missing_batches,
            "controller reports missing batches, resending (round {resends}/{})", s.max_retries
        );
        for &id in &st.missing_batches {
            let Some(id) = usize::try_from(id).ok().filter(|id| *id < batches) else {
                continue;
            };
            push(ctx, uplink, batch(id)).await;
            if !s.batch_interval.is_zero() {
                tokio::time::sleep(s.batch_interval).await;
            }
        }
        push(ctx, uplink, end.clone()).await;
    }
    Err(fail(format!(
        "not complete after {} status polls",
        s.max_polls
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_cover_the_keys_like_lmcache() {
        assert_eq!(batch_count(0, 2000), 1, "an empty sync still has one batch");
        assert_eq!(batch_count(2000, 2000), 1);
        assert_eq!(batch_count(2001, 2000), 2);
        let keys: Vec<ChunkHash> = (0..5_i64).map(ChunkHash::from).collect();
        let all: Vec<ChunkHash> = (0..batch_count(5, 2))
            .flat_map(|b| batch_keys(&keys, b, 2).to_vec())
            .collect();
        assert_eq!(all, keys);
        assert_eq!(batch_keys(&keys, 2, 2), &keys[4..]);
        assert!(batch_keys(&keys, 9, 2).is_empty());
        assert!(batch_keys(&[], 0, 2000).is_empty());
    }

    #[test]
    fn sync_ids_look_like_lmcaches() {
        let id = new_sync_id("inst", 3);
        let (prefix, tag) = id.rsplit_once('_').expect("underscore");
        assert_eq!(prefix, "inst_3");
        assert_eq!(tag.len(), 8);
        assert!(tag.chars().all(|c| c.is_ascii_hexdigit()));
    }
}
