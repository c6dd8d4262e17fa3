//! The router-facing KV indexer (`kvplane indexer`, issue 10): which engine instance holds the
//! longest prefix of a prompt, on which tier and which data-parallel rank.
//!
//! This module is the pure model: hashing ([`hash`]), event decoding ([`events`]), the prefix
//! index ([`index`]) and per-stream sequence tracking ([`seq`]). No I/O and no clock: time is
//! passed in. Sockets live in [`crate::transport`]; this module must not touch them.

pub mod events;
pub mod hash;
pub mod index;
mod msgpack;
pub mod seq;
mod table;
