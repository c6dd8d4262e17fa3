//! Discovery: a `kvplane router` process with no `--engine` routes to the engines registered
//! in an index, and follows them as they come and go — those registered at its own
//! in-process index (`--discover index`, `/register` on `--indexer-port`), and those of a
//! separate `kvplane indexer` process (`--discover http://…`), whose events the router then
//! takes into its own index (a continuation goes to the prefix holder, predicted). And the
//! router run by `kvplane serve --router-port` beside its indexer, configured from
//! `KVPLANE_ROUTER_*` and the `router:` section of serve's `--config`.

use crate::support::engine::Engine;
use crate::support::process::{Launch, Process};
use crate::support::{eventually, http, sample, SLOW};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

fn model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/models/minilm")
}

/// A `kvplane router` process discovering from `source`; its HTTP and indexer addresses.
async fn router(source: &str) -> (Process, SocketAddr, SocketAddr) {
    let p = Launch::kvplane("router")
        .envs_owned(&[
            ("KVPLANE_ROUTER_HOST", "127.0.0.1".into()),
            ("KVPLANE_ROUTER_PORT", "0".into()),
            ("KVPLANE_ROUTER_MODEL", "m".into()),
            (
                "KVPLANE_ROUTER_MODEL_DIR",
                model_dir().display().to_string(),
            ),
            ("KVPLANE_ROUTER_BLOCK_SIZE", "4".into()),
            ("KVPLANE_ROUTER_DISCOVER", source.into()),
            ("KVPLANE_ROUTER_DISCOVERY_INTERVAL", "0.2".into()),
            ("KVPLANE_ROUTER_HEALTH_INTERVAL", "0.2".into()),
        ])
        .spawn();
    let at = p.listening("kvplane router listening").await;
    (p, at.addr("http"), at.addr("indexer"))
}

/// Registers `engine` as `name` at the indexer `at` (with its HTTP address unless `bare`).
async fn register(at: SocketAddr, engine: &Engine, name: &str, bare: bool) {
    let mut body = json!({"endpoint": engine.events, "replay_endpoint": engine.replay,
        "type": "vLLM", "modelname": "m", "instance_id": name, "block_size": 4, "dp_rank": 0});
    if !bare {
        body["http_endpoint"] = json!(format!("http://{}", engine.addr));
    }
    let (status, answer) = http(at, "POST", "/register", Some(&body.to_string()), &[]).await;
    assert_eq!(status, 200, "{answer}");
}

async fn unregister(at: SocketAddr, name: &str) {
    let body = json!({"instance_id": name}).to_string();
    let (status, answer) = http(at, "POST", "/unregister", Some(&body), &[]).await;
    assert_eq!(status, 200, "{answer}");
}

/// The instances the router at `addr` routes to now.
async fn engines(addr: SocketAddr) -> Vec<String> {
    let (_, health) = http(addr, "GET", "/health", None, &[]).await;
    let mut names: Vec<String> = health["engines"]
        .as_array()
        .map(|l| {
            l.iter()
                .filter_map(|e| e["instance"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

async fn until_engines(addr: SocketAddr, want: &[&str]) {
    eventually("the router follows the registrations", SLOW, async || {
        let now = engines(addr).await;
        if now == want {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;
}

async fn complete(addr: SocketAddr, prompt: &str) -> (u16, Value) {
    let body = json!({"model": "m", "prompt": prompt, "max_tokens": 3}).to_string();
    http(addr, "POST", "/v1/completions", Some(&body), &[]).await
}

async fn metric(addr: SocketAddr, series: &str) -> f64 {
    let (_, text) = http(addr, "GET", "/metrics", None, &[]).await;
    sample(text.as_str().expect("metrics text"), series)
}

const PROMPT: &str = "a long shared system prompt that every request of this test begins with, \
                      long enough to fill several blocks of four tokens";

/// A continuation of [`PROMPT`] goes to an engine holding its prefix, which reuses it, as
/// the router's index predicted (so the discovered engines' events reach that index); that
/// engine.
async fn follows_the_prefix(addr: SocketAddr) -> String {
    let (status, first) = complete(addr, PROMPT).await;
    assert_eq!(status, 200, "{first}");
    eventually(
        "a continuation is predicted where it goes",
        SLOW,
        async || {
            let (_, next) = complete(addr, &format!("{PROMPT} and more")).await;
            let (_, stats) = http(addr, "GET", "/router/stats", None, &[]).await;
            let engine = next["engine"].as_str().unwrap_or_default();
            let predicted = stats["per_engine"][engine]["predicted"]
                .as_u64()
                .unwrap_or(0);
            let cached = next["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0);
            if predicted > 0 && cached > 0 {
                Ok(engine.to_owned())
            } else {
                Err(format!("{next} {stats}"))
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_follows_the_registrations_of_its_own_index() {
    let e0 = Engine::start("e0", &model_dir(), 4).await;
    let e1 = Engine::start("e1", &model_dir(), 4).await;
    let e2 = Engine::start("e2", &model_dir(), 4).await;
    let (mut router, addr, indexer) = router("index").await;
    // Nothing registered: no engine.
    assert_eq!(complete(addr, "hello").await.0, 503);
    register(indexer, &e0, "e0", false).await;
    register(indexer, &e1, "e1", false).await;
    until_engines(addr, &["e0", "e1"]).await;
    let holder = follows_the_prefix(addr).await;
    // The holder leaves: every request goes to the other one.
    unregister(indexer, &holder).await;
    let other = if holder == "e0" { "e1" } else { "e0" };
    until_engines(addr, &[other]).await;
    let (status, answer) = complete(addr, PROMPT).await;
    assert_eq!((status, answer["engine"].as_str()), (200, Some(other)));
    // An instance registered without its HTTP address is not routed to, and counted.
    register(indexer, &e2, "e2", true).await;
    eventually("the bare registration is counted", SLOW, async || {
        metric(
            addr,
            "kvplane_router_discovery_unrouted{reason=\"no_http_endpoint\"}",
        )
        .await
            == 1.0
    })
    .await;
    assert_eq!(engines(addr).await, [other]);
    assert_eq!(
        metric(
            addr,
            "kvplane_router_discovered_engines_changes_total{change=\"added\"}"
        )
        .await,
        2.0
    );
    assert_eq!(
        metric(
            addr,
            "kvplane_router_discovered_engines_changes_total{change=\"removed\"}"
        )
        .await,
        1.0
    );
    assert_eq!(metric(addr, "kvplane_router_discovered_engines").await, 1.0);
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_follows_a_separate_indexer_process() {
    let e0 = Engine::start("e0", &model_dir(), 4).await;
    let e1 = Engine::start("e1", &model_dir(), 4).await;
    let mut indexer = Launch::kvplane("indexer")
        .env("KVPLANE_INDEXER_HOST", "127.0.0.1")
        .env("KVPLANE_INDEXER_PORT", "0")
        .spawn();
    let at = indexer
        .listening("kvplane indexer listening")
        .await
        .addr("http");
    register(at, &e0, "e0", false).await;
    let (mut router, addr, own) = router(&format!("http://{at}")).await;
    until_engines(addr, &["e0"]).await;
    register(at, &e1, "e1", false).await;
    until_engines(addr, &["e0", "e1"]).await;
    // The router subscribed to both engines' events in its own index.
    let (_, services) = http(own, "GET", "/services", None, &[]).await;
    assert_eq!(services["count"], 2, "{services}");
    let holder = follows_the_prefix(addr).await;
    unregister(at, &holder).await;
    let other = if holder == "e0" { "e1" } else { "e0" };
    until_engines(addr, &[other]).await;
    eventually("the router's index drops it too", SLOW, async || {
        http(own, "GET", "/services", None, &[]).await.1["count"] == 1
    })
    .await;
    // The indexer goes away: the engines found are kept (the reads fail, counted).
    indexer.stop().await;
    eventually("a failed read is counted", SLOW, async || {
        metric(
            addr,
            "kvplane_router_discovery_reads_total{outcome=\"failed\"}",
        )
        .await
            >= 1.0
    })
    .await;
    assert_eq!(engines(addr).await, [other]);
    assert_eq!(complete(addr, "still routed").await.0, 200);
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_the_router_beside_its_indexer() {
    let e0 = Engine::start("e0", &model_dir(), 4).await;
    let e1 = Engine::start("e1", &model_dir(), 4).await;
    let dir = crate::support::node::tempdir("router-serve");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let file = dir.join("serve.yaml");
    std::fs::write(
        &file,
        format!(
            "router:\n  model_dir: {}\n  block_size: 4\n  discovery_interval: 0.2\n",
            model_dir().display()
        ),
    )
    .expect("write the settings");
    let ports = crate::support::ServePorts::free();
    let mut serve = Launch::kvplane("serve")
        .args(["--config".as_ref(), file.as_os_str()])
        .envs_owned(&ports.env())
        .envs_owned(&[
            ("KVPLANE_SERVE_INDEXER_PORT", "0".into()),
            ("KVPLANE_SERVE_ROUTER_PORT", "0".into()),
            ("KVPLANE_ROUTER_MODEL", "m".into()),
            ("KVPLANE_ROUTER_HEALTH_INTERVAL", "0.2".into()),
        ])
        .spawn();
    let indexer = serve
        .listening("kvplane indexer listening")
        .await
        .addr("http");
    let at = serve.listening("kvplane router listening").await;
    let addr = at.addr("http");
    // The router's index is serve's indexer: engines register there, nowhere else.
    assert_eq!(at.addr("indexer"), indexer);
    register(indexer, &e0, "e0", false).await;
    register(indexer, &e1, "e1", false).await;
    until_engines(addr, &["e0", "e1"]).await;
    follows_the_prefix(addr).await;
    unregister(indexer, "e0").await;
    until_engines(addr, &["e1"]).await;
    serve.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
