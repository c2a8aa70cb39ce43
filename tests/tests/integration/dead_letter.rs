//! Dead-letter queues (`SYSTEM$;DEADLETTER` for non-transactional messages, `SYSTEM$;DEADXACT`
//! for transactional ones) with real `mqd` processes: one test per reason a message is
//! dead-lettered (refused by the destination broker: no such queue, transactional mismatch either
//! way, queue over quota; time-to-reach-queue or time-to-be-received passing in an outgoing queue;
//! time-to-be-received passing in the destination queue), each checking the class, the original
//! destination, the id, body and properties, and which of the two queues it went to; the
//! dead-letter queues are read-only but can be received from, peeked, purged and inspected, also
//! with `mq peek` and `mq receive --json`.
//!
//! Every wait is bounded and polls a condition; nothing sleeps a fixed time.

use std::time::{Duration, SystemTime};

use mq_client::{Client, DeadLetterClass, Delivery, Error, Message, MessageId, ReceivedMessage};

use crate::store_and_forward::{
    cli, cli_output, create, drain, local, outgoing_to, try_count, wait_count, wait_outgoing_empty,
    Node, WAIT,
};
use mq_tests::eventually;

const DEADLETTER: &str = r"DIRECT=OS:.\SYSTEM$;DEADLETTER";
const DEADXACT: &str = r"DIRECT=OS:.\SYSTEM$;DEADXACT";
/// A time limit that passes while the test waits for it, but not before the test has looked.
const SHORT_LIMIT: Duration = Duration::from_millis(300);

/// B with a plain queue `q` and a transactional queue `tq`, stopped; A running. Returns
/// (B, A, a client of A).
async fn b_down_with_queues() -> (Node, Node, Client) {
    let mut b = Node::started("b");
    {
        let bc = b.client().await;
        create(&bc, "q", false, None).await;
        create(&bc, "tq", true, None).await;
    }
    b.terminate();
    let a = Node::started("a");
    let client = a.client().await;
    (b, a, client)
}

async fn dlq_count(client: &Client, dlq: &str) -> u64 {
    client
        .queue_info(dlq)
        .await
        .unwrap_or_else(|e| panic!("info {dlq}: {e}"))
        .messages
}

/// Waits until `dlq` holds exactly `n` messages and returns them, peeked (not removed).
async fn wait_dead_letters(client: &Client, dlq: &str, n: u64) -> Vec<ReceivedMessage> {
    let reached = eventually(WAIT, || async { dlq_count(client, dlq).await == n }).await;
    let got = client
        .queue(dlq)
        .unwrap()
        .peek_many(1000, Duration::ZERO)
        .await
        .unwrap();
    assert!(
        reached,
        "{dlq} holds {} messages, expected {n}: {got:#?}",
        got.len()
    );
    assert_eq!(got.len() as u64, n, "peek of {dlq}: {got:#?}");
    got
}

/// What a dead letter must carry.
struct Expected<'a> {
    id: MessageId,
    body: &'a str,
    class: DeadLetterClass,
    /// The format name it was sent to, as the sender wrote it.
    destination: &'a str,
    transactional: bool,
    /// The broker that must have dead-lettered it (its `--name`), where that is unambiguous.
    broker: Option<&'a str>,
}

#[track_caller]
fn check(m: &ReceivedMessage, want: &Expected<'_>) {
    let dl = m
        .dead_letter
        .as_ref()
        .unwrap_or_else(|| panic!("no dead_letter info on {m:#?}"));
    assert_eq!(m.id, want.id, "the id survives dead-lettering: {m:#?}");
    assert_eq!(m.body.as_ref(), want.body.as_bytes(), "{m:#?}");
    assert_eq!(dl.class, want.class, "{m:#?}");
    assert_eq!(m.transactional, want.transactional, "{m:#?}");
    assert!(!dl.reason.trim().is_empty(), "no reason: {m:#?}");
    assert!(!dl.broker.is_empty(), "no broker: {m:#?}");
    if let Some(b) = want.broker {
        assert_eq!(dl.broker, b, "{m:#?}");
    }
    assert!(
        dl.time + Duration::from_millis(1) >= m.sent_time && dl.time <= SystemTime::now(),
        "dead-lettered at {:?}, sent at {:?}: {m:#?}",
        dl.time,
        m.sent_time
    );
    assert_eq!(
        dl.destination, want.destination,
        "the dead letter's destination is the format name the sender used: {m:#?}"
    );
}

/// Asserts, at the end of a test (so that everything else is checked first), that each dead
/// letter kept its deadline: dead letters keep their properties.
#[track_caller]
fn assert_deadlines_kept(kept: &[(&str, &ReceivedMessage, Option<SystemTime>)], what: &str) {
    for (dlq, m, deadline) in kept {
        assert!(
            deadline.is_some(),
            "the dead letter in {dlq} lost its {what} (dead letters keep their properties): {m:#?}"
        );
    }
}

/// Commits one transaction sending `message` to `dest`; returns its id.
async fn send_tx(client: &Client, dest: &str, message: Message) -> MessageId {
    let mut tx = client.begin().await.unwrap();
    tx.send(dest, message).unwrap();
    let ids = tx
        .commit()
        .await
        .unwrap_or_else(|e| panic!("commit a send to {dest}: {e}"));
    assert_eq!(ids.len(), 1);
    ids[0]
}

async fn send(client: &Client, dest: &str, message: Message) -> MessageId {
    client
        .queue(dest)
        .unwrap()
        .send(message)
        .await
        .unwrap_or_else(|e| panic!("send to {dest}: {e}"))
}

/// A recoverable message `body` sent to `q` and a transactional one `{body}-tx` sent to `tq`,
/// both with the same time limit.
struct LimitedPair<'a> {
    q: &'a str,
    tq: &'a str,
    body: &'a str,
    id: MessageId,
    tid: MessageId,
}

/// Sends the [`LimitedPair`] for `body`, `limit` setting the time limit on each message.
async fn send_limited_pair<'a>(
    client: &Client,
    q: &'a str,
    tq: &'a str,
    body: &'a str,
    limit: impl Fn(Message) -> Message,
) -> LimitedPair<'a> {
    let id = send(
        client,
        q,
        limit(Message::new(body.to_string()).recoverable(true)),
    )
    .await;
    let tid = send_tx(client, tq, limit(Message::new(format!("{body}-tx")))).await;
    LimitedPair {
        q,
        tq,
        body,
        id,
        tid,
    }
}

/// Waits for `pair` to be dead-lettered as `class` by A (named `a`) from its outgoing queue: the
/// plain message in DEADLETTER, the transactional one in DEADXACT, each checked and dead-lettered
/// no earlier than [`SHORT_LIMIT`] after it was sent nor before its `deadline`. Returns each
/// with the queue it is in.
async fn wait_outgoing_dead_letters(
    client: &Client,
    a: &str,
    pair: &LimitedPair<'_>,
    class: DeadLetterClass,
    deadline: fn(&ReceivedMessage) -> Option<SystemTime>,
) -> Vec<(&'static str, ReceivedMessage)> {
    let tx_body = format!("{}-tx", pair.body);
    let mut dead = Vec::new();
    for (dlq, id, body, dest, transactional) in [
        (DEADLETTER, pair.id, pair.body, pair.q, false),
        (DEADXACT, pair.tid, tx_body.as_str(), pair.tq, true),
    ] {
        let m = wait_dead_letters(client, dlq, 1).await.remove(0);
        check(
            &m,
            &Expected {
                id,
                body,
                class,
                destination: dest,
                transactional,
                broker: Some(a),
            },
        );
        let at = m.dead_letter.as_ref().unwrap().time;
        assert!(
            at >= m.sent_time + SHORT_LIMIT && deadline(&m).is_none_or(|deadline| at >= deadline),
            "dead-lettered before its deadline: {m:#?}"
        );
        dead.push((dlq, m));
    }
    dead
}

// ---------------------------------------------------------------------------------------------

/// No such queue on B: both messages come back to A's dead-letter queues (the recoverable one to
/// DEADLETTER, the transactional one to DEADXACT) as BadDestinationQueue, with id, body, label,
/// correlation id and app-specific kept; `mq peek`, `mq peek --json` and `mq receive --json`
/// show why; receive and purge empty the queues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_destination_queue() {
    let b = Node::started("b");
    let a = Node::started("a");
    let client = a.client().await;
    let missing = b.queue("missing");

    let id = send(
        &client,
        &missing,
        Message::new("lost")
            .recoverable(true)
            .label("the label")
            .correlation_id("corr-1")
            .app_specific(42),
    )
    .await;
    let tid = send_tx(&client, &missing, Message::new("lost-tx").label("tx label")).await;

    let dl = wait_dead_letters(&client, DEADLETTER, 1).await;
    check(
        &dl[0],
        &Expected {
            id,
            body: "lost",
            class: DeadLetterClass::BadDestinationQueue,
            destination: &missing,
            transactional: false,
            broker: None,
        },
    );
    assert_eq!(
        (
            dl[0].label.as_str(),
            dl[0].correlation_id.as_str(),
            dl[0].app_specific,
            dl[0].delivery
        ),
        ("the label", "corr-1", 42, Delivery::Recoverable),
        "properties survive dead-lettering"
    );
    let dx = wait_dead_letters(&client, DEADXACT, 1).await;
    check(
        &dx[0],
        &Expected {
            id: tid,
            body: "lost-tx",
            class: DeadLetterClass::BadDestinationQueue,
            destination: &missing,
            transactional: true,
            broker: None,
        },
    );
    assert_eq!(dx[0].label, "tx label");

    wait_outgoing_empty(&client, &b.dest()).await;
    let o = outgoing_to(&client, &b.dest()).await.unwrap();
    assert_eq!((o.forwarded, o.dead_lettered), (0, 2), "{o:?}");
    let bc = b.client().await;
    assert_eq!(dlq_count(&bc, DEADLETTER).await, 0, "B's DEADLETTER");
    assert_eq!(dlq_count(&bc, DEADXACT).await, 0, "B's DEADXACT");

    // The command line shows why.
    let url = a.url();
    let text = cli(&url, &["peek", DEADLETTER]).await;
    assert!(
        text.contains("BadDestinationQueue") && text.contains(&missing) && text.contains("lost"),
        "mq peek {DEADLETTER}: {text}"
    );
    let out = cli(&url, &["peek", "--json", DEADLETTER]).await;
    let v: serde_json::Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("mq peek --json: not one JSON object ({e}): {out}"));
    assert_eq!(v["id"], id.to_string(), "{v}");
    assert_eq!(v["body"], "lost", "{v}");
    let d = &v["dead_letter"];
    assert_eq!(d["class"], "BadDestinationQueue", "{v}");
    assert_eq!(d["destination"], missing.as_str(), "{v}");
    assert!(d["reason"].as_str().is_some_and(|r| !r.is_empty()), "{v}");
    assert!(d["broker"].as_str().is_some_and(|r| !r.is_empty()), "{v}");
    assert!(d["time_ms"].as_u64().is_some_and(|t| t > 0), "{v}");

    let out = cli(&url, &["receive", "--json", DEADXACT]).await;
    let v: serde_json::Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("mq receive --json: not one JSON object ({e}): {out}"));
    assert_eq!(v["id"], tid.to_string(), "{v}");
    assert_eq!(v["dead_letter"]["class"], "BadDestinationQueue", "{v}");
    assert_eq!(v["dead_letter"]["destination"], missing.as_str(), "{v}");
    assert_eq!(v["transactional"], true, "{v}");
    assert_eq!(
        dlq_count(&client, DEADXACT).await,
        0,
        "received from DEADXACT"
    );

    assert_eq!(client.purge(DEADLETTER).await.unwrap(), 1);
    assert_eq!(dlq_count(&client, DEADLETTER).await, 0);
}

/// A transactional message for a non-transactional queue on B: A's DEADXACT,
/// NotTransactionalQueue. A recoverable message to the same queue is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_message_to_non_transactional_queue() {
    transactional_mismatch(false).await;
}

/// A non-transactional (recoverable) message for a transactional queue on B: A's DEADLETTER,
/// NotTransactionalMessage. A transactional message to the same queue is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_transactional_message_to_transactional_queue() {
    transactional_mismatch(true).await;
}

/// One message sent the other way than B's queue is (transactional or not) goes to A's
/// dead-letter queue for its kind; one sent the right way is delivered; B dead-letters nothing.
async fn transactional_mismatch(queue_transactional: bool) {
    let b = Node::started("b");
    let bc = b.client().await;
    let name = if queue_transactional { "tq" } else { "q" };
    create(&bc, name, queue_transactional, None).await;
    let a = Node::started("a");
    let client = a.client().await;
    let dest = b.queue(name);

    let (id, bad, good) = if queue_transactional {
        let id = send(
            &client,
            &dest,
            Message::new("plain-to-tx").recoverable(true),
        )
        .await;
        send_tx(&client, &dest, Message::new("tx")).await;
        (id, "plain-to-tx", "tx")
    } else {
        let id = send_tx(&client, &dest, Message::new("tx-to-plain")).await;
        send(&client, &dest, Message::new("plain").recoverable(true)).await;
        (id, "tx-to-plain", "plain")
    };
    let (dlq, other, class) = if queue_transactional {
        (
            DEADLETTER,
            DEADXACT,
            DeadLetterClass::NotTransactionalMessage,
        )
    } else {
        (DEADXACT, DEADLETTER, DeadLetterClass::NotTransactionalQueue)
    };

    let dead = wait_dead_letters(&client, dlq, 1).await;
    check(
        &dead[0],
        &Expected {
            id,
            body: bad,
            class,
            destination: &dest,
            transactional: !queue_transactional,
            broker: None,
        },
    );
    wait_count(&bc, name, 1).await;
    wait_outgoing_empty(&client, &b.dest()).await;
    assert_eq!(dlq_count(&client, other).await, 0);
    assert_eq!(drain(&bc, name).await, [good]);
    assert_eq!(dlq_count(&bc, dlq).await, 0, "B's dead-letter queue");
}

/// B's queue has room for one 600-byte message (quota 1000 bytes): the first is delivered, the
/// second comes back to A's DEADLETTER as QueueExceedQuota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destination_queue_over_quota() {
    let b = Node::started("b");
    let bc = b.client().await;
    create(&bc, "small", false, Some(1000)).await;
    let a = Node::started("a");
    let client = a.client().await;
    let dest = b.queue("small");
    let body = |n: u32| format!("{n:<600}");

    send(&client, &dest, Message::new(body(1)).recoverable(true)).await;
    let id2 = send(&client, &dest, Message::new(body(2)).recoverable(true)).await;

    let dl = wait_dead_letters(&client, DEADLETTER, 1).await;
    check(
        &dl[0],
        &Expected {
            id: id2,
            body: &body(2),
            class: DeadLetterClass::QueueExceedQuota,
            destination: &dest,
            transactional: false,
            broker: None,
        },
    );
    wait_count(&bc, "small", 1).await;
    wait_outgoing_empty(&client, &b.dest()).await;
    assert_eq!(drain(&bc, "small").await, [body(1)]);
    assert_eq!(dlq_count(&client, DEADXACT).await, 0);
}

/// B is down: messages whose time-to-reach-queue passes in A's outgoing queue go to A's
/// DEADLETTER / DEADXACT as ReachQueueTimeout (dead-lettered by A, after the deadline); a
/// message without a limit sent alongside stays and is delivered when B is back, alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reach_queue_timeout_in_outgoing_queue() {
    let (mut b, a, client) = b_down_with_queues().await;
    let (q, tq) = (b.queue("q"), b.queue("tq"));

    let late = send_limited_pair(&client, &q, &tq, "late", |m| {
        m.time_to_reach_queue(SHORT_LIMIT)
    })
    .await;
    send(&client, &q, Message::new("patient").recoverable(true)).await;

    let dead = wait_outgoing_dead_letters(
        &client,
        a.name(),
        &late,
        DeadLetterClass::ReachQueueTimeout,
        |m| m.reach_queue_by,
    )
    .await;
    let o = outgoing_to(&client, &b.dest()).await.unwrap();
    assert_eq!((o.messages, o.dead_lettered), (1, 2), "{o:?}");

    b.start();
    let bc = b.client().await;
    wait_count(&bc, "q", 1).await;
    wait_outgoing_empty(&client, &b.dest()).await;
    assert_eq!(drain(&bc, "q").await, ["patient"]);
    assert_eq!(try_count(&bc, "tq").await, Some(0));
    let kept: Vec<_> = dead
        .iter()
        .map(|(d, m)| (*d, m, m.reach_queue_by))
        .collect();
    assert_deadlines_kept(&kept, "reach_queue_by");
}

/// Messages whose time-to-be-received passes in B's queues, unreceived: a receive after the
/// deadline gets nothing, and they go to B's DEADLETTER / DEADXACT as ReceiveTimeout
/// (dead-lettered by B); A's dead-letter queues stay empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_timeout_in_destination_queue() {
    // Long enough for the forward and the peeks below on a loaded machine.
    const LIMIT: Duration = Duration::from_secs(5);
    let b = Node::started("b");
    let bc = b.client().await;
    create(&bc, "q", false, None).await;
    create(&bc, "tq", true, None).await;
    let a = Node::started("a");
    let client = a.client().await;
    let (q, tq) = (b.queue("q"), b.queue("tq"));

    let LimitedPair { id, tid, .. } =
        send_limited_pair(&client, &q, &tq, "short", |m| m.time_to_be_received(LIMIT)).await;

    // Both reach their queue on B before the limit.
    wait_count(&bc, "q", 1).await;
    wait_count(&bc, "tq", 1).await;
    let mut deadlines = Vec::new();
    for (name, want) in [("q", id), ("tq", tid)] {
        let m = bc
            .queue(&local(name))
            .unwrap()
            .peek(Duration::ZERO)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{name} on B is empty"));
        assert_eq!(m.id, want);
        assert!(m.dead_letter.is_none(), "{m:#?}");
        deadlines.push(
            m.receive_by
                .unwrap_or_else(|| panic!("no receive_by on a message sent with one: {m:#?}")),
        );
    }

    // Past the deadlines, a receive gets nothing, whether or not the sweep has run yet.
    let latest = *deadlines.iter().max().unwrap();
    let passed = eventually(WAIT, || async { SystemTime::now() > latest }).await;
    assert!(passed);
    for name in ["q", "tq"] {
        let got = bc
            .queue(&local(name))
            .unwrap()
            .receive(Duration::ZERO)
            .await
            .unwrap();
        assert!(got.is_none(), "an expired message was received: {got:#?}");
    }

    let mut dead = Vec::new();
    for (dlq, id, body, dest, transactional, deadline) in [
        (DEADLETTER, id, "short", &q, false, deadlines[0]),
        (DEADXACT, tid, "short-tx", &tq, true, deadlines[1]),
    ] {
        let m = wait_dead_letters(&bc, dlq, 1).await.remove(0);
        let at = m
            .dead_letter
            .as_ref()
            .unwrap_or_else(|| panic!("no dead_letter info on {m:#?}"))
            .time;
        assert!(at >= deadline, "dead-lettered before its deadline: {m:#?}");
        dead.push((dlq, m.clone(), deadline));
        check(
            &m,
            &Expected {
                id,
                body,
                class: DeadLetterClass::ReceiveTimeout,
                destination: dest,
                transactional,
                broker: Some(b.name()),
            },
        );
    }
    assert_eq!(try_count(&bc, "q").await, Some(0));
    assert_eq!(try_count(&bc, "tq").await, Some(0));
    assert_eq!(dlq_count(&client, DEADLETTER).await, 0, "A's DEADLETTER");
    assert_eq!(dlq_count(&client, DEADXACT).await, 0, "A's DEADXACT");
    for (dlq, m, deadline) in &dead {
        assert_eq!(
            m.receive_by,
            Some(*deadline),
            "the dead letter in {dlq} lost its receive_by (dead letters keep their properties): {m:#?}"
        );
    }
}

/// B is down: messages whose time-to-be-received passes in A's outgoing queue go to A's
/// DEADLETTER / DEADXACT as ReceiveTimeout (dead-lettered by A) and never reach B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_timeout_in_outgoing_queue() {
    let (mut b, a, client) = b_down_with_queues().await;
    let (q, tq) = (b.queue("q"), b.queue("tq"));

    let stale = send_limited_pair(&client, &q, &tq, "stale", |m| {
        m.time_to_be_received(SHORT_LIMIT)
    })
    .await;

    let dead = wait_outgoing_dead_letters(
        &client,
        a.name(),
        &stale,
        DeadLetterClass::ReceiveTimeout,
        |m| m.receive_by,
    )
    .await;
    // Counted by the outgoing queue a moment after the dead letters show.
    let counted = mq_tests::eventually(WAIT, || async {
        let o = outgoing_to(&client, &b.dest()).await.unwrap();
        (o.messages, o.dead_lettered) == (0, 2)
    })
    .await;
    let o = outgoing_to(&client, &b.dest()).await.unwrap();
    assert!(counted, "{o:?}");

    // Nothing of them reaches B: a marker sent now is all B gets.
    b.start();
    let bc = b.client().await;
    send(&client, &q, Message::new("marker").recoverable(true)).await;
    wait_count(&bc, "q", 1).await;
    wait_outgoing_empty(&client, &b.dest()).await;
    assert_eq!(drain(&bc, "q").await, ["marker"]);
    assert_eq!(try_count(&bc, "tq").await, Some(0));
    let kept: Vec<_> = dead.iter().map(|(d, m)| (*d, m, m.receive_by)).collect();
    assert_deadlines_kept(&kept, "receive_by");
}

/// Sending to a dead-letter queue is refused (client, transaction and `mq send`), naming the
/// queue as read-only; info, peek, receive and purge work on the empty queues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_queues_are_read_only() {
    let b = Node::started("b");
    let a = Node::started("a");
    let client = a.client().await;

    for dlq in [DEADLETTER, DEADXACT] {
        let q = client.queue(dlq).unwrap();
        let e = q
            .send(Message::new("x").recoverable(true))
            .await
            .expect_err("a send to a dead-letter queue");
        assert!(
            matches!(&e, Error::FailedPrecondition(m) if m.contains("read-only")),
            "send to {dlq}: {e:?}"
        );
        let mut tx = client.begin().await.unwrap();
        tx.send(dlq, Message::new("x")).unwrap();
        let e = tx
            .commit()
            .await
            .expect_err("a transactional send to a dead-letter queue");
        assert!(
            e.to_string().contains("read-only"),
            "commit to {dlq}: {e:?}"
        );

        let info = client.queue_info(dlq).await.unwrap();
        assert_eq!((info.messages, info.in_flight), (0, 0), "{info:?}");
        assert!(q.peek_many(10, Duration::ZERO).await.unwrap().is_empty());
        assert!(q.receive(Duration::ZERO).await.unwrap().is_none());
        assert_eq!(q.purge().await.unwrap(), 0);
    }

    // A dead-letter queue on another broker is just as read-only.
    let remote = format!(r"DIRECT=TCP:{}\SYSTEM$;DEADLETTER", b.dest());
    let e = client
        .queue(&remote)
        .unwrap()
        .send(Message::new("x").recoverable(true))
        .await
        .expect_err("a send to another broker's dead-letter queue");
    assert!(e.to_string().contains("read-only"), "{remote}: {e:?}");

    let out = cli_output(&a.url(), &["send", DEADLETTER, "x"]).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("read-only")
            && err.to_ascii_uppercase().contains("DEADLETTER"),
        "mq send {DEADLETTER}: {}; stderr: {err}",
        out.status
    );
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert_eq!(dlq_count(&client, DEADLETTER).await, 0);
}

/// The command line end to end on one broker: `mq send --ttbr` to a queue nobody reads; the
/// message leaves the queue for DEADLETTER as ReceiveTimeout, and `mq receive --json` on the
/// dead-letter queue shows the class, the reason and the original destination.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mq_send_ttbr_then_mq_receive_shows_the_dead_letter() {
    let b = Node::started("b");
    let client = b.client().await;
    create(&client, "q", false, None).await;
    let url = b.url();
    cli(
        &url,
        &[
            "send",
            &local("q"),
            "short-lived",
            "--recoverable",
            "--ttbr",
            "200ms",
        ],
    )
    .await;
    let dead = wait_dead_letters(&client, DEADLETTER, 1).await;
    assert_eq!(dead[0].body.as_ref(), b"short-lived");
    let line = cli(&url, &["receive", DEADLETTER, "--json", "--timeout", "5s"]).await;
    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(v["body"], "short-lived", "{line}");
    assert_eq!(v["dead_letter"]["class"], "ReceiveTimeout", "{line}");
    assert!(
        v["dead_letter"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("time-to-be-received")),
        "{line}"
    );
    assert_eq!(
        v["dead_letter"]["destination"], r"DIRECT=OS:.\private$\q",
        "{line}"
    );
    assert!(v["receive_by_ms"].as_u64().is_some(), "{line}");
    assert_eq!(try_count(&client, "q").await, Some(0));
}
