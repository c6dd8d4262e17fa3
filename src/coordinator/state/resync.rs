//! Startup resync: wait for the first MP server to register, then page its
//! `GET /cache/objects?tier=l2&page_size=N[&page_token=…]` and seed the usage and LRU
//! trackers with what is already resident in L2 (keys the event stream has already reported
//! are left alone: events are fresher). Best effort: the first error ends it, logged and
//! counted; the page count is bounded by the tracked-key limit.
//!
//! Only the S3 adapter implements listing in LMCache 0.5.6; other adapters answer 503, which
//! ends the resync as a (counted) failure.

use super::driver::Handle;
use super::outbound;
use crate::coordinator::model::keys::EncodedKey;
use serde::Deserialize;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Startup-resync settings.
#[derive(Clone, Debug, PartialEq)]
pub struct ResyncConfig {
    /// Between registration checks while waiting for a server.
    pub poll_interval: Duration,
    /// How long to wait for a server before giving up.
    pub max_wait: Duration,
    /// `page_size` sent to the server (it clamps to its own ceiling).
    pub page_size: usize,
}

#[derive(Deserialize)]
struct Page {
    /// The adapter listed (its `type_name`, the events' `backend`).
    #[serde(default)]
    adapter: Option<String>,
    /// A fleet-shared adapter.
    #[serde(default)]
    shared: bool,
    #[serde(default)]
    entries: Vec<PageEntry>,
    #[serde(default)]
    next_page_token: Option<String>,
}

#[derive(Deserialize)]
struct PageEntry {
    key: EncodedKey,
    #[serde(default)]
    size_bytes: u64,
}

/// Percent-encodes a query value (everything but RFC 3986 unreserved characters).
fn encode_query(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Runs the resync; returns the number of keys seeded.
pub async fn run(
    handle: Handle,
    config: ResyncConfig,
    max_keys: usize,
    timeout: Duration,
    shutdown: CancellationToken,
) -> u64 {
    let stats = &handle.stats;
    let deadline = tokio::time::Instant::now() + config.max_wait;
    let target = loop {
        let pick = rand::random::<u64>();
        match handle
            .fleet(move |f, _, _| {
                f.pick(pick)
                    .map(|i| (i.instance_id.clone(), i.ip.clone(), i.http_port))
            })
            .await
        {
            Err(_) => return 0,
            Ok(Some(t)) => break t,
            Ok(None) if tokio::time::Instant::now() >= deadline => {
                tracing::warn!(
                    "startup resync: no MP server registered within {:?}; starting empty",
                    config.max_wait
                );
                stats.resync_failed.fetch_add(1, Ordering::Relaxed);
                return 0;
            }
            Ok(None) => {}
        }
        tokio::select! {
            () = shutdown.cancelled() => return 0,
            () = tokio::time::sleep(config.poll_interval) => {}
        }
    };
    let (id, ip, port) = target;
    let max_pages = max_keys / config.page_size.max(1) + 1;
    let mut token: Option<String> = None;
    let mut seeded = 0u64;
    for _ in 0..max_pages {
        let mut path = format!("/cache/objects?tier=l2&page_size={}", config.page_size);
        if let Some(t) = &token {
            path.push_str("&page_token=");
            path.push_str(&encode_query(t));
        }
        let reply = tokio::select! {
            () = shutdown.cancelled() => return seeded,
            r = outbound::MP.call(&ip, port, "GET", &path, None, timeout) => r,
        };
        let page = match reply {
            Ok(r) if r.status == 200 => {
                serde_json::from_slice::<Page>(&r.body).map_err(|e| e.to_string())
            }
            Ok(r) => Err(format!(
                "status {}: {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            )),
            Err(e) => Err(e.to_string()),
        };
        let page = match page {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(instance_id = %id, "startup resync stopped: {e}");
                stats.resync_failed.fetch_add(1, Ordering::Relaxed);
                return seeded;
            }
        };
        stats.resync_pages.fetch_add(1, Ordering::Relaxed);
        let entries: Vec<(EncodedKey, u64)> = page
            .entries
            .into_iter()
            .map(|e| (e.key, e.size_bytes))
            .collect();
        // An adapter-less listing (the documented form) is the `default` backend, as the
        // documented events are.
        let backend = page.adapter.unwrap_or_else(|| "default".into());
        match handle.seed(id.clone(), backend, page.shared, entries).await {
            Ok(n) => seeded += n,
            Err(_) => return seeded,
        }
        match page.next_page_token {
            Some(t) if !t.is_empty() => token = Some(t),
            _ => {
                tracing::info!(instance_id = %id, keys = seeded, "startup resync done");
                stats.resync_keys.fetch_add(seeded, Ordering::Relaxed);
                return seeded;
            }
        }
    }
    tracing::warn!(instance_id = %id, "startup resync stopped after {max_pages} pages");
    stats.resync_keys.fetch_add(seeded, Ordering::Relaxed);
    seeded
}

#[cfg(test)]
mod tests {
    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(super::encode_query("a b/c=d&e~f"), "a%20b%2Fc%3Dd%26e~f");
    }
}
