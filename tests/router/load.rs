//! The engines' own metrics in the load term: the router scrapes each engine's Prometheus
//! `/metrics` (vLLM's series, here from the stand-in) and routes away from an engine that
//! reports requests the router did not send and a nearly full KV cache; with the weights at 0
//! it does not (the control). An engine without `/metrics` is counted and routed on tracked
//! load alone.

use crate::support::engine::engines;
use crate::support::{eventually, http, sample, within, SLOW};
use kvplane::router::{start, RouterConfig, RouterServer};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

const BUSY: &str = "# TYPE vllm:num_requests_running gauge\n\
    vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 20.0\n\
    vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 4.0\n\
    vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.9\n";

fn model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/models/minilm")
}

async fn metrics(r: &RouterServer) -> String {
    let (_, m) = http(r.addr, "GET", "/metrics", None, &[]).await;
    m.as_str().expect("metrics text").to_owned()
}

/// The engines that took `n` unrelated prompts (never sent before: `run` apart) in turn.
async fn picks(r: &RouterServer, run: &str, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for k in 0..n {
        let body =
            json!({"model": "m", "prompt": format!("{k} {run} words number {k}"), "max_tokens": 3});
        let (status, answer) = http(
            r.addr,
            "POST",
            "/v1/completions",
            Some(&body.to_string()),
            &[],
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        out.push(answer["engine"].as_str().expect("engine").to_owned());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_reporting_load_the_router_did_not_send_is_avoided() {
    let (engines, specs) = engines(&model_dir(), 3, 4).await;
    *engines[0].knobs.metrics.lock().unwrap() = Some(BUSY.into());
    *engines[1].knobs.metrics.lock().unwrap() = Some(
        "vllm:num_requests_running{model_name=\"m\"} 0\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.1\n"
            .into(),
    );
    // e2 has no /metrics (404).
    for weighted in [true, false] {
        let mut config = RouterConfig::new("m", specs.clone());
        config.model_dir = Some(model_dir());
        config.block_size = 4;
        config.engine_metrics_interval = Some(Duration::from_millis(50));
        if !weighted {
            config.weights.engine_metrics = 0.0;
            config.weights.kv_usage = 0.0;
        }
        let r = within("router starts", start(config))
            .await
            .expect("starts");
        eventually("the engines are scraped", SLOW, async || {
            let text = metrics(&r).await;
            sample(
                &text,
                "kvplane_router_engine_reported{engine=\"e0\",kind=\"running\"}",
            ) == 20.0
                && sample(
                    &text,
                    "kvplane_router_engine_scrapes_total{engine=\"e2\",outcome=\"failed\"}",
                ) > 0.0
        })
        .await;
        let text = metrics(&r).await;
        assert_eq!(
            sample(
                &text,
                "kvplane_router_engine_reported{engine=\"e0\",kind=\"kv_usage\"}"
            ),
            0.9,
            "{text}"
        );
        let picks = picks(&r, if weighted { "weighted" } else { "control" }, 6).await;
        if weighted {
            assert!(!picks.iter().any(|p| p == "e0"), "{picks:?}");
        } else {
            // The control: without the engines' figures the three take turns.
            assert!(picks.iter().any(|p| p == "e0"), "{picks:?}");
        }
        r.stop().await;
    }
}
