//! The routing decision, pure: each engine's cached prefix per tier (from the index) against
//! the load the router tracks, weighted, then an argmax (temperature 0) or a softmax draw.
//! No clock, no randomness of its own (the caller passes the draw), no I/O.

/// What the index says one engine holds of the prompt, in tokens (spec semantics: each tier's
/// longest prefix entirely on that tier, and the longest servable prefix with tiers mixed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Matched {
    /// Longest prefix entirely in GPU memory.
    pub gpu: u64,
    /// Longest prefix entirely in the CPU tier.
    pub cpu: u64,
    /// Longest prefix entirely in the disk tier.
    pub disk: u64,
    /// Longest prefix one rank can serve, tiers mixed.
    pub longest: u64,
}

/// The load the router itself tracks for one engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Load {
    /// Requests sent and not yet finished.
    pub in_flight: u64,
    /// Of those, requests that have not had their first response byte (queued or in
    /// prefill at the engine).
    pub waiting: u64,
    /// What the engine's own metrics said at the last scrape, when fresh.
    pub reported: Option<Reported>,
}

/// An engine's own figures (its Prometheus `/metrics`: vLLM's `num_requests_running` /
/// `num_requests_waiting` / `kv_cache_usage_perc`, SGLang's `num_running_reqs` /
/// `num_queue_reqs` / `token_usage`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reported {
    /// Requests running (decoding or in prefill).
    pub running: u64,
    /// Requests queued.
    pub waiting: u64,
    /// KV cache in use, per mille (0..=1000), when reported.
    pub kv_usage_permille: Option<u32>,
}

impl Load {
    /// The load figure of the requests the router tracks: a waiting request counts twice (it
    /// still needs its prefill), a decoding one once.
    pub fn units(self) -> u64 {
        self.in_flight + self.waiting
    }

    /// The load figure scoring uses: the tracked units, plus `weight` times the engine's own
    /// units (running + twice waiting) beyond them — requests the router does not know of
    /// (other clients, a replica without `--cluster`). A scrape that lags behind the router's
    /// own requests never lowers the load below what it tracks.
    pub fn blended(self, weight: f64) -> f64 {
        let tracked = self.units();
        let beyond = self
            .reported
            .map_or(0, |r| (r.running + 2 * r.waiting).saturating_sub(tracked));
        tracked as f64 + weight * beyond as f64
    }
}

/// One engine as scoring sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// Cached tokens per tier.
    pub matched: Matched,
    /// Tracked load.
    pub load: Load,
    /// Up (not failed recently, last health probe answered). Down engines are never chosen.
    pub up: bool,
    /// The engine that served the request's session last (session affinity).
    pub sticky: bool,
}

/// The weights of the score (flags of `kvplane router`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Weights {
    /// Weight of the cached fraction of the prompt.
    pub overlap: f64,
    /// Weight of the relative load.
    pub load: f64,
    /// Value of a token only in the CPU tier, relative to one in GPU memory (0..=1).
    pub cpu_tier: f64,
    /// Value of a token only on disk, relative to one in GPU memory (0..=1).
    pub disk_tier: f64,
    /// Softmax temperature; 0 picks the best score (ties: least loaded, then round robin).
    pub temperature: f64,
    /// Load units that make the load term 1 (when no engine is busier): one request in
    /// flight weighs `1/load_scale`, so a small prefix is not given up for one request.
    pub load_scale: f64,
    /// Weight of the engine's own request counts beyond the tracked ones ([`Load::blended`]).
    pub engine_metrics: f64,
    /// Weight of the engine's KV cache usage (0..1) in the score.
    pub kv_usage: f64,
    /// Added to the score of the engine that served the request's session last.
    pub session: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Self {
            overlap: 1.0,
            load: 1.0,
            cpu_tier: 0.8,
            disk_tier: 0.5,
            temperature: 0.0,
            load_scale: 8.0,
            engine_metrics: 1.0,
            kv_usage: 0.25,
            session: 0.5,
        }
    }
}

/// Cached tokens weighted by tier: GPU tokens count fully, tokens beyond them that the CPU
/// tier holds count `cpu_tier`, the rest of the longest mixed prefix `disk_tier`.
pub(crate) fn weighted_hit(m: Matched, w: &Weights) -> f64 {
    let gpu = m.gpu.min(m.longest);
    let cpu = m.cpu.max(gpu).min(m.longest);
    gpu as f64 + w.cpu_tier * (cpu - gpu) as f64 + w.disk_tier * (m.longest - cpu) as f64
}

/// Each candidate's score: `overlap · hit/prompt − load · units/max(load_scale, max units)
/// − kv_usage · cache used + session (the session's engine)`, `units` [`Load::blended`].
/// Down candidates score `-inf`.
pub(crate) fn scores(candidates: &[Candidate], prompt_tokens: u64, w: &Weights) -> Vec<f64> {
    let units: Vec<f64> = candidates
        .iter()
        .map(|c| c.load.blended(w.engine_metrics))
        .collect();
    let max_units = candidates
        .iter()
        .zip(&units)
        .filter(|(c, _)| c.up)
        .map(|(_, u)| *u)
        .fold(0.0, f64::max);
    let prompt = prompt_tokens.max(1) as f64;
    let scale = max_units.max(w.load_scale).max(1.0);
    candidates
        .iter()
        .zip(&units)
        .map(|(c, u)| {
            if !c.up {
                return f64::NEG_INFINITY;
            }
            let overlap = weighted_hit(c.matched, w) / prompt;
            let used = c
                .load
                .reported
                .and_then(|r| r.kv_usage_permille)
                .map_or(0.0, |p| f64::from(p.min(1000)) / 1000.0);
            let sticky = if c.sticky { w.session } else { 0.0 };
            w.overlap * overlap - w.load * u / scale - w.kv_usage * used + sticky
        })
        .collect()
}

/// The chosen candidate's index, `None` when every one is down.
///
/// With temperature 0: the best score; ties go to the least loaded, then to the first at or
/// after `rotate` (so equal engines take turns). Otherwise a softmax draw at that
/// temperature, `draw` in `[0, 1)`.
pub(crate) fn choose(
    candidates: &[Candidate],
    prompt_tokens: u64,
    w: &Weights,
    rotate: usize,
    draw: f64,
) -> Option<usize> {
    let s = scores(candidates, prompt_tokens, w);
    let n = s.len();
    let up: Vec<usize> = (0..n).filter(|&i| s[i].is_finite()).collect();
    if up.is_empty() {
        return None;
    }
    if w.temperature > 0.0 {
        let best = up.iter().map(|&i| s[i]).fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = up
            .iter()
            .map(|&i| ((s[i] - best) / w.temperature).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut target = draw.clamp(0.0, 1.0) * total;
        for (k, &i) in up.iter().enumerate() {
            if target < weights[k] {
                return Some(i);
            }
            target -= weights[k];
        }
        return up.last().copied();
    }
    const EPS: f64 = 1e-12;
    let mut best: Option<usize> = None;
    for k in 0..n {
        let i = (rotate + k) % n;
        if !s[i].is_finite() {
            continue;
        }
        best = match best {
            None => Some(i),
            Some(b) => {
                let better = s[i] > s[b] + EPS
                    || ((s[i] - s[b]).abs() <= EPS
                        && candidates[i].load.blended(w.engine_metrics)
                            < candidates[b].load.blended(w.engine_metrics));
                Some(if better { i } else { b })
            }
        };
    }
    best
}

/// What vLLM can reuse of a prompt: never its last token (it must compute one to sample),
/// in whole blocks. `longest` is clamped to that.
pub(crate) fn reusable(longest: u64, prompt_tokens: u64, block_size: u32) -> u64 {
    let bs = u64::from(block_size.max(1));
    let cap = prompt_tokens.saturating_sub(1) / bs * bs;
    longest.min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(longest: u64, in_flight: u64) -> Candidate {
        Candidate {
            matched: Matched {
                gpu: longest,
                cpu: 0,
                disk: 0,
                longest,
            },
            load: Load {
                in_flight,
                waiting: 0,
                reported: None,
            },
            up: true,
            sticky: false,
        }
    }

    #[test]
    fn a_session_stays_on_its_engine_until_load_outweighs_it() {
        let w = Weights::default();
        let mut c = [cand(0, 0), cand(0, 1), cand(0, 0)];
        c[1].sticky = true;
        // 0.5 affinity against 1/8 of load: the session's engine.
        assert_eq!(choose(&c, 64, &w, 0, 0.0), Some(1));
        // Much busier: it moves.
        c[1].load.in_flight = 6;
        assert_eq!(choose(&c, 64, &w, 0, 0.0), Some(0));
        // A whole prompt cached elsewhere beats the affinity.
        let mut c = [cand(64, 0), cand(0, 0)];
        c[1].sticky = true;
        assert_eq!(choose(&c, 64, &w, 0, 0.0), Some(0));
    }

    #[test]
    fn prefix_holder_wins_until_its_load_outweighs_the_overlap() {
        let w = Weights::default();
        // Engine 1 holds the whole prompt; equal load.
        let c = [cand(0, 0), cand(64, 0), cand(0, 0)];
        assert_eq!(choose(&c, 64, &w, 0, 0.0), Some(1));
        // Holding half the prompt with 1 request more than the others still wins.
        let c = [cand(0, 0), cand(32, 1)];
        assert_eq!(choose(&c, 64, &w, 0, 0.0), Some(1));
        // With much more load the idle one wins: 0.5·overlap < 10/10 load.
        let c = [cand(0, 0), cand(32, 10)];
        assert_eq!(choose(&c, 64, &w, 0, 0.0), Some(0));
        // Weighting the load at 0 makes overlap decide.
        let w0 = Weights { load: 0.0, ..w };
        assert_eq!(choose(&c, 64, &w0, 0, 0.0), Some(1));
    }

    #[test]
    fn ties_go_to_the_least_loaded_then_rotate() {
        let w = Weights {
            load: 0.0,
            ..Weights::default()
        };
        let c = [cand(0, 3), cand(0, 1), cand(0, 1)];
        assert_eq!(choose(&c, 10, &w, 0, 0.0), Some(1));
        assert_eq!(choose(&c, 10, &w, 2, 0.0), Some(2));
        let idle = [cand(0, 0), cand(0, 0), cand(0, 0)];
        let picks: Vec<_> = (0..3)
            .map(|r| choose(&idle, 10, &w, r, 0.0).unwrap())
            .collect();
        assert_eq!(picks, vec![0, 1, 2]);
    }

    #[test]
    fn down_engines_are_never_chosen() {
        let w = Weights::default();
        let mut c = [cand(64, 0), cand(0, 5)];
        c[0].up = false;
        assert_eq!(choose(&c, 64, &w, 0, 0.0), Some(1));
        c[1].up = false;
        assert_eq!(choose(&c, 64, &w, 0, 0.0), None);
        let hot = Weights {
            temperature: 1.0,
            ..w
        };
        assert_eq!(choose(&c, 64, &hot, 0, 0.5), None);
    }

    #[test]
    fn softmax_draws_follow_the_scores() {
        let w = Weights {
            temperature: 0.1,
            ..Weights::default()
        };
        let c = [cand(0, 0), cand(64, 0)];
        // p(1) = 1/(1+e^-10): almost every draw goes to the holder.
        let to_holder = (0..1000)
            .filter(|k| choose(&c, 64, &w, 0, f64::from(*k) / 1000.0) == Some(1))
            .count();
        assert!(to_holder >= 999, "{to_holder}");
        let warm = Weights {
            temperature: 1e6,
            ..w
        };
        // A huge temperature is near uniform.
        assert_eq!(choose(&c, 64, &warm, 0, 0.25), Some(0));
        assert_eq!(choose(&c, 64, &warm, 0, 0.75), Some(1));
    }

    #[test]
    fn tiers_are_weighted() {
        let w = Weights::default();
        let m = Matched {
            gpu: 16,
            cpu: 48,
            disk: 64,
            longest: 64,
        };
        // 16 GPU + 0.8·32 CPU + 0.5·16 beyond.
        assert!((weighted_hit(m, &w) - (16.0 + 25.6 + 8.0)).abs() < 1e-9);
        // A GPU copy beats the same prefix on disk only.
        let gpu = cand(64, 0);
        let mut disk = cand(0, 0);
        disk.matched = Matched {
            disk: 64,
            longest: 64,
            ..Matched::default()
        };
        assert_eq!(choose(&[disk, gpu], 64, &w, 0, 0.0), Some(1));
    }

    #[test]
    fn engine_metrics_add_the_load_the_router_does_not_see() {
        let w = Weights::default();
        let busy = |running, waiting, kv| Reported {
            running,
            waiting,
            kv_usage_permille: kv,
        };
        // The engine reports 10 requests the router never sent: the idle one wins.
        let mut c = [cand(0, 0), cand(0, 0)];
        c[0].load.reported = Some(busy(6, 2, None));
        assert_eq!(choose(&c, 64, &w, 0, 0.0), Some(1));
        // A scrape behind the router's own count never lowers the load.
        let mut l = cand(0, 4).load;
        l.reported = Some(busy(1, 0, None));
        assert!((l.blended(1.0) - 4.0).abs() < 1e-9);
        l.reported = Some(busy(5, 1, None));
        assert!((l.blended(0.5) - 5.5).abs() < 1e-9);
        // Weight 0: the engine's counts do not matter.
        let off = Weights {
            engine_metrics: 0.0,
            ..w
        };
        assert_eq!(choose(&c, 64, &off, 0, 0.0), Some(0));
        // A full KV cache weighs against an engine otherwise equal.
        let mut c = [cand(0, 0), cand(0, 0)];
        c[0].load.reported = Some(busy(0, 0, Some(950)));
        c[1].load.reported = Some(busy(0, 0, Some(100)));
        assert_eq!(choose(&c, 64, &w, 0, 0.0), Some(1));
    }

    #[test]
    fn vllm_never_reuses_the_last_token() {
        assert_eq!(reusable(64, 64, 16), 48);
        assert_eq!(reusable(64, 65, 16), 64);
        assert_eq!(reusable(32, 100, 16), 32);
        assert_eq!(reusable(0, 0, 16), 0);
    }
}
