//! Snapshots beside a service's change log: opaque bytes (a follower's whole state, with the
//! log position it holds), so that a follower starting later restores it and reads the log
//! from there, however much of the log's start the stream has dropped.
//!
//! Stream `KVPLANE_<cluster>_<service>_snap`, subjects `kvplane.<cluster>.<service>.snap.>`
//! (file storage, bounded like the log). A snapshot is published as parts of at most the
//! server's message size on `….snap.<id>`, then a marker naming the parts' stream sequences
//! on `….snap.latest`; the previous snapshot's parts are purged once the new marker is stored.
//! A reader takes the last marker and fetches its parts by sequence; a part missing or of the
//! wrong snapshot makes the snapshot unusable (the caller reads the log from its start).

use super::{Cluster, ClusterError};
use async_nats::jetstream::stream;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::future::IntoFuture;

/// The marker of one snapshot.
#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    id: u64,
    /// Stream sequences of the parts, in order.
    parts: Vec<u64>,
    bytes: u64,
}

impl Cluster {
    fn snap_subject(&self, service: &str, leaf: &str) -> String {
        format!("kvplane.{}.{service}.snap.{leaf}", self.config.name)
    }

    async fn snap_stream(&self, service: &str) -> Result<stream::Stream, ClusterError> {
        self.bounded_stream(
            format!("KVPLANE_{}_{service}_snap", self.config.name),
            format!("kvplane.{}.{service}.snap.>", self.config.name),
        )
        .await
    }

    async fn last_marker(&self, stream: &stream::Stream, service: &str) -> Option<Marker> {
        let subject = self.snap_subject(service, "latest");
        let get = stream.get_last_raw_message_by_subject(&subject);
        let m = tokio::time::timeout(self.config.timeout, get)
            .await
            .ok()?
            .ok()?;
        rmp_serde::from_slice(&m.payload).ok()
    }

    /// Publishes `data` as `service`'s latest snapshot (see the module docs).
    ///
    /// # Errors
    /// Larger than the stream keeps, or NATS did not take a part or the marker (the previous
    /// snapshot stays the latest).
    pub async fn publish_snapshot(&self, service: &str, data: &[u8]) -> Result<(), String> {
        if i64::try_from(data.len()).unwrap_or(i64::MAX) > self.config.max_bytes {
            // Its first parts would be discarded before the marker is stored.
            return Err(format!(
                "{} bytes, more than --cluster-max-bytes ({}) keeps",
                data.len(),
                self.config.max_bytes
            ));
        }
        let stream = self.snap_stream(service).await.map_err(|e| e.to_string())?;
        let previous = self.last_marker(&stream, service).await;
        let id: u64 = rand::random();
        let subject = self.snap_subject(service, &id.to_string());
        let part_bytes = self.max_message_bytes().max(4096);
        let mut parts = Vec::with_capacity(data.len() / part_bytes + 1);
        for chunk in data.chunks(part_bytes) {
            let seq = self
                .publish_to(subject.clone(), Bytes::copy_from_slice(chunk))
                .await
                .map_err(|e| format!("snapshot part: {e}"))?;
            parts.push(seq);
        }
        let marker = Marker {
            id,
            parts,
            bytes: data.len() as u64,
        };
        let payload = rmp_serde::to_vec(&marker).map_err(|e| e.to_string())?;
        self.publish_to(self.snap_subject(service, "latest"), Bytes::from(payload))
            .await
            .map_err(|e| format!("snapshot marker: {e}"))?;
        if let Some(old) = previous.filter(|m| m.id != id) {
            let purge = stream
                .purge()
                .filter(self.snap_subject(service, &old.id.to_string()))
                .into_future();
            if let Ok(Err(e)) = tokio::time::timeout(self.config.timeout, purge).await {
                tracing::debug!("purging the previous snapshot failed: {e}");
            }
        }
        Ok(())
    }

    /// The bytes of `service`'s latest snapshot; `None` when there is none or it is
    /// incomplete (parts dropped by the stream's limits).
    ///
    /// # Errors
    /// The snapshot stream cannot be set up.
    pub async fn load_snapshot(&self, service: &str) -> Result<Option<Vec<u8>>, ClusterError> {
        let stream = self.snap_stream(service).await?;
        let Some(marker) = self.last_marker(&stream, service).await else {
            return Ok(None);
        };
        let subject = self.snap_subject(service, &marker.id.to_string());
        let mut data = Vec::with_capacity(usize::try_from(marker.bytes).unwrap_or(0));
        for &seq in &marker.parts {
            let get = stream.get_raw_message(seq);
            let part = match tokio::time::timeout(self.config.timeout, get).await {
                Ok(Ok(m)) if m.subject.as_str() == subject => m,
                _ => {
                    tracing::warn!(
                        "snapshot {} of {service}: part at {seq} missing; not used",
                        marker.id
                    );
                    return Ok(None);
                }
            };
            data.extend_from_slice(&part.payload);
        }
        if data.len() as u64 != marker.bytes {
            return Ok(None);
        }
        Ok(Some(data))
    }
}
