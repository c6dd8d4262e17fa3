//! `--metadata-path`: the operator-set state (quotas, the default quota, pins) kept in one
//! JSON file, as LMCache 0.5.6 keeps its pins and quotas, so they survive a restart.
//!
//! Loaded once at startup, before the owner starts (a missing file starts empty; an
//! unreadable, oversized or malformed one is logged and ignored, as 0.5.6 does, so an
//! operator can re-apply their intent rather than face a coordinator that will not boot).
//! Saved after every change a route makes, before its reply: a 200 means the change is on
//! disk. A save captures the state on the owner and writes a temporary file beside the target
//! (fsynced, then renamed over it), off the runtime's threads; saves are serialised, each
//! capturing after the previous one wrote, so the file never goes back to an older state.
//! A failed write is logged and counted, never an error to the caller (0.5.6's rule).

use crate::coordinator::model::keys::EncodedKey;
use crate::coordinator::model::metadata::{Metadata, PinRow, VERSION};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Largest metadata file read at startup (100,000 quotas and pins fit many times over).
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// Why the file was not loaded.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// Reading failed (other than "not found").
    #[error("cannot read: {0}")]
    Io(#[from] std::io::Error),
    /// Over [`MAX_FILE_BYTES`].
    #[error("larger than {MAX_FILE_BYTES} bytes")]
    TooLarge,
    /// Not a document of this format.
    #[error("not a kvplane coordinator metadata document: {0}")]
    Format(String),
}

/// The file at `path` if it exists and is at most [`MAX_FILE_BYTES`].
fn open_bounded(path: &Path) -> Result<Option<std::fs::File>, MetadataError> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if file.metadata()?.len() > MAX_FILE_BYTES {
        return Err(MetadataError::TooLarge);
    }
    Ok(Some(file))
}

/// Reads the document; `Ok(None)` when the file does not exist.
///
/// # Errors
/// [`MetadataError`] for an unreadable, oversized or malformed file.
pub fn load(path: &Path) -> Result<Option<Metadata>, MetadataError> {
    let Some(file) = open_bounded(path)? else {
        return Ok(None);
    };
    let doc: Metadata = serde_json::from_reader(std::io::BufReader::new(file))
        .map_err(|e| MetadataError::Format(e.to_string()))?;
    if doc.version != VERSION {
        return Err(MetadataError::Format(format!(
            "version {} (this build reads {VERSION})",
            doc.version
        )));
    }
    Ok(Some(doc))
}

/// Reads `path` in either format: kvplane's own ([`load`]) or LMCache 0.5.6's metadata
/// document (`{"version": 1, "saved_at", "components": {"quotas": {"limits": {salt: bytes},
/// "default_limit_bytes"}, "pins": {"entries": [{"key", "count"}]}}}`), so a fleet moving
/// from LMCache's coordinator keeps its quotas and pins. `Ok(None)` when there is no file.
///
/// # Errors
/// [`MetadataError`] for an unreadable, oversized or malformed file (in both formats).
pub fn load_any(path: &Path) -> Result<Option<Metadata>, MetadataError> {
    let Some(file) = open_bounded(path)? else {
        return Ok(None);
    };
    let v: serde_json::Value = serde_json::from_reader(std::io::BufReader::new(file))
        .map_err(|e| MetadataError::Format(e.to_string()))?;
    if v.get("components").is_some() {
        return from_lmcache(v).map(Some);
    }
    load(path)
}

/// LMCache 0.5.6's metadata document (sections it does not know are ignored, as 0.5.6 does).
fn from_lmcache(v: serde_json::Value) -> Result<Metadata, MetadataError> {
    #[derive(Deserialize)]
    struct Doc {
        version: u32,
        saved_at: f64,
        components: Components,
    }
    #[derive(Deserialize)]
    struct Components {
        #[serde(default)]
        quotas: Option<Quotas>,
        #[serde(default)]
        pins: Option<PinSection>,
    }
    #[derive(Deserialize)]
    struct Quotas {
        limits: BTreeMap<String, u64>,
        default_limit_bytes: Option<u64>,
    }
    #[derive(Deserialize)]
    struct PinSection {
        entries: Vec<PinEntry>,
    }
    #[derive(Deserialize)]
    struct PinEntry {
        key: EncodedKey,
        count: u64,
    }
    let d: Doc = serde_json::from_value(v)
        .map_err(|e| MetadataError::Format(format!("an LMCache 0.5.6 metadata document: {e}")))?;
    if d.version != 1 {
        return Err(MetadataError::Format(format!(
            "LMCache metadata version {} (this build reads 1)",
            d.version
        )));
    }
    let quotas = d.components.quotas;
    Ok(Metadata {
        version: VERSION,
        saved_at: d.saved_at,
        default_limit_bytes: quotas.as_ref().and_then(|q| q.default_limit_bytes),
        quotas: quotas.map(|q| q.limits).unwrap_or_default(),
        pins: d
            .components
            .pins
            .map(|p| p.entries)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.count > 0)
            .map(|e| PinRow {
                key: e.key,
                pin_count: e.count,
            })
            .collect(),
    })
}

/// Writes `doc` to `path` atomically (temporary file, fsync, rename).
///
/// # Errors
/// The I/O error.
pub fn write(path: &Path, doc: &Metadata) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(doc).map_err(std::io::Error::other)?;
    super::files::write(path, &bytes)
}

/// Saves the metadata after each change (nothing without a path).
#[derive(Debug, Default)]
pub struct Persister {
    path: Option<PathBuf>,
    lock: tokio::sync::Mutex<()>,
    /// Saves written.
    pub saved: AtomicU64,
    /// Saves that failed (logged).
    pub failed: AtomicU64,
}

impl Persister {
    /// A persister writing to `path` (`None`: off).
    pub fn new(path: Option<PathBuf>) -> Self {
        Persister {
            path,
            ..Persister::default()
        }
    }

    /// Writes the document `capture` yields (the operator state captured on its owner;
    /// `None`: stopped), one save at a time; failures are logged and counted.
    pub async fn save(&self, capture: impl std::future::Future<Output = Option<Metadata>>) {
        let Some(path) = self.path.clone() else {
            return;
        };
        let _serial = self.lock.lock().await;
        let Some(doc) = capture.await else {
            return; // shutting down
        };
        let written = tokio::task::spawn_blocking(move || {
            let r = write(&path, &doc);
            (path, r)
        })
        .await;
        match written {
            Ok((_, Ok(()))) => {
                self.saved.fetch_add(1, Ordering::Relaxed);
            }
            Ok((path, Err(e))) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("cannot write the metadata file {}: {e}", path.display());
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("metadata save failed: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> Metadata {
        Metadata {
            version: VERSION,
            saved_at: 1.5,
            quotas: BTreeMap::from([("a".to_owned(), 1024), (String::new(), 0)]),
            default_limit_bytes: None,
            pins: vec![PinRow {
                key: EncodedKey {
                    chunk_hash_hex: "ab".into(),
                    model_name: "m".into(),
                    kv_rank: 1,
                    object_group_id: 0,
                    cache_salt: "a".into(),
                },
                pin_count: 2,
            }],
        }
    }

    #[test]
    fn a_written_document_loads_back_and_bad_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("kvplane-meta-{}", rand::random::<u64>()));
        let path = dir.join("sub").join("meta.json");
        assert!(load(&path).unwrap().is_none());
        write(&path, &doc()).unwrap();
        assert_eq!(load(&path).unwrap(), Some(doc()));
        assert!(!dir.join("sub").join("meta.json.tmp").exists());
        std::fs::write(&path, b"{\"version\": 9}").unwrap();
        assert!(matches!(load(&path), Err(MetadataError::Format(_))));
        let mut v9 = serde_json::to_value(doc()).unwrap();
        v9["version"] = 9.into();
        std::fs::write(&path, v9.to_string()).unwrap();
        assert!(matches!(load(&path), Err(MetadataError::Format(m)) if m.contains("version 9")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_lmcache_056_document_loads() {
        let dir = std::env::temp_dir().join(format!("kvplane-meta-{}", rand::random::<u64>()));
        let path = dir.join("lmcache.json");
        std::fs::create_dir_all(&dir).unwrap();
        // As LMCache 0.5.6's MetadataPersister writes it (spec §3.3).
        std::fs::write(
            &path,
            r#"{"version": 1, "saved_at": 1795378696.8, "components": {
              "pins": {"entries": [{"key": {"chunk_hash_hex": "ab", "model_name": "m",
                 "kv_rank": 1, "object_group_id": 0, "cache_salt": "a"}, "count": 2},
                 {"key": {"chunk_hash_hex": "cd", "model_name": "m", "kv_rank": 1,
                 "object_group_id": 0, "cache_salt": "a"}, "count": 0}]},
              "quotas": {"limits": {"a": 1024, "": 0}, "default_limit_bytes": null}}}"#,
        )
        .unwrap();
        let mut want = doc();
        want.saved_at = 1_795_378_696.8;
        assert_eq!(load_any(&path).unwrap(), Some(want));
        std::fs::write(&path, r#"{"version": 2, "saved_at": 1, "components": {}}"#).unwrap();
        assert!(
            matches!(load_any(&path), Err(MetadataError::Format(m)) if m.contains("version 2"))
        );
        // kvplane's own format still loads through the same call.
        write(&path, &doc()).unwrap();
        assert_eq!(load_any(&path).unwrap(), Some(doc()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
