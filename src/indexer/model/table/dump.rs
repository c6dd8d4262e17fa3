//! The membership store as a value, for a read replica's snapshot (`index_dump.rs` holds the
//! rest of the index): the arena exactly as it is, records at their positions and the free
//! list's links included; the tables are built again from it on restore.
//!
//! Must not: read clocks, do I/O.

use super::{idtable, Lane, Rec, Store, FREE, MAX_ID_BITS, MAX_LANES, MIN_ID_BITS, NIL};

/// A [`Store`] as a value, for a replica's snapshot: the arena (22 bytes a record, little
/// endian, in arena order, the free list's links included), the lanes and the counts. The two
/// tables are not in it: a restore builds them from the arena, under its own hash key.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct StoreDump {
    pub(super) recs: serde_bytes::ByteBuf,
    pub(super) free: u32,
    /// `(stream, namespace, records)` per lane.
    pub(super) lanes: Vec<(u16, u32, u32)>,
    pub(super) free_lanes: Vec<u32>,
    /// `(stream, namespace, lane)`, sorted.
    pub(super) lane_of: Vec<(u16, u32, u32)>,
    pub(super) ns_lanes: Vec<u32>,
    pub(super) emptied: Vec<u32>,
    pub(super) released_ns: Vec<u32>,
    pub(super) tick_secs: u32,
    pub(super) memberships: u64,
    pub(super) live: u64,
    pub(super) heads: u64,
}

/// Bytes of one record in a [`StoreDump`].
const REC_BYTES: usize = 22;

impl StoreDump {
    /// `(stream, namespace)` of every lane, for the index's checks.
    pub(crate) fn lanes(&self) -> impl Iterator<Item = (u16, u32)> + '_ {
        self.lanes.iter().map(|&(s, ns, _)| (s, ns))
    }

    /// The store's clock tick, in seconds.
    pub(crate) fn tick_secs(&self) -> u32 {
        self.tick_secs
    }

    /// Memberships held.
    pub(crate) fn memberships(&self) -> u64 {
        self.memberships
    }
}

impl Store {
    /// The store as a value (see [`StoreDump`]).
    pub(crate) fn dump(&self) -> StoreDump {
        let mut recs = Vec::with_capacity(self.recs.len() * REC_BYTES);
        for r in &self.recs {
            let Rec {
                seq,
                engine,
                meta,
                touched,
            } = *r;
            recs.extend_from_slice(&seq.to_le_bytes());
            recs.extend_from_slice(&engine.to_le_bytes());
            recs.extend_from_slice(&meta.to_le_bytes());
            recs.extend_from_slice(&touched.to_le_bytes());
        }
        let mut lane_of: Vec<_> = self
            .lane_of
            .iter()
            .map(|(&(s, ns), &l)| (s, ns, l))
            .collect();
        lane_of.sort_unstable();
        StoreDump {
            recs: serde_bytes::ByteBuf::from(recs),
            free: self.free,
            lanes: self
                .lanes
                .iter()
                .map(|l| (l.stream, l.ns, l.records))
                .collect(),
            free_lanes: self.free_lanes.clone(),
            lane_of,
            ns_lanes: self.ns_lanes.clone(),
            emptied: self.emptied.clone(),
            released_ns: self.released_ns.clone(),
            tick_secs: self.tick_secs,
            memberships: self.memberships as u64,
            live: self.live as u64,
            heads: self.heads as u64,
        }
    }

    /// The store `d` holds, its tables built from the arena; records sit where they sat, so
    /// the sweeps and capacity eviction walk them as the dumped store's would.
    ///
    /// # Errors
    /// When `d` is not a store this build could have dumped (a lane, a namespace or a free
    /// link out of range, an arena too large).
    pub(crate) fn restore(d: StoreDump) -> Result<Store, String> {
        if !d.recs.len().is_multiple_of(REC_BYTES) {
            return Err(format!("an arena of {} bytes", d.recs.len()));
        }
        let n = d.recs.len() / REC_BYTES;
        if n > idtable::max_id(MAX_ID_BITS) as usize + 1 || d.lanes.len() > MAX_LANES {
            return Err(format!("{n} records or {} lanes: too many", d.lanes.len()));
        }
        let recs: Vec<Rec> = d
            .recs
            .chunks_exact(REC_BYTES)
            .map(|b| {
                let u64_at =
                    |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
                Rec {
                    seq: u64_at(0),
                    engine: u64_at(8),
                    meta: u32::from_le_bytes(b[16..20].try_into().unwrap_or_default()),
                    touched: u16::from_le_bytes(b[20..22].try_into().unwrap_or_default()),
                }
            })
            .collect();
        let bad = |what: &str| Err(format!("a snapshot's store: {what} out of range"));
        if recs
            .iter()
            .any(|r| r.meta != FREE && r.lane() >= d.lanes.len())
        {
            return bad("a record's lane");
        }
        let lane_ok = |l: u32| (l as usize) < d.lanes.len();
        if !d.free_lanes.iter().chain(&d.emptied).copied().all(lane_ok)
            || !d.lane_of.iter().all(|&(_, _, l)| lane_ok(l))
            || d.lanes
                .iter()
                .any(|&(_, ns, _)| ns as usize >= d.ns_lanes.len())
        {
            return bad("a lane");
        }
        if d.released_ns
            .iter()
            .any(|&ns| ns as usize >= d.ns_lanes.len())
        {
            return bad("a namespace");
        }
        // The free list: every link in the arena, on a free record, no loop.
        let (mut at, mut steps) = (d.free, 0usize);
        while at != NIL {
            let Some(r) = recs.get(at as usize).filter(|r| r.meta == FREE) else {
                return bad("a free link");
            };
            steps += 1;
            if steps > n {
                return bad("the free list");
            }
            at = r.seq as u32;
        }
        let mut store = Store::new(d.tick_secs);
        store.recs = recs;
        store.free = d.free;
        store.lanes = d
            .lanes
            .into_iter()
            .map(|(stream, ns, records)| Lane {
                stream,
                ns,
                records,
            })
            .collect();
        store.free_lanes = d.free_lanes;
        store.lane_of = d
            .lane_of
            .into_iter()
            .map(|(s, ns, l)| ((s, ns), l))
            .collect();
        store.ns_lanes = d.ns_lanes;
        store.emptied = d.emptied;
        store.released_ns = d.released_ns;
        store.memberships = usize::try_from(d.memberships).unwrap_or(usize::MAX);
        store.live = usize::try_from(d.live).unwrap_or(usize::MAX);
        store.heads = usize::try_from(d.heads).unwrap_or(usize::MAX);
        store.rebuild(MIN_ID_BITS);
        Ok(store)
    }
}
