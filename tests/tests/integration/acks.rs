//! Acknowledgements to an administration queue (MSMQ's `PROPID_M_ACKNOWLEDGE`): positive and
//! negative reach-queue and receive acks through the client crate and `mq`, express,
//! recoverable and transactional; a NACK with the right class for each reason a message does
//! not arrive or is not received (time-to-be-received, purge, delete, time-to-reach-queue, bad
//! destination, transactional mismatch, quota, access denied); acks across two brokers; a
//! recoverable message's ack and its event after `kill -9`; never an ack of an ack; bad
//! requests refused. Every wait is bounded and polls.

use std::time::Duration;

use mq_client::ack::{self, class};
use mq_client::{Client, Message, MessageId, QueueOptions, ReceivedMessage};
use mq_tests::{eventually, free_port, loopback, InProcessBroker};

use crate::store_and_forward::{cli, cli_output, create, local, Node, WAIT};

const Q: &str = r".\private$\q";
const TQ: &str = r".\private$\tq";
const AQ: &str = r".\private$\aq";

async fn with_queues() -> (InProcessBroker, Client) {
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    for (name, transactional) in [(Q, false), (TQ, true), (AQ, false)] {
        client
            .create_queue(
                name,
                QueueOptions {
                    transactional,
                    ..QueueOptions::default()
                },
            )
            .await
            .unwrap();
    }
    (broker, client)
}

async fn count(client: &Client, queue: &str) -> u64 {
    client.queue_info(queue).await.map_or(0, |i| i.messages)
}

/// Waits until `aq` holds `n` messages and returns them, peeked.
async fn wait_acks(client: &Client, aq: &str, n: u64) -> Vec<ReceivedMessage> {
    let reached = eventually(WAIT, || async { count(client, aq).await == n }).await;
    let got = client
        .queue(aq)
        .unwrap()
        .peek_many(1000, Duration::ZERO)
        .await
        .unwrap();
    assert!(
        reached,
        "{aq} holds {} messages, expected {n}: {got:#?}",
        got.len()
    );
    got
}

/// Takes the one ack in `aq` (waiting for it) and checks it acknowledges `id` with `class`.
#[track_caller]
fn check_ack(a: &ReceivedMessage, id: MessageId, class: u16, label: &str, body: &[u8]) {
    assert_eq!(
        a.class,
        class,
        "class {:#x} ({:?}), expected {class:#x}: {a:#?}",
        a.class,
        ack::class_name(a.class as u32)
    );
    assert_eq!(a.correlation_id, id.to_string(), "{a:#?}");
    assert_ne!(a.id, id, "an ack has its own id");
    assert_eq!(a.label, label, "{a:#?}");
    assert_eq!(a.body.as_ref(), body, "{a:#?}");
    assert!(a.admin_queue.is_empty() && a.acknowledge == 0, "{a:#?}");
    assert!(!a.transactional, "{a:#?}");
}

async fn receive_ack(client: &Client, aq: &str) -> ReceivedMessage {
    client
        .queue(aq)
        .unwrap()
        .receive(WAIT)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no ack in {aq}"))
}

/// Sends `body` to `queue` asking for the acknowledgements `ack` at `AQ`.
async fn send_acked(client: &Client, queue: &str, body: &'static str, ack: u8) -> MessageId {
    client
        .queue(queue)
        .unwrap()
        .send(Message::new(body).admin_queue(AQ).acknowledge(ack))
        .await
        .unwrap()
}

/// Receives one message from `queue`; there must be one.
async fn receive_one(client: &Client, queue: &str) {
    assert!(client
        .queue(queue)
        .unwrap()
        .receive(WAIT)
        .await
        .unwrap()
        .is_some());
}

fn full() -> u8 {
    ack::parse_type("full-reach-queue+full-receive").unwrap()
}

/// Reach-queue and receive acks for express, recoverable and transactional messages; a
/// message that asked only for NACKs gets no positive ack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positive_reach_queue_and_receive_acks() {
    let (_broker, client) = with_queues().await;
    let fq = client.queue_info(Q).await.unwrap().format_name;
    for recoverable in [false, true] {
        let label = format!("recoverable={recoverable}");
        let id = client
            .queue(Q)
            .unwrap()
            .send(
                Message::new("hello")
                    .label(label.clone())
                    .recoverable(recoverable)
                    .admin_queue(AQ)
                    .acknowledge(full()),
            )
            .await
            .unwrap();
        let a = receive_ack(&client, AQ).await;
        check_ack(&a, id, class::ACK_REACH_QUEUE, &label, b"");
        assert_eq!(a.response_queue, fq, "the ack names the original's queue");
        assert_eq!(
            a.delivery,
            if recoverable {
                mq_client::Delivery::Recoverable
            } else {
                mq_client::Delivery::Express
            }
        );
        assert_eq!(count(&client, AQ).await, 0, "one ack until it is received");
        let got = client
            .queue(Q)
            .unwrap()
            .receive(WAIT)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((got.id, got.acknowledge), (id, full()));
        assert_eq!(got.admin_queue, AQ);
        check_ack(
            &receive_ack(&client, AQ).await,
            id,
            class::ACK_RECEIVE,
            &label,
            b"",
        );
    }
    // Transactional: arrival at commit, receive at the receiving transaction's commit (not
    // before, and not for an aborted one).
    let mut tx = client.begin().await.unwrap();
    tx.send(TQ, Message::new("tx").admin_queue(AQ).acknowledge(full()))
        .unwrap();
    assert_eq!(count(&client, AQ).await, 0);
    let id = tx.commit().await.unwrap()[0];
    check_ack(
        &receive_ack(&client, AQ).await,
        id,
        class::ACK_REACH_QUEUE,
        "",
        b"",
    );
    let mut tx = client.begin().await.unwrap();
    assert!(tx.receive(TQ, WAIT).await.unwrap().is_some());
    tx.abort().await.unwrap();
    let mut tx = client.begin().await.unwrap();
    assert!(tx.receive(TQ, WAIT).await.unwrap().is_some());
    assert_eq!(
        count(&client, AQ).await,
        0,
        "no receive ack before the commit, nor for the abort"
    );
    tx.commit().await.unwrap();
    check_ack(
        &receive_ack(&client, AQ).await,
        id,
        class::ACK_RECEIVE,
        "",
        b"",
    );

    // NACKs only: nothing on arrival or receive.
    send_acked(
        &client,
        Q,
        "quiet",
        ack::parse_type("nack-receive").unwrap(),
    )
    .await;
    receive_one(&client, Q).await;
    // A later positive ack shows the quiet one would have been seen by now.
    let id = send_acked(&client, Q, "loud", ack::POS_ARRIVAL).await;
    let acks = wait_acks(&client, AQ, 1).await;
    check_ack(&acks[0], id, class::ACK_REACH_QUEUE, "", b"");
}

/// The admin queue is the destination itself: the original's acks arrive, and receiving an
/// ack posts nothing (no ack of an ack, no loop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_is_never_acknowledged() {
    let (_broker, client) = with_queues().await;
    let id = client
        .queue(Q)
        .unwrap()
        .send(Message::new("self").admin_queue(Q).acknowledge(full()))
        .await
        .unwrap();
    let q = client.queue(Q).unwrap();
    let first = q.receive(WAIT).await.unwrap().unwrap();
    assert_eq!(first.id, id);
    // Now: the arrival ack, and the receive ack of the original.
    let a = q.receive(WAIT).await.unwrap().unwrap();
    check_ack(&a, id, class::ACK_REACH_QUEUE, "", b"");
    let b = q.receive(WAIT).await.unwrap().unwrap();
    check_ack(&b, id, class::ACK_RECEIVE, "", b"");
    assert!(q
        .receive(Duration::from_millis(300))
        .await
        .unwrap()
        .is_none());
}

/// Receive NACKs: time-to-be-received in the destination queue, purge, delete; each carries
/// the original body. A missing admin queue drops the ack (the send and the receive work).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_nacks_for_timeout_purge_and_delete() {
    let (_broker, client) = with_queues().await;
    let nack = ack::parse_type("nack-receive").unwrap();
    for recoverable in [false, true] {
        let id = client
            .queue(Q)
            .unwrap()
            .send(
                Message::new("late")
                    .recoverable(recoverable)
                    .time_to_be_received(Duration::from_millis(200))
                    .admin_queue(AQ)
                    .acknowledge(nack),
            )
            .await
            .unwrap();
        check_ack(
            &receive_ack(&client, AQ).await,
            id,
            class::NACK_RECEIVE_TIMEOUT,
            "",
            b"late",
        );

        let id = client
            .queue(Q)
            .unwrap()
            .send(
                Message::new("purged")
                    .recoverable(recoverable)
                    .admin_queue(AQ)
                    .acknowledge(nack),
            )
            .await
            .unwrap();
        assert_eq!(client.purge(Q).await.unwrap(), 1);
        check_ack(
            &receive_ack(&client, AQ).await,
            id,
            class::NACK_Q_PURGED,
            "",
            b"purged",
        );
    }
    let dq = r".\private$\doomed";
    client
        .create_queue(dq, QueueOptions::default())
        .await
        .unwrap();
    let id = client
        .queue(dq)
        .unwrap()
        .send(
            Message::new("deleted")
                .recoverable(true)
                .admin_queue(AQ)
                .acknowledge(nack),
        )
        .await
        .unwrap();
    client.delete_queue(dq).await.unwrap();
    check_ack(
        &receive_ack(&client, AQ).await,
        id,
        class::NACK_Q_DELETED,
        "",
        b"deleted",
    );

    // No such admin queue: dropped, nothing else changes.
    client
        .queue(Q)
        .unwrap()
        .send(
            Message::new("x")
                .admin_queue(r".\private$\nowhere")
                .acknowledge(full()),
        )
        .await
        .unwrap();
    receive_one(&client, Q).await;
    assert_eq!(count(&client, AQ).await, 0);
}

/// Bad requests are refused, each with one clear line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ack_requests_are_refused() {
    let (_broker, client) = with_queues().await;
    let q = client.queue(Q).unwrap();
    for (m, want) in [
        (
            Message::new("a").acknowledge(ack::POS_ARRIVAL),
            "without an admin queue",
        ),
        (
            Message::new("b").admin_queue(AQ).acknowledge(0x10),
            "unknown bits",
        ),
        (
            Message::new("c")
                .admin_queue(r"FORMATNAME:DIRECT=OS:.\private$\aq,DIRECT=OS:.\private$\q")
                .acknowledge(1),
            "multiple-element",
        ),
        (
            Message::new("d")
                .admin_queue(r"DIRECT=OS:.\SYSTEM$;DEADLETTER")
                .acknowledge(1),
            "read-only",
        ),
        (
            Message::new("e")
                .admin_queue("x".repeat(5000))
                .acknowledge(1),
            "the limit is",
        ),
    ] {
        let e = q.send(m).await.expect_err(want).to_string();
        assert!(e.contains(want), "{e}");
    }
    assert_eq!(count(&client, Q).await, 0);
}

/// `mq send --admin-queue --ack`, and `mq receive --json` shows the class by code and name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mq_send_with_ack_and_receive_shows_the_class() {
    let (broker, client) = with_queues().await;
    let url = broker.url().to_string();
    let out = cli(
        &url,
        &[
            "send",
            Q,
            "hi",
            "--recoverable",
            "--admin-queue",
            AQ,
            "--ack",
            "full-receive",
            "--label",
            "L",
        ],
    )
    .await;
    let id = out.split_whitespace().find_map(|w| {
        uuid::Uuid::parse_str(w.trim_matches(|c: char| !c.is_ascii_hexdigit() && c != '-')).ok()
    });
    // full-receive has no positive arrival ack.
    assert_eq!(count(&client, AQ).await, 0);
    cli(&url, &["receive", Q]).await;
    let json = cli(&url, &["receive", AQ, "--json"]).await;
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(v["class"]["code"], class::ACK_RECEIVE, "{v}");
    assert_eq!(v["class"]["name"], "ACK_RECEIVE", "{v}");
    assert_eq!(v["label"], "L", "{v}");
    if let Some(id) = id {
        assert_eq!(v["correlation_id"], id.to_string(), "{v}");
    }
    // A NACK through mq: purge.
    cli(
        &url,
        &[
            "send",
            Q,
            "gone",
            "--admin-queue",
            AQ,
            "--ack",
            "nack-receive",
        ],
    )
    .await;
    cli(&url, &["queue", "purge", Q]).await;
    let json = cli(&url, &["receive", AQ, "--json"]).await;
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(v["class"]["code"], class::NACK_Q_PURGED, "{v}");
    assert_eq!(v["class"]["name"], "NACK_Q_PURGED", "{v}");
    assert_eq!(v["body"], "gone", "{v}");
    // Usage errors: --ack needs --admin-queue, and a known type.
    for args in [
        vec!["send", Q, "x", "--ack", "full-receive"],
        vec!["send", Q, "x", "--admin-queue", AQ, "--ack", "sometimes"],
    ] {
        let out = cli_output(&url, &args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
}

/// Arrival NACKs on the sending broker: time-to-reach-queue in the outgoing queue (nobody
/// listens there), and the destination broker's refusals (no such queue, transactional
/// mismatch, over quota), each with its class and the original body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arrival_nacks_for_each_refusal() {
    let b = Node::started("b");
    {
        let bc = b.client().await;
        create(&bc, "q", false, None).await;
        create(&bc, "small", false, Some(1)).await;
    }
    let a = Node::started("a");
    let client = a.client().await;
    create(&client, "aq", false, None).await;
    let aq = local("aq");
    let nack = ack::parse_type("nack-reach-queue").unwrap();
    let nobody = format!(r"DIRECT=TCP:{}\private$\q", loopback(free_port()));
    let cases: Vec<(String, bool, Message, u16)> = vec![
        (
            nobody,
            false,
            Message::new("ttrq")
                .recoverable(true)
                .time_to_reach_queue(Duration::from_millis(300)),
            class::NACK_REACH_QUEUE_TIMEOUT,
        ),
        (
            b.queue("missing"),
            false,
            Message::new("missing").recoverable(true),
            class::NACK_BAD_DST_Q,
        ),
        (
            b.queue("q"),
            true,
            Message::new("tx-to-plain"),
            class::NACK_NOT_TRANSACTIONAL_Q,
        ),
        (
            b.queue("small"),
            false,
            Message::new("too big").recoverable(true),
            class::NACK_Q_EXCEED_QUOTA,
        ),
    ];
    for (dest, transactional, m, want) in cases {
        let m = m.admin_queue(aq.clone()).acknowledge(nack);
        let body = m.body().clone();
        let id = if transactional {
            let mut tx = client.begin().await.unwrap();
            tx.send(&dest, m).unwrap();
            tx.commit().await.unwrap()[0]
        } else {
            client.queue(&dest).unwrap().send(m).await.unwrap()
        };
        let got = client.queue(&aq).unwrap().receive(WAIT).await.unwrap();
        let got = got.unwrap_or_else(|| panic!("no NACK for {dest}: {}", a.logs()));
        check_ack(&got, id, want, "", &body);
        assert_eq!(
            got.response_queue, dest,
            "the NACK names the original destination"
        );
    }
}

/// Acks across two brokers: A sends to B's queue with A's admin queue; B posts the arrival
/// and the receive acks through its outgoing queue back to A. Recoverable, so they are
/// store-and-forward messages like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_cross_brokers() {
    let b = Node::started("b");
    let bc = b.client().await;
    create(&bc, "q", false, None).await;
    let a = Node::started("a");
    let client = a.client().await;
    create(&client, "aq", false, None).await;
    let admin = a.queue("aq");
    let id = client
        .queue(&b.queue("q"))
        .unwrap()
        .send(
            Message::new("far")
                .label("far away")
                .recoverable(true)
                .admin_queue(admin.clone())
                .acknowledge(full()),
        )
        .await
        .unwrap();
    let got = client
        .queue(&local("aq"))
        .unwrap()
        .receive(WAIT)
        .await
        .unwrap();
    let got = got.unwrap_or_else(|| panic!("no arrival ack: {}\n{}", a.logs(), b.logs()));
    check_ack(&got, id, class::ACK_REACH_QUEUE, "far away", b"");
    let m = bc
        .queue(&local("q"))
        .unwrap()
        .receive(WAIT)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((m.id, m.admin_queue.as_str()), (id, admin.as_str()));
    let got = client
        .queue(&local("aq"))
        .unwrap()
        .receive(WAIT)
        .await
        .unwrap();
    let got = got.unwrap_or_else(|| panic!("no receive ack: {}\n{}", a.logs(), b.logs()));
    check_ack(&got, id, class::ACK_RECEIVE, "far away", b"");
}

/// A recoverable message's arrival ack survives `kill -9` (it is in the send's record); after
/// a receive and `kill -9`, the receive ack is there exactly when the removal is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recoverable_acks_survive_kill9() {
    let mut n = Node::started("solo");
    let client = n.client().await;
    create(&client, "q", false, None).await;
    create(&client, "aq", false, None).await;
    let (q, aq) = (local("q"), local("aq"));
    let id = client
        .queue(&q)
        .unwrap()
        .send(
            Message::new("durable")
                .recoverable(true)
                .admin_queue(aq.clone())
                .acknowledge(full()),
        )
        .await
        .unwrap();
    n.kill9();
    n.start();
    let client = n.client().await;
    assert_eq!(count(&client, &q).await, 1);
    let acks = wait_acks(&client, &aq, 1).await;
    check_ack(&acks[0], id, class::ACK_REACH_QUEUE, "", b"");
    client
        .queue(&aq)
        .unwrap()
        .receive(WAIT)
        .await
        .unwrap()
        .unwrap();
    receive_one(&client, &q).await;
    n.kill9();
    n.start();
    let client = n.client().await;
    let left = count(&client, &q).await;
    let acks = client
        .queue(&aq)
        .unwrap()
        .peek_many(10, Duration::ZERO)
        .await
        .unwrap();
    // The arrival ack received above may come back (its removal was not waited for: at least
    // once); only receive acks count here.
    let acks: Vec<_> = acks
        .into_iter()
        .filter(|a| a.class != class::ACK_REACH_QUEUE)
        .collect();
    match left {
        // The removal reached the disk: so did the ack.
        0 => {
            assert_eq!(acks.len(), 1, "{acks:#?}");
            check_ack(&acks[0], id, class::ACK_RECEIVE, "", b"");
        }
        // It did not: no ack for a receive that did not durably happen.
        _ => assert!(acks.is_empty(), "an ack without its removal: {acks:#?}"),
    }
}

/// A cursor's receive-current (MSMQ `MQ_ACTION_RECEIVE` at a cursor, .NET `RemoveCurrent`) is
/// a receive for good: it posts `ACK_RECEIVE` for the message under the cursor only, from a
/// plain queue (express and recoverable) and from a transactional one (a committed
/// single-message transaction); peeking through the cursor posts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursor_receive_current_posts_ack_receive() {
    let (_broker, client) = with_queues().await;
    let pos_receive = ack::parse_type("pos-receive").unwrap();
    for (queue, recoverable) in [(Q, false), (Q, true), (TQ, true)] {
        let mut ids = Vec::new();
        for body in ["first", "second"] {
            let m = Message::new(body)
                .recoverable(recoverable)
                .admin_queue(AQ)
                .acknowledge(pos_receive);
            let id = if queue == TQ {
                let mut tx = client.begin().await.unwrap();
                tx.send(TQ, m).unwrap();
                tx.commit().await.unwrap()[0]
            } else {
                client.queue(queue).unwrap().send(m).await.unwrap()
            };
            ids.push(id);
        }
        let mut cursor = client.queue(queue).unwrap().cursor().unwrap();
        let first = cursor.peek_current(WAIT).await.unwrap().unwrap();
        let second = cursor.peek_next(WAIT).await.unwrap().unwrap();
        assert_eq!((first.id, second.id), (ids[0], ids[1]));
        let got = cursor.receive_current(WAIT).await.unwrap().unwrap();
        assert_eq!(got.id, ids[1], "{queue}: the message under the cursor");
        let acks = wait_acks(&client, AQ, 1).await;
        check_ack(&acks[0], ids[1], class::ACK_RECEIVE, "", b"");
        // The one left waiting (peeked by the cursor) is not acknowledged.
        assert_eq!(count(&client, queue).await, 1, "{queue}");
        client.purge(AQ).await.unwrap();
        client.purge(queue).await.unwrap();
    }
}

/// Acknowledgements with a queue journal: a receive posts one `ACK_RECEIVE` and keeps one
/// journal copy; receiving or purging the copy in `Q;JOURNAL`, and receiving a dead letter,
/// post nothing (copies and dead letters keep the original's request, but only the original
/// is acknowledged). Deleting the queue posts `NACK_Q_DELETED` for the messages waiting in it
/// and in its subqueues, not for its journal's copies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_with_queue_journals_and_dead_letters() {
    let (_broker, client) = with_queues().await;
    let jq = r".\private$\journaled";
    client
        .create_queue(
            jq,
            QueueOptions {
                journal: true,
                ..QueueOptions::default()
            },
        )
        .await
        .unwrap();
    let journal = format!("{jq};JOURNAL");
    for recoverable in [false, true] {
        let id = client
            .queue(jq)
            .unwrap()
            .send(
                Message::new("kept")
                    .recoverable(recoverable)
                    .admin_queue(AQ)
                    .acknowledge(full()),
            )
            .await
            .unwrap();
        check_ack(
            &receive_ack(&client, AQ).await,
            id,
            class::ACK_REACH_QUEUE,
            "",
            b"",
        );
        let got = client.queue(jq).unwrap().receive(WAIT).await.unwrap();
        assert_eq!(got.unwrap().id, id);
        check_ack(
            &receive_ack(&client, AQ).await,
            id,
            class::ACK_RECEIVE,
            "",
            b"",
        );
        let copies = wait_acks(&client, &journal, 1).await;
        assert_eq!(copies[0].id, id, "the journal copy");
        let copy = client.queue(&journal).unwrap().receive(WAIT).await.unwrap();
        assert_eq!(copy.unwrap().id, id);
    }
    // A copy purged from the journal: no NACK_Q_PURGED.
    let id = send_acked(
        &client,
        jq,
        "purged copy",
        ack::parse_type("full-receive").unwrap(),
    )
    .await;
    receive_one(&client, jq).await;
    check_ack(
        &receive_ack(&client, AQ).await,
        id,
        class::ACK_RECEIVE,
        "",
        b"",
    );
    wait_acks(&client, &journal, 1).await;
    assert_eq!(client.purge(&journal).await.unwrap(), 1);

    // A dead letter (time-to-be-received): its NACK, then nothing when it is received.
    let id = client
        .queue(Q)
        .unwrap()
        .send(
            Message::new("dead")
                .recoverable(true)
                .time_to_be_received(Duration::from_millis(100))
                .admin_queue(AQ)
                .acknowledge(full()),
        )
        .await
        .unwrap();
    check_ack(
        &receive_ack(&client, AQ).await,
        id,
        class::ACK_REACH_QUEUE,
        "",
        b"",
    );
    check_ack(
        &receive_ack(&client, AQ).await,
        id,
        class::NACK_RECEIVE_TIMEOUT,
        "",
        b"dead",
    );
    let dlq = client.queue(r"DIRECT=OS:.\SYSTEM$;DEADLETTER").unwrap();
    let dead = dlq.receive(WAIT).await.unwrap().unwrap();
    assert_eq!(dead.id, id);

    // Deleting the queue: a NACK for the one waiting in it and the one in its subqueue.
    let waiting = client
        .queue(jq)
        .unwrap()
        .send(
            Message::new("waiting")
                .recoverable(true)
                .admin_queue(AQ)
                .acknowledge(ack::NEG_RECEIVE),
        )
        .await
        .unwrap();
    let parked = send_acked(&client, jq, "parked", ack::NEG_RECEIVE).await;
    client.move_message(jq, parked, "parked").await.unwrap();
    // One more copy in the journal, which must not be NACKed with the queue.
    let copied = client
        .queue(jq)
        .unwrap()
        .send(
            Message::new("copied")
                .recoverable(true)
                .admin_queue(AQ)
                .acknowledge(ack::NEG_RECEIVE),
        )
        .await
        .unwrap();
    let taken = client.queue(jq).unwrap().receive_by_id(copied, WAIT).await;
    assert_eq!(taken.unwrap().unwrap().id, copied);
    wait_acks(&client, &journal, 1).await;
    client.delete_queue(jq).await.unwrap();
    let mut nacks = wait_acks(&client, AQ, 2).await;
    nacks.sort_by_key(|a| a.body.clone());
    check_ack(&nacks[0], parked, class::NACK_Q_DELETED, "", b"parked");
    check_ack(&nacks[1], waiting, class::NACK_Q_DELETED, "", b"waiting");
    // Nothing else (the dead letter's receive, the journal's purge and deletion): the
    // deletion's NACKs were stored with it, so all are there when it returns.
    assert_eq!(count(&client, AQ).await, 2, "{nacks:#?}");
}

/// `MQMSG_CLASS_NACK_ACCESS_DENIED`, as MSMQ produces it: a message forwarded to a queue whose
/// broker refuses the sending broker's identity (it holds `forward` there, but the queue's ACL
/// does not give it `send`) is dead-lettered at the sending broker, which posts the NACK with
/// the original body to the admin queue. A local send without the right is refused to the
/// sender at once (`PERMISSION_DENIED`, as MSMQ refuses opening a local queue) and posts
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_denied_nacks() {
    use mq_tests::{temp_data_dir, users_file, MqdProcess};
    let users_dir = temp_data_dir("mq-acks-users-");
    let users_b = users_file(
        &users_dir.path().join("users-b.toml"),
        &[
            ("admin", "admin-pw", &[], &["create-queue", "dead-letter"]),
            ("broker-a", "a-pw", &[], &["forward"]),
        ],
    );
    let b_addr = loopback(free_port());
    let creds = users_dir.path().join("forward.toml");
    std::fs::write(
        &creds,
        format!("[\"{b_addr}\"]\nuser = \"broker-a\"\npassword = \"a-pw\"\n"),
    )
    .unwrap();
    let (dir_a, dir_b) = (temp_data_dir("mq-acks-a-"), temp_data_dir("mq-acks-b-"));
    let b = MqdProcess::launch_on(
        dir_b.path(),
        b_addr,
        &["--name", "b", "--users", users_b.to_str().unwrap()],
    );
    let a = MqdProcess::launch(
        dir_a.path(),
        &[
            "--name",
            "a",
            "--forward-credentials",
            creds.to_str().unwrap(),
            "--forward-retry-max",
            "200ms",
        ],
    );
    let b_admin = Client::builder(b.url())
        .user("admin", "admin-pw")
        .connect()
        .await
        .unwrap();
    create(&b_admin, "q", false, None).await;
    let client = Client::connect(a.url()).await.unwrap();
    create(&client, "aq", false, None).await;
    let dest = format!(r"DIRECT=TCP:{b_addr}\private$\q");
    let id = client
        .queue(&dest)
        .unwrap()
        .send(
            Message::new("not for you")
                .label("denied")
                .recoverable(true)
                .admin_queue(local("aq"))
                .acknowledge(ack::parse_type("full-reach-queue").unwrap()),
        )
        .await
        .unwrap();
    let got = client
        .queue(&local("aq"))
        .unwrap()
        .receive(WAIT)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no NACK: {}\n{}", a.stderr(), b.stderr()));
    check_ack(
        &got,
        id,
        class::NACK_ACCESS_DENIED,
        "denied",
        b"not for you",
    );
    assert_eq!(got.response_queue, dest, "the NACK names the destination");
    assert_eq!(count(&b_admin, &local("q")).await, 0, "nothing reached B");
    drop(b_admin);

    // Local: alice may write to the admin queue but not to q.
    let users = users_file(
        &users_dir.path().join("users.toml"),
        &[
            ("admin", "admin-pw", &[], &["create-queue"]),
            ("alice", "alice-pw", &[], &[]),
        ],
    );
    let broker = InProcessBroker::start_with(|c| c.security.users_file = Some(users)).await;
    let admin = Client::builder(broker.url())
        .user("admin", "admin-pw")
        .connect()
        .await
        .unwrap();
    for q in [Q, AQ] {
        admin
            .create_queue(q, QueueOptions::default())
            .await
            .unwrap();
    }
    admin.grant(AQ, "alice", &["send"]).await.unwrap();
    let alice = Client::builder(broker.url())
        .user("alice", "alice-pw")
        .connect()
        .await
        .unwrap();
    let refused = alice
        .queue(Q)
        .unwrap()
        .send(Message::new("local").admin_queue(AQ).acknowledge(full()))
        .await;
    assert!(
        matches!(refused, Err(mq_client::Error::PermissionDenied(_))),
        "{refused:?}"
    );
    assert_eq!(count(&admin, AQ).await, 0, "a refused send posts nothing");
    assert_eq!(count(&admin, Q).await, 0);
}

/// Deleting a queue posts `NACK_Q_DELETED` also for the messages in flight then, once they
/// come back: delivered to a consumer and not acknowledged, or received in a transaction that
/// then aborts. The deletion's NACKs covered only the messages waiting in it, and these got
/// none (stop 48's note): their senders never heard of them. (Without the body of a
/// recoverable message: the journal no longer reads a deleted queue's messages.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_in_flight_when_their_queue_is_deleted_are_nacked() {
    let (_broker, client) = with_queues().await;
    let (plain, tx) = (r".\private$\doomed", r".\private$\doomed-tx");
    client
        .create_queue(plain, QueueOptions::default())
        .await
        .unwrap();
    let tx_options = QueueOptions {
        transactional: true,
        ..QueueOptions::default()
    };
    client.create_queue(tx, tx_options).await.unwrap();
    let delivered = send_acked(&client, plain, "delivered", ack::NEG_RECEIVE).await;
    let mut t = client.begin().await.unwrap();
    t.send(
        tx,
        Message::new("in a transaction")
            .recoverable(true)
            .admin_queue(AQ)
            .acknowledge(ack::NEG_RECEIVE),
    )
    .unwrap();
    let received = t.commit().await.unwrap()[0];
    // One delivered to a consumer, not acknowledged; one received in an open transaction.
    let mut consumer = client
        .queue(plain)
        .unwrap()
        .consumer(Default::default())
        .await
        .unwrap();
    assert_eq!(consumer.next(WAIT).await.unwrap().unwrap().id, delivered);
    let mut t = client.begin().await.unwrap();
    assert_eq!(t.receive(tx, WAIT).await.unwrap().unwrap().id, received);
    client.delete_queue(plain).await.unwrap();
    client.delete_queue(tx).await.unwrap();
    let _ = t.abort().await;
    drop(consumer);
    let mut nacks = wait_acks(&client, AQ, 2).await;
    nacks.sort_by_key(|a| a.body.is_empty());
    check_ack(
        &nacks[0],
        delivered,
        class::NACK_Q_DELETED,
        "",
        b"delivered",
    );
    // A recoverable message's body is not read once its queue is deleted: its NACK has none.
    check_ack(&nacks[1], received, class::NACK_Q_DELETED, "", b"");
}
