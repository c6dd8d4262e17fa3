//! The node's pure parts: no sockets, no files, no clock, no runtime. The `lm://` wire
//! format (`codec`), the eviction policy both tiers share (`lru`) and the `compress`
//! command's body codecs (`compress`).

pub mod codec;
pub(crate) mod compress;
pub(crate) mod keys;
pub(crate) mod lru;
pub(crate) mod prefetches;
