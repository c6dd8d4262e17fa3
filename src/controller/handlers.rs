//! What the controller does with each message: pure functions of the shared state, called
//! by the socket loops (and directly by tests). No socket I/O here.

use super::limits::Limit;
use super::state::{host_port, unix_now, Shared};
use crate::index::{
    BatchOutcome, HeartbeatOutcome, IndexError, RegisterOutcome, SyncBatchOutcome, SyncEndOutcome,
};
use crate::protocol::{
    BatchedP2PLookupRetMsg, ErrorMsg, FullSyncStartRetMsg, FullSyncStatusRetMsg, HeartbeatCommand,
    HeartbeatRetMsg, KVOpEvent, Msg, OpType, RegisterRetMsg,
};
use std::net::{IpAddr, UdpSocket};
use std::time::Instant;

/// Which ROUTER socket a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouterKind {
    /// The reply socket: registration, lookups, full-sync start/status (and heartbeats).
    Reply,
    /// The dedicated heartbeat socket: heartbeats only, as in LMCache.
    Heartbeat,
}

impl RouterKind {
    /// Metric label of the socket.
    pub fn label(self) -> &'static str {
        match self {
            RouterKind::Reply => "reply",
            RouterKind::Heartbeat => "heartbeat",
        }
    }
}

fn error(text: impl Into<String>) -> Msg {
    Msg::ErrorMsg(ErrorMsg { error: text.into() })
}

fn port_of(port: i64) -> Result<u16, String> {
    u16::try_from(port).map_err(|_| format!("port {port} is out of range"))
}

/// Answers one request from a ROUTER socket. Always returns exactly one reply.
pub fn handle_request(shared: &Shared, kind: RouterKind, msg: Msg) -> Msg {
    shared
        .metrics
        .requests
        .with_label_values(&[msg.tag()])
        .inc();
    if kind == RouterKind::Heartbeat && !matches!(msg, Msg::HeartbeatMsg(_)) {
        return error(format!("Expected HeartbeatMsg, got {}", msg.tag()));
    }
    match msg {
        Msg::RegisterMsg(m) => {
            let port = match port_of(m.port) {
                Ok(p) => p,
                Err(e) => return error(e),
            };
            let now = unix_now();
            let outcome = shared.index.write().register(
                &m.instance_id,
                m.worker_id,
                &m.ip,
                port,
                m.peer_init_url.as_deref(),
                now,
            );
            let outcome = match outcome {
                Ok(o) => o,
                Err(e) => {
                    refused_worker(shared, &e, &m.instance_id, m.worker_id, "registration");
                    return error(format!("registration refused: {e}"));
                }
            };
            let reopen = match outcome {
                RegisterOutcome::New => true,
                RegisterOutcome::ReRegistered { endpoint_changed } => {
                    tracing::warn!(
                        instance = %m.instance_id, worker = m.worker_id,
                        "worker re-registered: its keys and sync state were cleared"
                    );
                    endpoint_changed || shared.downlink(&m.instance_id, m.worker_id).is_none()
                }
            };
            if reopen {
                shared.open_downlink((m.instance_id.clone(), m.worker_id), &m.ip, port);
            }
            tracing::info!(instance = %m.instance_id, worker = m.worker_id, ip = %m.ip, port, "worker registered");
            shared.refresh_gauges();
            let mut extra_config = indexmap::IndexMap::new();
            if let Some(url) = heartbeat_url(shared, &m.ip) {
                extra_config.insert("heartbeat_url".to_owned(), url);
            }
            Msg::RegisterRetMsg(RegisterRetMsg { extra_config })
        }
        Msg::HeartbeatMsg(m) => {
            let port = match port_of(m.port) {
                Ok(p) => p,
                Err(e) => return error(e),
            };
            let outcome = shared.index.write().heartbeat(
                &m.instance_id,
                m.worker_id,
                &m.ip,
                port,
                m.peer_init_url.as_deref(),
                unix_now(),
            );
            let outcome = match outcome {
                Ok(o) => o,
                Err(e) => {
                    refused_worker(shared, &e, &m.instance_id, m.worker_id, "heartbeat");
                    return error(format!("heartbeat refused: {e}"));
                }
            };
            let commands = match outcome {
                HeartbeatOutcome::ReRegistered => {
                    tracing::info!(
                        instance = %m.instance_id, worker = m.worker_id,
                        "heartbeat from an unknown worker: re-registered, asking for a full sync"
                    );
                    shared.open_downlink((m.instance_id.clone(), m.worker_id), &m.ip, port);
                    shared.refresh_gauges();
                    vec![HeartbeatCommand::full_sync("worker_re_registered")]
                }
                HeartbeatOutcome::Known {
                    full_sync,
                    endpoint_changed,
                } => {
                    if endpoint_changed {
                        shared.open_downlink((m.instance_id.clone(), m.worker_id), &m.ip, port);
                    }
                    full_sync
                        .map(HeartbeatCommand::full_sync)
                        .into_iter()
                        .collect()
                }
            };
            Msg::HeartbeatRetMsg(HeartbeatRetMsg { commands })
        }
        Msg::BatchedP2PLookupMsg(m) => {
            let started = Instant::now();
            let index = shared.index.read();
            let hit = index.p2p_lookup(&m.hashes, &m.instance_id, m.worker_id);
            shared
                .metrics
                .p2p_lookup_seconds
                .observe(started.elapsed().as_secs_f64());
            let entry = match hit {
                Some(hit) => {
                    shared.metrics.p2p_lookups.with_label_values(&["hit"]).inc();
                    let n = i64::try_from(hit.num_hit_chunks).unwrap_or(i64::MAX);
                    (
                        hit.instance_id.to_owned(),
                        hit.location.to_owned(),
                        n,
                        hit.peer_init_url.to_owned(),
                    )
                }
                None => {
                    shared
                        .metrics
                        .p2p_lookups
                        .with_label_values(&["miss"])
                        .inc();
                    (String::new(), String::new(), 0, String::new())
                }
            };
            drop(index);
            Msg::BatchedP2PLookupRetMsg(BatchedP2PLookupRetMsg {
                layout_info: vec![entry],
            })
        }
        Msg::FullSyncStartMsg(m) => {
            let result = shared.index.write().sync_start(
                &m.instance_id,
                m.worker_id,
                &m.location,
                &m.sync_id,
                m.total_keys,
                m.batch_count,
                unix_now(),
            );
            let error_msg = result.err().map(|e| e.to_string());
            match &error_msg {
                None => tracing::info!(
                    instance = %m.instance_id, worker = m.worker_id, sync_id = %m.sync_id,
                    keys = m.total_keys, batches = m.batch_count, "full sync started"
                ),
                Some(e) => {
                    if let Some(held_back) = shared.drop_log.admit() {
                        tracing::warn!(instance = %m.instance_id, worker = m.worker_id, held_back, "full sync refused: {e}")
                    }
                }
            }
            Msg::FullSyncStartRetMsg(FullSyncStartRetMsg {
                sync_id: m.sync_id,
                accepted: error_msg.is_none(),
                error_msg,
            })
        }
        Msg::FullSyncStatusMsg(m) => {
            let s = shared
                .index
                .read()
                .sync_status(&m.instance_id, m.worker_id, &m.sync_id);
            Msg::FullSyncStatusRetMsg(FullSyncStatusRetMsg {
                sync_id: m.sync_id,
                is_complete: s.is_complete,
                global_progress: s.global_progress,
                can_exit_freeze: s.can_exit_freeze,
                missing_batches: s.missing_batches,
            })
        }
        other => error(format!(
            "Unsupported request type {} on the {} socket",
            other.tag(),
            kind.label()
        )),
    }
}

/// Applies one message from the PULL socket. Returns the drop reason if it had no effect
/// because it does not belong on this socket.
pub fn handle_push(shared: &Shared, msg: Msg) -> Result<(), &'static str> {
    match msg {
        Msg::BatchedKVOperationMsg(m) => {
            apply_ops(
                shared,
                &m.instance_id,
                m.worker_id,
                &m.location,
                &m.operations,
            );
            Ok(())
        }
        // Legacy single-op messages: LMCache 0.5.6 decodes and ignores them; applying them
        // is what their sender meant (Mooncake's JSON integration sends them).
        Msg::KVAdmitMsg(m) => {
            let op = KVOpEvent {
                op_type: OpType::Admit,
                key: m.key,
                seq_num: m.seq_num,
            };
            apply_ops(shared, &m.instance_id, m.worker_id, &m.location, &[op]);
            Ok(())
        }
        Msg::KVEvictMsg(m) => {
            let op = KVOpEvent {
                op_type: OpType::Evict,
                key: m.key,
                seq_num: m.seq_num,
            };
            apply_ops(shared, &m.instance_id, m.worker_id, &m.location, &[op]);
            Ok(())
        }
        Msg::FullSyncBatchMsg(m) => {
            let (outcome, refused) = {
                let mut index = shared.index.write();
                let before = index.keys_refused();
                let outcome = index.sync_batch(
                    &m.instance_id,
                    m.worker_id,
                    &m.location,
                    &m.sync_id,
                    m.batch_id,
                    &m.keys,
                    unix_now(),
                );
                (outcome, index.keys_refused() - before)
            };
            if refused > 0 {
                refused_keys(shared, refused, &m.instance_id, m.worker_id, &m.location);
            }
            match outcome {
                SyncBatchOutcome::Accepted => Ok(()),
                SyncBatchOutcome::Completed => {
                    tracing::info!(instance = %m.instance_id, worker = m.worker_id, sync_id = %m.sync_id, "full sync completed by a resent batch");
                    Ok(())
                }
                SyncBatchOutcome::Rejected => {
                    if let Some(held_back) = shared.drop_log.admit() {
                        tracing::warn!(instance = %m.instance_id, worker = m.worker_id, sync_id = %m.sync_id, batch = m.batch_id, held_back, "full-sync batch for no active sync dropped");
                    }
                    Err("stale_sync")
                }
                SyncBatchOutcome::TooLarge => {
                    refused_batch(
                        shared,
                        Some(m.keys.len()),
                        &m.instance_id,
                        m.worker_id,
                        "full-sync",
                    );
                    Err("too_many_ops")
                }
                SyncBatchOutcome::OverBudget => {
                    let limit = shared.index.read().config().max_sync_ranges;
                    shared.limits.hit(
                        &shared.metrics,
                        Limit::SyncRanges,
                        limit as u64,
                        &|| {
                            format!(
                                "out-of-order full-sync batch {} from worker {}/{} dropped (it stays missing)",
                                m.batch_id, m.instance_id, m.worker_id
                            )
                        },
                    );
                    Err("sync_ranges")
                }
            }
        }
        Msg::FullSyncEndMsg(m) => {
            let outcome = shared.index.write().sync_end(
                &m.instance_id,
                m.worker_id,
                &m.sync_id,
                m.actual_total_keys,
                unix_now(),
            );
            match outcome {
                SyncEndOutcome::Completed => {
                    tracing::info!(instance = %m.instance_id, worker = m.worker_id, sync_id = %m.sync_id, "full sync completed");
                    Ok(())
                }
                SyncEndOutcome::Incomplete { missing } => {
                    tracing::warn!(instance = %m.instance_id, worker = m.worker_id, sync_id = %m.sync_id, missing, "full sync ended with batches missing: waiting for them");
                    Ok(())
                }
                SyncEndOutcome::Rejected => Err("stale_sync"),
            }
        }
        Msg::DeRegisterMsg(m) => {
            if shared.index.write().deregister(&m.instance_id, m.worker_id) {
                shared.close_downlink(&m.instance_id, m.worker_id);
                shared
                    .metrics
                    .workers_removed
                    .with_label_values(&["deregistered"])
                    .inc();
                shared.refresh_gauges();
                tracing::info!(instance = %m.instance_id, worker = m.worker_id, "worker deregistered");
            } else if let Some(held_back) = shared.drop_log.admit() {
                tracing::warn!(instance = %m.instance_id, worker = m.worker_id, held_back, "deregistration of an unknown worker");
            }
            Ok(())
        }
        _ => Err("wrong_socket"),
    }
}

fn apply_ops(
    shared: &Shared,
    instance_id: &str,
    worker_id: i64,
    location: &str,
    ops: &[KVOpEvent],
) {
    let outcome =
        shared
            .index
            .write()
            .apply_batch(instance_id, worker_id, location, ops, unix_now());
    record_batch(shared, outcome, instance_id, worker_id, location);
}

/// Counts what applying one admit/evict batch did, and logs sequence gaps.
pub fn record_batch(
    shared: &Shared,
    outcome: BatchOutcome,
    instance_id: &str,
    worker_id: i64,
    location: &str,
) {
    let m = &shared.metrics;
    match outcome {
        BatchOutcome::Applied {
            admits,
            evicts,
            gaps,
            refused,
            ..
        } => {
            if refused > 0 {
                refused_keys(shared, refused as u64, instance_id, worker_id, location);
            }
            // Refused admits were received but not applied.
            m.ops_applied
                .with_label_values(&["admit"])
                .inc_by((admits - refused) as u64);
            m.ops_applied
                .with_label_values(&["evict"])
                .inc_by(evicts as u64);
            if gaps > 0 {
                m.seq_discontinuities.inc();
                if let Some(held_back) = shared.drop_log.admit() {
                    tracing::warn!(instance = %instance_id, worker = worker_id, location, gaps, held_back, "sequence gap in admit/evict batch (ops applied anyway)");
                }
            }
        }
        BatchOutcome::DiscardedSyncing => {
            m.batches_discarded.with_label_values(&["syncing"]).inc();
        }
        BatchOutcome::UnknownWorker => {
            m.batches_discarded
                .with_label_values(&["unknown_worker"])
                .inc();
        }
        BatchOutcome::TooManyLocations => {
            m.batches_discarded
                .with_label_values(&["too_many_locations"])
                .inc();
            if let Some(held_back) = shared.drop_log.admit() {
                tracing::warn!(
                    instance = %instance_id, worker = worker_id, location, held_back,
                    "batch for a new location over the per-worker limit dropped"
                );
            }
        }
        BatchOutcome::TooLarge => {
            m.batches_discarded
                .with_label_values(&["too_many_ops"])
                .inc();
            refused_batch(shared, None, instance_id, worker_id, "admit/evict");
        }
    }
}

fn refused_worker(shared: &Shared, e: &IndexError, instance_id: &str, worker_id: i64, what: &str) {
    match e {
        IndexError::TooManyWorkers { limit } => {
            shared
                .limits
                .hit(&shared.metrics, Limit::Workers, *limit as u64, &|| {
                    format!("{what} of worker {instance_id}/{worker_id} refused")
                });
        }
        IndexError::CapacityExceeded => {
            tracing::warn!(instance = %instance_id, worker = worker_id, "{what} refused: {e}");
        }
    }
}

fn refused_keys(shared: &Shared, n: u64, instance_id: &str, worker_id: i64, location: &str) {
    shared.metrics.keys_refused.inc_by(n);
    let limit = shared.config.max_keys_per_worker;
    shared
        .limits
        .hit(&shared.metrics, Limit::KeysPerWorker, limit, &|| {
            format!("{n} admits of worker {instance_id}/{worker_id} ({location}) refused")
        });
}

fn refused_batch(
    shared: &Shared,
    keys: Option<usize>,
    instance_id: &str,
    worker_id: i64,
    what: &str,
) {
    let limit = shared.config.max_batch_ops;
    shared
        .limits
        .hit(&shared.metrics, Limit::BatchOps, limit as u64, &|| {
            let size = keys.map_or_else(String::new, |n| format!(" of {n} keys"));
            format!("{what} batch{size} from worker {instance_id}/{worker_id} dropped whole")
        });
}

/// The `heartbeat_url` a worker at `worker_ip` can reach: `--advertise-host`, else the bind
/// host, else (bind host is a wildcard) the local address of the route to the worker —
/// `127.0.0.1` for a worker on loopback. Computing the route sends no packet.
pub fn heartbeat_url(shared: &Shared, worker_ip: &str) -> Option<String> {
    let port = shared.heartbeat_port?;
    let cfg = &shared.config;
    let host = match &cfg.advertise_host {
        Some(h) => h.clone(),
        None if !matches!(cfg.host.as_str(), "0.0.0.0" | "*" | "" | "::" | "[::]") => {
            cfg.host.clone()
        }
        None => route_source(worker_ip).map_or_else(|| "127.0.0.1".to_owned(), |ip| ip.to_string()),
    };
    Some(host_port(&host, port))
}

fn route_source(peer: &str) -> Option<IpAddr> {
    let peer: IpAddr = peer.parse().ok()?;
    if peer.is_loopback() {
        return Some(peer);
    }
    let bind = if peer.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let socket = UdpSocket::bind(bind).ok()?;
    // UDP connect only selects a route; nothing is sent.
    socket.connect((peer, 9)).ok()?;
    socket.local_addr().ok().map(|a| a.ip())
}
