//! What the application does when the controller sends a command: the [`CommandHandler`]
//! trait, its error type, and [`NoCommands`] (a handler that implements nothing).
//!
//! The methods take the wire message as it arrived (see `crate::protocol`), so nothing is lost
//! in translation. A method the application does not override answers the controller with
//! `ErrorMsg{"not implemented: <command>"}`, which LMCache's and kvplane's controllers both
//! report as a failed command (HTTP 500, or error code -1001 for `/health`). Only `health`
//! has a working default: answering at all proves the worker alive.

use crate::protocol::{
    CheckFinishWorkerMsg, ClearWorkerMsg, CompressWorkerMsg, DecompressWorkerMsg, HealthWorkerMsg,
    MoveWorkerMsg, PinWorkerMsg,
};
use std::fmt;
use std::future::Future;

/// A command failed; the controller receives `ErrorMsg{error: <the message>}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandError(String);

impl CommandError {
    /// A failure with this message.
    pub fn new(message: impl Into<String>) -> Self {
        CommandError(message.into())
    }

    /// The answer of a command the handler does not implement: `"not implemented: <command>"`.
    pub fn not_implemented(command: &str) -> Self {
        CommandError(format!("not implemented: {command}"))
    }

    /// The message sent to the controller.
    pub fn message(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CommandError {}

impl From<String> for CommandError {
    fn from(message: String) -> Self {
        CommandError(message)
    }
}

impl From<&str> for CommandError {
    fn from(message: &str) -> Self {
        CommandError(message.to_owned())
    }
}

/// Result of a command: a number of tokens (or a health code, or a status), or an error.
pub type CommandResult<T> = Result<T, CommandError>;

/// The application's side of the controller's commands (LMCache's `LMCacheEngine` calls in
/// `worker.py`). Each method answers one `ControlMsg`; implement the ones your engine supports
/// and write them as `async fn` in your `impl`.
///
/// Calls arrive one at a time, in the order the controller sends them, each bounded by
/// [`WorkerConfig::command_timeout`](super::WorkerConfig::command_timeout). A method that
/// panics answers `ErrorMsg` and does not stop the command server.
///
/// ```
/// use kvplane::protocol::ClearWorkerMsg;
/// use kvplane::worker::{CommandHandler, CommandResult};
///
/// struct Engine;
///
/// impl CommandHandler for Engine {
///     async fn clear(&self, req: ClearWorkerMsg) -> CommandResult<i64> {
///         println!("clearing {}", req.location);
///         Ok(0) // tokens cleared
///     }
/// }
/// ```
pub trait CommandHandler: Send + Sync + 'static {
    /// `ClearWorkerMsg`: drop everything stored in `req.location`; returns the number of
    /// tokens cleared (`ClearWorkerRetMsg.num_tokens`).
    ///
    /// # Errors
    /// Any [`CommandError`] becomes the controller's `ErrorMsg`; the default is
    /// "not implemented: clear".
    fn clear(&self, req: ClearWorkerMsg) -> impl Future<Output = CommandResult<i64>> + Send {
        let _ = req;
        async { Err(CommandError::not_implemented("clear")) }
    }

    /// `PinWorkerMsg`: pin the prefix of `req.tokens` held in `req.location`; returns the
    /// number of tokens pinned.
    ///
    /// # Errors
    /// As for [`clear`](Self::clear); the default is "not implemented: pin".
    fn pin(&self, req: PinWorkerMsg) -> impl Future<Output = CommandResult<i64>> + Send {
        let _ = req;
        async { Err(CommandError::not_implemented("pin")) }
    }

    /// `CompressWorkerMsg`: compress `req.tokens` (all when `None`) in `req.location` with
    /// `req.method`; returns the number of tokens compressed.
    ///
    /// # Errors
    /// As for [`clear`](Self::clear); the default is "not implemented: compress".
    fn compress(&self, req: CompressWorkerMsg) -> impl Future<Output = CommandResult<i64>> + Send {
        let _ = req;
        async { Err(CommandError::not_implemented("compress")) }
    }

    /// `DecompressWorkerMsg`: the inverse of [`compress`](Self::compress).
    ///
    /// # Errors
    /// As for [`clear`](Self::clear); the default is "not implemented: decompress".
    fn decompress(
        &self,
        req: DecompressWorkerMsg,
    ) -> impl Future<Output = CommandResult<i64>> + Send {
        let _ = req;
        async { Err(CommandError::not_implemented("decompress")) }
    }

    /// `MoveWorkerMsg`: send the KV of `req.tokens` from the local backend `req.old_position`
    /// to the peer `req.new_position.0` (its `peer_init_url`), backend `req.new_position.1`;
    /// keep a copy when `req.copy` is true. Returns the number of tokens moved.
    ///
    /// # Errors
    /// As for [`clear`](Self::clear); the default is "not implemented: move".
    fn move_kv(&self, req: MoveWorkerMsg) -> impl Future<Output = CommandResult<i64>> + Send {
        let _ = req;
        async { Err(CommandError::not_implemented("move")) }
    }

    /// `HealthWorkerMsg`: 0 when healthy (LMCache: -1 when its memory check failed). The
    /// default answers 0: a worker that answers is alive.
    ///
    /// # Errors
    /// A [`CommandError`] becomes `ErrorMsg` (LMCache's `/health` reports -1001 for it).
    fn health(&self, req: HealthWorkerMsg) -> impl Future<Output = CommandResult<i64>> + Send {
        let _ = req;
        async { Ok(0) }
    }

    /// `CheckFinishWorkerMsg`: the status of event `req.worker_event_id`
    /// (`CheckFinishWorkerRetMsg.status`). LMCache's workers do not implement it.
    ///
    /// # Errors
    /// As for [`clear`](Self::clear); the default is "not implemented: check_finish".
    fn check_finish(
        &self,
        req: CheckFinishWorkerMsg,
    ) -> impl Future<Output = CommandResult<String>> + Send {
        let _ = req;
        async { Err(CommandError::not_implemented("check_finish")) }
    }
}

/// A handler that implements no command (every command but `health` answers
/// "not implemented"). For workers that only report their keys.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoCommands;

impl CommandHandler for NoCommands {}

impl<H: CommandHandler> CommandHandler for std::sync::Arc<H> {
    fn clear(&self, req: ClearWorkerMsg) -> impl Future<Output = CommandResult<i64>> + Send {
        (**self).clear(req)
    }
    fn pin(&self, req: PinWorkerMsg) -> impl Future<Output = CommandResult<i64>> + Send {
        (**self).pin(req)
    }
    fn compress(&self, req: CompressWorkerMsg) -> impl Future<Output = CommandResult<i64>> + Send {
        (**self).compress(req)
    }
    fn decompress(
        &self,
        req: DecompressWorkerMsg,
    ) -> impl Future<Output = CommandResult<i64>> + Send {
        (**self).decompress(req)
    }
    fn move_kv(&self, req: MoveWorkerMsg) -> impl Future<Output = CommandResult<i64>> + Send {
        (**self).move_kv(req)
    }
    fn health(&self, req: HealthWorkerMsg) -> impl Future<Output = CommandResult<i64>> + Send {
        (**self).health(req)
    }
    fn check_finish(
        &self,
        req: CheckFinishWorkerMsg,
    ) -> impl Future<Output = CommandResult<String>> + Send {
        (**self).check_finish(req)
    }
}
