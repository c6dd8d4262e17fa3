//! The router's pure state: no I/O, no clock (callers pass `now`), no randomness of its own
//! (callers pass the draw). Tested directly, without a runtime.
//!
//! [`score`] (the decision), [`accounting`] (predicted against delivered cached tokens),
//! [`slots`] (one engine's reservations as the replicas share them), [`sessions`] (the engine
//! each session went to last), [`discovery`] (which registrations become engines), [`scrape`]
//! (an engine's Prometheus text read into its figures).

pub mod accounting;
pub mod discovery;
pub mod score;
pub mod scrape;
pub mod sessions;
pub mod slots;
