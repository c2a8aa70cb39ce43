//! A broker that does not answer (`mqd` stopped with SIGSTOP; SIGCONT and a stop at the end), and
//! a broker that is not there: every `mq` command and client call ends at its deadline with a
//! clear error instead of hanging; `mq receive --timeout 2s` is a hard bound on the command's
//! wait; every failed `mq send --count N` (and `--tx`) ends with the `acknowledged K of N` line,
//! including failures to connect and at the start of a transaction.

use std::time::{Duration, Instant};

use mq_client::{Client, ClientOptions, Error, QueueOptions};
use mq_tests::{free_port, mq, temp_data_dir, MqdProcess, STOP_TIMEOUT};

const Q: &str = r".\private$\silent";
const TXQ: &str = r".\private$\silent-tx";
/// Far above every deadline used here, far below "hangs": the harness kills `mq` at 30 s.
const BOUND: Duration = Duration::from_secs(12);

/// Runs `mq` with `args` and returns (exit code, stderr's last line, how long it took).
fn run(url: &str, args: &[&str]) -> (Option<i32>, String, Duration) {
    let started = Instant::now();
    let out = mq(url, args, None);
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let last = err.lines().last().unwrap_or("").to_string();
    (out.status.code(), last, took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_broker_fails_every_command_at_its_deadline() {
    let dir = temp_data_dir("mq-silent-");
    let mut mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    mq_tests::create_default_queue(&client, Q).await;
    let tx_opts = QueueOptions {
        transactional: true,
        ..QueueOptions::default()
    };
    client.create_queue(TXQ, tx_opts).await.unwrap();
    let url = mqd.url().to_string();

    mqd.signal("STOP").unwrap();
    let cli_url = url.clone();
    let checks = move || {
        let url = cli_url;
        // `--timeout 2s` bounds the whole receive (and peek), connecting included.
        for verb in ["receive", "peek"] {
            let (code, last, took) = run(&url, &[verb, Q, "--timeout", "2s"]);
            assert_eq!(code, Some(1), "mq {verb}: {last}");
            assert!(
                last.contains("no answer from the broker"),
                "mq {verb}: {last}"
            );
            assert!(took < BOUND, "mq {verb} --timeout 2s took {took:?}");
        }
        let (code, last, took) = run(&url, &["receive", Q, "--count", "5", "--timeout", "2s"]);
        assert_eq!(code, Some(1), "{last}");
        assert!(took < BOUND, "mq receive --count 5 took {took:?}");
        // Other commands: the call deadline, once (connecting's protocol check that timed out
        // was let through, so the command waited a second deadline: 6 s here, helper-73).
        let (code, last, took) = run(&url, &["--call-timeout", "3s", "queue", "list"]);
        assert_eq!(code, Some(1), "{last}");
        assert!(
            last.contains("no answer") || last.contains("cannot reach"),
            "{last}"
        );
        // Two deadlines (the bug) are 6 s; starting and stopping mq on a loaded machine is
        // the rest.
        assert!(
            took < Duration::from_millis(5_500),
            "mq --call-timeout 3s queue list took {took:?}"
        );
        // Sends: the last line says how much was acknowledged.
        for args in [
            vec![
                "--call-timeout",
                "2s",
                "--connect-timeout",
                "2s",
                "send",
                Q,
                "x",
                "--count",
                "5",
            ],
            vec![
                "--call-timeout",
                "2s",
                "--connect-timeout",
                "2s",
                "send",
                Q,
                "x",
            ],
            vec![
                "--call-timeout",
                "2s",
                "--connect-timeout",
                "2s",
                "send",
                TXQ,
                "x",
                "--count",
                "5",
                "--tx",
            ],
        ] {
            let (code, last, took) = run(&url, &args);
            assert_eq!(code, Some(1), "mq {args:?}: {last}");
            let n = if args.contains(&"--count") { 5 } else { 1 };
            assert!(
                last.contains(&format!("acknowledged 0 of {n}")),
                "mq {args:?}: last line {last:?}"
            );
            assert!(took < BOUND, "mq {args:?} took {took:?}");
        }
    };
    let outcome = tokio::task::spawn_blocking(checks).await;

    // Client-crate calls fail at their deadline too.
    let quick = Client::connect_with(
        &url,
        ClientOptions {
            connect_timeout: Duration::from_secs(2),
            call_timeout: Duration::from_secs(2),
            ..ClientOptions::default()
        },
    )
    .await;
    let started = Instant::now();
    let r = match quick {
        Ok(c) => c.list_queues().await.map(|_| ()),
        Err(e) => Err(e),
    };
    let took = started.elapsed();
    mqd.signal("CONT").unwrap();
    outcome.unwrap();
    assert!(
        matches!(
            &r,
            Err(Error::Timeout(_) | Error::Unavailable(_) | Error::Connect { .. })
        ),
        "{r:?}"
    );
    assert!(took < BOUND, "a client call took {took:?}");
    // With the broker back, it answers.
    assert!(client.queue_info(Q).await.is_ok());
    mqd.terminate(STOP_TIMEOUT).unwrap();
}

#[test]
fn every_failed_send_ends_with_the_acknowledged_line_even_without_a_broker() {
    let url = format!("http://127.0.0.1:{}", free_port());
    for args in [
        vec!["send", Q, "x", "--count", "7"],
        vec!["send", Q, "x"],
        vec!["send", TXQ, "x", "--count", "7", "--tx"],
    ] {
        let (code, last, _) = run(&url, &args);
        assert_eq!(code, Some(1), "mq {args:?}: {last}");
        let n = if args.contains(&"--count") { 7 } else { 1 };
        assert!(
            last.contains("cannot reach the broker")
                && last.ends_with(&format!("acknowledged 0 of {n}")),
            "mq {args:?}: last line {last:?}"
        );
    }
}
