//! One engine's reservations as every router replica sees them (docs/ROUTER.md, "Replicas
//! that do not herd"): the value of the engine's entry in the cluster's compare-and-set
//! bucket, a list of reservations each with its replica and deadline. Pure: no clock (the
//! caller passes `now`), no I/O; the driver (`shared.rs`) reads, changes and writes it back
//! only if nobody wrote it since.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// Most reservations one engine's entry holds (about 27 bytes each on NATS); a reservation
/// beyond is refused like a full engine and counted.
pub const MAX_HELD: usize = 1024;

/// One routed request's share of an engine, held by one replica until its answer ends or its
/// deadline passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// Unique per reservation (random).
    pub id: u64,
    /// The replica that holds it (random per process).
    pub replica: u64,
    /// Wall clock, ms since the Unix epoch, after which it no longer counts.
    pub until_ms: u64,
}

/// Why a reservation was not added.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The engine's slots are all held.
    Full,
    /// The entry already holds [`MAX_HELD`] reservations.
    TooMany,
}

/// One engine's reservations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    /// Live and expired reservations, oldest first.
    pub held: Vec<Held>,
}

impl Table {
    /// Reads an entry's value (empty: none held).
    ///
    /// # Errors
    /// Bytes that are not a table (another version's, or damaged).
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.is_empty() {
            return Ok(Self::default());
        }
        let held: Vec<Held> = rmp_serde::from_slice(bytes).map_err(|e| e.to_string())?;
        if held.len() > MAX_HELD {
            return Err(format!("{} reservations, more than {MAX_HELD}", held.len()));
        }
        Ok(Self { held })
    }

    /// The entry's value.
    pub fn encode(&self) -> Bytes {
        Bytes::from(rmp_serde::to_vec(&self.held).unwrap_or_default())
    }

    /// Reservations that still count at `now`.
    pub fn live(&self, now_ms: u64) -> u64 {
        self.held.iter().filter(|h| h.until_ms > now_ms).count() as u64
    }

    /// Reservations of replicas other than `replica` that still count at `now`.
    pub fn others(&self, replica: u64, now_ms: u64) -> u64 {
        self.held
            .iter()
            .filter(|h| h.replica != replica && h.until_ms > now_ms)
            .count() as u64
    }

    /// Drops the reservations whose deadline passed; how many.
    pub fn prune(&mut self, now_ms: u64) -> usize {
        let before = self.held.len();
        self.held.retain(|h| h.until_ms > now_ms);
        before - self.held.len()
    }

    /// Adds `held` unless `slots` (when set) are all taken by live reservations.
    ///
    /// # Errors
    /// [`Refused`]: full, or the entry is at [`MAX_HELD`].
    pub fn reserve(&mut self, held: Held, slots: Option<u64>, now_ms: u64) -> Result<(), Refused> {
        if slots.is_some_and(|s| self.live(now_ms) >= s) {
            return Err(Refused::Full);
        }
        if self.held.len() >= MAX_HELD {
            return Err(Refused::TooMany);
        }
        self.held.push(held);
        Ok(())
    }

    /// Removes the reservations named in `ids`; how many were there.
    pub fn release(&mut self, ids: &[u64]) -> usize {
        let before = self.held.len();
        self.held.retain(|h| !ids.contains(&h.id));
        before - self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(id: u64, replica: u64, until_ms: u64) -> Held {
        Held {
            id,
            replica,
            until_ms,
        }
    }

    #[test]
    fn the_last_slot_goes_once() {
        let mut t = Table::default();
        assert_eq!(t.reserve(held(1, 7, 100), Some(2), 10), Ok(()));
        assert_eq!(t.reserve(held(2, 8, 100), Some(2), 10), Ok(()));
        assert_eq!(t.reserve(held(3, 8, 100), Some(2), 10), Err(Refused::Full));
        // Unlimited slots take it; a released one frees the slot.
        assert_eq!(t.release(&[1, 9]), 1);
        assert_eq!(t.reserve(held(3, 8, 100), Some(2), 10), Ok(()));
        assert_eq!(t.others(8, 10), 0);
        assert_eq!(t.others(7, 10), 2);
    }

    #[test]
    fn expired_reservations_stop_counting_and_are_pruned() {
        let mut t = Table::default();
        t.reserve(held(1, 7, 50), Some(1), 10).unwrap();
        assert_eq!(t.reserve(held(2, 7, 200), Some(1), 40), Err(Refused::Full));
        // Past its deadline the slot is free, though the entry still lists it.
        assert_eq!(t.live(60), 0);
        t.reserve(held(2, 7, 200), Some(1), 60).unwrap();
        assert_eq!(t.prune(60), 1);
        assert_eq!(t.held, vec![held(2, 7, 200)]);
    }

    #[test]
    fn entries_round_trip_and_are_bounded() {
        let mut t = Table::default();
        for i in 0..MAX_HELD as u64 {
            t.reserve(held(i, 1, u64::MAX), None, 0).unwrap();
        }
        assert_eq!(
            t.reserve(held(u64::MAX, 1, u64::MAX), None, 0),
            Err(Refused::TooMany)
        );
        let bytes = t.encode();
        assert!(bytes.len() <= 32 * MAX_HELD, "{}", bytes.len());
        assert_eq!(Table::decode(&bytes), Ok(t));
        assert_eq!(Table::decode(b""), Ok(Table::default()));
        assert!(Table::decode(b"\xc1").is_err());
    }
}
