//! The `churn` scenario: workers that come and go. Each cycle registers a fresh worker on the
//! reply socket, pushes one batch of admits and its deregistration on the PULL socket; the
//! cycles run over `--churn-lanes` concurrent connections, and the scenario ends once
//! `/controller/key-stats` is back to the workers and keys it showed before. It reports the
//! cycle rate; `scripts/soak.sh` runs rounds of it and holds the controller's resident memory
//! under a ceiling (a per-cycle leak grows it round after round). Asserts nothing about time.

use super::fleet::{key, SimWorker, LOCATION, REQUEST_TIMEOUT};
use super::BenchArgs;
use crate::protocol::{
    decode, encode, BatchedKVOperationMsg, DeRegisterMsg, KVOpEvent, Msg, OpType,
};
use crate::transport::{DealerClient, PushSender};
use bytes::Bytes;
use serde::Serialize;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// Admits each cycle's worker pushes before it leaves.
const ADMITS: u64 = 10;

/// Churn result.
#[derive(Debug, Serialize)]
pub struct Churn {
    /// Register → admit → deregister cycles.
    pub cycles: usize,
    /// Concurrent connections they ran over.
    pub lanes: usize,
    /// Seconds until the controller had dropped every one of them.
    pub seconds: f64,
    /// `cycles / seconds`.
    pub cycles_per_sec: f64,
}

/// (workers, keys) of `/controller/key-stats`.
async fn totals(args: &BenchArgs) -> Result<(u64, u64), String> {
    let v = super::http::get_json(&args.http, "/controller/key-stats", REQUEST_TIMEOUT).await?;
    let field = |name: &str| {
        v[name]
            .as_u64()
            .ok_or_else(|| format!("key-stats without {name}: {v}"))
    };
    Ok((field("total_worker_count")?, field("total_key_count")?))
}

/// One lane: the cycles `lane, lane + lanes, …` below `cycles`, over one DEALER and one PUSH.
async fn lane(args: BenchArgs, run: u64, lane: usize, lanes: usize) -> Result<(), String> {
    let mut dealer = DealerClient::new(args.reply.clone(), REQUEST_TIMEOUT);
    let mut push = PushSender::new(args.pull.clone());
    for i in (lane..args.churn_cycles).step_by(lanes) {
        let worker = SimWorker {
            instance_id: format!("churn-{run:x}-{i}"),
            worker_id: 0,
            port: 1,
        };
        let answer = dealer
            .request(Bytes::from(encode(&worker.register_msg(None))))
            .await
            .map_err(|e| format!("register {}: {e}", worker.instance_id))?;
        if !matches!(decode(&answer), Ok(Msg::RegisterRetMsg(_))) {
            return Err(format!(
                "register {}: unexpected answer {:?}",
                worker.instance_id,
                decode(&answer)
            ));
        }
        let batch = Msg::BatchedKVOperationMsg(BatchedKVOperationMsg {
            instance_id: worker.instance_id.clone(),
            worker_id: 0,
            location: LOCATION.into(),
            operations: (0..ADMITS)
                .map(|k| KVOpEvent {
                    op_type: OpType::Admit,
                    key: key(run, i, k),
                    seq_num: k as i64,
                })
                .collect(),
        });
        let leave = Msg::DeRegisterMsg(DeRegisterMsg {
            instance_id: worker.instance_id,
            worker_id: 0,
            ip: "127.0.0.1".into(),
            port: worker.port,
        });
        push.send(
            vec![Bytes::from(encode(&batch)), Bytes::from(encode(&leave))],
            REQUEST_TIMEOUT,
        )
        .await
        .map_err(|e| format!("push: {e}"))?;
    }
    Ok(())
}

pub(super) async fn churn(args: &BenchArgs, run: u64) -> Result<Churn, String> {
    let lanes = args.churn_lanes.max(1);
    let before = totals(args).await?;
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for l in 0..lanes {
        tasks.spawn(lane(args.clone(), run, l, lanes));
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| format!("lane: {e}"))??;
    }
    // Drained: every cycle's worker and keys gone again.
    let limit = Duration::from_secs_f64(args.timeout);
    loop {
        let now = totals(args).await?;
        if now == before {
            break;
        }
        if start.elapsed() > limit {
            return Err(format!(
                "(workers, keys) {now:?}, {before:?} before the run, after {limit:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(Churn {
        cycles: args.churn_cycles,
        lanes,
        seconds,
        cycles_per_sec: args.churn_cycles as f64 / seconds.max(f64::MIN_POSITIVE),
    })
}
