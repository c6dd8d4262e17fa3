//! The one launcher of the integration tests: every process a test starts — the `kvplane`
//! binary, `nats-server`, the real LMCache and vLLM peers in Python, `node`, the test binary
//! itself — goes through [`Launch`]. It spawns with args and env, captures stdout and stderr
//! line by line (for waits and for failure messages), waits — always bounded — for a line such
//! as the listening line and parses the bound addresses out of it, stops with SIGTERM or
//! SIGKILL, and kills the process when dropped. It knows no service: the caller names the line
//! to wait for.

use super::{try_eventually, STEP};
use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStdin, Command};

/// Bound on a process start: from the spawn to the line it is waited for.
pub const START: Duration = Duration::from_secs(30);

/// Bound on a stop: from the signal to the exit.
pub const STOP: Duration = Duration::from_secs(15);

/// Which output stream a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Everything a process printed so far, one entry per line, in arrival order per stream.
#[derive(Default)]
struct Output {
    lines: Mutex<Vec<(Stream, String)>>,
    /// Streams that reached EOF.
    closed: Mutex<Vec<Stream>>,
}

/// A process to start: the program, its args and env, whether its stdin is kept.
pub struct Launch {
    name: String,
    cmd: Command,
    stdin: bool,
    drop_grace: Option<Duration>,
}

/// The `kvplane` binary under test: `$KVPLANE_TEST_BIN` (a copy, for a target directory other
/// builds write to) or Cargo's own.
pub fn kvplane_bin() -> PathBuf {
    std::env::var_os("KVPLANE_TEST_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_kvplane")),
        PathBuf::from,
    )
}

impl Launch {
    /// `program` with no args, named `name` in messages.
    pub fn new(name: &str, program: impl AsRef<OsStr>) -> Self {
        let mut cmd = Command::new(program);
        cmd.kill_on_drop(true);
        Launch {
            name: name.to_owned(),
            cmd,
            stdin: false,
            drop_grace: None,
        }
    }

    /// `kvplane <subcommand>` logging at info (the listening lines), without backtraces.
    pub fn kvplane(subcommand: &str) -> Self {
        let mut l = Launch::new(&format!("kvplane {subcommand}"), kvplane_bin());
        l.cmd
            .arg(subcommand)
            .env("RUST_LOG", "info")
            .env("RUST_BACKTRACE", "0");
        l
    }

    /// A Python script of the repository run by `python`, with LMCache's usage tracking off
    /// and unbuffered output.
    pub fn python(name: &str, python: impl AsRef<OsStr>, script: impl AsRef<OsStr>) -> Self {
        let mut l = Launch::new(name, python);
        l.cmd
            .arg(script)
            .env("LMCACHE_TRACK_USAGE", "false")
            .env("DO_NOT_TRACK", "1")
            .env("LMCACHE_DISABLE_BANNER", "1")
            .env("PYTHONUNBUFFERED", "1");
        l
    }

    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.cmd.arg(a);
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.cmd.args(args);
        self
    }

    pub fn env(mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> Self {
        self.cmd.env(k, v);
        self
    }

    pub fn envs<'a>(mut self, vars: impl IntoIterator<Item = &'a (&'a str, &'a str)>) -> Self {
        for (k, v) in vars {
            self.cmd.env(k, v);
        }
        self
    }

    /// [`Launch::envs`] for owned values.
    pub fn envs_owned(mut self, vars: &[(&str, String)]) -> Self {
        for (k, v) in vars {
            self.cmd.env(k, v);
        }
        self
    }

    pub fn current_dir(mut self, dir: impl AsRef<std::path::Path>) -> Self {
        self.cmd.current_dir(dir);
        self
    }

    /// Names it `name` in messages.
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// When dropped, SIGTERM first and SIGKILL only after `grace` (a peer that must
    /// deregister or clean up on its way out); otherwise the drop is a SIGKILL.
    pub fn stop_on_drop(mut self, grace: Duration) -> Self {
        self.drop_grace = Some(grace);
        self
    }

    /// Keeps a pipe to its stdin ([`Process::write_line`]); otherwise stdin is /dev/null.
    pub fn stdin(mut self) -> Self {
        self.stdin = true;
        self
    }

    /// Starts it (inside a tokio runtime). Its output is read by two threads of their own, so
    /// a test that blocks its runtime never stalls the process on a full pipe.
    pub fn spawn(mut self) -> Process {
        self.cmd
            .stdin(if self.stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = self
            .cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{} does not start: {e}", self.name));
        let output = Arc::new(Output::default());
        let out = child.stdout.take().expect("stdout piped");
        let err = child.stderr.take().expect("stderr piped");
        let out = out.into_owned_fd().expect("stdout descriptor");
        let err = err.into_owned_fd().expect("stderr descriptor");
        read_lines(out.into(), Stream::Stdout, Arc::clone(&output));
        read_lines(err.into(), Stream::Stderr, Arc::clone(&output));
        Process {
            name: self.name,
            stdin: child.stdin.take(),
            child,
            output,
            drop_grace: self.drop_grace,
        }
    }

    /// Runs it to the end, bounded by `limit`: its exit status and its output (a
    /// command-line run, a Python client, a browser script). Panics if it runs past `limit`.
    pub async fn run(self, limit: Duration) -> Finished {
        let name = self.name.clone();
        let mut p = self.spawn();
        let status = match tokio::time::timeout(limit, p.child.wait()).await {
            Ok(status) => status.unwrap_or_else(|e| panic!("{name}: wait failed: {e}")),
            Err(_) => {
                p.kill().await;
                panic!("{name} did not finish within {limit:?}:\n{}", p.log());
            }
        };
        // The readers end at EOF, which follows the exit (unless a grandchild holds the pipes).
        let output = Arc::clone(&p.output);
        let _ = try_eventually("its output read to the end", STEP, async || {
            output.closed.lock().unwrap().len() == 2
        })
        .await;
        Finished {
            status,
            stdout: p.text(Stream::Stdout),
            stderr: p.text(Stream::Stderr),
        }
    }
}

/// Reads `file` line by line into `output` on a thread of its own, until EOF.
fn read_lines(file: std::fs::File, which: Stream, output: Arc<Output>) {
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut reader = std::io::BufReader::new(file);
        let mut line = Vec::new();
        // Lines as bytes: a child's non-UTF-8 output is kept (lossily), never ends the read.
        while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end_matches(['\n', '\r']).to_owned();
            output.lines.lock().unwrap().push((which, text));
            line.clear();
        }
        output.closed.lock().unwrap().push(which);
    });
}

/// A process that ran to its end ([`Launch::run`]).
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// Panics with both outputs unless it exited 0.
    pub fn assert_success(&self, what: &str) {
        assert!(
            self.status.success(),
            "{what}: {}\nstdout:\n{}\nstderr:\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
    }
}

/// A running process; killed (SIGKILL) when dropped.
pub struct Process {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    output: Arc<Output>,
    drop_grace: Option<Duration>,
}

impl Drop for Process {
    fn drop(&mut self) {
        if let (Some(grace), Ok(None)) = (self.drop_grace, self.child.try_wait()) {
            if let Some(pid) = self.child.id() {
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status();
                // A drop cannot await: poll the exit on this thread, bounded by `grace`.
                let deadline = std::time::Instant::now() + grace;
                while std::time::Instant::now() < deadline {
                    if !matches!(self.child.try_wait(), Ok(None)) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        // Otherwise kill_on_drop: SIGKILL.
    }
}

/// A logged line that names bound addresses: `key=ADDR`, `key=Some(ADDR)` or `key://ADDR`.
#[derive(Clone, Debug)]
pub struct Listening(pub String);

impl Listening {
    /// The address logged under `key`; panics, quoting the line, when it is not there.
    pub fn addr(&self, key: &str) -> SocketAddr {
        self.try_addr(key)
            .unwrap_or_else(|| panic!("no {key} address in {:?}", self.0))
    }

    /// The address right after `text` in the line (`... connections on 127.0.0.1:4222`).
    pub fn addr_after(&self, text: &str) -> SocketAddr {
        let line = &self.0;
        line.find(text)
            .and_then(|at| line[at + text.len()..].split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no address after {text:?} in {line:?}"))
    }

    /// The address logged under `key`, if any (`None` for `key=None`).
    pub fn try_addr(&self, key: &str) -> Option<SocketAddr> {
        let line = &self.0;
        let at = [format!(" {key}="), format!(" {key}://")]
            .iter()
            .find_map(|p| line.find(p.as_str()).map(|i| i + p.len()))?;
        let value = line[at..].split_whitespace().next()?;
        let value = value
            .strip_prefix("Some(")
            .and_then(|v| v.strip_suffix(')'))
            .unwrap_or(value);
        value.parse().ok()
    }
}

impl Process {
    /// Its name in messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its pid (it has not been reaped).
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the process has not been reaped")
    }

    /// Everything it printed on `stream`, one line each.
    pub fn text(&self, stream: Stream) -> String {
        let lines = self.output.lines.lock().unwrap();
        let mut s = String::new();
        for (_, l) in lines.iter().filter(|(w, _)| *w == stream) {
            s.push_str(l);
            s.push('\n');
        }
        s
    }

    /// Everything it printed, both streams in arrival order (for failure messages).
    pub fn log(&self) -> String {
        let lines = self.output.lines.lock().unwrap();
        lines
            .iter()
            .map(|(_, l)| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The last `n` lines it printed.
    pub fn tail(&self, n: usize) -> String {
        let lines = self.output.lines.lock().unwrap();
        let from = lines.len().saturating_sub(n);
        lines[from..]
            .iter()
            .map(|(_, l)| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Whether any line so far contains `needle`.
    pub fn logged(&self, needle: &str) -> bool {
        self.find_line(needle).is_some()
    }

    /// The lines of `stream` from index `from` on (a cursor for protocol reads on stdout).
    pub fn lines_from(&self, stream: Stream, from: usize) -> Vec<String> {
        self.output
            .lines
            .lock()
            .unwrap()
            .iter()
            .filter(|(w, _)| *w == stream)
            .skip(from)
            .map(|(_, l)| l.clone())
            .collect()
    }

    /// Whether `stream` reached its end (the process closed it, usually by exiting).
    pub fn closed(&self, stream: Stream) -> bool {
        self.output.closed.lock().unwrap().contains(&stream)
    }

    /// Waits (at most `limit`) for the first line containing `needle`: the line, or why not
    /// (the process exited first, or the time ran out) with the end of its log.
    pub async fn try_wait_for_line(&self, needle: &str, limit: Duration) -> Result<String, String> {
        let what = format!("{}: a line with {needle:?}", self.name);
        let outcome = try_eventually(&what, limit, async || {
            let line = self.find_line(needle);
            if line.is_some() {
                return Ok(line);
            }
            // Both streams at their end: it exited (and everything it printed is in).
            if self.closed(Stream::Stdout) && self.closed(Stream::Stderr) {
                return Ok(self.find_line(needle));
            }
            Err(format!("the last lines:\n{}", self.tail(20)))
        })
        .await?;
        outcome.ok_or_else(|| {
            format!(
                "{} exited before printing {needle:?}:\n{}",
                self.name,
                self.tail(40)
            )
        })
    }

    fn find_line(&self, needle: &str) -> Option<String> {
        self.output
            .lines
            .lock()
            .unwrap()
            .iter()
            .find(|(_, l)| l.contains(needle))
            .map(|(_, l)| l.clone())
    }

    /// Waits (at most `limit`) for the first line containing `needle`, panicking with the log
    /// when the process exits first or the time is up.
    pub async fn wait_for_line_within(&self, needle: &str, limit: Duration) -> String {
        self.try_wait_for_line(needle, limit)
            .await
            .unwrap_or_else(|why| panic!("{why}"))
    }

    /// [`Process::wait_for_line_within`] bounded by [`START`].
    pub async fn wait_for_line(&self, needle: &str) -> String {
        self.wait_for_line_within(needle, START).await
    }

    /// Waits for the listening line containing `needle` and returns it for its addresses.
    pub async fn listening(&self, needle: &str) -> Listening {
        Listening(self.wait_for_line(needle).await)
    }

    /// Writes `line` and a newline to its stdin (kept with [`Launch::stdin`]), bounded.
    pub async fn write_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin kept: Launch::stdin");
        let data = format!("{line}\n");
        tokio::time::timeout(STEP, stdin.write_all(data.as_bytes()))
            .await
            .unwrap_or_else(|_| panic!("{}: stdin write within {STEP:?}", self.name))
            .unwrap_or_else(|e| panic!("{}: stdin write: {e}", self.name));
    }

    /// Closes its stdin (EOF for a process reading it).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Its exit status if it has exited, without waiting.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("wait")
    }

    /// Waits (at most `limit`) for it to exit on its own: its status, or `None` if it still
    /// runs.
    pub async fn exit_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        tokio::time::timeout(limit, self.child.wait())
            .await
            .ok()
            .map(|status| status.expect("wait"))
    }

    /// Waits (at most `limit`) for it to exit on its own; panics with its log otherwise.
    pub async fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => status.expect("wait"),
            Err(_) => panic!(
                "{}: still running after {limit:?}:\n{}",
                self.name,
                self.tail(40)
            ),
        }
    }

    /// Sends `signal` (a `kill` name: "TERM", "KILL", "INT") without waiting.
    pub fn signal(&self, signal: &str) {
        let pid = self.pid().to_string();
        let status = std::process::Command::new("kill")
            .args([format!("-{signal}").as_str(), pid.as_str()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} {pid}: {status}");
    }

    /// SIGTERM, then waits (at most [`STOP`]) for the exit; returns its status.
    pub async fn terminate(&mut self) -> ExitStatus {
        self.signal("TERM");
        self.wait_exit(STOP).await
    }

    /// SIGTERM and asserts a clean exit (status 0) within [`STOP`].
    pub async fn stop(&mut self) {
        let status = self.terminate().await;
        assert!(
            status.success(),
            "{}: exit status {status} after SIGTERM:\n{}",
            self.name,
            self.tail(40)
        );
    }

    /// SIGTERM, and SIGKILL when it has not exited within `grace` (a peer that may not stop
    /// cleanly: its exit status is not checked).
    pub async fn stop_within(&mut self, grace: Duration) {
        if self.try_exit().is_some() {
            return;
        }
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            self.kill().await;
        }
    }

    /// SIGKILL (a crash) and reaps it.
    pub async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(STOP, self.child.wait()).await;
    }
}
