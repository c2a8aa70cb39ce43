//! Quotas: the broker-wide express memory quota and a queue's own quota refuse a send that
//! does not fit with `Error::QuotaExceeded`, store nothing of it, keep the broker serving, and
//! accept sends again once messages are received or purged.

use std::time::Duration;

use mq_client::{ConsumerOptions, Error, Message, QueueOptions};
use mq_tests::InProcessBroker;

const T: Duration = Duration::from_secs(5);
/// Bytes a 1000-byte express body without a label is charged (body + label + the per-message
/// overhead of an express message, what it costs in memory).
const CHARGE: u64 = 1000 + OVERHEAD;
/// mq_broker's EXPRESS_OVERHEAD_BYTES.
const OVERHEAD: u64 = 384;

/// Sends 1000-byte messages until one is refused; returns how many were accepted and the error.
async fn fill(q: &mq_client::Queue) -> (u64, Error) {
    for n in 0..1000 {
        if let Err(e) = q.send(Message::new(vec![b'q'; 1000])).await {
            return (n, e);
        }
    }
    panic!("1000 sends were all accepted; the quota is not enforced");
}

#[tokio::test]
async fn express_quota_refuses_then_recovers_after_receive_and_purge() {
    let quota = 10_500;
    let broker = InProcessBroker::start_with(|c| c.express_quota_bytes = quota).await;
    let client = broker.client().await;
    client
        .create_queue(r".\private$\a", QueueOptions::default())
        .await
        .unwrap();
    client
        .create_queue(r".\private$\b", QueueOptions::default())
        .await
        .unwrap();
    let a = client.queue(r".\private$\a").unwrap();
    let b = client.queue(r".\private$\b").unwrap();

    let (accepted, err) = fill(&a).await;
    assert_eq!(accepted, quota / CHARGE, "as many as fit");
    assert!(matches!(err, Error::QuotaExceeded(_)), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("express memory quota") && msg.contains(&quota.to_string()),
        "{msg}"
    );
    // The quota is broker-wide: another queue is full too.
    let err = b.send(Message::new(vec![b'q'; 1000])).await.unwrap_err();
    assert!(matches!(err, Error::QuotaExceeded(_)), "{err:?}");
    // Small messages that still fit are accepted.
    let room = quota - accepted * CHARGE;
    assert!(room > OVERHEAD);
    b.send(Message::new(vec![b's'; (room - OVERHEAD) as usize]))
        .await
        .unwrap();
    assert!(matches!(
        b.send(Message::new("")).await.unwrap_err(),
        Error::QuotaExceeded(_)
    ));

    // The broker keeps serving; nothing refused was stored.
    assert!(!broker.has_stopped());
    assert_eq!(a.info().await.unwrap().messages, accepted);
    assert_eq!(b.info().await.unwrap().messages, 1);

    // Receiving frees exactly what the message held.
    assert!(a.receive(T).await.unwrap().is_some());
    a.send(Message::new(vec![b'q'; 1000])).await.unwrap();
    assert!(matches!(
        a.send(Message::new(vec![b'q'; 1000])).await.unwrap_err(),
        Error::QuotaExceeded(_)
    ));

    // A consumer's acknowledgement frees too.
    let mut c = a.consumer(ConsumerOptions::default()).await.unwrap();
    assert!(c.next(T).await.unwrap().is_some());
    c.close().await.unwrap();
    a.send(Message::new(vec![b'q'; 1000])).await.unwrap();

    // Purge frees everything.
    client.purge(r".\private$\a").await.unwrap();
    client.purge(r".\private$\b").await.unwrap();
    let (again, _) = fill(&a).await;
    assert_eq!(again, quota / CHARGE, "the whole quota is available again");
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn a_pipelined_send_over_the_quota_fails_only_what_does_not_fit() {
    let quota = 10 * CHARGE;
    let broker = InProcessBroker::start_with(|c| c.express_quota_bytes = quota).await;
    let client = broker.client().await;
    client
        .create_queue(r".\private$\a", QueueOptions::default())
        .await
        .unwrap();
    let sender = client
        .sender(r".\private$\a", Default::default())
        .await
        .unwrap();
    let mut receipts = Vec::new();
    for _ in 0..15 {
        receipts.push(
            sender
                .send_with_receipt(Message::new(vec![b'q'; 1000]))
                .await
                .unwrap(),
        );
    }
    let mut ok = 0;
    for r in receipts {
        match r.await {
            Ok(_) => ok += 1,
            Err(Error::QuotaExceeded(_)) => {}
            Err(e) => panic!("unexpected error {e:?}"),
        }
    }
    assert_eq!(ok, 10);
    let err = sender.close().await.unwrap_err();
    assert!(
        matches!(err, Error::QuotaExceeded(_)),
        "close reports the first refusal: {err:?}"
    );
    assert_eq!(
        client.queue_info(r".\private$\a").await.unwrap().messages,
        10
    );
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn a_queue_quota_refuses_and_recovers() {
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    client
        .create_queue(
            r".\private$\small",
            QueueOptions {
                quota_bytes: Some(3 * CHARGE),
                ..QueueOptions::default()
            },
        )
        .await
        .unwrap();
    client
        .create_queue(r".\private$\other", QueueOptions::default())
        .await
        .unwrap();
    let small = client.queue(r".\private$\small").unwrap();
    let (accepted, err) = fill(&small).await;
    assert_eq!(accepted, 3);
    assert!(matches!(err, Error::QuotaExceeded(_)), "{err:?}");
    assert!(err.to_string().contains(r".\private$\small"), "{err}");
    // Only that queue is full.
    client
        .queue(r".\private$\other")
        .unwrap()
        .send(Message::new(vec![b'q'; 1000]))
        .await
        .unwrap();
    assert!(small.receive(T).await.unwrap().is_some());
    small.send(Message::new(vec![b'q'; 1000])).await.unwrap();
    assert_eq!(small.info().await.unwrap().quota_bytes, Some(3 * CHARGE));
    broker.stop().await.unwrap();
}
