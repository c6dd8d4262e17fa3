//! `--checkpoint-path` / `--checkpoint-interval` (LMCache 0.5.6's checkpoint): the key
//! model's whole state — event cursors, tracked keys in LRU order, usage per instance and
//! compartment, capacity declarations, the key directory with its placements and token ids,
//! quotas and pins, counters — written to one file every interval and at a clean stop, and
//! read back at start, so a restarted coordinator knows what is on the servers' L2 before any
//! of them stores again. It is the replication snapshot's dump ([`crate::coordinator::model::ModelDump`]),
//! so whatever the model holds is checkpointed.
//!
//! File: `KVPLCKPT` (8 bytes), format version (`u32` LE), payload length (`u64` LE), CRC-32
//! of the payload (`u32` LE), then the payload (msgpack of [`CheckpointDoc`]). Written to
//! `PATH.tmp`, fsynced, renamed over `PATH`: a crash leaves the old or the new file. Bounded:
//! a payload over the size limit is not written (logged, counted); a file over it is not
//! read. An unknown version, a bad magic (LMCache's own `LMCKPT` file included), a length or
//! checksum mismatch or an undecodable payload is logged and ignored: the coordinator starts
//! cold rather than not at all.

use super::files::write;
use crate::coordinator::model::ModelDump;
use crate::web::exposition::{Exposition, Kind};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The file's first bytes.
pub(crate) const MAGIC: &[u8; 8] = b"KVPLCKPT";
/// LMCache 0.5.6's checkpoint magic (recognised to say so, not read).
const LMCACHE_MAGIC: &[u8; 6] = b"LMCKPT";
/// The format version this build writes and reads.
pub(crate) const VERSION: u32 = 1;
/// Header bytes before the payload.
const HEADER: usize = 8 + 4 + 8 + 4;
/// Largest checkpoint written or read (16 Mi keys with placements and 256-token chunks fit).
pub(crate) const MAX_BYTES: u64 = 16 << 30;

/// The checkpoint settings.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointConfig {
    /// The file.
    pub path: PathBuf,
    /// Between writes (`None`: only at a clean stop; 0.5.6's `--checkpoint-interval 0`).
    pub interval: Option<Duration>,
    /// Largest file written or read.
    pub max_bytes: u64,
}

/// The payload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointDoc {
    /// Wall-clock time of the capture, Unix seconds.
    pub saved_at: f64,
    /// The model.
    pub model: ModelDump,
}

/// Why a checkpoint was not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CheckpointError {
    /// Reading failed (other than "not found").
    #[error("cannot read: {0}")]
    Io(#[from] std::io::Error),
    /// Over the size limit.
    #[error("larger than {0} bytes")]
    TooLarge(u64),
    /// LMCache's own checkpoint.
    #[error(
        "an LMCache coordinator checkpoint (msgpack of Python objects); kvplane reads only its own"
    )]
    Lmcache,
    /// Not a kvplane checkpoint.
    #[error("not a kvplane coordinator checkpoint (bad magic)")]
    Magic,
    /// Another format version.
    #[error("format version {0} (this build reads {VERSION})")]
    Version(u32),
    /// Truncated or damaged.
    #[error("corrupt: {0}")]
    Corrupt(String),
}

/// The file's bytes for `doc`.
///
/// # Errors
/// When the payload is over `max_bytes`.
pub(crate) fn encode(doc: &CheckpointDoc, max_bytes: u64) -> Result<Vec<u8>, u64> {
    let payload = rmp_serde::to_vec(doc).unwrap_or_default();
    let n = payload.len() as u64;
    if n + HEADER as u64 > max_bytes {
        return Err(n);
    }
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// The document in `bytes`.
///
/// # Errors
/// [`CheckpointError`] for anything but a whole checkpoint of this version.
pub(crate) fn decode(bytes: &[u8]) -> Result<CheckpointDoc, CheckpointError> {
    if bytes.starts_with(LMCACHE_MAGIC) {
        return Err(CheckpointError::Lmcache);
    }
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return Err(CheckpointError::Magic);
    }
    let word =
        |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let version = word(8);
    if version != VERSION {
        return Err(CheckpointError::Version(version));
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&bytes[12..20]);
    let len = u64::from_le_bytes(len);
    let payload = &bytes[HEADER..];
    if payload.len() as u64 != len {
        return Err(CheckpointError::Corrupt(format!(
            "{} payload bytes, the header says {len}",
            payload.len()
        )));
    }
    if crc32fast::hash(payload) != word(20) {
        return Err(CheckpointError::Corrupt("checksum mismatch".into()));
    }
    rmp_serde::from_slice(payload).map_err(|e| CheckpointError::Corrupt(e.to_string()))
}

/// Reads the checkpoint at `path`; `Ok(None)` when there is none.
///
/// # Errors
/// [`CheckpointError`].
pub(crate) fn load(path: &Path, max_bytes: u64) -> Result<Option<CheckpointDoc>, CheckpointError> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let size = file.metadata()?.len();
    if size > max_bytes {
        return Err(CheckpointError::TooLarge(max_bytes));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(max_bytes).read_to_end(&mut bytes)?;
    decode(&bytes).map(Some)
}

/// Writes checkpoints of a running coordinator, one at a time, and counts them.
#[derive(Debug)]
pub struct Checkpointer {
    config: CheckpointConfig,
    lock: tokio::sync::Mutex<()>,
    /// Checkpoints written.
    pub written: AtomicU64,
    /// Writes that failed (I/O; logged).
    pub failed: AtomicU64,
    /// Captures over the size limit, not written.
    pub refused: AtomicU64,
    /// Size of the last file written.
    pub last_bytes: AtomicU64,
    /// Keys restored from a checkpoint at start.
    pub restored_keys: AtomicU64,
}

impl Checkpointer {
    /// A checkpointer for `config`.
    pub fn new(config: CheckpointConfig) -> Self {
        Checkpointer {
            config,
            lock: tokio::sync::Mutex::new(()),
            written: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            last_bytes: AtomicU64::new(0),
            restored_keys: AtomicU64::new(0),
        }
    }

    /// The settings.
    pub fn config(&self) -> &CheckpointConfig {
        &self.config
    }

    /// Writes the document `capture` yields (the model captured on its owner: event ingest
    /// waits for it, heartbeats do not; `None`: stopped), off the runtime's threads, one write
    /// at a time; failures are logged and counted.
    pub async fn write(&self, capture: impl std::future::Future<Output = Option<CheckpointDoc>>) {
        let _serial = self.lock.lock().await;
        let Some(doc) = capture.await else {
            return; // stopped
        };
        let (path, max) = (self.config.path.clone(), self.config.max_bytes);
        let done = tokio::task::spawn_blocking(move || {
            let bytes = match encode(&doc, max) {
                Ok(b) => b,
                Err(n) => return Err(Err(n)),
            };
            write(&path, &bytes).map(|()| bytes.len()).map_err(Ok)
        })
        .await;
        let path = self.config.path.display();
        match done {
            Ok(Ok(n)) => {
                self.written.fetch_add(1, Ordering::Relaxed);
                self.last_bytes.store(n as u64, Ordering::Relaxed);
                tracing::debug!(bytes = n, "checkpoint written to {path}");
            }
            Ok(Err(Err(n))) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "checkpoint not written to {path}: {n} bytes is over the limit of {max}"
                );
            }
            Ok(Err(Ok(e))) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("cannot write the checkpoint {path}: {e}");
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("checkpoint write failed: {e}");
            }
        }
    }

    /// Writes the checkpoint's series.
    pub fn write_metrics(&self, out: &mut Exposition) {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let rows: [(&str, Kind, &str, u64); 5] = [
            (
                "checkpoints_written_total",
                Kind::Counter,
                "Checkpoints written (--checkpoint-path).",
                n(&self.written),
            ),
            (
                "checkpoint_failures_total",
                Kind::Counter,
                "Checkpoint writes that failed.",
                n(&self.failed),
            ),
            (
                "checkpoints_refused_total",
                Kind::Counter,
                "Checkpoints not written: over the size limit.",
                n(&self.refused),
            ),
            (
                "checkpoint_bytes",
                Kind::Gauge,
                "Size of the last checkpoint written.",
                n(&self.last_bytes),
            ),
            (
                "checkpoint_restored_keys",
                Kind::Gauge,
                "Tracked keys restored from the checkpoint at start.",
                n(&self.restored_keys),
            ),
        ];
        for (name, kind, help, v) in rows {
            out.one(format_args!("kvplane_coordinator_{name}"), kind, help, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::model::{Model, ModelConfig};

    fn doc() -> CheckpointDoc {
        let m = Model::new(ModelConfig {
            max_instances: 4,
            max_tracked_keys: 100,
            max_quotas: 4,
            eviction_ratio: 0.2,
            trigger_watermark: 1.0,
        });
        CheckpointDoc {
            saved_at: 2.5,
            model: m.dump(),
        }
    }

    #[test]
    fn round_trip_and_every_damage_is_refused() {
        let bytes = encode(&doc(), MAX_BYTES).unwrap();
        assert_eq!(decode(&bytes).unwrap(), doc());
        assert!(encode(&doc(), 10).is_err());
        let mut v2 = bytes.clone();
        v2[8] = 2;
        assert!(matches!(decode(&v2), Err(CheckpointError::Version(2))));
        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(matches!(decode(&flipped), Err(CheckpointError::Corrupt(_))));
        assert!(matches!(
            decode(&bytes[..bytes.len() - 1]),
            Err(CheckpointError::Corrupt(_))
        ));
        assert!(matches!(
            decode(b"LMCKPT\0\0\x01\0\0\0"),
            Err(CheckpointError::Lmcache)
        ));
        assert!(matches!(decode(b"{}"), Err(CheckpointError::Magic)));

        let dir = std::env::temp_dir().join(format!("kvplane-ckpt-{}", rand::random::<u64>()));
        let path = dir.join("c.ckpt");
        assert!(load(&path, MAX_BYTES).unwrap().is_none());
        write(&path, &bytes).unwrap();
        assert_eq!(load(&path, MAX_BYTES).unwrap(), Some(doc()));
        assert!(matches!(load(&path, 8), Err(CheckpointError::TooLarge(8))));
        assert!(!dir.join("c.ckpt.tmp").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
