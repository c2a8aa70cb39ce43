//! `mqd` as an operator runs it: the `listening on <addr>` handshake, a graceful SIGTERM even
//! with open streams, and one broker per data directory.

use std::time::Duration;

use mq_client::{ConsumerOptions, Message, QueueOptions, SenderOptions};
use mq_tests::{mqd_command, wait_timeout, MqdProcess};

#[test]
fn prints_listening_line_first_and_serves_there() {
    let dir = tempfile::tempdir().unwrap();
    let mqd = MqdProcess::start(dir.path()).unwrap();
    assert!(
        mqd.first_line().starts_with("listening on 127.0.0.1:"),
        "{}",
        mqd.first_line()
    );
    assert_ne!(
        mqd.addr().port(),
        0,
        "port 0 must be resolved to the real port"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = mq_client::Client::connect(mqd.url()).await.unwrap();
        assert!(client.list_queues().await.unwrap().is_empty());
    });
}

#[test]
fn sigterm_exits_zero_with_idle_streams_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut mqd = MqdProcess::start(dir.path()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_client, sender, mut consumer) = rt.block_on(async {
        let client = mq_client::Client::connect(mqd.url()).await.unwrap();
        client
            .create_queue(r".\private$\open", QueueOptions::default())
            .await
            .unwrap();
        let q = client.queue(r".\private$\open").unwrap();
        let sender = q.sender(SenderOptions::default()).await.unwrap();
        // One acknowledged message proves the send stream is really open.
        let receipt = sender.send_with_receipt(Message::new("x")).await.unwrap();
        receipt.await.unwrap();
        let mut consumer = q.consumer(ConsumerOptions::default()).await.unwrap();
        let got = consumer.next(Duration::from_secs(5)).await.unwrap();
        assert!(got.is_some());
        // Now both streams are idle: the consumer waits for more, the sender has nothing to send.
        (client, sender, consumer)
    });
    let started = std::time::Instant::now();
    let status = mqd.terminate(Duration::from_secs(8)).unwrap();
    eprintln!("mqd exited {:?} after SIGTERM", started.elapsed());
    assert_eq!(status.code(), Some(0), "stderr: {}", mqd.stderr());
    // The open streams learn that the broker is gone, as errors, not hangs.
    rt.block_on(async {
        let r = consumer.next(Duration::from_secs(5)).await;
        assert!(
            matches!(r, Err(mq_client::Error::Unavailable(_))),
            "consumer after shutdown: {r:?}"
        );
        let r = match sender.send_with_receipt(Message::new("late")).await {
            Ok(receipt) => receipt.await.map(drop),
            Err(e) => Err(e),
        };
        assert!(
            matches!(r, Err(mq_client::Error::Unavailable(_))),
            "send after shutdown: {r:?}"
        );
    });
}

/// SIGHUP (what the systemd unit's `ExecReload` sends) rereads the users file; without one it
/// says there is nothing to reread and the broker serves on. Its default action ended an mqd
/// started without `--users` (helper-67), and systemd counts that as a clean stop.
#[test]
fn sighup_without_a_users_file_leaves_the_broker_running() {
    let dir = tempfile::tempdir().unwrap();
    let mut mqd = MqdProcess::start(dir.path()).unwrap();
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &mqd.pid().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    assert!(
        mq_tests::wait_until(Duration::from_secs(20), || mqd
            .stderr()
            .contains("SIGHUP: no users file to reread")
            || !mqd.is_running()),
        "{}",
        mqd.stderr()
    );
    assert!(mqd.is_running(), "mqd ended at SIGHUP: {}", mqd.stderr());
    let out = mq_tests::mq(
        mqd.url(),
        &["queue", "create", r".\private$\after-hup"],
        None,
    );
    assert!(out.status.success(), "{out:?}");
    let status = mqd.terminate(Duration::from_secs(8)).unwrap();
    assert_eq!(status.code(), Some(0), "stderr: {}", mqd.stderr());
}

#[test]
fn sigterm_exits_zero_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let mut mqd = MqdProcess::start(dir.path()).unwrap();
    let status = mqd.terminate(Duration::from_secs(8)).unwrap();
    assert_eq!(status.code(), Some(0), "stderr: {}", mqd.stderr());
}

#[test]
fn second_mqd_on_the_same_data_dir_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let _first = MqdProcess::start(dir.path()).unwrap();
    let mut second = mqd_command(dir.path(), &[]).spawn().unwrap();
    let mut stderr = second.stderr.take().unwrap();
    let status = wait_timeout(&mut second, Duration::from_secs(10)).unwrap();
    let Some(status) = status else {
        let _ = second.kill();
        let _ = second.wait();
        panic!("a second mqd on the same data directory kept running");
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut err).unwrap();
    assert!(!status.success(), "second mqd exited {status}");
    assert!(
        err.contains("in use by another running mqd")
            && err.contains(&dir.path().display().to_string()),
        "stderr should say the data directory is in use, and which: {err}"
    );
}

/// A `--listen` address another process holds ends mqd with one line that names the address
/// and the cause, exit status 1 (anyhow's report was four lines, and a backtrace under
/// RUST_BACKTRACE).
#[test]
fn a_taken_listen_address_is_one_line() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = mq_tests::mqd_command_on(&dir.path().join("data"), &addr, &[])
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run mqd");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("mqd: cannot listen on ")
            && last.contains(&addr)
            && last.contains("in use"),
        "{err}"
    );
    assert!(
        !err.contains("Caused by") && !err.contains("backtrace"),
        "{err}"
    );
}

/// Configuration mistakes found past the flags' parsing exit 2 (usage or configuration), as
/// `mqd --help` and the README say, not 1 (failed), which the systemd unit restarts every 2 s
/// (helper-73: a segment size out of range passed the flags, then stopped mqd with "internal
/// error", exit 1; so did a missing users file, an HTTP address protected mode refuses, a
/// right that does not exist).
#[test]
fn configuration_mistakes_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let missing = dir.path().join("missing.toml");
    let missing = missing.to_str().unwrap();
    for (args, says) in [
        (vec!["--journal-segment-bytes", "1000"], "4096"),
        (
            vec!["--journal-segment-bytes", "8589934592"],
            "journal-segment-bytes",
        ),
        (vec!["--users", missing], "missing.toml"),
        (vec!["--metrics-listen", "0.0.0.0:0"], "--http-insecure"),
    ] {
        let out = mq_tests::mqd_command(&data, &args)
            .output()
            .expect("run mqd");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("internal error"), "{args:?}: {err}");
    }
    let users = dir.path().join("users.toml");
    let out = std::process::Command::new(mq_tests::mqd_path())
        .args(["user", "add", "--users", users.to_str().unwrap(), "u"])
        .args(["--rights", "send,fly"])
        .env("MQD_PASSWORD", "pw")
        .output()
        .expect("run mqd user add");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("fly"), "{err}");
    assert!(!users.exists(), "nothing written");
}

/// A TLS certificate, key or client CA mqd cannot use stops it at once with a line naming the
/// file, before the journal is opened: it said only "the gRPC server failed: transport error",
/// after recovering the journal (helper-67), and the systemd unit restarts it every 2 s.
#[test]
fn unusable_tls_files_are_named_before_the_journal_is_opened() {
    let pki = mq_tests::TestPki::new("test CA");
    let (cert, key) = pki.issue("broker");
    let (_, other_key) = pki.issue("other");
    let garbage = pki.path("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let s = |p: &std::path::Path| p.to_str().unwrap().to_string();
    for (args, says) in [
        (
            vec!["--tls-cert", &s(&garbage), "--tls-key", &s(&key)],
            "garbage.pem",
        ),
        (
            vec!["--tls-cert", &s(&cert), "--tls-key", &s(&other_key)],
            "TLS",
        ),
        (
            vec![
                "--tls-cert",
                &s(&cert),
                "--tls-key",
                &s(&key),
                "--tls-client-ca",
                &s(&garbage),
            ],
            "client CA",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let out = mq_tests::mqd_command(&data, &args)
            .output()
            .expect("run mqd");
        let err = String::from_utf8_lossy(&out.stderr);
        // A configuration mistake: 2, so the systemd unit does not restart mqd on it.
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        let last = err.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("mqd: ") && last.contains(says),
            "{args:?}: {err}"
        );
        assert!(!last.contains("transport error"), "{err}");
        assert!(
            !data.join("journal").exists(),
            "{args:?}: the journal was opened first"
        );
    }
}
