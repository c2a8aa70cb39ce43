//! mqperf's integration tests: every scenario at small counts against a real (embedded)
//! broker, with its numbers checked for sanity (never for speed), and the binary's command
//! line (usage errors, exit codes, JSON lines).
//!
//! Index:
//! - scenarios, in-process: `send_and_purge`, `send_and_receive`, `server_and_client_pair`,
//!   `skipped_combinations_are_reported`; TX: `tx_send_and_receive`, `tx_send_and_purge`,
//!   `tx_concurrent_clients_share_the_count`, `tx_server_and_client_pair`, `tx_one_at_a_time`.
//! - the binary: `usage_errors_exit_2_naming_the_choices`,
//!   `mode_must_match_an_existing_queue_one_line`,
//!   `unreachable_broker_is_one_line`, `json_lines_carry_the_required_keys`,
//!   `table_starts_with_the_banner`, `recoverable_runs_or_reports_the_brokers_error`.
//! - store-and-forward (`--forward`): `forward_send_and_receive_exits_0` (the binary, two
//!   embedded brokers), `forward_against_two_brokers_leaves_them_empty`,
//!   `forward_tx_server_and_client_pair`, `forward_usage_errors_exit_2`.
//! - load shape (the binary against a broker in the test process, `--broker-pid` = the test):
//!   `rate_queues_and_consumers_against_a_running_broker` (`--rate` caps the achieved rate,
//!   per-consumer counts, queues left empty), `backlog_fill_drain_and_rss_line` (`--backlog`,
//!   `--ack-each`, the `rss:` line), `load_shape_usage_errors_exit_2` (and `--help`).

use std::process::{Command, Output};
use std::time::Duration;

use mq_perf::payload::{FormatterKind, PayloadKind};
use mq_perf::{ComboResult, Config, DeliveryKind, EmbeddedBroker, Mode, Op, Outcome, Scenario};

const COUNT: u64 = 200;
const RUNS: u32 = 2;

fn config(scenario: Scenario, payloads: &str, formatters: &str) -> Config {
    let mut c = Config::new(Mode::Notx, scenario, r".\private$\perf");
    c.payloads = PayloadKind::parse_list(payloads).unwrap();
    c.formatters = FormatterKind::parse_list(formatters).unwrap();
    c.count = COUNT;
    c.runs = RUNS;
    c.timeout = Duration::from_secs(10);
    c
}

async fn run(c: &Config) -> (Vec<ComboResult>, String) {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let results = mq_perf::run(c, &mut out, &mut err)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    (results, String::from_utf8(out).unwrap())
}

/// Every measured op of every combination processed COUNT x RUNS messages (acknowledged, or
/// received and decoded equal to the payload), at a positive rate, with ordered percentiles.
fn check_sane(results: &[ComboResult], ops: &[Op]) {
    for r in results {
        let name = format!("{}/{}", r.payload, r.formatter);
        let Outcome::Measured(measured) = &r.outcome else {
            continue;
        };
        let got: Vec<Op> = measured.iter().map(|o| o.op).collect();
        assert_eq!(got, ops, "{name}");
        for o in measured {
            let what = format!("{name} {}", o.op.name());
            assert_eq!(o.runs.len(), RUNS as usize, "{what}");
            for run in &o.runs {
                assert_eq!(run.messages, COUNT, "{what}");
                assert!(run.rate() > 0.0, "{what}");
            }
            assert_eq!(o.messages(), COUNT * RUNS as u64, "{what}");
            let rate = o.rate().unwrap();
            assert!(rate.min > 0.0 && rate.min <= rate.median && rate.median <= rate.max);
            let l = &o.latency;
            assert!(l.samples() > 0, "{what}");
            let (p50, p99, p999) = (
                l.quantile_us(0.5).unwrap(),
                l.quantile_us(0.99).unwrap(),
                l.quantile_us(0.999).unwrap(),
            );
            assert!(
                p50 > 0.0 && p50 <= p99 && p99 <= p999,
                "{what}: {p50} {p99} {p999}"
            );
        }
        if let Some(send) = measured.iter().find(|o| o.op == Op::Send) {
            // 200 messages: every send carries a receipt.
            assert_eq!(mq_perf::sample_every(COUNT), 1);
            assert_eq!(send.latency.samples(), COUNT * RUNS as u64, "{name}");
        }
    }
}

fn measured(results: &[ComboResult]) -> Vec<String> {
    results
        .iter()
        .filter(|r| r.skipped().is_none())
        .map(|r| format!("{}/{}", r.payload, r.formatter))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_and_purge() {
    let c = config(
        Scenario::SendAndPurge,
        "empty,int,string:1000",
        "raw,binary",
    );
    let (results, table) = run(&c).await;
    assert_eq!(results.len(), 6);
    assert_eq!(measured(&results).len(), 6);
    check_sane(&results, &[Op::Send]);
    assert!(table.contains("string:1000"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_and_receive() {
    // Against a broker of our own, to see the queue empty afterwards.
    let broker = EmbeddedBroker::start(0).await.unwrap();
    let mut c = config(
        Scenario::SendAndReceive,
        "order,string:1000,empty,int",
        "manual,xml,raw",
    );
    c.broker = Some(broker.url().to_string());
    let (results, _) = run(&c).await;
    assert_eq!(results.len(), 12);
    let skipped: Vec<_> = results.iter().filter(|r| r.skipped().is_some()).collect();
    assert_eq!(skipped.len(), 1);
    assert_eq!(
        (skipped[0].payload.as_str(), skipped[0].formatter),
        ("order", "raw")
    );
    for want in [
        "order/manual",
        "order/xml",
        "string:1000/raw",
        "empty/raw",
        "int/raw",
    ] {
        assert!(measured(&results).contains(&want.to_string()), "{want}");
    }
    check_sane(&results, &[Op::Send, Op::Receive, Op::E2e]);
    let client = mq_client::Client::connect(broker.url()).await.unwrap();
    let info = client.queue_info(r".\private$\perf").await.unwrap();
    assert_eq!((info.messages, info.in_flight), (0, 0));
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_and_client_pair() {
    let broker = EmbeddedBroker::start(0).await.unwrap();
    let mut c = config(Scenario::Server, "order,string:1000,int", "manual,xml,raw");
    c.broker = Some(broker.url().to_string());
    c.response_queue = Some(r".\private$\perf_reply".to_string());
    let server_config = c.clone();
    let server = tokio::spawn(async move { run(&server_config).await.0 });
    c.scenario = Scenario::Client;
    let client = tokio::spawn(async move { run(&c).await.0 });
    let (server, client) = (server.await.unwrap(), client.await.unwrap());
    assert_eq!(server.len(), 9);
    assert_eq!(measured(&server), measured(&client));
    assert_eq!(measured(&server).len(), 8, "order/raw is skipped by both");
    check_sane(&server, &[Op::Receive]);
    check_sane(&client, &[Op::Send, Op::E2e]);
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipped_combinations_are_reported() {
    let mut c = config(Scenario::SendAndPurge, "order", "raw");
    c.json = true;
    let (results, out) = run(&c).await;
    assert_eq!(results.len(), 1);
    let reason = results[0].skipped().expect("skipped");
    assert!(reason.contains("raw"), "{reason}");
    let row: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(row["skipped"], true);
    assert_eq!(row["reason"], reason);
    assert_eq!(row["op"], "send");
}

/// TX against a broker of our own: the queue is created transactional, and every message is
/// committed on the way in and on the way out (none left, none in flight).
async fn run_tx(
    scenario: Scenario,
    payloads: &str,
    formatters: &str,
    clients: u32,
) -> Vec<ComboResult> {
    let broker = EmbeddedBroker::start(0).await.unwrap();
    let mut c = config(scenario, payloads, formatters);
    c.mode = Mode::Tx;
    c.queue = r".\private$\tx".to_string();
    c.clients = clients;
    c.json = true;
    c.broker = Some(broker.url().to_string());
    let (results, out) = run(&c).await;
    for line in out.lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(row["mode"], "TX", "{row}");
        assert_eq!(row["delivery"], "transactional", "{row}");
        assert_eq!(row["clients"], clients, "{row}");
    }
    let client = mq_client::Client::connect(broker.url()).await.unwrap();
    let info = client.queue_info(&c.queue).await.unwrap();
    assert!(info.transactional);
    assert_eq!((info.messages, info.in_flight), (0, 0));
    broker.stop().await.unwrap();
    results
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_send_and_receive() {
    let results = run_tx(
        Scenario::SendAndReceive,
        "empty,string:1000,order",
        "raw,binary,manual",
        1,
    )
    .await;
    assert_eq!(results.len(), 9);
    // raw cannot carry an order.
    assert_eq!(measured(&results).len(), 8, "{:?}", measured(&results));
    check_sane(&results, &[Op::Send, Op::Receive, Op::E2e]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_send_and_purge() {
    let results = run_tx(Scenario::SendAndPurge, "int,string:1000", "json,raw", 1).await;
    assert_eq!(measured(&results).len(), 4);
    check_sane(&results, &[Op::Send]);
}

/// `--one-at-a-time` (each send a begin, send, commit awaited before the next; each receive a
/// begin, receive_and_commit with `--receive-and-commit`, else begin, receive, commit), in both
/// scenarios that run it (its loop runs in a task on a runtime worker in each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_one_at_a_time() {
    for (scenario, receive_and_commit, ops) in [
        (Scenario::SendAndPurge, false, &[Op::Send][..]),
        (
            Scenario::SendAndReceive,
            false,
            &[Op::Send, Op::Receive, Op::E2e][..],
        ),
        (
            Scenario::SendAndReceive,
            true,
            &[Op::Send, Op::Receive, Op::E2e][..],
        ),
    ] {
        let broker = EmbeddedBroker::start(0).await.unwrap();
        let mut c = config(scenario, "string:1000", "raw");
        c.mode = Mode::Tx;
        c.queue = r".\private$\txone".to_string();
        c.one_at_a_time = true;
        c.receive_and_commit = receive_and_commit;
        c.broker = Some(broker.url().to_string());
        let (results, _) = run(&c).await;
        assert_eq!(measured(&results).len(), 1, "{scenario:?}");
        check_sane(&results, ops);
        let client = mq_client::Client::connect(broker.url()).await.unwrap();
        let info = client.queue_info(&c.queue).await.unwrap();
        assert_eq!((info.messages, info.in_flight), (0, 0), "{scenario:?}");
        broker.stop().await.unwrap();
    }
}

/// `--send-one` and `--receive-one` (every send one `Queue::send` or `Queue::send_tx`, every
/// receive one unary `Queue::receive`, each awaited) in each delivery: every message arrives
/// once and decodes equal, and nothing is left in the queue or in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_one_and_receive_one_in_every_delivery() {
    let broker = EmbeddedBroker::start(0).await.unwrap();
    let client = mq_client::Client::connect(broker.url()).await.unwrap();
    for (mode, delivery, queue) in [
        (Mode::Notx, DeliveryKind::Express, r".\private$\one-express"),
        (
            Mode::Notx,
            DeliveryKind::Recoverable,
            r".\private$\one-stored",
        ),
        (Mode::Tx, DeliveryKind::Express, r".\private$\one-tx"),
    ] {
        let mut c = config(Scenario::SendAndReceive, "string:1000", "raw");
        c.mode = mode;
        c.delivery = delivery;
        c.queue = queue.to_string();
        c.send_one = true;
        c.receive_one = true;
        c.broker = Some(broker.url().to_string());
        let (results, out) = run(&c).await;
        assert_eq!(measured(&results).len(), 1, "{queue}");
        check_sane(&results, &[Op::Send, Op::Receive, Op::E2e]);
        assert!(out.contains("one Queue::send"), "{out}");
        assert!(out.contains("one unary Queue::receive"), "{out}");
        let info = client.queue_info(queue).await.unwrap();
        assert_eq!((info.messages, info.in_flight), (0, 0), "{queue}");
        // Each run receives COUNT messages in its receive phase and COUNT more in its e2e.
        assert_eq!(info.received, 2 * u64::from(RUNS) * COUNT, "{queue}");
    }
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_concurrent_clients_share_the_count() {
    // 200 over 3 clients: 67 + 67 + 66, every message decoded equal by the one receiver.
    let results = run_tx(Scenario::SendAndReceive, "string:1000", "xml", 3).await;
    assert_eq!(measured(&results).len(), 1);
    check_sane(&results, &[Op::Send, Op::Receive, Op::E2e]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_server_and_client_pair() {
    let broker = EmbeddedBroker::start(0).await.unwrap();
    let mut c = config(Scenario::Server, "order,int", "binary,raw");
    c.mode = Mode::Tx;
    c.queue = r".\private$\txs".to_string();
    c.broker = Some(broker.url().to_string());
    c.response_queue = Some(r".\private$\txs_reply".to_string());
    let server_config = c.clone();
    let server = tokio::spawn(async move { run(&server_config).await.0 });
    c.scenario = Scenario::Client;
    let client = tokio::spawn(async move { run(&c).await.0 });
    let (server, client) = (server.await.unwrap(), client.await.unwrap());
    assert_eq!(measured(&server), measured(&client));
    assert_eq!(measured(&server).len(), 3, "order/raw is skipped by both");
    check_sane(&server, &[Op::Receive]);
    check_sane(&client, &[Op::Send, Op::E2e]);
    broker.stop().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// The binary

fn mqperf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mqperf"))
        .args(args)
        .output()
        .expect("run mqperf")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn usage_errors_exit_2_naming_the_choices() {
    let q = r".\private$\perf";
    for (args, needle) in [
        (vec!["XACT", "SENDANDPURGE", q], "NOTX"),
        (vec!["NOTX", "SENDANDBURN", q], "SENDANDRECEIVE"),
        (
            vec!["NOTX", "SENDANDPURGE", q, "--payload", "blob"],
            "string:N",
        ),
        (
            vec!["NOTX", "SENDANDPURGE", q, "--formatter", "soap"],
            "manual",
        ),
        (
            vec!["NOTX", "SENDANDPURGE", q, "--delivery", "fast"],
            "recoverable",
        ),
        (vec!["NOTX", "SERVER", q], "RESPONSE-QUEUE"),
        (vec!["NOTX", "CLIENT", q], "RESPONSE-QUEUE"),
        (
            vec!["TX", "CLIENT", q, r".\private$\r", "--clients", "2"],
            "--clients",
        ),
        (vec!["TX", "SENDANDPURGE", q, "--clients", "0"], "clients"),
        (vec!["NOTX", "SENDANDPURGE", q, "--count", "0"], "count"),
        (
            vec!["TX", "SENDANDRECEIVE", q, "--send-one", "--one-at-a-time"],
            "--one-at-a-time",
        ),
        (
            vec!["NOTX", "SENDANDRECEIVE", q, "--receive-one", "--ack-each"],
            "--ack-each",
        ),
        (
            vec![
                "TX",
                "SENDANDRECEIVE",
                q,
                "--one-at-a-time",
                "--receive-and-commit",
                "--target",
                "amqp://guest:guest@127.0.0.1:5672",
            ],
            "--receive-and-commit applies to the mq target only",
        ),
        (
            vec![
                "NOTX",
                "SENDANDRECEIVE",
                q,
                "--rate",
                "1000",
                "--target",
                "nats://127.0.0.1:4222",
            ],
            "--rate applies to the mq target only",
        ),
        // The spread shape works with a peer in NOTX SENDANDRECEIVE only, one consumer a queue.
        (
            vec![
                "TX",
                "SENDANDRECEIVE",
                q,
                "--queues",
                "4",
                "--target",
                "nats://127.0.0.1:4222",
            ],
            "--queues with --target nats://127.0.0.1:4222 applies to NOTX SENDANDRECEIVE only",
        ),
        (
            vec![
                "NOTX",
                "SENDANDPURGE",
                q,
                "--clients",
                "4",
                "--target",
                "amqp://guest:guest@127.0.0.1:5672",
            ],
            "--clients with --target amqp://guest:***@127.0.0.1:5672 applies to NOTX SENDANDRECEIVE only",
        ),
        (
            vec![
                "NOTX",
                "SENDANDRECEIVE",
                q,
                "--queues",
                "2",
                "--consumers",
                "4",
                "--target",
                "nats://127.0.0.1:4222",
            ],
            "one consumer per queue (--consumers 2)",
        ),
        (vec!["NOTX", "SENDANDPURGE", "no such name"], "no such name"),
        (vec!["NOTX"], "Usage"),
    ] {
        let o = mqperf(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
        assert!(o.stdout.is_empty(), "{args:?}");
    }
}

/// Runs the binary against `url` (a broker in this test's runtime) without blocking it.
async fn mqperf_at(url: &str, args: &[&str]) -> Output {
    let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    args.extend(["--broker".to_string(), url.to_string()]);
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        mqperf(&args)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_must_match_an_existing_queue_one_line() {
    let broker = EmbeddedBroker::start(0).await.unwrap();
    let client = mq_client::Client::connect(broker.url()).await.unwrap();
    let plain = r".\private$\plain";
    let tx = r".\private$\txq";
    client
        .create_queue(plain, mq_client::QueueOptions::default())
        .await
        .unwrap();
    let options = mq_client::QueueOptions {
        transactional: true,
        ..Default::default()
    };
    client.create_queue(tx, options).await.unwrap();
    for (mode, queue, needle) in [
        ("TX", plain, "TX needs a transactional queue"),
        ("NOTX", tx, "NOTX needs a non-transactional queue"),
    ] {
        let o = mqperf_at(
            broker.url(),
            &[mode, "SENDANDPURGE", queue, "--count", "10"],
        )
        .await;
        assert_eq!(o.status.code(), Some(1), "{mode}: {}", stderr(&o));
        let e = stderr(&o);
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(e.starts_with("mqperf: error:"), "{e}");
        assert!(e.contains(needle) && e.contains(queue), "{e}");
        // Refused before anything was sent.
        assert_eq!(client.queue_info(queue).await.unwrap().messages, 0);
    }
    // The matching mode runs (TX on the transactional queue), with the JSON naming it.
    let o = mqperf_at(
        broker.url(),
        &[
            "TX",
            "SENDANDPURGE",
            tx,
            "--payload",
            "int",
            "--formatter",
            "raw",
            "--count",
            "10",
            "--runs",
            "1",
            "--json",
        ],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let row: serde_json::Value =
        serde_json::from_str(String::from_utf8(o.stdout).unwrap().trim()).unwrap();
    assert_eq!(
        (&row["mode"], &row["delivery"]),
        (&"TX".into(), &"transactional".into())
    );
    assert_eq!(row["messages"], 10);
    broker.stop().await.unwrap();
}

#[test]
fn unreachable_broker_is_one_line() {
    let o = mqperf(&[
        "NOTX",
        "SENDANDPURGE",
        r".\private$\perf",
        "--broker",
        "http://127.0.0.1:1",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains("http://127.0.0.1:1"), "{e}");
}

#[test]
fn json_lines_carry_the_required_keys() {
    let o = mqperf(&[
        "NOTX",
        "SENDANDRECEIVE",
        r".\private$\perf",
        "--payload",
        "order,int",
        "--formatter",
        "raw,json",
        "--count",
        "50",
        "--runs",
        "1",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // The banner goes to stderr, so stdout is nothing but JSON lines.
    assert!(stderr(&o).contains("SENDANDRECEIVE"));
    let stdout = String::from_utf8(o.stdout).unwrap();
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    // 4 combinations x 3 ops.
    assert_eq!(rows.len(), 12, "{stdout}");
    let keys = [
        "op",
        "mode",
        "delivery",
        "payload",
        "formatter",
        "body_bytes",
        "count",
        "runs",
        "msgs_per_s",
        "msgs_per_s_min",
        "msgs_per_s_max",
        "mb_per_s",
        "p50_us",
        "p99_us",
        "p999_us",
        "skipped",
        "reason",
    ];
    for r in &rows {
        for k in keys {
            assert!(r.get(k).is_some(), "{k} missing in {r}");
        }
        assert_eq!(r["mode"], "NOTX");
        assert_eq!(r["delivery"], "express");
        assert_eq!(r["count"], 50);
        if r["skipped"] == true {
            assert_eq!(
                (&r["payload"], &r["formatter"]),
                (&"order".into(), &"raw".into())
            );
            assert!(r["reason"].as_str().unwrap().contains("raw"));
        } else {
            assert!(r["msgs_per_s"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["p50_us"].as_f64().unwrap() <= r["p99_us"].as_f64().unwrap());
            assert_eq!(r["messages"], 50);
        }
    }
    let ops: Vec<&str> = rows.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(&ops[..3], ["send", "receive", "e2e"]);
    assert_eq!(rows.iter().filter(|r| r["skipped"] == true).count(), 3);
}

#[test]
fn table_starts_with_the_banner() {
    let o = mqperf(&[
        "notx",
        "SendAndPurge",
        r".\private$\perf",
        "--payload",
        "empty",
        "--formatter",
        "raw",
        "--count",
        "20",
        "--runs",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout.clone()).unwrap();
    assert!(out.starts_with("mqperf "), "{out}");
    for word in [
        "embedded",
        "express",
        "SENDANDPURGE",
        "cores",
        "payloads",
        "msgs/s",
    ] {
        assert!(out.contains(word), "{word}: {out}");
    }
    // The row, then the embedded broker's RSS after the phase, then the share of CPU time the
    // hypervisor took during it (absent if the phase ended within one clock tick; the
    // open-loop JSON test below runs long enough to need the figure).
    let mut lines: Vec<&str> = out.lines().collect();
    if let Some(pct) = lines
        .last()
        .and_then(|l| l.strip_prefix("  host steal (CPU time the hypervisor took): send "))
    {
        let pct: f64 = pct
            .strip_suffix('%')
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{out}"));
        assert!((0.0..=100.0).contains(&pct), "{out}");
        lines.pop();
    }
    assert!(lines[lines.len() - 2].starts_with("empty "), "{out}");
    assert!(
        lines[lines.len() - 1].starts_with("  rss: after send "),
        "{out}"
    );
    // Not a terminal: no progress bar escapes.
    assert!(!stderr(&o).contains('\u{1b}'));
}

/// Recoverable delivery is being wired to the journal: until then the broker may refuse it.
/// Either way mqperf must not hide it: success, or exit 1 with the broker's one-line reason.
#[test]
fn recoverable_runs_or_reports_the_brokers_error() {
    let o = mqperf(&[
        "NOTX",
        "SENDANDRECEIVE",
        r".\private$\perf",
        "--payload",
        "int",
        "--formatter",
        "raw",
        "--count",
        "20",
        "--runs",
        "1",
        "--delivery",
        "recoverable",
        "--json",
    ]);
    match o.status.code() {
        Some(0) => {
            let out = String::from_utf8(o.stdout).unwrap();
            assert_eq!(out.lines().count(), 3, "{out}");
            assert!(out.contains("\"delivery\":\"recoverable\""));
        }
        Some(1) => {
            let e = stderr(&o);
            let last = e.lines().last().unwrap_or_default();
            assert!(last.starts_with("mqperf: error:"), "{e}");
        }
        other => panic!("exit {other:?}: {}", stderr(&o)),
    }
}

// ---------------------------------------------------------------------------------------------
// Store-and-forward (--forward)

/// The binary with two embedded brokers: every message sent through A, received on B and
/// decoded equal (a receive row counts only messages decoded equal to the payload).
#[test]
fn forward_send_and_receive_exits_0() {
    let o = mqperf(&[
        "NOTX",
        "SENDANDRECEIVE",
        r".\private$\perf",
        "--forward",
        "--delivery",
        "recoverable",
        "--payload",
        "string:1000",
        "--formatter",
        "raw",
        "--count",
        "500",
        "--runs",
        "1",
        "--timeout",
        "20",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let banner = stderr(&o);
    let route = banner
        .lines()
        .find(|l| l.trim_start().starts_with("forwarded"))
        .unwrap_or_else(|| panic!("no forwarded line: {banner}"));
    assert!(
        route.contains("A 127.0.0.1:") && route.contains(" -> B 127.0.0.1:"),
        "{route}"
    );
    assert!(route.contains(r"DIRECT=TCP:127.0.0.1:"), "{route}");
    let stdout = String::from_utf8(o.stdout).unwrap();
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let ops: Vec<&str> = rows.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["send", "receive", "e2e"], "{stdout}");
    for r in &rows {
        assert_eq!(r["forwarded"], true, "{r}");
        assert_eq!(r["delivery"], "recoverable", "{r}");
        assert_eq!(r["messages"], 500, "{r}");
        assert!(r["msgs_per_s"].as_f64().unwrap() > 0.0, "{r}");
    }
}

/// Two brokers of our own as --broker and --receive-broker: counts match, and afterwards B's
/// queue, A's outgoing queue for B, and A itself (no such queue there) hold nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_against_two_brokers_leaves_them_empty() {
    let a = EmbeddedBroker::start(0).await.unwrap();
    let b = EmbeddedBroker::start(0).await.unwrap();
    for (mode, queue, scenario) in [
        (Mode::Notx, r".\private$\fwd", Scenario::SendAndReceive),
        (Mode::Tx, r".\private$\fwdtx", Scenario::SendAndReceive),
        (Mode::Notx, r".\private$\fwd", Scenario::SendAndPurge),
    ] {
        let mut c = config(scenario, "string:1000,int", "raw,binary");
        c.mode = mode;
        c.queue = queue.to_string();
        c.forward = true;
        c.broker = Some(a.url().to_string());
        c.receive_broker = Some(b.url().to_string());
        c.json = true;
        let (results, out) = run(&c).await;
        assert_eq!(measured(&results).len(), 4, "{:?}", measured(&results));
        let ops = match scenario {
            Scenario::SendAndReceive => vec![Op::Send, Op::Receive, Op::E2e],
            _ => vec![Op::Send],
        };
        check_sane(&results, &ops);
        for line in out.lines() {
            let row: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(row["forwarded"], true, "{row}");
        }
        let on_b = mq_client::Client::connect(b.url()).await.unwrap();
        let info = on_b.queue_info(queue).await.unwrap();
        assert_eq!(info.transactional, mode == Mode::Tx);
        assert_eq!((info.messages, info.in_flight), (0, 0), "{queue} on B");
        let on_a = mq_client::Client::connect(a.url()).await.unwrap();
        let outgoing = on_a.outgoing().await.unwrap();
        let dest = format!("127.0.0.1:{}", b.addr().port());
        let q = outgoing
            .iter()
            .find(|q| q.destination == dest)
            .unwrap_or_else(|| panic!("no outgoing queue for {dest}: {outgoing:?}"));
        assert_eq!((q.messages, q.in_flight), (0, 0), "{q:?}");
        assert!(on_a.queue_info(queue).await.is_err(), "{queue} exists on A");
    }
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

/// SERVER and CLIENT with --forward: the client sends through A, the server receives on B and
/// replies through B to the client's response queue on A (TX: forwarded transactions).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_tx_server_and_client_pair() {
    let a = EmbeddedBroker::start(0).await.unwrap();
    let b = EmbeddedBroker::start(0).await.unwrap();
    let mut c = config(Scenario::Server, "int,string:1000", "binary");
    c.mode = Mode::Tx;
    c.queue = r".\private$\fwds".to_string();
    c.response_queue = Some(r".\private$\fwds_reply".to_string());
    c.forward = true;
    c.broker = Some(a.url().to_string());
    c.receive_broker = Some(b.url().to_string());
    let server_config = c.clone();
    let server = tokio::spawn(async move { run(&server_config).await.0 });
    c.scenario = Scenario::Client;
    let client = tokio::spawn(async move { run(&c).await.0 });
    let (server, client) = (server.await.unwrap(), client.await.unwrap());
    assert_eq!(measured(&server), measured(&client));
    assert_eq!(measured(&server).len(), 2);
    check_sane(&server, &[Op::Receive]);
    check_sane(&client, &[Op::Send, Op::E2e]);
    let on_a = mq_client::Client::connect(a.url()).await.unwrap();
    let reply = on_a.queue_info(r".\private$\fwds_reply").await.unwrap();
    assert_eq!((reply.messages, reply.in_flight), (0, 0));
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

#[test]
fn forward_usage_errors_exit_2() {
    let q = r".\private$\perf";
    let a = "http://127.0.0.1:1";
    for (args, needle) in [
        (
            vec!["NOTX", "SENDANDRECEIVE", q, "--receive-broker", a],
            "--receive-broker applies only with --forward",
        ),
        (
            vec!["NOTX", "SENDANDRECEIVE", q, "--forward", "--broker", a],
            "--forward with --broker needs --receive-broker",
        ),
        (
            vec![
                "NOTX",
                "SENDANDRECEIVE",
                q,
                "--forward",
                "--receive-broker",
                a,
            ],
            "--receive-broker needs --broker",
        ),
        (
            vec![
                "NOTX",
                "SENDANDRECEIVE",
                q,
                "--forward",
                "--broker",
                a,
                "--receive-broker",
                a,
            ],
            "two brokers",
        ),
        (
            vec![
                "NOTX",
                "SENDANDRECEIVE",
                r"DIRECT=TCP:127.0.0.1:2\private$\q",
                "--forward",
            ],
            "local path",
        ),
        (
            vec!["NOTX", "SERVER", q, r".\private$\r", "--forward"],
            "--receive-broker",
        ),
    ] {
        let o = mqperf(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        let first = e.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("error: ") && first.contains(needle),
            "{args:?}: {e}"
        );
        assert!(o.stdout.is_empty(), "{args:?}");
    }
}

// Load shape: --rate, --queues, --consumers, --backlog, --ack-each, --broker-pid

/// JSON rows of a run of the binary against `url`.
async fn json_rows_at(url: &str, args: &[&str]) -> Vec<serde_json::Value> {
    let o = mqperf_at(url, args).await;
    assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Every queue of `names` exists and is empty.
async fn all_empty(client: &mq_client::Client, names: &[String]) {
    for n in names {
        let info = client.queue_info(n).await.unwrap();
        assert_eq!(info.messages, 0, "{n}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_queues_and_consumers_against_a_running_broker() {
    let broker = EmbeddedBroker::start(0).await.unwrap();
    let client = mq_client::Client::connect(broker.url()).await.unwrap();
    let pid = std::process::id().to_string();
    let q = r".\private$\shape";
    let rows = json_rows_at(
        broker.url(),
        &[
            "NOTX",
            "SENDANDRECEIVE",
            q,
            "--payload",
            "string:100",
            "--formatter",
            "raw",
            "--count",
            "300",
            "--runs",
            "1",
            "--json",
            "--rate",
            "2000",
            "--queues",
            "3",
            "--consumers",
            "5",
            "--clients",
            "2",
            "--broker-pid",
            &pid,
        ],
    )
    .await;
    assert_eq!(rows.len(), 3, "{rows:?}");
    for r in &rows {
        assert_eq!(r["rate"], 2000, "{r}");
        assert_eq!(
            (&r["queues"], &r["consumers"]),
            (&3.into(), &5.into()),
            "{r}"
        );
        assert_eq!(r["messages"], 300, "{r}");
        assert!(r["rss_mib"].as_f64().unwrap() > 1.0, "{r}");
        // A phase shorter than a clock tick (10 ms; a 300-message receive can take 6) has no
        // steal share: `null`, by design (perf/src/steal.rs).
        let secs = r["messages"].as_f64().unwrap() / r["msgs_per_s"].as_f64().unwrap();
        if std::path::Path::new("/proc/stat").exists() && secs > 0.05 {
            let steal = r["steal_pct"].as_f64().unwrap_or_else(|| panic!("{r}"));
            assert!((0.0..=100.0).contains(&steal), "{r}");
        } else if let Some(steal) = r["steal_pct"].as_f64() {
            assert!((0.0..=100.0).contains(&steal), "{r}");
        }
    }
    let op = |name: &str| rows.iter().find(|r| r["op"] == name).unwrap();
    // Open loop: message 299 is not due before 299/2000 s, so neither phase that sends can
    // beat 2000 msgs/s by more than rounding (closed loop sends 300 much faster).
    for name in ["send", "e2e"] {
        let rate = op(name)["msgs_per_s"].as_f64().unwrap();
        assert!(rate <= 2010.0, "{name}: {rate} msgs/s at --rate 2000");
    }
    // 300 over 3 queues, 5 consumers: queue 0 and 1 have two consumers sharing 100 each.
    for name in ["receive", "e2e"] {
        let (lo, hi) = (
            op(name)["consumer_min"].as_u64().unwrap(),
            op(name)["consumer_max"].as_u64().unwrap(),
        );
        assert!(lo <= hi && hi <= 100, "{name}: {lo}-{hi}");
    }
    assert!(op("send")["consumer_min"].is_null());
    let names: Vec<String> = (0..3).map(|i| format!("{q}-{i}")).collect();
    all_empty(&client, &names).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_fill_drain_and_rss_line() {
    let broker = EmbeddedBroker::start(0).await.unwrap();
    let client = mq_client::Client::connect(broker.url()).await.unwrap();
    let pid = std::process::id().to_string();
    let q = r".\private$\backlog";
    let o = mqperf_at(
        broker.url(),
        &[
            "NOTX",
            "SENDANDRECEIVE",
            q,
            "--payload",
            "string:1000",
            "--formatter",
            "raw",
            "--backlog",
            "500",
            "--runs",
            "2",
            "--delivery",
            "recoverable",
            "--ack-each",
            "--broker-pid",
            &pid,
        ],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let table = String::from_utf8(o.stdout).unwrap();
    assert!(table.contains("backlog     500 messages filled"), "{table}");
    assert!(table.contains(&format!("VmRSS of pid {pid}")), "{table}");
    assert!(table.contains("acknowledged on its own"), "{table}");
    let ops: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("string:1000"))
        .map(|l| l.split_whitespace().nth(2).unwrap())
        .collect();
    assert_eq!(ops, ["fill", "drain"], "{table}");
    let rss = table
        .lines()
        .find(|l| l.trim_start().starts_with("rss:"))
        .unwrap();
    assert!(
        rss.contains("after fill") && rss.contains("after drain"),
        "{rss}"
    );
    assert!(rss.contains("MiB") && !rss.contains(" -"), "{rss}");
    all_empty(&client, &[q.to_string()]).await;

    // JSON: the same two ops with the backlog as the message count.
    let rows = json_rows_at(
        broker.url(),
        &[
            "NOTX",
            "SENDANDRECEIVE",
            q,
            "--formatter",
            "raw",
            "--backlog",
            "300",
            "--runs",
            "1",
            "--json",
            "--queues",
            "2",
        ],
    )
    .await;
    let ops: Vec<&str> = rows.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["fill", "drain"]);
    for r in &rows {
        assert_eq!(
            (&r["backlog"], &r["messages"]),
            (&300.into(), &300.into()),
            "{r}"
        );
        // --broker without --broker-pid: the broker's memory is not known.
        assert!(r["rss_mib"].is_null(), "{r}");
    }
}

#[test]
fn load_shape_usage_errors_exit_2() {
    let q = r".\private$\perf";
    for (args, needle) in [
        (
            vec![
                "NOTX",
                "SENDANDRECEIVE",
                q,
                "--queues",
                "3",
                "--consumers",
                "2",
            ],
            "every queue needs a consumer",
        ),
        (
            vec!["NOTX", "SENDANDRECEIVE", q, "--broker-pid", "1"],
            "--broker-pid",
        ),
        (
            vec!["NOTX", "SENDANDPURGE", q, "--backlog", "10"],
            "--backlog",
        ),
        (
            vec!["NOTX", "SENDANDPURGE", q, "--consumers", "2"],
            "--consumers",
        ),
        (
            vec!["NOTX", "SERVER", q, r".\private$\r", "--rate", "10"],
            "--rate",
        ),
        (
            vec!["NOTX", "CLIENT", q, r".\private$\r", "--queues", "2"],
            "--queues",
        ),
        (vec!["NOTX", "SENDANDPURGE", q, "--rate", "0"], "rate"),
    ] {
        let o = mqperf(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
    let help = String::from_utf8(mqperf(&["--help"]).stdout).unwrap();
    for flag in [
        "--rate",
        "--queues",
        "--consumers",
        "--backlog",
        "--broker-pid",
        "--ack-each",
        "coordinated omission",
    ] {
        assert!(help.contains(flag), "{flag} not in --help");
    }
}
