//! `kvplane coordinator` in front of a REAL LMCache 0.5.6 multi-process fleet (CPU-only, the
//! real torch; `scripts/setup-mp-fleet.sh`): two `lmcache server` MP servers with PRIVATE `fs`
//! L2 directories and one whose `fs` L2 is declared `"shared": true`, storing real KV from
//! LMCache's own `lmcache bench server --mode cpu`. kvplane is checked against the bytes
//! actually on the servers' disks (the `.data` files of each L2 directory):
//!
//! * usage (`GET /quota`, `GET /instances/usage`) equals the disks' bytes ±10%, per holder and
//!   in total, before and after eviction;
//! * no quota (0.5.6's boot default): nothing is evicted over several eviction cycles;
//! * a quota at 40% of usage: the bytes on the disks fall to it, on every holder;
//! * a coordinator restarted from its `--checkpoint-path` knows what is on the disks before
//!   any server stores again;
//! * a SIGKILLed MP server restarted with the same `--instance-id` is fenced (its old
//!   incarnation's L1 placements dropped), not double-counted.
//!
//! One fleet for all phases: an MP server costs ~700 MB and ~5-30 s to start (torch).

use crate::support::eventually;
use crate::support::mp_fleet::{self, close, get, MpServer, Proc};
use crate::support::{free_port, sample};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

const GIB: f64 = (1u64 << 30) as f64;
/// Requests each server stores per drive (16 keys of 16 KiB each).
const REQUESTS: usize = 20;
/// Bound on a fleet start, a drive's events arriving, an eviction reaching a quota.
const WAIT: Duration = Duration::from_secs(120);

/// The fleet of one test; on a panic the logs' tails are printed.
struct Fleet {
    dir: PathBuf,
    venv: PathBuf,
    port: u16,
    coordinator: Option<Proc>,
    servers: Vec<MpServer>,
    shm_before: std::collections::BTreeSet<String>,
}

impl Fleet {
    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn server(&self, id: &str) -> &MpServer {
        self.servers.iter().find(|s| s.id == id).expect("server")
    }

    /// Stops the MP servers (SIGTERM: they deregister), then the coordinator.
    async fn stop(&mut self) {
        for s in &mut self.servers {
            s.proc.stop_within(Duration::from_secs(15)).await;
        }
        if let Some(c) = self.coordinator.as_mut() {
            c.stop_within(Duration::from_secs(10)).await;
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for p in self
                .servers
                .iter()
                .map(|s| &s.proc)
                .chain(self.coordinator.as_ref())
            {
                eprintln!("---- {}:\n{}", p.name(), p.tail(40));
            }
        }
        // The MP servers first (each SIGTERMed on drop: they deregister), then the coordinator.
        self.servers.clear();
        self.coordinator = None;
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Coordinator usage: L2 bytes per private holder, of the shared pool, and the salt total.
#[derive(Debug, Default)]
struct Usage {
    private: Vec<(String, u64)>,
    shared: u64,
    total: u64,
    l1: Vec<(String, u64)>,
}

async fn usage(addr: SocketAddr) -> Option<Usage> {
    let per = get(addr, "/instances/usage").await?;
    let quota = get(addr, "/quota").await?;
    let mut u = Usage {
        total: (quota["total_gb"].as_f64()? * GIB).round() as u64,
        ..Usage::default()
    };
    for inst in per["instances"].as_array()? {
        let id = inst["instance_id"].as_str()?.to_owned();
        for m in inst["modules"].as_array()? {
            let bytes = m["used_bytes"].as_u64()?;
            match m["tier"].as_str()? {
                "l2" => u.private.push((id.clone(), bytes)),
                _ => u.l1.push((id.clone(), bytes)),
            }
        }
    }
    for m in per["shared_modules"].as_array()? {
        if m["tier"] == "l2" {
            u.shared += m["used_bytes"].as_u64()?;
        }
    }
    Some(u)
}

/// Disk bytes per server id.
fn disks(fleet: &Fleet) -> Vec<(String, u64)> {
    fleet
        .servers
        .iter()
        .map(|s| (s.id.clone(), s.disk_bytes()))
        .collect()
}

/// Waits until kvplane's usage matches the disks ±10%: each private holder's L2, the shared
/// pool (counted once), and the total. Returns the disks' bytes.
async fn usage_matches_disks(fleet: &Fleet, what: &str) -> Vec<(String, u64)> {
    eventually(what, WAIT, || async {
        let disks = disks(fleet);
        let u = usage(fleet.addr()).await.ok_or("no usage yet")?;
        let sum: u64 = disks.iter().map(|d| d.1).sum();
        let mut ok = close(u.total, sum, 10.0);
        for (id, bytes) in &disks {
            ok &= if id.starts_with("shared") {
                close(u.shared, *bytes, 10.0)
            } else {
                let counted = u.private.iter().find(|p| &p.0 == id).map_or(0, |p| p.1);
                close(counted, *bytes, 10.0)
            };
        }
        if ok && sum > 0 {
            Ok(disks)
        } else {
            Err(format!("disks {disks:?} (sum {sum}) vs kvplane {u:?}"))
        }
    })
    .await
}

async fn metric(addr: SocketAddr, name: &str) -> f64 {
    match get(addr, "/metrics").await {
        Some(Value::String(text)) => sample(&text, name),
        other => panic!("/metrics: {other:?}"),
    }
}

/// Starts the coordinator and three MP servers, and waits until all three registered and
/// declared their modules.
async fn start_fleet(venv: PathBuf) -> Fleet {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("kvplane-fleet-{}-{port}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let shm_before = mp_fleet::shm_names();
    let args = checkpoint_args(&dir);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let coordinator = mp_fleet::coordinator(port, &args).await;
    let mut fleet = Fleet {
        dir: dir.clone(),
        venv: venv.clone(),
        port,
        coordinator: Some(coordinator),
        servers: Vec::new(),
        shm_before,
    };
    for (id, shared) in [
        ("private-a", false),
        ("private-b", false),
        ("shared-s", true),
    ] {
        let l2 = dir.join(format!("l2-{id}"));
        let server = MpServer::start(&venv, id, &l2, shared, port);
        fleet.servers.push(server);
    }
    eventually("three MP servers registered and declared", WAIT, || async {
        let u = get(fleet.addr(), "/instances/usage")
            .await
            .ok_or("coordinator not answering")?;
        let declared = u["instances"].as_array().map_or(0, |a| {
            a.iter().filter(|i| i["declared_capacity"] == true).count()
        });
        if declared == 3 {
            Ok(())
        } else {
            Err(u.to_string())
        }
    })
    .await;
    fleet
}

/// `--checkpoint-path` in the fleet's directory; 0: written only at a clean stop, so what a
/// restarted coordinator knows comes from that stop's checkpoint alone.
fn checkpoint_args(dir: &std::path::Path) -> Vec<String> {
    let path = dir.join("coordinator.ckpt");
    vec![
        "--checkpoint-path".into(),
        path.display().to_string(),
        "--checkpoint-interval".into(),
        "0".into(),
    ]
}

/// Drives the three servers at once, each with its own sequences.
async fn drive_all(fleet: &Fleet) {
    let drive = |i: usize| fleet.servers[i].drive(&fleet.venv, 1000 * (i + 1), REQUESTS);
    tokio::join!(drive(0), drive(1), drive(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kvplane_accounts_and_evicts_a_real_mp_fleet_by_its_disks() {
    let Some(venv) = mp_fleet::venv() else {
        return;
    };
    let mut fleet = start_fleet(venv).await;
    let addr = fleet.addr();
    drive_all(&fleet).await;

    // (c) usage equals the disks, per holder, the shared pool once, and in total.
    let before = usage_matches_disks(&fleet, "usage equals the disks after the stores").await;
    assert!(
        before.iter().all(|d| d.1 > 0),
        "every server stored: {before:?}"
    );

    // (a) no quota: several eviction cycles later nothing was evicted.
    let cycles = metric(addr, "kvplane_coordinator_eviction_cycles_total").await;
    eventually("three eviction cycles", WAIT, || async {
        let now = metric(addr, "kvplane_coordinator_eviction_cycles_total").await;
        if now >= cycles + 3.0 {
            Ok(())
        } else {
            Err(format!("{now} cycles (from {cycles})"))
        }
    })
    .await;
    assert_eq!(disks(&fleet), before, "no quota: nothing may be evicted");
    assert_eq!(
        metric(addr, "kvplane_coordinator_eviction_keys_planned_total").await,
        0.0
    );

    // (b) a quota at 40% of usage: the disks fall to it, on every holder.
    let total: u64 = before.iter().map(|d| d.1).sum();
    let limit = total * 4 / 10;
    let body = format!(r#"{{"limit_gb": {}}}"#, limit as f64 / GIB);
    let (status, reply) =
        crate::support::http(addr, "PUT", "/quota/_default", Some(&body), &[]).await;
    assert_eq!(status, 200, "{reply}");
    let after = eventually("the disks fall to the quota", WAIT, || async {
        let now = disks(&fleet);
        let sum: u64 = now.iter().map(|d| d.1).sum();
        if sum <= limit {
            Ok(now)
        } else {
            Err(format!("{sum} bytes on disk > {limit}: {now:?}"))
        }
    })
    .await;
    for ((id, was), (_, now)) in before.iter().zip(&after) {
        assert!(now < was, "{id}: evicted on its own disk ({was} -> {now})");
    }
    // (c) and after eviction, kvplane still counts what is on the disks.
    usage_matches_disks(&fleet, "usage equals the disks after eviction").await;
    let (status, reply) = crate::support::http(addr, "DELETE", "/quota/_default", None, &[]).await;
    assert_eq!(status, 200, "{reply}");

    // (d) restart the coordinator from its checkpoint (SIGTERM writes it): it knows what is
    // on the disks before any server stores again (no drive runs until (e)). Without the
    // checkpoint it would start blind: 0.5.6 MP servers never re-send what L2 holds.
    let on_disk = disks(&fleet);
    if let Some(c) = fleet.coordinator.as_mut() {
        c.stop_within(Duration::from_secs(10)).await;
    }
    let ckpt = fleet.dir.join("coordinator.ckpt");
    assert!(ckpt.exists(), "a clean stop writes {}", ckpt.display());
    let args = checkpoint_args(&fleet.dir);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    fleet.coordinator = Some(mp_fleet::coordinator(fleet.port, &args).await);
    let restored = usage_matches_disks(&fleet, "usage equals the disks after a restart").await;
    assert_eq!(restored, on_disk, "no server stored or evicted meanwhile");
    assert!(
        metric(addr, "kvplane_coordinator_checkpoint_restored_keys").await > 0.0,
        "the keys came from the checkpoint"
    );

    // (e) SIGKILL a private server and restart it under the same id: the new incarnation
    // fences the old one's L1 placements; re-storing the same sequences is not counted twice.
    let (l2, venv) = {
        let a = fleet.server("private-a");
        (a.l2.clone(), fleet.venv.clone())
    };
    let i = fleet
        .servers
        .iter()
        .position(|s| s.id == "private-a")
        .expect("private-a");
    fleet.servers[i].proc.kill().await;
    let restarted = MpServer::start(&venv, "private-a", &l2, false, fleet.port);
    fleet.servers[i] = restarted;
    eventually("private-a re-registered and declared", WAIT, || async {
        let u = get(addr, "/instances/usage").await.ok_or("no answer")?;
        let a = u["instances"]
            .as_array()
            .and_then(|a| a.iter().find(|i| i["instance_id"] == "private-a").cloned())
            .ok_or_else(|| u.to_string())?;
        // Registered again; its fresh L1 (emptied by the crash) declared.
        let l1 = a["modules"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["tier"] == "l1").cloned());
        match l1 {
            Some(m) if m["used_bytes"] == 0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    fleet
        .server("private-a")
        .drive(&fleet.venv, 1000 * (i + 1), REQUESTS)
        .await;
    let settled = usage_matches_disks(&fleet, "usage equals the disks after the restart").await;
    let a_disk = settled
        .iter()
        .find(|d| d.0 == "private-a")
        .map_or(0, |d| d.1);
    let u = usage(addr).await.expect("usage");
    let a_l1: u64 =
        u.l1.iter()
            .filter(|l| l.0 == "private-a")
            .map(|l| l.1)
            .sum();
    // What it stored again (the same sequences, also on its disk), not that plus the dead
    // incarnation's copy: at most the disk's bytes (some chunks may be served from L2 instead).
    assert!(
        a_l1 > 0 && a_l1 <= a_disk + a_disk / 10,
        "private-a's L1 after the restart: {a_l1} B; its disk holds {a_disk} B"
    );
    let listed = get(addr, "/instances").await.expect("instances");
    let copies = listed["instances"].as_array().map_or(0, |a| {
        a.iter().filter(|i| i["instance_id"] == "private-a").count()
    });
    assert_eq!(copies, 1, "{listed}");

    // Clean shutdown: the MP servers deregister; nothing is left in /dev/shm.
    fleet.stop().await;
    let left: Vec<String> = mp_fleet::shm_names()
        .difference(&fleet.shm_before)
        .cloned()
        .collect();
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
}
