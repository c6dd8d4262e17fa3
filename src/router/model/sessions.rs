//! Session affinity (docs/ROUTER.md, "Sessions"): which engine (its instance) served each
//! session last,
//! bounded in entries and age. Pure: the caller passes the time; no I/O.
//!
//! Must not: grow past its bound (a new session beyond it is not remembered, counted), or
//! keep a session past its TTL.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Sessions remembered at most.
pub(crate) const MAX_SESSIONS: usize = 100_000;

/// Longest session id kept (a longer one is not a session, counted).
pub(crate) const MAX_SESSION_ID: usize = 256;

/// The engine each session went to last.
#[derive(Debug)]
pub struct Sessions {
    last: HashMap<String, (String, Instant)>,
    ttl: Duration,
    max: usize,
    swept: Option<Instant>,
}

/// What remembering a session did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Noted {
    /// Remembered (new or updated).
    Kept,
    /// Not remembered: the table is full of live sessions.
    Full,
}

impl Sessions {
    /// An empty table keeping sessions `ttl` after their last request, at most `max`.
    pub fn new(ttl: Duration, max: usize) -> Self {
        Self {
            last: HashMap::new(),
            ttl,
            max,
            swept: None,
        }
    }

    /// The engine `id` went to last, unless that was more than the TTL ago.
    pub fn engine(&self, id: &str, now: Instant) -> Option<&str> {
        self.last
            .get(id)
            .filter(|(_, at)| now.saturating_duration_since(*at) <= self.ttl)
            .map(|(e, _)| e.as_str())
    }

    /// Remembers that `id` went to `engine` at `now`. When full, drops the expired sessions
    /// first (at most once a second).
    pub fn note(&mut self, id: &str, engine: &str, now: Instant) -> Noted {
        if let Some(slot) = self.last.get_mut(id) {
            engine.clone_into(&mut slot.0);
            slot.1 = now;
            return Noted::Kept;
        }
        if self.last.len() >= self.max {
            let due = self
                .swept
                .is_none_or(|t| now.saturating_duration_since(t) >= Duration::from_secs(1));
            if due {
                self.swept = Some(now);
                let ttl = self.ttl;
                self.last
                    .retain(|_, (_, at)| now.saturating_duration_since(*at) <= ttl);
            }
            if self.last.len() >= self.max {
                return Noted::Full;
            }
        }
        self.last.insert(id.to_owned(), (engine.to_owned(), now));
        Noted::Kept
    }

    /// Sessions remembered (live or not yet swept).
    pub fn len(&self) -> usize {
        self.last.len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_expire_and_are_bounded() {
        let t0 = Instant::now();
        let mut s = Sessions::new(Duration::from_secs(10), 2);
        assert_eq!(s.note("a", "e1", t0), Noted::Kept);
        assert_eq!(s.engine("a", t0 + Duration::from_secs(5)), Some("e1"));
        assert_eq!(s.engine("a", t0 + Duration::from_secs(11)), None);
        assert_eq!(s.note("b", "e0", t0), Noted::Kept);
        // Full of live sessions: a third is not remembered, an update is.
        assert_eq!(s.note("c", "e2", t0 + Duration::from_secs(1)), Noted::Full);
        assert_eq!(s.note("a", "e2", t0 + Duration::from_secs(1)), Noted::Kept);
        assert_eq!(s.engine("a", t0 + Duration::from_secs(2)), Some("e2"));
        // Once b expired, the sweep makes room.
        assert_eq!(s.note("c", "e2", t0 + Duration::from_secs(11)), Noted::Kept);
        assert_eq!(s.len(), 2);
        assert_eq!(s.engine("b", t0 + Duration::from_secs(11)), None);
    }
}
