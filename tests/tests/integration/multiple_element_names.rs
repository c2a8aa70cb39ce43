//! Multiple-element format names (`FORMATNAME:a,b`): one send puts one copy in each queue, all
//! with the same id; they can be sent to and nothing else.

use std::time::Duration;

use mq_client::{ConsumerOptions, Error, Message, QueueOptions};
use mq_tests::InProcessBroker;

const T: Duration = Duration::from_secs(5);
const MULTI: &str = r"FORMATNAME:DIRECT=OS:.\private$\q1,DIRECT=OS:.\private$\q2";

async fn two_queues(broker: &InProcessBroker) -> mq_client::Client {
    let client = broker.client().await;
    for q in [r".\private$\q1", r".\private$\q2"] {
        client
            .create_queue(q, QueueOptions::default())
            .await
            .unwrap();
    }
    client
}

#[tokio::test]
async fn one_send_one_copy_per_queue_same_id() {
    let broker = InProcessBroker::start().await;
    let client = two_queues(&broker).await;
    let multi = client.queue(MULTI).unwrap();
    let id = multi
        .send(Message::new("fan-out").label("both").priority(5))
        .await
        .unwrap();
    for name in [r".\private$\q1", r".\private$\q2"] {
        let q = client.queue(name).unwrap();
        let got = q.receive(T).await.unwrap().expect("a copy");
        assert_eq!(got.id, id, "{name}");
        assert_eq!(got.body.as_ref(), b"fan-out");
        assert_eq!((got.label.as_str(), got.priority), ("both", 5));
        assert_eq!(got.destination, format!("DIRECT=OS:{name}"));
        assert_eq!(
            q.receive(Duration::from_millis(50)).await.unwrap(),
            None,
            "one copy only"
        );
    }

    // Pipelined, through a Sender, with mixed element syntaxes.
    let port = broker.addr().port();
    let mixed = format!(r"./private$/Q1,DIRECT=TCP:127.0.0.1:{port}\private$\q2");
    let sender = client.sender(&mixed, Default::default()).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..100 {
        ids.push(
            sender
                .send_with_receipt(Message::new(format!("{i}")))
                .await
                .unwrap(),
        );
    }
    let mut want = Vec::new();
    for r in ids {
        want.push(r.await.unwrap());
    }
    sender.close().await.unwrap();
    for name in [r".\private$\q1", r".\private$\q2"] {
        let q = client.queue(name).unwrap();
        assert_eq!(q.info().await.unwrap().messages, 100);
        let got: Vec<_> = q
            .peek_many(1000, T)
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.id)
            .collect();
        assert_eq!(got, want, "{name}: same ids, same order");
    }
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn the_same_queue_twice_gets_one_copy() {
    let broker = InProcessBroker::start().await;
    let client = two_queues(&broker).await;
    let multi = client
        .queue(r"FORMATNAME:.\private$\q1,DIRECT=OS:.\PRIVATE$\Q1")
        .unwrap();
    multi.send(Message::new("once")).await.unwrap();
    assert_eq!(
        client.queue_info(r".\private$\q1").await.unwrap().messages,
        1
    );
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn receiving_peeking_or_administering_a_multiple_element_name_is_an_error() {
    let broker = InProcessBroker::start().await;
    let client = two_queues(&broker).await;
    client
        .queue(r".\private$\q1")
        .unwrap()
        .send(Message::new("stays"))
        .await
        .unwrap();
    let multi = client.queue(MULTI).unwrap();
    let check = |what: &str, r: Result<(), Error>| {
        let e = r.expect_err(what);
        assert!(matches!(e, Error::InvalidArgument(_)), "{what}: {e:?}");
        assert!(e.to_string().contains("multiple-element"), "{what}: {e}");
    };
    check("receive", multi.receive(T).await.map(drop));
    check("peek", multi.peek(T).await.map(drop));
    check("peek_many", multi.peek_many(5, T).await.map(drop));
    check(
        "consumer",
        multi.consumer(ConsumerOptions::default()).await.map(drop),
    );
    check("purge", multi.purge().await.map(drop));
    check("info", multi.info().await.map(drop));
    // The broker refuses too, when a client does not check first.
    check("client.purge", client.purge(MULTI).await.map(drop));
    check("queue_info", client.queue_info(MULTI).await.map(drop));
    check("delete_queue", client.delete_queue(MULTI).await.map(drop));
    check(
        "create_queue",
        client
            .create_queue(MULTI, QueueOptions::default())
            .await
            .map(drop),
    );
    // Nothing was touched.
    assert_eq!(
        client.queue_info(r".\private$\q1").await.unwrap().messages,
        1
    );
    assert_eq!(client.list_queues().await.unwrap().len(), 2);
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn a_missing_element_queue_fails_the_send_and_stores_no_copy() {
    let broker = InProcessBroker::start().await;
    let client = two_queues(&broker).await;
    let multi = client
        .queue(r"FORMATNAME:.\private$\q1,.\private$\missing")
        .unwrap();
    let err = multi.send(Message::new("x")).await.unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
    assert!(err.to_string().contains("missing"), "{err}");
    assert_eq!(
        client.queue_info(r".\private$\q1").await.unwrap().messages,
        0,
        "no partial delivery"
    );
    broker.stop().await.unwrap();
}

/// A copy refused by one queue's quota means no copy anywhere: the send fails as a whole, the
/// other queue holds nothing, and both the queue and broker quotas are whole again.
#[tokio::test]
async fn a_copy_refused_by_one_quota_leaves_no_copy_in_the_others() {
    for recoverable in [false, true] {
        let broker = InProcessBroker::start().await;
        let client = broker.client().await;
        client
            .create_queue(r".\private$\q1", QueueOptions::default())
            .await
            .unwrap();
        client
            .create_queue(
                r".\private$\q2",
                QueueOptions {
                    quota_bytes: Some(1),
                    ..QueueOptions::default()
                },
            )
            .await
            .unwrap();
        let multi = client.queue(MULTI).unwrap();
        let err = multi
            .send(Message::new("fan-out").recoverable(recoverable))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::QuotaExceeded(_)), "{err:?}");
        for name in [r".\private$\q1", r".\private$\q2"] {
            let info = client.queue_info(name).await.unwrap();
            assert_eq!(
                (info.messages, info.bytes),
                (0, 0),
                "{name} (recoverable {recoverable})"
            );
        }
        // q1 alone still takes messages: nothing of the refused send is held against it.
        client
            .queue(r".\private$\q1")
            .unwrap()
            .send(Message::new("alone").recoverable(recoverable))
            .await
            .unwrap();
        let got = client
            .queue(r".\private$\q1")
            .unwrap()
            .receive(T)
            .await
            .unwrap()
            .expect("the later message");
        assert_eq!(got.body.as_ref(), b"alone");
        broker.stop().await.unwrap();
    }
}
