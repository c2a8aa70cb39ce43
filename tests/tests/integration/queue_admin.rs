//! Queue administration through the client: create, delete, list, info, purge; path names and
//! format names (either separator, `DIRECT=OS:` or `DIRECT=TCP:` with the broker's own address)
//! naming the same queue; queue names compared ignoring case.

use std::time::Duration;

use mq_client::{Error, Message, QueueOptions};
use mq_tests::{eventually, InProcessBroker};

const T: Duration = Duration::from_secs(5);

#[tokio::test]
async fn create_info_list_purge_delete() {
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;

    let info = client
        .create_queue(
            r".\private$\orders",
            QueueOptions {
                label: "incoming orders".into(),
                ..QueueOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(info.name, r".\private$\orders");
    assert_eq!(info.format_name, r"DIRECT=OS:.\private$\orders");
    assert_eq!((info.messages, info.bytes, info.in_flight), (0, 0, 0));
    assert!(!info.transactional);
    assert_eq!(info.label, "incoming orders");
    client
        .create_queue(r".\public_one", QueueOptions::default())
        .await
        .unwrap();

    let q = client.queue(r".\private$\orders").unwrap();
    for body in ["a", "bb", "cccc"] {
        q.send(Message::new(body)).await.unwrap();
    }
    let info = client.queue_info(r".\private$\orders").await.unwrap();
    assert_eq!((info.messages, info.bytes), (3, 7), "{info:?}");

    let names: Vec<String> = client
        .list_queues()
        .await
        .unwrap()
        .into_iter()
        .map(|q| q.name)
        .collect();
    assert_eq!(names, [r".\private$\orders", r".\public_one"]);
    let listed = client.list_queues().await.unwrap();
    assert_eq!((listed[0].messages, listed[0].bytes), (3, 7));

    assert_eq!(client.purge(r".\private$\orders").await.unwrap(), 3);
    let info = q.info().await.unwrap();
    assert_eq!((info.messages, info.bytes), (0, 0));
    assert_eq!(q.receive(Duration::from_millis(50)).await.unwrap(), None);
    assert_eq!(client.purge(r".\private$\orders").await.unwrap(), 0);

    client.delete_queue(r".\private$\orders").await.unwrap();
    let err = client.queue_info(r".\private$\orders").await.unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
    let err = q.send(Message::new("late")).await.unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
    let names: Vec<String> = client
        .list_queues()
        .await
        .unwrap()
        .into_iter()
        .map(|q| q.name)
        .collect();
    assert_eq!(names, [r".\public_one"]);

    // A deleted queue's name is free again, and the new queue starts empty.
    client
        .create_queue(r".\private$\orders", QueueOptions::default())
        .await
        .unwrap();
    assert_eq!(q.info().await.unwrap().messages, 0);
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn delete_discards_messages_and_frees_the_express_quota() {
    // Room for a few 1000-byte messages only: if deleting did not give their bytes back, the
    // sends after it would be refused.
    let broker = InProcessBroker::start_with(|c| c.express_quota_bytes = 5_000).await;
    let client = broker.client().await;
    for round in 0..3 {
        client
            .create_queue(r".\private$\scratch", QueueOptions::default())
            .await
            .unwrap();
        let q = client.queue(r".\private$\scratch").unwrap();
        for _ in 0..3 {
            q.send(Message::new(vec![b'x'; 1000]))
                .await
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        client.delete_queue(r".\private$\scratch").await.unwrap();
    }
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn path_and_format_names_with_either_separator_address_one_queue() {
    let (broker, client) = InProcessBroker::start_with_queue(r".\private$\Orders").await;
    let port = broker.addr().port();

    let by_os_slash = client.queue("DIRECT=OS:./private$/orders").unwrap();
    let id = by_os_slash.send(Message::new("one")).await.unwrap();

    let tcp_name = format!(r"DIRECT=TCP:127.0.0.1:{port}\private$\orders");
    let by_tcp = client.queue(&tcp_name).unwrap();
    let got = by_tcp
        .receive(T)
        .await
        .unwrap()
        .expect("the message sent via DIRECT=OS:");
    assert_eq!(got.id, id);
    assert_eq!(got.body.as_ref(), b"one");

    // Every spelling reaches the same queue; messages go in through one and out through another.
    let names = [
        r".\private$\Orders".to_string(),
        "./private$/orders".to_string(),
        r"DIRECT=OS:.\PRIVATE$\ORDERS".to_string(),
        r"direct=os:localhost\private$\orders".to_string(),
        format!("FORMATNAME:DIRECT=TCP:127.0.0.1:{port}/private$/orders"),
        format!(r"localhost:{port}\private$\orders"),
    ];
    for (i, name) in names.iter().enumerate() {
        let q = client.queue(name).unwrap();
        q.send(Message::new(format!("via {i}")))
            .await
            .unwrap_or_else(|e| panic!("send via {name}: {e}"));
        let info = client
            .queue_info(name)
            .await
            .unwrap_or_else(|e| panic!("info via {name}: {e}"));
        assert_eq!(info.name, r".\private$\Orders", "info via {name}");
        assert_eq!(info.messages, 1, "info via {name}");
        let got = by_tcp.receive(T).await.unwrap().expect("a message");
        assert_eq!(got.body, format!("via {i}").as_bytes(), "sent via {name}");
    }
    assert_eq!(client.list_queues().await.unwrap().len(), 1);
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn queue_names_ignore_case() {
    let (broker, client) = InProcessBroker::start_with_queue(r".\private$\MixedCase").await;
    let err = client
        .create_queue(r".\PRIVATE$\mixedcase", QueueOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AlreadyExists(_)), "{err:?}");
    assert!(err.to_string().contains("already exists"), "{err}");

    client
        .queue(r".\private$\MIXEDCASE")
        .unwrap()
        .send(Message::new("x"))
        .await
        .unwrap();
    let info = client.queue_info(r".\private$\mixedcase").await.unwrap();
    assert_eq!(
        info.name, r".\private$\MixedCase",
        "the name is kept as created"
    );
    assert_eq!(info.messages, 1);
    assert_eq!(client.purge(r".\Private$\mIxEdCaSe").await.unwrap(), 1);
    client.delete_queue(r".\private$\mixedcase").await.unwrap();
    assert!(client.list_queues().await.unwrap().is_empty());

    // A public and a private queue of the same name are two queues.
    client
        .create_queue(r".\same", QueueOptions::default())
        .await
        .unwrap();
    client
        .create_queue(r".\private$\same", QueueOptions::default())
        .await
        .unwrap();
    assert_eq!(client.list_queues().await.unwrap().len(), 2);
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn purge_leaves_messages_in_flight_to_a_consumer() {
    let (broker, client) = InProcessBroker::start_with_queue(r".\private$\p").await;
    let q = client.queue(r".\private$\p").unwrap();
    for i in 0..4 {
        q.send(Message::new(format!("{i}"))).await.unwrap();
    }
    let mut consumer = q
        .consumer(mq_client::ConsumerOptions {
            prefetch: 1,
            limit: Some(1),
        })
        .await
        .unwrap();
    let first = consumer.next(T).await.unwrap().expect("a message");
    assert_eq!(first.body.as_ref(), b"0");
    assert_eq!(q.info().await.unwrap().in_flight, 1);
    assert_eq!(q.purge().await.unwrap(), 3, "purge removes what is waiting");
    let info = q.info().await.unwrap();
    assert_eq!((info.messages, info.in_flight), (1, 1), "{info:?}");
    consumer.close().await.unwrap();
    let info = q.info().await.unwrap();
    assert_eq!(
        (info.messages, info.in_flight, info.bytes),
        (0, 0, 0),
        "{info:?}"
    );
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_queue_ends_waiting_receivers_with_not_found() {
    let (broker, client) = InProcessBroker::start_with_queue(r".\private$\gone").await;
    let q = client.queue(r".\private$\gone").unwrap();
    let waiting = {
        let q = q.clone();
        tokio::spawn(async move { q.receive(Duration::from_secs(30)).await })
    };
    // A consumer is attached once `consumer()` returns (the broker answers the stream's first
    // request after resolving the queue), so it is certainly waiting when the delete lands. The
    // plain receive may reach the broker before or after the delete: NotFound either way.
    let mut consumer = q
        .consumer(mq_client::ConsumerOptions::default())
        .await
        .unwrap();
    client.delete_queue(r".\private$\gone").await.unwrap();
    let r = consumer.next(Duration::from_secs(10)).await;
    assert!(matches!(r, Err(Error::NotFound(_))), "consumer: {r:?}");
    let r = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting receive ends when its queue is deleted")
        .unwrap();
    assert!(matches!(r, Err(Error::NotFound(_))), "{r:?}");
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn a_queue_label_over_250_characters_is_refused() {
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    let err = client
        .create_queue(
            r".\private$\labelled",
            QueueOptions {
                label: "q".repeat(251),
                ..QueueOptions::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(err.to_string().contains("251"), "{err}");
    assert!(client.list_queues().await.unwrap().is_empty());
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_queue_under_a_consumer_with_unacknowledged_messages() {
    // The queue is deleted while a consumer holds all its credit; its acknowledgement then
    // arrives for messages of a queue that no longer exists.
    let quota = 20 * (100 + 384); // 20 express messages of 100 B
    let broker = InProcessBroker::start_with(|c| c.express_quota_bytes = quota).await;
    let client = broker.client().await;
    client
        .create_queue(r".\private$\doomed", QueueOptions::default())
        .await
        .unwrap();
    let q = client.queue(r".\private$\doomed").unwrap();
    let sender = q.sender(Default::default()).await.unwrap();
    for _ in 0..10 {
        sender.send(Message::new(vec![b'd'; 100])).await.unwrap();
    }
    sender.close().await.unwrap();
    let mut c = q
        .consumer(mq_client::ConsumerOptions {
            prefetch: 4,
            limit: None,
        })
        .await
        .unwrap();
    assert!(c.next(Duration::from_secs(5)).await.unwrap().is_some());
    let settled = eventually(Duration::from_secs(5), || async {
        q.info().await.unwrap().in_flight == 4
    })
    .await;
    assert!(settled, "the consumer holds its whole prefetch");
    client.delete_queue(r".\private$\doomed").await.unwrap();
    // The acknowledgement fails once the consumer has seen its stream end with the queue (the
    // message went with it); before, it goes to a stream that ends.
    match c.ack().await {
        Ok(()) | Err(Error::NotFound(_)) => {}
        Err(e) => panic!("ack after the deletion: {e:?}"),
    }
    // The consumer hands out what it had buffered until it sees the end, then learns that the
    // queue is gone.
    let mut end = None;
    for _ in 0..10 {
        match c.next(Duration::from_secs(5)).await {
            Ok(Some(_)) => continue,
            Ok(None) => break,
            Err(e) => {
                end = Some(e);
                break;
            }
        }
    }
    let end = end.expect("the consumer is told that its queue is gone");
    assert!(matches!(end, Error::NotFound(_)), "{end:?}");

    // The broker serves, and the whole express quota is free again (no bytes leaked or
    // released twice).
    client
        .create_queue(r".\private$\after", QueueOptions::default())
        .await
        .unwrap();
    let after = client.queue(r".\private$\after").unwrap();
    let mut accepted = 0;
    for _ in 0..40 {
        match after.send(Message::new(vec![b'a'; 100])).await {
            Ok(_) => accepted += 1,
            Err(Error::QuotaExceeded(_)) => break,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(accepted, 20, "the express quota is intact");
    broker.stop().await.unwrap();
}

/// `ListQueues` pages: `page_size` queues per answer in name order, and a token to go on with
/// until the last page; the client's `list_queues` follows the pages (and 0 gives one page of
/// at most 10,000: all of these).
#[tokio::test]
async fn list_queues_pages() {
    use mq_proto::v1;
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    // Created out of order.
    for i in (0..12).rev() {
        let n = format!(r".\private$\page-{i:02}");
        client
            .create_queue(&n, QueueOptions::default())
            .await
            .unwrap();
    }
    let mut rpc = v1::admin_service_client::AdminServiceClient::connect(broker.url().to_string())
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut sizes = Vec::new();
    let mut page_token = String::new();
    loop {
        let r = rpc
            .list_queues(v1::ListQueuesRequest {
                page_size: 5,
                page_token,
            })
            .await
            .unwrap()
            .into_inner();
        sizes.push(r.queues.len());
        seen.extend(r.queues.into_iter().map(|q| q.name));
        if r.next_page_token.is_empty() {
            break;
        }
        page_token = r.next_page_token;
    }
    assert_eq!(sizes, [5, 5, 2]);
    let numbers: Vec<String> = seen
        .iter()
        .map(|n| n.rsplit('-').next().unwrap().to_string())
        .collect();
    let want: Vec<String> = (0..12).map(|i| format!("{i:02}")).collect();
    assert_eq!(numbers, want, "name order, each queue once: {seen:?}");
    let all = rpc
        .list_queues(v1::ListQueuesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.queues.len(), 12);
    assert!(all.next_page_token.is_empty());
    assert_eq!(client.list_queues().await.unwrap().len(), 12);
    // A token longer than any queue name is refused, naming the field.
    let e = rpc
        .list_queues(v1::ListQueuesRequest {
            page_size: 5,
            page_token: "x".repeat(mq_proto::limits::MAX_FORMAT_NAME_ELEMENT_BYTES + 1),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("page_token"), "{e:?}");
    broker.stop().await.unwrap();
}

/// `ListQueues` answers at most 10,000 queues a page, whatever `page_size` asks (0 included):
/// 100,000 queues in one answer held ~58 MB of mqd's memory per call until written, and 128
/// such calls at once on one connection took mqd from 0.6 to 1.7 GB. The rest follow with
/// `next_page_token`; the client's `list_queues` gets them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_queues_pages_are_at_most_ten_thousand() {
    use mq_proto::v1;
    const QUEUES: usize = 10_003;
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let creators: Vec<_> = (0..16)
        .map(|_| {
            let (client, next) = (client.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= QUEUES {
                        return;
                    }
                    client
                        .create_queue(&format!(r".\private$\p{i:05}"), QueueOptions::default())
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for c in creators {
        c.await.unwrap();
    }
    let mut rpc = v1::admin_service_client::AdminServiceClient::connect(broker.url().to_string())
        .await
        .unwrap();
    for page_size in [0, 10_001, u32::MAX] {
        let r = rpc
            .list_queues(v1::ListQueuesRequest {
                page_size,
                page_token: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.queues.len(), 10_000, "page_size {page_size}");
        assert_eq!(
            r.queues.last().map(|q| q.name.as_str()),
            Some(r".\private$\p09999")
        );
        assert!(!r.next_page_token.is_empty(), "page_size {page_size}");
        let rest = rpc
            .list_queues(v1::ListQueuesRequest {
                page_size,
                page_token: r.next_page_token,
            })
            .await
            .unwrap()
            .into_inner();
        let names: Vec<_> = rest.queues.iter().map(|q| q.name.as_str()).collect();
        assert_eq!(
            names,
            [
                r".\private$\p10000",
                r".\private$\p10001",
                r".\private$\p10002"
            ]
        );
        assert!(rest.next_page_token.is_empty());
    }
    assert_eq!(client.list_queues().await.unwrap().len(), QUEUES);
    broker.stop().await.unwrap();
}

/// Clear refusals (helper-60): creating a queue journal says it comes with its queue (it said
/// "already exists" even for a queue that did not); a right that is not a queue right in an
/// ACL names the queue rights (it listed the broker-wide ones too); a transaction whose queue
/// was deleted and created again says it was deleted (it said "does not exist; create it").
#[tokio::test]
async fn refusals_say_what_is_wrong() {
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    match client
        .create_queue(r".\private$\missing;journal", QueueOptions::default())
        .await
    {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("comes with its queue"), "{m}"),
        other => panic!("{other:?}"),
    }
    const TQ: &str = r".\private$\tq";
    let tx_queue = QueueOptions {
        transactional: true,
        ..Default::default()
    };
    client.create_queue(TQ, tx_queue.clone()).await.unwrap();
    match client.grant(TQ, "alice", &["bogus"]).await {
        Err(Error::InvalidArgument(m)) => {
            assert!(m.contains("send, receive, peek, admin"), "{m}");
            assert!(!m.contains("outgoing"), "{m}");
        }
        other => panic!("{other:?}"),
    }
    let mut tx = client.begin().await.unwrap();
    tx.send(TQ, Message::new("x")).unwrap();
    // The send is staged once the broker has it: a receive in the same transaction waits for
    // it to be read (nothing to receive from an empty queue, at once).
    let _ = tx.receive(TQ, std::time::Duration::ZERO).await;
    client.delete_queue(TQ).await.unwrap();
    client.create_queue(TQ, tx_queue).await.unwrap();
    match tx.commit().await {
        Err(Error::NotFound(m)) => assert!(m.contains("was deleted"), "{m}"),
        other => panic!("{other:?}"),
    }
    broker.stop().await.unwrap();
}
