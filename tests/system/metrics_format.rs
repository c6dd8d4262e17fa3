//! Every service's `GET /metrics` read by a real exposition-format parser: the controller, the
//! indexer (alone and with `--cluster`, for the replication core's series), the coordinator,
//! the node and the router, each started in this process and given
//! a little traffic, their documents parsed by `prometheus_client.parser` (the Python client
//! in the project's venv, `$KVPLANE_PYTHON`), so a malformed line, a family declared twice or a
//! label value that breaks its line fails here. The coordinator echoes a client's cache salt
//! into a label: one with a double quote and a newline must come back intact (it refuses a
//! backslash in a salt; `web::exposition`'s own tests cover that escape).

use crate::support;
use crate::support::lmcache::python;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;
use support::http::http;
use support::node::node_with;

/// A cache salt with the characters the text format escapes in a label value that a salt may
/// hold (a backslash is refused in a salt).
const HOSTILE_SALT: &str = "a\"quote\nnew \"line\"";

/// Parses a document; returns `[family, type, sample, labels, value]` rows. Panics with the
/// parser's error and the document when it is not valid text format.
const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
text = sys.stdin.read()
rows = []
for f in text_string_to_metric_families(text):
    for s in f.samples:
        rows.append([f.name, f.type, s.name, s.labels, repr(float(s.value))])
print(json.dumps(rows))
"#;

async fn parse(service: &str, text: &str) -> Vec<Value> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(python())
        .args(["-c", PARSE])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the Python parser");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(text.as_bytes()).await.expect("write");
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the parser finishes")
        .expect("the parser runs");
    assert!(
        out.status.success(),
        "{service}: /metrics is not valid text format: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Vec<Value>>(&out.stdout).expect("parser output")
}

/// `GET /metrics` as text.
async fn scrape(service: &str, addr: SocketAddr) -> String {
    let (status, text) = http(addr, "GET", "/metrics", None, &[]).await;
    assert_eq!(status, 200, "{service}: {text}");
    text.as_str()
        .unwrap_or_else(|| panic!("{service}: /metrics is not text: {text}"))
        .to_owned()
}

/// Checks one document: it parses, every family is declared once, it holds `at_least` samples.
async fn check(service: &str, text: &str, at_least: usize) -> Vec<Value> {
    let rows = parse(service, text).await;
    assert!(
        rows.len() >= at_least,
        "{service}: {} samples\n{text}",
        rows.len()
    );
    let mut seen = BTreeSet::new();
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let name = line.split(' ').nth(2).expect("a family name");
        assert!(
            seen.insert(name),
            "{service}: {name} declared twice\n{text}"
        );
    }
    rows
}

#[tokio::test]
async fn every_services_metrics_parse_as_the_text_format() {
    let controller = support::server_with(|_| {}).await;
    let text = scrape("controller", controller.addrs.http).await;
    check("controller", &text, 10).await;

    let indexer = kvplane::indexer::start(kvplane::indexer::IndexerConfig::default())
        .await
        .expect("indexer");
    let (status, _) = http(indexer.addr, "GET", "/no/such/route", None, &[]).await;
    assert_eq!(status, 404);
    let text = scrape("indexer", indexer.addr).await;
    check("indexer", &text, 10).await;

    // The replication core's series (`kvplane_cluster_*`), on an indexer with `--cluster`.
    if let Some(nats) = support::nats::Nats::start().await {
        let clustered = kvplane::indexer::start(nats.indexer("metrics", false))
            .await
            .expect("indexer --cluster");
        let text = scrape("indexer --cluster", clustered.addr).await;
        let rows = check("indexer --cluster", &text, 30).await;
        assert!(
            rows.iter()
                .any(|r| r[2] == "kvplane_cluster_connected" && r[3]["service"] == "indexer"),
            "no cluster series: {text}"
        );
    }

    let mut c = kvplane::coordinator::CoordinatorConfig::with_defaults("127.0.0.1", 0);
    c.resync = None;
    let coordinator = kvplane::coordinator::start(c).await.expect("coordinator");
    let key = json!({"chunk_hash_hex": "aa", "model_name": "m", "kv_rank": 16777472,
                     "object_group_id": 0, "cache_salt": HOSTILE_SALT});
    let events = json!({"batches": [
        {"instance_id": "mp-a", "incarnation": 1, "seq": 1, "event_type": "store", "tier": "l2",
         "backend": "fs", "entries": [{"key": key, "size_bytes": 2048}]}]});
    let body = events.to_string();
    let (status, answer) = http(coordinator.addr, "POST", "/events", Some(&body), &[]).await;
    assert_eq!(status, 200, "{answer}");
    let text = scrape("coordinator", coordinator.addr).await;
    let rows = check("coordinator", &text, 30).await;
    let usage: Vec<_> = rows
        .iter()
        .filter(|r| r[2] == "kvplane_coordinator_usage_bytes")
        .collect();
    assert!(
        usage
            .iter()
            .any(|r| r[3]["cache_salt"] == HOSTILE_SALT && r[4] == "2048.0"),
        "the hostile salt did not come back intact: {usage:?}\n{text}"
    );

    let node = node_with(|c| c.http_port = Some(0)).await;
    let node_http = node.addrs.http.expect("the node's HTTP port");
    let text = scrape("node", node_http).await;
    check("node", &text, 5).await;

    let router = kvplane::router::start(kvplane::router::RouterConfig::new("m", Vec::new()))
        .await
        .expect("router");
    let (status, _) = http(router.addr, "GET", "/healthz", None, &[]).await;
    assert_eq!(status, 200);
    let text = scrape("router", router.addr).await;
    check("router", &text, 1).await;
}
