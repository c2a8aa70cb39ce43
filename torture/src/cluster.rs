//! The process layer: real `mqd` processes on loopback at fixed free ports with temporary data
//! directories, and the faults done to them by PID (SIGKILL, SIGSTOP/SIGCONT, SIGTERM, restart).
//!
//! Built on `mq-tests` ([`MqdProcess`], [`free_port`], [`temp_data_dir`]). Every process is
//! stopped by its PID when its [`Node`] is dropped, also on panic (a stopped process is
//! continued first, then killed).

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use mq_tests::{free_port, loopback, start_timeout, temp_data_dir, MqdProcess};

/// How long a SIGTERM may take before the broker is killed instead (and that is reported).
pub const TERM_TIMEOUT: Duration = Duration::from_secs(20);

/// One broker: a port and a data directory that outlive its processes.
#[derive(Debug)]
pub struct Node {
    // First, so the process dies before its data directory is removed.
    proc: Option<MqdProcess>,
    /// Whether the process is stopped by SIGSTOP now.
    stopped: bool,
    index: usize,
    name: String,
    addr: SocketAddr,
    /// The network namespace it runs in (`ip netns exec`), if not the harness's own.
    netns: Option<String>,
    dir: tempfile::TempDir,
    /// Processes started so far.
    pub starts: u64,
    /// Problems seen with the process itself (a SIGTERM that did not end it, an exit on its
    /// own, a restart that failed).
    pub incidents: Vec<String>,
}

impl Node {
    /// A node at a free loopback port; not started.
    pub fn new(index: usize) -> Node {
        let name = format!("mqt{}", (b'a' + index as u8) as char);
        Node {
            proc: None,
            stopped: false,
            index,
            addr: loopback(free_port()),
            netns: None,
            dir: temp_data_dir(&format!("mqtorture-{name}-")),
            name,
            starts: 0,
            incidents: Vec::new(),
        }
    }

    /// A node that runs in network namespace `netns`, listening on `ip` there; not started.
    pub fn in_namespace(index: usize, netns: &str, ip: std::net::IpAddr) -> Node {
        let mut n = Node::new(index);
        n.addr = SocketAddr::new(ip, n.addr.port());
        n.netns = Some(netns.to_string());
        n
    }

    pub fn index(&self) -> usize {
        self.index
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn data_dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(MqdProcess::pid)
    }

    /// Whether a process runs (it may be SIGSTOPped).
    pub fn is_up(&mut self) -> bool {
        self.proc.as_mut().is_some_and(MqdProcess::is_running)
    }

    /// Starts `mqd` at the node's port and data directory, retrying while the port is still
    /// held by a process killed a moment ago.
    pub fn start(&mut self) -> anyhow::Result<()> {
        if self.proc.is_some() {
            bail!("{} already runs", self.name);
        }
        let args = ["--name", self.name.as_str(), "--forward-retry-max", "300ms"];
        let deadline = Instant::now() + start_timeout();
        loop {
            let started = match &self.netns {
                None => MqdProcess::start_on(self.dir.path(), self.addr, &args),
                Some(ns) => MqdProcess::spawn(in_namespace(ns, self.dir.path(), self.addr, &args)),
            };
            match started {
                Ok(p) => {
                    self.proc = Some(p);
                    self.stopped = false;
                    self.starts += 1;
                    return Ok(());
                }
                Err(e) if Instant::now() < deadline && format!("{e:#}").contains("in use") => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => {
                    let msg = format!("{} did not start: {e:#}", self.name);
                    self.incidents.push(msg.clone());
                    bail!(msg);
                }
            }
        }
    }

    fn signal(&self, sig: &str) -> anyhow::Result<()> {
        let Some(pid) = self.pid() else {
            bail!("{} is not running", self.name)
        };
        let status = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .context("run `kill`")?;
        if !status.success() {
            bail!("`kill {sig} {pid}` failed: {status}");
        }
        Ok(())
    }

    /// SIGKILL by PID, and reap it.
    pub fn kill9(&mut self) -> anyhow::Result<()> {
        let mut p = self
            .proc
            .take()
            .with_context(|| format!("{} is not running", self.name))?;
        self.stopped = false;
        if let Ok(Some(status)) = p.wait_exit(Duration::ZERO) {
            self.incidents.push(format!(
                "{} (pid {}) had exited on its own ({status}) before SIGKILL; stderr tail: {}",
                self.name,
                p.pid(),
                tail(&p.stderr(), 2000)
            ));
            return Ok(());
        }
        p.kill9()?;
        Ok(())
    }

    /// SIGTERM by PID; waits for the exit (at most [`TERM_TIMEOUT`], then SIGKILL and an
    /// incident).
    pub fn terminate(&mut self) -> anyhow::Result<()> {
        if self.stopped {
            self.cont()?;
        }
        let mut p = self
            .proc
            .take()
            .with_context(|| format!("{} is not running", self.name))?;
        match p.terminate(TERM_TIMEOUT) {
            Ok(status) if status.success() => Ok(()),
            Ok(status) => {
                self.incidents.push(format!(
                    "{} (pid {}) exited {status} after SIGTERM; stderr tail: {}",
                    self.name,
                    p.pid(),
                    tail(&p.stderr(), 2000)
                ));
                Ok(())
            }
            Err(e) => {
                self.incidents.push(format!("{}: {e:#}", self.name));
                let _ = p.kill9();
                Ok(())
            }
        }
    }

    /// SIGSTOP by PID: the broker hangs.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        self.signal("-STOP")?;
        self.stopped = true;
        Ok(())
    }

    /// SIGCONT by PID.
    pub fn cont(&mut self) -> anyhow::Result<()> {
        self.signal("-CONT")?;
        self.stopped = false;
        Ok(())
    }

    /// The tail of the current process's log (stderr).
    pub fn log_tail(&self, max: usize) -> String {
        self.proc
            .as_ref()
            .map(|p| tail(&p.stderr(), max))
            .unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.stopped {
            let _ = self.signal("-CONT");
        }
        // MqdProcess's Drop kills it by PID and reaps it.
        self.proc = None;
    }
}

/// `ip netns exec NS mqd --listen ADDR --data-dir DIR ARGS` (as `mq_tests::mqd_command_on`
/// builds it; `ip netns exec` execs mqd, so the PID is mqd's). A broker off loopback is given
/// `--insecure` where this mqd has that flag.
fn in_namespace(ns: &str, data_dir: &std::path::Path, addr: SocketAddr, extra: &[&str]) -> Command {
    let model = mq_tests::mqd_command_on(data_dir, &addr.to_string(), extra);
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns]).arg(model.get_program());
    cmd.args(model.get_args());
    if mqd_has_flag("--insecure") {
        cmd.arg("--insecure");
    }
    for (k, v) in model.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cmd
}

/// Whether `mqd --help` lists `flag`.
fn mqd_has_flag(flag: &str) -> bool {
    Command::new(mq_tests::mqd_path())
        .arg("--help")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(flag))
}

fn tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("...{}", &s[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Start, hang, continue, kill, restart, stop: the process layer on a real mqd.
    #[test]
    fn a_node_survives_every_fault_and_is_gone_when_dropped() {
        let mut n = Node::new(0);
        n.start().unwrap();
        let first = n.pid().unwrap();
        assert!(n.is_up());
        n.stop().unwrap();
        n.cont().unwrap();
        n.kill9().unwrap();
        assert!(!n.is_up());
        n.start().unwrap();
        n.stop().unwrap();
        // SIGTERM continues a stopped broker first.
        n.terminate().unwrap();
        n.start().unwrap();
        n.stop().unwrap();
        let last = n.pid().unwrap();
        assert_ne!(first, last);
        assert_eq!(n.starts, 3);
        assert!(n.incidents.is_empty(), "{:?}", n.incidents);
        drop(n);
        // Reaped and gone: no /proc entry (a zombie would still have one).
        assert!(!std::path::Path::new(&format!("/proc/{last}")).exists());
    }
}
