//! The operator-set state — quotas, the default quota, pins — as one document: what
//! `--metadata-path` keeps ([`crate::coordinator::state::metadata`] reads and writes the
//! file), what a cluster's leader logs as a whole and what a model dump holds. Pure data.

use super::keys::EncodedKey;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The document's format version.
pub(crate) const VERSION: u32 = 1;

/// One pinned key and its count.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinRow {
    /// The key (object group 0).
    pub key: EncodedKey,
    /// Active pins (≥ 1).
    pub pin_count: u64,
}

/// The document (the `--metadata-path` file's content).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// [`VERSION`].
    pub version: u32,
    /// Wall-clock time of the save, epoch seconds.
    pub saved_at: f64,
    /// Explicit quotas in bytes, by salt.
    pub quotas: BTreeMap<String, u64>,
    /// The limit of salts without a quota in bytes; `null`: exempt.
    pub default_limit_bytes: Option<u64>,
    /// Pinned keys in first-pinned order.
    pub pins: Vec<PinRow>,
}
