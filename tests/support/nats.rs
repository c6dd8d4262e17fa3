//! A real `nats-server` with JetStream on 127.0.0.1 for the cluster tests: a port it picks and
//! logs, its store in a fresh temporary directory, killed when dropped; and the `kvplane
//! --cluster` members on it, started with [`Launch`].
//!
//! The binary is `$KVPLANE_NATS_SERVER`, else `nats-server` on the PATH or in /usr/sbin
//! (`scripts/setup-nats.sh` installs Debian's package; `scripts/test.sh` runs it). Without
//! one the tests FAIL with these instructions, unless `KVPLANE_SKIP_NATS=1` says on purpose
//! that they are skipped.

use super::process::{Launch, Process};
use super::{eventually, STEP};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// A running `nats-server -js`.
pub struct Nats {
    /// `nats://127.0.0.1:PORT`.
    pub url: String,
    port: u16,
    store: PathBuf,
    server: Option<Process>,
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

/// What nats-server logs once it accepts clients, before the bound address.
const LISTENING: &str = "Listening for client connections on ";

impl Nats {
    /// Starts a server on a port of its choosing, or `None` when `KVPLANE_SKIP_NATS=1` and
    /// there is none.
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
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let store = std::env::temp_dir().join(format!(
            "kvplane-nats-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&store);
        std::fs::create_dir_all(&store).expect("nats store dir");
        let mut nats = Nats {
            url: String::new(),
            port: 0,
            store,
            server: None,
        };
        // -p -1: a random free port, read back from its listening line.
        nats.spawn(&bin, "-1").await;
        Some(nats)
    }

    async fn spawn(&mut self, bin: &PathBuf, port: &str) {
        let server = Launch::new("nats-server", bin)
            .args(["-js", "-a", "127.0.0.1", "-p", port])
            .arg("-sd")
            .arg(&self.store)
            .spawn();
        let line = server.listening(LISTENING).await;
        self.port = line.addr_after(LISTENING).port();
        self.url = format!("nats://127.0.0.1:{}", self.port);
        server.wait_for_line("Server is ready").await;
        self.server = Some(server);
    }

    /// An indexer of cluster `name` on this server: the ingester, or a `--replica`.
    pub fn indexer(&self, name: &str, replica: bool) -> kvplane::indexer::IndexerConfig {
        kvplane::indexer::IndexerConfig {
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
        if let Some(mut server) = self.server.take() {
            server.kill().await;
        }
    }

    /// Starts it again on the same port and store.
    pub async fn restart(&mut self) {
        self.kill().await;
        let bin = binary().expect("nats-server");
        let port = self.port.to_string();
        // The old socket may linger for a moment: retry the bind (bounded).
        eventually("nats-server restarts on its port", STEP, async || {
            let server = Launch::new("nats-server", &bin)
                .args(["-js", "-a", "127.0.0.1", "-p", &port])
                .arg("-sd")
                .arg(&self.store)
                .spawn();
            let ready = server.try_wait_for_line("Server is ready", STEP).await;
            ready.map(|_| self.server = Some(server))
        })
        .await;
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        // The process is SIGKILLed by its own drop.
        self.server = None;
        let _ = std::fs::remove_dir_all(&self.store);
    }
}

/// One `kvplane <subcommand> --cluster` process of a cluster on a [`Nats`] (lease TTL 1 s): a
/// [`Process`], SIGKILLed when dropped.
pub type Member = Process;

impl Nats {
    /// Starts `kvplane <subcommand>` in `cluster`, with `env` on top of the cluster settings.
    pub fn member(
        &self,
        subcommand: &str,
        cluster: &str,
        name: &str,
        env: &[(&str, &str)],
    ) -> Member {
        let var = |flag: &str| format!("KVPLANE_{}_{flag}", subcommand.to_uppercase());
        Launch::kvplane(subcommand)
            .named(&format!("kvplane {subcommand} {name} of cluster {cluster}"))
            .env(var("CLUSTER"), &self.url)
            .env(var("CLUSTER_NAME"), cluster)
            .env(var("CLUSTER_LEASE_TTL"), "1.0")
            .envs(env)
            .spawn()
    }
}
