//! The generations of LMCache's controller wire, named by the releases that speak them, and how
//! a worker's generation is told from what it sends.
//!
//! Every message of every generation decodes into the one [`super::Msg`] union (older fields
//! are optional or aliased there); this module only names the generation and what it implies
//! for the answers. It holds no state and sends nothing: the controller records a worker's
//! generation at registration and answers by it.
//!
//! What changed, from each release's `lmcache/v1/cache_controller/message.py` and `worker.py`:
//! - 0.3.1–0.3.2: chunk keys were strings and commands carried location lists: not spoken
//!   (their admits are refused as `invalid KVAdmitMsg`).
//! - 0.3.3: integer keys, `RegisterMsg.distributed_url`, the `*WorkerMsg` commands with
//!   `worker_event_id` and their `num_tokens` answers (0.3.4: `HealthWorkerRetMsg.error_code`,
//!   decompress; 0.3.5: `HeartbeatMsg`, a `RegisterMsg` subclass; 0.3.7: `BatchedP2PLookupMsg`).
//!   Registration and heartbeats are pushed on PULL and read no reply; one `KVAdmitMsg` or
//!   `KVEvictMsg` per operation, without a sequence number.
//! - 0.3.10: `peer_init_url` (optional) replaces `distributed_url`; `BatchedKVOperationMsg`
//!   with per-location sequence numbers replaces the single messages. Still pushed, no reply.
//! - 0.3.12: registration and heartbeats become requests on the ROUTER sockets, answered by
//!   `RegisterRetMsg` (`heartbeat_url`) and `HeartbeatRetMsg` (commands, e.g. `full_sync`);
//!   the full-sync messages appear; `ErrorMsg` becomes a request answer. 0.3.12 through 0.5.6
//!   share this wire byte for byte.

use serde::{Deserialize, Serialize};

/// A controller-wire generation, labelled by the LMCache releases that speak it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Wire {
    /// LMCache 0.3.3–0.3.9: pushed registration with `distributed_url`, one message per op.
    #[serde(rename = "0.3.3-0.3.9")]
    Pushed,
    /// LMCache 0.3.10–0.3.11: pushed registration with `peer_init_url`, batched ops.
    #[serde(rename = "0.3.10-0.3.11")]
    PushedBatched,
    /// LMCache 0.3.12–0.5.6: registration and heartbeats as requests, full sync.
    #[default]
    #[serde(rename = "0.3.12-0.5.6")]
    Requests,
}

impl Wire {
    /// Every generation, oldest first.
    pub const ALL: [Wire; 3] = [Wire::Pushed, Wire::PushedBatched, Wire::Requests];

    /// The label (`/controller/workers`' `protocol`, metrics, the dashboard).
    pub fn label(self) -> &'static str {
        match self {
            Wire::Pushed => "0.3.3-0.3.9",
            Wire::PushedBatched => "0.3.10-0.3.11",
            Wire::Requests => "0.3.12-0.5.6",
        }
    }

    /// The generation of a worker whose registration or heartbeat came on the PULL socket:
    /// `distributed_url` names the oldest one.
    pub fn of_pushed(has_distributed_url: bool) -> Wire {
        if has_distributed_url {
            Wire::Pushed
        } else {
            Wire::PushedBatched
        }
    }

    /// Whether the worker's admits and evicts carry sequence numbers to check.
    pub fn numbers_ops(self) -> bool {
        self != Wire::Pushed
    }

    /// Whether the worker reads heartbeat answers, so a `full_sync` command can reach it.
    pub fn reads_commands(self) -> bool {
        self == Wire::Requests
    }
}

#[cfg(test)]
mod tests {
    use super::Wire;

    #[test]
    fn labels_are_their_serde_names_and_only_the_request_wire_syncs() {
        for wire in Wire::ALL {
            let json = serde_json::to_string(&wire).expect("serialises");
            assert_eq!(json, format!("\"{}\"", wire.label()));
            let back: Wire = serde_json::from_str(&json).expect("parses");
            assert_eq!(back, wire);
        }
        assert_eq!(Wire::of_pushed(true), Wire::Pushed);
        assert_eq!(Wire::of_pushed(false), Wire::PushedBatched);
        assert!(!Wire::Pushed.numbers_ops() && Wire::PushedBatched.numbers_ops());
        assert!(!Wire::PushedBatched.reads_commands() && Wire::Requests.reads_commands());
    }
}
