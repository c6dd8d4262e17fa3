//! Handing freed heap memory back to the system after a burst.
//!
//! glibc keeps freed chunks below its mmap threshold (KV-event messages, decoded events) in
//! its per-thread arenas. After a burst of queued messages is applied, that memory is free
//! but still counted in the process's RSS until something reuses it. [`after_burst`] asks
//! glibc to give it back (`malloc_trim`), at most once every [`MIN_INTERVAL_MS`], on a
//! blocking thread (a trim walks the arenas: milliseconds to tens of them). Elsewhere than
//! Linux with glibc it does nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Bursts smaller than this are not worth a trim.
pub const MIN_BURST_BYTES: usize = 16 << 20;
/// At most one trim this often, process-wide.
pub const MIN_INTERVAL_MS: u64 = 500;

static LAST_TRIM_MS: AtomicU64 = AtomicU64::new(0);
static TRIMS: AtomicU64 = AtomicU64::new(0);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Trims run so far.
pub fn trims() -> u64 {
    TRIMS.load(Ordering::Relaxed)
}

/// Returns freed heap memory to the system now (blocking).
#[allow(unsafe_code)]
pub fn release_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks and releases glibc's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
    TRIMS.fetch_add(1, Ordering::Relaxed);
}

/// Fixes glibc's mmap and trim thresholds at 1 MiB (process-wide; once is enough, more is
/// harmless). By default glibc raises both as the process frees big blocks: after a 32 MiB
/// block is freed, blocks up to 32 MiB come from its arenas instead of their own mappings,
/// and a thread arena keeps up to 64 MiB of free memory at its top, which `malloc_trim` does
/// not release. An indexer that has just rebuilt its tables and drained a burst of messages
/// kept 40–80 MB that way, a fifth of its index at 10M blocks. With fixed thresholds, blocks
/// of 1 MiB and more are mapped on their own and unmapped when freed, and arena tops shrink
/// past 1 MiB. Elsewhere than Linux with glibc it does nothing.
#[allow(unsafe_code)]
pub fn return_freed_promptly() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets glibc's allocator parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 20);
    }
}

/// Called when a queue that held `peak_bytes` has drained: trims on a blocking thread when
/// the burst was large and no trim ran in the last [`MIN_INTERVAL_MS`]. Needs a Tokio
/// runtime; returns whether a trim was started.
pub fn after_burst(peak_bytes: usize) -> bool {
    if peak_bytes < MIN_BURST_BYTES {
        return false;
    }
    let now = now_ms();
    let last = LAST_TRIM_MS.load(Ordering::Relaxed);
    if now.saturating_sub(last) < MIN_INTERVAL_MS
        || LAST_TRIM_MS
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
    {
        return false;
    }
    tokio::task::spawn_blocking(release_freed);
    true
}
