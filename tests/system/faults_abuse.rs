//! Fault injection against the real binary, part two (part one, and the helpers both use, in
//! `faults.rs`), loopback only, every wait bounded:
//!
//! * the PULL socket flooded with valid batches and 10% garbage: every op applied, every bad
//!   frame counted;
//! * raw TCP peers that send nothing, half a frame or a huge frame header: no fd or task leak,
//!   no stall;
//! * 10,000 register/deregister cycles: fds and tasks back to baseline (resident memory over
//!   rounds of them is a ceiling of `scripts/soak.sh`).

use crate::faults::{
    apply, get, index_equals, init_tracing, metric, metrics_text, model, start_worker, workers,
    Kvplane, CPU,
};
use crate::support::zmtp::{zmtp_greeting, zmtp_ready};
use crate::support::*;
use bytes::Bytes;
use kvplane::protocol::*;
use kvplane::transport::{DealerClient, PushSender};
use kvplane::worker::*;
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

// ---------------------------------------------------------------------------------------------
// 4. PULL flooded with valid batches and 10% garbage.
// ---------------------------------------------------------------------------------------------

/// The `i`-th garbage frame: every kind of frame the PULL loop must count and drop.
fn garbage(i: usize, valid: &[u8]) -> Bytes {
    let bytes: Vec<u8> = match i % 8 {
        // Reserved msgpack marker.
        0 => vec![0xc1, 1, 2, 3, (i % 251) as u8],
        // A valid batch cut in half.
        1 => valid[..valid.len() / 2].to_vec(),
        // An unknown tag, in JSON.
        2 => br#"{"type":"NoSuchMsg","x":1}"#.to_vec(),
        // A string where a chunk hash belongs.
        3 => br#"{"type":"BatchedKVOperationMsg","instance_id":"w0","worker_id":0,"location":"LocalCPUBackend","operations":[{"op_type":"admit","key":"x","seq_num":0}]}"#.to_vec(),
        // Empty.
        4 => Vec::new(),
        // A request on the wrong socket (a pushed RegisterMsg is LMCache 0.3.9's registration;
        // a P2P lookup is only ever a request).
        5 => encode(&Msg::BatchedP2PLookupMsg(BatchedP2PLookupMsg {
            hashes: Vec::new(),
            instance_id: "intruder".into(),
            worker_id: 0,
        })),
        // A str32 claiming 4 GiB.
        6 => vec![0x81, 0xa4, b't', b'y', b'p', b'e', 0xdb, 0xff, 0xff, 0xff, 0xff],
        // Trailing bytes after a valid message.
        _ => [valid, &[0xc0][..]].concat(),
    };
    Bytes::from(bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_flood_with_ten_percent_garbage_applies_every_valid_op_and_counts_every_bad_frame() {
    init_tracing();
    let server = server().await;
    let addr = server.addrs.http;
    const WORKERS: usize = 5;
    const ROUNDS: usize = 400;
    const VALID_PER_MULTIPART: usize = 9;
    const OPS: i64 = 10;
    let mut ws = Vec::new();
    for i in 0..WORKERS {
        let (rep, port) = rep().await;
        let mut w = TestWorker::new(&server, &format!("w{i}"), 0);
        w.register(port, None).await;
        ws.push((w, rep));
    }
    let mut models: Vec<BTreeSet<i128>> = vec![BTreeSet::new(); WORKERS];
    let mut sent_frames = 0u64;
    let mut sent_garbage = 0u64;
    let mut valid_ops = 0u64;
    let mut push = PushSender::new(ep(server.addrs.pull));
    for round in 0..ROUNDS {
        let mut frames = Vec::new();
        let bad_at = round % (VALID_PER_MULTIPART + 1);
        for j in 0..VALID_PER_MULTIPART {
            let wi = (round + j) % WORKERS;
            let base = i64::try_from(round * 1000 + j * 100).expect("small");
            // Admit 10 keys, evict the first two admitted by this worker's previous batch.
            let (w, _) = &mut ws[wi];
            let mut ops: Vec<(bool, i64)> = (0..OPS - 2).map(|k| (true, base + k)).collect();
            let old: Vec<i128> = models[wi].iter().take(2).copied().collect();
            for k in &old {
                ops.push((false, i64::try_from(*k).expect("i64")));
                models[wi].remove(k);
            }
            for (admit, k) in &ops {
                if *admit {
                    models[wi].insert(i128::from(*k));
                }
            }
            valid_ops += ops.len() as u64;
            frames.push(Bytes::from(encode(&w.batch(CPU, &ops))));
        }
        let g = garbage(round, &frames[0]);
        frames.insert(bad_at, g);
        sent_garbage += 1;
        sent_frames += frames.len() as u64;
        within("push", push.send(frames, Duration::from_secs(5)))
            .await
            .expect("pushed");
    }
    assert_eq!(sent_garbage * 10, sent_frames, "10% garbage");

    eventually("every frame handled", SLOW, || async {
        let text = metrics_text(addr).await;
        metric(
            &text,
            "kvplane_frames_received_total",
            &[r#"socket="pull""#],
        ) as u64
            == sent_frames
            && metric(&text, "kvplane_kv_ops_applied_total", &[]) as u64 == valid_ops
    })
    .await;
    let text = metrics_text(addr).await;
    assert_eq!(
        metric(&text, "kvplane_frames_dropped_total", &[r#"socket="pull""#]) as u64,
        sent_garbage,
        "every bad frame counted once:\n{}",
        text.lines()
            .filter(|l| l.starts_with("kvplane_frames_dropped_total"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    for reason in [
        "malformed",
        "unknown_tag",
        "bad_field",
        "empty",
        "wrong_socket",
    ] {
        assert!(
            metric(
                &text,
                "kvplane_frames_dropped_total",
                &[r#"socket="pull""#, &format!(r#"reason="{reason}""#)]
            ) > 0.0,
            "reason {reason} seen"
        );
    }
    assert_eq!(
        metric(&text, "kvplane_kv_seq_discontinuities_total", &[]),
        0.0
    );
    assert_eq!(
        metric(&text, "kvplane_kv_batches_discarded_total", &[]),
        0.0
    );
    for (i, keys) in models.iter().enumerate() {
        assert!(
            index_equals(addr, &format!("w{i}"), 0, CPU, keys).await,
            "w{i}'s key set"
        );
    }
    assert_eq!(
        workers(addr).await.len(),
        WORKERS,
        "the intruder did not register"
    );
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 5. Hostile raw TCP peers.
// ---------------------------------------------------------------------------------------------

/// What each hostile peer sends before going quiet (it keeps its side open).
fn hostile_payloads(socket_type: &str) -> Vec<(&'static str, Vec<u8>)> {
    let handshake = [zmtp_greeting(), zmtp_ready(socket_type)].concat();
    // A long frame header claiming 1 TiB.
    let mut huge = handshake.clone();
    huge.push(0x02);
    huge.extend_from_slice(&(1u64 << 40).to_be_bytes());
    // A frame announcing 200 bytes, 50 of them sent.
    let mut half = handshake.clone();
    half.extend_from_slice(&[0x00, 200]);
    half.extend_from_slice(&[0xab; 50]);
    vec![
        ("nothing", Vec::new()),
        ("half a greeting", zmtp_greeting()[..10].to_vec()),
        ("half a frame", half),
        ("huge frame header", huge),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_peers_leak_nothing_and_stall_nothing() {
    let (ports, kv, addr) = Kvplane::on_free_ports().await;
    // Baseline, once the server is idle.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (fds0, tasks0) = (kv.fds(), kv.tasks().await);

    const PER_KIND: usize = 10;
    let mut peers: Vec<(&'static str, TcpStream)> = Vec::new();
    for (port, socket_type) in [
        (ports.pull, "PUSH"),
        (ports.reply, "DEALER"),
        (ports.heartbeat, "DEALER"),
    ] {
        for (kind, bytes) in hostile_payloads(socket_type) {
            for _ in 0..PER_KIND {
                let mut s = within("raw connect", TcpStream::connect(("127.0.0.1", port)))
                    .await
                    .expect("connect");
                let _ = within("raw write", s.write_all(&bytes)).await;
                peers.push((kind, s));
            }
        }
    }
    let opened = peers.len();

    // No stall: a real worker registers, pushes and looks up while they hang around — before
    // the handshake timeout (10 s) hangs up on the silent ones, which are still connected.
    let keys = MemoryKeys::new();
    let w = start_worker(worker_config(ports.pull, ports.reply, "inst-ok", 0), &keys).await;
    for k in 1..=20 {
        apply(&w, &keys, true, k);
    }
    eventually("the good worker's ops applied", STEP, || {
        let m = model(&keys);
        async move { index_equals(addr, "inst-ok", 0, CPU, &m).await }
    })
    .await;
    assert_eq!(get(addr, "/healthz").await.0, 200);
    assert!(
        silent_still_connected(&peers),
        "served only once the handshake timeout had hung up on the silent peers"
    );

    // Huge frame headers are hung up on at once: by the frame check, while the silent peers
    // still wait for their handshake timeout.
    let mut hung_up = 0;
    for (kind, s) in peers.iter_mut().filter(|(k, _)| *k == "huge frame header") {
        within(&format!("{kind}: hung up on"), closed(s)).await;
        hung_up += 1;
    }
    assert_eq!(hung_up, 3 * PER_KIND);
    assert!(
        silent_still_connected(&peers),
        "huge frame headers were hung up on only with the handshake timeout"
    );
    // Silent and half-greeting peers are hung up on by the handshake timeout (10 s).
    for (kind, s) in peers
        .iter_mut()
        .filter(|(k, _)| *k == "nothing" || *k == "half a greeting")
    {
        let what = format!("{kind}: closed by the handshake timeout");
        tokio::time::timeout(SLOW, closed(s))
            .await
            .unwrap_or_else(|_| panic!("not within {SLOW:?}: {what}"));
    }
    // Peers stuck halfway through a frame hold their connection until they leave.
    let peak_fds = kv.fds();
    drop(peers);
    within("good worker shutdown", w.shutdown())
        .await
        .expect("shutdown");
    let last = std::cell::Cell::new((0, 0.0));
    eventually(
        "fds and tasks back to baseline",
        Duration::from_secs(20),
        || {
            let (kv, last) = (&kv, &last);
            async move {
                last.set((kv.fds(), kv.tasks().await));
                let (fds, tasks) = last.get();
                fds <= fds0 && tasks <= tasks0
            }
        },
    )
    .await;
    let (fds, tasks) = last.get();
    eprintln!(
        "hostile peers: {opened} opened; fds {fds0} → peak {peak_fds} → {fds}; tasks {tasks0} → {tasks}"
    );
    kv.kill9().await;
}

/// Reads `s` until the peer closes it (or the connection fails).
async fn closed(s: &mut TcpStream) {
    let mut sink = [0u8; 256];
    while let Ok(n) = s.read(&mut sink).await {
        if n == 0 {
            return;
        }
    }
}

/// Whether every peer that sent nothing is still connected: the server has not hung up.
fn silent_still_connected(peers: &[(&str, TcpStream)]) -> bool {
    peers
        .iter()
        .filter(|(kind, _)| *kind == "nothing")
        .all(|(_, s)| still_connected(s))
}

// ---------------------------------------------------------------------------------------------
// 6. 10,000 register/deregister cycles.
// ---------------------------------------------------------------------------------------------

/// Runs `cycles` register → admit 10 → deregister cycles over `lanes` concurrent connections.
async fn churn(ports: ServePorts, lanes: usize, cycles: usize, tag: &str) {
    let mut tasks = Vec::new();
    for lane in 0..lanes {
        let tag = tag.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut dealer =
                DealerClient::new(format!("127.0.0.1:{}", ports.reply), Duration::from_secs(5));
            let mut push = PushSender::new(format!("127.0.0.1:{}", ports.pull));
            for i in (lane..cycles).step_by(lanes) {
                let instance = format!("{tag}-{i}");
                let reg = register_msg(&instance, 0, 1, None);
                let reply = within("register", dealer.request(Bytes::from(encode(&reg))))
                    .await
                    .expect("answered");
                assert!(
                    matches!(decode(&reply), Ok(Msg::RegisterRetMsg(_))),
                    "{:?}",
                    decode(&reply)
                );
                let base = i64::try_from(i * 10).expect("small");
                let batch = Msg::BatchedKVOperationMsg(BatchedKVOperationMsg {
                    instance_id: instance.clone(),
                    worker_id: 0,
                    location: CPU.into(),
                    operations: (0..10)
                        .map(|k| KVOpEvent {
                            op_type: OpType::Admit,
                            key: ChunkHash::from_i64(base + k),
                            seq_num: k,
                        })
                        .collect(),
                });
                let dereg = Msg::DeRegisterMsg(DeRegisterMsg {
                    instance_id: instance,
                    worker_id: 0,
                    ip: "127.0.0.1".into(),
                    port: 1,
                });
                let frames = vec![Bytes::from(encode(&batch)), Bytes::from(encode(&dereg))];
                within("push", push.send(frames, Duration::from_secs(5)))
                    .await
                    .expect("pushed");
            }
        }));
    }
    for t in tasks {
        within("churn lane", t).await.expect("lane finished");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_register_deregister_cycles_return_to_baseline() {
    let (ports, kv, addr) = Kvplane::on_free_ports().await;
    let idle = move || async move {
        let (_, s) = get(addr, "/controller/key-stats").await;
        s["total_worker_count"] == 0 && s["total_key_count"] == 0
    };
    // Warm-up: the first connections and tasks of each kind exist before the baseline.
    churn(ports, 8, 1_000, "warm").await;
    eventually("warm-up drained", SLOW, idle).await;
    let (fds0, tasks0) = (kv.fds(), kv.tasks().await);

    churn(ports, 8, 10_000, "cycle").await;
    eventually("cycles drained", SLOW, idle).await;
    let text = metrics_text(addr).await;
    assert_eq!(
        metric(
            &text,
            "kvplane_workers_removed_total",
            &[r#"reason="deregistered""#]
        ),
        11_000.0
    );
    assert_eq!(
        metric(&text, "kvplane_kv_ops_applied_total", &[r#"op="admit""#]),
        110_000.0,
        "every admit applied"
    );
    // Every connection and task given back. Polled: the server closes the churned
    // connections (and our own /metrics connection) asynchronously. Resident memory over
    // rounds of such cycles is a soak measure (scripts/soak.sh, docs/RELIABILITY.md): it moves
    // with the allocator and the machine.
    let (fds, tasks) = eventually("fds and tasks back to baseline", SLOW, async || {
        let (fds, tasks) = (kv.fds(), kv.tasks().await);
        if fds <= fds0 && tasks <= tasks0 {
            Ok((fds, tasks))
        } else {
            Err(format!("fds {fds0} → {fds}, tasks {tasks0} → {tasks}"))
        }
    })
    .await;
    eprintln!("10,000 cycles: fds {fds0} → {fds}, tasks {tasks0} → {tasks}");
    kv.kill9().await;
}
