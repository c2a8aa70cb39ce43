//! `mq-tests`: the harness of mq's integration tests, which run real brokers.
//!
//! It is not a test itself: the tests live in `tests/tests/`, one binary (`integration`) with one
//! module per behaviour (see the index at the top of `tests/tests/integration/main.rs`).
//!
//! # Layout
//! - [`InProcessBroker`]: `mq_broker::run` on the current tokio runtime, on `127.0.0.1:0`, with a
//!   temporary data directory; stopped by its handle.
//! - [`MqdProcess`]: the real `mqd` binary as a child process, stopped by its PID (SIGTERM or
//!   SIGKILL; `Drop` kills it if it still runs).
//! - [`mq`]: runs the `mq` command line against a broker and returns its output.
//! - [`wait_until`] / [`eventually`]: bounded polling for a condition, never fixed sleeps.
//! - [`free_port`], [`MqdProcess::launch_on`]: brokers at fixed ports, for store-and-forward
//!   between several `mqd` processes (a destination restarted where it was).
//!
//! The `mqd` and `mq` binaries are not built by `cargo test -p mq-tests` (Cargo builds the
//! binaries of a package only for that package's own integration tests), so the first use of
//! either runs [`BUILD_ARGS`] (`cargo build --workspace --test journal --bin mqd --bin mq`) once
//! per test process, with the same profile and target directory as the running test. That
//! keeps them from being stale, and it resolves features as `cargo test --workspace` does (a
//! test target in the selection turns on every member's dev-dependencies), so after that command
//! it rebuilds nothing: a plain `cargo build -p mq-broker` would resolve tokio, regex, syn, ...
//! with fewer features and compile the broker and most of its dependencies a second time.
//!
//! # Example
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let broker = mq_tests::InProcessBroker::start().await;
//! let client = broker.client().await;
//! client.create_queue(r".\private$\q", Default::default()).await?;
//! broker.stop().await?;
//! # Ok(()) }
//! ```

pub mod http;

use std::future::Future;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use mq_broker::{BrokerConfig, RunError};
use mq_client::Client;

/// How long [`InProcessBroker::stop`] and [`MqdProcess::terminate`] wait by default.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`MqdProcess::start`] waits for the `listening on <addr>` line.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// The environment variable that overrides [`START_TIMEOUT`] (whole seconds), for slow
/// machines and for long `mqtorture` runs whose journals grow large.
pub const START_TIMEOUT_ENV: &str = "MQ_TEST_START_TIMEOUT_SECS";

/// [`START_TIMEOUT`], or the whole seconds in [`START_TIMEOUT_ENV`] when that is set.
pub fn start_timeout() -> Duration {
    std::env::var(START_TIMEOUT_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(START_TIMEOUT)
}
/// How long [`mq`] lets one CLI invocation run before killing it.
pub const CLI_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// In-process broker

/// A broker running `mq_broker::run` on the current tokio runtime, listening on
/// `127.0.0.1:<free port>` with a temporary data directory.
///
/// Stop it with [`InProcessBroker::stop`]; dropping it signals shutdown and aborts the task.
#[derive(Debug)]
pub struct InProcessBroker {
    addr: SocketAddr,
    url: String,
    config: BrokerConfig,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), RunError>>>,
    // Last, so the directory outlives the broker task when dropped.
    _data_dir: tempfile::TempDir,
}

impl InProcessBroker {
    /// A broker with the default configuration.
    pub async fn start() -> InProcessBroker {
        Self::start_with(|_| {}).await
    }

    /// A broker whose configuration `tweak` adjusts (limits, quotas, ...). The data directory is
    /// already set to a fresh temporary directory.
    pub async fn start_with(tweak: impl FnOnce(&mut BrokerConfig)) -> InProcessBroker {
        let data_dir = tempfile::Builder::new()
            .prefix("mq-test-")
            .tempdir()
            .expect("create a temporary data directory");
        let mut config = BrokerConfig::new(data_dir.path());
        config.shutdown_grace = Duration::from_secs(2);
        tweak(&mut config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("listener address");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(mq_broker::run(listener, config.clone(), async move {
            let _ = rx.await;
        }));
        InProcessBroker {
            addr,
            url: format!("http://{addr}"),
            config,
            shutdown: Some(tx),
            task: Some(task),
            _data_dir: data_dir,
        }
    }

    /// The address it listens on (`127.0.0.1:<port>`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`, for [`Client::connect`] and `MQ_BROKER`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }

    /// A connected client. Panics if the broker does not answer.
    pub async fn client(&self) -> Client {
        Client::connect(self.url.clone())
            .await
            .unwrap_or_else(|e| panic!("connect to the in-process broker at {}: {e}", self.url))
    }

    /// [`InProcessBroker::start`], then [`InProcessBroker::client`] and
    /// [`create_default_queue`]: a broker holding an empty `queue`, and a client of it.
    pub async fn start_with_queue(queue: &str) -> (InProcessBroker, Client) {
        let broker = Self::start().await;
        let client = broker.client().await;
        create_default_queue(&client, queue).await;
        (broker, client)
    }

    /// Whether the broker task has ended (it should not before [`InProcessBroker::stop`]).
    pub fn has_stopped(&self) -> bool {
        self.task.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Signals shutdown and waits (at most [`STOP_TIMEOUT`]) for `run` to return.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let task = self
            .task
            .take()
            .expect("the broker task is there until stop");
        match tokio::time::timeout(STOP_TIMEOUT, task).await {
            Ok(Ok(r)) => r.context("the broker's run() returned an error"),
            Ok(Err(join)) => Err(anyhow!("the broker task failed: {join}")),
            Err(_) => bail!("the broker did not stop within {STOP_TIMEOUT:?}"),
        }
    }
}

impl Drop for InProcessBroker {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Binaries

/// The directory holding the binaries of the profile the tests were built with
/// (`target/debug` for `target/debug/deps/integration-…`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("test executable has a directory");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir = dir.parent().expect("deps has a parent");
    }
    dir.to_path_buf()
}

/// Whether `key` is one of the variables Cargo sets for the package a test belongs to, not one
/// of Cargo's own settings (CARGO_HOME, CARGO_TARGET_DIR, CARGO_PROFILE_* stay).
fn is_package_variable(key: &str) -> bool {
    [
        "CARGO_PKG_",
        "CARGO_MANIFEST_",
        "CARGO_BIN_EXE_",
        "CARGO_CRATE_",
    ]
    .iter()
    .any(|p| key.starts_with(p))
        || matches!(
            key,
            "CARGO_BIN_NAME" | "CARGO_PRIMARY_PACKAGE" | "CARGO_TARGET_TMPDIR" | "OUT_DIR"
        )
}

/// The `cargo build` arguments that build `mqd` and `mq` with the features `cargo test
/// --workspace` resolves (see the crate docs); `.ci/run` uses the same list. The `journal` test
/// (broker/tests/journal) is small: it is there only so that the selection holds a test target.
pub const BUILD_ARGS: [&str; 7] = [
    "--workspace",
    "--test",
    "journal",
    "--bin",
    "mqd",
    "--bin",
    "mq",
];

/// Builds `mqd` and `mq` once per test process, and returns the profile directory.
fn built_binaries() -> &'static Path {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let r = BUILT.get_or_init(|| {
        let dir = profile_dir();
        let target_dir = dir
            .parent()
            .ok_or("the profile directory has no parent")?
            .to_path_buf();
        let profile = dir
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or("the profile directory has no name")?
            .to_string();
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .ok_or("tests/ has no parent")?
            .to_path_buf();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        // Cargo gives a test process the variables of its own package (CARGO_PKG_NAME, ...).
        // Passed on, they would reach build scripts that watch them (ring's does:
        // `rerun-if-env-changed=CARGO_PKG_NAME`), and this build would recompile ring and
        // everything above it, broker included, and the next plain `cargo test` all over again.
        for (key, _) in std::env::vars_os() {
            if key.to_str().is_some_and(is_package_variable) {
                cmd.env_remove(&key);
            }
        }
        cmd.arg("build")
            .arg("--quiet")
            .arg("--manifest-path")
            .arg(workspace.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target_dir)
            .args(BUILD_ARGS);
        match profile.as_str() {
            "debug" => {}
            "release" => {
                cmd.arg("--release");
            }
            other => {
                cmd.args(["--profile", other]);
            }
        }
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run cargo to build mqd and mq: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "building mqd and mq failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(dir)
    });
    match r {
        Ok(dir) => dir,
        Err(e) => panic!("{e}"),
    }
}

/// The path of the `mqd` binary (built on first use), or `$MQ_TEST_MQD` if set (a measurement
/// against a release build from a debug test).
pub fn mqd_path() -> PathBuf {
    if let Some(p) = std::env::var_os("MQ_TEST_MQD") {
        return PathBuf::from(p);
    }
    built_binaries().join(format!("mqd{}", std::env::consts::EXE_SUFFIX))
}

/// The path of the `mq` binary (built on first use).
pub fn mq_path() -> PathBuf {
    built_binaries().join(format!("mq{}", std::env::consts::EXE_SUFFIX))
}

/// Collects a pipe into a shared buffer on a thread, so the child never blocks on a full pipe.
fn drain<R: Read + Send + 'static>(mut r: R) -> (Arc<Mutex<Vec<u8>>>, std::thread::JoinHandle<()>) {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let b = buf.clone();
    let h = std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        loop {
            match r.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => b
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend_from_slice(&chunk[..n]),
            }
        }
    });
    (buf, h)
}

/// Waits for `child` to exit, at most `timeout`; `None` if it is still running.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> std::io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(Some(s));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------------------------------
// mqd as a process

/// A running `mqd` child process, listening on `127.0.0.1:<free port>`.
///
/// Stopped by its PID: [`MqdProcess::terminate`] (SIGTERM), [`MqdProcess::kill9`] (SIGKILL),
/// or `Drop` (SIGKILL if still running).
#[derive(Debug)]
pub struct MqdProcess {
    child: Child,
    addr: SocketAddr,
    url: String,
    first_line: String,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    /// The threads that read its stdout and stderr: done at the pipes' end, soon after exit.
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl MqdProcess {
    /// Starts `mqd --listen 127.0.0.1:0 --data-dir <data_dir>` and waits (at most
    /// [`start_timeout`]) for its first stdout line, `listening on <addr>`.
    pub fn start(data_dir: &Path) -> anyhow::Result<MqdProcess> {
        Self::start_with_args(data_dir, &[])
    }

    /// Like [`MqdProcess::start`], with more flags (e.g. `--max-body-bytes 1000`).
    pub fn start_with_args(data_dir: &Path, extra: &[&str]) -> anyhow::Result<MqdProcess> {
        Self::spawn(mqd_command(data_dir, extra))
    }

    /// Like [`MqdProcess::start_with_args`], listening on `addr` instead of `127.0.0.1:0`: for a
    /// broker that must be reachable at a port known in advance (another broker forwards to it
    /// before it first starts, or it restarts where it was). Fails if the port is taken; see
    /// [`MqdProcess::launch_on`] for a restart on a port that may briefly still be in use.
    pub fn start_on(
        data_dir: &Path,
        addr: SocketAddr,
        extra: &[&str],
    ) -> anyhow::Result<MqdProcess> {
        Self::spawn(mqd_command_on(data_dir, &addr.to_string(), extra))
    }

    /// Runs `cmd` (an [`mqd_command`], or one that execs `mqd` in the same process, such as
    /// `ip netns exec NS mqd ...`) and waits for its `listening on <addr>` line.
    pub fn spawn(mut cmd: Command) -> anyhow::Result<MqdProcess> {
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", mqd_path().display()))?;
        let (stderr, stderr_thread) = drain(child.stderr.take().expect("piped stderr"));
        let stdout_pipe = child.stdout.take().expect("piped stdout");
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let (line_tx, line_rx) = std::sync::mpsc::channel::<std::io::Result<String>>();
        let stdout_thread = {
            let stdout = stdout.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(stdout_pipe);
                let mut first = String::new();
                let res = r.read_line(&mut first).map(|_| first);
                let _ = line_tx.send(res);
                let mut rest = Vec::new();
                let _ = r.read_to_end(&mut rest);
                stdout
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend_from_slice(&rest);
            })
        };
        let mut proc = MqdProcess {
            child,
            addr: "127.0.0.1:0".parse().expect("address"),
            url: String::new(),
            first_line: String::new(),
            stdout,
            stderr,
            readers: vec![stdout_thread, stderr_thread],
        };
        let start_timeout = start_timeout();
        let line = match line_rx.recv_timeout(start_timeout) {
            // End of stdout before any line: mqd exited (bad flags, port in use, ...). Let it
            // finish writing its reason to stderr, so the error below carries it.
            Ok(Ok(l)) if l.is_empty() => {
                if let Ok(Some(_)) = wait_timeout(&mut proc.child, STOP_TIMEOUT) {
                    proc.output_read();
                }
                l
            }
            Ok(Ok(l)) => l,
            Ok(Err(e)) => bail!("reading mqd's stdout: {e}; stderr: {}", proc.stderr()),
            Err(_) => bail!(
                "mqd printed no first line within {start_timeout:?}; stderr: {}",
                proc.stderr()
            ),
        };
        proc.first_line = line.trim_end().to_string();
        let addr = proc
            .first_line
            .strip_prefix("listening on ")
            .ok_or_else(|| {
                anyhow!(
                    "mqd's first stdout line is {:?}, expected \"listening on <addr>\"; stderr: {}",
                    proc.first_line,
                    proc.stderr()
                )
            })?;
        proc.addr = addr
            .parse()
            .with_context(|| format!("mqd printed an unparsable address {addr:?}"))?;
        proc.url = format!("http://{}", proc.addr);
        Ok(proc)
    }

    /// The address from the `listening on` line.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The first stdout line, without its newline.
    pub fn first_line(&self) -> &str {
        &self.first_line
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the process wrote to stderr so far (its logs).
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }

    /// Whether its logs come to contain `needle` within `timeout`: they arrive through a pipe
    /// a thread reads, so a line the broker wrote just now may not be here yet.
    pub fn logs_within(&self, timeout: Duration, needle: &str) -> bool {
        wait_until(timeout, || self.stderr().contains(needle))
    }

    /// What it wrote to stdout after the first line (complete once it has exited).
    pub fn stdout_rest(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }

    /// Whether it still runs.
    pub fn is_running(&mut self) -> bool {
        if matches!(self.child.try_wait(), Ok(None)) {
            return true;
        }
        self.output_read();
        false
    }

    /// SIGKILL by PID, and reap it.
    pub fn kill9(&mut self) -> anyhow::Result<ExitStatus> {
        if let Some(s) = self.child.try_wait()? {
            self.output_read();
            return Ok(s);
        }
        self.child.kill().context("SIGKILL mqd")?;
        let s = self.child.wait()?;
        self.output_read();
        Ok(s)
    }

    /// Once it has exited: waits (at most 10 s) until what it wrote to stdout and stderr has
    /// been read, so [`MqdProcess::stderr`] and [`MqdProcess::stdout_rest`] are whole.
    fn output_read(&self) {
        wait_until(Duration::from_secs(10), || {
            self.readers.iter().all(|r| r.is_finished())
        });
    }

    /// SIGTERM by PID, then waits at most `timeout` for it to exit. An error if it does not
    /// (it is then left running for `Drop` to kill).
    pub fn terminate(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        if let Some(s) = self.child.try_wait()? {
            self.output_read();
            return Ok(s);
        }
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .context("run `kill -TERM`")?;
        if !status.success() {
            bail!("`kill -TERM {}` failed: {status}", self.child.id());
        }
        match wait_timeout(&mut self.child, timeout)? {
            Some(s) => {
                self.output_read();
                Ok(s)
            }
            None => bail!(
                "mqd (pid {}) still runs {timeout:?} after SIGTERM; stderr: {}",
                self.child.id(),
                self.stderr()
            ),
        }
    }

    /// Sends `signal` (a `kill` name: `STOP`, `CONT`, `TERM`, ...) to it by PID, without waiting.
    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .with_context(|| format!("run `kill -{signal}`"))?;
        if !status.success() {
            bail!("`kill -{signal} {}` failed: {status}", self.child.id());
        }
        Ok(())
    }

    /// Waits at most `timeout` for it to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<Option<ExitStatus>> {
        let s = wait_timeout(&mut self.child, timeout)?;
        if s.is_some() {
            self.output_read();
        }
        Ok(s)
    }
}

impl Drop for MqdProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The `mqd` command for `data_dir` on `127.0.0.1:0`, stdout and stderr piped, stdin closed.
/// For tests that need the raw process (e.g. one that must fail to start).
pub fn mqd_command(data_dir: &Path, extra: &[&str]) -> Command {
    mqd_command_on(data_dir, "127.0.0.1:0", extra)
}

/// [`mqd_command`] with `--listen listen`.
pub fn mqd_command_on(data_dir: &Path, listen: &str, extra: &[&str]) -> Command {
    let mut cmd = Command::new(mqd_path());
    cmd.arg("--listen")
        .arg(listen)
        .arg("--data-dir")
        .arg(data_dir)
        .args(extra)
        .env_remove("MQD_LISTEN")
        .env_remove("MQD_DATA_DIR")
        .env_remove("MQD_NAME")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Runs `cmd` to completion with `stdin` as its input, killing it after `timeout`.
pub fn run_with_timeout(
    mut cmd: Command,
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> anyhow::Result<Output> {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("cannot run {cmd:?}"))?;
    let (out, out_h) = drain(child.stdout.take().expect("piped stdout"));
    let (err, err_h) = drain(child.stderr.take().expect("piped stderr"));
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("piped stdin");
        let input = input.to_vec();
        // On a thread: a child that does not read its stdin must not block us.
        std::thread::spawn(move || {
            let _ = pipe.write_all(&input);
        });
    }
    let status = match wait_timeout(&mut child, timeout)? {
        Some(s) => s,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "{cmd:?} did not finish within {timeout:?}; stderr so far: {}",
                String::from_utf8_lossy(&err.lock().unwrap_or_else(|p| p.into_inner()))
            );
        }
    };
    let _ = out_h.join();
    let _ = err_h.join();
    let stdout = std::mem::take(&mut *out.lock().unwrap_or_else(|p| p.into_inner()));
    let stderr = std::mem::take(&mut *err.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

/// Runs the `mq` command line with `MQ_BROKER=broker_url` and `args`, feeding it `stdin`
/// (closed when `None`), killing it after [`CLI_TIMEOUT`].
pub fn mq(broker_url: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut cmd = Command::new(mq_path());
    cmd.args(args).env("MQ_BROKER", broker_url);
    run_with_timeout(cmd, stdin, CLI_TIMEOUT).unwrap_or_else(|e| panic!("mq {args:?}: {e:#}"))
}

// ---------------------------------------------------------------------------------------------
// Waiting for conditions

/// The resident memory of process `pid` in KiB (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// The peak resident memory of process `pid` in KiB (`VmHWM` of `/proc/<pid>/status`).
pub fn peak_rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

/// The value in KiB of `field` (with its colon) in `/proc/<pid>/status`.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/<pid>/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

/// Polls `cond` until it holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Async [`wait_until`]: polls the future `cond` makes until it yields `true` or `timeout`
/// passes; returns whether it did.
pub async fn eventually<F, Fut>(timeout: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A port on 127.0.0.1 that was free a moment ago (bound, then released), never handed out
/// twice by this process: for a broker that must listen at an address known before it starts,
/// or come back there after a stop ([`MqdProcess::launch_on`]).
///
/// It is taken from below the kernel's ephemeral range (`ip_local_port_range`) where possible:
/// a port in that range can become the source port of some outgoing connection while the
/// broker is down, and the broker then cannot listen there again (or, with nothing listening, a
/// connection to it can even connect to itself).
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .filter(|&low| low > 12_000)
        .unwrap_or(32_768);
    // A cheap per-process pseudo-random start, so concurrent test processes spread out.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        ^ std::process::id().wrapping_mul(2_654_435_761);
    let span = 10_000u32;
    let first = low - span as u16;
    for i in 0..span {
        let port = first + ((seed.wrapping_add(i.wrapping_mul(7_919))) % span) as u16;
        if given.contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
    // Everything below the ephemeral range is taken: any free port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port();
    given.push(port);
    port
}

/// `127.0.0.1:<port>`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A fresh temporary data directory, named `<prefix>XXXXXX` so a leftover one says which test
/// group made it.
pub fn temp_data_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("create a temporary data directory")
}

impl MqdProcess {
    /// [`MqdProcess::start_with_args`], panicking with the reason: for tests.
    pub fn launch(data_dir: &Path, extra: &[&str]) -> MqdProcess {
        MqdProcess::start_with_args(data_dir, extra).unwrap_or_else(|e| panic!("start mqd: {e:#}"))
    }

    /// [`MqdProcess::start_on`], panicking with the reason: for tests. While mqd fails because
    /// the port is still in use (a broker killed a moment ago on the same port), retries for at
    /// most [`start_timeout`].
    pub fn launch_on(data_dir: &Path, addr: SocketAddr, extra: &[&str]) -> MqdProcess {
        let deadline = Instant::now() + start_timeout();
        loop {
            match MqdProcess::start_on(data_dir, addr, extra) {
                Ok(p) => return p,
                Err(e) if Instant::now() < deadline && format!("{e:#}").contains("in use") => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("start mqd on {addr}: {e:#}"),
            }
        }
    }

    /// A client connected to this mqd, panicking with the reason: for tests.
    pub async fn connect(&self) -> Client {
        Client::connect(self.url())
            .await
            .unwrap_or_else(|e| panic!("connect to mqd at {}: {e}", self.url()))
    }

    /// [`MqdProcess::launch`], then [`MqdProcess::connect`] and [`create_default_queue`]: a
    /// running mqd holding an empty `queue`, and a client of it.
    pub async fn launch_with_queue(
        data_dir: &Path,
        extra: &[&str],
        queue: &str,
    ) -> (MqdProcess, Client) {
        let mqd = MqdProcess::launch(data_dir, extra);
        let client = mqd.connect().await;
        create_default_queue(&client, queue).await;
        (mqd, client)
    }

    /// SIGKILL, asserting that mqd died by the signal (not by exiting on its own first).
    pub fn kill9_checked(&mut self) {
        let pid = self.pid();
        let status = self.kill9().expect("SIGKILL mqd");
        assert!(
            !status.success(),
            "mqd {pid} exited {status} instead of dying by SIGKILL"
        );
    }
}

/// Receives and acknowledges every message `queue` holds right now (its count at the start),
/// waiting up to `wait` for each; returns the bodies in order and asserts that the queue is then
/// empty, with nothing in flight.
pub async fn drain_queue(client: &Client, queue: &str, wait: Duration) -> Vec<bytes::Bytes> {
    let n = client.queue_info(queue).await.unwrap().messages;
    let mut out = Vec::with_capacity(n as usize);
    if n > 0 {
        let mut c = client
            .queue(queue)
            .unwrap()
            .consumer(mq_client::ConsumerOptions {
                prefetch: 256,
                limit: Some(n),
            })
            .await
            .unwrap();
        for i in 0..n {
            let m = c
                .next(wait)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("message {i} of {n} in {queue} did not arrive"));
            out.push(m.body);
        }
        c.close().await.unwrap();
    }
    let left = client.queue_info(queue).await.unwrap();
    assert_eq!(
        (left.messages, left.in_flight),
        (0, 0),
        "{queue} still holds messages: {left:?}"
    );
    out
}

/// The bodies (as text) and abort counts of up to 1,000 messages waiting in `queue`, peeked in
/// order (nothing removed).
pub async fn peek_bodies_and_aborts(client: &Client, queue: &str) -> Vec<(String, u32)> {
    client
        .queue(queue)
        .unwrap()
        .peek_many(1000, Duration::ZERO)
        .await
        .unwrap()
        .into_iter()
        .map(|m| (String::from_utf8_lossy(&m.body).into_owned(), m.abort_count))
        .collect()
}

/// One raw `Transact` stream, written to request by request as a client built from the
/// `.proto` alone would (the transaction tests' view of the wire).
#[derive(Debug)]
pub struct RawTransact {
    out: tokio::sync::mpsc::UnboundedSender<mq_proto::v1::TransactRequest>,
    pub inbound: tonic::Streaming<mq_proto::v1::TransactResponse>,
    /// The broker's response headers announced reusable streams (transactions one after
    /// another).
    pub reusable: bool,
}

impl RawTransact {
    /// How long [`RawTransact::answer`] waits.
    pub const WAIT: Duration = Duration::from_secs(20);

    pub async fn open(url: &str) -> RawTransact {
        use mq_proto::v1::message_queue_service_client::MessageQueueServiceClient;
        let mut rpc = MessageQueueServiceClient::connect(url.to_string())
            .await
            .unwrap();
        let (out, rx) = tokio::sync::mpsc::unbounded_channel();
        let response = rpc
            .transact(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
            .await
            .unwrap();
        RawTransact {
            out,
            reusable: response
                .metadata()
                .get(mq_proto::TX_STREAM_REUSE_METADATA)
                .is_some(),
            inbound: response.into_inner(),
        }
    }

    pub fn op(&self, op: mq_proto::v1::transact_request::Op) {
        self.out
            .send(mq_proto::v1::TransactRequest { op: Some(op) })
            .unwrap();
    }

    pub fn begin(&self, id: uuid::Uuid) {
        self.op(mq_proto::v1::transact_request::Op::Begin(
            mq_proto::v1::TxBegin {
                id: bytes::Bytes::copy_from_slice(id.as_bytes()),
            },
        ));
    }

    /// Stages one message with `body` for `queue`.
    pub fn send(&self, queue: &str, body: &str) {
        self.op(mq_proto::v1::transact_request::Op::Send(
            mq_proto::v1::TxSend {
                destination: queue.to_string(),
                messages: vec![mq_proto::v1::OutMessage {
                    body: bytes::Bytes::copy_from_slice(body.as_bytes()),
                    ..Default::default()
                }],
            },
        ));
    }

    /// Receives one message from `queue` (`commit`: and commits, `TxReceive.commit`).
    pub fn receive(&self, queue: &str, timeout: Duration, commit: bool) {
        self.op(mq_proto::v1::transact_request::Op::Receive(
            mq_proto::v1::TxReceive {
                queue: queue.to_string(),
                timeout_ms: timeout.as_millis() as u64,
                commit,
                ..Default::default()
            },
        ));
    }

    /// The next answer (panics if the stream ends or none comes within [`Self::WAIT`]).
    pub async fn answer(
        &mut self,
    ) -> Result<mq_proto::v1::transact_response::Result, tonic::Status> {
        let wait = Self::WAIT;
        match tokio::time::timeout(wait, self.inbound.message()).await {
            Ok(Ok(Some(mq_proto::v1::TransactResponse { result: Some(r) }))) => Ok(r),
            Ok(Ok(other)) => panic!("the stream ended or sent nothing: {other:?}"),
            Ok(Err(status)) => Err(status),
            Err(_) => panic!("no answer within {wait:?}"),
        }
    }

    /// No further answer is waiting (what came was all of it).
    pub async fn nothing_more(&mut self) {
        let more = tokio::time::timeout(Duration::from_millis(200), self.inbound.message()).await;
        assert!(more.is_err(), "a second answer: {more:?}");
    }
}

/// Creates `queue` with the default options (not transactional, no quota); panics if that fails.
pub async fn create_default_queue(client: &Client, queue: &str) {
    client
        .create_queue(queue, mq_client::QueueOptions::default())
        .await
        .unwrap_or_else(|e| panic!("create {queue}: {e}"));
}

// ---------------------------------------------------------------------------------------------
// Security: certificates and users

/// A test PKI: a CA made with `rcgen` and certificates it signs, as PEM files in a temporary
/// directory.
#[derive(Debug)]
pub struct TestPki {
    dir: tempfile::TempDir,
    ca_params: rcgen::CertificateParams,
    ca_key: rcgen::KeyPair,
    /// The CA certificate (PEM file).
    pub ca: PathBuf,
}

impl TestPki {
    /// A new CA named `name`.
    pub fn new(name: &str) -> TestPki {
        let dir = temp_data_dir("mq-pki-");
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let ca_cert = ca_params.self_signed(&ca_key).expect("self-signed CA");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, ca_cert.pem()).expect("write ca.pem");
        TestPki {
            dir,
            ca_params,
            ca_key,
            ca,
        }
    }

    /// A certificate for `127.0.0.1` and `localhost` with subject CN=`cn`, signed by the CA:
    /// (certificate file, key file).
    pub fn issue(&self, cn: &str) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut p = rcgen::CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])
            .expect("params");
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let issuer = rcgen::Issuer::from_params(&self.ca_params, &self.ca_key);
        let cert = p.signed_by(&key, &issuer).expect("sign");
        let c = self.dir.path().join(format!("{cn}.pem"));
        let k = self.dir.path().join(format!("{cn}.key"));
        std::fs::write(&c, cert.pem()).expect("write cert");
        std::fs::write(&k, key.serialize_pem()).expect("write key");
        (c, k)
    }

    /// The CA certificate's PEM.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(&self.ca).expect("read ca.pem")
    }

    /// A file in the PKI's directory, for other test files (users, credentials).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// Writes a users file at `path` with `mqd user add`'s code: (name, password, groups, rights).
pub fn users_file(path: &Path, users: &[(&str, &str, &[&str], &[&str])]) -> PathBuf {
    for (name, password, groups, rights) in users {
        let groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        let rights: Vec<String> = rights.iter().map(|r| r.to_string()).collect();
        mq_broker::add_user(path, name, Some(password), &groups, &rights, false)
            .unwrap_or_else(|e| panic!("add user {name}: {e}"));
    }
    path.to_path_buf()
}

/// Sends every message on `sender` without waiting in between, then waits for each receipt:
/// the messages' ids, in send order.
pub async fn send_with_receipts(
    sender: &mq_client::Sender,
    messages: impl IntoIterator<Item = mq_client::Message>,
) -> Vec<mq_client::MessageId> {
    let mut receipts = Vec::new();
    for m in messages {
        receipts.push(sender.send_with_receipt(m).await.unwrap());
    }
    let mut ids = Vec::with_capacity(receipts.len());
    for r in receipts {
        ids.push(r.await.unwrap());
    }
    ids
}

/// A Receive stream on `queue` opened with the generated gRPC client alone (no mq-client), with
/// `credit` messages asked for: the request side (for acknowledgements) and the deliveries.
pub async fn open_receive(
    url: &str,
    queue: &str,
    credit: u32,
) -> (
    tokio::sync::mpsc::Sender<mq_proto::v1::ReceiveRequest>,
    tonic::Streaming<mq_proto::v1::ReceiveResponse>,
) {
    let mut rpc = mq_proto::v1::message_queue_service_client::MessageQueueServiceClient::connect(
        url.to_string(),
    )
    .await
    .unwrap()
    .max_decoding_message_size(mq_proto::MAX_GRPC_MESSAGE);
    open_receive_on(&mut rpc, queue, credit).await
}

/// [`open_receive`] on a connection the caller made (its own HTTP/2 settings).
pub async fn open_receive_on(
    rpc: &mut mq_proto::v1::message_queue_service_client::MessageQueueServiceClient<
        tonic::transport::Channel,
    >,
    queue: &str,
    credit: u32,
) -> (
    tokio::sync::mpsc::Sender<mq_proto::v1::ReceiveRequest>,
    tonic::Streaming<mq_proto::v1::ReceiveResponse>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(mq_proto::v1::ReceiveRequest {
        queue: queue.into(),
        credit,
        ack_through: 0,
    })
    .await
    .unwrap();
    let items = rpc
        .receive(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (tx, items)
}

#[cfg(test)]
mod tests {
    use super::is_package_variable;

    #[test]
    fn only_the_packages_own_variables_are_dropped_from_the_build() {
        for k in [
            "CARGO_PKG_NAME",
            "CARGO_MANIFEST_DIR",
            "CARGO_BIN_EXE_mq",
            "OUT_DIR",
        ] {
            assert!(is_package_variable(k), "{k}");
        }
        for k in [
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_PROFILE_DEV_DEBUG",
            "PATH",
        ] {
            assert!(!is_package_variable(k), "{k}");
        }
    }
}
