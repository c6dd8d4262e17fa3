//! LMCache 0.5.6's own MP-server coordinator client against `kvplane coordinator`: the real
//! `registrar.keep_registered` (register, heartbeat, 404 → re-register, deregister on
//! shutdown), the real event wire types posted to `POST /events`, and the MP server's real
//! event reporter (`cache_events.CacheEventSubscriber` + `HttpCacheEventSink`) fed bus
//! events, CPU only (tests/interop/coordinator_client.py). The full `lmcache server` MP
//! server needs LMCache's compiled extension (`lmcache_native`, linked to real torch) for its
//! storage manager, so it does not run here (docs/COORDINATOR.md says exactly why).

use crate::support::lmcache::python;
use crate::support::process::Launch;
use crate::support::SLOW;
use kvplane::coordinator::{self, CoordinatorConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lmcache_registrar_and_event_wire_work_against_the_coordinator() {
    let server = coordinator::start(CoordinatorConfig::with_defaults("127.0.0.1", 0))
        .await
        .expect("bind");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/interop/coordinator_client.py"
    );
    let out = Launch::python("LMCache's coordinator client", python(), script)
        .arg(format!("http://{}", server.addr))
        .run(SLOW)
        .await;
    let (stdout, stderr) = (&out.stdout, &out.stderr);
    assert!(
        out.status.success() && stdout.contains(r#"{"done": true}"#),
        "client failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    for step in [
        "registered",
        "re-registered",
        "store event moved usage",
        "replayed batch is a duplicate",
        "delete event cleared usage",
        "reporter stores moved usage",
        "reporter capacity declaration and bytes in /instances/{id}/usage",
        "fleet usage lists the reporter",
        "reporter delete lowered usage",
        "deregistered on shutdown",
    ] {
        assert!(
            stdout.contains(&format!(r#"{{"ok": "{step}"}}"#)),
            "{step}: {stdout}"
        );
    }
    let instances = server
        .handle
        .fleet(|f, _, _| f.len())
        .await
        .expect("running");
    assert_eq!(instances, 0);
    // The reporter's batches went through the sequence gate: its capacity (config) batch,
    // stores and access, then the delete, as one instance's ordered stream.
    let (applied, gaps) = server
        .handle
        .with(|m, _, _| (m.counters.batches_applied, m.counters.seq_gaps))
        .await
        .expect("running");
    assert!(applied >= 6, "batches applied: {applied}");
    assert_eq!(gaps, 0);
    server.stop().await;
}
