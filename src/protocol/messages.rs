//! The 51 message types of the LMCache 0.5.6 `Msg` union (spec §1.8), declared once.
//!
//! Field order is declaration order, as msgspec writes it. Integer fields are `i64` (Python
//! `int`); chunk hashes are [`ChunkHash`]. Fields that have a default in LMCache carry
//! `#[serde(default)]`; `Optional[X]` fields without a default are required-but-nullable in
//! msgspec, and kvplane accepts them missing as `None` (tolerant decoding loses nothing).

use super::{ChunkHash, KVOpEvent, Wire};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

/// `dict[str, Any]` payloads (heartbeat command args) keep their key order.
pub type AnyMap = serde_json::Map<String, serde_json::Value>;

/// A command carried by `HeartbeatRetMsg.commands`, tagged by `command_type`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command_type")]
pub enum HeartbeatCommand {
    /// The base class itself (tag = class name), never sent by LMCache's controller.
    #[serde(rename = "HeartbeatCommand")]
    Base(CommandFields),
    /// `FullSyncCommand` (tag `full_sync`): the worker must run a full sync.
    #[serde(rename = "full_sync")]
    FullSync(CommandFields),
}

/// Fields shared by every heartbeat command.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CommandFields {
    /// Why the command was issued (`"worker_re_registered"`, `"sync_failed_retry"`, …).
    #[serde(default)]
    pub reason: Option<String>,
    /// Free-form arguments.
    #[serde(default)]
    pub args: Option<AnyMap>,
}

impl HeartbeatCommand {
    /// A `full_sync` command with the given reason and no args.
    pub fn full_sync(reason: &str) -> Self {
        HeartbeatCommand::FullSync(CommandFields {
            reason: Some(reason.to_owned()),
            args: None,
        })
    }
}

impl RegisterMsg {
    /// The peer address under either name (`peer_init_url`, or ≤ 0.3.9's `distributed_url`).
    pub fn peer_url(&self) -> Option<&str> {
        self.peer_init_url
            .as_deref()
            .or(self.distributed_url.as_deref())
    }

    /// The wire generation of a worker that pushed this registration on PULL.
    pub fn pushed_wire(&self) -> Wire {
        Wire::of_pushed(self.distributed_url.is_some())
    }
}

impl HeartbeatMsg {
    /// The peer address under either name (`peer_init_url`, or ≤ 0.3.9's `distributed_url`).
    pub fn peer_url(&self) -> Option<&str> {
        self.peer_init_url
            .as_deref()
            .or(self.distributed_url.as_deref())
    }

    /// The wire generation of a worker that pushed this heartbeat on PULL.
    pub fn pushed_wire(&self) -> Wire {
        Wire::of_pushed(self.distributed_url.is_some())
    }
}

/// One `WorkerInfo` record (an untagged dataclass on the wire).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// Instance id.
    pub instance_id: String,
    /// Worker id (TP rank).
    pub worker_id: i64,
    /// Address the worker's command socket listens on.
    pub ip: String,
    /// Port of the worker's command socket.
    pub port: i64,
    /// `host:port` peers use to fetch KV from this worker, if P2P is on.
    pub peer_init_url: Option<String>,
    /// Unix seconds.
    pub registration_time: f64,
    /// Unix seconds.
    pub last_heartbeat_time: f64,
}

/// A message body in some encoding, decodable into any concrete message type.
pub(crate) trait BodyDecoder {
    /// The decoder's error.
    type Error;
    /// Decodes the body as `T` (unknown keys, including `"type"`, are ignored).
    fn decode<T: serde::de::DeserializeOwned>(self) -> Result<T, Self::Error>;
}

fn default_true() -> Option<bool> {
    Some(true)
}

fn default_false() -> Option<bool> {
    Some(false)
}

/// Declares every message struct, the tagged [`Msg`] union and the tag list from one table.
macro_rules! messages {
    ($(
        $(#[$meta:meta])*
        $name:ident { $( $(#[$fmeta:meta])* $field:ident : $ty:ty ),* $(,)? }
    )*) => {
        $(
            $(#[$meta])*
            #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
            pub struct $name { $( $(#[$fmeta])* #[allow(missing_docs)] pub $field: $ty, )* }

            impl From<$name> for Msg {
                fn from(m: $name) -> Msg { Msg::$name(m) }
            }
        )*

        /// Every message LMCache 0.5.6 may put on a socket, tagged by `"type"` = class name.
        #[derive(Clone, Debug, PartialEq, Serialize)]
        #[serde(tag = "type")]
        #[allow(missing_docs)]
        pub enum Msg { $( $name($name), )* }

        impl Msg {
            /// The `"type"` tag of this message (the LMCache class name).
            pub fn tag(&self) -> &'static str {
                match self { $( Msg::$name(_) => stringify!($name), )* }
            }
        }

        /// Every tag of the union, in spec order.
        pub const TAGS: &[&str] = &[ $( stringify!($name), )* ];

        /// Decodes the body of a message whose tag is already known; `None` for an unknown tag.
        pub(crate) fn decode_tagged<D: BodyDecoder>(tag: &str, body: D) -> Option<Result<Msg, D::Error>> {
            match tag {
                $( stringify!($name) => Some(body.decode::<$name>().map(Msg::$name)), )*
                _ => None,
            }
        }
    };
}

messages! {
    /// Worker → controller (ROUTER; LMCache ≤ 0.3.11 pushes it on PULL): join the fleet.
    /// LMCache ≤ 0.3.9 names the peer address `distributed_url` (see [`Wire`]); it is written
    /// back only when a decoded message held it (kvplane's own messages never do).
    RegisterMsg { instance_id: String, worker_id: i64, ip: String, port: i64, peer_init_url: Option<String>, #[serde(default, skip_serializing_if = "Option::is_none")] distributed_url: Option<String> }
    /// Controller → worker: registration accepted; `extra_config["heartbeat_url"]`.
    RegisterRetMsg { #[serde(default)] extra_config: IndexMap<String, String> }
    /// Worker → controller (PULL): leave the fleet.
    DeRegisterMsg { instance_id: String, worker_id: i64, ip: String, port: i64 }
    /// Legacy single admit (decoded, not applied by LMCache 0.5.6).
    KVAdmitMsg { instance_id: String, worker_id: i64, key: ChunkHash, location: String, #[serde(default)] seq_num: i64 }
    /// Legacy single evict (decoded, not applied by LMCache 0.5.6).
    KVEvictMsg { instance_id: String, worker_id: i64, key: ChunkHash, location: String, #[serde(default)] seq_num: i64 }
    /// Worker → controller (PULL): a batch of admits and evicts for one location.
    BatchedKVOperationMsg { instance_id: String, worker_id: i64, location: String, operations: Vec<KVOpEvent> }
    /// Controller → worker (REQ): clear a location.
    ClearWorkerMsg { worker_event_id: String, location: String }
    /// Worker → controller: tokens cleared.
    ClearWorkerRetMsg { num_tokens: i64 }
    /// Controller → worker: pin tokens.
    PinWorkerMsg { worker_event_id: String, location: String, tokens: Vec<i64> }
    /// Worker → controller: tokens pinned.
    PinWorkerRetMsg { num_tokens: i64 }
    /// Controller → worker: compress.
    CompressWorkerMsg { worker_event_id: String, method: String, location: String, #[serde(default)] tokens: Option<Vec<i64>> }
    /// Worker → controller: tokens compressed.
    CompressWorkerRetMsg { num_tokens: i64 }
    /// Controller → worker: decompress.
    DecompressWorkerMsg { worker_event_id: String, method: String, location: String, #[serde(default)] tokens: Option<Vec<i64>> }
    /// Worker → controller: tokens decompressed.
    DecompressWorkerRetMsg { num_tokens: i64 }
    /// Controller → worker: move KV to a peer (`new_position` = (peer_init_url, backend)).
    MoveWorkerMsg { worker_event_id: String, old_position: String, new_position: (String, String), #[serde(default)] tokens: Option<Vec<i64>>, #[serde(default = "default_true")] copy: Option<bool> }
    /// Worker → controller: tokens moved.
    MoveWorkerRetMsg { num_tokens: i64 }
    /// Controller → worker: health probe.
    HealthWorkerMsg { worker_event_id: String }
    /// Worker → controller: 0 healthy, -1 memcheck failed.
    HealthWorkerRetMsg { error_code: i64 }
    /// Controller → worker: is an event finished (not implemented by LMCache workers).
    CheckFinishWorkerMsg { worker_event_id: String }
    /// Worker → controller: event status.
    CheckFinishWorkerRetMsg { status: String }
    /// Orchestration: which instances hold these tokens.
    LookupMsg { event_id: String, tokens: Vec<i64> }
    /// Orchestration reply: instance → (location, end token).
    LookupRetMsg { event_id: String, layout_info: IndexMap<String, (String, i64)> }
    /// Orchestration: clear an instance's location.
    ClearMsg { event_id: String, instance_id: String, location: String }
    /// Orchestration reply.
    ClearRetMsg { event_id: String, num_tokens: i64 }
    /// Orchestration: pin tokens on an instance.
    PinMsg { event_id: String, instance_id: String, location: String, tokens: Vec<i64> }
    /// Orchestration reply.
    PinRetMsg { event_id: String, num_tokens: i64 }
    /// Orchestration: compress.
    CompressMsg { event_id: String, instance_id: String, method: String, location: String, #[serde(default)] tokens: Option<Vec<i64>> }
    /// Orchestration reply.
    CompressRetMsg { event_id: String, num_tokens: i64 }
    /// Orchestration: decompress.
    DecompressMsg { event_id: String, instance_id: String, method: String, location: String, #[serde(default)] tokens: Option<Vec<i64>> }
    /// Orchestration reply.
    DecompressRetMsg { event_id: String, num_tokens: i64 }
    /// Orchestration: move between (instance, location) positions.
    MoveMsg { event_id: String, old_position: (String, String), new_position: (String, String), #[serde(default)] tokens: Option<Vec<i64>>, #[serde(default = "default_false")] copy: Option<bool> }
    /// Orchestration reply.
    MoveRetMsg { event_id: String, num_tokens: i64 }
    /// Orchestration: health of an instance's workers.
    HealthMsg { event_id: String, instance_id: String }
    /// Orchestration reply: worker id → code.
    HealthRetMsg { event_id: String, error_codes: IndexMap<i64, i64> }
    /// Orchestration: status of an event.
    CheckFinishMsg { event_id: String }
    /// Orchestration reply.
    CheckFinishRetMsg { status: String }
    /// Any failure, as a reply.
    ErrorMsg { error: String }
    /// Orchestration: which instance has a worker at this ip.
    QueryInstMsg { event_id: String, ip: String }
    /// Orchestration reply.
    QueryInstRetMsg { event_id: String, instance_id: Option<String> }
    /// Worker → controller (heartbeat ROUTER; LMCache ≤ 0.3.11 pushes it on PULL, ≤ 0.3.9
    /// with `distributed_url`): I am alive.
    HeartbeatMsg { instance_id: String, worker_id: i64, ip: String, port: i64, peer_init_url: Option<String>, #[serde(default, skip_serializing_if = "Option::is_none")] distributed_url: Option<String> }
    /// Controller → worker: commands to run (e.g. `full_sync`).
    HeartbeatRetMsg { #[serde(default)] commands: Vec<HeartbeatCommand> }
    /// Worker → controller (ROUTER): who holds this prefix of chunk hashes?
    BatchedP2PLookupMsg { hashes: Vec<ChunkHash>, instance_id: String, worker_id: i64 }
    /// Controller → worker: a one-element list (instance, location, hit chunks, peer url).
    BatchedP2PLookupRetMsg { layout_info: Vec<(String, String, i64, String)> }
    /// Orchestration: worker infos of an instance (or `"all"`).
    QueryWorkerInfoMsg { event_id: String, instance_id: String, worker_ids: Option<Vec<i64>> }
    /// Orchestration reply.
    QueryWorkerInfoRetMsg { event_id: String, worker_infos: Vec<WorkerInfo> }
    /// Worker → controller (ROUTER): a full sync of one location begins.
    FullSyncStartMsg { instance_id: String, worker_id: i64, location: String, sync_id: String, total_keys: i64, batch_count: i64 }
    /// Controller → worker: accepted or not.
    FullSyncStartRetMsg { sync_id: String, accepted: bool, #[serde(default)] error_msg: Option<String> }
    /// Worker → controller (PULL): one batch of keys of a full sync.
    FullSyncBatchMsg { instance_id: String, worker_id: i64, location: String, sync_id: String, batch_id: i64, keys: Vec<ChunkHash> }
    /// Worker → controller (PULL): every batch was sent.
    FullSyncEndMsg { instance_id: String, worker_id: i64, location: String, sync_id: String, actual_total_keys: i64 }
    /// Worker → controller (ROUTER): how is my sync doing?
    FullSyncStatusMsg { instance_id: String, worker_id: i64, sync_id: String }
    /// Controller → worker: sync status and whether to leave freeze mode.
    FullSyncStatusRetMsg { sync_id: String, is_complete: bool, global_progress: f64, can_exit_freeze: bool, #[serde(default)] missing_batches: Vec<i64> }
}
