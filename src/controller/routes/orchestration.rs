//! The commands: `POST /clear /pin /compress /decompress /move /health`, and
//! `POST /check_finish` to follow them.
//!
//! Each command resolves the instance's workers (sorted by worker id, as LMCache's
//! `get_worker_ids`), sends every worker its `*WorkerMsg` over its downlink *concurrently*,
//! and waits for all answers; each downlink request is bounded by `--downlink-timeout`, so a
//! silent worker makes the call fail with 504 naming it instead of hanging (LMCache waits
//! forever). The fan-out runs in its own task, so a caller that disconnects does not leave the
//! command half-recorded: its status in the command log always ends `finished` or `failed`.
//!
//! Where kvplane answers differently from LMCache 0.5.6 (see `docs/API.md`):
//! * unknown instance: 404 (LMCache: 500), except `/health`, which keeps LMCache's 200 with
//!   empty `error_codes` because LMCache's dashboard uses it as a connectivity probe;
//! * workers disagreeing on `num_tokens` (LMCache: 500 from an assertion): 200 with the
//!   smallest value — what every rank of the instance covered — plus `num_tokens_by_worker`
//!   with each worker's own answer, and a warning in the log;
//! * a worker answering `ErrorMsg` or a wrong reply type: 502 naming it (LMCache: 500);
//! * `/move` to an instance without P2P: 409 (LMCache: 500);
//! * `/check_finish` works (LMCache: always 500).

use super::new_event_id;
use crate::controller::{Downlink, DownlinkError, Driver};
use crate::protocol::{
    ClearWorkerMsg, CompressWorkerMsg, DecompressWorkerMsg, HealthWorkerMsg, MoveWorkerMsg, Msg,
    PinWorkerMsg,
};
use crate::web::error::{ApiError, FailureKind, WorkerFailure, WorkersFailed};
use crate::web::json::Json as Valid;
use crate::web::schema::{Body, BodySpec, Field, FieldDefault, FieldType};
use axum::extract::State;
use axum::Json;
use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::future::Future;
use std::sync::Arc;
use tokio::task::JoinSet;

/// `/health` code: the worker answered `ErrorMsg` (LMCache's value).
pub const HEALTH_ERROR_REPLY: i64 = -1001;
/// `/health` code: the worker answered with another message type (LMCache's value).
pub const HEALTH_UNEXPECTED_REPLY: i64 = -1002;
/// `/health` code: the worker's answer could not be decoded (LMCache's value).
pub const HEALTH_UNDECODABLE: i64 = -1003;
/// `/health` code (kvplane): no answer within `--downlink-timeout` (the call is a 504).
pub const HEALTH_TIMEOUT: i64 = -1004;
/// `/health` code (kvplane): the worker could not be reached (the call is a 502 or 503).
pub const HEALTH_UNREACHABLE: i64 = -1005;

/// `POST /clear`.
#[derive(Debug, Deserialize)]
pub(crate) struct ClearRequest {
    instance_id: String,
    location: String,
}

impl Body for ClearRequest {
    const SPEC: BodySpec = BodySpec {
        name: "ClearRequest",
        fields: &[
            Field::required(
                "instance_id",
                FieldType::Str,
                "Instance whose workers clear.",
            ),
            Field::required(
                "location",
                FieldType::Str,
                "Backend to clear, e.g. `LocalCPUBackend`.",
            ),
        ],
        exactly_one_of: &[],
    };
}

/// `POST /pin`.
#[derive(Debug, Deserialize)]
pub(crate) struct PinRequest {
    instance_id: String,
    location: String,
    tokens: Vec<i64>,
}

impl Body for PinRequest {
    const SPEC: BodySpec = BodySpec {
        name: "PinRequest",
        fields: &[
            Field::required("instance_id", FieldType::Str, "Instance whose workers pin."),
            Field::required(
                "location",
                FieldType::Str,
                "Backend holding the tokens' chunks.",
            ),
            Field::required("tokens", FieldType::IntList, "Token ids whose KV to pin."),
        ],
        exactly_one_of: &[],
    };
}

/// `POST /compress` and `POST /decompress`.
#[derive(Debug, Deserialize)]
pub(crate) struct CompressRequest {
    instance_id: String,
    method: String,
    location: String,
    tokens: Option<Vec<i64>>,
}

const COMPRESS_FIELDS: &[Field] = &[
    Field::required(
        "instance_id",
        FieldType::Str,
        "Instance whose workers run the command.",
    ),
    Field::required(
        "method",
        FieldType::Str,
        "Compression method, passed to the workers as is.",
    ),
    Field::required("location", FieldType::Str, "Backend holding the KV."),
    Field::optional(
        "tokens",
        FieldType::IntList,
        FieldDefault::EmptyList,
        "Token ids (LMCache's default is [], not null).",
    ),
];

impl Body for CompressRequest {
    const SPEC: BodySpec = BodySpec {
        name: "CompressRequest",
        fields: COMPRESS_FIELDS,
        exactly_one_of: &[],
    };
}

/// `POST /decompress` (same fields as compress).
#[derive(Debug, Deserialize)]
pub(crate) struct DecompressRequest(CompressRequest);

impl Body for DecompressRequest {
    const SPEC: BodySpec = BodySpec {
        name: "DecompressRequest",
        fields: COMPRESS_FIELDS,
        exactly_one_of: &[],
    };
}

/// `POST /move`.
#[derive(Debug, Deserialize)]
pub(crate) struct MoveRequest {
    old_position: (String, String),
    new_position: (String, String),
    tokens: Option<Vec<i64>>,
    should_copy: Option<bool>,
}

impl Body for MoveRequest {
    const SPEC: BodySpec = BodySpec {
        name: "MoveRequest",
        fields: &[
            Field::required(
                "old_position",
                FieldType::StrPair,
                "[instance_id, location] the KV moves from.",
            ),
            Field::required(
                "new_position",
                FieldType::StrPair,
                "[instance_id, location] the KV moves to (its workers need a peer_init_url).",
            ),
            Field::optional(
                "tokens",
                FieldType::IntList,
                FieldDefault::EmptyList,
                "Token ids to move.",
            ),
            Field::optional(
                "should_copy",
                FieldType::Bool,
                FieldDefault::False,
                "Keep the source copy (null is taken as false).",
            ),
        ],
        exactly_one_of: &[],
    };
}

/// `POST /health`.
#[derive(Debug, Deserialize)]
pub(crate) struct HealthRequest {
    instance_id: String,
}

impl Body for HealthRequest {
    const SPEC: BodySpec = BodySpec {
        name: "HealthRequest",
        fields: &[Field::required(
            "instance_id",
            FieldType::Str,
            "Instance whose workers are probed.",
        )],
        exactly_one_of: &[],
    };
}

/// `POST /check_finish`.
#[derive(Debug, Deserialize)]
pub(crate) struct CheckFinishRequest {
    event_id: String,
}

impl Body for CheckFinishRequest {
    const SPEC: BodySpec = BodySpec {
        name: "CheckFinishRequest",
        fields: &[Field::required(
            "event_id",
            FieldType::Str,
            "The event_id a command returned.",
        )],
        exactly_one_of: &[],
    };
}

/// One worker a command goes to.
struct CommandTarget {
    instance_id: String,
    worker_id: i64,
    endpoint: String,
    downlink: Option<Downlink>,
}

/// The workers of `instance_id`, sorted by worker id; 404 if it has none.
fn targets(shared: &Driver, instance_id: &str) -> Result<Vec<CommandTarget>, ApiError> {
    let mut workers = shared
        .index()
        .instance_workers(instance_id)
        .unwrap_or_default();
    if workers.is_empty() {
        return Err(ApiError::NotFound(format!(
            "Instance {instance_id} is not registered"
        )));
    }
    workers.sort_by_key(|w| w.worker_id);
    Ok(workers
        .into_iter()
        .map(|w| {
            let downlink = shared
                .downlink(instance_id, w.worker_id)
                .map(|e| e.downlink);
            CommandTarget {
                instance_id: w.instance_id,
                worker_id: w.worker_id,
                endpoint: downlink.as_ref().map_or_else(
                    || crate::net::host_port(&w.ip, w.port),
                    |d| d.endpoint().to_owned(),
                ),
                downlink,
            }
        })
        .collect())
}

/// Most downlink requests one command has in flight at once; an instance with more workers
/// is reached in waves (each request is bounded by `--downlink-timeout`).
pub const MAX_FAN_OUT: usize = 64;

/// Sends `msgs[i]` to `targets[i]`, at most [`MAX_FAN_OUT`] at a time, and returns the answers
/// in the same order.
async fn fan_out(targets: &[CommandTarget], msgs: Vec<Msg>) -> Vec<Result<Msg, DownlinkError>> {
    let mut set = JoinSet::new();
    let mut pending = targets.iter().zip(msgs).enumerate();
    let mut answers: Vec<Result<Msg, DownlinkError>> = (0..targets.len())
        .map(|_| Err(DownlinkError::Closed))
        .collect();
    loop {
        while set.len() < MAX_FAN_OUT {
            let Some((i, (target, msg))) = pending.next() else {
                break;
            };
            let downlink = target.downlink.clone();
            set.spawn(async move {
                let answer = match downlink {
                    Some(d) => d.request(msg).await,
                    None => Err(DownlinkError::Closed),
                };
                (i, answer)
            });
        }
        let Some(joined) = set.join_next().await else {
            break;
        };
        if let Ok((i, answer)) = joined {
            answers[i] = answer;
        }
    }
    answers
}

/// Runs `work` as command `event_id` in its own task, recording it in the command log as
/// pending, then finished or failed, and counting its outcome.
async fn run_command<F>(
    shared: &Arc<Driver>,
    command: &'static str,
    event_id: &str,
    instance_id: &str,
    work: F,
) -> Result<Json<Value>, ApiError>
where
    F: Future<Output = Result<Value, ApiError>> + Send + 'static,
{
    shared.begin_command(event_id, command, instance_id);
    let task = {
        let tracker = shared.tasks().clone();
        let shared = Arc::clone(shared);
        let event_id = event_id.to_owned();
        tracker.spawn(async move {
            let result = work.await;
            let outcome = match &result {
                Ok(value) => {
                    shared.finish_command(&event_id, value.clone());
                    "ok"
                }
                Err(e) => {
                    shared.fail_command(&event_id, e.detail());
                    tracing::warn!(command, %event_id, "command failed: {}", e.detail());
                    match e {
                        ApiError::Workers(w) => w.outcome(),
                        ApiError::Conflict(_) => "conflict",
                        _ => "error",
                    }
                }
            };
            shared
                .metrics
                .commands
                .with_label_values(&[command, outcome])
                .inc();
            result
        })
    };
    match task.await {
        Ok(result) => result.map(Json),
        Err(e) => {
            shared.fail_command(event_id, format!("command task failed: {e}"));
            Err(ApiError::Internal(format!("command task failed: {e}")))
        }
    }
}

/// Counts a command refused before it started (unknown instance, …).
fn refused(shared: &Driver, command: &'static str, error: ApiError) -> ApiError {
    let outcome = match &error {
        ApiError::NotFound(_) => "not_found",
        ApiError::Conflict(_) => "conflict",
        _ => "error",
    };
    shared
        .metrics
        .commands
        .with_label_values(&[command, outcome])
        .inc();
    error
}

/// Reads the `num_tokens` of the reply a command expects.
type NumTokens = fn(&Msg) -> Option<i64>;

/// Interprets the answers of a `num_tokens` command: every worker must answer with the
/// expected reply; the result is the smallest count, with every worker's own.
fn num_tokens_answer(
    command: &'static str,
    event_id: String,
    targets: &[CommandTarget],
    answers: Vec<Result<Msg, DownlinkError>>,
    expect: NumTokens,
) -> Result<Value, ApiError> {
    let mut by_worker = IndexMap::new();
    let mut failures = Vec::new();
    for (t, answer) in targets.iter().zip(answers) {
        let failure = |kind, message: String| WorkerFailure {
            instance_id: t.instance_id.clone(),
            worker_id: t.worker_id,
            endpoint: t.endpoint.clone(),
            kind,
            message,
        };
        match answer {
            Ok(reply) => match (expect(&reply), reply) {
                (Some(n), _) => {
                    by_worker.insert(t.worker_id.to_string(), n);
                }
                (None, Msg::ErrorMsg(e)) => failures.push(failure(
                    FailureKind::ErrorReply,
                    format!("worker error: {}", e.error),
                )),
                (None, other) => failures.push(failure(
                    FailureKind::UnexpectedReply,
                    format!("unexpected reply {}", other.tag()),
                )),
            },
            Err(e) => failures.push(WorkerFailure::from_downlink(
                &t.instance_id,
                t.worker_id,
                &t.endpoint,
                &e,
            )),
        }
    }
    if !failures.is_empty() {
        return Err(ApiError::Workers(Box::new(WorkersFailed {
            command,
            event_id,
            total: targets.len(),
            failures,
            extra: Map::new(),
        })));
    }
    let num_tokens = by_worker.values().copied().min().unwrap_or(0);
    if by_worker.values().any(|&n| n != num_tokens) {
        tracing::warn!(
            command, %event_id, ?by_worker,
            "workers disagree on num_tokens; answering the smallest"
        );
    }
    Ok(json!({
        "event_id": event_id,
        "num_tokens": num_tokens,
        "num_tokens_by_worker": by_worker,
    }))
}

/// Sends one `num_tokens` command to every worker of `instance_id`: a new event id
/// `<event>…`, and to each worker the message `make` builds from its
/// `worker_event_id`, `<worker><worker_id><event id>`.
async fn num_tokens_command(
    shared: Arc<Driver>,
    command: &'static str,
    (event, worker): (&str, &str),
    instance_id: &str,
    make: impl Fn(String) -> Msg,
    expect: NumTokens,
) -> Result<Json<Value>, ApiError> {
    let event_id = new_event_id(event);
    let targets = targets(&shared, instance_id).map_err(|e| refused(&shared, command, e))?;
    let msgs = targets
        .iter()
        .map(|t| make(format!("{worker}{}{event_id}", t.worker_id)))
        .collect();
    let id = event_id.clone();
    run_command(&shared, command, &event_id, instance_id, async move {
        let answers = fan_out(&targets, msgs).await;
        num_tokens_answer(command, id, &targets, answers, expect)
    })
    .await
}

/// `POST /clear`: `ClearWorkerMsg` to every worker of the instance.
pub(crate) async fn clear(
    State(shared): State<Arc<Driver>>,
    Valid(req): Valid<ClearRequest>,
) -> Result<Json<Value>, ApiError> {
    let ClearRequest {
        instance_id,
        location,
    } = req;
    num_tokens_command(
        shared,
        "clear",
        ("Clear", "Worker"),
        &instance_id,
        move |worker_event_id| {
            Msg::ClearWorkerMsg(ClearWorkerMsg {
                worker_event_id,
                location: location.clone(),
            })
        },
        |m| match m {
            Msg::ClearWorkerRetMsg(r) => Some(r.num_tokens),
            _ => None,
        },
    )
    .await
}

/// `POST /pin`: `PinWorkerMsg` to every worker of the instance.
pub(crate) async fn pin(
    State(shared): State<Arc<Driver>>,
    Valid(req): Valid<PinRequest>,
) -> Result<Json<Value>, ApiError> {
    let PinRequest {
        instance_id,
        location,
        tokens,
    } = req;
    num_tokens_command(
        shared,
        "pin",
        ("Pin", "Worker"),
        &instance_id,
        move |worker_event_id| {
            Msg::PinWorkerMsg(PinWorkerMsg {
                worker_event_id,
                location: location.clone(),
                tokens: tokens.clone(),
            })
        },
        |m| match m {
            Msg::PinWorkerRetMsg(r) => Some(r.num_tokens),
            _ => None,
        },
    )
    .await
}

/// `POST /compress`: `CompressWorkerMsg` to every worker of the instance.
pub(crate) async fn compress(
    State(shared): State<Arc<Driver>>,
    Valid(req): Valid<CompressRequest>,
) -> Result<Json<Value>, ApiError> {
    let CompressRequest {
        instance_id,
        method,
        location,
        tokens,
    } = req;
    num_tokens_command(
        shared,
        "compress",
        ("Compress", "CompressWorker"),
        &instance_id,
        move |worker_event_id| {
            Msg::CompressWorkerMsg(CompressWorkerMsg {
                worker_event_id,
                method: method.clone(),
                location: location.clone(),
                tokens: tokens.clone(),
            })
        },
        |m| match m {
            Msg::CompressWorkerRetMsg(r) => Some(r.num_tokens),
            _ => None,
        },
    )
    .await
}

/// `POST /decompress`: `DecompressWorkerMsg` to every worker of the instance.
pub(crate) async fn decompress(
    State(shared): State<Arc<Driver>>,
    Valid(DecompressRequest(req)): Valid<DecompressRequest>,
) -> Result<Json<Value>, ApiError> {
    let CompressRequest {
        instance_id,
        method,
        location,
        tokens,
    } = req;
    num_tokens_command(
        shared,
        "decompress",
        ("Decompress", "DecompressWorker"),
        &instance_id,
        move |worker_event_id| {
            Msg::DecompressWorkerMsg(DecompressWorkerMsg {
                worker_event_id,
                method: method.clone(),
                location: location.clone(),
                tokens: tokens.clone(),
            })
        },
        |m| match m {
            Msg::DecompressWorkerRetMsg(r) => Some(r.num_tokens),
            _ => None,
        },
    )
    .await
}

/// `POST /move`: for each (source rank, destination rank) pair, zipped in worker-id order as
/// LMCache does (the shorter list decides how many pairs), a `MoveWorkerMsg` to the source
/// with `new_position = (destination peer_init_url, destination location)`.
pub(crate) async fn move_kv(
    State(shared): State<Arc<Driver>>,
    Valid(req): Valid<MoveRequest>,
) -> Result<Json<Value>, ApiError> {
    const COMMAND: &str = "move";
    let (src_instance, src_location) = req.old_position;
    let (dst_instance, dst_location) = req.new_position;
    let sources = targets(&shared, &src_instance).map_err(|e| refused(&shared, COMMAND, e))?;
    let mut destinations = shared
        .index()
        .instance_workers(&dst_instance)
        .unwrap_or_default();
    if destinations.is_empty() {
        return Err(refused(
            &shared,
            COMMAND,
            ApiError::NotFound(format!("Instance {dst_instance} is not registered")),
        ));
    }
    destinations.sort_by_key(|w| w.worker_id);
    let event_id = new_event_id("Move");
    let mut pairs = Vec::new();
    let mut msgs = Vec::new();
    for (src, dst) in sources.into_iter().zip(destinations) {
        let Some(url) = dst.peer_init_url else {
            return Err(refused(
                &shared,
                COMMAND,
                ApiError::Conflict(format!(
                    "Destination worker ({dst_instance}, {}) has no peer_init_url: P2P is not \
                     enabled on it, so it cannot receive KV",
                    dst.worker_id
                )),
            ));
        };
        msgs.push(Msg::MoveWorkerMsg(MoveWorkerMsg {
            worker_event_id: format!("MoveWorker{}{event_id}", src.worker_id),
            old_position: src_location.clone(),
            new_position: (url, dst_location.clone()),
            tokens: req.tokens.clone(),
            copy: Some(req.should_copy.unwrap_or(false)),
        }));
        pairs.push(src);
    }
    let id = event_id.clone();
    run_command(&shared, COMMAND, &event_id, &src_instance, async move {
        let answers = fan_out(&pairs, msgs).await;
        num_tokens_answer(COMMAND, id, &pairs, answers, |m| match m {
            Msg::MoveWorkerRetMsg(r) => Some(r.num_tokens),
            _ => None,
        })
    })
    .await
}

/// `POST /health`: `HealthWorkerMsg` to every worker; `error_codes` maps worker id to the
/// worker's code (0 healthy, −1 memory check failed) or LMCache's −1001 (`ErrorMsg`), −1002
/// (other reply), −1003 (undecodable). A worker that does not answer makes the call a 504
/// whose body still carries `error_codes`, with −1004 for it (−1005: unreachable). An unknown
/// instance answers 200 with no codes, as LMCache does.
pub(crate) async fn health(
    State(shared): State<Arc<Driver>>,
    Valid(req): Valid<HealthRequest>,
) -> Result<Json<Value>, ApiError> {
    const COMMAND: &str = "health";
    let event_id = new_event_id("health");
    let targets = match targets(&shared, &req.instance_id) {
        Ok(t) => t,
        Err(ApiError::NotFound(_)) => {
            // LMCache's answer (its dashboard's connectivity probe), recorded like any other.
            let answer = json!({ "event_id": event_id, "error_codes": {} });
            shared.begin_command(&event_id, COMMAND, &req.instance_id);
            shared.finish_command(&event_id, answer.clone());
            shared
                .metrics
                .commands
                .with_label_values(&[COMMAND, "not_found"])
                .inc();
            return Ok(Json(answer));
        }
        Err(e) => return Err(e),
    };
    let msgs = targets
        .iter()
        .map(|t| {
            Msg::HealthWorkerMsg(HealthWorkerMsg {
                worker_event_id: format!("HealthWorker{}{event_id}", t.worker_id),
            })
        })
        .collect();
    let id = event_id.clone();
    run_command(&shared, COMMAND, &event_id, &req.instance_id, async move {
        let answers = fan_out(&targets, msgs).await;
        let mut codes = IndexMap::new();
        let mut failures = Vec::new();
        for (t, answer) in targets.iter().zip(answers) {
            let code = match answer {
                Ok(Msg::HealthWorkerRetMsg(r)) => r.error_code,
                Ok(Msg::ErrorMsg(_)) => HEALTH_ERROR_REPLY,
                Ok(_) => HEALTH_UNEXPECTED_REPLY,
                Err(DownlinkError::Decode(_)) => HEALTH_UNDECODABLE,
                Err(e) => {
                    let failure =
                        WorkerFailure::from_downlink(&t.instance_id, t.worker_id, &t.endpoint, &e);
                    let code = if failure.kind == FailureKind::Timeout {
                        HEALTH_TIMEOUT
                    } else {
                        HEALTH_UNREACHABLE
                    };
                    failures.push(failure);
                    code
                }
            };
            codes.insert(t.worker_id.to_string(), code);
        }
        if failures.is_empty() {
            Ok(json!({ "event_id": id, "error_codes": codes }))
        } else {
            let mut extra = Map::new();
            extra.insert("error_codes".into(), json!(codes));
            Err(ApiError::Workers(Box::new(WorkersFailed {
                command: COMMAND,
                event_id: id,
                total: targets.len(),
                failures,
                extra,
            })))
        }
    })
    .await
}

/// `POST /check_finish`: the status of a command by its `event_id` — `pending`, `finished`
/// or `failed` — with what it returned or why it failed; 404 for an id the controller does not
/// know (never issued, or older than the last 10,000 commands).
pub(crate) async fn check_finish(
    State(shared): State<Arc<Driver>>,
    Valid(req): Valid<CheckFinishRequest>,
) -> Result<Json<Value>, ApiError> {
    let Some(r) = shared.command(&req.event_id) else {
        return Err(ApiError::NotFound(format!(
            "Unknown event_id {} (the controller remembers the last {} commands)",
            req.event_id,
            crate::controller::model::command_log::COMMAND_LOG_CAPACITY
        )));
    };
    let mut body = json!({
        "status": r.status.as_str(),
        "event_id": req.event_id,
        "command": r.command,
        "instance_id": r.instance_id,
        "created": r.created,
        "finished": r.finished,
    });
    if let Value::Object(b) = &mut body {
        if let Some(result) = r.result {
            b.insert("result".into(), result);
        }
        if let Some(detail) = r.detail {
            b.insert("detail".into(), detail.into());
        }
    }
    Ok(Json(body))
}
