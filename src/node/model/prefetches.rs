//! The warm prefetch jobs of one node (`POST /cache/prefetches`): bounded, at most
//! `max_jobs` remembered; a completed job stays pollable until newer completions push it out
//! (LMCache 0.5.6 forgets it at the first poll, so a lost reply loses the result), and no slot
//! is free while every one holds a running job. Pure but for the random job ids.

use parking_lot::Mutex;
use rand::Rng;
use std::collections::{HashMap, VecDeque};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PrefetchJob {
    /// Running.
    Pending,
    /// Done: `found` of the `total` keys wanted are in L1.
    Completed { found: usize, total: usize },
}

#[derive(Default)]
struct PrefetchJobs {
    by_id: HashMap<String, PrefetchJob>,
    /// Completed ids, oldest first (the first to be forgotten).
    completed: VecDeque<String>,
}

/// The prefetch jobs of one node.
pub(crate) struct Prefetches {
    jobs: Mutex<PrefetchJobs>,
    max_jobs: usize,
    chunk_size: usize,
}

impl Prefetches {
    /// At most `max_jobs` jobs remembered; tokens hashed in chunks of `chunk_size`.
    pub(crate) fn new(max_jobs: usize, chunk_size: usize) -> Self {
        Prefetches {
            jobs: Mutex::new(PrefetchJobs::default()),
            max_jobs: max_jobs.max(1),
            chunk_size: chunk_size.max(1),
        }
    }

    /// Takes a slot for a new job; `None` when every slot holds a running one.
    pub(crate) fn reserve(&self) -> Option<String> {
        let mut jobs = self.jobs.lock();
        while jobs.by_id.len() >= self.max_jobs {
            let oldest = jobs.completed.pop_front()?;
            jobs.by_id.remove(&oldest);
        }
        let id: String = {
            let mut rng = rand::rng();
            (0..16)
                .map(|_| format!("{:02x}", rng.random::<u8>()))
                .collect()
        };
        jobs.by_id.insert(id.clone(), PrefetchJob::Pending);
        Some(id)
    }

    /// Marks `id` completed (pollable until newer completions push it out).
    pub(crate) fn complete(&self, id: &str, found: usize, total: usize) {
        let mut jobs = self.jobs.lock();
        if let Some(job) = jobs.by_id.get_mut(id) {
            *job = PrefetchJob::Completed { found, total };
            jobs.completed.push_back(id.to_owned());
        }
    }

    /// Tokens per chunk.
    pub(crate) fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// The job `id`, if remembered.
    pub(crate) fn job(&self, id: &str) -> Option<PrefetchJob> {
        self.jobs.lock().by_id.get(id).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_are_bounded_and_completed_ones_go_first() {
        let p = Prefetches::new(2, 4);
        let a = p.reserve().expect("slot");
        let b = p.reserve().expect("slot");
        assert!(p.reserve().is_none(), "both running");
        p.complete(&a, 1, 2);
        let c = p.reserve().expect("a's slot");
        let jobs = p.jobs.lock();
        assert!(!jobs.by_id.contains_key(&a));
        assert_eq!(jobs.by_id.get(&b), Some(&PrefetchJob::Pending));
        assert_eq!(jobs.by_id.get(&c), Some(&PrefetchJob::Pending));
    }
}
