//! The tap: a hook that sees every batch the coordinator applies (after the sequence gate, in
//! apply order) and every server that leaves, so the process embedding the coordinator can
//! feed another service (`kvplane serve` feeds its indexer the MP servers' L1/L2 chunks).
//! Called on the key owner's task: it must not block (take a short lock, or queue).

use crate::coordinator::model::events::Batch;
use std::sync::Arc;

/// What the tap sees.
#[derive(Clone, Copy, Debug)]
pub enum TapEvent<'a> {
    /// A batch was applied.
    Applied(&'a Batch),
    /// A server left (timed out or deregistered): its memory tier is gone.
    Left(&'a str),
}

/// The hook (cheap to clone).
#[derive(Clone)]
pub struct Tap(pub Arc<dyn Fn(TapEvent<'_>) + Send + Sync>);

impl std::fmt::Debug for Tap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tap")
    }
}
