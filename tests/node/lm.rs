//! `kvplane node` over real TCP on 127.0.0.1: round trips, eviction at the watermarks, L2
//! spill and promotion, restart recovery with torn files planted, concurrent clients, and
//! every bad-input case (each answered, counted, and harmless to other clients). The round
//! trip, concurrency, bad-input and cap tests run under both connection models.

use crate::support::eventually;
use crate::support::node::*;
use kvplane::node::config::{ConnectionModel, EvictionPolicy, PrefetchPolicy, StorePolicy};
use kvplane::node::model::codec::{LmCommand, ObjectMeta, CODE_SUCCESS, REQUEST_HEADER_LEN};
use std::time::Duration;

#[tokio::test]
async fn put_get_exist_list_health_round_trip_identical_bytes() {
    put_get_exist_list_health_round_trip_identical_bytes_with(ConnectionModel::Tasks).await;
}

#[tokio::test]
async fn put_get_exist_list_health_round_trip_identical_bytes_on_threads() {
    put_get_exist_list_health_round_trip_identical_bytes_with(ConnectionModel::Threads).await;
}

async fn put_get_exist_list_health_round_trip_identical_bytes_with(model: ConnectionModel) {
    let node = node_with(|c| c.connection_model = model).await;
    let mut c = Client::connect(&node).await;
    assert_eq!(
        c.health().await,
        kvplane::node::model::codec::LmReply::success()
    );
    assert!(c.get("absent").await.is_none());
    assert!(!c.exists("absent").await);

    let small = body(1, 1);
    let big = body(2, 3 << 20);
    let key = "mymodel@1@0@00000000deadbeef@bfloat16";
    // PUTs get no reply: the next request's reply is the first thing to read.
    c.put(key, &big).await;
    c.put("k@small", &small).await;
    c.put("k@empty", &[]).await;
    let (reply, got) = c.get(key).await.expect("hit");
    assert_eq!(
        (reply.code, reply.length, reply.meta),
        (CODE_SUCCESS, big.len(), META)
    );
    assert!(got == big, "identical bytes");
    assert_eq!(c.get("k@small").await.expect("hit").1, small);
    assert_eq!(c.get("k@empty").await.expect("hit").1, Vec::<u8>::new());
    assert!(c.exists(key).await);
    assert_eq!(c.list().await, ["k@empty", "k@small", key]);

    // A second PUT replaces; another connection sees it.
    c.put("k@small", b"replaced").await;
    assert!(c.exists("k@small").await);
    let mut other = Client::connect(&node).await;
    assert_eq!(other.get("k@small").await.expect("hit").1, b"replaced");

    let text = scrape(&node).await;
    assert_eq!(requests(&text, "put", "ok"), 4.0);
    assert_eq!(requests(&text, "get", "hit"), 4.0);
    assert_eq!(requests(&text, "get", "miss"), 1.0);
    assert_eq!(
        sample(&text, r#"kvplane_node_tier_objects{tier="l1"}"#),
        3.0
    );
    assert_eq!(
        sample(&text, r#"kvplane_node_tier_bytes{tier="l1"}"#),
        (big.len() + 8) as f64
    );
    assert!(text.contains("kvplane_node_request_seconds_bucket"));
    node.stop().await;
}

#[tokio::test]
async fn l1_evicts_lru_at_the_trigger_watermark_by_the_ratio() {
    let node = node_with(|c| {
        c.l1 = EvictionPolicy {
            budget: 1000,
            trigger_watermark: 0.8,
            eviction_ratio: 0.5,
            lru: true,
        };
    })
    .await;
    let mut c = Client::connect(&node).await;
    for i in 0..8 {
        c.put(&format!("k{i}"), &body(i, 100)).await;
    }
    // 800 bytes: at, not above, the watermark: nothing evicted. Touch k0 so it is recent.
    assert!(c.get("k0").await.is_some());
    assert_eq!(node.usage().l1_objects, 8);
    // 900 > 800: one cycle frees ceil(0.5 × 900) = 450 bytes → 5 objects, LRU first (k1..k5).
    c.put("k8", &body(8, 100)).await;
    assert!(c.exists("k8").await);
    let mut held = Vec::new();
    for i in 0..9 {
        if c.exists(&format!("k{i}")).await {
            held.push(i);
        }
    }
    assert_eq!(held, [0, 6, 7, 8]);
    let text = scrape(&node).await;
    assert_eq!(
        sample(&text, r#"kvplane_node_evictions_total{tier="l1"}"#),
        5.0
    );
    assert_eq!(
        sample(&text, r#"kvplane_node_evicted_bytes_total{tier="l1"}"#),
        500.0
    );
    // Larger than the whole budget: refused and counted, not stored.
    c.put("huge", &body(9, 1001)).await;
    assert!(!c.exists("huge").await);
    let text = scrape(&node).await;
    assert_eq!(
        sample(&text, r#"kvplane_node_stores_refused_total{tier="l1"}"#),
        1.0
    );
    node.stop().await;
}

async fn spill_and_get(prefetch: PrefetchPolicy) -> (bool, f64) {
    let dir = tempdir("spill");
    let node = node_with(|c| {
        c.l1.budget = 1000;
        c.l2 = Some(l2(&dir, 1 << 20, prefetch, StorePolicy::Default));
    })
    .await;
    let mut c = Client::connect(&node).await;
    for i in 0..20 {
        c.put(&format!("k{i}"), &body(i, 100)).await;
    }
    assert!(c.exists("k19").await);
    node.flush().await;
    assert!(!node.in_l1("k0"), "k0 left L1");
    assert_eq!(node.usage().l2_objects, 20, "every object written through");
    let (reply, got) = c.get("k0").await.expect("served from L2");
    assert_eq!((got, reply.meta), (body(0, 100), META));
    assert!(c.exists("k0").await);
    let promoted = node.in_l1("k0");
    let text = scrape(&node).await;
    let promotions = sample(&text, "kvplane_node_l2_promotions_total");
    assert_eq!(
        sample(&text, r#"kvplane_node_l2_reads_total{outcome="ok"}"#),
        1.0
    );
    node.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    (promoted, promotions)
}

#[tokio::test]
async fn l2_spill_then_get_follows_the_prefetch_policy() {
    assert_eq!(spill_and_get(PrefetchPolicy::Default).await, (false, 0.0));
    assert_eq!(spill_and_get(PrefetchPolicy::Retain).await, (true, 1.0));
}

#[tokio::test]
async fn skip_l1_keeps_objects_only_on_l2_and_l2_evicts_at_its_watermark() {
    let dir = tempdir("skip");
    let node = node_with(|c| {
        // Each file is 100 bytes of body + header (56) + key (2) = 158 bytes; 10 fit in 1580.
        c.l2 = Some(l2(&dir, 1580, PrefetchPolicy::Default, StorePolicy::SkipL1));
    })
    .await;
    let mut c = Client::connect(&node).await;
    for i in 0..8 {
        c.put(&format!("k{i}"), &body(i, 100)).await;
    }
    assert!(c.exists("k7").await);
    node.flush().await;
    let u = node.usage();
    assert_eq!(
        (u.l1_objects, u.l2_objects),
        (0, 8),
        "skip_l1 drops L1 copies once on disk"
    );
    assert_eq!(c.get("k3").await.expect("from L2").1, body(3, 100));
    // 9 files = 1422 > 0.8 × 1580 = 1264: one cycle frees ceil(0.2 × 1422) = 285 bytes →
    // the 2 least recently used files (k0, k1; k3 was just read).
    c.put("k8", &body(8, 100)).await;
    assert!(c.exists("k8").await);
    node.flush().await;
    let mut held = Vec::new();
    for i in 0..9 {
        if c.exists(&format!("k{i}")).await {
            held.push(i);
        }
    }
    assert_eq!(held, [2, 3, 4, 5, 6, 7, 8]);
    let text = scrape(&node).await;
    assert_eq!(
        sample(&text, r#"kvplane_node_evictions_total{tier="l2"}"#),
        2.0
    );
    node.stop().await;
    let files = std::fs::read_dir(dir.join("objects"))
        .expect("objects")
        .count();
    assert_eq!(files, 7, "evicted files are deleted");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn restart_serves_complete_objects_and_discards_torn_ones() {
    let dir = tempdir("restart");
    let config = |c: &mut kvplane::node::NodeConfig| {
        c.l2 = Some(plain_l2(&dir, 1 << 20));
    };
    let node = node_with(config).await;
    let mut c = Client::connect(&node).await;
    for i in 0..10 {
        c.put(&format!("k{i}"), &body(i, 1000 + i as usize)).await;
    }
    assert!(c.exists("k9").await);
    drop(c);
    node.stop().await;

    // Plant what a crash can leave: a temp file of a write in progress, a truncated object
    // file, one with a flipped body byte, and junk under an object name.
    let objects = dir.join("objects");
    std::fs::write(dir.join("tmp").join("999-1.tmp"), b"KVPLOBJ1 partial").expect("tmp");
    let mut files: Vec<_> = std::fs::read_dir(&objects)
        .expect("objects")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    let truncated = &files[0];
    let len = std::fs::metadata(truncated).expect("md").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(truncated)
        .and_then(|f| f.set_len(len - 10))
        .expect("truncate");
    let flipped = &files[1];
    let mut raw = std::fs::read(flipped).expect("read");
    let last = raw.len() - 1;
    raw[last] ^= 0x5a;
    std::fs::write(flipped, raw).expect("write");
    std::fs::write(objects.join("6a756e6b.kvo"), b"junk").expect("junk");

    let node = node_with(config).await;
    assert_eq!(node.recovery.recovered, 9, "all but the truncated file");
    assert_eq!(node.recovery.discarded, 3, "temp, truncated, junk");
    let mut c = Client::connect(&node).await;
    let mut served = 0;
    for i in 0..10 {
        if let Some((r, got)) = c.get(&format!("k{i}")).await {
            assert_eq!(
                (r.meta, got),
                (META, body(i, 1000 + i as usize)),
                "k{i} intact"
            );
            served += 1;
        }
    }
    assert_eq!(
        served, 8,
        "the truncated and the corrupt object are never served"
    );
    let text = scrape(&node).await;
    assert_eq!(
        sample(
            &text,
            r#"kvplane_node_l2_discarded_total{reason="truncated"}"#
        ),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            r#"kvplane_node_l2_discarded_total{reason="torn_temp"}"#
        ),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            r#"kvplane_node_l2_discarded_total{reason="bad_checksum"}"#
        ),
        1.0
    );
    assert_eq!(node.usage().l2_objects, 8, "the corrupt one left the index");
    node.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_clients_get_their_own_bytes() {
    many_concurrent_clients_get_their_own_bytes_with(ConnectionModel::Tasks).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_clients_get_their_own_bytes_on_threads() {
    many_concurrent_clients_get_their_own_bytes_with(ConnectionModel::Threads).await;
}

async fn many_concurrent_clients_get_their_own_bytes_with(model: ConnectionModel) {
    let dir = tempdir("conc");
    let node = node_with(|c| {
        c.connection_model = model;
        c.l1.budget = 4 << 20;
        c.l2 = Some(l2(
            &dir,
            64 << 20,
            PrefetchPolicy::Retain,
            StorePolicy::Default,
        ));
    })
    .await;
    let clients = 16u64;
    let per = 12u64;
    let mut tasks = Vec::new();
    for id in 0..clients {
        let addr = node.addrs.lm;
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let mut c = Client { stream };
            for j in 0..per {
                let seed = id * 1000 + j;
                c.put(
                    &format!("c{id}@{j}"),
                    &body(seed, 1000 + (seed as usize % 7) * 9000),
                )
                .await;
            }
            for j in 0..per {
                let seed = id * 1000 + j;
                let (_, got) = c.get(&format!("c{id}@{j}")).await.expect("hit");
                assert!(
                    got == body(seed, 1000 + (seed as usize % 7) * 9000),
                    "c{id}@{j}"
                );
            }
        }));
    }
    for t in tasks {
        within("client", t).await.expect("client passes");
    }
    let text = scrape(&node).await;
    assert_eq!(requests(&text, "get", "hit"), (clients * per) as f64);
    assert_eq!(
        sample(&text, "kvplane_node_connections_total"),
        clients as f64
    );
    node.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn bad_input_is_answered_counted_and_harms_no_one_else() {
    bad_input_is_answered_counted_and_harms_no_one_else_with(ConnectionModel::Tasks).await;
}

#[tokio::test]
async fn bad_input_is_answered_counted_and_harms_no_one_else_on_threads() {
    bad_input_is_answered_counted_and_harms_no_one_else_with(ConnectionModel::Threads).await;
}

async fn bad_input_is_answered_counted_and_harms_no_one_else_with(model: ConnectionModel) {
    let node = node_with(|c| {
        c.connection_model = model;
        c.max_object_bytes = 1 << 20;
        c.read_timeout = Duration::from_millis(200);
    })
    .await;
    let mut bystander = Client::connect(&node).await;
    bystander.put("keep", b"safe").await;

    // (header, FAIL reply expected, connection stays usable)
    let cases: Vec<([u8; REQUEST_HEADER_LEN], bool, bool)> = vec![
        (raw_header([9, 0, 0, 0, 0, 0, 0, 0, 0], b"k"), true, false),
        (raw_header([1, -1, 0, 0, 0, 0, 0, 0, 0], b"k"), false, false),
        (
            raw_header([1, i32::MAX, 0, 0, 0, 0, 0, 0, 0], b"k"),
            false,
            false,
        ),
        (raw_header([2, 64, 0, 0, 0, 0, 0, 0, 0], b"k"), true, false),
        (
            raw_header([2, 0, 0, 0, 0, 0, 0, 0, 0], b"\xc3\x28bad"),
            true,
            true,
        ),
        (raw_header([3, 0, 0, 0, 0, 0, 0, 0, 0], b""), true, true),
        (
            raw_header([1, 4, 0, 0, 0, 0, 0, 0, 0], b"\xff"),
            false,
            false,
        ),
    ];
    for (i, (raw, fail_reply, usable)) in cases.into_iter().enumerate() {
        let mut c = Client::connect(&node).await;
        c.send_raw(&raw).await;
        if fail_reply {
            let r = c.reply().await;
            assert_eq!(r, kvplane::node::model::codec::LmReply::fail(), "case {i}");
        }
        if usable {
            assert_eq!(c.health().await.code, CODE_SUCCESS, "case {i} still usable");
        } else {
            assert!(
                c.until_closed().await.is_empty(),
                "case {i}: closed, nothing more"
            );
        }
        assert_eq!(bystander.get("keep").await.expect("unaffected").1, b"safe");
    }
    // A short read: half a header, then the client goes away.
    let mut c = Client::connect(&node).await;
    c.send_raw(&raw_header([5, 0, 0, 0, 0, 0, 0, 0, 0], b"h")[..100])
        .await;
    drop(c);
    // A stalled request: half a header, then nothing; the read timeout closes it.
    let mut c = Client::connect(&node).await;
    c.send_raw(&raw_header([5, 0, 0, 0, 0, 0, 0, 0, 0], b"h")[..100])
        .await;
    assert!(c.until_closed().await.is_empty());
    // A PUT body cut short.
    let mut c = Client::connect(&node).await;
    c.send_header(LmCommand::Put, "cut", 1000, ObjectMeta::default())
        .await;
    c.send_raw(&[0u8; 10]).await;
    drop(c);
    assert_eq!(bystander.get("keep").await.expect("unaffected").1, b"safe");
    assert!(!bystander.exists("cut").await, "a cut PUT stores nothing");

    let text = scrape(&node).await;
    for (reason, n) in [
        ("unknown_command", 1.0),
        ("negative_length", 1.0),
        ("too_large", 1.0),
        ("unexpected_body", 1.0),
        ("bad_utf8", 2.0),
        ("empty_key", 1.0),
    ] {
        let series = format!(r#"kvplane_node_bad_requests_total{{reason="{reason}"}}"#);
        assert_eq!(sample(&text, &series), n, "{reason}");
    }
    // The two dropped clients' connections end on their own schedule (a thread each under
    // `Threads`): wait for both to be counted.
    let aborted =
        |why: &str| format!(r#"kvplane_node_connections_aborted_total{{reason="{why}"}}"#);
    eventually("both dropped clients counted as eof", STEP, async || {
        sample(&scrape(&node).await, &aborted("eof")) == 2.0
    })
    .await;
    let text = scrape(&node).await;
    assert_eq!(sample(&text, &aborted("timeout")), 1.0);
    assert_eq!(sample(&text, &aborted("io")), 0.0);
    node.stop().await;
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_and_counted() {
    connections_beyond_the_cap_are_closed_and_counted_with(ConnectionModel::Tasks).await;
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_and_counted_on_threads() {
    connections_beyond_the_cap_are_closed_and_counted_with(ConnectionModel::Threads).await;
}

async fn connections_beyond_the_cap_are_closed_and_counted_with(model: ConnectionModel) {
    let node = node_with(|c| {
        c.max_connections = 2;
        c.connection_model = model;
    })
    .await;
    let mut a = Client::connect(&node).await;
    let mut b = Client::connect(&node).await;
    assert_eq!(a.health().await.code, CODE_SUCCESS);
    assert_eq!(b.health().await.code, CODE_SUCCESS);
    let mut third = Client::connect(&node).await;
    third
        .send_raw(&raw_header([5, 0, 0, 0, 0, 0, 0, 0, 0], b"h"))
        .await;
    assert!(third.until_closed().await.is_empty(), "refused");
    let text = scrape(&node).await;
    assert_eq!(sample(&text, "kvplane_node_connections_refused_total"), 1.0);
    drop(a);
    // A slot frees up once a connection closes.
    let mut ok = false;
    for _ in 0..200 {
        let mut d = Client::connect(&node).await;
        d.send_raw(&raw_header([5, 0, 0, 0, 0, 0, 0, 0, 0], b"h"))
            .await;
        let mut raw = [0u8; 36];
        if tokio::io::AsyncReadExt::read_exact(&mut d.stream, &mut raw)
            .await
            .is_ok()
        {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(ok, "a new connection is served after one closed");
    assert_eq!(b.health().await.code, CODE_SUCCESS);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_being_sent_is_pinned_and_never_evicted_mid_read() {
    const MIB: usize = 1 << 20;
    let node = node_with(|c| {
        c.l1 = EvictionPolicy {
            budget: 40 << 20,
            trigger_watermark: 0.8,
            eviction_ratio: 0.2,
            lru: true,
        };
    })
    .await;
    let big = body(1, 30 * MIB);
    let mut reader = Client::connect(&node).await;
    reader.put("big", &big).await;
    // Ask for it but do not read: 30 MiB cannot fit in the socket buffers, so the node is
    // stuck mid-reply holding the pin.
    reader
        .send_header(LmCommand::Get, "big", 0, ObjectMeta::default())
        .await;
    eventually("the GET reached the node", STEP, async || {
        requests(&scrape(&node).await, "get", "hit") == 1.0
    })
    .await;
    // 38 MiB > 0.8 × 40 MiB: a cycle must free 7.6 MiB, and only the new object is evictable.
    let mut writer = Client::connect(&node).await;
    writer.put("small", &body(2, 8 * MIB)).await;
    assert!(
        !writer.exists("small").await,
        "the unpinned object was evicted"
    );
    assert!(
        node.in_l1("big"),
        "the pinned object stays while it is being sent"
    );
    let reply = reader.reply().await;
    assert_eq!(reply.length, big.len());
    assert!(reader.body(big.len()).await == big, "identical bytes");
    // Pin released: the next cycle may take it (least recently used).
    assert!(reader.exists("big").await);
    writer.put("small2", &body(3, 8 * MIB)).await;
    assert!(writer.exists("small2").await);
    assert!(!node.in_l1("big"), "unpinned, it is evictable again");
    node.stop().await;
}

#[tokio::test]
async fn a_full_l2_with_nothing_evictable_refuses_and_counts() {
    let dir = tempdir("full");
    let node = node_with(|c| {
        let mut cfg = l2(&dir, 1000, PrefetchPolicy::Default, StorePolicy::Default);
        cfg.eviction.lru = false;
        c.l2 = Some(cfg);
    })
    .await;
    let mut c = Client::connect(&node).await;
    for i in 0..8 {
        c.put(&format!("k{i}"), &body(i, 200)).await;
    }
    assert!(c.exists("k7").await, "still in L1");
    node.flush().await;
    // 258 bytes per file: 3 fit in 1000, the other 5 are refused; the client never waits.
    assert_eq!(node.usage().l2_objects, 3);
    let text = scrape(&node).await;
    assert_eq!(
        sample(&text, r#"kvplane_node_stores_refused_total{tier="l2"}"#),
        5.0
    );
    node.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn list_is_bounded_to_whole_keys_and_healthz_answers() {
    let node = node_with(|c| c.max_list_bytes = 10).await;
    let mut c = Client::connect(&node).await;
    for k in ["aaaa", "bbbb", "cccc"] {
        c.put(k, b"x").await;
    }
    // "aaaa\nbbbb" is 9 bytes; adding "\ncccc" would exceed 10.
    assert_eq!(c.list().await, ["aaaa", "bbbb"]);
    let addr = node.addrs.http.expect("http");
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tokio::io::AsyncWriteExt::write_all(&mut s, b"GET /healthz HTTP/1.0\r\n\r\n")
        .await
        .expect("send");
    let mut out = String::new();
    within(
        "healthz",
        tokio::io::AsyncReadExt::read_to_string(&mut s, &mut out),
    )
    .await
    .expect("read");
    assert!(
        out.starts_with("HTTP/1.0 200") && out.ends_with("ok\n"),
        "{out}"
    );
    node.stop().await;
}

#[tokio::test]
async fn coordinator_routes_page_and_delete_objects() {
    use crate::support::http::http;
    let node = node_with(|_| {}).await;
    let addr = node.addrs.http.expect("http");
    let mut c = Client::connect(&node).await;
    let keys: Vec<String> = (0..5)
        .map(|i| format!("m@1@0@{:016x}@bfloat16", 0xa0 + i))
        .collect();
    for k in &keys {
        c.put(k, &body(3, 100)).await;
    }
    c.put("not-an-lmcache-key", &body(4, 10)).await;
    assert!(c.exists("not-an-lmcache-key").await, "PUTs applied");

    // Page through L1 two at a time: every parseable key once, in order.
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..10 {
        let path = match &token {
            Some(t) => format!("/cache/objects?tier=l1&page_size=2&page_token={t}"),
            None => "/cache/objects?tier=l1&page_size=2".to_owned(),
        };
        let (status, page) = http(addr, "GET", &path, None, &[]).await;
        assert_eq!(status, 200, "{page}");
        for e in page["entries"].as_array().expect("entries") {
            assert_eq!(e["size_bytes"], 100);
            assert_eq!(e["key"]["model_name"], "m");
            assert_eq!(e["key"]["kv_rank"], (1 << 24) | (1 << 8));
            seen.push(e["raw_key"].as_str().expect("raw").to_owned());
        }
        match page["next_page_token"].as_str() {
            Some(t) => token = Some(t.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, keys);
    let (status, _) = http(addr, "GET", "/cache/objects?tier=l9", None, &[]).await;
    assert_eq!(status, 422);

    // Delete two by encoded key and one by raw key. 0.5.6's default tier is l2, which this
    // node does not have (503); a tier it does not know is 422.
    let delete_body = |tier: Option<&str>| {
        let mut b = serde_json::json!({"keys": [
            {"chunk_hash_hex": format!("{:016x}", 0xa0), "model_name": "m", "kv_rank": (1 << 24) | (1 << 8)},
            {"chunk_hash_hex": format!("{:016X}", 0xa1), "model_name": "m", "kv_rank": (1 << 24) | (1 << 8)},
            "not-an-lmcache-key",
            {"chunk_hash_hex": "ff", "model_name": "other", "kv_rank": 0},
        ]});
        if let Some(t) = tier {
            b["tier"] = t.into();
        }
        b.to_string()
    };
    for (tier, want) in [(None, 503), (Some("l9"), 422)] {
        let body = delete_body(tier);
        let (status, reply) = http(addr, "DELETE", "/cache/objects", Some(&body), &[]).await;
        assert_eq!(status, want, "{tier:?}: {reply}");
    }
    // `exists`, not a GET: the node's connection drops a GET's hold on the object only after
    // its last byte is written, so a delete right after a GET may find the object still being
    // read and (not forced) skip it.
    assert!(c.exists(&keys[0]).await, "refused deletes removed nothing");
    let body = delete_body(Some("l1"));
    let (status, reply) = http(addr, "DELETE", "/cache/objects", Some(&body), &[]).await;
    assert_eq!(
        (status, reply["deleted"].as_u64(), reply["skipped"].as_u64()),
        (200, Some(3), Some(1)),
        "{reply}"
    );
    assert!(c.get(&keys[0]).await.is_none());
    assert!(c.get(&keys[1]).await.is_none());
    assert!(!c.exists("not-an-lmcache-key").await);
    assert!(c.get(&keys[2]).await.is_some());
    let (status, _) = http(addr, "DELETE", "/cache/objects", Some("{\"keys\": 3}"), &[]).await;
    assert_eq!(status, 422);
    let metrics = scrape(&node).await;
    assert!(
        metrics.contains("kvplane_node_coordinator_deleted_total 3"),
        "{metrics}"
    );
}

/// `force` on the coordinator's delete removes an L1 object a client is still reading (the
/// reply in flight finishes, byte for byte, from its own reference); without it the object
/// is skipped.
#[tokio::test]
async fn force_deletes_an_object_mid_read_and_the_read_completes() {
    use crate::support::http::http;
    let node = node_with(|_| {}).await;
    let addr = node.addrs.http.expect("http");
    let key = "m@1@0@00e0@bfloat16";
    // 32 MiB: far more than the socket buffers hold, so the reply stays in flight.
    let data = body(7, 32 << 20);
    let mut writer = Client::connect(&node).await;
    writer.put(key, &data).await;
    writer.health().await;
    let mut reader = Client::connect(&node).await;
    reader.send_header(LmCommand::Get, key, 0, META).await;
    eventually("the GET is being answered", STEP, async || {
        requests(&scrape(&node).await, "get", "hit") == 1.0
    })
    .await;
    let delete =
        |force: bool| serde_json::json!({"keys": [key], "tier": "l1", "force": force}).to_string();
    let (status, reply) = http(addr, "DELETE", "/cache/objects", Some(&delete(false)), &[]).await;
    assert_eq!(
        (status, reply["skipped"].as_u64()),
        (200, Some(1)),
        "{reply}"
    );
    let (status, reply) = http(addr, "DELETE", "/cache/objects", Some(&delete(true)), &[]).await;
    assert_eq!(
        (status, reply["deleted"].as_u64()),
        (200, Some(1)),
        "{reply}"
    );
    let head = reader.reply().await;
    assert_eq!((head.code, head.length), (CODE_SUCCESS, data.len()));
    assert!(
        reader.body(data.len()).await == data,
        "the read finished intact"
    );
    assert!(!writer.exists(key).await, "deleted");
    node.stop().await;
}
