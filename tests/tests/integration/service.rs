//! mqd as a service: `deploy/mqd.service` passes `systemd-analyze verify`, mqd tells the
//! service manager READY=1 after recovery and STOPPING=1 on SIGTERM (`$NOTIFY_SOCKET`), and
//! `--log-format json` writes one JSON object per line with identity, peer and queue fields.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use mq_tests::{mq, mq_path, mqd_command, mqd_path, run_with_timeout, temp_data_dir, MqdProcess};

const Q: &str = r".\private$\q";
const ORDERS: &str = r".\private$\orders";

fn repo_file(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

#[test]
fn unit_file_passes_systemd_analyze_verify() {
    let unit = std::fs::read_to_string(repo_file("deploy/mqd.service")).expect("the unit");
    for line in [
        "Type=notify",
        "ExecStart=/usr/local/bin/mqd --config /etc/mqd/mqd.toml",
        "StateDirectory=mqd",
        // Where a Unix socket can live under ProtectSystem=strict.
        "RuntimeDirectory=mqd",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "Restart=on-failure",
    ] {
        assert!(unit.lines().any(|l| l == line), "no `{line}` in the unit");
    }
    // The example config it reads keeps its data where StateDirectory makes it writable.
    let example = std::fs::read_to_string(repo_file("docs/examples/mqd.toml")).expect("example");
    assert!(example.lines().any(|l| l == "data-dir = \"/var/lib/mqd\""));

    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        eprintln!(
            "SKIPPED: systemd-analyze is not installed here; deploy/mqd.service not verified"
        );
        return;
    }
    // verify checks that ExecStart's program exists: point it at the mqd under test.
    let dir = temp_data_dir("unit-verify");
    let copy = dir.path().join("mqd.service");
    let mqd = mqd_path();
    std::fs::write(
        &copy,
        unit.replace("/usr/local/bin/mqd", mqd.to_str().expect("utf-8 path")),
    )
    .unwrap();
    let mut cmd = Command::new("systemd-analyze");
    cmd.arg("verify").arg(&copy);
    let out = run_with_timeout(cmd, None, Duration::from_secs(60)).expect("systemd-analyze runs");
    let err = String::from_utf8_lossy(&out.stderr);
    // It exits 0 on a mistyped key or value too; what it says about the unit is the verdict.
    let about_unit: Vec<&str> = err.lines().filter(|l| l.contains("mqd.service")).collect();
    assert!(
        out.status.success() && about_unit.is_empty(),
        "systemd-analyze verify: {:?}\n{err}",
        out.status
    );
}

/// Reads one notification (a datagram) from `sock`, waiting at most its read timeout.
fn next_notification(sock: &UnixDatagram) -> Option<String> {
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[test]
fn mqd_notifies_ready_after_recovery_and_stopping_on_sigterm() {
    let data = temp_data_dir("sd-notify");
    // Something to recover: a recoverable message from a first run.
    let mut first = MqdProcess::start(data.path()).expect("mqd starts");
    let url = first.url().to_string();
    assert!(mq(&url, &["queue", "create", Q], None).status.success());
    assert!(mq(&url, &["send", Q, "kept", "--recoverable"], None)
        .status
        .success());
    first.terminate(Duration::from_secs(30)).expect("stops");

    let sock_dir = temp_data_dir("sd-notify-sock");
    let sock_path = sock_dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("bind the notify socket");
    sock.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut cmd = mqd_command(data.path(), &[]);
    cmd.env("NOTIFY_SOCKET", &sock_path);
    let mut mqd = MqdProcess::spawn(cmd).expect("mqd starts");
    let ready = next_notification(&sock).expect("a notification after start");
    assert!(
        ready.lines().any(|l| l == "READY=1"),
        "first notification {ready:?}"
    );
    assert!(!ready.contains("STOPPING=1"));
    // Ready means recovered: the message of the first run is there to receive.
    let got = mq(mqd.url(), &["receive", Q, "--timeout", "5s"], None);
    assert!(got.status.success(), "{got:?}");
    assert_eq!(String::from_utf8_lossy(&got.stdout).trim(), "kept");
    // Nothing more until the signal.
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    assert_eq!(next_notification(&sock), None);
    sock.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let status = mqd.terminate(Duration::from_secs(30)).expect("stops");
    assert!(status.success(), "{status:?}");
    let stopping = next_notification(&sock).expect("a notification on SIGTERM");
    assert!(
        stopping.lines().any(|l| l == "STOPPING=1"),
        "notification on SIGTERM {stopping:?}"
    );
}

#[test]
fn json_logs_are_one_object_per_line_with_identity_peer_and_queue() {
    let dir = temp_data_dir("json-logs");
    let users = mq_tests::users_file(
        &dir.path().join("users.toml"),
        &[
            ("alice", "alice-pw", &[], &["create-queue"]),
            ("bob", "bob-pw", &[], &[]),
        ],
    );
    let data = dir.path().join("data");
    let mut mqd = MqdProcess::start_with_args(
        &data,
        &["--users", users.to_str().unwrap(), "--log-format", "json"],
    )
    .expect("mqd starts");
    let as_user = |user: &str, pw: &str, args: &[&str]| {
        let mut cmd = Command::new(mq_path());
        cmd.args(["--user", user])
            .args(args)
            .env("MQ_BROKER", mqd.url())
            .env("MQ_PASSWORD", pw);
        run_with_timeout(cmd, None, mq_tests::CLI_TIMEOUT).unwrap()
    };
    let made = as_user("alice", "alice-pw", &["queue", "create", ORDERS]);
    assert!(made.status.success(), "{made:?}");
    // A refusal: bob has no right on alice's queue.
    let refused = as_user("bob", "bob-pw", &["queue", "purge", ORDERS]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    mqd.terminate(Duration::from_secs(30)).expect("stops");

    let logs = mqd.stderr();
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON object ({e}): {l:?}"))
        })
        .collect();
    assert!(lines.len() >= 4, "too few log lines: {logs}");
    for l in &lines {
        assert!(l["timestamp"].is_string() && l["level"].is_string(), "{l}");
        assert!(l["message"].is_string(), "{l}");
    }
    let created = lines
        .iter()
        .find(|l| l["message"] == "queue created")
        .unwrap_or_else(|| panic!("no `queue created` line: {logs}"));
    assert_eq!(created["queue"], ORDERS, "{created}");
    let refusal = lines
        .iter()
        .find(|l| l["level"] == "WARN" && l["identity"] == "bob")
        .unwrap_or_else(|| panic!("no refusal line for bob: {logs}"));
    assert_eq!(refusal["queue"], ORDERS, "{refusal}");
    let peer = refusal["peer"].as_str().expect("peer is a string");
    assert!(peer.starts_with("127.0.0.1:"), "{refusal}");
    assert!(
        refusal["reason"].as_str().unwrap_or("").contains("admin"),
        "{refusal}"
    );
}
