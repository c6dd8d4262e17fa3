//! Snapshots of a coordinator standby's state (`--cluster`, docs/CLUSTER.md): the whole
//! `CoordinatorState` — fleet membership, event cursors, tracked keys in LRU order, usage per
//! instance and compartment, quotas, the default quota, pins, counters — as the body of the
//! replication core's snapshot, which adds the log position it reflects. A standby starting
//! after the stream dropped the log's start restores the latest snapshot and reads the log
//! from the message after it.
//!
//! The core dumps under the lock the follower applies records under, so state and position
//! match. Deterministic: maps are written in their order (fleet and salts in
//! insertion order, keys least recently used first, cursors and L1 fingerprints sorted), so
//! two replicas holding the same state dump the same bytes. Not kept: heartbeat instants (a
//! restored instance counts as seen at the restore, as at a takeover), the LRU ticks
//! themselves (renumbered in the same order) and the configuration (the restoring process's).
//! Pure data.

use crate::coordinator::model::fleet::InstancesDump;
use crate::coordinator::model::ModelDump;
use serde::{Deserialize, Serialize};

/// A standby's state as a value (`CoordinatorState`'s `Replicated::dump`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StateDump {
    /// Fleet membership.
    pub fleet: InstancesDump,
    /// The key model.
    pub model: ModelDump,
}
