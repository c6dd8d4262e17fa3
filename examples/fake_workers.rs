//! Two fake workers for exercising the HTTP API by hand or with a fuzzer
//! (`scripts/schemathesis.sh` uses them): one answers every command with fixed numbers, the
//! other registers and never answers its downlink, so commands to it end in 504.
//!
//! ```sh
//! cargo run --example fake_workers -- --reply 127.0.0.1:8400
//! curl -X POST :9000/clear -d '{"instance_id":"","location":"LocalCPUBackend"}'   # 200
//! curl -X POST :9000/clear -d '{"instance_id":"0","location":"LocalCPUBackend"}'  # 504
//! ```
//!
//! Instance ids are `""` (answers) and `"0"` (silent) by default: the strings a property-based
//! generator tries first, so that generated requests reach real workers. They speak the wire
//! protocol directly (a REP socket and one registration), not through `kvplane::worker`, which
//! refuses an empty instance id.

use bytes::Bytes;
use clap::Parser;
use kvplane::protocol::*;
use kvplane::transport::{DealerClient, RepServer};
use std::time::Duration;

/// Two fake workers: one that answers, one that never does.
#[derive(Debug, Parser)]
#[command(name = "fake_workers", about)]
struct Args {
    /// The controller's reply ROUTER socket.
    #[arg(long, default_value = "127.0.0.1:8400")]
    reply: String,
    /// Instance id of the worker that answers every command.
    #[arg(long, default_value = "")]
    answering: String,
    /// Instance id of the worker that never answers.
    #[arg(long, default_value = "0")]
    silent: String,
}

/// The answering worker's reply: `num_tokens` 7 (pin: the number of tokens), healthy.
fn answer(msg: &Msg) -> Msg {
    match msg {
        Msg::ClearWorkerMsg(_) => ClearWorkerRetMsg { num_tokens: 7 }.into(),
        Msg::PinWorkerMsg(m) => PinWorkerRetMsg {
            num_tokens: i64::try_from(m.tokens.len()).unwrap_or(i64::MAX),
        }
        .into(),
        Msg::CompressWorkerMsg(_) => CompressWorkerRetMsg { num_tokens: 7 }.into(),
        Msg::DecompressWorkerMsg(_) => DecompressWorkerRetMsg { num_tokens: 7 }.into(),
        Msg::MoveWorkerMsg(_) => MoveWorkerRetMsg { num_tokens: 7 }.into(),
        Msg::HealthWorkerMsg(_) => HealthWorkerRetMsg { error_code: 0 }.into(),
        Msg::CheckFinishWorkerMsg(_) => CheckFinishWorkerRetMsg {
            status: "finished".into(),
        }
        .into(),
        other => ErrorMsg {
            error: format!("fake worker: unexpected {}", other.tag()),
        }
        .into(),
    }
}

async fn register(
    dealer: &mut DealerClient,
    instance_id: &str,
    port: u16,
    peer: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let msg = Msg::RegisterMsg(RegisterMsg {
        instance_id: instance_id.to_owned(),
        worker_id: 0,
        ip: "127.0.0.1".into(),
        port: i64::from(port),
        peer_init_url: Some(peer.to_owned()),
        distributed_url: None,
    });
    match decode(&dealer.request(Bytes::from(encode(&msg))).await?)? {
        Msg::RegisterRetMsg(_) => Ok(()),
        other => Err(format!("registration of {instance_id:?} refused: {other:?}").into()),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let (mut answering, a) = RepServer::bind("127.0.0.1:0").await?;
    // Bound and never read: commands sent to it are never answered.
    let (_silent, s) = RepServer::bind("127.0.0.1:0").await?;
    let mut dealer = DealerClient::new(args.reply.clone(), Duration::from_secs(5));
    register(&mut dealer, &args.answering, a.port(), "127.0.0.1:1").await?;
    register(&mut dealer, &args.silent, s.port(), "127.0.0.1:2").await?;
    println!(
        "registered {:?} (answers, port {}) and {:?} (silent, port {})",
        args.answering,
        a.port(),
        args.silent,
        s.port()
    );
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            request = answering.recv() => {
                let Ok(bytes) = request else { continue };
                let reply = match decode(&bytes) {
                    Ok(msg) => answer(&msg),
                    Err(e) => ErrorMsg { error: format!("fake worker: {e}") }.into(),
                };
                let _ = answering.reply(Bytes::from(encode(&reply))).await;
            }
        }
    }
}
