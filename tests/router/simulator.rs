//! `kvplane bench route` on a short synthetic trace with 2 simulated engines (child
//! processes of the bench, each with its HTTP server and ZMQ publisher) and three policies:
//! structural facts only, never a time. Every request is answered, the oracle reuses at least
//! as much as round-robin, and kvplane's router accounts every answer's cached tokens.

use crate::support::process::Launch;
use serde_json::Value;
use std::fmt::Write as _;
use std::time::Duration;

/// 36 requests over 3 shared prefixes of 4 trace blocks (2,048 tokens) with a unique tail
/// each, 100 ms apart in trace time.
fn trace() -> String {
    let mut out = String::new();
    for i in 0..36u64 {
        let prefix = i % 3;
        let ids: Vec<String> = (0..4)
            .map(|b| (prefix * 10 + b).to_string())
            .chain([(1000 + i).to_string()])
            .collect();
        let _ = writeln!(
            out,
            r#"{{"timestamp": {}, "input_length": 2300, "output_length": 4, "hash_ids": [{}]}}"#,
            i * 100,
            ids.join(", ")
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_answers_every_request_and_the_oracle_reuses_at_least_round_robin() {
    let path =
        std::env::temp_dir().join(format!("kvplane-route-trace-{}.jsonl", std::process::id()));
    std::fs::write(&path, trace()).expect("write trace");
    let done = Launch::kvplane("bench")
        .args(["route", "--engines", "2", "--speedup", "10", "--json"])
        .args(["--policies", "round-robin,oracle,kvplane"])
        .arg("--trace")
        .arg(&path)
        .env("RUST_LOG", "warn")
        .run(Duration::from_secs(180))
        .await;
    let _ = std::fs::remove_file(&path);
    done.assert_success("kvplane bench route");
    let report: Value = serde_json::from_str(&done.stdout).expect("JSON report");
    assert_eq!(report["requests"], 36);
    let policy = |name: &str| -> Value {
        report["policies"]
            .as_array()
            .expect("policies")
            .iter()
            .find(|p| p["policy"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} missing: {report}"))
    };
    for name in ["round-robin", "oracle", "kvplane"] {
        let p = policy(name);
        assert_eq!(p["answered"], 36, "{name}: every request answered: {p}");
        assert_eq!(p["prompt_tokens"], 36 * 2300, "{name}: {p}");
    }
    let hit = |name: &str| policy(name)["hit_ratio"].as_f64().expect("hit ratio");
    assert!(hit("oracle") >= hit("round-robin"), "{report}");
    assert!(hit("oracle") > 0.0, "{report}");
    // kvplane's router accounted every answer, and what it counts as delivered is what the
    // engines reported.
    let kv = policy("kvplane");
    let overall = &kv["router_stats"]["overall"];
    assert_eq!(overall["requests"], 36, "{kv}");
    assert_eq!(overall["delivered"], kv["cached_tokens"], "{kv}");
    assert!(
        overall["predicted"].as_u64().expect("predicted") > 0,
        "{kv}"
    );
}
