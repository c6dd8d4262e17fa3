//! The command server: the worker's REP socket, which answers every request the controller's
//! REQ socket sends, one at a time, by calling the [`CommandHandler`].
//!
//! Every request gets exactly one reply: the handler's answer as the matching `…RetMsg`, or
//! an `ErrorMsg` — for a handler error, a handler that panicked or overran
//! `command_timeout`, an undecodable frame, or a message that is not a worker command
//! (LMCache's text: "Unknown message: …"). Nothing a peer sends stops the loop.

use super::handler::{CommandHandler, CommandResult};
use super::state::{inc, Ctx};
use crate::protocol::{
    decode, encode, CheckFinishWorkerRetMsg, ClearWorkerRetMsg, CompressWorkerRetMsg,
    DecompressWorkerRetMsg, ErrorMsg, HealthWorkerRetMsg, MoveWorkerRetMsg, Msg, PinWorkerRetMsg,
};
use crate::transport::RepServer;
use bytes::Bytes;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Pause after a socket error before receiving again (the socket never errors in a loop, but
/// a busy loop must be impossible).
const ERROR_PAUSE: Duration = Duration::from_millis(50);

fn error(text: String) -> Msg {
    Msg::ErrorMsg(ErrorMsg { error: text })
}

/// Runs the handler call in its own task, so that a panic or an overrun becomes an
/// `ErrorMsg` instead of ending the server.
async fn guarded<T, F>(command: &str, timeout: Duration, call: F) -> CommandResult<T>
where
    T: Send + 'static,
    F: Future<Output = CommandResult<T>> + Send + 'static,
{
    let mut task = tokio::spawn(call);
    match tokio::time::timeout(timeout, &mut task).await {
        Ok(Ok(result)) => result,
        Ok(Err(join)) => {
            tracing::error!(command, "command handler failed: {join}");
            Err(format!("Worker error: {command} handler panicked").into())
        }
        Err(_) => {
            task.abort();
            tracing::warn!(command, "command handler did not answer within {timeout:?}");
            Err(format!("Worker error: {command} timed out after {timeout:?}").into())
        }
    }
}

/// Answers one decoded request.
pub(crate) async fn dispatch<H: CommandHandler>(
    handler: &Arc<H>,
    msg: Msg,
    timeout: Duration,
) -> Msg {
    let h = Arc::clone(handler);
    let tokens = |r: CommandResult<i64>, ok: fn(i64) -> Msg| match r {
        Ok(n) => ok(n),
        Err(e) => error(e.to_string()),
    };
    match msg {
        Msg::ClearWorkerMsg(m) => tokens(
            guarded("clear", timeout, async move { h.clear(m).await }).await,
            |num_tokens| Msg::ClearWorkerRetMsg(ClearWorkerRetMsg { num_tokens }),
        ),
        Msg::PinWorkerMsg(m) => tokens(
            guarded("pin", timeout, async move { h.pin(m).await }).await,
            |num_tokens| Msg::PinWorkerRetMsg(PinWorkerRetMsg { num_tokens }),
        ),
        Msg::CompressWorkerMsg(m) => tokens(
            guarded("compress", timeout, async move { h.compress(m).await }).await,
            |num_tokens| Msg::CompressWorkerRetMsg(CompressWorkerRetMsg { num_tokens }),
        ),
        Msg::DecompressWorkerMsg(m) => tokens(
            guarded("decompress", timeout, async move { h.decompress(m).await }).await,
            |num_tokens| Msg::DecompressWorkerRetMsg(DecompressWorkerRetMsg { num_tokens }),
        ),
        Msg::MoveWorkerMsg(m) => tokens(
            guarded("move", timeout, async move { h.move_kv(m).await }).await,
            |num_tokens| Msg::MoveWorkerRetMsg(MoveWorkerRetMsg { num_tokens }),
        ),
        Msg::HealthWorkerMsg(m) => tokens(
            guarded("health", timeout, async move { h.health(m).await }).await,
            |error_code| Msg::HealthWorkerRetMsg(HealthWorkerRetMsg { error_code }),
        ),
        Msg::CheckFinishWorkerMsg(m) => {
            match guarded(
                "check_finish",
                timeout,
                async move { h.check_finish(m).await },
            )
            .await
            {
                Ok(status) => Msg::CheckFinishWorkerRetMsg(CheckFinishWorkerRetMsg { status }),
                Err(e) => error(e.to_string()),
            }
        }
        other => error(format!("Unknown message: {}", other.tag())),
    }
}

/// Serves commands on `rep` until `cancel`.
pub(crate) async fn serve<H: CommandHandler>(
    ctx: Arc<Ctx>,
    mut rep: RepServer,
    handler: Arc<H>,
    cancel: CancellationToken,
) {
    let timeout = ctx.config.command_timeout;
    loop {
        let received = tokio::select! {
            () = cancel.cancelled() => return,
            received = rep.recv() => received,
        };
        let payload = match received {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("command socket: {e}");
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(ERROR_PAUSE) => continue,
                }
            }
        };
        let reply = match decode(&payload) {
            Ok(msg) => {
                let tag = msg.tag();
                tracing::debug!(command = tag, "controller command");
                tokio::select! {
                    () = cancel.cancelled() => return,
                    reply = dispatch(&handler, msg, timeout) => reply,
                }
            }
            Err(e) => {
                tracing::warn!("undecodable command ({} bytes): {e}", payload.len());
                error(format!("Worker error: cannot decode the request: {e}"))
            }
        };
        inc(&ctx.stats.commands);
        if let Err(e) = rep.reply(Bytes::from(encode(&reply))).await {
            tracing::warn!("command reply not sent: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{ClearWorkerMsg, CompressWorkerMsg, HealthWorkerMsg, RegisterMsg};
    use crate::worker::{CommandError, NoCommands};

    struct Panics;
    impl CommandHandler for Panics {
        async fn clear(&self, _req: ClearWorkerMsg) -> CommandResult<i64> {
            panic!("boom")
        }
        async fn health(&self, _req: HealthWorkerMsg) -> CommandResult<i64> {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(0)
        }
        async fn compress(&self, req: CompressWorkerMsg) -> CommandResult<i64> {
            Err(CommandError::new(format!("no method {}", req.method)))
        }
    }

    fn err_text(m: Msg) -> String {
        match m {
            Msg::ErrorMsg(e) => e.error,
            other => panic!("expected ErrorMsg, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn defaults_errors_panics_and_overruns_all_answer() {
        let t = Duration::from_millis(200);
        let none = Arc::new(NoCommands);
        let clear = Msg::ClearWorkerMsg(ClearWorkerMsg {
            worker_event_id: "e".into(),
            location: "LocalCPUBackend".into(),
        });
        assert_eq!(
            err_text(dispatch(&none, clear.clone(), t).await),
            "not implemented: clear"
        );
        let health = Msg::HealthWorkerMsg(HealthWorkerMsg {
            worker_event_id: "h".into(),
        });
        assert_eq!(
            dispatch(&none, health.clone(), t).await,
            Msg::HealthWorkerRetMsg(HealthWorkerRetMsg { error_code: 0 })
        );
        let reg = Msg::RegisterMsg(RegisterMsg {
            instance_id: "i".into(),
            worker_id: 0,
            ip: "x".into(),
            port: 1,
            peer_init_url: None,
            distributed_url: None,
        });
        assert_eq!(
            err_text(dispatch(&none, reg, t).await),
            "Unknown message: RegisterMsg"
        );

        let bad = Arc::new(Panics);
        assert!(err_text(dispatch(&bad, clear, t).await).contains("panicked"));
        assert!(err_text(dispatch(&bad, health, t).await).contains("timed out"));
        let compress = Msg::CompressWorkerMsg(CompressWorkerMsg {
            worker_event_id: "c".into(),
            method: "zstd".into(),
            location: "LocalCPUBackend".into(),
            tokens: None,
        });
        assert_eq!(
            err_text(dispatch(&bad, compress, t).await),
            "no method zstd"
        );
    }
}
