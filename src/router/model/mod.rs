//! The router's pure state: no I/O, no clock (callers pass `now`), no randomness of its own
//! (callers pass the draw). Tested directly, without a runtime.
//!
//! [`score`] (the decision), [`accounting`] (predicted against delivered cached tokens),
//! [`slots`] (one engine's reservations as the replicas share them), [`sessions`] (the engine
//! each session went to last), [`discovery`] (which registrations become engines), [`scrape`]
//! (an engine's Prometheus text read into its figures).

pub(crate) mod accounting;
pub(crate) mod discovery;
pub(crate) mod score;
pub(crate) mod scrape;
pub(crate) mod sessions;
pub(crate) mod slots;
