//! Router replicas sharing their reservations through a real `nats-server` (`--cluster`):
//! two replicas racing for an engine's last free slot never both take it (and two replicas
//! that do not share both do: the control), a reservation whose release never comes stops
//! counting at its deadline, counted.
//!
//! Needs `nats-server` (`$KVPLANE_NATS_SERVER`, `scripts/setup-nats.sh`); without it the tests
//! FAIL with those instructions unless `KVPLANE_SKIP_NATS=1`.

use crate::support::engine::{engines, Engine};
use crate::support::nats::Nats;
use crate::support::{eventually, http, sample, within, SLOW};
use kvplane::router::{start, EngineSpec, RouterConfig, RouterServer};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::task::JoinHandle;

const BS: usize = 4;

fn model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/models/minilm")
}

async fn replica(
    engines: Vec<EngineSpec>,
    cluster: Option<(&Nats, &str)>,
    tweak: impl FnOnce(&mut RouterConfig),
) -> RouterServer {
    let mut config = RouterConfig::new("m", engines);
    config.model_dir = Some(model_dir());
    config.block_size = BS as u32;
    config.engine_slots = Some(1);
    config.cluster = cluster.map(|(nats, name)| kvplane::cluster::ClusterConfig {
        name: name.into(),
        ..kvplane::cluster::ClusterConfig::new(nats.url.clone())
    });
    tweak(&mut config);
    within("router replica starts", start(config))
        .await
        .expect("router replica starts")
}

/// A streamed completion through `addr`, held by the gated engine until released.
fn stream(addr: SocketAddr, prompt: &str) -> JoinHandle<(u16, Value)> {
    let body = json!({"model": "m", "prompt": prompt, "max_tokens": 3, "stream": true});
    tokio::spawn(async move {
        crate::support::try_http(
            addr,
            "POST",
            "/v1/completions",
            Some(&body.to_string()),
            &[],
        )
        .await
        .unwrap_or((0, Value::Null))
    })
}

/// Every replica's reservations on every engine, as replica `r` sees them.
fn held(r: &RouterServer) -> u64 {
    let shared = r.state.shared.as_ref().expect("shared");
    let now = kvplane::cluster::now_ms();
    r.state
        .engines()
        .iter()
        .map(|e| shared.live(&e.spec.instance, now))
        .sum()
}

/// `series` summed over the replicas at `addrs`.
async fn summed(addrs: [SocketAddr; 2], series: &str) -> f64 {
    let mut sum = 0.0;
    for addr in addrs {
        let (_, m) = http(addr, "GET", "/metrics", None, &[]).await;
        sum += sample(m.as_str().expect("metrics text"), series);
    }
    sum
}

/// The engine an SSE answer came from.
fn engine_of(answer: &Value) -> String {
    let text = answer.as_str().unwrap_or_default();
    let at = text.find("\"engine\":\"").map(|i| i + 10).unwrap_or(0);
    text[at..].split('"').next().unwrap_or_default().to_owned()
}

/// Lets the gated streams go on until every task in `tasks` ended; their answers.
async fn release_all(
    engines: &[Engine],
    tasks: Vec<JoinHandle<(u16, Value)>>,
) -> Vec<(u16, Value)> {
    eventually("the held streams end", SLOW, async || {
        for e in engines {
            e.knobs.release.notify_waiters();
        }
        tasks.iter().all(JoinHandle::is_finished)
    })
    .await;
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("request task"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_never_both_take_the_last_free_slot() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let (engines, specs) = engines(&model_dir(), 2, BS).await;
    for e in &engines {
        e.knobs.gate.store(true, Ordering::Relaxed);
    }
    let a = replica(specs.clone(), Some((&nats, "slots")), |_| {}).await;
    let b = replica(specs.clone(), Some((&nats, "slots")), |_| {}).await;
    for round in 0..4 {
        // One slot of two is held (through A, or B every other round).
        let (first, other) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let fill = stream(first.addr, &format!("fill {round}"));
        eventually("the other replica sees the held slot", SLOW, async || {
            held(other) == 1
        })
        .await;
        // Both replicas route at once; one free slot is left.
        let race = vec![
            stream(a.addr, &format!("race a {round}")),
            stream(b.addr, &format!("race b {round}")),
        ];
        eventually("one replica is refused", SLOW, async || {
            race.iter().any(JoinHandle::is_finished)
        })
        .await;
        let answers = release_all(&engines, std::iter::once(fill).chain(race).collect()).await;
        let (fill, race) = (&answers[0], &answers[1..]);
        assert_eq!(fill.0, 200, "round {round}: {fill:?}");
        let statuses: Vec<u16> = race.iter().map(|r| r.0).collect();
        let mut sorted = statuses.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![200, 429], "round {round}: {race:?}");
        let won = race.iter().find(|r| r.0 == 200).unwrap();
        assert_ne!(engine_of(&won.1), engine_of(&fill.1), "round {round}");
        // Released at the answers' ends: nothing is held before the next round.
        for r in [&a, &b] {
            eventually("the releases reach the replicas", SLOW, async || {
                held(r) == 0
            })
            .await;
        }
    }
    // Summed over both replicas: 4 refusals, 8 slots taken (4 fills, 4 winners).
    let addrs = [a.addr, b.addr];
    assert_eq!(
        summed(
            addrs,
            "kvplane_router_limits_hit_total{limit=\"engine_slots\"}"
        )
        .await,
        4.0
    );
    assert_eq!(
        summed(
            addrs,
            "kvplane_router_shared_reservations_total{outcome=\"reserved\"}"
        )
        .await,
        8.0
    );
    a.stop().await;
    b.stop().await;

    // The control: replicas that do not share both take the last free slot.
    let a = replica(specs.clone(), None, |_| {}).await;
    let b = replica(specs, None, |_| {}).await;
    let served = || {
        engines
            .iter()
            .map(|e| e.knobs.served.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let base = served();
    let fill = stream(a.addr, "fill");
    eventually("A holds a slot", SLOW, async || {
        a.state
            .engines()
            .iter()
            .map(|e| e.load().in_flight)
            .sum::<u64>()
            == 1
    })
    .await;
    let race = vec![stream(a.addr, "race a"), stream(b.addr, "race b")];
    eventually("both race requests are held by engines", SLOW, async || {
        served() >= base + 3
    })
    .await;
    let answers = release_all(&engines, std::iter::once(fill).chain(race).collect()).await;
    assert!(answers.iter().all(|r| r.0 == 200), "{answers:?}");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_never_released_expires_at_its_deadline() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let engine = Engine::start("e0", &model_dir(), BS).await;
    let ttl = |c: &mut RouterConfig| c.reservation_ttl = Duration::from_millis(800);
    let a = replica(vec![engine.spec("e0")], Some((&nats, "ttl")), ttl).await;
    let b = replica(vec![engine.spec("e0")], Some((&nats, "ttl")), ttl).await;
    // B takes the only slot and never releases it (as a replica that died would).
    let shared = b.state.shared.as_ref().expect("shared");
    shared
        .reserve("e0", Some(1), Vec::new())
        .await
        .expect("B reserves");
    eventually("A sees B's reservation", SLOW, async || held(&a) == 1).await;
    let body = json!({"model": "m", "prompt": "hello there", "max_tokens": 3}).to_string();
    let (status, refused) = http(a.addr, "POST", "/v1/completions", Some(&body), &[]).await;
    assert_eq!(status, 429, "{refused}");
    assert_eq!(refused["error"]["type"], "engine_slots", "{refused}");
    // Past its deadline it no longer counts: A routes, and drops it from the entry, counted.
    eventually(
        "the slot frees at the reservation's deadline",
        SLOW,
        async || {
            http(a.addr, "POST", "/v1/completions", Some(&body), &[])
                .await
                .0
                == 200
        },
    )
    .await;
    let (_, metrics) = http(a.addr, "GET", "/metrics", None, &[]).await;
    let text = metrics.as_str().expect("text");
    assert_eq!(
        sample(text, "kvplane_router_shared_reservations_expired_total"),
        1.0,
        "{text}"
    );
    a.stop().await;
    b.stop().await;
}

/// The herd effect, measured (docs/BENCHMARKS.md, "Router replicas"): `n` identical streamed
/// requests at once through `replicas` routers (in turn), the engines holding every stream;
/// how many each engine got. `warm`: one engine holds the prompt's blocks first.
async fn spread(
    engines: &[Engine],
    replicas: &[RouterServer],
    prompt: &str,
    n: usize,
    warm: bool,
) -> Vec<u64> {
    let served = || -> Vec<u64> {
        engines
            .iter()
            .map(|e| e.knobs.served.load(Ordering::Relaxed))
            .collect()
    };
    if warm {
        let body = json!({"model": "m", "prompt": prompt, "max_tokens": 3}).to_string();
        let (status, _) = http(
            replicas[0].addr,
            "POST",
            "/v1/completions",
            Some(&body),
            &[],
        )
        .await;
        assert_eq!(status, 200);
        let ids = kvplane::router::tokenize::ModelTokenizer::load(&model_dir())
            .unwrap()
            .encode(prompt, true)
            .unwrap();
        for r in replicas {
            eventually("every replica indexed the prompt", SLOW, async || {
                r.state
                    .query(Some(&ids), "", "")
                    .1
                    .predicted
                    .iter()
                    .any(|p| *p > 0)
            })
            .await;
        }
    }
    let before = served();
    let tasks: Vec<_> = (0..n)
        .map(|k| stream(replicas[k % replicas.len()].addr, prompt))
        .collect();
    eventually("every request reached an engine", SLOW, async || {
        served().iter().sum::<u64>() >= before.iter().sum::<u64>() + n as u64
    })
    .await;
    let after = served();
    let answers = release_all(engines, tasks).await;
    assert!(answers.iter().all(|a| a.0 == 200), "{answers:?}");
    after.iter().zip(&before).map(|(a, b)| a - b).collect()
}

/// `cargo test --test router herd -- --ignored --nocapture`: the spread of identical
/// requests over 4 engines through 3 replicas, with and without shared reservations, and
/// through one router (the reference: one replica sees every choice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: prints the herd figures for docs/BENCHMARKS.md"]
async fn herd() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let mut engines = Vec::new();
    for i in 0..4 {
        let e = Engine::start(&format!("e{i}"), &model_dir(), BS).await;
        e.knobs.gate.store(true, Ordering::Relaxed);
        engines.push(e);
    }
    let specs: Vec<EngineSpec> = (0..4).map(|i| engines[i].spec(&format!("e{i}"))).collect();
    let unlimited = |c: &mut RouterConfig| c.engine_slots = None;
    let runs = 5;
    for (label, cluster) in [
        ("one router", None),
        ("3 replicas, shared", Some("herd")),
        ("3 replicas, not shared", None),
    ] {
        let count = if label == "one router" { 1 } else { 3 };
        let mut replicas = Vec::new();
        for _ in 0..count {
            replicas.push(replica(specs.clone(), cluster.map(|c| (&nats, c)), unlimited).await);
        }
        for (scenario, n, warm) in [
            ("cold, 3 requests", 3, false),
            ("warm, 24 requests", 24, true),
        ] {
            let mut busiest = Vec::new();
            let mut last = Vec::new();
            for run in 0..runs {
                let prompt = format!("{label} {scenario} run {run}: the quick brown fox jumps over the lazy dog again and again");
                last = spread(&engines, &replicas, &prompt, n, warm).await;
                busiest.push(*last.iter().max().unwrap());
            }
            busiest.sort_unstable();
            println!(
                "HERD | {label} | {scenario} | busiest engine median {} of {n} (runs {busiest:?}) | last run per engine {last:?}",
                busiest[runs / 2]
            );
        }
        for r in replicas {
            r.stop().await;
        }
    }
}
