//! The router's pure state: no I/O, no clock (callers pass `now`), no randomness of its own
//! (callers pass the draw). Tested directly, without a runtime.
//!
//! [`score`] (the decision), [`accounting`] (predicted against delivered cached tokens),
//! [`slots`] (one engine's reservations as the replicas share them), [`sessions`] (the engine
//! each session went to last).

pub mod accounting;
pub mod score;
pub mod sessions;
pub mod slots;
