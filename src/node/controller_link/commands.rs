//! The node's answers to a controller's commands, through `kvplane::worker` (docs/NODE.md,
//! "Controller commands"). A location names a tier (`LocalCPUBackend` = L1,
//! `LocalDiskBackend` = L2); tokens name keys as an LMCache worker's `lookup` does: the
//! builtin-hash chunk chain of the tokens (`--chunk-size`, `--lookup-none-hash`), matched
//! chunk by chunk from the first against the keys' chunk hashes, keys of this worker's TP
//! rank only.
//!
//! - `clear`: empties the tier, answering the tokens removed (`StorageManager.clear`).
//! - `pin`: holds the prefix's objects in the tier until released (`POST /unpin` on the
//!   node's HTTP port); answers the prefix's tokens, as LMCache's `lookup(pin=True)`.
//! - `move`: to this node's own `peer_init_url`, between its tiers; to another node's, the
//!   objects are PUT there over `lm://`. Unless `copy`, the source copies are removed.
//! - `compress` / `decompress`: re-encodes the objects in the tier (`lz4`);
//!   GET still returns the bytes that were PUT. Without tokens, every object of the tier.
//! - `health`: 0.

use super::peer::{Outgoing, PeerConn};
use super::{location, tier_of};
use crate::node::metrics::NodeMetrics;
use crate::node::model::compress::Codec;
use crate::node::model::keys::{key_rank, TokenChunks};
use crate::node::tiers::{decode, Resolved, TierId, TierSet, TieredStore};
use crate::protocol::{
    ClearWorkerMsg, CompressWorkerMsg, DecompressWorkerMsg, MoveWorkerMsg, PinWorkerMsg,
};
use crate::worker::{CommandError, CommandHandler, CommandResult};
use std::sync::Arc;
use std::time::Duration;

/// How the node maps tokens to keys, and where it is.
#[derive(Debug, Clone)]
pub(crate) struct CommandConfig {
    /// Token → chunk hashing.
    pub(crate) chunks: TokenChunks,
    /// This node's `peer_init_url` (its `lm://` address): a move there stays on the node.
    pub(crate) peer_url: String,
    /// Bound on each step of a move to a peer.
    pub(crate) peer_timeout: Duration,
}

/// The [`CommandHandler`] of one worker (one TP rank) of the node.
pub(crate) struct NodeCommands {
    pub(crate) tiers: Arc<TieredStore>,
    pub(crate) metrics: Arc<NodeMetrics>,
    pub(crate) config: Arc<CommandConfig>,
    /// The TP rank this worker answers for; `None`: every rank (one worker for the node).
    pub(crate) rank: Option<u32>,
}

fn tokens_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl NodeCommands {
    /// The tier of `loc`, or the controller's error.
    fn tier(&self, loc: &str) -> CommandResult<TierId> {
        match tier_of(loc) {
            Some(TierId::L2) if !self.tiers.has_l2() => Err(CommandError::new(format!(
                "location {loc}: this node has no L2 (--l2-path)"
            ))),
            Some(t) => Ok(t),
            None => Err(CommandError::new(format!(
                "unknown location {loc:?}: a node has {} and {}",
                location(TierId::L1),
                location(TierId::L2)
            ))),
        }
    }

    /// The keys of `tier` the token prefix names.
    fn resolve(&self, tier: TierId, tokens: &[i64]) -> Resolved {
        self.tiers
            .resolve(tier, &self.config.chunks.of(tokens), self.rank)
    }

    /// Every key of `tier` of this worker's rank, with the tokens they hold.
    fn everything(&self, tier: TierId) -> Resolved {
        let rank = self.rank;
        let keys = self
            .tiers
            .keys_in(tier, |k| rank.is_none_or(|r| key_rank(k) == Some(r)));
        let tokens = keys.iter().map(|(_, t)| u64::from(*t)).sum::<u64>();
        Resolved {
            keys: keys.into_iter().map(|(k, _)| k).collect(),
            tokens: usize::try_from(tokens).unwrap_or(usize::MAX),
        }
    }

    fn count(&self, command: &str, result: &CommandResult<i64>) {
        let outcome = if result.is_ok() { "ok" } else { "error" };
        self.metrics
            .controller_commands
            .with_label_values(&[command, outcome])
            .inc();
    }

    async fn recode(
        &self,
        command: &'static str,
        method: &str,
        loc: &str,
        tokens: Option<&[i64]>,
        decompress: bool,
    ) -> CommandResult<i64> {
        let codec = Codec::from_method(method).ok_or_else(|| {
            CommandError::new(format!(
                "unsupported {command} method {method:?}: a node has {}",
                Codec::METHODS
            ))
        })?;
        let tier = self.tier(loc)?;
        let found = match tokens {
            Some(t) if !t.is_empty() => self.resolve(tier, t),
            _ => self.everything(tier),
        };
        let target = if decompress { Codec::Raw } else { codec };
        let done = self.tiers.recode(tier, &found.keys, target).await;
        tracing::info!(
            command,
            location = loc,
            method,
            objects = done.len(),
            of = found.keys.len(),
            "re-encoded by the controller"
        );
        Ok(i64::try_from(found.tokens).unwrap_or(i64::MAX))
    }

    /// Sends `keys` of `from` to the peer at `url`; returns how many were sent.
    async fn send_to_peer(
        &self,
        url: &str,
        from: TierId,
        keys: &[String],
    ) -> CommandResult<Vec<String>> {
        let fail = |e: std::io::Error| CommandError::new(format!("move to peer {url}: {e}"));
        let mut conn = PeerConn::connect(url, self.config.peer_timeout)
            .await
            .map_err(fail)?;
        let mut sent = Vec::new();
        for key in keys {
            let Some(obj) = self.tiers.fetch(from, key).await else {
                continue;
            };
            let Ok(raw) = decode(obj).await else { continue };
            conn.put(&Outgoing {
                key: key.clone(),
                meta: raw.meta,
                data: raw.data,
            })
            .await
            .map_err(fail)?;
            sent.push(key.clone());
        }
        conn.confirm().await.map_err(fail)?;
        Ok(sent)
    }

    async fn move_inner(&self, req: MoveWorkerMsg) -> CommandResult<i64> {
        let from = self.tier(&req.old_position)?;
        let (url, to_loc) = &req.new_position;
        let copy = req.copy.unwrap_or(true);
        let tokens = req.tokens.unwrap_or_default();
        let found = self.resolve(from, &tokens);
        if found.keys.is_empty() {
            return Ok(0);
        }
        let err = |e: std::io::Error| CommandError::new(format!("move: {e}"));
        if *url == self.config.peer_url {
            let to = self.tier(to_loc)?;
            if to == from {
                return Err(CommandError::new(format!(
                    "move within {}: source and destination are the same tier",
                    req.old_position
                )));
            }
            self.tiers
                .move_between(from, to, &found.keys, copy)
                .await
                .map_err(err)?;
        } else {
            let sent = self.send_to_peer(url, from, &found.keys).await?;
            if !copy {
                self.tiers.remove_unread(from, &sent).await.map_err(err)?;
            }
        }
        Ok(i64::try_from(found.tokens).unwrap_or(i64::MAX))
    }
}

impl CommandHandler for NodeCommands {
    /// Removes every object of the tier (objects being read, L2 files still being written and
    /// pinned objects stay, as LMCache's clear skips objects it cannot evict); the removals
    /// reach the controller as evicts, like any other.
    async fn clear(&self, req: ClearWorkerMsg) -> CommandResult<i64> {
        let result = (|| {
            let tier = self.tier(&req.location)?;
            let which = TierSet {
                l1: tier == TierId::L1,
                l2: tier == TierId::L2,
            };
            let rank = self.rank;
            let removed = self.tiers.delete_in(which, false, |k| {
                rank.is_none_or(|r| key_rank(k) == Some(r))
            });
            tracing::info!(
                location = req.location,
                objects = removed.keys,
                tokens = removed.tokens,
                "cleared by the controller"
            );
            Ok(tokens_i64(removed.tokens))
        })();
        self.count("clear", &result);
        result
    }

    async fn pin(&self, req: PinWorkerMsg) -> CommandResult<i64> {
        let result = async {
            let tier = self.tier(&req.location)?;
            let found = self.resolve(tier, &req.tokens);
            self.tiers
                .hold(tier, &found.keys, true)
                .await
                .map_err(|e| CommandError::new(format!("pin: cannot record the pins: {e}")))?;
            Ok(i64::try_from(found.tokens).unwrap_or(i64::MAX))
        }
        .await;
        self.count("pin", &result);
        result
    }

    async fn compress(&self, req: CompressWorkerMsg) -> CommandResult<i64> {
        let result = self
            .recode(
                "compress",
                &req.method,
                &req.location,
                req.tokens.as_deref(),
                false,
            )
            .await;
        self.count("compress", &result);
        result
    }

    async fn decompress(&self, req: DecompressWorkerMsg) -> CommandResult<i64> {
        let result = self
            .recode(
                "decompress",
                &req.method,
                &req.location,
                req.tokens.as_deref(),
                true,
            )
            .await;
        self.count("decompress", &result);
        result
    }

    async fn move_kv(&self, req: MoveWorkerMsg) -> CommandResult<i64> {
        let result = self.move_inner(req).await;
        self.count("move", &result);
        result
    }
}
