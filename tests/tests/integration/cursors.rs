//! Cursors (MSMQ MQ_ACTION_PEEK_CURRENT / PEEK_NEXT / RECEIVE, .NET `MessageEnumerator`) and
//! `mq browse`: a cursor walking a queue while another client receives sees every message that
//! was not taken exactly once, in order; receive-current; a message taken under the cursor;
//! cursors bounded per connection and closed when idle; `mq browse --json --from`.

use std::collections::HashSet;
use std::time::Duration;

use mq_client::{ConsumerOptions, Error, Message, SenderOptions};
use mq_tests::{mq, InProcessBroker};

const Q: &str = r".\private$\walk";

fn num(m: &mq_client::ReceivedMessage) -> u64 {
    std::str::from_utf8(&m.body).unwrap().parse().unwrap()
}

async fn fill(q: &mq_client::Queue, n: u64) {
    let s = q.sender(SenderOptions::default()).await.unwrap();
    for i in 0..n {
        s.send(Message::new(i.to_string())).await.unwrap();
    }
    s.close().await.unwrap();
}

/// One client walks the queue with peek-next (and receives every 10th message through the
/// cursor) while another receives from the head. The walker sees messages in order, never
/// twice, and sees every message the other did not take; every message is received once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_walks_while_another_client_receives() {
    const N: u64 = 3000;
    let (broker, client) = InProcessBroker::start_with_queue(Q).await;
    let q = client.queue(Q).unwrap();
    fill(&q, N).await;
    let other = broker.client().await;
    let receiver = tokio::spawn(async move {
        let mut c = other
            .queue(Q)
            .unwrap()
            .consumer(ConsumerOptions {
                prefetch: 16,
                limit: None,
            })
            .await
            .unwrap();
        let mut taken = Vec::new();
        while let Some(m) = c.next(Duration::from_millis(500)).await.unwrap() {
            taken.push(num(&m));
            if taken.len().is_multiple_of(64) {
                tokio::task::yield_now().await;
            }
        }
        c.close().await.unwrap();
        taken
    });
    let mut cursor = q.cursor().unwrap();
    let mut seen = Vec::new();
    let mut received = Vec::new();
    let mut step = cursor.peek_current(Duration::ZERO).await;
    loop {
        let m = match step {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(Error::NotFound(_)) => {
                // Taken under the cursor by the other client: move on.
                step = cursor.peek_next(Duration::ZERO).await;
                continue;
            }
            Err(e) => panic!("cursor: {e}"),
        };
        let n = num(&m);
        seen.push(n);
        step = if n.is_multiple_of(10) {
            match cursor.receive_current(Duration::ZERO).await {
                Ok(Some(r)) => {
                    assert_eq!(num(&r), n);
                    received.push(n);
                }
                Ok(None) => panic!("receive-current found nothing at {n}"),
                Err(Error::NotFound(_)) => {} // the other client was first
                Err(e) => panic!("receive-current: {e}"),
            }
            // After a receive the cursor is on the next message already.
            cursor.peek_current(Duration::ZERO).await
        } else {
            cursor.peek_next(Duration::ZERO).await
        };
    }
    let taken = receiver.await.unwrap();
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "in order, never twice"
    );
    let taken_set: HashSet<u64> = taken.iter().copied().collect();
    let seen_set: HashSet<u64> = seen.iter().copied().collect();
    for i in 0..N {
        assert!(
            seen_set.contains(&i) || taken_set.contains(&i),
            "message {i} was neither seen by the cursor nor taken by the other client"
        );
    }
    let mut all: Vec<u64> = taken.iter().chain(received.iter()).copied().collect();
    all.sort();
    let drained = q.peek_many(u32::MAX, Duration::ZERO).await.unwrap();
    all.extend(drained.iter().map(num));
    all.sort();
    assert_eq!(
        all,
        (0..N).collect::<Vec<_>>(),
        "every message received exactly once"
    );
    assert!(!received.is_empty());
    broker.stop().await.unwrap();
}

/// Peek-current on a message another client took: MQ_ERROR_MESSAGE_ALREADY_RECEIVED, and
/// peek-next moves on. A cursor at the end waits for a new message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_taken_under_the_cursor_and_waiting_at_the_end() {
    let (broker, client) = InProcessBroker::start_with_queue(Q).await;
    let q = client.queue(Q).unwrap();
    fill(&q, 3).await;
    let mut cursor = q.cursor().unwrap();
    let first = cursor.peek_current(Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(num(&first), 0);
    q.receive_by_id(first.id, Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    match cursor.peek_current(Duration::ZERO).await {
        Err(Error::NotFound(m)) => assert!(m.contains("ALREADY_RECEIVED"), "{m}"),
        other => panic!("expected already received, got {other:?}"),
    }
    assert_eq!(
        num(&cursor.peek_next(Duration::ZERO).await.unwrap().unwrap()),
        1
    );
    assert_eq!(
        num(&cursor.peek_next(Duration::ZERO).await.unwrap().unwrap()),
        2
    );
    assert!(cursor
        .peek_next(Duration::from_millis(50))
        .await
        .unwrap()
        .is_none());
    let waiter = tokio::spawn(async move { cursor.peek_next(Duration::from_secs(20)).await });
    q.send(Message::new("3")).await.unwrap();
    assert_eq!(num(&waiter.await.unwrap().unwrap().unwrap()), 3);
    broker.stop().await.unwrap();
}

/// At most --max-cursors-per-connection cursors per connection (the refusal names the limit);
/// closing one frees its place; an idle cursor is closed after --cursor-idle-secs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_are_bounded_per_connection_and_closed_when_idle() {
    let broker = InProcessBroker::start_with(|c| {
        c.flow.max_cursors_per_connection = 2;
        c.flow.cursor_idle = Duration::from_millis(300);
    })
    .await;
    let client = broker.client().await;
    mq_tests::create_default_queue(&client, Q).await;
    let q = client.queue(Q).unwrap();
    fill(&q, 2).await;
    let mut a = q.cursor().unwrap();
    let mut b = q.cursor().unwrap();
    let mut c = q.cursor().unwrap();
    a.peek_current(Duration::ZERO).await.unwrap().unwrap();
    b.peek_current(Duration::ZERO).await.unwrap().unwrap();
    match c.peek_current(Duration::ZERO).await {
        Err(Error::QuotaExceeded(m)) => assert!(m.contains("--max-cursors-per-connection"), "{m}"),
        other => panic!("expected the cursor limit, got {other:?}"),
    }
    drop(b);
    // The broker sees the stream end a moment later.
    let mut opened = false;
    for _ in 0..200 {
        if c.peek_current(Duration::ZERO).await.is_ok() {
            opened = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(opened, "a closed cursor gives its place back");
    // Idle past the limit: closed, saying why.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    match a.peek_next(Duration::ZERO).await {
        Err(e) => assert!(e.to_string().contains("--cursor-idle-secs"), "{e}"),
        Ok(m) => panic!("an idle cursor answered: {m:?}"),
    }
    broker.stop().await.unwrap();
}

/// `mq browse` prints every message in receive order without removing any, `--from ID` starts
/// at a message, `--json` prints objects; `mq queue set` changes label and quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mq_browse_from_and_json() {
    let (broker, client) = InProcessBroker::start_with_queue(Q).await;
    let q = client.queue(Q).unwrap();
    fill(&q, 2500).await;
    let out = mq(broker.url(), &["browse", Q], None);
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(lines, (0..2500).map(|i| i.to_string()).collect::<Vec<_>>());
    let third = q.peek_many(3, Duration::ZERO).await.unwrap()[2].id;
    let out = mq(
        broker.url(),
        &[
            "browse",
            Q,
            "--json",
            "--from",
            &third.to_string(),
            "--count",
            "1200",
        ],
        None,
    );
    assert!(out.status.success(), "{out:?}");
    let objs: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(objs.len(), 1200);
    assert_eq!(objs[0]["id"], third.to_string());
    assert_eq!(q.info().await.unwrap().messages, 2500);
    let out = mq(
        broker.url(),
        &["browse", Q, "--from", &uuid::Uuid::nil().to_string()],
        None,
    );
    assert!(!out.status.success());
    broker.stop().await.unwrap();
}
