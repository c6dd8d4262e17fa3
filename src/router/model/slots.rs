//! One engine's reservations as every router replica sees them (docs/ROUTER.md, "Replicas
//! that do not herd"): the value of the engine's entry in the cluster's compare-and-set
//! bucket, a list of reservations each with its replica, its deadline and the blocks its
//! request will add (a sample of its prompt's chained block hashes, [`sample`]). Pure: no clock (the
//! caller passes `now`), no I/O; the driver (`cluster.rs`) reads, changes and writes it back
//! only if nobody wrote it since.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// Most reservations one engine's entry holds (about 27 bytes each on NATS, plus up to
/// [`MAX_SAMPLES`] × 14 bytes of blocks); a reservation beyond is refused like a full engine
/// and counted.
pub(crate) const MAX_HELD: usize = 1024;

/// Every prefix length up to this many blocks is sampled ([`sample`]); beyond, powers of two.
pub(crate) const DENSE_BLOCKS: u32 = 16;

/// Most block samples one reservation carries: the first [`DENSE_BLOCKS`], the powers of two
/// after them up to 2^31, and the last.
pub(crate) const MAX_SAMPLES: usize = 16 + 27 + 1;

/// The prefixes of a prompt a reservation carries, as `(blocks, chained hash of those
/// blocks)`: every length up to [`DENSE_BLOCKS`], then every power of two, then the whole.
/// `hashes[i]` is the chained hash of the first `i + 1` blocks. A prompt sharing `k` blocks
/// with it is then seen to share exactly `k` up to 16 blocks or when it extends it whole,
/// else at least half of `k`.
pub(crate) fn sample(hashes: &[u64]) -> Vec<(u32, u64)> {
    let n = u32::try_from(hashes.len()).unwrap_or(u32::MAX);
    let mut out: Vec<(u32, u64)> = Vec::new();
    let mut k = 1u32;
    while k <= n {
        out.push((k, hashes[k as usize - 1]));
        k = if k < DENSE_BLOCKS {
            k + 1
        } else {
            k.saturating_mul(2)
        };
        if k == u32::MAX {
            break;
        }
    }
    if n > 0 && out.last().is_none_or(|(b, _)| *b != n) {
        out.push((n, hashes[n as usize - 1]));
    }
    debug_assert!(out.len() <= MAX_SAMPLES);
    out
}

/// Blocks of a prompt (`hashes`, chained) that `samples` show it shares.
pub(crate) fn shared_blocks(samples: &[(u32, u64)], hashes: &[u64]) -> u32 {
    samples
        .iter()
        .filter(|(b, h)| *b > 0 && hashes.get(*b as usize - 1) == Some(h))
        .map(|(b, _)| *b)
        .max()
        .unwrap_or(0)
}

/// One routed request's share of an engine, held by one replica until its answer ends or its
/// deadline passes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Held {
    /// Unique per reservation (random).
    pub id: u64,
    /// The replica that holds it (random per process).
    pub replica: u64,
    /// Wall clock, ms since the Unix epoch, after which it no longer counts.
    pub until_ms: u64,
    /// The blocks its request will add to the engine, [`sample`]d (empty: not shared, or a
    /// replica of an earlier version).
    #[serde(default)]
    pub blocks: Vec<(u32, u64)>,
}

/// Why a reservation was not added.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoSlot {
    /// The engine's slots are all held.
    Full,
    /// The entry already holds [`MAX_HELD`] reservations.
    TooMany,
}

/// One engine's reservations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Table {
    /// Live and expired reservations, oldest first.
    pub held: Vec<Held>,
}

impl Table {
    /// Reads an entry's value (empty: none held).
    ///
    /// # Errors
    /// Bytes that are not a table (another version's, or damaged).
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, String> {
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
    pub(crate) fn encode(&self) -> Bytes {
        Bytes::from(rmp_serde::to_vec(&self.held).unwrap_or_default())
    }

    /// Reservations that still count at `now`.
    pub(crate) fn live(&self, now_ms: u64) -> u64 {
        self.held.iter().filter(|h| h.until_ms > now_ms).count() as u64
    }

    /// Reservations of replicas other than `replica` that still count at `now`.
    pub(crate) fn others(&self, replica: u64, now_ms: u64) -> u64 {
        self.held
            .iter()
            .filter(|h| h.replica != replica && h.until_ms > now_ms)
            .count() as u64
    }

    /// The most blocks of a prompt (`hashes`, chained) that a reservation still counting at
    /// `now` will add.
    pub(crate) fn pending(&self, now_ms: u64, hashes: &[u64]) -> u32 {
        self.held
            .iter()
            .filter(|h| h.until_ms > now_ms)
            .map(|h| shared_blocks(&h.blocks, hashes))
            .max()
            .unwrap_or(0)
    }

    /// Drops the reservations whose deadline passed; how many.
    pub(crate) fn prune(&mut self, now_ms: u64) -> usize {
        let before = self.held.len();
        self.held.retain(|h| h.until_ms > now_ms);
        before - self.held.len()
    }

    /// Adds `held` unless `slots` (when set) are all taken by live reservations.
    ///
    /// # Errors
    /// [`NoSlot`]: full, or the entry is at [`MAX_HELD`].
    pub(crate) fn reserve(
        &mut self,
        held: Held,
        slots: Option<u64>,
        now_ms: u64,
    ) -> Result<(), NoSlot> {
        if slots.is_some_and(|s| self.live(now_ms) >= s) {
            return Err(NoSlot::Full);
        }
        if self.held.len() >= MAX_HELD {
            return Err(NoSlot::TooMany);
        }
        self.held.push(held);
        Ok(())
    }

    /// Removes the reservations named in `ids`; how many were there.
    pub(crate) fn release(&mut self, ids: &[u64]) -> usize {
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
            blocks: Vec::new(),
        }
    }

    #[test]
    fn a_reservation_shows_the_blocks_it_will_add() {
        let prompt: Vec<u64> = (1..=100).collect();
        let s = sample(&prompt);
        let lens: Vec<u32> = s.iter().map(|(b, _)| *b).collect();
        assert_eq!(lens[..16], (1..=16).collect::<Vec<u32>>()[..]);
        assert_eq!(lens[16..], [32, 64, 100]);
        assert!(s.len() <= MAX_SAMPLES);
        assert_eq!(sample(&[]), Vec::new());
        // The same prompt, one that extends it, and ones that share a part.
        assert_eq!(shared_blocks(&s, &prompt), 100);
        let longer: Vec<u64> = (1..=120).collect();
        assert_eq!(shared_blocks(&s, &longer), 100);
        // Chained: a prompt that differs from block `k` on differs in every hash after.
        let fork = |k: usize| -> Vec<u64> {
            (1..=100u64)
                .map(|i| if i > k as u64 { i + 1000 } else { i })
                .collect()
        };
        assert_eq!(shared_blocks(&s, &fork(10)), 10);
        assert_eq!(shared_blocks(&s, &fork(50)), 32);
        assert_eq!(shared_blocks(&s, &[7, 8]), 0);
        let mut t = Table::default();
        let mut h = held(1, 7, 100);
        h.blocks = s;
        t.reserve(h, None, 0).unwrap();
        assert_eq!(t.pending(50, &longer), 100);
        assert_eq!(t.pending(100, &longer), 0);
        // An entry of a replica that carried no blocks still reads.
        let old = rmp_serde::to_vec(&vec![(1u64, 2u64, 3u64)]).unwrap();
        assert_eq!(Table::decode(&old).unwrap().held[0].blocks, Vec::new());
    }

    #[test]
    fn the_last_slot_goes_once() {
        let mut t = Table::default();
        assert_eq!(t.reserve(held(1, 7, 100), Some(2), 10), Ok(()));
        assert_eq!(t.reserve(held(2, 8, 100), Some(2), 10), Ok(()));
        assert_eq!(t.reserve(held(3, 8, 100), Some(2), 10), Err(NoSlot::Full));
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
        assert_eq!(t.reserve(held(2, 7, 200), Some(1), 40), Err(NoSlot::Full));
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
            Err(NoSlot::TooMany)
        );
        let bytes = t.encode();
        assert!(bytes.len() <= 32 * MAX_HELD, "{}", bytes.len());
        assert_eq!(Table::decode(&bytes), Ok(t));
        assert_eq!(Table::decode(b""), Ok(Table::default()));
        assert!(Table::decode(b"\xc1").is_err());
    }
}
