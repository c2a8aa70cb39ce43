//! `mq stats` against an `mqd` process: one line per queue with messages, bytes and rates; the
//! `--json` documents' per-interval counts add up to what was sent and received.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use mq_tests::{mq, mq_path, temp_data_dir, MqdProcess};
use serde_json::Value;

const Q: &str = r".\private$\stats";
const OTHER: &str = r".\private$\quiet";

#[test]
fn stats_shows_each_queue_and_rates_that_add_up() {
    let data = temp_data_dir("mq-stats");
    let mut mqd = MqdProcess::start(data.path()).expect("mqd starts");
    let url = mqd.url().to_string();
    for q in [Q, OTHER] {
        assert!(mq(&url, &["queue", "create", q], None).status.success());
    }
    // One table: a header and a line per queue.
    let once = mq(&url, &["stats", "--interval", "100ms"], None);
    assert!(once.status.success(), "{once:?}");
    let table = String::from_utf8_lossy(&once.stdout).into_owned();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(
        lines[0].starts_with("QUEUE") && lines[0].contains("SENT/S"),
        "{table}"
    );
    assert!(lines.iter().any(|l| l.starts_with(Q)), "{table}");

    // --watch --json while 30 messages are sent and 12 received: the per-interval counts add
    // up to exactly that, and the last document shows the totals and the depth.
    let mut watch = Command::new(mq_path())
        .args([
            "stats",
            "--watch",
            "--json",
            "--interval",
            "200ms",
            "--iterations",
            "400",
        ])
        .env("MQ_BROKER", &url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("mq stats starts");
    let mut docs = BufReader::new(watch.stdout.take().unwrap()).lines();
    let first: Value = serde_json::from_str(&docs.next().unwrap().unwrap()).unwrap();
    assert!(first["interval_ms"].as_u64().unwrap() >= 200);
    assert!(mq(&url, &["send", Q, "m{n}", "--count", "30"], None)
        .status
        .success());
    assert!(mq(&url, &["receive", Q, "--count", "12"], None)
        .status
        .success());
    let (mut sent, mut received) = (0, 0);
    let mut last = first;
    for line in docs.by_ref() {
        let doc: Value = serde_json::from_str(&line.unwrap()).expect("one JSON document a line");
        let q = doc["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["name"] == Q)
            .cloned()
            .expect("the queue is listed");
        sent += q["sent_in_interval"].as_u64().unwrap();
        received += q["received_in_interval"].as_u64().unwrap();
        last = q;
        if last["received"] == 12 && last["sent"] == 30 {
            break;
        }
    }
    // Stop it as Ctrl-C would.
    let _ = Command::new("kill")
        .args(["-INT", &watch.id().to_string()])
        .status();
    let _ = watch.wait();
    assert_eq!((sent, received), (30, 12), "last: {last}");
    assert_eq!(last["messages"], 18, "{last}");
    assert!(last["sent_per_sec"].as_f64().is_some(), "{last}");
    mqd.terminate(Duration::from_secs(30)).expect("stops");
}
