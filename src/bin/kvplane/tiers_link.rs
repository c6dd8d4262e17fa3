//! `kvplane serve --indexer-port … --coordinator-port …`: the coordinator's applied batches
//! feed the indexer of the same process (docs/INDEXER.md, "LMCache tiers"). The one place
//! that knows both services: it turns the coordinator's batches (L1/L2 stores and deletes
//! with their keys and the stored chunks' token ids) into the indexer's `TierBatch`es, in
//! apply order, on the coordinator's key owner task (the indexer takes its locks briefly).

use kvplane::coordinator::model::events::{Batch, Op as CoordOp, Tier as CoordTier};
use kvplane::coordinator::state::tap::{Tap, TapEvent};
use kvplane::indexer::tiers::{ChunkKey, Op, Tier, TierBatch};
use kvplane::indexer::IndexerState;
use std::collections::HashMap;
use std::sync::Arc;

/// The tap feeding `state`.
pub(crate) fn tap(state: Arc<IndexerState>) -> Tap {
    Tap(Arc::new(move |event| match event {
        TapEvent::Applied(b) => {
            let batches = tier_batches(b);
            if !batches.is_empty() {
                state.apply_tier_batches(&batches);
            }
        }
        TapEvent::Left(id) => state.tier_server_left(id),
    }))
}

/// A coordinator batch as the indexer's batches: one per run of stores or deletes (reads
/// change no placement and are left out).
fn tier_batches(b: &Batch) -> Vec<TierBatch> {
    let tier = match b.tier {
        CoordTier::L1 => Tier::L1,
        CoordTier::L2 => Tier::L2,
    };
    let tokens: HashMap<&str, &kvplane::coordinator::model::tokens::ChunkTokens> = b
        .tokens
        .iter()
        .map(|t| (t.chunk_hash_hex.as_str(), t))
        .collect();
    let mut out: Vec<TierBatch> = Vec::new();
    for op in &b.ops {
        let (kind, key) = match op {
            CoordOp::Store(k, _) => (Op::Store, k),
            CoordOp::Delete(k) => (Op::Delete, k),
            CoordOp::Access(_) => continue,
        };
        let (Some(hash), Ok(kv_rank), Ok(group)) = (
            hex(&key.chunk_hash_hex),
            u32::try_from(key.kv_rank),
            u32::try_from(key.object_group_id),
        ) else {
            continue;
        };
        let bound = tokens.get(key.chunk_hash_hex.to_ascii_lowercase().as_str());
        let chunk = ChunkKey {
            hash,
            kv_rank,
            group,
            salt: key.cache_salt.clone(),
            tokens: bound.map(|t| t.token_ids.clone()),
            offset: bound.map_or(-1, |t| t.token_offset),
        };
        match out.last_mut() {
            Some(last) if last.op == kind => last.keys.push(chunk),
            _ => out.push(TierBatch {
                server: b.instance_id.clone(),
                incarnation: b.incarnation,
                tier,
                op: kind,
                keys: vec![chunk],
            }),
        }
    }
    out
}

fn hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}
