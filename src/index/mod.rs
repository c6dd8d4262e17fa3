//! Index (being written).
