//! Session affinity: requests of one session (the `x-session-id` header, else the body's
//! `user`) go to the engine that served it last, though their prompts share no prefix;
//! requests without one take turns (the control).

use crate::support::engine::engines;
use crate::support::{http, sample, within};
use kvplane::router::{start, RouterConfig, RouterServer};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/models/minilm")
}

/// The engines that took 6 unrelated prompts (`run` apart from every other run's), each
/// with `extra` in the body and `headers`.
async fn engines_of(
    r: &RouterServer,
    run: &str,
    extra: Value,
    headers: &[(&str, &str)],
) -> Vec<String> {
    let mut out = Vec::new();
    for k in 0..6 {
        let mut body =
            json!({"model": "m", "prompt": format!("{k} {run} turn {k}"), "max_tokens": 3});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        let (status, answer) = http(
            r.addr,
            "POST",
            "/v1/completions",
            Some(&body.to_string()),
            headers,
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        out.push(answer["engine"].as_str().expect("engine").to_owned());
    }
    out
}

fn distinct(picks: &[String]) -> usize {
    picks.iter().collect::<HashSet<_>>().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_keeps_its_engine() {
    let (_engines, specs) = engines(&model_dir(), 3, 4).await;
    let mut config = RouterConfig::new("m", specs);
    config.model_dir = Some(model_dir());
    config.block_size = 4;
    let r = within("router starts", start(config))
        .await
        .expect("starts");
    let alice = engines_of(&r, "alice", json!({"user": "alice"}), &[]).await;
    assert_eq!(distinct(&alice), 1, "{alice:?}");
    let bob = engines_of(
        &r,
        "bob",
        json!({"user": "not bob"}),
        &[("x-session-id", "bob")],
    )
    .await;
    assert_eq!(distinct(&bob), 1, "{bob:?}");
    let nobody = engines_of(&r, "nobody", json!({}), &[]).await;
    assert!(distinct(&nobody) > 1, "the control: {nobody:?}");
    let (_, m) = http(r.addr, "GET", "/metrics", None, &[]).await;
    let text = m.as_str().expect("metrics");
    assert_eq!(
        sample(
            text,
            "kvplane_router_session_requests_total{outcome=\"new\"}"
        ),
        2.0,
        "{text}"
    );
    assert_eq!(
        sample(
            text,
            "kvplane_router_session_requests_total{outcome=\"kept\"}"
        ),
        10.0,
        "{text}"
    );
    r.stop().await;
}
