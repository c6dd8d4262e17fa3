//! The coordinator's calls to MP servers (eviction delete, prefetch submit and poll, the
//! startup resync's pages): the shared bounded client of [`crate::web::client`] — one request
//! per connection, a deadline over connect + write + read, a capped `Content-Length` reply
//! (chunked replies are refused, a 502 for the caller) — as `kvplane-coordinator`.

use std::time::Duration;

pub use crate::web::client::{ClientError as OutboundError, Reply, MAX_REPLY_BYTES};

/// Sends `method path` with an optional JSON body to `host:port`.
///
/// # Errors
/// [`OutboundError`] on connection failure, timeout or an unreadable reply.
pub async fn call(
    host: &str,
    port: u16,
    method: &str,
    path: &str,
    json: Option<&[u8]>,
    timeout: Duration,
) -> Result<Reply, OutboundError> {
    crate::web::client::call(
        host,
        port,
        method,
        path,
        json,
        timeout,
        "kvplane-coordinator",
    )
    .await
}
