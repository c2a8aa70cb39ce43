//! A consumer's acknowledgements held back and batched (`Consumer::set_ack_delay`), and
//! deliveries cut into stream items of about 64 KiB: held acknowledgements still remove their
//! messages (within the delay while `next` waits, at once when `next` times out), a dropped
//! consumer still gives back everything unacknowledged, in order, and a big delivery arrives
//! in several items, in order.

use std::time::Duration;

use mq_client::{ConsumerOptions, Message, SenderOptions};
use mq_proto::v1;
use mq_tests::{eventually, InProcessBroker};

const Q: &str = r".\private$\batched";

fn number(body: &[u8]) -> usize {
    std::str::from_utf8(body)
        .ok()
        .and_then(|s| s.strip_prefix('m'))
        .and_then(|s| s.get(..s.find(' ').unwrap_or(s.len())))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("unexpected body {:?}", String::from_utf8_lossy(body)))
}

/// A broker with queue `Q` holding `m0 ... m{n-1}`, each body padded to `size` bytes.
async fn queue_with(n: usize, size: usize) -> (InProcessBroker, mq_client::Queue) {
    let (broker, client) = InProcessBroker::start_with_queue(Q).await;
    let q = client.queue(Q).unwrap();
    let sender = q.sender(SenderOptions::default()).await.unwrap();
    for i in 0..n {
        let mut body = format!("m{i} ");
        body.extend(std::iter::repeat_n('x', size.saturating_sub(body.len())));
        sender.send(Message::new(body)).await.unwrap();
    }
    assert_eq!(sender.close().await.unwrap().acknowledged, n as u64);
    (broker, q)
}

/// Whether the queue settles at `messages` stored and none reserved by a consumer.
async fn settles(q: &mq_client::Queue, messages: u64) -> bool {
    eventually(Duration::from_secs(10), || async {
        let i = q.info().await.unwrap();
        i.in_flight == 0 && i.messages == messages
    })
    .await
}

async fn consumer(q: &mq_client::Queue, ack_delay: Duration) -> mq_client::Consumer {
    let mut c = q
        .consumer(ConsumerOptions {
            prefetch: 100,
            limit: None,
        })
        .await
        .unwrap();
    c.set_ack_delay(ack_delay);
    c
}

async fn expect_next(c: &mut mq_client::Consumer, wants: std::ops::Range<usize>) {
    for want in wants {
        let m = c.next(Duration::from_secs(5)).await.unwrap().unwrap();
        assert_eq!(number(&m.body), want);
    }
}

/// Consumed messages whose acknowledgement is held back are acknowledged once the delay has
/// passed while `next` still waits for more: the broker removes them without another call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_acknowledgement_goes_out_within_the_delay_while_next_waits() {
    let (broker, q) = queue_with(3, 10).await;
    let mut c = consumer(&q, Duration::from_millis(200)).await;
    expect_next(&mut c, 0..3).await;
    // The fourth `next` consumes m2 and waits (nothing more is coming for 30 s).
    tokio::select! {
        r = c.next(Duration::from_secs(30)) => panic!("nothing was sent, got {r:?}"),
        removed = settles(&q, 0) => assert!(
            removed,
            "m0..m2 not acknowledged while next() waited: {:?}",
            q.info().await.unwrap()
        ),
    }
    // Still usable: what comes next is delivered.
    q.send(Message::new("m3")).await.unwrap();
    expect_next(&mut c, 3..4).await;
    c.close().await.unwrap();
    assert!(settles(&q, 0).await, "{:?}", q.info().await.unwrap());
    broker.stop().await.unwrap();
}

/// With a delay longer than the test, a `next` that times out still acknowledges what was
/// consumed before it returns `None`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_timing_out_acknowledges_what_was_consumed() {
    let (broker, q) = queue_with(2, 10).await;
    let mut c = consumer(&q, Duration::from_secs(3600)).await;
    expect_next(&mut c, 0..2).await;
    assert!(c.next(Duration::from_millis(100)).await.unwrap().is_none());
    assert!(
        settles(&q, 0).await,
        "m0 and m1 not acknowledged when next() timed out: {:?}",
        q.info().await.unwrap()
    );
    drop(c);
    broker.stop().await.unwrap();
}

/// Held acknowledgements are only promises until they are sent: a consumer dropped with some
/// held gives back every unacknowledged message, in order (a redelivery, never a loss).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_consumer_with_held_acknowledgements_gives_them_back_in_order() {
    let (broker, q) = queue_with(10, 10).await;
    let mut c = consumer(&q, Duration::from_secs(3600)).await;
    expect_next(&mut c, 0..2).await;
    c.ack().await.unwrap(); // m0, m1 removed for good
    expect_next(&mut c, 2..6).await; // m2..m4 consumed, held; m5 handed out
    drop(c);
    assert!(settles(&q, 8).await, "{:?}", q.info().await.unwrap());
    let mut d = consumer(&q, Duration::ZERO).await;
    expect_next(&mut d, 2..10).await;
    assert!(d.next(Duration::from_millis(200)).await.unwrap().is_none());
    d.close().await.unwrap();
    assert!(settles(&q, 0).await, "{:?}", q.info().await.unwrap());
    broker.stop().await.unwrap();
}

/// 200 messages of 1000 B taken at once reach the receiver in several stream items of about
/// 64 KiB (not one of 200 KB), with tags 1, 2, 3, ... and bodies in queue order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_delivery_arrives_in_items_of_about_64_kib_in_order() {
    const N: usize = 200;
    let (broker, _q) = queue_with(N, 1000).await;
    let (tx, mut items) = mq_tests::open_receive(broker.url(), Q, N as u32).await;
    let mut sizes = Vec::new();
    let mut got = Vec::new();
    while got.len() < N {
        let item = tokio::time::timeout(Duration::from_secs(10), items.message())
            .await
            .expect("the rest of the delivery")
            .unwrap()
            .expect("the stream stays open");
        sizes.push(item.messages.len());
        for d in item.messages {
            got.push((d.tag, number(&d.message.unwrap().body)));
        }
    }
    assert_eq!(
        got,
        (0..N).map(|i| (i as u64 + 1, i)).collect::<Vec<_>>(),
        "tags and bodies in order"
    );
    assert!(
        sizes.len() >= 3 && sizes.iter().all(|&n| n <= 66),
        "items of at most ~64 KiB of 1000 B bodies, got sizes {sizes:?}"
    );
    tx.send(v1::ReceiveRequest {
        queue: String::new(),
        credit: 0,
        ack_through: N as u64,
    })
    .await
    .unwrap();
    drop(tx);
    while let Ok(Some(_)) = items.message().await {}
    let q = broker.client().await.queue(Q).unwrap();
    assert!(settles(&q, 0).await, "{:?}", q.info().await.unwrap());
    broker.stop().await.unwrap();
}
