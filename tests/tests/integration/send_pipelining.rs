//! The wire behaviour of a `Sender`: many messages in flight on one stream, acknowledged and
//! stored in order; a refusal of one message fails only that message's receipt.

use std::time::Duration;

use mq_client::{Client, ConsumerOptions, Error, Message, QueueOptions, SenderOptions};
use mq_tests::InProcessBroker;

const Q: &str = r".\private$\pipe";

/// Peeks at most `max` messages of `Q` and returns their bodies as text, in queue order.
async fn peek_bodies(client: &Client, max: u32) -> Vec<String> {
    client
        .queue(Q)
        .unwrap()
        .peek_many(max, Duration::from_secs(5))
        .await
        .unwrap()
        .into_iter()
        .map(|m| String::from_utf8(m.body.to_vec()).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_pipelined_sends_all_acknowledged_and_in_order() {
    const N: u64 = 20_000;
    let (broker, client) = InProcessBroker::start_with_queue(Q).await;
    let sender = client.sender(Q, SenderOptions::default()).await.unwrap();
    let mut last = None;
    for i in 0..N {
        if i == N - 1 {
            last = Some(
                sender
                    .send_with_receipt(Message::new(format!("{i}")))
                    .await
                    .unwrap(),
            );
        } else {
            sender.send(Message::new(format!("{i}"))).await.unwrap();
        }
    }
    let last_id = last.unwrap().await.unwrap();
    let summary = sender.close().await.unwrap();
    assert_eq!(summary.acknowledged, N);
    assert_eq!(summary.submitted, N);
    assert_eq!(client.queue_info(Q).await.unwrap().messages, N);

    let mut c = client
        .queue(Q)
        .unwrap()
        .consumer(ConsumerOptions::default())
        .await
        .unwrap();
    let mut prev_id = None;
    for i in 0..N {
        let m = c
            .next(Duration::from_secs(10))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("message {i} missing"));
        assert_eq!(m.body, i.to_string().as_bytes(), "order broken at {i}");
        if let Some(p) = prev_id {
            assert!(m.id > p, "ids are time-ordered within one stream");
        }
        prev_id = Some(m.id);
        if i == N - 1 {
            assert_eq!(m.id, last_id);
        }
    }
    assert!(c.next(Duration::from_millis(50)).await.unwrap().is_none());
    c.close().await.unwrap();
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_windows_and_batches_still_deliver_everything_in_order() {
    let (broker, client) = InProcessBroker::start_with_queue(Q).await;
    let options = SenderOptions {
        transactional: false,
        window_messages: 3,
        window_bytes: 0,
        max_batch_messages: 2,
        max_batch_bytes: 10,
    };
    let sender = client.sender(Q, options).await.unwrap();
    for i in 0..500 {
        sender.send(Message::new(format!("{i}"))).await.unwrap();
    }
    assert_eq!(sender.close().await.unwrap().acknowledged, 500);
    let got = peek_bodies(&client, 1000).await;
    assert_eq!(got, (0..500).map(|i| i.to_string()).collect::<Vec<_>>());
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_refused_message_fails_only_its_receipt() {
    let (broker, client) = InProcessBroker::start_with_queue(Q).await;
    let mut sender = client.sender(Q, SenderOptions::default()).await.unwrap();
    let bad = [17usize, 500, 999];
    let mut receipts = Vec::new();
    for i in 0..1000usize {
        let m = if bad.contains(&i) {
            Message::new(format!("{i}")).label("x".repeat(300))
        } else {
            Message::new(format!("{i}")).label("fine")
        };
        receipts.push(sender.send_with_receipt(m).await.unwrap());
    }
    let flushed = sender.flush().await;
    let err = flushed.expect_err("flush reports the first refusal");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(err.to_string().contains("300"), "{err}");
    for (i, r) in receipts.into_iter().enumerate() {
        match (bad.contains(&i), r.await) {
            (true, Err(Error::InvalidArgument(m))) => assert!(m.contains("label"), "{m}"),
            (false, Ok(id)) => assert_eq!(id.get_version_num(), 7),
            (b, other) => panic!("message {i} (bad: {b}): {other:?}"),
        }
    }
    // The stream survives a refusal: more sends on it are stored.
    let tail = sender
        .send_with_receipt(Message::new("after"))
        .await
        .unwrap();
    tail.await.unwrap();
    let _ = sender.close().await;

    let got = peek_bodies(&client, 2000).await;
    let mut want: Vec<String> = (0..1000)
        .filter(|i| !bad.contains(i))
        .map(|i| i.to_string())
        .collect();
    want.push("after".into());
    assert_eq!(got, want);
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn a_sender_to_a_missing_queue_fails_each_message_not_the_connection() {
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    let sender = client
        .sender(r".\private$\nowhere", SenderOptions::default())
        .await
        .unwrap();
    let r = sender.send_with_receipt(Message::new("x")).await.unwrap();
    let err = r.await.unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
    assert!(err.to_string().contains("nowhere"), "{err}");
    let _ = sender.close().await;
    // The same client still works.
    client
        .create_queue(r".\private$\nowhere", QueueOptions::default())
        .await
        .unwrap();
    client
        .queue(r".\private$\nowhere")
        .unwrap()
        .send(Message::new("y"))
        .await
        .unwrap();
    broker.stop().await.unwrap();
}
