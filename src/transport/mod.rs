//! Transport (being written).
