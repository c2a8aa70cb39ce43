//! Totals that survive restarts (issue 12 point 6): after a known workload (sends, receives, a
//! purge, transactional aborts, a dead letter, forwards to a second broker), `kill -9` of the
//! broker and a restart, `mq queue info --json`, `mq outgoing list --json`, a message's abort
//! count and a scrape of `/metrics` (parsed with a Prometheus text parser) show the same totals
//! as before. The test waits until `mq_counters_saved_timestamp_seconds` says the totals on
//! disk are as of a time after the workload ended (polled, bounded), then kills.
//!
//! It runs in about 2 s (timed by phase on the shared 2-core VM, load 5-6: the workload 0.1 s,
//! waiting for the saved timestamp 1.1 s, each restart 0.2 s). A run that took minutes was
//! the harness's one `cargo build` of `mqd` and `mq` after a change (155 s of a 157 s run),
//! which the first test of the process waits for, whichever it is.

use std::collections::HashMap;
use std::time::Duration;

use mq_client::{Message, QueueOptions};
use mq_tests::{free_port, mq, temp_data_dir, wait_until, MqdProcess};

const WAIT: Duration = Duration::from_secs(30);

const Q: &str = r".\private$\pc-q";
const PQ: &str = r".\private$\pc-purged";
const TQ: &str = r".\private$\pc-tq";
const EXPIRING: &str = r".\private$\pc-expiring";
const DLQ: &str = r".\SYSTEM$;DEADLETTER";

/// A parsed scrape: `(name, sorted labels) -> value` of every scalar sample.
type Samples = HashMap<(String, Vec<(String, String)>), f64>;

/// GET `/metrics`, parsed.
fn scrape(http: &str) -> Samples {
    let body = mq_tests::http::metrics_text(http);
    let parsed =
        prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("parse");
    let mut out = HashMap::new();
    for s in parsed.samples {
        use prometheus_parse::Value::*;
        let v = match s.value {
            Counter(x) | Gauge(x) | Untyped(x) => x,
            _ => continue,
        };
        let mut labels: Vec<(String, String)> = s
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.replace("\\\\", "\\")))
            .collect();
        labels.sort();
        out.insert((s.metric, labels), v);
    }
    out
}

fn value(s: &Samples, name: &str, label: &[(&str, &str)]) -> f64 {
    let mut l: Vec<(String, String)> = label
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.sort();
    *s.get(&(name.to_string(), l))
        .unwrap_or_else(|| panic!("no sample {name} {label:?}"))
}

/// The totals that must survive, as `/metrics` shows them.
fn kept_totals(http: &str, dest: &str) -> Vec<(String, f64)> {
    let s = scrape(http);
    let mut out = Vec::new();
    for q in [Q, PQ, TQ, EXPIRING, DLQ] {
        for m in [
            "mq_queue_sent_total",
            "mq_queue_received_total",
            "mq_queue_purged_total",
            "mq_queue_dead_lettered_total",
            "mq_queue_receive_aborts_total",
        ] {
            out.push((format!("{m}{{queue={q}}}"), value(&s, m, &[("queue", q)])));
        }
    }
    for m in [
        "mq_outgoing_forwarded_total",
        "mq_outgoing_dead_lettered_total",
    ] {
        out.push((
            format!("{m}{{destination={dest}}}"),
            value(&s, m, &[("destination", dest)]),
        ));
    }
    for class in ["ReceiveTimeout", "BadDestinationQueue"] {
        out.push((
            format!("mq_dead_lettered_total{{class={class}}}"),
            value(&s, "mq_dead_lettered_total", &[("class", class)]),
        ));
    }
    out.push((
        "mq_transactions_committed_total".into(),
        value(&s, "mq_transactions_committed_total", &[]),
    ));
    out.push((
        "mq_transactions_aborted_total{reason=requested}".into(),
        value(
            &s,
            "mq_transactions_aborted_total",
            &[("reason", "requested")],
        ),
    ));
    out
}

/// `mq queue info --json` of each queue and `mq outgoing list --json`, as JSON values.
fn cli_totals(url: &str) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for q in [Q, PQ, TQ, EXPIRING, DLQ] {
        let o = mq(url, &["queue", "info", q, "--json"], None);
        assert!(o.status.success(), "{o:?}");
        let mut v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        // The totals (not the messages: the express ones are gone after kill -9).
        let keep = [
            "name",
            "sent",
            "received",
            "purged",
            "dead_lettered",
            "receive_aborts",
            "poisoned",
        ];
        v.as_object_mut()
            .unwrap()
            .retain(|k, _| keep.contains(&k.as_str()));
        out.push(v);
    }
    let o = mq(url, &["outgoing", "list", "--json"], None);
    assert!(o.status.success(), "{o:?}");
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let list = list.as_array().expect("a JSON array").clone();
    assert_eq!(list.len(), 1, "{list:?}");
    for mut v in list {
        v.as_object_mut()
            .unwrap()
            .retain(|k, _| ["destination", "forwarded", "dead_lettered"].contains(&k.as_str()));
        out.push(v);
    }
    out
}

fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn totals_and_abort_counts_survive_kill_9() {
    // The destination of the forwards.
    let dest_dir = temp_data_dir("mq-pc-dest");
    let mut dest = MqdProcess::launch(dest_dir.path(), &[]);
    let dest_client = dest.connect().await;
    dest_client
        .create_queue(r".\private$\in", QueueOptions::default())
        .await
        .unwrap();
    let dest_addr = dest.addr().to_string();

    let dir = temp_data_dir("mq-pc");
    let http = format!("127.0.0.1:{}", free_port());
    let args = [
        "--metrics-listen",
        http.as_str(),
        "--forward-retry-max",
        "200ms",
    ];
    let mut mqd = MqdProcess::launch(dir.path(), &args);
    let client = mqd.connect().await;
    for (name, transactional, max_aborts) in [
        (Q, false, 0),
        (PQ, false, 0),
        (TQ, true, 5),
        (EXPIRING, false, 0),
    ] {
        client
            .create_queue(
                name,
                QueueOptions {
                    transactional,
                    max_aborts,
                    ..QueueOptions::default()
                },
            )
            .await
            .unwrap();
    }

    // 10 recoverable sends and 4 receives; 3 express sends, 1 received.
    let q = client.queue(Q).unwrap();
    for i in 0..10 {
        q.send(Message::new(format!("m{i}")).recoverable(true))
            .await
            .unwrap();
    }
    for i in 0..3 {
        q.send(Message::new(format!("e{i}"))).await.unwrap();
    }
    for _ in 0..5 {
        q.receive(Duration::from_secs(5)).await.unwrap().unwrap();
    }
    // 3 sent, purged.
    let pq = client.queue(PQ).unwrap();
    for i in 0..3 {
        pq.send(Message::new(format!("p{i}")).recoverable(true))
            .await
            .unwrap();
    }
    assert_eq!(client.purge(PQ).await.unwrap(), 3);
    // Two committed transactional sends; the head's receive aborted twice: its abort count is 2.
    let mut tx = client.begin().await.unwrap();
    tx.send(TQ, Message::new("t1")).unwrap();
    tx.send(TQ, Message::new("t2")).unwrap();
    tx.commit().await.unwrap();
    for _ in 0..2 {
        let mut tx = client.begin().await.unwrap();
        tx.receive(TQ, Duration::from_secs(5))
            .await
            .unwrap()
            .expect("t1");
        tx.abort().await.unwrap();
    }
    // One that expires in its queue: dead-lettered (ReceiveTimeout).
    client
        .queue(EXPIRING)
        .unwrap()
        .send(Message::new("late").time_to_be_received(Duration::from_millis(1)))
        .await
        .unwrap();
    // 5 recoverable forwards to the other broker.
    let remote = client
        .queue(&format!(r"DIRECT=TCP:{dest_addr}\private$\in"))
        .unwrap();
    for i in 0..5 {
        remote
            .send(Message::new(format!("f{i}")).recoverable(true))
            .await
            .unwrap();
    }
    assert!(
        wait_until(WAIT, || {
            let s = scrape(&http);
            value(&s, "mq_queue_messages", &[("queue", DLQ)]) == 1.0
                && value(
                    &s,
                    "mq_outgoing_forwarded_total",
                    &[("destination", &dest_addr)],
                ) == 5.0
        }),
        "the dead letter or the forwards never happened"
    );
    // Everything counted is done; wait until the totals on disk are as of a later time.
    let done = now_secs();
    assert!(
        wait_until(WAIT, || value(
            &scrape(&http),
            "mq_counters_saved_timestamp_seconds",
            &[]
        ) > done),
        "the totals were never saved"
    );
    let before = kept_totals(&http, &dest_addr);
    let before_cli = cli_totals(mqd.url());
    let abort_count = |c: mq_client::Client| async move {
        c.queue(TQ)
            .unwrap()
            .peek(Duration::from_secs(5))
            .await
            .unwrap()
            .expect("t1 is back")
            .abort_count
    };

    // The workload's own numbers (so the comparison is not between two zeros).
    let get = |k: &str| {
        before
            .iter()
            .find(|(n, _)| n == k)
            .unwrap_or_else(|| panic!("{k}"))
            .1
    };
    assert_eq!(get(&format!("mq_queue_sent_total{{queue={Q}}}")), 13.0);
    assert_eq!(get(&format!("mq_queue_received_total{{queue={Q}}}")), 5.0);
    assert_eq!(get(&format!("mq_queue_purged_total{{queue={PQ}}}")), 3.0);
    assert_eq!(
        get(&format!("mq_queue_receive_aborts_total{{queue={TQ}}}")),
        2.0
    );
    assert_eq!(
        get(&format!("mq_queue_dead_lettered_total{{queue={EXPIRING}}}")),
        1.0
    );
    assert_eq!(get(&format!("mq_queue_sent_total{{queue={DLQ}}}")), 1.0);
    assert_eq!(
        get(&format!(
            "mq_outgoing_forwarded_total{{destination={dest_addr}}}"
        )),
        5.0
    );
    assert_eq!(get("mq_dead_lettered_total{class=ReceiveTimeout}"), 1.0);
    assert_eq!(get("mq_transactions_committed_total"), 1.0);
    assert_eq!(get("mq_transactions_aborted_total{reason=requested}"), 2.0);
    assert_eq!(abort_count(client.clone()).await, 2);
    drop(client);

    mqd.kill9_checked();
    let http2 = format!("127.0.0.1:{}", free_port());
    let args = [
        "--metrics-listen",
        http2.as_str(),
        "--forward-retry-max",
        "200ms",
    ];
    let mut mqd = MqdProcess::launch(dir.path(), &args);
    let after = kept_totals(&http2, &dest_addr);
    assert_eq!(before, after, "/metrics after kill -9 and restart");
    let after_cli = cli_totals(mqd.url());
    assert_eq!(
        before_cli, after_cli,
        "mq queue info / mq outgoing list after kill -9"
    );
    let client = mqd.connect().await;
    assert_eq!(
        abort_count(client.clone()).await,
        2,
        "the message's abort count after kill -9"
    );
    // Counting goes on from there: a third abort, then a clean restart keeps it exactly.
    let mut tx = client.begin().await.unwrap();
    tx.receive(TQ, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    tx.abort().await.unwrap();
    drop(client);
    mqd.terminate(WAIT).unwrap();
    let mut mqd = MqdProcess::launch(dir.path(), &args);
    let s = scrape(&http2);
    assert_eq!(
        value(&s, "mq_queue_receive_aborts_total", &[("queue", TQ)]),
        3.0
    );
    assert_eq!(
        value(
            &s,
            "mq_transactions_aborted_total",
            &[("reason", "requested")]
        ),
        3.0
    );
    assert_eq!(abort_count(mqd.connect().await).await, 3);
    mqd.terminate(WAIT).unwrap();
    dest.terminate(WAIT).unwrap();
}
