//! `kvplane router` end to end on 127.0.0.1: engine stand-ins (`crate::support::engine`: an axum
//! server answering as vLLM's OpenAI server, publishing vLLM-format KV events over ZMQ) behind
//! a real router with its in-process index. Passthrough (streaming chunk by chunk and whole),
//! routing to the prefix holder, namespaces (LoRA, `cache_salt`), dead and slow engines,
//! predicted against delivered cached tokens, and tokenizer parity with the Python
//! `tokenizers` library and transformers' chat templates.
//!
//! The parity test needs `KVPLANE_TOKENIZERS_PYTHON` (printed by
//! `scripts/setup-tokenizers.sh`; `scripts/test.sh` sets it); without it the test FAILS with
//! these instructions, unless `KVPLANE_SKIP_TOKENIZERS=1` says on purpose that it is skipped.

use crate::support::engine::{engines, Engine};
use crate::support::process::{Launch, Stream};
use crate::support::{eventually, http, within, SLOW, STEP};
use http_body_util::BodyExt;
use kvplane::indexer::index::{LoraNs, QueryScope};
use kvplane::router::tokenize::ModelTokenizer;
use kvplane::router::{start, EngineSpec, RouterConfig, RouterServer};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

const BS: usize = 4;

fn model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/models/minilm")
}

fn tokenizer() -> ModelTokenizer {
    ModelTokenizer::load(&model_dir()).expect("test tokenizer loads")
}

async fn router(engines: Vec<EngineSpec>, tweak: impl FnOnce(&mut RouterConfig)) -> RouterServer {
    let mut config = RouterConfig::new("m", engines);
    config.model_dir = Some(model_dir());
    config.block_size = BS as u32;
    config.health_interval = Duration::from_millis(200);
    tweak(&mut config);
    within("router starts", start(config))
        .await
        .expect("router starts")
}

async fn post(addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    http(addr, "POST", path, Some(&body.to_string()), &[]).await
}

/// No answer's `usage.prompt_tokens` differed from the router's own count.
fn assert_no_mismatch(metrics: &str) {
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("kvplane_router_prompt_tokens_mismatch_total{")),
        "{metrics}"
    );
}

/// Waits until the router's index says `instance` holds at least `tokens` of `prompt`.
async fn until_indexed(
    r: &RouterServer,
    ids: &[u32],
    instance: &str,
    salt: &str,
    lora: &str,
    tokens: u64,
) {
    let indexer = &r.state.indexer;
    eventually(
        "the engine's blocks reach the index",
        Duration::from_secs(10),
        async || {
            let rows = indexer.query_tokens(
                &QueryScope {
                    tenant: "default",
                    model: "m",
                    lora: LoraNs::Name(lora.into()),
                    block_size: BS as u32,
                    salt,
                    instance: None,
                },
                ids,
            );
            rows.get(instance)
                .is_some_and(|m| m.longest_matched >= tokens)
        },
    )
    .await;
}

const PROMPT: &str = "The quick brown fox jumps over the lazy dog while the cat watches from \
                      the warm windowsill and the birds sing in the old oak tree";

fn cached(body: &Value) -> u64 {
    body["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached_tokens")
}

/// `--host` takes an IPv6 literal as it is written (the bind brackets it); skipped where the
/// machine has no IPv6 loopback.
#[tokio::test]
async fn binds_an_ipv6_literal() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("skipped: no IPv6 loopback here");
        return;
    }
    let r = router(Vec::new(), |c| c.host = "::1".into()).await;
    assert!(r.addr.is_ipv6(), "{}", r.addr);
    let (status, body) = http(r.addr, "GET", "/healthz", None, &[]).await;
    assert_eq!((status, body), (200, json!({"status": "ok"})));
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_to_the_engine_holding_the_prefix_and_accounts_it() {
    let (_engines, specs) = engines(&model_dir(), 3, BS).await;
    let r = router(specs, |_| {}).await;
    let (status, first) = post(
        r.addr,
        "/v1/completions",
        json!({"model": "m", "prompt": PROMPT, "max_tokens": 3}),
    )
    .await;
    assert_eq!(status, 200, "{first}");
    // The engine's answer passes through whole.
    assert_eq!(first["object"], "text_completion");
    assert_eq!(first["choices"][0]["text"], "a b c");
    assert_eq!(cached(&first), 0);
    let holder = first["engine"].as_str().expect("engine").to_owned();
    let ids = tokenizer().encode(PROMPT, true).unwrap();
    let full = (ids.len() / BS * BS) as u64;
    until_indexed(&r, &ids, &holder, "", "", full).await;
    // Every continuation of the prompt goes to the holder and reuses its blocks. Each one's
    // own blocks reach the index before the next leaves (they share more than the prompt:
    // a next one sent earlier would find the engine holding more than the index says).
    for i in 0..4 {
        let prompt = format!("{PROMPT} and then something else happens number {i}");
        let (status, body) = post(
            r.addr,
            "/v1/completions",
            json!({"model": "m", "prompt": prompt}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["engine"],
            holder.as_str(),
            "request {i} left the prefix holder"
        );
        assert!(cached(&body) >= full - BS as u64, "{body}");
        let ids = tokenizer().encode(&prompt, true).unwrap();
        until_indexed(&r, &ids, &holder, "", "", (ids.len() / BS * BS) as u64).await;
    }
    // A prompt of token ids is routed as well, without tokenizing.
    let (_, body) = post(
        r.addr,
        "/v1/completions",
        json!({"model": "m", "prompt": ids}),
    )
    .await;
    assert_eq!(body["engine"], holder.as_str());
    // Predicted against delivered: the index was right about every request.
    let (_, stats) = http(r.addr, "GET", "/router/stats", None, &[]).await;
    let all = &stats["overall"];
    assert_eq!(all["requests"], 6, "{stats}");
    assert!(all["predicted"].as_u64().unwrap() > 0, "{stats}");
    assert_eq!(all["predicted"], all["delivered"], "{stats}");
    assert_eq!(all["delivered_ratio"], 1.0);
    assert_eq!(all["missed"]["index_stale"], 0);
    assert_eq!(all["missed"]["routed_for_load"], 0);
    assert_eq!(stats["per_engine"][&holder]["requests"], 6);
    let (_, metrics) = http(r.addr, "GET", "/metrics", None, &[]).await;
    let text = metrics.as_str().expect("text");
    assert!(
        text.contains("kvplane_router_cached_tokens_delivered_ratio{engine=\"all\"} 1"),
        "{text}"
    );
    assert_no_mismatch(text);
    assert_eq!(
        crate::support::sample(
            text,
            &format!("kvplane_router_requests_total{{engine=\"{holder}\",status=\"2xx\"}}")
        ),
        6.0
    );
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_pass_through_chunk_by_chunk() {
    let engine = Engine::start("e0", &model_dir(), BS).await;
    engine.knobs.gate.store(true, Ordering::Relaxed);
    let r = router(vec![engine.spec("e0")], |_| {}).await;
    let client = kvplane::router::upstream::client(Duration::from_secs(2));
    let body = json!({"model": "m", "prompt": PROMPT, "stream": true,
                      "stream_options": {"include_usage": true}});
    let req = hyper::Request::post(format!("http://{}/v1/completions", r.addr))
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_string()))
        .unwrap();
    let resp = within("the stream's head", client.request(req))
        .await
        .expect("answer");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    // The first event arrives while the engine still holds the rest back: the router passes
    // chunks on as they come, it does not wait for the whole body.
    let mut seen = String::new();
    while !seen.contains("\n\n") {
        let frame = within("the first chunk", body.frame())
            .await
            .expect("a frame")
            .expect("ok");
        seen.push_str(std::str::from_utf8(&frame.into_data().unwrap()).unwrap());
    }
    assert!(seen.starts_with("data: {"), "{seen}");
    assert!(!seen.contains("[DONE]"));
    engine.knobs.release.notify_one();
    let rest = within("the rest", body.collect())
        .await
        .expect("rest")
        .to_bytes();
    seen.push_str(std::str::from_utf8(&rest).unwrap());
    let events: Vec<&str> = seen.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 5, "3 tokens, usage, [DONE]: {seen}");
    assert_eq!(events[4], "data: [DONE]");
    assert!(events[3].contains("\"cached_tokens\":0"), "{seen}");
    // The usage chunk was accounted, and the reservation released at the end.
    eventually("accounted", STEP, async || {
        r.state.accounting.lock().overall().requests == 1
    })
    .await;
    eventually("released", STEP, async || {
        r.state.engines()[0].load().in_flight == 0
    })
    .await;
    // A stream that does not ask for usage: the router asks on its behalf, accounts it, and
    // the client sees exactly the events it asked for.
    engine.knobs.gate.store(false, Ordering::Relaxed);
    let req = hyper::Request::post(format!("http://{}/v1/completions", r.addr))
        .header("content-type", "application/json")
        .body(axum::body::Body::from(
            json!({"model": "m", "prompt": PROMPT, "stream": true}).to_string(),
        ))
        .unwrap();
    let resp = within("the second stream", client.request(req))
        .await
        .expect("answer");
    let all = within("its body", resp.into_body().collect())
        .await
        .expect("body")
        .to_bytes();
    let text = std::str::from_utf8(&all).unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(
        events.len(),
        4,
        "3 tokens and [DONE], no usage event: {text}"
    );
    assert!(!text.contains("\"choices\":[]"), "{text}");
    assert_eq!(events[3], "data: [DONE]");
    eventually("the second stream accounted", STEP, async || {
        r.state.accounting.lock().overall().requests == 2
    })
    .await;
    let predicted = r.state.accounting.lock().overall();
    assert!(
        predicted.delivered > 0,
        "the second stream reused the first's blocks: {predicted:?}"
    );
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chats_are_tokenized_with_the_template_and_follow_their_prefix() {
    let (_engines, specs) = engines(&model_dir(), 2, BS).await;
    let r = router(specs, |_| {}).await;
    let system = "You answer questions about the weather in small mountain towns, briefly and \
                  with care for the facts you are given by the user";
    let chat = |q: &str| {
        json!({"model": "m", "messages": [{"role": "system", "content": system},
                                          {"role": "user", "content": q}]})
    };
    let (status, first) = post(r.addr, "/v1/chat/completions", chat("Is it snowing?")).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["object"], "chat.completion");
    let holder = first["engine"].as_str().unwrap().to_owned();
    let req = chat("Is it snowing?");
    let ids = tokenizer().encode_chat(req.as_object().unwrap()).unwrap();
    until_indexed(&r, &ids, &holder, "", "", (ids.len() / BS * BS) as u64).await;
    for q in ["Will it rain tomorrow?", "How cold is it tonight?"] {
        let (_, body) = post(r.addr, "/v1/chat/completions", chat(q)).await;
        assert_eq!(body["engine"], holder.as_str());
        assert!(cached(&body) > 0, "{body}");
    }
    let (_, metrics) = http(r.addr, "GET", "/metrics", None, &[]).await;
    let text = metrics.as_str().unwrap();
    assert_eq!(
        crate::support::sample(text, "kvplane_router_tokenized_total{source=\"local\"}"),
        3.0
    );
    assert_no_mismatch(text);
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lora_and_cache_salt_are_part_of_the_key() {
    let (_engines, specs) = engines(&model_dir(), 2, BS).await;
    let r = router(specs, |_| {}).await;
    let ids = tokenizer().encode(PROMPT, true).unwrap();
    let full = (ids.len() / BS * BS) as u64;
    let (_, a) = post(
        r.addr,
        "/v1/completions",
        json!({"model": "m", "prompt": PROMPT, "cache_salt": "tenant-a"}),
    )
    .await;
    let salted = a["engine"].as_str().unwrap().to_owned();
    until_indexed(&r, &ids, &salted, "tenant-a", "", full).await;
    let (_, b) = post(
        r.addr,
        "/v1/completions",
        json!({"model": "sql-adapter", "prompt": PROMPT}),
    )
    .await;
    let adapter = b["engine"].as_str().unwrap().to_owned();
    until_indexed(&r, &ids, &adapter, "", "sql-adapter", full).await;
    let holder = |lora: &str, salt: &str| {
        let (_, d) = r.state.query(Some(&ids), lora, salt);
        d.predicted
    };
    let e = |name: &str| usize::from(name == "e1");
    // Each namespace sees only its own blocks.
    assert!(holder("", "tenant-a")[e(&salted)] > 0);
    assert_eq!(holder("", "tenant-b"), vec![0, 0]);
    assert_eq!(holder("", ""), vec![0, 0]);
    assert!(holder("sql-adapter", "")[e(&adapter)] > 0);
    assert_eq!(holder("other-adapter", ""), vec![0, 0]);
    // And the same salt comes back to its holder, reusing its blocks.
    let (_, c) = post(
        r.addr,
        "/v1/completions",
        json!({"model": "m", "prompt": PROMPT, "cache_salt": "tenant-a"}),
    )
    .await;
    assert_eq!(c["engine"], salted.as_str());
    assert!(cached(&c) > 0);
    r.stop().await;
}

/// A port nothing listens on.
fn dead_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    format!("http://{addr},instance=dead")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_engine_is_skipped() {
    let live = Engine::start("live", &model_dir(), BS).await;
    let dead: EngineSpec = dead_url().parse().unwrap();
    // Health probes far apart: the failed calls themselves take the dead engine out.
    let r = router(vec![dead, live.spec("live")], |c| {
        c.health_interval = Duration::from_secs(3600);
    })
    .await;
    for i in 0..4 {
        let (status, body) = post(
            r.addr,
            "/v1/completions",
            json!({"model": "m", "prompt": format!("hello {i}")}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["engine"], "live");
    }
    let (_, metrics) = http(r.addr, "GET", "/metrics", None, &[]).await;
    let text = metrics.as_str().unwrap();
    assert!(
        crate::support::sample(
            text,
            "kvplane_router_engine_errors_total{engine=\"dead\",kind=\"connect\"}"
        ) >= 1.0,
        "{text}"
    );
    assert_eq!(
        crate::support::sample(text, "kvplane_router_engine_up{engine=\"dead\"}"),
        0.0
    );
    let (status, health) = http(r.addr, "GET", "/health", None, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(health["engines"][0]["up"], false);
    r.stop().await;

    // Every engine dead: 503 at once, not a hang.
    let r = router(vec![dead_url().parse().unwrap()], |_| {}).await;
    let (status, body) = post(
        r.addr,
        "/v1/completions",
        json!({"model": "m", "prompt": "x"}),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["type"], "no_engine");
    let (status, _) = http(r.addr, "GET", "/health", None, &[]).await;
    assert_eq!(status, 503);
    r.stop().await;
}

/// An answer over `--max-response-bytes` is a 502, counted as the limit it hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_the_response_bound_is_refused_and_counted() {
    let e = Engine::start("e0", &model_dir(), BS).await;
    let r = router(vec![e.spec("e0")], |c| c.max_response_bytes = 64).await;
    let (status, body) = post(
        r.addr,
        "/v1/completions",
        json!({"model": "m", "prompt": "hello", "max_tokens": 3}),
    )
    .await;
    assert_eq!(status, 502, "{body}");
    let (_, metrics) = http(r.addr, "GET", "/metrics", None, &[]).await;
    let text = metrics.as_str().expect("text");
    let series = [
        "kvplane_router_limits_hit_total{limit=\"max_response_bytes\"}",
        "kvplane_router_engine_errors_total{engine=\"e0\",kind=\"too_large\"}",
    ];
    for s in series {
        assert_eq!(crate::support::sample(text, s), 1.0, "{s}: {text}");
    }
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_engine_times_out_and_the_next_requests_go_elsewhere() {
    let slow = Engine::start("slow", &model_dir(), BS).await;
    let fast = Engine::start("fast", &model_dir(), BS).await;
    slow.knobs.delay_ms.store(30_000, Ordering::Relaxed);
    let r = router(vec![slow.spec("slow"), fast.spec("fast")], |c| {
        c.response_timeout = Duration::from_millis(300);
        c.health_interval = Duration::from_secs(3600);
    })
    .await;
    let mut timed_out = 0;
    for i in 0..4 {
        let (status, body) = post(
            r.addr,
            "/v1/completions",
            json!({"model": "m", "prompt": format!("question {i}")}),
        )
        .await;
        match status {
            504 => {
                timed_out += 1;
                assert_eq!(body["error"]["type"], "engine_error");
            }
            200 => assert_eq!(body["engine"], "fast"),
            other => panic!("status {other}: {body}"),
        }
    }
    // The first request went to the slow engine (both idle, the first in order), timed out,
    // and took it out of rotation: the others all went to the fast one.
    assert_eq!(timed_out, 1);
    let (_, metrics) = http(r.addr, "GET", "/metrics", None, &[]).await;
    let text = metrics.as_str().unwrap();
    assert_eq!(
        crate::support::sample(
            text,
            "kvplane_router_engine_errors_total{engine=\"slow\",kind=\"timeout\"}"
        ),
        1.0
    );
    eventually(
        "the timed-out request released its load",
        STEP,
        async || r.state.engines()[0].load().in_flight == 0,
    )
    .await;
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stream_is_cut() {
    let engine = Engine::start("e0", &model_dir(), BS).await;
    engine.knobs.stall.store(true, Ordering::Relaxed);
    let r = router(vec![engine.spec("e0")], |c| {
        c.stream_idle_timeout = Duration::from_millis(300);
    })
    .await;
    let client = kvplane::router::upstream::client(Duration::from_secs(2));
    let req = hyper::Request::post(format!("http://{}/v1/completions", r.addr))
        .header("content-type", "application/json")
        .body(axum::body::Body::from(
            json!({"model": "m", "prompt": "hi", "stream": true}).to_string(),
        ))
        .unwrap();
    let resp = within("head", client.request(req)).await.expect("answer");
    assert_eq!(resp.status(), 200);
    // The first chunk comes, then the body ends in an error instead of hanging.
    let collected = within("the cut stream ends", resp.into_body().collect()).await;
    assert!(collected.is_err(), "a stalled stream must end in an error");
    let (_, metrics) = http(r.addr, "GET", "/metrics", None, &[]).await;
    let text = metrics.as_str().unwrap();
    assert_eq!(
        crate::support::sample(
            text,
            "kvplane_router_engine_errors_total{engine=\"e0\",kind=\"timeout\"}"
        ),
        1.0
    );
    eventually("released", STEP, async || {
        r.state.engines()[0].load().in_flight == 0
    })
    .await;
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_model_dir_the_engine_tokenizes() {
    let engine = Engine::start("e0", &model_dir(), BS).await;
    let r = router(vec![engine.spec("e0")], |c| c.model_dir = None).await;
    let (status, body) = post(
        r.addr,
        "/v1/completions",
        json!({"model": "m", "prompt": PROMPT}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, models) = http(r.addr, "GET", "/v1/models", None, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(models["data"][0]["id"], "m");
    let (_, metrics) = http(r.addr, "GET", "/metrics", None, &[]).await;
    let text = metrics.as_str().unwrap();
    assert_eq!(
        crate::support::sample(text, "kvplane_router_tokenized_total{source=\"engine\"}"),
        1.0
    );
    assert_no_mismatch(text);
    // A body that is not JSON is refused before any engine sees it.
    let (status, body) = http(r.addr, "POST", "/v1/completions", Some("{not json"), &[]).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(engine.knobs.served.load(Ordering::Relaxed), 1);
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_doctor_names_block_size_and_salt_mismatches() {
    let good = Engine::start("good", &model_dir(), BS).await;
    // Blocks of 8 tokens where the router expects 4.
    let wide = Engine::start("wide", &model_dir(), 2 * BS).await;
    // A salt the router is not told about.
    let salted = Engine::start("salted", &model_dir(), BS).await;
    *salted.knobs.salt.lock().unwrap() = Some("w8a8".into());
    // No events endpoint at all.
    let silent = Engine::start("silent", &model_dir(), BS).await;
    let silent_spec: EngineSpec = format!("http://{},instance=silent", silent.addr)
        .parse()
        .unwrap();
    let specs = vec![
        good.spec("good"),
        wide.spec("wide"),
        salted.spec("salted"),
        silent_spec,
        dead_url().parse().unwrap(),
    ];
    let mut config = RouterConfig::new("m", specs.clone());
    config.model_dir = Some(model_dir());
    config.block_size = BS as u32;
    let verdicts = within(
        "the doctor",
        kvplane::router::doctor(config, Duration::from_secs(2)),
    )
    .await
    .expect("doctor runs");
    let status: Vec<(&str, &str)> = verdicts
        .iter()
        .map(|v| (v.instance.as_str(), v.status))
        .collect();
    assert_eq!(
        status,
        vec![
            ("good", "ok"),
            ("wide", "block_size"),
            ("salted", "namespace"),
            ("silent", "no_events"),
            ("dead", "unreachable"),
        ],
        "{verdicts:#?}"
    );
    assert!(
        verdicts[1].detail.contains("--block-size 4"),
        "{}",
        verdicts[1].detail
    );
    assert!(
        verdicts[2].detail.contains("salt"),
        "{}",
        verdicts[2].detail
    );
    // The same check as a route of a running router: 409 naming the mismatches.
    let r = router(specs, |c| c.connect_timeout = Duration::from_millis(500)).await;
    let (status, body) = post(r.addr, "/router/doctor", json!({})).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["ok"], false);
    assert_eq!(body["engines"][0]["status"], "ok", "{body}");
    assert_eq!(body["engines"][1]["status"], "block_size", "{body}");
    r.stop().await;
}

#[tokio::test]
async fn tokenizer_matches_python_tokenizers_and_transformers() {
    let Ok(python) = std::env::var("KVPLANE_TOKENIZERS_PYTHON") else {
        if std::env::var("KVPLANE_SKIP_TOKENIZERS").as_deref() == Ok("1") {
            eprintln!("skipped: KVPLANE_SKIP_TOKENIZERS=1");
            return;
        }
        panic!(
            "set KVPLANE_TOKENIZERS_PYTHON to the interpreter `bash scripts/setup-tokenizers.sh` \
             prints (or KVPLANE_SKIP_TOKENIZERS=1 to skip this test on purpose)"
        );
    };
    let texts = [
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "  leading and trailing spaces  ",
        "Ünïcödé àccents, CJK 漢字かな, emoji 🦀 and Greek λόγος",
        "tabs\tand\nnewlines\r\nmixed",
        "numbers 3.14159 and 1,000,000 and 2024-11-26",
        "code: fn main() { println!(\"{}\", x); } // done",
        "[CLS] special tokens written out [SEP] [MASK]",
        "unbelievably antidisestablishmentarianism supercalifragilistic",
        "",
    ];
    let chats = [
        json!([{"role": "user", "content": "Hi there"}]),
        json!([{"role": "system", "content": "  Be brief.  "},
               {"role": "user", "content": "What is 2+2?"},
               {"role": "assistant", "content": "4"},
               {"role": "user", "content": "And 3+3?"}]),
    ];
    let req = json!({"model_dir": model_dir(), "texts": texts, "chats": chats});
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/router-tokenizers/encode.py");
    let mut encode = Launch::new("encode.py", &python)
        .arg(&script)
        .stdin()
        .spawn();
    encode.write_line(&req.to_string()).await;
    encode.close_stdin();
    let status = encode.wait_exit(SLOW).await;
    assert!(status.success(), "encode.py failed:\n{}", encode.log());
    let out = eventually("encode.py's answer read", STEP, async || {
        encode
            .closed(Stream::Stdout)
            .then(|| encode.text(Stream::Stdout))
    })
    .await;
    let want: Value = serde_json::from_str(&out).expect("JSON");
    let tok = tokenizer();
    for (i, text) in texts.iter().enumerate() {
        let ids = tok.encode(text, true).unwrap();
        assert_eq!(
            json!(ids),
            want["texts"][i],
            "with special tokens: {text:?}"
        );
        let plain = tok.encode(text, false).unwrap();
        assert_eq!(json!(plain), want["plain"][i], "without: {text:?}");
    }
    for (i, messages) in chats.iter().enumerate() {
        let req = json!({"messages": messages});
        let text = tok.render_chat(req.as_object().unwrap()).unwrap();
        assert_eq!(json!(text), want["chats"][i]["text"], "rendered chat {i}");
        let ids = tok.encode_chat(req.as_object().unwrap()).unwrap();
        assert_eq!(json!(ids), want["chats"][i]["ids"], "chat {i}");
    }
    // A template's own error is the request's error, not a panic.
    let bad = json!({"messages": [{"role": "tool", "content": "x"}]});
    let err = tok.render_chat(bad.as_object().unwrap()).unwrap_err();
    assert!(err.contains("roles must alternate"), "{err}");
}
