//! Predicted against delivered cached tokens, pure: for each answered request, what the
//! router predicted the chosen engine would reuse, what the best engine could have reused,
//! and what the engine reported (`usage.prompt_tokens_details.cached_tokens`). Sums per
//! engine; ratios are ratios of sums. Tokens the request could have reused and did not are
//! split by cause.

use std::collections::BTreeMap;

/// One answered request's figures, in tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delivery {
    /// What the engine could at most reuse of the prompt (whole blocks, never the last
    /// token).
    pub reusable: u64,
    /// What the index said the best engine holds (clamped to `reusable`).
    pub best: u64,
    /// What the index said the chosen engine holds (clamped to `reusable`).
    pub predicted: u64,
    /// What the engine reported it reused.
    pub delivered: u64,
}

/// Where reusable tokens that were not reused went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Misses {
    /// No engine held them (by the index): nothing to route to.
    pub no_reuse_possible: u64,
    /// Another engine held them, and load (or a softmax draw) sent the request elsewhere.
    pub routed_for_load: u64,
    /// The index said the chosen engine held them, and it did not reuse them (evicted since,
    /// events not yet seen, or the engine's hashes disagree).
    pub index_stale: u64,
}

impl Delivery {
    /// The split of `reusable − delivered`. Tokens delivered beyond the prediction (the
    /// engine held more than the index knew) reduce the stale count first, and what remains
    /// of them is [`Delivery::unpredicted`].
    pub fn misses(&self) -> Misses {
        let predicted = self.predicted.min(self.best);
        let best = self.best.min(self.reusable);
        let delivered = self.delivered.min(self.reusable);
        Misses {
            no_reuse_possible: self.reusable - best.max(delivered),
            routed_for_load: best.saturating_sub(predicted.max(delivered)),
            index_stale: predicted.saturating_sub(delivered),
        }
    }

    /// Tokens delivered that the index did not predict.
    pub fn unpredicted(&self) -> u64 {
        self.delivered.saturating_sub(self.predicted)
    }
}

/// Sums for one engine (or the whole router).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Requests whose engine reported cached tokens.
    pub requests: u64,
    /// Reusable tokens.
    pub reusable: u64,
    /// Predicted cached tokens.
    pub predicted: u64,
    /// Delivered cached tokens.
    pub delivered: u64,
    /// Delivered beyond the prediction.
    pub unpredicted: u64,
    /// Reusable tokens not reused, by cause.
    pub misses: Misses,
}

impl Tally {
    fn add(&mut self, o: &Delivery) {
        let m = o.misses();
        self.requests += 1;
        self.reusable += o.reusable;
        self.predicted += o.predicted;
        self.delivered += o.delivered;
        self.unpredicted += o.unpredicted();
        self.misses.no_reuse_possible += m.no_reuse_possible;
        self.misses.routed_for_load += m.routed_for_load;
        self.misses.index_stale += m.index_stale;
    }

    /// Delivered over predicted (`None` before anything was predicted).
    pub fn delivered_ratio(&self) -> Option<f64> {
        (self.predicted > 0).then(|| self.delivered as f64 / self.predicted as f64)
    }

    /// Delivered over reusable: the hit ratio.
    pub fn hit_ratio(&self) -> Option<f64> {
        (self.reusable > 0).then(|| self.delivered as f64 / self.reusable as f64)
    }
}

/// Sums per engine, and overall.
#[derive(Debug, Default)]
pub struct Accounting {
    per_engine: BTreeMap<String, Tally>,
    overall: Tally,
}

impl Accounting {
    /// Records one answered request of `engine`.
    pub fn record(&mut self, engine: &str, o: &Delivery) {
        self.overall.add(o);
        match self.per_engine.get_mut(engine) {
            Some(t) => t.add(o),
            None => {
                let mut t = Tally::default();
                t.add(o);
                self.per_engine.insert(engine.to_owned(), t);
            }
        }
    }

    /// The whole router's sums.
    pub fn overall(&self) -> Tally {
        self.overall
    }

    /// Each engine's sums (engines that answered with usage at least once).
    pub fn per_engine(&self) -> &BTreeMap<String, Tally> {
        &self.per_engine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(reusable: u64, best: u64, predicted: u64, delivered: u64) -> Delivery {
        Delivery {
            reusable,
            best,
            predicted,
            delivered,
        }
    }

    #[test]
    fn misses_split_by_cause_and_add_up() {
        // Nothing held anywhere.
        assert_eq!(
            o(64, 0, 0, 0).misses(),
            Misses {
                no_reuse_possible: 64,
                ..Misses::default()
            }
        );
        // Best engine held 48, the chosen one 16 and delivered them.
        assert_eq!(
            o(64, 48, 16, 16).misses(),
            Misses {
                no_reuse_possible: 16,
                routed_for_load: 32,
                index_stale: 0,
            }
        );
        // Chosen was the best (48) and delivered only 32.
        assert_eq!(
            o(64, 48, 48, 32).misses(),
            Misses {
                no_reuse_possible: 16,
                routed_for_load: 0,
                index_stale: 16,
            }
        );
        // Delivered beyond the prediction: no stale, the surplus is unpredicted.
        let x = o(64, 16, 16, 48);
        assert_eq!(
            x.misses(),
            Misses {
                no_reuse_possible: 16,
                ..Misses::default()
            }
        );
        assert_eq!(x.unpredicted(), 32);
        // Every split adds up to reusable − delivered when delivered ≤ predicted.
        for (r, b, p, d) in [(64, 48, 32, 16), (128, 128, 0, 0), (16, 16, 16, 0)] {
            let m = o(r, b, p, d).misses();
            assert_eq!(
                m.no_reuse_possible + m.routed_for_load + m.index_stale,
                r - d
            );
        }
    }

    #[test]
    fn ratios_are_ratios_of_sums() {
        let mut a = Accounting::default();
        a.record("e0", &o(100, 100, 100, 100));
        a.record("e0", &o(10, 10, 10, 0));
        a.record("e1", &o(50, 50, 0, 0));
        let all = a.overall();
        assert_eq!(
            (all.predicted, all.delivered, all.reusable),
            (110, 100, 160)
        );
        // Not the mean of per-request ratios (which would be 0.5).
        assert!((all.delivered_ratio().unwrap() - 100.0 / 110.0).abs() < 1e-12);
        assert_eq!(a.per_engine()["e1"].delivered_ratio(), None);
        assert_eq!(a.per_engine()["e1"].misses.routed_for_load, 50);
        assert!((a.per_engine()["e0"].hit_ratio().unwrap() - 100.0 / 110.0).abs() < 1e-12);
    }
}
