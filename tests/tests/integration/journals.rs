//! Journal queues against real `mqd` processes: target journaling (`Q;JOURNAL` keeps a copy of
//! every message received from `Q`) for express, recoverable and transactional queues through
//! the client crate and `mq`; the copies of recoverable messages across `kill -9` (a received
//! message is in its queue or in its journal, never in neither nor in both); the journal quota
//! and its not-kept counter (queue info and /metrics); `Q;JOURNAL` refuses sends; source
//! journaling (`mq send --journal`) into `SYSTEM$;JOURNAL` locally and across two brokers.
//!
//! Every wait is bounded and polls a condition; nothing sleeps a fixed time.

use std::collections::HashSet;
use std::time::Duration;

use mq_client::{Client, ConsumerOptions, Message, MessageId, QueueOptions};
use mq_tests::{eventually, free_port, mq, temp_data_dir, MqdProcess};

use crate::store_and_forward::{local, Node};
use crate::subqueues::{bodies, peek_all};

const Q: &str = r".\private$\jq";
const QJ: &str = r".\private$\jq;JOURNAL";
const TQ: &str = r".\private$\jtq";
const TQJ: &str = r".\private$\jtq;JOURNAL";
const SYSJ: &str = r".\SYSTEM$;JOURNAL";
const WAIT: Duration = Duration::from_secs(30);

async fn send(client: &Client, queue: &str, body: &str, recoverable: bool) -> MessageId {
    client
        .queue(queue)
        .unwrap()
        .send(Message::new(body.to_string()).recoverable(recoverable))
        .await
        .unwrap_or_else(|e| panic!("send {body} to {queue}: {e}"))
}

fn mq_ok(url: &str, args: &[&str]) -> String {
    let out = mq(url, args, None);
    assert!(
        out.status.success(),
        "mq {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn info_json(url: &str, queue: &str) -> serde_json::Value {
    serde_json::from_str(&mq_ok(url, &["queue", "info", queue, "--json"])).unwrap()
}

/// Waits until `queue` holds `n` messages (journal copies appear once their record is durable).
async fn wait_count(client: &Client, queue: &str, n: u64) {
    let ok = eventually(WAIT, || async {
        client.queue_info(queue).await.map(|i| i.messages).ok() == Some(n)
    })
    .await;
    assert!(
        ok,
        "{queue} never held {n} messages: {:?}",
        client.queue_info(queue).await
    );
}

/// Express and recoverable messages received every way (one-shot, streaming consumer, `mq
/// receive`, by id) are copied to Q;JOURNAL with their id and body; peeks, purges and
/// messages received from a queue without journaling are not; a transactional receive is
/// copied when it commits, not when it aborts; the journal can be peeked, received, browsed
/// and purged but not sent to; `mq queue set --journal off|on` switches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn received_messages_are_copied_to_the_queue_journal() {
    let dir = temp_data_dir("mq-journal");
    let mqd = MqdProcess::launch(dir.path(), &[]);
    let url = mqd.url().to_string();
    let client = mqd.connect().await;
    client
        .create_queue(
            Q,
            QueueOptions {
                journal: true,
                ..QueueOptions::default()
            },
        )
        .await
        .unwrap();
    mq_ok(
        &url,
        &["queue", "create", TQ, "--transactional", "--journal"],
    );
    let info = info_json(&url, TQ);
    assert_eq!(info["journal"], true, "{info}");
    assert_eq!(info["journal_quota_bytes"], 1u64 << 30, "{info}");

    // Non-transactional: every way of receiving makes a copy; peeking does not.
    let q = client.queue(Q).unwrap();
    let e1 = send(&client, Q, "e1", false).await;
    let r1 = send(&client, Q, "r1", true).await;
    let r2 = send(&client, Q, "r2", true).await;
    let r3 = send(&client, Q, "r3", true).await;
    let e2 = send(&client, Q, "e2", false).await;
    assert_eq!(q.peek(Duration::ZERO).await.unwrap().unwrap().id, e1);
    assert_eq!(q.receive(WAIT).await.unwrap().unwrap().id, e1);
    assert_eq!(q.receive_by_id(r3, WAIT).await.unwrap().unwrap().id, r3);
    let mut c = q
        .consumer(ConsumerOptions {
            prefetch: 8,
            limit: Some(2),
        })
        .await
        .unwrap();
    assert_eq!(c.next(WAIT).await.unwrap().unwrap().id, r1);
    assert_eq!(c.next(WAIT).await.unwrap().unwrap().id, r2);
    c.close().await.unwrap();
    let out = mq_ok(&url, &["receive", Q, "--json"]);
    assert!(out.contains(&e2.to_string()), "{out}");
    wait_count(&client, QJ, 5).await;
    let journal = peek_all(&client, QJ).await;
    let mut ids: Vec<_> = journal.iter().map(|m| m.id).collect();
    ids.sort();
    let mut want = vec![e1, r1, r2, r3, e2];
    want.sort();
    assert_eq!(ids, want);
    assert!(bodies(&journal).contains(&"r3".to_string()));
    // A purge is not journaled (as MSMQ).
    send(&client, Q, "purged", true).await;
    assert_eq!(client.purge(Q).await.unwrap(), 1);

    // Sends to the journal are refused, through the client and `mq`.
    let err = client
        .queue(QJ)
        .unwrap()
        .send(Message::new("x"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("read-only"), "{err}");
    let out = mq(&url, &["send", QJ, "x"], None);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("read-only"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Journaling off: no copy; on again: copies again.
    mq_ok(&url, &["queue", "set", Q, "--journal", "off"]);
    assert_eq!(info_json(&url, Q)["journal"], false);
    send(&client, Q, "unjournaled", true).await;
    q.receive(WAIT).await.unwrap().unwrap();
    mq_ok(&url, &["queue", "set", Q, "--journal", "on"]);
    let again = send(&client, Q, "again", true).await;
    q.receive(WAIT).await.unwrap().unwrap();
    wait_count(&client, QJ, 6).await;
    let journal = peek_all(&client, QJ).await;
    assert!(journal.iter().any(|m| m.id == again));
    assert!(!bodies(&journal).contains(&"unjournaled".to_string()));
    assert!(!bodies(&journal).contains(&"purged".to_string()));

    // The journal is read like a queue: browsed, received from, purged.
    let browsed = mq_ok(&url, &["browse", QJ, "--json"]);
    assert_eq!(browsed.lines().count(), 6, "{browsed}");
    let first = client.queue(QJ).unwrap().receive(WAIT).await.unwrap();
    assert!(first.is_some());
    let out = mq_ok(&url, &["queue", "purge", QJ]);
    assert!(out.contains("purged 5"), "{out}");
    // Receiving from the journal is not journaled again.
    assert_eq!(client.queue_info(QJ).await.unwrap().messages, 0);

    // Transactional: a copy when the receive commits, none when it aborts.
    let t = client.queue(TQ).unwrap();
    let t1 = t.send_tx(Message::new("t1")).await.unwrap();
    let t2 = t.send_tx(Message::new("t2")).await.unwrap();
    let mut tx = client.begin().await.unwrap();
    assert_eq!(tx.receive(TQ, WAIT).await.unwrap().unwrap().id, t1);
    tx.abort().await.unwrap();
    assert_eq!(client.queue_info(TQJ).await.unwrap().messages, 0);
    let mut tx = client.begin().await.unwrap();
    assert_eq!(tx.receive(TQ, WAIT).await.unwrap().unwrap().id, t1);
    tx.commit().await.unwrap();
    // A one-shot receive from a transactional queue is a committed single-message transaction.
    assert_eq!(t.receive(WAIT).await.unwrap().unwrap().id, t2);
    wait_count(&client, TQJ, 2).await;
    let ids: Vec<_> = peek_all(&client, TQJ).await.iter().map(|m| m.id).collect();
    assert_eq!(ids, [t1, t2]);
    // The journal of a transactional queue is read as one too (mq receive: a single-message
    // transaction).
    let out = mq_ok(&url, &["receive", TQJ, "--json"]);
    assert!(out.contains(&t1.to_string()), "{out}");
}

/// Recoverable messages received from a journaling queue, then `kill -9`: each is in the
/// queue or in its journal after the restart, never in neither and never in both; once the
/// copies are shown (their record is durable) all of them survive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_copies_of_recoverable_messages_survive_kill9() {
    let dir = temp_data_dir("mq-journal-kill");
    let mut mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    client
        .create_queue(
            Q,
            QueueOptions {
                journal: true,
                ..QueueOptions::default()
            },
        )
        .await
        .unwrap();
    let q = client.queue(Q).unwrap();
    let sender = q.sender(mq_client::SenderOptions::default()).await.unwrap();
    for i in 0..300 {
        sender
            .send(Message::new(format!("m{i}")).recoverable(true))
            .await
            .unwrap();
    }
    sender.close().await.unwrap();
    let sent: Vec<MessageId> = peek_all(&client, Q).await.iter().map(|m| m.id).collect();
    assert_eq!(sent.len(), 300);

    // Round 1: 100 received, copies shown, then kill -9: all 100 are in the journal.
    let mut c = q
        .consumer(ConsumerOptions {
            prefetch: 32,
            limit: Some(100),
        })
        .await
        .unwrap();
    for _ in 0..100 {
        c.next(WAIT).await.unwrap().unwrap();
    }
    c.close().await.unwrap();
    wait_count(&client, QJ, 100).await;
    mqd.kill9_checked();
    let mut mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    assert_eq!(client.queue_info(QJ).await.unwrap().messages, 100);
    assert_eq!(client.queue_info(Q).await.unwrap().messages, 200);
    // The copies' bodies (the received messages' own, moved to the journal) read back.
    let want: Vec<String> = (0..100).map(|i| format!("m{i}")).collect();
    assert_eq!(bodies(&peek_all(&client, QJ).await), want);

    // Round 2: kill -9 while a receiver acknowledges: nothing lost, nothing in both.
    let q = client.queue(Q).unwrap();
    let mut c = q
        .consumer(ConsumerOptions {
            prefetch: 16,
            limit: Some(150),
        })
        .await
        .unwrap();
    for _ in 0..150 {
        c.next(WAIT).await.unwrap().unwrap();
    }
    // No close: the acknowledgements of the last ones may or may not be stored.
    mqd.kill9_checked();
    drop(c);
    let mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    let in_queue: HashSet<MessageId> = peek_all(&client, Q).await.iter().map(|m| m.id).collect();
    let in_journal: HashSet<MessageId> = peek_all(&client, QJ).await.iter().map(|m| m.id).collect();
    assert!(
        in_queue.is_disjoint(&in_journal),
        "in both: {:?}",
        in_queue.intersection(&in_journal).collect::<Vec<_>>()
    );
    let lost: Vec<_> = sent
        .iter()
        .filter(|id| !in_queue.contains(id) && !in_journal.contains(id))
        .collect();
    assert!(
        lost.is_empty(),
        "{} received messages lost: {lost:?}",
        lost.len()
    );
    assert!(in_journal.len() >= 100, "{}", in_journal.len());
}

/// Bytes the broker's journal has written, from /metrics.
fn journal_written_bytes(http: &str) -> u64 {
    let metrics = ureq::get(&format!("http://{http}/metrics"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    metrics
        .lines()
        .find(|l| l.starts_with("mq_journal_written_bytes"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no mq_journal_written_bytes in {metrics}")) as u64
}

/// A recoverable message's journal copy moves the message's stored record to the journal
/// queue: receiving 1 MiB of bodies from a journaling queue does not write them again (it
/// did: each copy was a new record with the body read back from disk). The copies' bodies
/// are intact, also after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_copies_do_not_write_bodies_again() {
    const N: usize = 32;
    const LEN: usize = 32 << 10;
    let dir = temp_data_dir("mq-journal-rekey");
    let http = format!("127.0.0.1:{}", free_port());
    let mut mqd = MqdProcess::launch(dir.path(), &["--metrics-listen", &http]);
    let client = mqd.connect().await;
    client
        .create_queue(
            Q,
            QueueOptions {
                journal: true,
                ..QueueOptions::default()
            },
        )
        .await
        .unwrap();
    let q = client.queue(Q).unwrap();
    let body = |i: usize| format!("{i:04}").repeat(LEN / 4);
    for i in 0..N {
        q.send(Message::new(body(i)).recoverable(true))
            .await
            .unwrap();
    }
    let before = journal_written_bytes(&http);
    // Half by one-shot receives, half by a streaming consumer.
    for _ in 0..N / 2 {
        q.receive(WAIT).await.unwrap().unwrap();
    }
    let mut c = q
        .consumer(ConsumerOptions {
            prefetch: 8,
            limit: Some((N / 2) as u64),
        })
        .await
        .unwrap();
    for _ in 0..N / 2 {
        c.next(WAIT).await.unwrap().unwrap();
    }
    c.close().await.unwrap();
    wait_count(&client, QJ, N as u64).await;
    let written = journal_written_bytes(&http) - before;
    assert!(
        written < (N * LEN / 8) as u64,
        "{written} bytes written to journal {N} received messages of {LEN} bytes"
    );
    mqd.kill9_checked();
    let mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    assert_eq!(client.queue_info(Q).await.unwrap().messages, 0);
    let want: Vec<String> = (0..N).map(body).collect();
    assert_eq!(bodies(&peek_all(&client, QJ).await), want);
}

/// Past the journal quota no copy is kept (as MSMQ, journaling stops) and a counter says how
/// many were not, in `mq queue info --json` and /metrics; `mq queue set --journal-quota`
/// raises it; `--max-aborts` is settable on a transactional queue and refused on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_quota_stops_copies_and_counts_them() {
    let dir = temp_data_dir("mq-journal-quota");
    let http = format!("127.0.0.1:{}", free_port());
    let mqd = MqdProcess::launch(dir.path(), &["--metrics-listen", &http]);
    let url = mqd.url().to_string();
    let client = mqd.connect().await;
    // Each message: 10 body bytes + 128 overhead (recoverable: 138) or + 384 (express, what
    // it costs in memory: 394); room for the first two copies (532), not a third.
    mq_ok(
        &url,
        &["queue", "create", Q, "--journal", "--journal-quota", "600"],
    );
    let q = client.queue(Q).unwrap();
    for i in 0..5 {
        send(&client, Q, &format!("message-{i}"), i % 2 == 0).await;
    }
    for _ in 0..5 {
        q.receive(WAIT).await.unwrap().unwrap();
    }
    wait_count(&client, QJ, 2).await;
    let info = info_json(&url, Q);
    assert_eq!(info["journal_not_kept"], 3, "{info}");
    assert_eq!(info["journal_quota_bytes"], 600, "{info}");
    assert_eq!(
        bodies(&peek_all(&client, QJ).await),
        ["message-0", "message-1"]
    );
    let metrics = ureq::get(&format!("http://{http}/metrics"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("mq_journal_copies_not_kept_total{")
                && l.contains(r"jq")
                && l.ends_with(" 3")),
        "{metrics}"
    );

    // A bigger quota: copies are kept again.
    mq_ok(&url, &["queue", "set", Q, "--journal-quota", "100000"]);
    send(&client, Q, "message-5", true).await;
    q.receive(WAIT).await.unwrap().unwrap();
    wait_count(&client, QJ, 3).await;
    let info = info_json(&url, Q);
    assert_eq!(
        (
            info["journal_not_kept"].as_u64(),
            info["journal_quota_bytes"].as_u64()
        ),
        (Some(3), Some(100_000)),
        "{info}"
    );

    // --max-aborts through `mq queue set`: a transactional queue only, shown by info.
    mq_ok(&url, &["queue", "create", TQ, "--transactional"]);
    mq_ok(&url, &["queue", "set", TQ, "--max-aborts", "3"]);
    assert_eq!(info_json(&url, TQ)["max_aborts"], 3);
    let out = mq(&url, &["queue", "set", Q, "--max-aborts", "3"], None);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("transactional"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `mq send --journal` to a local queue: a copy in SYSTEM$;JOURNAL once stored (a recoverable
/// one survives kill -9), none without the flag; SYSTEM$;JOURNAL refuses sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_journaling_to_a_local_queue() {
    let dir = temp_data_dir("mq-journal-src");
    let mut mqd = MqdProcess::launch(dir.path(), &[]);
    let url = mqd.url().to_string();
    let client = mqd.connect().await;
    mq_ok(&url, &["queue", "create", Q]);
    mq_ok(&url, &["queue", "create", TQ, "--transactional"]);
    mq_ok(&url, &["send", Q, "plain", "--recoverable"]);
    mq_ok(
        &url,
        &["send", Q, "journaled", "--recoverable", "--journal"],
    );
    mq_ok(&url, &["send", Q, "express", "--journal"]);
    mq_ok(&url, &["send", TQ, "in-tx", "--tx", "--journal"]);
    client
        .queue(Q)
        .unwrap()
        .send(Message::new("client").recoverable(true).journal(true))
        .await
        .unwrap();
    wait_count(&client, SYSJ, 4).await;
    let mut got = bodies(&peek_all(&client, SYSJ).await);
    got.sort();
    assert_eq!(got, ["client", "express", "in-tx", "journaled"]);
    // The messages themselves are where they were sent.
    assert_eq!(client.queue_info(Q).await.unwrap().messages, 4);
    let out = mq(&url, &["send", SYSJ, "x"], None);
    assert!(!out.status.success());

    mqd.kill9_checked();
    let mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    let mut got = bodies(&peek_all(&client, SYSJ).await);
    got.sort();
    assert_eq!(
        got,
        ["client", "in-tx", "journaled"],
        "express copies are gone"
    );
}

/// Across two brokers: a message sent with the journal flag to a queue on another broker is
/// copied to the sending broker's SYSTEM$;JOURNAL only once that broker stored it (not while
/// it is down), and not to the receiving broker's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_journaling_across_two_brokers() {
    let a = Node::started("jsrc-a");
    let mut b = Node::started("jsrc-b");
    b.client()
        .await
        .create_queue(&local("remote"), QueueOptions::default())
        .await
        .unwrap();
    b.terminate();
    let ca = a.client().await;
    mq_ok(
        &a.url(),
        &[
            "send",
            &b.queue("remote"),
            "while-down",
            "--recoverable",
            "--journal",
        ],
    );
    ca.queue(&b.queue("remote"))
        .unwrap()
        .send(Message::new("unjournaled").recoverable(true))
        .await
        .unwrap();
    // b is down: nothing reached its next hop.
    assert_eq!(peek_all(&ca, SYSJ).await.len(), 0);
    b.start();
    let cb = b.client().await;
    wait_count(&cb, &local("remote"), 2).await;
    wait_count(&ca, SYSJ, 1).await;
    let copies = peek_all(&ca, SYSJ).await;
    assert_eq!(bodies(&copies), ["while-down"], "{}", a.logs());
    let arrived = peek_all(&cb, &local("remote")).await;
    assert_eq!(arrived[0].id, copies[0].id);
    assert_eq!(cb.queue_info(SYSJ).await.unwrap().messages, 0);
}
