//! The coordinator's files on disk (`--metadata-path`, `--checkpoint-path`): written
//! atomically, so a crash leaves the old file or the new one.
//!
//! Must not: know what the files hold.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` atomically (temporary file, fsync, rename, directory fsync).
///
/// # Errors
/// The I/O error.
pub(crate) fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir)?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = dir {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
