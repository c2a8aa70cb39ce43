//! Several receivers on one queue: streaming consumers and plain receive loops, all at once,
//! get every message exactly once and each in queue order; a consumer that goes away gives its
//! unacknowledged messages back, in order.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mq_client::{ConsumerOptions, Message, SenderOptions};
use mq_tests::{create_default_queue, eventually, InProcessBroker};

const Q: &str = r".\private$\work";

fn body_number(body: &[u8]) -> usize {
    std::str::from_utf8(body)
        .ok()
        .and_then(|s| s.strip_prefix('m'))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("unexpected body {:?}", String::from_utf8_lossy(body)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_consumers_and_two_receive_loops_get_each_message_once() {
    const N: usize = 5_000;
    let (broker, client) = InProcessBroker::start_with_queue(Q).await;
    let q = client.queue(Q).unwrap();
    let total = Arc::new(AtomicUsize::new(0));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);

    let mut tasks = Vec::new();
    for c in 0..4 {
        let q = q.clone();
        let total = total.clone();
        tasks.push(tokio::spawn(async move {
            let mut consumer = q
                .consumer(ConsumerOptions {
                    prefetch: 32 << c, // 32, 64, 128, 256: different appetites
                    limit: None,
                })
                .await
                .unwrap();
            let mut got = Vec::new();
            while total.load(Ordering::Acquire) < N && tokio::time::Instant::now() < deadline {
                if let Some(m) = consumer.next(Duration::from_millis(100)).await.unwrap() {
                    got.push(body_number(&m.body));
                    total.fetch_add(1, Ordering::AcqRel);
                }
            }
            consumer.close().await.unwrap();
            (format!("consumer {c}"), got)
        }));
    }
    for r in 0..2 {
        let q = q.clone();
        let total = total.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            while total.load(Ordering::Acquire) < N && tokio::time::Instant::now() < deadline {
                if let Some(m) = q.receive(Duration::from_millis(100)).await.unwrap() {
                    got.push(body_number(&m.body));
                    total.fetch_add(1, Ordering::AcqRel);
                }
            }
            (format!("receive loop {r}"), got)
        }));
    }

    let sender = q.sender(SenderOptions::default()).await.unwrap();
    for i in 0..N {
        sender.send(Message::new(format!("m{i}"))).await.unwrap();
    }
    assert_eq!(sender.close().await.unwrap().acknowledged, N as u64);

    let mut all = Vec::with_capacity(N);
    let mut shares = Vec::new();
    for t in tasks {
        let (who, got) = t.await.unwrap();
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "{who} received out of queue order"
        );
        shares.push(format!("{who}: {}", got.len()));
        all.extend(got);
    }
    all.sort_unstable();
    let dups: Vec<_> = all
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    assert!(
        dups.is_empty(),
        "received more than once: {dups:?} ({shares:?})"
    );
    assert_eq!(
        all,
        (0..N).collect::<Vec<_>>(),
        "every message once ({shares:?})"
    );
    let info = q.info().await.unwrap();
    assert_eq!(
        (info.messages, info.in_flight, info.bytes),
        (0, 0, 0),
        "{info:?}"
    );
    broker.stop().await.unwrap();
}

async fn queue_with(broker: &InProcessBroker, n: usize) -> mq_client::Queue {
    let client = broker.client().await;
    create_default_queue(&client, Q).await;
    let q = client.queue(Q).unwrap();
    let sender = q.sender(SenderOptions::default()).await.unwrap();
    for i in 0..n {
        sender.send(Message::new(format!("m{i}"))).await.unwrap();
    }
    sender.close().await.unwrap();
    q
}

/// Waits until nothing of the queue is reserved by a consumer and `messages` are stored.
async fn settle(q: &mq_client::Queue, messages: u64) {
    let settled = eventually(Duration::from_secs(10), || async {
        let i = q.info().await.unwrap();
        i.in_flight == 0 && i.messages == messages
    })
    .await;
    assert!(
        settled,
        "queue did not settle: {:?}",
        q.info().await.unwrap()
    );
}

/// Every message waiting in `q` (settled: none in flight), in the order a consumer gets them.
async fn drain(q: &mq_client::Queue) -> Vec<usize> {
    let n = q.info().await.unwrap().messages;
    let mut c = q
        .consumer(ConsumerOptions {
            limit: Some(n),
            ..ConsumerOptions::default()
        })
        .await
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..n {
        match c.next(Duration::from_secs(10)).await.unwrap() {
            Some(m) => got.push(body_number(&m.body)),
            None => break,
        }
    }
    c.close().await.unwrap();
    got
}

/// A consumer of `q` with `prefetch` and `limit`.
async fn consumer(q: &mq_client::Queue, prefetch: u32, limit: Option<u64>) -> mq_client::Consumer {
    q.consumer(ConsumerOptions { prefetch, limit })
        .await
        .unwrap()
}

/// Takes the next messages from `c`, asserting they are `m{want}` for each of `wants` in turn.
async fn expect_next(c: &mut mq_client::Consumer, wants: std::ops::Range<usize>) {
    for want in wants {
        let m = c.next(Duration::from_secs(5)).await.unwrap().unwrap();
        assert_eq!(body_number(&m.body), want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_consumer_gives_back_unacknowledged_messages_in_order() {
    let broker = InProcessBroker::start().await;
    let q = queue_with(&broker, 20).await;
    let mut a = consumer(&q, 50, None).await;
    expect_next(&mut a, 0..3).await;
    // m0..m2 handed out, m3..m19 prefetched; nothing acknowledged (no further `next`, no
    // `ack`, no `close`).
    drop(a);
    settle(&q, 20).await;
    assert_eq!(drain(&q).await, (0..20).collect::<Vec<_>>());
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_then_drop_removes_the_acknowledged_and_gives_back_the_rest() {
    let broker = InProcessBroker::start().await;
    let q = queue_with(&broker, 20).await;
    let mut a = consumer(&q, 50, None).await;
    expect_next(&mut a, 0..2).await;
    // `ack` is documented as "the broker removes them for good".
    a.ack().await.unwrap();
    expect_next(&mut a, 2..5).await;
    drop(a);
    let settled = eventually(Duration::from_secs(10), || async {
        q.info().await.unwrap().in_flight == 0
    })
    .await;
    assert!(settled, "{:?}", q.info().await.unwrap());
    let info = q.info().await.unwrap();
    assert_eq!(
        info.messages, 18,
        "m0 and m1 were acknowledged by ack() before the drop and must not come back: {info:?}"
    );
    assert_eq!(drain(&q).await, (2..20).collect::<Vec<_>>());
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_acknowledges_what_was_consumed_and_returns_the_prefetch() {
    let broker = InProcessBroker::start().await;
    let q = queue_with(&broker, 20).await;
    let mut a = consumer(&q, 10, None).await;
    expect_next(&mut a, 0..3).await;
    a.close().await.unwrap();
    settle(&q, 17).await;
    assert_eq!(drain(&q).await, (3..20).collect::<Vec<_>>());
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_with_a_limit_reserves_no_more_than_it_takes() {
    let broker = InProcessBroker::start().await;
    let q = queue_with(&broker, 10).await;
    let mut a = consumer(&q, 100, Some(3)).await;
    let mut got = Vec::new();
    for _ in 0..3 {
        if let Some(m) = a.next(Duration::from_secs(10)).await.unwrap() {
            got.push(body_number(&m.body));
        }
    }
    assert_eq!(got, [0, 1, 2]);
    assert!(a.next(Duration::from_millis(300)).await.unwrap().is_none());
    // While it is still open, the rest stays available to others.
    let other = q.receive(Duration::from_secs(5)).await.unwrap().unwrap();
    assert_eq!(body_number(&other.body), 3);
    a.close().await.unwrap();
    settle(&q, 6).await;
    broker.stop().await.unwrap();
}
