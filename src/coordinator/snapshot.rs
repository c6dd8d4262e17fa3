//! Snapshots of a coordinator standby's state (`--cluster`, docs/CLUSTER.md): the whole
//! [`Replica`] — fleet membership, event cursors, tracked keys in LRU order, usage per
//! instance and compartment, quotas, the default quota, pins, counters — with the log
//! [`Position`] it reflects. A standby starting after the stream dropped the log's start
//! restores the latest snapshot and reads the log from `position.stream_seq + 1`.
//!
//! The dump is taken under the lock the follower applies records under, so state and
//! position match. Deterministic: maps are written in their order (fleet and salts in
//! insertion order, keys least recently used first, cursors and L1 fingerprints sorted), so
//! two replicas holding the same state dump the same bytes. Not kept: heartbeat instants (a
//! restored instance counts as seen at the restore, as at a takeover), the LRU ticks
//! themselves (renumbered in the same order) and the configuration (the restoring process's).
//! Pure: no I/O, the caller passes the clock.

use super::changes::{Position, Replica};
use super::fleet::{Fleet, FleetDump};
use super::model::{Model, ModelConfig, ModelDump};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// A standby's state and its place in the log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The log position the state reflects.
    pub position: Position,
    /// Fleet membership.
    pub fleet: FleetDump,
    /// The key model.
    pub model: ModelDump,
}

impl Snapshot {
    /// `state` at `position` (the caller holds the lock both are changed under).
    pub fn of(state: &Replica, position: Position) -> Self {
        Snapshot {
            position,
            fleet: state.fleet.dump(),
            model: state.model.dump(),
        }
    }

    /// The bytes published (msgpack).
    pub fn encode(&self) -> Vec<u8> {
        // Every field is a plain value: the encoder cannot fail on it.
        rmp_serde::to_vec(self).unwrap_or_default()
    }

    /// A snapshot from published bytes.
    ///
    /// # Errors
    /// When the bytes are not a snapshot.
    pub fn decode(bytes: &[u8]) -> Result<Self, rmp_serde::decode::Error> {
        rmp_serde::from_slice(bytes)
    }

    /// The state it holds, within `config`'s limits; every instance counts as seen at `now`.
    ///
    /// # Errors
    /// When `config`'s limits cannot hold it (instances or keys).
    pub fn restore(self, config: ModelConfig, now: Instant) -> Result<Replica, String> {
        let fleet =
            Fleet::restore(config.max_instances, self.fleet, now).map_err(|e| e.to_string())?;
        let model = Model::restore(config, self.model)?;
        Ok(Replica { fleet, model })
    }
}
