//! The routing policies `kvplane bench route` runs itself (the client picks the engine):
//! round-robin, least-loaded, an approximate router that remembers where it sent each block
//! for a TTL (as Dynamo's approximate mode), and an oracle that asks every simulated engine
//! for its true cached prefix. The cache-aware ones score with kvplane's own formula
//! ([`crate::router::model::score`]) and weights, so only the knowledge differs. Owns no sockets
//! but the oracle's HTTP calls.

use crate::router::model::score::{self, Candidate, Load, Matched, Weights};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// A policy the bench itself applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Local {
    /// In turn.
    RoundRobin,
    /// Fewest requests in flight (ties in turn).
    LeastLoaded,
    /// Its own routing history (no events).
    Approx,
    /// Every engine's true cache.
    Oracle,
}

/// What the client-side policies share during one run.
pub struct Shared {
    /// Requests in flight per engine.
    pub in_flight: Vec<AtomicU64>,
    turn: AtomicUsize,
    /// Approx: per engine, block hash → expiry (simulated ms).
    history: parking_lot::Mutex<Vec<HashMap<u64, u64>>>,
    ttl_ms: u64,
    weights: Weights,
    block_size: usize,
}

impl Shared {
    /// State for `engines` engines.
    pub fn new(engines: usize, weights: Weights, ttl_ms: u64, block_size: usize) -> Self {
        Self {
            in_flight: (0..engines).map(|_| AtomicU64::new(0)).collect(),
            turn: AtomicUsize::new(0),
            history: parking_lot::Mutex::new(vec![HashMap::new(); engines]),
            ttl_ms,
            weights,
            block_size,
        }
    }

    fn loads(&self) -> Vec<Load> {
        self.in_flight
            .iter()
            .map(|n| Load {
                in_flight: n.load(Ordering::Relaxed),
                ..Load::default()
            })
            .collect()
    }

    /// Round robin.
    pub fn round_robin(&self) -> usize {
        self.turn.fetch_add(1, Ordering::Relaxed) % self.in_flight.len()
    }

    /// Least loaded (ties in turn).
    pub fn least_loaded(&self) -> usize {
        let n = self.in_flight.len();
        let start = self.turn.fetch_add(1, Ordering::Relaxed);
        let loads = self.loads();
        (0..n)
            .map(|k| (start + k) % n)
            .min_by_key(|&i| loads[i].in_flight)
            .unwrap_or(0)
    }

    /// Scores `matched_blocks` (per engine) with kvplane's formula; returns the pick.
    pub fn best(&self, matched_blocks: &[usize], prompt_tokens: usize) -> usize {
        let loads = self.loads();
        let candidates: Vec<Candidate> = matched_blocks
            .iter()
            .zip(loads)
            .map(|(&b, load)| {
                let t = super::sim_pool::cached_tokens(b, prompt_tokens, self.block_size) as u64;
                Candidate {
                    matched: Matched {
                        gpu: t,
                        cpu: 0,
                        disk: 0,
                        longest: t,
                    },
                    load,
                    up: true,
                    sticky: false,
                }
            })
            .collect();
        let rotate = self.turn.fetch_add(1, Ordering::Relaxed) % candidates.len().max(1);
        score::choose(
            &candidates,
            prompt_tokens as u64,
            &self.weights,
            rotate,
            0.0,
        )
        .unwrap_or(0)
    }

    /// The approximate router: blocks it sent to each engine within the TTL count as cached
    /// there; the chosen engine's entries are renewed. `now_ms` is simulated time.
    pub fn approx(&self, hashes: &[u64], prompt_tokens: usize, now_ms: u64) -> usize {
        let mut history = self.history.lock();
        let matched: Vec<usize> = history
            .iter()
            .map(|h| {
                hashes
                    .iter()
                    .take_while(|b| h.get(b).is_some_and(|&exp| exp > now_ms))
                    .count()
            })
            .collect();
        let pick = self.best(&matched, prompt_tokens);
        let h = &mut history[pick];
        if h.len() > 4 * 1024 * 1024 {
            h.retain(|_, exp| *exp > now_ms);
        }
        for &b in hashes {
            h.insert(b, now_ms + self.ttl_ms);
        }
        pick
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approx_follows_its_history_until_the_ttl_and_load_breaks_ties() {
        let s = Shared::new(3, Weights::default(), 1000, 4);
        let a = [1u64, 2, 3, 4];
        let first = s.approx(&a, 17, 0);
        assert_eq!(s.approx(&a, 17, 10), first, "it remembers");
        s.in_flight[first].store(1, Ordering::Relaxed);
        // Past the TTL nothing is remembered: the least loaded others win.
        assert_ne!(s.approx(&a, 17, 5000), first);
        let rr: Vec<usize> = (0..3).map(|_| s.round_robin()).collect();
        let mut sorted = rr.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![0, 1, 2]);
        s.in_flight[0].store(5, Ordering::Relaxed);
        s.in_flight[1].store(0, Ordering::Relaxed);
        s.in_flight[2].store(5, Ordering::Relaxed);
        assert_eq!(s.least_loaded(), 1);
    }
}
