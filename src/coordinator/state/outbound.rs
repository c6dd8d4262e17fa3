//! The coordinator's calls to MP servers (eviction delete, prefetch submit and poll, the
//! startup resync's pages): the shared bounded client of [`crate::web::client`] — a deadline
//! over connect + write + read, a reply body capped whatever its framing (beyond it, a 502 for
//! the caller), at most one idle connection kept per MP server — as `kvplane-coordinator`.

use crate::web::client::Caller;
use crate::web::error::ApiError;
use serde_json::Value;
use std::time::Duration;

pub use crate::web::client::{ClientError as OutboundError, Reply, MAX_REPLY_BYTES};

/// Every call to an MP server, as `kvplane-coordinator`.
pub const MP: Caller = Caller("kvplane-coordinator");

/// Sends `method path` with `body` as JSON to an MP server at `host:port` and reads its 2xx
/// reply as JSON. A failure is the `ApiError` (a 502) that `failed` makes of its reason:
/// the connection's error, `status N: <reply>`, or `unreadable reply: <reply>`.
///
/// # Errors
/// A body that cannot be written (a 502 with serde's text), or `failed`'s error.
pub async fn call_json(
    host: &str,
    port: u16,
    (method, path): (&str, &str),
    body: &Value,
    timeout: Duration,
    failed: impl Fn(String) -> ApiError,
) -> Result<Value, ApiError> {
    let body = serde_json::to_vec(body).map_err(|e| ApiError::BadGateway(e.to_string()))?;
    let reply = MP
        .call(host, port, method, path, Some(&body), timeout)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let text = String::from_utf8_lossy(&reply.body);
    if !(200..300).contains(&reply.status) {
        return Err(failed(format!("status {}: {text}", reply.status)));
    }
    serde_json::from_slice(&reply.body).map_err(|_| failed(format!("unreadable reply: {text}")))
}
