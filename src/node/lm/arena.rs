//! The L1 preallocation (`--l1-preallocate`): one anonymous mapping of the requested size,
//! faulted in by the kernel at start (`MAP_POPULATE`), handed out front to back as the page
//! ranges of object bodies ([`Region`]), so a PUT into a fresh node writes into memory that
//! is already faulted in and zeroed instead of paying a page fault per 4 KiB.
//!
//! A region owns its page range: dropping it unmaps exactly that range (the kernel splits the
//! mapping). The arena never hands out a range twice and unmaps the part it never handed out
//! when it is dropped. This module only maps and unmaps pages: which body uses a region, and
//! whether a freed region is kept for reuse, is `node/buffers.rs`'s business. Linux only
//! (elsewhere the node starts without a preallocation and says so).

use parking_lot::Mutex;
use std::ptr::NonNull;

/// The page size mappings are rounded to.
pub(crate) const PAGE: usize = 4096;

/// A page-aligned range of an anonymous mapping, owned: unmapped when dropped.
pub(crate) struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Region is the only owner of its page range (the arena hands each range out once),
// so moving it to another thread or sharing `&Region` is as safe as for a `Vec<u8>`.
#[allow(unsafe_code)]
unsafe impl Send for Region {}
// SAFETY: see `Send`; `&Region` gives read-only access.
#[allow(unsafe_code)]
unsafe impl Sync for Region {}

impl Region {
    /// Its length in bytes (a multiple of [`PAGE`]).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Its bytes.
    #[allow(unsafe_code)]
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is mapped readable and owned by self until drop.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Its bytes, writable.
    #[allow(unsafe_code)]
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, mapped writable, and `&mut self` makes this borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        unmap(self.ptr, self.len);
    }
}

#[allow(unsafe_code)]
fn unmap(ptr: NonNull<u8>, len: usize) {
    if len == 0 {
        return;
    }
    #[cfg(target_os = "linux")]
    // SAFETY: ptr..ptr+len is a page-aligned range of a mapping this module made and nothing
    // else refers to it any more (its owner is being dropped).
    unsafe {
        libc::munmap(ptr.as_ptr().cast(), len);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = ptr;
}

/// The preallocated pages not yet handed out.
pub(crate) struct Arena {
    base: NonNull<u8>,
    len: usize,
    /// Offset of the first page not handed out yet.
    next: Mutex<usize>,
}

// SAFETY: the arena only hands out disjoint ranges under its mutex; its own pointer is never
// dereferenced.
#[allow(unsafe_code)]
unsafe impl Send for Arena {}
// SAFETY: see `Send`.
#[allow(unsafe_code)]
unsafe impl Sync for Arena {}

impl Arena {
    /// Maps `bytes` (rounded up to whole pages) and faults every page in before returning:
    /// blocking, about a second per 2–10 GiB depending on the machine.
    ///
    /// # Errors
    /// The OS error when the mapping fails (not enough address space or memory), or
    /// `Unsupported` elsewhere than Linux.
    #[allow(unsafe_code)]
    pub(crate) fn populate(bytes: u64) -> std::io::Result<Arena> {
        let len = usize::try_from(bytes)
            .ok()
            .and_then(|b| b.checked_next_multiple_of(PAGE))
            .ok_or_else(|| std::io::Error::other("size does not fit the address space"))?;
        #[cfg(target_os = "linux")]
        {
            // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                    -1,
                    0,
                )
            };
            if ptr == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            let base = NonNull::new(ptr.cast::<u8>())
                .ok_or_else(|| std::io::Error::other("mmap returned null"))?;
            Ok(Arena {
                base,
                len,
                next: Mutex::new(0),
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = len;
            Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
        }
    }

    /// The next `len` bytes (a multiple of [`PAGE`]), or `None` once fewer are left.
    pub(crate) fn carve(&self, len: usize) -> Option<Region> {
        debug_assert_eq!(len % PAGE, 0);
        let mut next = self.next.lock();
        if len == 0 || self.len - *next < len {
            return None;
        }
        // In bounds: next + len <= self.len, and the mapping is self.len bytes long.
        let ptr = NonNull::new(self.base.as_ptr().wrapping_add(*next))?;
        *next += len;
        Some(Region { ptr, len })
    }

    /// Bytes not handed out yet.
    pub(crate) fn unused(&self) -> usize {
        self.len - *self.next.lock()
    }

    /// Bytes mapped at start.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let next = *self.next.get_mut();
        if let Some(tail) = NonNull::new(self.base.as_ptr().wrapping_add(next)) {
            unmap(tail, self.len - next);
        }
    }
}

/// Memory the kernel says it can give without swapping (`MemAvailable` of `/proc/meminfo`),
/// in bytes; `None` where that is not known.
pub(crate) fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn regions_are_disjoint_writable_and_the_arena_runs_out() {
        let arena = Arena::populate(10 * PAGE as u64 - 100).expect("map");
        assert_eq!(arena.len(), 10 * PAGE);
        let mut a = arena.carve(4 * PAGE).expect("a");
        let mut b = arena.carve(4 * PAGE).expect("b");
        assert_eq!(arena.unused(), 2 * PAGE);
        assert!(arena.carve(4 * PAGE).is_none(), "only 2 pages left");
        assert!(a.as_slice().iter().all(|&x| x == 0), "fresh pages are zero");
        a.as_mut_slice().fill(1);
        b.as_mut_slice().fill(2);
        assert!(a.as_slice().iter().all(|&x| x == 1));
        assert!(b.as_slice().iter().all(|&x| x == 2));
        drop(a);
        // Unmapping a's range leaves b and the rest mapped.
        assert!(b.as_slice().iter().all(|&x| x == 2));
        let c = arena.carve(2 * PAGE).expect("the last two pages");
        assert_eq!(c.len(), 2 * PAGE);
        assert_eq!(arena.unused(), 0);
        drop(arena);
        assert!(
            b.as_slice().iter().all(|&x| x == 2),
            "a region outlives its arena"
        );
    }

    #[test]
    fn available_memory_is_read() {
        assert!(available_memory().is_some_and(|b| b > 0));
    }
}
