//! An engine's Prometheus text read into its figures, pure: [`parse`]. The driver
//! (`scrape.rs`) fetches `/metrics` every `--engine-metrics-interval`.

use super::score::Reported;

/// Series of requests running: vLLM, SGLang.
const RUNNING: &[&str] = &["vllm:num_requests_running", "sglang:num_running_reqs"];
/// Series of requests queued.
const WAITING: &[&str] = &["vllm:num_requests_waiting", "sglang:num_queue_reqs"];
/// Series of KV cache usage, 0..1 (vLLM's name before and after 0.10, SGLang's).
const KV_USAGE: &[&str] = &[
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
];

/// The engine's figures in a Prometheus text exposition: running and waiting summed over
/// every label set (models, data-parallel ranks), KV usage the highest. `None` when it holds
/// neither request series.
pub(crate) fn parse(text: &str) -> Option<Reported> {
    let (mut running, mut waiting, mut usage): (Option<f64>, Option<f64>, Option<f64>) =
        (None, None, None);
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        let kind = if RUNNING.contains(&name) {
            0
        } else if WAITING.contains(&name) {
            1
        } else if KV_USAGE.contains(&name) {
            2
        } else {
            continue;
        };
        // The value follows the labels (which may hold spaces inside quotes).
        let rest = match line[name_end..].strip_prefix('{') {
            Some(labels) => match labels.rfind('}') {
                Some(end) => &labels[end + 1..],
                None => continue,
            },
            None => &line[name_end..],
        };
        let Some(v) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v >= 0.0)
        else {
            continue;
        };
        match kind {
            0 => running = Some(running.unwrap_or(0.0) + v),
            1 => waiting = Some(waiting.unwrap_or(0.0) + v),
            _ => usage = Some(usage.map_or(v, |u| u.max(v))),
        }
    }
    if running.is_none() && waiting.is_none() {
        return None;
    }
    Some(Reported {
        running: running.unwrap_or(0.0).round() as u64,
        waiting: waiting.unwrap_or(0.0).round() as u64,
        kv_usage_permille: usage.map(|u| (u.min(1.0) * 1000.0).round() as u32),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_and_sglang_figures() {
        let vllm =
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
            # TYPE vllm:num_requests_running gauge\n\
            vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n\
            vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2.0\n\
            vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 4.0\n\
            vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n\
            vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.5\n\
            vllm:num_requests_running_total 99\n";
        assert_eq!(
            parse(vllm),
            Some(Reported {
                running: 5,
                waiting: 4,
                kv_usage_permille: Some(500),
            })
        );
        let old = "vllm:num_requests_running{model_name=\"a b\"} 1\nvllm:gpu_cache_usage_perc 0.9";
        assert_eq!(parse(old).unwrap().kv_usage_permille, Some(900));
        let sglang = "sglang:num_running_reqs{model_name=\"m\"} 7\nsglang:num_queue_reqs{model_name=\"m\"} 1\nsglang:token_usage{model_name=\"m\"} 0.1";
        assert_eq!(
            parse(sglang),
            Some(Reported {
                running: 7,
                waiting: 1,
                kv_usage_permille: Some(100),
            })
        );
    }

    #[test]
    fn refuses_what_is_not_a_figure() {
        assert_eq!(parse(""), None);
        assert_eq!(parse("other_metric 3\n"), None);
        // Bad values are skipped, not read as 0 of a series that is there.
        assert_eq!(
            parse("vllm:num_requests_running NaN\nvllm:num_requests_running -1\nvllm:num_requests_running{x=\"}\n"),
            None
        );
        let r = parse("vllm:num_requests_waiting 2 1700000000000\n").unwrap();
        assert_eq!((r.running, r.waiting, r.kv_usage_permille), (0, 2, None));
    }
}
