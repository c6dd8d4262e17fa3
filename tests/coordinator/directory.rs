//! The `/directory` routes over a real socket, against LMCache 0.5.6's own answers: the
//! requests of `tests/conformance/lmcache-0.5.6-coordinator/directory_exchanges.json`
//! (recorded from a real `lmcache coordinator --chunk-size 16 --enable-blend-lookup` by
//! `record_directory.py` beside it) replayed in order against `kvplane coordinator` with the
//! same settings: every 2xx body equal, every 422 with the same `loc` and `msg`. Then the
//! blend index off, the eviction controller off and `--disable-metrics`.

use crate::support::http::http;
use kvplane::coordinator::{self, CoordinatorConfig};
use serde_json::{json, Value};

fn config() -> CoordinatorConfig {
    let mut c = CoordinatorConfig::with_defaults("127.0.0.1", 0);
    c.resync = None;
    c.chunk_size = 16;
    c.eviction_check_interval = None;
    c.health_check_interval = None;
    c.blend_probe_stride = Some(1);
    c
}

fn exchanges() -> Vec<Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/conformance/lmcache-0.5.6-coordinator/directory_exchanges.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("recorded exchanges")).expect("JSON")
}

#[tokio::test]
async fn directory_answers_as_lmcache_056() {
    let c = coordinator::start(config()).await.expect("starts");
    let recorded = exchanges();
    assert!(recorded.len() > 30);
    for x in &recorded {
        let method = x["method"].as_str().unwrap();
        let path = x["path"].as_str().unwrap();
        let body = (!x["body"].is_null()).then(|| x["body"].to_string());
        let (status, got) = http(c.addr, method, path, body.as_deref(), &[]).await;
        let want_status = x["status"].as_u64().unwrap() as u16;
        assert_eq!(status, want_status, "{method} {path}: {got}");
        let want = &x["answer"];
        if status == 422 {
            let (g, w) = (&got["detail"][0], &want["detail"][0]);
            assert_eq!(
                (&g["loc"], &g["msg"]),
                (&w["loc"], &w["msg"]),
                "{method} {path}"
            );
        } else if status != 204 {
            assert_eq!(&got, want, "{method} {path}");
        }
    }
    c.stop().await;
}

#[tokio::test]
async fn blend_off_eviction_controller_off_and_metrics_off() {
    let mut cfg = config();
    cfg.blend_probe_stride = None;
    cfg.features.eviction_controller = false;
    cfg.features.metrics = false;
    let c = coordinator::start(cfg).await.expect("starts");
    // The recorded stores, without the blend index: lookups still work, matches are empty.
    for x in exchanges().iter().take(5) {
        let (status, _) = http(c.addr, "POST", "/events", Some(&x["body"].to_string()), &[]).await;
        assert_eq!(status, 200);
    }
    let blend = exchanges()
        .into_iter()
        .find(|x| {
            x["path"] == "/directory/blend-lookup"
                && x["answer"]["matches"]
                    .as_array()
                    .is_some_and(|m| !m.is_empty())
        })
        .unwrap();
    let (status, got) = http(
        c.addr,
        "POST",
        "/directory/blend-lookup",
        Some(&blend["body"].to_string()),
        &[],
    )
    .await;
    assert_eq!((status, got), (200, json!({"matches": []})));
    let (_, st) = http(c.addr, "GET", "/directory/stats", None, &[]).await;
    assert_eq!(st["num_keys"], 6);
    assert_eq!(
        st["blend"],
        json!({"num_contents": 0, "num_chunks": 0, "num_claims": 0, "num_namespaces": 0, "table_size": 1024})
    );
    // 0.5.6 without FleetEvictionController: no quota or pin routes; the rest stays.
    for (m, p) in [
        ("GET", "/quota"),
        ("PUT", "/quota/config"),
        ("GET", "/quota/a"),
        ("GET", "/cache/pins"),
        ("GET", "/metrics"),
    ] {
        let (status, _) = http(c.addr, m, p, Some("{}"), &[]).await;
        assert_eq!(status, 404, "{m} {p}");
    }
    let (status, _) = http(c.addr, "GET", "/instances/usage", None, &[]).await;
    assert_eq!(status, 200);
    c.stop().await;
}

#[tokio::test]
async fn directory_metrics_count_the_limits() {
    let c = coordinator::start(config()).await.expect("starts");
    for x in exchanges().iter().take(5) {
        http(c.addr, "POST", "/events", Some(&x["body"].to_string()), &[]).await;
    }
    let (status, text) = http(c.addr, "GET", "/metrics", None, &[]).await;
    assert_eq!(status, 200);
    let text = text.as_str().unwrap().to_owned();
    for line in [
        "kvplane_coordinator_directory_keys 6",
        "kvplane_coordinator_directory_token_ids 48",
        "kvplane_coordinator_directory_keys_refused_total 0",
        "kvplane_coordinator_directory_tokens_refused_total 0",
        "kvplane_coordinator_directory_blend_chunks 3",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    c.stop().await;
}
