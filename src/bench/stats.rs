//! Latency summaries and small measurement helpers.

use serde::Serialize;
use std::time::Duration;

/// Percentiles of a latency sample, in microseconds.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Latency {
    /// Number of samples.
    pub count: usize,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest sample.
    pub max_us: f64,
    /// Mean.
    pub mean_us: f64,
}

impl Latency {
    /// Summarises `samples` (order irrelevant; sorted in place).
    pub fn from_samples(samples: &mut [Duration]) -> Self {
        if samples.is_empty() {
            return Latency::default();
        }
        samples.sort_unstable();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let at = |q: f64| {
            // Nearest-rank percentile; the epsilon keeps 0.99 × 1000 (= 990.0000000000001 in
            // binary floating point) at rank 990.
            let rank = (q * samples.len() as f64 - 1e-9).ceil() as usize;
            us(samples[rank.clamp(1, samples.len()) - 1])
        };
        let total: f64 = samples.iter().map(|d| us(*d)).sum();
        Latency {
            count: samples.len(),
            p50_us: at(0.50),
            p99_us: at(0.99),
            p999_us: at(0.999),
            max_us: us(samples[samples.len() - 1]),
            mean_us: total / samples.len() as f64,
        }
    }
}

/// Resident set size of a process in bytes, from `/proc/<pid>/status` (Linux).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A well-mixed 64-bit value (splitmix64), for spreading synthetic chunk hashes.
pub(super) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut s: Vec<Duration> = (1..=1000).map(Duration::from_micros).collect();
        let l = Latency::from_samples(&mut s);
        let got = [l.p50_us, l.p99_us, l.p999_us, l.max_us];
        for (g, want) in got.into_iter().zip([500.0, 990.0, 999.0, 1000.0]) {
            assert!((g - want).abs() < 1e-6, "{got:?}");
        }
        assert_eq!(l.count, 1000);
        assert_eq!(Latency::from_samples(&mut []), Latency::default());
    }
}
