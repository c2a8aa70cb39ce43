//! One message at a time: what a sender sets arrives intact; receive removes and peek does not;
//! both wait up to their timeout; priority orders delivery; the broker enforces the label and
//! body limits and assigns time-ordered UUID v7 ids.

use std::time::{Duration, Instant, SystemTime};

use mq_client::{Client, Delivery, Error, Message, QueueOptions};
use mq_tests::{send_with_receipts, InProcessBroker};

const T: Duration = Duration::from_secs(5);
const Q: &str = r".\private$\props";

async fn with_queue(broker: &InProcessBroker) -> (Client, mq_client::Queue) {
    let client = broker.client().await;
    client
        .create_queue(Q, QueueOptions::default())
        .await
        .unwrap();
    let q = client.queue(Q).unwrap();
    (client, q)
}

#[tokio::test]
async fn properties_travel_end_to_end() {
    let broker = InProcessBroker::start().await;
    let (_client, q) = with_queue(&broker).await;
    let before = SystemTime::now() - Duration::from_secs(1);
    let id = q
        .send(
            Message::new("hello")
                .label("greeting")
                .priority(6)
                .correlation_id("req-42")
                .app_specific(-7)
                .response_queue(r".\private$\replies"),
        )
        .await
        .unwrap();
    let after = SystemTime::now() + Duration::from_secs(1);

    let peeked = q.peek(T).await.unwrap().expect("peek sees the message");
    let got = q
        .receive(T)
        .await
        .unwrap()
        .expect("receive gets the message");
    assert_eq!(peeked, got, "peek shows exactly what receive then gets");
    assert_eq!(got.id, id);
    assert_eq!(got.id.get_version_num(), 7, "ids are UUID v7: {}", got.id);
    assert_eq!(got.body.as_ref(), b"hello");
    assert_eq!(got.label, "greeting");
    assert_eq!(got.priority, 6);
    assert_eq!(got.correlation_id, "req-42");
    assert_eq!(got.app_specific, -7);
    assert_eq!(got.response_queue, r".\private$\replies");
    assert_eq!(got.delivery, Delivery::Express);
    assert_eq!(got.destination, format!("DIRECT=OS:{Q}"));
    assert!(
        before <= got.sent_time && got.sent_time <= got.arrived_time && got.arrived_time <= after,
        "sent {:?}, arrived {:?}, expected both within [{before:?}, {after:?}] and sent <= arrived",
        got.sent_time,
        got.arrived_time
    );
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn defaults_priority_three_and_empty_properties() {
    let broker = InProcessBroker::start().await;
    let (_client, q) = with_queue(&broker).await;
    q.send(Message::new(Vec::<u8>::new())).await.unwrap();
    let got = q.receive(T).await.unwrap().expect("a message");
    assert_eq!(got.priority, 3);
    assert!(got.body.is_empty());
    assert_eq!(
        (
            got.label.as_str(),
            got.correlation_id.as_str(),
            got.app_specific
        ),
        ("", "", 0)
    );
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn receive_removes_peek_does_not() {
    let broker = InProcessBroker::start().await;
    let (_client, q) = with_queue(&broker).await;
    let a = q.send(Message::new("a")).await.unwrap();
    let b = q.send(Message::new("b")).await.unwrap();
    for _ in 0..3 {
        assert_eq!(q.peek(T).await.unwrap().unwrap().id, a);
    }
    let many = q.peek_many(10, T).await.unwrap();
    assert_eq!(many.iter().map(|m| m.id).collect::<Vec<_>>(), [a, b]);
    assert_eq!(q.info().await.unwrap().messages, 2);
    assert_eq!(q.receive(T).await.unwrap().unwrap().id, a);
    assert_eq!(q.peek(T).await.unwrap().unwrap().id, b);
    assert_eq!(q.receive(T).await.unwrap().unwrap().id, b);
    assert_eq!(q.info().await.unwrap().messages, 0);
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn receive_and_peek_on_an_empty_queue_wait_then_return_none() {
    let broker = InProcessBroker::start().await;
    let (_client, q) = with_queue(&broker).await;
    let wait = Duration::from_millis(300);
    let started = Instant::now();
    assert_eq!(q.receive(wait).await.unwrap(), None);
    assert!(
        started.elapsed() >= wait,
        "returned after {:?}",
        started.elapsed()
    );
    let started = Instant::now();
    assert_eq!(q.peek(wait).await.unwrap(), None);
    assert!(
        started.elapsed() >= wait,
        "returned after {:?}",
        started.elapsed()
    );
    assert!(q.peek_many(5, wait).await.unwrap().is_empty());
    assert_eq!(q.receive(Duration::ZERO).await.unwrap(), None);
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_receive_gets_a_message_sent_later() {
    let broker = InProcessBroker::start().await;
    let (_client, q) = with_queue(&broker).await;
    let receiver = {
        let q = q.clone();
        tokio::spawn(async move { q.receive(Duration::from_secs(20)).await })
    };
    // The receive is waiting once the broker has had time to see it; either way it must end
    // with the message, not with None.
    tokio::task::yield_now().await;
    let id = q.send(Message::new("late")).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(20), receiver)
        .await
        .expect("the waiting receive returns")
        .unwrap()
        .unwrap()
        .expect("the message sent while it waited");
    assert_eq!(got.id, id);
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn higher_priority_first_fifo_within_a_priority() {
    let broker = InProcessBroker::start().await;
    let (_client, q) = with_queue(&broker).await;
    let sender = q.sender(Default::default()).await.unwrap();
    // (priority, body) in send order: every priority, several per level, interleaved.
    let mut sent = Vec::new();
    for round in 0..3 {
        for p in [3u8, 0, 7, 5, 1, 6, 2, 4] {
            let body = format!("p{p}-r{round}");
            sender
                .send(Message::new(body.clone()).priority(p))
                .await
                .unwrap();
            sent.push((p, round, body));
        }
    }
    sender.close().await.unwrap();
    let mut expected = sent.clone();
    expected.sort_by_key(|(p, round, _)| (std::cmp::Reverse(*p), *round));

    let peeked: Vec<String> = q
        .peek_many(100, T)
        .await
        .unwrap()
        .into_iter()
        .map(|m| String::from_utf8(m.body.to_vec()).unwrap())
        .collect();
    let want: Vec<String> = expected.iter().map(|(_, _, b)| b.clone()).collect();
    assert_eq!(peeked, want, "peek order");
    let mut got = Vec::new();
    while let Some(m) = q.receive(Duration::from_millis(100)).await.unwrap() {
        assert!(m.body.starts_with(format!("p{}-", m.priority).as_bytes()));
        got.push(String::from_utf8(m.body.to_vec()).unwrap());
    }
    assert_eq!(got, want, "receive order");
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn labels_up_to_250_characters() {
    let broker = InProcessBroker::start().await;
    let (_client, q) = with_queue(&broker).await;
    // Characters, not bytes: 250 three-byte characters are fine.
    let long = "€".repeat(250);
    q.send(Message::new("ok").label(long.clone()))
        .await
        .unwrap();
    assert_eq!(q.receive(T).await.unwrap().unwrap().label, long);

    let err = q
        .send(Message::new("too long").label("l".repeat(251)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("251") && msg.contains("250"), "{msg}");
    assert_eq!(q.info().await.unwrap().messages, 0, "nothing stored");
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn priority_above_seven_is_refused() {
    let broker = InProcessBroker::start().await;
    let (_client, q) = with_queue(&broker).await;
    let err = q.send(Message::new("x").priority(8)).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(err.to_string().contains("priority 8"), "{err}");
    q.send(Message::new("x").priority(0)).await.unwrap();
    q.send(Message::new("x").priority(7)).await.unwrap();
    assert_eq!(q.info().await.unwrap().messages, 2);
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn correlation_id_up_to_255_characters() {
    let broker = InProcessBroker::start().await;
    let (_client, q) = with_queue(&broker).await;
    let c = "c".repeat(255);
    q.send(Message::new("x").correlation_id(c.clone()))
        .await
        .unwrap();
    assert_eq!(q.receive(T).await.unwrap().unwrap().correlation_id, c);
    let err = q
        .send(Message::new("x").correlation_id("c".repeat(256)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(err.to_string().contains("256"), "{err}");
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_up_to_4_mib_by_default() {
    let broker = InProcessBroker::start().await;
    let (_client, q) = with_queue(&broker).await;
    let max = mq_broker::DEFAULT_MAX_BODY_BYTES;
    assert_eq!(max, 4 * 1024 * 1024);
    let body: Vec<u8> = (0..max).map(|i| (i % 251) as u8).collect();
    q.send(Message::new(body.clone())).await.unwrap();
    let got = q.receive(T).await.unwrap().expect("the 4 MiB message");
    assert_eq!(got.body.len(), max);
    assert!(got.body == body, "the 4 MiB body arrives intact");

    let err = q.send(Message::new(vec![0u8; max + 1])).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&(max + 1).to_string()) && msg.contains(&max.to_string()),
        "{msg}"
    );
    assert_eq!(q.info().await.unwrap().messages, 0);
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn a_smaller_configured_body_limit_is_enforced() {
    let broker = InProcessBroker::start_with(|c| c.max_body_bytes = 1000).await;
    let (_client, q) = with_queue(&broker).await;
    q.send(Message::new(vec![1u8; 1000])).await.unwrap();
    let err = q.send(Message::new(vec![1u8; 1001])).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(
        err.to_string().contains("1001") && err.to_string().contains("1000"),
        "{err}"
    );
    assert_eq!(q.info().await.unwrap().messages, 1);
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn ids_are_unique_and_time_ordered_uuid_v7() {
    let broker = InProcessBroker::start().await;
    let (_client, q) = with_queue(&broker).await;
    let sender = q.sender(Default::default()).await.unwrap();
    let ids = send_with_receipts(&sender, (0..200).map(|i| Message::new(format!("{i}")))).await;
    sender.close().await.unwrap();
    assert!(ids.iter().all(|id| id.get_version_num() == 7));
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "ids are unique");
    // Time-ordered at millisecond granularity (the timestamp prefix never goes backwards).
    let ts: Vec<u64> = ids
        .iter()
        .map(|id| {
            let (s, n) = id.get_timestamp().expect("v7 has a timestamp").to_unix();
            s * 1000 + u64::from(n) / 1_000_000
        })
        .collect();
    assert!(
        ts.windows(2).all(|w| w[0] <= w[1]),
        "timestamps go backwards"
    );
    // And what receive returns carries the same ids in the same order.
    for id in &ids {
        assert_eq!(q.receive(T).await.unwrap().unwrap().id, *id);
    }
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn the_body_type_travels_with_the_message() {
    use mq_client::formatter::{BinaryFormatter, BodyType, JsonFormatter};
    let broker = InProcessBroker::start().await;
    let (_client, q) = with_queue(&broker).await;
    let order = serde_json::json!({"id": 7, "lines": ["a", "b"]});
    q.send(Message::encode(&order, &JsonFormatter).unwrap())
        .await
        .unwrap();
    let got = q.receive(T).await.unwrap().expect("a message");
    assert_eq!(got.body_type, BodyType::Json as u32);
    let back: serde_json::Value = got.decode(&JsonFormatter).unwrap();
    assert_eq!(back, order);
    let wrong: Result<serde_json::Value, _> = got.decode(&BinaryFormatter);
    assert!(wrong.is_err(), "a JSON body is not decoded as binary");
    broker.stop().await.unwrap();
}
