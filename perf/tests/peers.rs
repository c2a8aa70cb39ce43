//! mqperf against real peers: starts `rabbitmq-server` and `nats-server` when they are
//! installed (bound to 127.0.0.1 on free ports, data and logs in temporary directories,
//! stopped by PID / process group; RabbitMQ's `epmd` on its own port, stopped with
//! `epmd -kill`), runs tiny scenarios against each, and checks the rows. Skips, printing why,
//! when a server is not installed. RabbitMQ boots once per test run.
//!
//! Index:
//! - `peers_run_the_scenarios`: NOTX express SENDANDRECEIVE against both side by side
//!   (messages, mapping, versions), recoverable and TX SENDANDPURGE (fsync flags), and a
//!   SERVER/CLIENT pair against each; the spread shape (--clients 3 --queues 4 --consumers 4)
//!   with its per-consumer counts; a SERVER that gets 10 of 30 messages gives up after
//!   --timeout, through the consumer and through --receive-one.
//! - `unreachable_peer_is_one_line`: the binary against closed ports: exit 1, one line naming
//!   the URL (no server needed).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mq_perf::payload::{FormatterKind, PayloadKind};
use mq_perf::{Config, DeliveryKind, Mode, Row, Scenario, Target};

const RABBITMQ: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";
const COUNT: u64 = 30;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// Waits (bounded) until something accepts on 127.0.0.1:port, or the process exits.
fn wait_listening(child: &mut Child, port: u16, limit: Duration, log: &Path) {
    let start = Instant::now();
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "the server exited ({status}) before listening on {port}; log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            start.elapsed() < limit,
            "nothing listens on 127.0.0.1:{port} after {limit:?}; log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A server process, stopped (with its process group) when dropped.
struct Server {
    child: Child,
    epmd_port: Option<u16>,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        // The process group (RabbitMQ's script and its beam.smp), then the process itself.
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{pid}")])
            .status();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(port) = self.epmd_port {
            let _ = Command::new("epmd")
                .env("ERL_EPMD_PORT", port.to_string())
                .env("ERL_EPMD_ADDRESS", "127.0.0.1")
                .arg("-kill")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn spawn_rabbitmq() -> Option<(Server, u16)> {
    if !Path::new(RABBITMQ).is_file() {
        println!(
            "skipping RabbitMQ: {RABBITMQ} is not installed (apt-get install rabbitmq-server)"
        );
        return None;
    }
    let dir = tempfile::Builder::new()
        .prefix("mqperf-rabbit-")
        .tempdir()
        .unwrap();
    let d = dir.path();
    let (port, dist, epmd) = (free_port(), free_port(), free_port());
    std::fs::write(d.join("enabled_plugins"), "[].\n").unwrap();
    let log = d.join("server.log");
    let child = {
        use std::os::unix::process::CommandExt;
        Command::new(RABBITMQ)
            .current_dir(d)
            .env("HOME", d)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", port.to_string())
            .env("RABBITMQ_DIST_PORT", dist.to_string())
            .env("ERL_EPMD_PORT", epmd.to_string())
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env(
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                "-kernel inet_dist_use_interface {127,0,0,1}",
            )
            .env("RABBITMQ_NODENAME", format!("mqperf{port}@localhost"))
            .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", d.join("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", d.join("rabbitmq"))
            .env("RABBITMQ_ADVANCED_CONFIG_FILE", d.join("advanced.config"))
            .env("RABBITMQ_CONF_ENV_FILE", d.join("rabbitmq-env.conf"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(d.join("server.err")).unwrap())
            .process_group(0)
            .spawn()
            .unwrap()
    };
    Some((
        Server {
            child,
            epmd_port: Some(epmd),
            _dir: dir,
        },
        port,
    ))
}

fn spawn_nats() -> Option<(Server, u16)> {
    let Some(bin) = on_path("nats-server") else {
        println!("skipping NATS: nats-server is not installed (apt-get install nats-server)");
        return None;
    };
    let dir = tempfile::Builder::new()
        .prefix("mqperf-nats-")
        .tempdir()
        .unwrap();
    let port = free_port();
    let log = dir.path().join("server.log");
    let child = {
        use std::os::unix::process::CommandExt;
        Command::new(bin)
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(dir.path().join("js"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .process_group(0)
            .spawn()
            .unwrap()
    };
    Some((
        Server {
            child,
            epmd_port: None,
            _dir: dir,
        },
        port,
    ))
}

fn config(mode: Mode, scenario: Scenario, targets: Vec<Target>) -> Config {
    let mut c = Config::new(mode, scenario, r".\private$\peertest");
    c.payloads = PayloadKind::parse_list("string:100,int").unwrap();
    c.formatters = FormatterKind::parse_list("raw,binary").unwrap();
    c.count = COUNT;
    c.runs = 1;
    c.timeout = Duration::from_secs(30);
    c.json = true;
    c.targets = targets;
    c
}

async fn run(c: &Config) -> Vec<Row> {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    mq_perf::run_all(c, &mut out, &mut err)
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", String::from_utf8_lossy(&err)))
}

/// Connects until it works (RabbitMQ listens a little before it accepts logins).
async fn wait_ready(target: &Target) {
    let start = Instant::now();
    let mut c = config(Mode::Notx, Scenario::SendAndPurge, vec![target.clone()]);
    c.count = 1;
    c.payloads = PayloadKind::parse_list("int").unwrap();
    c.formatters = FormatterKind::parse_list("raw").unwrap();
    loop {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        match mq_perf::run_all(&c, &mut out, &mut err).await {
            Ok(_) => return,
            Err(e) if start.elapsed() < Duration::from_secs(90) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("{} is not ready after 90 s: {e:#}", target.display_url()),
        }
    }
}

fn check_rows(rows: &[Row], target: &str, ops: &[&str], fsync: bool) {
    let mine: Vec<&Row> = rows.iter().filter(|r| r.target == target).collect();
    // 2 payloads x 2 formatters.
    assert_eq!(mine.len(), 4 * ops.len(), "{target}: {mine:?}");
    for r in &mine {
        assert!(!r.skipped, "{target}: {r:?}");
        assert!(ops.contains(&r.op.as_str()), "{target}: {}", r.op);
        assert_eq!(
            r.messages, COUNT,
            "{target} {} {}/{}",
            r.op, r.payload, r.formatter
        );
        assert!(r.msgs_per_s.unwrap() > 0.0);
        assert_eq!(r.fsync_before_ack, fsync, "{target} {}", r.delivery);
        assert!(!r.mapping.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_run_the_scenarios() {
    // Both boot at once; RabbitMQ takes seconds.
    let rabbit = spawn_rabbitmq();
    let nats = spawn_nats();
    let mut targets = Vec::new();
    let mut servers = Vec::new();
    if let Some((mut s, port)) = rabbit {
        wait_listening(
            &mut s.child,
            port,
            Duration::from_secs(120),
            &s._dir.path().join("server.log"),
        );
        let t = Target::parse(&format!("amqp://guest:guest@127.0.0.1:{port}")).unwrap();
        wait_ready(&t).await;
        targets.push(t);
        servers.push(s);
    }
    if let Some((mut s, port)) = nats {
        wait_listening(
            &mut s.child,
            port,
            Duration::from_secs(30),
            &s._dir.path().join("server.log"),
        );
        let t = Target::parse(&format!("nats://127.0.0.1:{port}")).unwrap();
        wait_ready(&t).await;
        targets.push(t);
        servers.push(s);
    }
    if targets.is_empty() {
        println!("skipping: neither rabbitmq-server nor nats-server is installed");
        return;
    }

    // NOTX express SENDANDRECEIVE, the peers side by side.
    let rows = run(&config(
        Mode::Notx,
        Scenario::SendAndReceive,
        targets.clone(),
    ))
    .await;
    for t in &targets {
        check_rows(&rows, t.kind(), &["send", "receive", "e2e"], false);
        let r = rows.iter().find(|r| r.target == t.kind()).unwrap();
        assert!(r.mapping.starts_with("express:"), "{}", r.mapping);
        if t.kind() == "nats" {
            assert!(
                r.target_version
                    .as_deref()
                    .is_some_and(|v| v.starts_with('2')),
                "{r:?}"
            );
        }
        assert!(
            !r.broker.contains("guest:guest"),
            "the password is not reported"
        );
    }

    // Recoverable and TX SENDANDPURGE: RabbitMQ fsyncs before confirming, NATS does not.
    for mode in [Mode::Notx, Mode::Tx] {
        let mut c = config(mode, Scenario::SendAndPurge, targets.clone());
        c.delivery = DeliveryKind::Recoverable;
        let rows = run(&c).await;
        for t in &targets {
            check_rows(&rows, t.kind(), &["send"], t.kind() == "rabbitmq");
        }
    }

    // --send-one: every confirm or publish ack awaited before the next publish; said so.
    let mut c = config(Mode::Notx, Scenario::SendAndReceive, targets.clone());
    c.send_one = true;
    let rows = run(&c).await;
    for t in &targets {
        check_rows(&rows, t.kind(), &["send", "receive", "e2e"], false);
        let r = rows.iter().find(|r| r.target == t.kind()).unwrap();
        assert!(r.mapping.contains("(--send-one)"), "{}", r.mapping);
    }

    // --receive-one: a basic.get or a pull request of one message per receive; said so. NOTX
    // express and TX (where RabbitMQ commits each get's ack).
    for mode in [Mode::Notx, Mode::Tx] {
        let mut c = config(mode, Scenario::SendAndReceive, targets.clone());
        c.receive_one = true;
        let rows = run(&c).await;
        for t in &targets {
            let fsync = mode == Mode::Tx && t.kind() == "rabbitmq";
            check_rows(&rows, t.kind(), &["send", "receive", "e2e"], fsync);
            let r = rows.iter().find(|r| r.target == t.kind()).unwrap();
            assert!(r.mapping.contains("(--receive-one)"), "{}", r.mapping);
        }
    }

    // SERVER and CLIENT, one peer at a time, in two tasks.
    for t in &targets {
        let mut server = config(Mode::Tx, Scenario::Server, vec![t.clone()]);
        server.response_queue = Some(r".\private$\peerreply".to_string());
        let mut client = server.clone();
        client.scenario = Scenario::Client;
        let s = tokio::spawn(async move { run(&server).await });
        let client_rows = run(&client).await;
        let server_rows = s.await.unwrap();
        check_rows(
            &client_rows,
            t.kind(),
            &["send", "e2e"],
            t.kind() == "rabbitmq",
        );
        check_rows(&server_rows, t.kind(), &["receive"], t.kind() == "rabbitmq");
    }

    // The spread shape: 3 senders (connections), 4 queues, one consumer each; every consumer
    // gets its queue's share (30 messages: 8, 8, 7, 7) in the receive and e2e phases.
    let mut c = config(Mode::Notx, Scenario::SendAndReceive, targets.clone());
    c.queue = r".\private$\peerspread".to_string();
    c.clients = 3;
    c.queues = 4;
    c.consumers = Some(4);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let rows = mq_perf::run_all(&c, &mut out, &mut err)
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", String::from_utf8_lossy(&err)));
    // The banner (stderr with --json) names the queues and connections of each peer.
    let banner = String::from_utf8_lossy(&err);
    for t in &targets {
        check_rows(&rows, t.kind(), &["send", "receive", "e2e"], false);
        for r in rows
            .iter()
            .filter(|r| r.target == t.kind() && r.op != "send")
        {
            assert_eq!(
                (r.consumer_min, r.consumer_max),
                (Some(7), Some(8)),
                "{} {}",
                t.kind(),
                r.op
            );
        }
    }
    let shape =
        "(queues mqperf_peerspread-0_express ... mqperf_peerspread-3_express, 3 connections)";
    assert_eq!(banner.matches(shape).count(), targets.len(), "{banner}");

    // A receiver that stops getting messages gives up after --timeout with the count it got,
    // through the consumer (RabbitMQ basic.consume, NATS pull batches) and through --receive-one
    // (basic.get asked again every 1 ms, NATS pull of one). The SERVER waits for 30 messages, the
    // CLIENT sends 10 (and gets no reply).
    for t in &targets {
        for one in [false, true] {
            let timeout = Duration::from_secs(2);
            let mut server = config(Mode::Notx, Scenario::Server, vec![t.clone()]);
            server.queue = format!(r".\private$\peerstall{}", u8::from(one));
            server.response_queue = Some(r".\private$\peerstallreply".to_string());
            server.payloads = PayloadKind::parse_list("int").unwrap();
            server.formatters = FormatterKind::parse_list("raw").unwrap();
            server.timeout = timeout;
            server.receive_one = one;
            let mut client = server.clone();
            client.scenario = Scenario::Client;
            client.count = 10;
            let s = tokio::spawn(async move {
                let (mut out, mut err) = (Vec::new(), Vec::new());
                let start = Instant::now();
                let r = mq_perf::run_all(&server, &mut out, &mut err).await;
                (r.map(|_| ()), start.elapsed())
            });
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let c = mq_perf::run_all(&client, &mut out, &mut err).await;
            let c = format!("{:#}", c.expect_err("the CLIENT gets no reply"));
            assert!(c.contains("no reply from the SERVER"), "{}: {c}", t.kind());
            let (r, elapsed) = s.await.unwrap();
            let e = format!("{:#}", r.expect_err("the SERVER got 10 of 30"));
            assert!(
                e.contains("got 10 of 30 messages") && e.contains("nothing more arrived within 2s"),
                "{} (receive_one {one}): {e}",
                t.kind()
            );
            // The SERVER waited for its first message for ever, then gave up one --timeout
            // after the last: well under this bound even on a loaded machine.
            assert!(elapsed < Duration::from_secs(60), "{elapsed:?}");
        }
    }
    drop(servers);
}

/// mqperf sending one message to the peer at `url`.
fn one_message_to(url: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mqperf"));
    c.args([
        "NOTX",
        "SENDANDPURGE",
        r".\private$\q",
        "--count",
        "1",
        "--target",
        url,
    ]);
    c
}

#[test]
fn unreachable_peer_is_one_line() {
    for url in [
        format!("amqp://guest:secret@127.0.0.1:{}", free_port()),
        format!("nats://127.0.0.1:{}", free_port()),
    ] {
        let o = one_message_to(&url).output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        let shown = url.replace("secret", "***");
        assert!(stderr.contains(&shown), "{stderr}");
        assert!(!stderr.contains("secret"), "{stderr}");
        assert!(o.stdout.is_empty(), "nothing measured");
    }
}

/// A port where something accepts the TCP connection but never speaks AMQP (another process
/// that took the port, a firewall's tarpit): mqperf gives up after its connect timeout (10 s)
/// with one line, instead of waiting for the handshake for ever (it did: `lapin`'s connect has
/// no timeout of its own; this test's sibling above hung once in CI).
#[test]
fn silent_amqp_peer_is_one_line_within_the_connect_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Accept and hold connections, saying nothing, until the test ends.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in listener.incoming().flatten() {
            held.push(c);
        }
    });
    let url = format!("amqp://guest:secret@127.0.0.1:{port}");
    let mut child = one_message_to(&url)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: the connect timeout with room for a loaded machine; killed by its handle if not.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mqperf still waiting for a silent AMQP peer after 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("no AMQP connection within"), "{stderr}");
    assert!(!stderr.contains("secret"), "{stderr}");
}
