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

/// Every charge comes back, whatever way a message leaves: with the charge depending on the
/// delivery (express messages are charged 384 B of overhead, recoverable ones 128) and a dead
/// letter also its info, a copy that changed between charge and release would drift the quotas.
/// Express: messages dead-lettered on expiry, two moved back out of the dead-letter queue
/// (their info's charge goes with it) and received, three purged from it, moved to a subqueue and
/// received there, purged, received; then the whole quota fills as at first. Recoverable: the
/// same, and a transaction staged and aborted, one committed and received; then the broker's
/// storage charge (`stored_bytes`) is 0 again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_charge_comes_back_whichever_way_a_message_leaves() {
    const A: &str = r".\private$\a";
    const TQ: &str = r".\private$\tq";
    const DLQ: &str = r"DIRECT=OS:.\SYSTEM$;DEADLETTER";
    let quota = 20 * CHARGE;
    let broker = InProcessBroker::start_with(|c| c.express_quota_bytes = quota).await;
    let client = broker.client().await;
    client
        .create_queue(A, QueueOptions::default())
        .await
        .unwrap();
    let tq = QueueOptions {
        transactional: true,
        ..QueueOptions::default()
    };
    client.create_queue(TQ, tq).await.unwrap();
    let a = client.queue(A).unwrap();
    let (first, _) = fill(&a).await;
    assert_eq!(first, 20);
    client.purge(A).await.unwrap();
    let info = mq_proto::v1::message_queue_service_client::MessageQueueServiceClient::connect(
        broker.url().to_string(),
    )
    .await
    .unwrap();
    for recoverable in [false, true] {
        let msg = |s: &str| Message::new(s.to_string()).recoverable(recoverable);
        for i in 0..5 {
            a.send(msg(&format!("expires {i}")).time_to_be_received(Duration::from_millis(200)))
                .await
                .unwrap();
        }
        let mut moved = Vec::new();
        for i in 0..3 {
            moved.push(a.send(msg(&format!("moved {i}"))).await.unwrap());
        }
        for i in 0..4 {
            a.send(msg(&format!("kept {i}"))).await.unwrap();
        }
        for id in moved {
            client.move_message(A, id, "held").await.unwrap();
        }
        // The five expire into the dead-letter queue (looked at by peeking, which expires).
        let dead = mq_tests::eventually(Duration::from_secs(10), || async {
            let _ = a.peek(Duration::ZERO).await;
            client.queue_info(DLQ).await.unwrap().messages == 5
        })
        .await;
        assert!(dead, "five dead letters");
        // Two go back where they were going (MoveMessage out of the dead-letter queue, which
        // drops their dead-letter info and its charge), three are purged.
        let dl = client
            .queue(DLQ)
            .unwrap()
            .peek_many(10, Duration::ZERO)
            .await
            .unwrap();
        for m in &dl[..2] {
            client.move_message(DLQ, m.id, "").await.unwrap();
        }
        assert_eq!(client.purge(DLQ).await.unwrap(), 3);
        let held = client.queue(&format!("{A};held")).unwrap();
        for _ in 0..3 {
            assert!(held.receive(T).await.unwrap().is_some());
        }
        assert!(a.receive(T).await.unwrap().is_some());
        // Three kept, two replayed.
        assert_eq!(client.purge(A).await.unwrap(), 5);
        if recoverable {
            let mut tx = client.begin().await.unwrap();
            tx.send(TQ, Message::new("aborted")).unwrap();
            tx.abort().await.unwrap();
            let mut tx = client.begin().await.unwrap();
            tx.send(TQ, Message::new("committed")).unwrap();
            tx.commit().await.unwrap();
            let mut tx = client.begin().await.unwrap();
            assert!(tx.receive(TQ, T).await.unwrap().is_some());
            tx.commit().await.unwrap();
            let stored = || {
                let mut info = info.clone();
                async move {
                    info.get_broker_info(())
                        .await
                        .unwrap()
                        .into_inner()
                        .stored_bytes
                }
            };
            let freed =
                mq_tests::eventually(Duration::from_secs(10), || async { stored().await == 0 })
                    .await;
            assert!(
                freed,
                "stored_bytes is {} with nothing stored",
                stored().await
            );
        }
    }
    let (again, _) = fill(&a).await;
    assert_eq!(again, first, "the whole express quota is free again");
    broker.stop().await.unwrap();
}
