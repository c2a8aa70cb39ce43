//! Subqueues (`Q;name`), moving a message by id (MSMQ 4.0's MoveMessage), poison messages
//! (`--max-aborts`) and dead-letter replay, against `mqd` processes killed with SIGKILL: a
//! moved recoverable or transactional message is in exactly one place after a restart, with
//! its id, properties and move count; express ones are gone, as by design.
//!
//! Every wait is bounded and polls a condition; nothing sleeps a fixed time.

use std::time::Duration;

use mq_client::{Client, Error, Message, MessageId, QueueOptions, ReceivedMessage};
use mq_tests::{eventually, mq, temp_data_dir, MqdProcess};

const Q: &str = r".\private$\orders";
const POISON: &str = r".\private$\orders;poison";
const TQ: &str = r".\private$\txorders";
const TQ_POISON: &str = r".\private$\txorders;poison";
const DEADLETTER: &str = r"DIRECT=OS:.\SYSTEM$;DEADLETTER";
const DEADXACT: &str = r"DIRECT=OS:.\SYSTEM$;DEADXACT";
const WAIT: Duration = Duration::from_secs(30);

/// Every waiting message of `queue` (up to 1,000), left in place.
pub(crate) async fn peek_all(client: &Client, queue: &str) -> Vec<ReceivedMessage> {
    client
        .queue(queue)
        .unwrap()
        .peek_many(1000, Duration::ZERO)
        .await
        .unwrap_or_else(|e| panic!("peek {queue}: {e}"))
}

/// The bodies of `ms` as text.
pub(crate) fn bodies(ms: &[ReceivedMessage]) -> Vec<String> {
    ms.iter()
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect()
}

async fn send(client: &Client, queue: &str, body: &str, recoverable: bool) -> MessageId {
    client
        .queue(queue)
        .unwrap()
        .send(
            Message::new(body.to_string())
                .label(body)
                .recoverable(recoverable),
        )
        .await
        .unwrap_or_else(|e| panic!("send {body} to {queue}: {e}"))
}

async fn send_tx(client: &Client, queue: &str, body: &str) -> MessageId {
    client
        .queue(queue)
        .unwrap()
        .send_tx(Message::new(body.to_string()).label(body))
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

/// Move to a subqueue and back, for recoverable, express and transactional messages, with the
/// client and with `mq move`; the moves survive kill -9 (express messages do not, by design);
/// subqueues cannot be sent to or created; they share the main queue's quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_to_a_subqueue_and_back_survives_kill9() {
    let dir = temp_data_dir("mq-subq");
    let mut mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    client
        .create_queue(
            Q,
            QueueOptions {
                // m1 and m2 recoverable (128 B of overhead), ex express (384).
                quota_bytes: Some(2 * (128 + 2 + 2) + (384 + 2 + 2)),
                ..QueueOptions::default()
            },
        )
        .await
        .unwrap();
    client
        .create_queue(
            TQ,
            QueueOptions {
                transactional: true,
                ..QueueOptions::default()
            },
        )
        .await
        .unwrap();
    let m1 = send(&client, Q, "m1", true).await;
    let m2 = send(&client, Q, "m2", true).await;
    let ex = send(&client, Q, "ex", false).await;
    let t1 = send_tx(&client, TQ, "t1").await;
    let t2 = send_tx(&client, TQ, "t2").await;

    // The queue is full (its three messages): moving one to a subqueue frees nothing.
    let moved = client.move_message(Q, m2, "poison").await.unwrap();
    assert_eq!(moved.id, m2);
    assert_eq!(moved.move_count, 1);
    assert!(
        moved.destination.ends_with(r"orders;poison"),
        "{}",
        moved.destination
    );
    client.move_message(Q, ex, "Poison").await.unwrap();
    assert_queue_full(&client).await;
    assert_eq!(bodies(&peek_all(&client, Q).await), ["m1"]);
    let sub = peek_all(&client, POISON).await;
    assert_eq!(bodies(&sub), ["m2", "ex"]);
    // The broker's total counts subqueues too (it said 3 of 5, helper-70).
    assert_eq!(client.broker_info().await.unwrap().messages, 5);
    assert_eq!(
        (sub[0].id, sub[0].move_count, sub[0].label.as_str()),
        (m2, 1, "m2")
    );
    // Transactional queue: moved in one journal record.
    let out = mq_ok(mqd.url(), &["move", TQ, &t1.to_string(), "held"]);
    assert!(out.contains("move count 1"), "{out}");
    assert_eq!(bodies(&peek_all(&client, TQ).await), ["t2"]);

    // A subqueue is not a send destination, and cannot be created.
    let e = client
        .queue(POISON)
        .unwrap()
        .send(Message::new("x").recoverable(true))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::FailedPrecondition(_)), "{e}");
    assert!(e.to_string().contains("subqueues cannot be sent to"), "{e}");
    let e = client
        .create_queue(POISON, QueueOptions::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("subqueue"), "{e}");
    // Moving a message that is not there says so.
    let e = client.move_message(Q, m2, "other").await.unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e}");
    // A bad subqueue name is refused with the rule.
    let out = mq(mqd.url(), &["move", Q, &m1.to_string(), "a;b"], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot contain"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    drop(client);
    mqd.kill9_checked();
    let mut mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    assert_eq!(bodies(&peek_all(&client, Q).await), ["m1"]);
    let sub = peek_all(&client, POISON).await;
    assert_eq!(
        bodies(&sub),
        ["m2"],
        "the express message is gone, the recoverable one moved"
    );
    assert_eq!((sub[0].id, sub[0].move_count), (m2, 1));
    let held = peek_all(&client, r".\private$\txorders;held").await;
    assert_eq!(
        (bodies(&held), held[0].id, held[0].move_count),
        (vec!["t1".to_string()], t1, 1)
    );
    assert!(held[0].transactional);
    // Still counted against the main queue's quota after the restart: m1 + m2 + two more fit
    // (the express message's larger charge went with it).
    send(&client, Q, "m3", true).await;
    send(&client, Q, "m4", true).await;
    assert_queue_full(&client).await;

    // Back to the main queue with `mq move 'Q;poison' ID ''`: at its tail, move count 2.
    let out = mq_ok(mqd.url(), &["move", POISON, &m2.to_string(), "", "--json"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["move_count"], 2);
    assert_eq!(v["id"], m2.to_string());
    assert!(v.get("body").is_none(), "without body, as --help says: {v}");
    mq_ok(
        mqd.url(),
        &["move", r".\private$\txorders;held", &t1.to_string(), ""],
    );
    drop(client);
    mqd.kill9_checked();
    let mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    let main = peek_all(&client, Q).await;
    assert_eq!(bodies(&main), ["m1", "m3", "m4", "m2"]);
    assert_eq!((main[3].id, main[3].move_count), (m2, 2));
    assert!(peek_all(&client, POISON).await.is_empty());
    assert_eq!(bodies(&peek_all(&client, TQ).await), ["t2", "t1"]);
    // A transactional receive from the main queue gets the moved message in its turn.
    let mut tx = client.begin().await.unwrap();
    let got = tx.receive(TQ, WAIT).await.unwrap().unwrap();
    assert_eq!(got.id, t2);
    tx.commit().await.unwrap();
    let got = client
        .queue(TQ)
        .unwrap()
        .receive(WAIT)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((got.id, got.move_count), (t1, 2));
    // Deleting the queue deletes its subqueues.
    client.move_message(Q, m1, "poison").await.unwrap();
    client.delete_queue(Q).await.unwrap();
    client
        .create_queue(Q, QueueOptions::default())
        .await
        .unwrap();
    assert!(peek_all(&client, POISON).await.is_empty());
}

/// The queue of `move_to_a_subqueue_and_back_survives_kill9` is full: one more is refused.
async fn assert_queue_full(client: &Client) {
    let e = client
        .queue(Q)
        .unwrap()
        .send(Message::new("xx").label("xx").recoverable(true))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::QuotaExceeded(_)), "{e}");
}

/// `--max-aborts 3`: the third aborted receive moves the message to `Q;poison` (durably,
/// counted, abort count reset, move count 1) instead of handing it out again; `mq move` takes
/// it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_after_n_aborts_and_move_back() {
    let dir = temp_data_dir("mq-poison");
    let mut mqd = MqdProcess::launch(dir.path(), &[]);
    mq_ok(
        mqd.url(),
        &[
            "queue",
            "create",
            TQ,
            "--transactional",
            "--max-aborts",
            "3",
        ],
    );
    let client = mqd.connect().await;
    let bad = send_tx(&client, TQ, "bad").await;
    let good = send_tx(&client, TQ, "good").await;
    for i in 1..=3u32 {
        let mut tx = client.begin().await.unwrap();
        let m = tx.receive(TQ, WAIT).await.unwrap().expect("a message");
        assert_eq!((m.id, m.abort_count), (bad, i - 1), "attempt {i}");
        tx.abort().await.unwrap();
    }
    assert!(
        eventually(WAIT, || async {
            peek_all(&client, TQ_POISON).await.len() == 1
        })
        .await,
        "the message did not reach the poison subqueue"
    );
    // The next receive gets the next message, not the poison one.
    let mut tx = client.begin().await.unwrap();
    let m = tx.receive(TQ, WAIT).await.unwrap().unwrap();
    assert_eq!(m.id, good);
    tx.commit().await.unwrap();
    let info = client.queue_info(TQ).await.unwrap();
    assert_eq!((info.max_aborts, info.poisoned, info.messages), (3, 1, 0));
    let out = mq_ok(mqd.url(), &["queue", "info", TQ]);
    assert!(
        out.contains("max aborts:     3") && out.contains("poisoned:       1"),
        "{out}"
    );

    drop(client);
    mqd.kill9_checked();
    let mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    assert_eq!(
        client.queue_info(TQ).await.unwrap().max_aborts,
        3,
        "the policy is journaled"
    );
    let p = peek_all(&client, TQ_POISON).await;
    assert_eq!(bodies(&p), ["bad"]);
    assert_eq!((p[0].id, p[0].move_count, p[0].abort_count), (bad, 1, 0));
    // Back to the queue: it gets another N tries.
    mq_ok(mqd.url(), &["move", TQ_POISON, &bad.to_string(), ""]);
    let mut tx = client.begin().await.unwrap();
    let m = tx.receive(TQ, WAIT).await.unwrap().unwrap();
    assert_eq!((m.id, m.abort_count, m.move_count), (bad, 0, 2));
    tx.abort().await.unwrap();
    assert_eq!(peek_all(&client, TQ).await.len(), 1);
    // A policy on a non-transactional queue is refused.
    let e = client
        .create_queue(
            r".\private$\plain",
            QueueOptions {
                max_aborts: 2,
                ..QueueOptions::default()
            },
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("needs a transactional queue"), "{e}");
}

/// Replay from the dead-letter queues: `mq requeue DLQ ID` back to the original destination,
/// `mq move DLQ ID QUEUE` to another one; same id and properties, no dead-letter record, the
/// passed timer cleared; durable across kill -9; the kind must match.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_replay_to_their_destination_or_another_queue() {
    let dir = temp_data_dir("mq-replay");
    let mut mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    mq_tests::create_default_queue(&client, Q).await;
    mq_tests::create_default_queue(&client, r".\private$\other").await;
    client
        .create_queue(
            TQ,
            QueueOptions {
                transactional: true,
                ..QueueOptions::default()
            },
        )
        .await
        .unwrap();
    let short = Duration::from_millis(200);
    let a = client
        .queue(Q)
        .unwrap()
        .send(
            Message::new("a")
                .label("la")
                .correlation_id("c-a")
                .recoverable(true)
                .time_to_be_received(short),
        )
        .await
        .unwrap();
    send(&client, Q, "b", true).await;
    let b2 = client
        .queue(Q)
        .unwrap()
        .send(
            Message::new("b2")
                .recoverable(true)
                .time_to_be_received(short),
        )
        .await
        .unwrap();
    let t = client
        .queue(TQ)
        .unwrap()
        .send_tx(Message::new("t").time_to_be_received(short))
        .await
        .unwrap();
    assert!(
        eventually(WAIT, || async {
            peek_all(&client, DEADLETTER).await.len() == 2
                && peek_all(&client, DEADXACT).await.len() == 1
        })
        .await,
        "the messages were not dead-lettered"
    );
    // Replay a to where it was going, b2 to another queue.
    let out = mq_ok(mqd.url(), &["requeue", DEADLETTER, &a.to_string()]);
    assert!(out.contains(r"orders"), "{out}");
    mq_ok(
        mqd.url(),
        &["move", DEADLETTER, &b2.to_string(), r".\private$\other"],
    );
    // A transactional dead letter cannot go to a non-transactional queue.
    let out = mq(mqd.url(), &["move", DEADXACT, &t.to_string(), Q], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not transactional"));
    mq_ok(mqd.url(), &["requeue", DEADXACT, &t.to_string()]);
    assert!(peek_all(&client, DEADLETTER).await.is_empty());
    assert!(peek_all(&client, DEADXACT).await.is_empty());

    drop(client);
    mqd.kill9_checked();
    let mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    assert!(peek_all(&client, DEADLETTER).await.is_empty());
    let main = peek_all(&client, Q).await;
    assert_eq!(bodies(&main), ["b", "a"]);
    let ra = &main[1];
    assert_eq!(
        (ra.id, ra.label.as_str(), ra.correlation_id.as_str()),
        (a, "la", "c-a")
    );
    assert!(ra.dead_letter.is_none() && ra.receive_by.is_none());
    let other = peek_all(&client, r".\private$\other").await;
    assert_eq!((bodies(&other), other[0].id), (vec!["b2".to_string()], b2));
    let tm = client
        .queue(TQ)
        .unwrap()
        .receive(WAIT)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((tm.id, tm.transactional), (t, true));
    // A dead-letter record says where it was going: replaying it again is "not there".
    let e = client.move_message(DEADLETTER, a, "").await.unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e}");
}
