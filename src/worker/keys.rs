//! What the worker holds, for full syncs: the [`KeySource`] trait and [`MemoryKeys`], a
//! ready-made key set.
//!
//! A full sync replaces the controller's key set of a location with a snapshot taken from the
//! key source, so the key source is the truth the worker falls back on whenever the op stream
//! is in doubt (controller restart, undelivered ops, a full queue). One rule makes that sound:
//! **update the key source before you call `admit`/`evict` for the same change.** Then every
//! op the worker drops or cannot deliver is already reflected in the next snapshot.

use crate::protocol::ChunkHash;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// LMCache's hot CPU cache location, the only one LMCache's full sync covers.
pub const LOCAL_CPU_BACKEND: &str = "LocalCPUBackend";

/// The chunk hashes a worker holds, per location.
///
/// Called from a blocking thread when a full sync starts (once for
/// [`locations`](Self::locations), then once per location); it should return a consistent
/// snapshot quickly. LMCache syncs only `LocalCPUBackend` (its `get_keys()` of the hot cache);
/// kvplane syncs every location listed here, one after the other.
pub trait KeySource: Send + Sync + 'static {
    /// The locations to sync. A location you admit to but leave out here is not restored
    /// after a controller restart. Default: `["LocalCPUBackend"]`.
    fn locations(&self) -> Vec<String> {
        vec![LOCAL_CPU_BACKEND.to_owned()]
    }

    /// Every chunk hash held in `location`, in any order.
    fn keys(&self, location: &str) -> Vec<ChunkHash>;
}

impl<K: KeySource> KeySource for Arc<K> {
    fn locations(&self) -> Vec<String> {
        (**self).locations()
    }
    fn keys(&self, location: &str) -> Vec<ChunkHash> {
        (**self).keys(location)
    }
}

/// A thread-safe in-memory key set per location, usable as a [`KeySource`]. Clones share the
/// same set.
///
/// Keep it in step with your cache and call [`admit`](Self::admit) /
/// [`evict`](Self::evict) here *before* the worker handle's, as the module docs explain.
/// Its [`locations`](KeySource::locations) are `LocalCPUBackend` plus every location ever
/// admitted to.
#[derive(Clone, Debug, Default)]
pub struct MemoryKeys {
    inner: Arc<Mutex<BTreeMap<String, HashSet<ChunkHash>>>>,
}

impl MemoryKeys {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `location` holds `hash`; returns whether it was new.
    pub fn admit(&self, location: &str, hash: impl Into<ChunkHash>) -> bool {
        let mut map = self.inner.lock();
        match map.get_mut(location) {
            Some(set) => set.insert(hash.into()),
            None => {
                map.insert(location.to_owned(), HashSet::from([hash.into()]));
                true
            }
        }
    }

    /// Records that `location` no longer holds `hash`; returns whether it was there.
    pub fn evict(&self, location: &str, hash: impl Into<ChunkHash>) -> bool {
        self.inner
            .lock()
            .get_mut(location)
            .is_some_and(|set| set.remove(&hash.into()))
    }

    /// Whether `location` holds `hash`.
    pub fn contains(&self, location: &str, hash: impl Into<ChunkHash>) -> bool {
        self.inner
            .lock()
            .get(location)
            .is_some_and(|set| set.contains(&hash.into()))
    }

    /// Removes every key of `location`; returns how many there were.
    pub fn clear(&self, location: &str) -> usize {
        self.inner.lock().get_mut(location).map_or(0, |set| {
            let n = set.len();
            set.clear();
            n
        })
    }

    /// Number of keys in `location`.
    pub fn len(&self, location: &str) -> usize {
        self.inner.lock().get(location).map_or(0, HashSet::len)
    }

    /// Whether no location holds any key.
    pub fn is_empty(&self) -> bool {
        self.inner.lock().values().all(HashSet::is_empty)
    }

    /// A copy of the keys of `location`.
    pub fn snapshot(&self, location: &str) -> HashSet<ChunkHash> {
        self.inner.lock().get(location).cloned().unwrap_or_default()
    }
}

impl KeySource for MemoryKeys {
    fn locations(&self) -> Vec<String> {
        let map = self.inner.lock();
        let mut locations: Vec<String> = map.keys().cloned().collect();
        if !map.contains_key(LOCAL_CPU_BACKEND) {
            locations.insert(0, LOCAL_CPU_BACKEND.to_owned());
        }
        locations
    }

    fn keys(&self, location: &str) -> Vec<ChunkHash> {
        self.inner
            .lock()
            .get(location)
            .map(|set| set.iter().copied().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_keys_track_locations() {
        let keys = MemoryKeys::new();
        assert!(keys.is_empty());
        assert_eq!(keys.locations(), vec![LOCAL_CPU_BACKEND.to_owned()]);
        assert!(keys.admit("LocalDiskBackend", 5_i64));
        assert!(!keys.admit("LocalDiskBackend", 5_i64));
        assert!(keys.admit(LOCAL_CPU_BACKEND, u64::MAX));
        assert_eq!(
            keys.locations(),
            vec!["LocalCPUBackend".to_owned(), "LocalDiskBackend".to_owned()]
        );
        assert!(keys.contains(LOCAL_CPU_BACKEND, u64::MAX));
        assert!(keys.evict("LocalDiskBackend", 5_i64));
        assert!(!keys.evict("LocalDiskBackend", 5_i64));
        assert_eq!(
            keys.keys(LOCAL_CPU_BACKEND),
            vec![ChunkHash::from(u64::MAX)]
        );
        assert_eq!(keys.clear(LOCAL_CPU_BACKEND), 1);
        assert!(keys.is_empty());
    }
}
