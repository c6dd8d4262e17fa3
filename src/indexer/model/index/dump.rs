//! The index as a value, for a read replica's snapshot (`--cluster`, docs/CLUSTER.md): the
//! streams, the namespaces and the record arena exactly as they are — records at their
//! positions, free slots and free lists included — so that a replica restoring it and applying
//! the ingester's later changes holds what the ingester holds: the TTL sweep's slices and
//! capacity eviction walk arena positions, which a rebuild from the blocks would not keep.
//! Not in it: the configuration (the restoring process's, which must give the same clock
//! tick) and the record tables' hash key (a restore builds the tables under its own).
//!
//! Must not: read clocks, do I/O.

use super::{Counters, Index, IndexConfig, LoraNs, NsKey, Stream, StreamSpec, MAX_STREAMS};
use crate::indexer::model::table::{Store, StoreDump};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// A namespace: tenant, model, LoRA (by name or id), block size, salt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct NsDump {
    tenant: String,
    model: String,
    lora_name: Option<String>,
    lora_id: i64,
    block_size: u32,
    salt: String,
}

/// A stream: its registration, blocks per tier, records.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct StreamDump {
    spec: StreamSpec,
    tier_blocks: [u64; 3],
    records: u64,
    /// For the stream of another medium: its name and the stream it belongs to.
    #[serde(default)]
    medium: Option<(String, u32)>,
}

/// An [`Index`] as a value (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IndexDump {
    store: StoreDump,
    streams: Vec<Option<StreamDump>>,
    free_streams: Vec<u32>,
    namespaces: Vec<Option<NsDump>>,
    free_ns: Vec<u32>,
    fresh_ns: Vec<u32>,
    counters: Counters,
    hand: u64,
}

impl IndexDump {
    /// `(holder, block)` memberships in it.
    pub fn memberships(&self) -> u64 {
        self.store.memberships()
    }
}

fn ns_dump(k: &NsKey) -> NsDump {
    let (lora_name, lora_id) = match &k.lora {
        LoraNs::Name(n) => (Some(n.clone()), 0),
        LoraNs::Id(i) => (None, *i),
    };
    NsDump {
        tenant: k.tenant.clone(),
        model: k.model.clone(),
        lora_name,
        lora_id,
        block_size: k.block_size,
        salt: k.salt.clone(),
    }
}

fn ns_key(d: NsDump) -> NsKey {
    NsKey {
        tenant: d.tenant,
        model: d.model,
        lora: d.lora_name.map_or(LoraNs::Id(d.lora_id), LoraNs::Name),
        block_size: d.block_size,
        salt: d.salt,
    }
}

impl Index {
    /// The index as a value (a full pass over the arena).
    pub fn dump(&self) -> IndexDump {
        IndexDump {
            store: self.store.dump(),
            streams: self
                .streams
                .iter()
                .map(|s| {
                    s.as_ref().map(|s| StreamDump {
                        spec: s.spec.clone(),
                        tier_blocks: s.tier_blocks,
                        records: s.records as u64,
                        medium: s.medium.map(|(n, o)| (n.as_str().to_owned(), o)),
                    })
                })
                .collect(),
            free_streams: self.free_streams.clone(),
            namespaces: self
                .ns_keys
                .iter()
                .map(|k| k.as_ref().map(ns_dump))
                .collect(),
            free_ns: self.free_ns.clone(),
            fresh_ns: self.fresh_ns.clone(),
            counters: self.counters,
            hand: self.hand as u64,
        }
    }

    /// An index of `config` holding `dump`.
    ///
    /// # Errors
    /// When `config` cannot hold it (more memberships than its limit, another clock tick:
    /// another TTL) or `dump` is not an index this build could have dumped.
    pub fn restore(config: IndexConfig, dump: IndexDump) -> Result<Index, String> {
        let mut index = Index::new(config);
        if dump.store.tick_secs() != tick_of(&index) {
            return Err(format!(
                "the snapshot's clock ticks every {} s, this index's every {} s (another --ttl)",
                dump.store.tick_secs(),
                tick_of(&index)
            ));
        }
        if dump.memberships() > index.config.max_memberships as u64 {
            return Err(format!(
                "{} memberships, over this index's limit of {}",
                dump.memberships(),
                index.config.max_memberships
            ));
        }
        // Lanes keep their stream and namespace once freed too; the slots never shrink.
        if dump.streams.len() > MAX_STREAMS
            || dump.store.lanes().any(|(s, ns)| {
                usize::from(s) >= dump.streams.len() || ns as usize >= dump.namespaces.len()
            })
        {
            return Err("a snapshot's lane names a stream or a namespace it lacks".into());
        }
        let in_range = |v: &[u32], n: usize| v.iter().all(|&i| (i as usize) < n);
        if !in_range(&dump.free_streams, dump.streams.len())
            || !in_range(&dump.free_ns, dump.namespaces.len())
            || !in_range(&dump.fresh_ns, dump.namespaces.len())
        {
            return Err("a snapshot's free list names a slot it lacks".into());
        }
        index.store = Store::restore(dump.store)?;
        index.streams = dump
            .streams
            .into_iter()
            .map(|s| {
                s.map(|s| Stream {
                    spec: s.spec,
                    tier_blocks: s.tier_blocks,
                    records: usize::try_from(s.records).unwrap_or(usize::MAX),
                    medium: s
                        .medium
                        .map(|(n, o)| (crate::indexer::model::events::MediumName::intern(&n), o)),
                    media: Vec::new(),
                })
            })
            .collect();
        // Each stream of another medium back in its owner's list.
        let owned: Vec<(u32, crate::indexer::model::events::MediumName, u32)> = index
            .streams
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref()?.medium.map(|(n, o)| (o, n, i as u32)))
            .collect();
        for (owner, name, stream) in owned {
            match index
                .streams
                .get_mut(owner as usize)
                .and_then(Option::as_mut)
            {
                Some(o) => o.media.push((name, stream)),
                None => return Err("a snapshot's medium stream names no owner".into()),
            }
        }
        index.free_streams = dump.free_streams;
        index.ns_keys = dump.namespaces.into_iter().map(|k| k.map(ns_key)).collect();
        index.ns_ids = index
            .ns_keys
            .iter()
            .enumerate()
            .filter_map(|(i, k)| Some((k.clone()?, i as u32)))
            .collect::<HashMap<_, _>>();
        index.free_ns = dump.free_ns;
        index.fresh_ns = dump.fresh_ns;
        index.counters = dump.counters;
        index.hand = usize::try_from(dump.hand).unwrap_or(0);
        Ok(index)
    }
}

/// The seconds of one tick of `index`'s store clock.
fn tick_of(index: &Index) -> u32 {
    index.store.tick_secs()
}
