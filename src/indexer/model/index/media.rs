//! Media outside the three tiers (NPU, 3FS, NFS, …): each registered stream keeps its blocks on
//! such a medium in a stream of its own, made on first use, with the owner's registration; the
//! records hold them as that stream's GPU tier. A query counts them for the owner's rank (or,
//! for a shared pool's, for every rank of its instance) and reports each medium under its own
//! name. Pure, as the rest of the index.
//!
//! Must not: let a medium's blocks into the owner's GPU, CPU or DISK numbers.

use super::{Index, KvEvent, Medium, StreamId};
use crate::indexer::model::events::MediumName;
use crate::indexer::model::table::RecId;

impl Index {
    /// The stream holding `id`'s blocks on `name`, made on first use; `None` when every
    /// stream id is in use (counted as a capacity refusal).
    fn medium_stream(&mut self, id: StreamId, name: MediumName) -> Option<StreamId> {
        let owner = self.stream(id)?;
        if let Some(&(_, s)) = owner.media.iter().find(|(n, _)| *n == name) {
            return Some(StreamId(s));
        }
        let spec = owner.spec.clone();
        let Some(sid) = self.add_stream(spec) else {
            self.counters.capacity_refused += 1;
            return None;
        };
        if let Some(s) = self
            .streams
            .get_mut(sid.0 as usize)
            .and_then(Option::as_mut)
        {
            s.medium = Some((name, id.0));
        }
        if let Some(o) = self.streams.get_mut(id.0 as usize).and_then(Option::as_mut) {
            o.media.push((name, sid.0));
        }
        Some(sid)
    }

    /// Applies an event naming another medium to that medium's stream of `id`, as its GPU
    /// tier; false when the event names none (GPU, CPU or DISK, or a clear of them all).
    pub(super) fn apply_other_medium(&mut self, id: StreamId, event: &KvEvent, now: u32) -> bool {
        let name = match event {
            KvEvent::Stored(s) => s.medium.other(),
            KvEvent::Removed(r) => r.medium.other(),
            KvEvent::Cleared(Some(m)) => m.other(),
            KvEvent::Cleared(None) => None,
        };
        let Some(name) = name else {
            return false;
        };
        if let KvEvent::Cleared(_) = event {
            let found = self
                .stream(id)
                .and_then(|s| s.media.iter().find(|(n, _)| *n == name).map(|m| m.1));
            if let Some(s) = found {
                self.clear_stream(StreamId(s), None);
            }
            return true;
        }
        let Some(target) = self.medium_stream(id, name) else {
            return true;
        };
        let mut event = event.clone();
        match &mut event {
            KvEvent::Stored(s) => s.medium = Medium::Gpu,
            KvEvent::Removed(r) => r.medium = Medium::Gpu,
            KvEvent::Cleared(_) => {}
        }
        self.apply(target, &event, now);
        true
    }

    /// The streams whose records a store on `st` may take a parent or a placeholder's block
    /// from: itself first, then its owner and the owner's other media.
    pub(super) fn related(&self, st: u16) -> Vec<u16> {
        let mut out = vec![st];
        let owner = self
            .streams
            .get(usize::from(st))
            .and_then(Option::as_ref)
            .and_then(|s| s.medium.map(|m| m.1))
            .unwrap_or(u32::from(st));
        if let Some(o) = self.streams.get(owner as usize).and_then(Option::as_ref) {
            for s in std::iter::once(owner).chain(o.media.iter().map(|m| m.1)) {
                if let Ok(s) = u16::try_from(s) {
                    if !out.contains(&s) {
                        out.push(s);
                    }
                }
            }
        }
        out
    }

    /// The record of `engine` in `st` or, failing that, in a related stream, and whether it
    /// is `st`'s own.
    pub(super) fn find_related(&self, st: u16, engine: u64) -> Option<(RecId, bool)> {
        if let Some(r) = self.store.find_engine(st, engine) {
            return Some((r, true));
        }
        self.related(st)
            .into_iter()
            .skip(1)
            .find_map(|s| self.store.find_engine(s, engine))
            .map(|r| (r, false))
    }

    /// The streams of `id`'s other media (cleared and removed with it).
    pub(super) fn media_of(&self, id: StreamId) -> Vec<StreamId> {
        self.stream(id)
            .map(|s| s.media.iter().map(|m| StreamId(m.1)).collect())
            .unwrap_or_default()
    }

    /// Blocks per other medium of a registered stream, for `/services`.
    pub fn stream_media(&self, id: StreamId) -> Vec<(&'static str, u64)> {
        self.stream(id)
            .map(|s| {
                s.media
                    .iter()
                    .map(|(name, m)| {
                        let blocks = self.stream(StreamId(*m)).map_or(0, |x| x.tier_blocks[0]);
                        (name.as_str(), blocks)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{scope, spec, BS};
    use super::super::{Index, IndexConfig, KvEvent, Medium, StreamId};
    use crate::indexer::model::events::{Removed, Stored};

    fn tokens(n_blocks: u32) -> Vec<u32> {
        (1..=n_blocks * BS).collect()
    }

    /// Blocks `from..to` of `tokens(to)` on `medium`, engine hashes `100 + i`, chained.
    fn stored(from: u32, to: u32, medium: &str) -> KvEvent {
        let all = tokens(to);
        KvEvent::Stored(Stored {
            hashes: (from..to).map(|i| 100 + u64::from(i)).collect(),
            parent: (from > 0).then(|| 100 + u64::from(from) - 1),
            tokens: all[(from * BS) as usize..].to_vec(),
            block_size: BS,
            medium: Medium::parse(medium).expect("a medium"),
            ..Stored::default()
        })
    }

    fn removed(i: u32, medium: &str) -> KvEvent {
        KvEvent::Removed(Removed {
            hashes: vec![100 + u64::from(i)],
            medium: Medium::parse(medium).expect("a medium"),
            group: None,
        })
    }

    fn row(index: &Index) -> super::super::InstanceMatch {
        let rows = index.query_tokens(&scope(), &tokens(4));
        rows.get("e").cloned().unwrap_or_default()
    }

    #[test]
    fn every_alias_maps_to_its_tier_and_other_names_are_kept() {
        for (name, tier) in [
            ("GPU", Medium::Gpu),
            ("cuda:1", Medium::Gpu),
            ("hbm", Medium::Gpu),
            ("CPU", Medium::Cpu),
            ("cpu", Medium::Cpu),
            ("CPU_PINNED", Medium::Cpu),
            ("STORAGE", Medium::Disk),
            ("disk", Medium::Disk),
            ("EXTERNAL", Medium::Disk),
        ] {
            assert_eq!(Medium::parse(name), Some(tier), "{name}");
        }
        for (name, kept) in [
            ("NPU", "NPU"),
            ("3fs", "3FS"),
            ("nfs", "NFS"),
            ("DFS", "DFS"),
        ] {
            let m = Medium::parse(name).expect("kept");
            assert_eq!(m.other().map(|n| n.as_str()), Some(kept), "{name}");
        }
        // The answer's own keys stay apart; a name of no letters or digits names nothing.
        assert_eq!(
            Medium::parse("dp")
                .and_then(Medium::other)
                .map(|n| n.as_str()),
            Some("OTHER")
        );
        assert_eq!(Medium::parse(" -- "), None);
        // Written by name, so another process reads the same medium.
        let json = serde_json::to_string(&Medium::parse("NPU")).expect("json");
        assert_eq!(json, r#"{"Other":"NPU"}"#);
        assert_eq!(
            serde_json::to_string(&Medium::Cpu).expect("json"),
            r#""Cpu""#
        );
        let back: Medium = serde_json::from_str(&json).expect("back");
        assert_eq!(Some(back), Medium::parse("npu"));
    }

    #[test]
    fn another_medium_is_reported_by_name_and_serves_its_rank() {
        let mut index = Index::new(IndexConfig::default());
        let e = index.add_stream(spec("e", 0)).expect("stream");
        index.apply(e, &stored(0, 2, "NPU"), 1);
        let r = row(&index);
        assert_eq!((r.gpu, r.cpu, r.disk), (0, 0, 0));
        assert_eq!(r.other.get("NPU"), Some(&(2 * u64::from(BS))));
        assert_eq!(r.dp.get(&0), Some(&(2 * u64::from(BS))));
        assert_eq!(r.longest_matched, 2 * u64::from(BS));
        // A child on 3FS of the NPU block: its parent is found on the other medium.
        index.apply(e, &stored(2, 3, "3FS"), 1);
        let r = row(&index);
        assert_eq!(r.other.get("3FS"), Some(&0), "not a prefix on 3FS alone");
        assert_eq!(r.longest_matched, 3 * u64::from(BS));
        assert_eq!(index.stream_media(e), vec![("NPU", 2), ("3FS", 1)]);
        // A removal on NPU leaves the GPU-less prefix at one block.
        index.apply(e, &removed(1, "npu"), 1);
        let r = row(&index);
        assert_eq!(r.other.get("NPU"), Some(&u64::from(BS)));
        assert_eq!(r.longest_matched, u64::from(BS));
        // GPU numbers never include another medium's blocks.
        index.apply(e, &stored(0, 1, "GPU"), 1);
        assert_eq!(row(&index).gpu, u64::from(BS));
        // A clear of one medium clears only it; a full clear clears every medium.
        index.apply(e, &KvEvent::Cleared(Medium::parse("3FS")), 1);
        assert_eq!(index.stream_media(e), vec![("NPU", 1), ("3FS", 0)]);
        index.clear_stream(e, None);
        let r = row(&index);
        assert_eq!((r.longest_matched, r.gpu), (0, 0));
        assert_eq!(index.stream_media(e), vec![("NPU", 0), ("3FS", 0)]);
    }

    #[test]
    fn media_streams_go_with_their_owner_and_survive_a_snapshot() {
        let mut index = Index::new(IndexConfig::default());
        let e = index.add_stream(spec("e", 0)).expect("stream");
        index.apply(e, &stored(0, 2, "NPU"), 1);
        let restored = Index::restore(IndexConfig::default(), index.dump()).expect("restore");
        assert_eq!(row(&restored), row(&index));
        assert_eq!(restored.stream_media(e), vec![("NPU", 2)]);
        index.remove_stream(e);
        assert_eq!(index.records(), 0);
        // Both stream ids are free again: two new streams take them.
        let a = index.add_stream(spec("a", 0)).expect("stream");
        let b = index.add_stream(spec("b", 0)).expect("stream");
        let mut ids = vec![a, b];
        ids.sort();
        assert_eq!(ids, vec![StreamId(0), StreamId(1)]);
    }
}
