//! The orchestration command log behind `/check_finish`: the last commands by event id,
//! their status, answer or failure.
//!
//! A plain value, changed only by the controller's driver under its state lock; it reads no
//! clock (callers pass `now`). `/health` calls (open to anyone) are kept in their own, smaller
//! ring, so they can never evict the records of real commands.

use std::collections::{HashMap, VecDeque};

/// How many orchestration commands (all but `health`) the log remembers.
pub(crate) const COMMAND_LOG_CAPACITY: usize = 10_000;

/// How many `health` calls the log remembers, apart from the other commands.
pub(crate) const HEALTH_LOG_CAPACITY: usize = 1_000;

/// The command whose records live in their own ring.
const HEALTH: &str = "health";

/// Where an orchestration command is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandStatus {
    /// Sent to the workers, answers outstanding.
    Pending,
    /// Every worker answered.
    Finished,
    /// A worker failed, timed out, or could not be reached.
    Failed,
}

impl CommandStatus {
    /// `"pending"`, `"finished"` or `"failed"`.
    pub fn as_str(self) -> &'static str {
        match self {
            CommandStatus::Pending => "pending",
            CommandStatus::Finished => "finished",
            CommandStatus::Failed => "failed",
        }
    }
}

/// One orchestration command, as `/check_finish` reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct CommandRecord {
    /// The command (`clear`, `pin`, `compress`, `decompress`, `move`, `health`).
    pub command: &'static str,
    /// The instance it addressed (the source instance for `move`).
    pub instance_id: String,
    /// Status.
    pub status: CommandStatus,
    /// When it was issued (Unix seconds).
    pub created: f64,
    /// When it finished or failed (Unix seconds).
    pub finished: Option<f64>,
    /// The answer returned to the caller, once finished.
    pub result: Option<serde_json::Value>,
    /// Why it failed.
    pub detail: Option<String>,
}

#[derive(Debug)]
struct CommandRing {
    capacity: usize,
    records: HashMap<String, CommandRecord>,
    order: VecDeque<String>,
}

impl CommandRing {
    fn new(capacity: usize) -> Self {
        CommandRing {
            capacity: capacity.max(1),
            records: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    fn insert(&mut self, event_id: &str, record: CommandRecord) {
        if self.records.insert(event_id.to_owned(), record).is_none() {
            self.order.push_back(event_id.to_owned());
        }
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.records.remove(&old);
            }
        }
    }
}

/// The last [`COMMAND_LOG_CAPACITY`] commands and [`HEALTH_LOG_CAPACITY`] health calls by
/// event id; the oldest of each is forgotten first, so memory stays bounded.
#[derive(Debug)]
pub struct CommandLog {
    commands: CommandRing,
    health: CommandRing,
}

impl Default for CommandLog {
    fn default() -> Self {
        Self::new(COMMAND_LOG_CAPACITY, HEALTH_LOG_CAPACITY)
    }
}

impl CommandLog {
    /// An empty log keeping at most `commands` commands and `health` health calls (each at
    /// least one).
    pub fn new(commands: usize, health: usize) -> Self {
        CommandLog {
            commands: CommandRing::new(commands),
            health: CommandRing::new(health),
        }
    }

    /// Records a new pending command issued at `now`, forgetting the oldest of its ring if
    /// that is full.
    pub fn begin(&mut self, event_id: &str, command: &'static str, instance_id: &str, now: f64) {
        let record = CommandRecord {
            command,
            instance_id: instance_id.to_owned(),
            status: CommandStatus::Pending,
            created: now,
            finished: None,
            result: None,
            detail: None,
        };
        let ring = if command == HEALTH {
            &mut self.health
        } else {
            &mut self.commands
        };
        ring.insert(event_id, record);
    }

    /// Marks a command finished at `now` with the answer given to the caller.
    pub fn finish(&mut self, event_id: &str, result: serde_json::Value, now: f64) {
        self.settle(event_id, CommandStatus::Finished, Some(result), None, now);
    }

    /// Marks a command failed at `now`.
    pub fn fail(&mut self, event_id: &str, detail: String, now: f64) {
        self.settle(event_id, CommandStatus::Failed, None, Some(detail), now);
    }

    fn settle(
        &mut self,
        event_id: &str,
        status: CommandStatus,
        result: Option<serde_json::Value>,
        detail: Option<String>,
        now: f64,
    ) {
        let record = match self.commands.records.get_mut(event_id) {
            Some(r) => Some(r),
            None => self.health.records.get_mut(event_id),
        };
        if let Some(r) = record {
            r.status = status;
            r.finished = Some(now);
            r.result = result;
            r.detail = detail;
        }
    }

    /// The record of a command, if it is still remembered.
    pub fn get(&self, event_id: &str) -> Option<&CommandRecord> {
        self.commands
            .records
            .get(event_id)
            .or_else(|| self.health.records.get(event_id))
    }

    /// Commands and health calls remembered.
    pub fn len(&self) -> usize {
        self.commands.order.len() + self.health.order.len()
    }

    /// Nothing remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_tracks_status() {
        let mut log = CommandLog::new(3, 2);
        for i in 0..5 {
            log.begin(&format!("ev{i}"), "clear", "inst", f64::from(i));
        }
        assert_eq!(log.len(), 3);
        assert!(log.get("ev0").is_none() && log.get("ev1").is_none());
        let r = log.get("ev2").expect("kept");
        assert_eq!((r.status, r.created), (CommandStatus::Pending, 2.0));
        log.finish("ev3", serde_json::json!({"num_tokens": 1}), 10.0);
        log.fail("ev4", "timeout".into(), 11.0);
        let r = log.get("ev3").expect("kept");
        assert_eq!(r.status, CommandStatus::Finished);
        assert_eq!(r.finished, Some(10.0));
        assert!(r.result.is_some());
        assert_eq!(
            log.get("ev4").map(|r| r.status),
            Some(CommandStatus::Failed)
        );
        log.fail("unknown", "ignored".into(), 12.0);
        assert_eq!(log.len(), 3);
    }

    #[test]
    fn health_calls_cannot_evict_commands() {
        let mut log = CommandLog::new(2, 2);
        log.begin("clear-1", "clear", "inst", 0.0);
        log.begin("pin-1", "pin", "inst", 0.0);
        for i in 0..1_000 {
            let id = format!("health-{i}");
            log.begin(&id, "health", "inst", 1.0);
            log.finish(&id, serde_json::json!({}), 1.0);
        }
        assert!(log.get("clear-1").is_some() && log.get("pin-1").is_some());
        assert_eq!(
            log.get("health-999").map(|r| r.status),
            Some(CommandStatus::Finished)
        );
        assert!(log.get("health-0").is_none());
        assert_eq!(log.len(), 4);
    }
}
