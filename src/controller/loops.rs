//! The socket loops. Each one selects on the shutdown token, handles one message at a time
//! and never ends on bad input: every malformed frame is counted, logged (at most one line
//! every 10 s, with how many were held back) and dropped.

use super::driver::Driver;
use super::limits::Limit;
use super::model::RouterKind;
use super::report::record_batch;
use crate::protocol::{decode, decode_batch, decode_lookup, encode, ErrorMsg, KVOpEvent, Msg};
use crate::transport::{PullListener, RouterListener, TransportError};
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Pause after a socket-level receive error, so a persistent fault cannot spin a core.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);

/// Capacity of the PULL loop's scratch ops vector kept after a multipart (a 50-op LMCache
/// batch needs 50); above it, the vector is freed.
const MAX_RETAINED_OPS: usize = 1 << 16;

/// Capacity of the reply loop's scratch hashes vector kept after a lookup (LMCache asks for a
/// request's chunks, hundreds at most); above it, the vector is freed.
const MAX_RETAINED_HASHES: usize = 1 << 16;

/// Receives admit/evict batches, full-sync batches and deregistrations until shutdown.
pub async fn pull_loop(shared: Arc<Driver>, mut socket: PullListener, shutdown: CancellationToken) {
    let m = &shared.metrics;
    let stats = &shared.sockets.pull;
    let _serving = stats.start_serving();
    let mut ops = Vec::with_capacity(64);
    loop {
        let frames = tokio::select! {
            () = shutdown.cancelled() => return,
            r = stats.observe(socket.recv()) => match r {
                Ok(frames) => frames,
                // One peer's connection was closed (and counted in
                // kvplane_peer_disconnects_total); the socket serves the others at once.
                Err(TransportError::PeerDropped { reason }) => {
                    if let Some(held_back) = shared.drop_log.admit() {
                        tracing::warn!(held_back, %reason, "PULL peer connection dropped");
                    }
                    continue;
                }
                Err(e) => {
                    m.dropped("pull", "transport");
                    if let Some(held_back) = shared.drop_log.admit() {
                        tracing::warn!(held_back, "PULL receive error: {e}");
                    }
                    tokio::time::sleep(ERROR_BACKOFF).await;
                    continue;
                }
            },
        };
        m.frames_received
            .with_label_values(&["pull"])
            .inc_by(frames.len() as u64);
        let _active = stats.handling(frames.len());
        apply_frames(&shared, &frames, &mut ops);
    }
}

/// Applies one multipart from the PULL socket, in order. Admit/evict batches take the
/// allocation-free fast path and share one index write lock; any other frame releases it and
/// goes through the general decoder and [`Driver::handle_push`]. `ops` is scratch space kept
/// between calls (public so that the `pull_frames` fuzz target drives exactly this path).
pub fn apply_frames(shared: &Driver, frames: &[Bytes], ops: &mut Vec<KVOpEvent>) {
    let m = &shared.metrics;
    let mut writer = None;
    for frame in frames {
        if frame.len() > shared.config.max_frame_bytes {
            m.dropped("pull", "too_large");
            frame_too_large(shared, "pull", frame.len());
            continue;
        }
        ops.clear();
        if let Some(batch) = decode_batch(frame, ops) {
            let guard = writer.get_or_insert_with(|| shared.batch_writer());
            let outcome = guard.apply_batch(
                frame,
                batch.instance_id,
                batch.worker_id,
                batch.location,
                ops,
            );
            record_batch(
                &shared.reporter(),
                outcome,
                batch.instance_id,
                batch.worker_id,
                batch.location,
            );
            continue;
        }
        drop(writer.take());
        match decode(frame) {
            Ok(msg) => {
                let tag = msg.tag();
                if let Err(reason) = shared.handle_push_frame(msg, Some(frame)) {
                    let reason = reason.label();
                    m.dropped("pull", reason);
                    tracing::debug!(tag, reason, "PULL message had no effect");
                }
            }
            Err(e) => {
                m.dropped("pull", e.reason());
                if let Some(held_back) = shared.drop_log.admit() {
                    tracing::warn!(bytes = frame.len(), held_back, "PULL frame dropped: {e}");
                }
            }
        }
    }
    // One huge batch must not pin its ops vector for the life of the loop.
    if ops.capacity() > MAX_RETAINED_OPS {
        *ops = Vec::with_capacity(64);
    }
}

/// Answers requests on a ROUTER socket until shutdown: exactly one reply per request, in
/// order (the loop is sequential), `ErrorMsg` for anything it cannot handle. On the reply
/// socket a P2P lookup, the hot request, is decoded in place (`decode_lookup`) into a reused
/// hashes vector; anything else goes through the general decoder.
pub async fn router_loop(
    shared: Arc<Driver>,
    mut socket: RouterListener,
    kind: RouterKind,
    shutdown: CancellationToken,
) {
    let m = &shared.metrics;
    let label = kind.label();
    let stats = match kind {
        RouterKind::Reply => &shared.sockets.reply,
        RouterKind::Heartbeat => &shared.sockets.heartbeat,
    };
    let _serving = stats.start_serving();
    let received = m.frames_received.with_label_values(&[label]);
    let mut hashes = Vec::new();
    loop {
        let request = tokio::select! {
            () = shutdown.cancelled() => return,
            r = stats.observe(socket.recv()) => match r {
                Ok(request) => request,
                Err(e) => {
                    m.dropped(label, "transport");
                    if let Some(held_back) = shared.drop_log.admit() {
                        tracing::warn!(socket = label, held_back, "ROUTER receive error: {e}");
                    }
                    tokio::time::sleep(ERROR_BACKOFF).await;
                    continue;
                }
            },
        };
        received.inc();
        let _active = stats.handling(1);
        let reply = match request.frames.as_slice() {
            // A DEALER sends [b"", payload]; the ROUTER prepends the identity, stripped here.
            [delimiter, payload] if delimiter.is_empty() => {
                if payload.len() > shared.config.max_frame_bytes {
                    m.dropped(label, "too_large");
                    frame_too_large(&shared, label, payload.len());
                    error_reply("frame larger than the controller's --max-frame-bytes")
                } else if let Some(lookup) = (kind == RouterKind::Reply)
                    .then(|| decode_lookup(payload, &mut hashes))
                    .flatten()
                {
                    shared.p2p_lookup(&hashes, lookup.instance_id, lookup.worker_id)
                } else {
                    match decode(payload) {
                        Ok(msg) => shared.handle_request_frame(kind, msg, Some(payload)),
                        Err(e) => {
                            m.dropped(label, e.reason());
                            if let Some(held_back) = shared.drop_log.admit() {
                                tracing::warn!(socket = label, held_back, "request dropped: {e}");
                            }
                            error_reply(&format!("could not decode request: {e}"))
                        }
                    }
                }
            }
            _ => {
                m.dropped(label, "bad_envelope");
                if let Some(held_back) = shared.drop_log.admit() {
                    tracing::warn!(
                        socket = label,
                        frames = request.frames.len(),
                        held_back,
                        "request without the [\"\", payload] envelope"
                    );
                }
                error_reply(
                    "expected a DEALER request: an empty delimiter frame, then one payload frame",
                )
            }
        };
        if let Err(e) = socket
            .reply(&request.peer, Bytes::from(encode(&reply)))
            .await
        {
            m.dropped(label, "reply_failed");
            if let Some(held_back) = shared.drop_log.admit() {
                tracing::warn!(socket = label, held_back, "could not reply: {e}");
            }
        }
        if hashes.capacity() > MAX_RETAINED_HASHES {
            hashes = Vec::new();
        }
    }
}

/// Counts and (throttled) logs a frame over `--max-frame-bytes` that reached a loop. The
/// transport normally closes the sending connection before such a frame is read; this is the
/// second line of defence.
fn frame_too_large(shared: &Driver, socket: &str, bytes: usize) {
    let limit = shared.config.max_frame_bytes as u64;
    shared
        .limits
        .hit(&shared.metrics, Limit::FrameBytes, limit, &|| {
            format!("{socket} frame of {bytes} bytes dropped")
        });
}

fn error_reply(text: &str) -> Msg {
    Msg::ErrorMsg(ErrorMsg {
        error: text.to_owned(),
    })
}
