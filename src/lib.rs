//! kvplane (skeleton, filled in below)
pub mod index;
pub mod protocol;
pub mod transport;
