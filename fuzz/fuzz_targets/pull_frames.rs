//! `pull_frames`: a sequence of frames applied to a real controller state, through the same
//! functions the socket loops call — [`apply_frames`] for PULL multiparts and
//! [`handle_request`] for the two ROUTER sockets — with index invariants checked after every
//! step.
//!
//! Input: records `[kind: u8][len: u16 LE][len bytes]` (the last one may be short):
//! * kind % 5 == 0 — a PULL frame, appended to the current multipart;
//! * kind % 5 == 1 — the current multipart (plus this frame, if non-empty) goes through the
//!   PULL path;
//! * kind % 5 == 2 — a request on the reply ROUTER;
//! * kind % 5 == 3 — a request on the heartbeat ROUTER;
//! * kind % 5 == 4 — maintenance chosen by the first byte: compaction, expiring every full
//!   sync, or reaping every worker as the liveness sweep does after a failed probe.
//!
//! The state has small limits (workers, locations, keys per worker, ops per batch) so that
//! the refusal paths are reached too.
#![no_main]

use bytes::Bytes;
use kvplane::config::ServeConfig;
use kvplane::controller::loops::apply_frames;
use kvplane::controller::{RouterKind, Driver};
use kvplane::protocol::decode;
use libfuzzer_sys::fuzz_target;

const MAX_WORKERS: usize = 6;
const MAX_KEYS_PER_WORKER: u64 = 24;

fn config() -> ServeConfig {
    let mut c = ServeConfig::ephemeral();
    c.max_frame_bytes = 4096;
    c.max_workers = MAX_WORKERS;
    c.max_keys_per_worker = MAX_KEYS_PER_WORKER;
    c.max_batch_ops = 40;
    c
}

fuzz_target!(|data: &[u8]| {
    // Registering opens a downlink task; a runtime that is never driven keeps them inert, and
    // dropping it at the end of the input drops them.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let shared = Driver::new(config(), Some(1));
    let mut ops = Vec::new();
    let mut multipart: Vec<Bytes> = Vec::new();
    let mut rest = data;
    while let Some((&kind, tail)) = rest.split_first() {
        let len = match tail {
            [a, b, ..] => usize::from(u16::from_le_bytes([*a, *b])),
            _ => tail.len(),
        };
        let body = tail.get(2..).unwrap_or(&[]);
        let (frame, next) = body.split_at(len.min(body.len()));
        rest = next;
        match kind % 5 {
            0 => multipart.push(Bytes::copy_from_slice(frame)),
            1 => {
                if !frame.is_empty() {
                    multipart.push(Bytes::copy_from_slice(frame));
                }
                apply_frames(&shared, &std::mem::take(&mut multipart), &mut ops);
            }
            2 | 3 => {
                let router = if kind % 5 == 2 {
                    RouterKind::Reply
                } else {
                    RouterKind::Heartbeat
                };
                if let Ok(msg) = decode(frame) {
                    let _reply = shared.handle_request(router, msg);
                }
            }
            _ => maintenance(&shared, frame.first().copied().unwrap_or(0)),
        }
        check(&shared);
    }
    if !multipart.is_empty() {
        apply_frames(&shared, &multipart, &mut ops);
        check(&shared);
    }
});

fn maintenance(shared: &Driver, what: u8) {
    // Past every timeout (worker and full sync): everything is stale.
    let skip = || shared.clock().skip(std::time::Duration::from_secs(100_000));
    match what % 3 {
        0 => {
            shared.index_mut_for_tests().compact();
        }
        1 => {
            skip();
            shared.begin_sweep();
        }
        _ => {
            skip();
            for target in shared.begin_sweep() {
                shared.probe_failed(&target);
            }
        }
    }
}

/// Index invariants: every count agrees with every other view of the same data.
fn check(shared: &Driver) {
    shared
        .check_consistency()
        .expect("one live downlink of the model's generation per registered worker");
    let index = shared.index();
    let workers = index.workers();
    let total = index.key_count();
    assert_eq!(workers.len(), index.worker_count(), "worker views vs count");
    assert!(workers.len() <= MAX_WORKERS, "--max-workers holds");
    let by_instance: usize = index.instances().iter().map(|i| i.worker_count).sum();
    assert_eq!(by_instance, index.worker_count(), "instances vs workers");
    let mut sum = 0;
    let mut scanned = 0;
    for w in &workers {
        let locs: u64 = w.locations.iter().map(|l| l.key_count).sum();
        assert_eq!(w.key_count, locs, "worker key count vs its locations");
        assert!(
            w.key_count <= MAX_KEYS_PER_WORKER,
            "--max-keys-per-worker holds"
        );
        sum += w.key_count;
        for l in &w.locations {
            let keys = index.keys_of(&w.instance_id, w.worker_id, &l.name);
            assert_eq!(keys.len() as u64, l.key_count, "location count vs its keys");
            scanned += keys.len() as u64;
            for k in keys.iter().take(4) {
                let holders = index.prefix_holders(std::slice::from_ref(k));
                assert!(
                    holders.iter().any(|h| h.instance_id == w.instance_id
                        && h.worker_id == w.worker_id
                        && h.location == l.name),
                    "a held key is found by lookup"
                );
            }
        }
    }
    assert_eq!(total, sum, "key_count is the sum of per-worker counts");
    assert_eq!(total, scanned, "key_count is the number of memberships");
    let mem = index.memory_stats();
    assert_eq!(mem.live_memberships, total, "memory stats vs key count");
    let keys_in_instances: u64 = index.instances().iter().map(|i| i.key_count).sum();
    assert_eq!(keys_in_instances, total, "instance key counts");
}
