//! A real `nats-server` with JetStream on 127.0.0.1 for the cluster tests: an ephemeral port,
//! its store in a fresh temporary directory, killed when dropped.
//!
//! The binary is `$KVPLANE_NATS_SERVER`, else `nats-server` on the PATH or in /usr/sbin
//! (`scripts/setup-nats.sh` installs Debian's package; `scripts/test.sh` runs it). Without
//! one the tests FAIL with these instructions, unless `KVPLANE_SKIP_NATS=1` says on purpose
//! that they are skipped.

use super::{free_port, within};
use std::path::PathBuf;
use std::process::Stdio;
use tokio::process::{Child, Command};

/// A running `nats-server -js`.
pub struct Nats {
    /// `nats://127.0.0.1:PORT`.
    pub url: String,
    port: u16,
    store: PathBuf,
    child: Option<Child>,
}

fn binary() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("KVPLANE_NATS_SERVER") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
}

impl Nats {
    /// Starts a server, or `None` when `KVPLANE_SKIP_NATS=1` and there is none.
    pub async fn start() -> Option<Nats> {
        let Some(bin) = binary() else {
            if std::env::var("KVPLANE_SKIP_NATS").as_deref() == Ok("1") {
                eprintln!("KVPLANE_SKIP_NATS=1: no nats-server, the cluster test is skipped");
                return None;
            }
            panic!(
                "nats-server not found: install it with scripts/setup-nats.sh (Debian's package) \
                 or point KVPLANE_NATS_SERVER at one; KVPLANE_SKIP_NATS=1 skips this test on \
                 purpose"
            );
        };
        let port = free_port();
        let store =
            std::env::temp_dir().join(format!("kvplane-nats-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&store);
        std::fs::create_dir_all(&store).expect("nats store dir");
        let mut nats = Nats {
            url: format!("nats://127.0.0.1:{port}"),
            port,
            store,
            child: None,
        };
        nats.spawn(&bin).await;
        Some(nats)
    }

    async fn spawn(&mut self, bin: &PathBuf) {
        let child = Command::new(bin)
            .args(["-js", "-a", "127.0.0.1", "-p", &self.port.to_string()])
            .arg("-sd")
            .arg(&self.store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("nats-server starts");
        self.child = Some(child);
        let addr = format!("127.0.0.1:{}", self.port);
        within("nats-server listens", async {
            while tokio::net::TcpStream::connect(&addr).await.is_err() {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
        .await;
    }

    /// An indexer of cluster `name` on this server: the ingester, or a `--replica`.
    pub fn indexer(&self, name: &str, replica: bool) -> kvplane::indexer::service::IndexerConfig {
        kvplane::indexer::service::IndexerConfig {
            cluster: Some(kvplane::cluster::ClusterConfig {
                name: name.into(),
                ..kvplane::cluster::ClusterConfig::new(self.url.clone())
            }),
            replica,
            ..Default::default()
        }
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
            let _ = within("nats-server exits", c.wait()).await;
        }
    }

    /// Starts it again on the same port and store.
    pub async fn restart(&mut self) {
        self.kill().await;
        let bin = binary().expect("nats-server");
        self.spawn(&bin).await;
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.store);
    }
}

/// One `kvplane <subcommand> --cluster` process of a cluster on a [`Nats`] (lease TTL 1 s), its
/// stderr in a temp file; SIGKILLed when dropped.
pub struct Member {
    /// The process (tests kill or stop it).
    pub child: Child,
    log: PathBuf,
}

impl Nats {
    /// Starts `kvplane <subcommand>` in `cluster`, with `env` on top of the cluster settings.
    pub fn member(
        &self,
        subcommand: &str,
        cluster: &str,
        name: &str,
        env: &[(&str, &str)],
    ) -> Member {
        let log = std::env::temp_dir().join(format!(
            "kvplane-{subcommand}-{cluster}-{}-{name}.log",
            std::process::id()
        ));
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_kvplane"))
            .arg(subcommand)
            .env("KVPLANE_CLUSTER", &self.url)
            .env("KVPLANE_CLUSTER_NAME", cluster)
            .env("KVPLANE_CLUSTER_LEASE_TTL", "1.0")
            .env("RUST_LOG", "info")
            .env("RUST_BACKTRACE", "0")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .expect("kvplane starts");
        Member { child, log }
    }
}

impl Member {
    /// Everything the process logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (at most 30 s) until the log contains `what`.
    pub async fn wait_log(&self, what: &str) {
        let limit = std::time::Duration::from_secs(30);
        let start = std::time::Instant::now();
        while !self.log().contains(what) {
            assert!(
                start.elapsed() < limit,
                "no {what:?} in the log within {limit:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_file(&self.log);
    }
}
