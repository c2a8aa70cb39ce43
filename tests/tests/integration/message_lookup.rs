//! Receive and peek by id and by correlation id (.NET `ReceiveById`, `PeekById`,
//! `ReceiveByCorrelationId`): express, recoverable and transactional queues, waiting for the
//! message to arrive, MQ_ERROR_MESSAGE_NOT_FOUND without a timeout, inside transactions
//! (abort puts it back in its place), after `kill -9` (the index is rebuilt), and `mq`.

use std::time::Duration;

use mq_client::{Error, Message, QueueOptions};
use mq_tests::{mq, temp_data_dir, InProcessBroker, MqdProcess};

const WAIT: Duration = Duration::from_secs(20);

fn body(m: &mq_client::ReceivedMessage) -> String {
    String::from_utf8(m.body.to_vec()).unwrap()
}

/// Ten requesters wait at once, each for the reply whose correlation id is its request's; the
/// replies arrive after they started waiting, in another order, among a thousand others. Each
/// gets exactly its own; the others stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_concurrent_requesters_each_get_exactly_their_reply() {
    let (broker, client) = InProcessBroker::start_with_queue(r".\private$\replies").await;
    let q = client.queue(r".\private$\replies").unwrap();
    let sender = q.sender(Default::default()).await.unwrap();
    for i in 0..1000 {
        sender
            .send(Message::new(format!("noise {i}")).correlation_id(format!("other-{i}")))
            .await
            .unwrap();
    }
    sender.close().await.unwrap();
    let mut waiting = Vec::new();
    for r in 0..10 {
        let q = q.clone();
        waiting.push(tokio::spawn(async move {
            let m = q
                .receive_by_correlation_id(&format!("request-{r}"), WAIT)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("requester {r} got no reply"));
            (r, m)
        }));
    }
    // Nothing for them yet: the receives wait (peek: still a thousand messages).
    assert_eq!(q.info().await.unwrap().messages, 1000);
    for r in [7, 2, 9, 0, 5, 1, 8, 3, 6, 4] {
        q.send(Message::new(format!("reply {r}")).correlation_id(format!("request-{r}")))
            .await
            .unwrap();
    }
    for w in waiting {
        let (r, m) = w.await.unwrap();
        assert_eq!(body(&m), format!("reply {r}"));
        assert_eq!(m.correlation_id, format!("request-{r}"));
    }
    let info = q.info().await.unwrap();
    assert_eq!((info.messages, info.in_flight), (1000, 0));
    // The noise is untouched and in order.
    let head = q.peek_many(3, Duration::ZERO).await.unwrap();
    assert_eq!(
        head.iter().map(body).collect::<Vec<_>>(),
        ["noise 0", "noise 1", "noise 2"]
    );
    broker.stop().await.unwrap();
}

/// By id and by correlation id on an express and a recoverable queue: peek leaves it, receive
/// takes it from the middle, the rest keeps its order; no such message now is NOT_FOUND, and
/// with a timeout `None` once it passes; a message sent later is waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_id_and_correlation_id_on_express_and_recoverable_queues() {
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    for recoverable in [false, true] {
        let name = format!(r".\private$\lookup-{recoverable}");
        client
            .create_queue(&name, QueueOptions::default())
            .await
            .unwrap();
        let q = client.queue(&name).unwrap();
        let mut ids = Vec::new();
        for i in 0..5 {
            let m = Message::new(format!("m{i}"))
                .correlation_id(format!("c{i}"))
                .recoverable(recoverable);
            ids.push(q.send(m).await.unwrap());
        }
        let p = q.peek_by_id(ids[3], Duration::ZERO).await.unwrap().unwrap();
        assert_eq!((body(&p), p.id), ("m3".to_string(), ids[3]));
        let r = q
            .receive_by_id(ids[3], Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(r.id, ids[3]);
        let c = q
            .receive_by_correlation_id("c1", Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(body(&c), "m1");
        // Gone now: NOT_FOUND at once, None after a timeout.
        match q.receive_by_id(ids[3], Duration::ZERO).await {
            Err(Error::NotFound(m)) => assert!(m.contains("MQ_ERROR_MESSAGE_NOT_FOUND"), "{m}"),
            other => panic!("expected NotFound, got {other:?}"),
        }
        assert!(q
            .peek_by_correlation_id("c1", Duration::from_millis(50))
            .await
            .unwrap()
            .is_none());
        let rest = q.peek_many(10, Duration::ZERO).await.unwrap();
        assert_eq!(
            rest.iter().map(body).collect::<Vec<_>>(),
            ["m0", "m2", "m4"]
        );
        // Waits for a message that arrives later.
        let waiter = {
            let q = q.clone();
            tokio::spawn(async move { q.receive_by_correlation_id("late", WAIT).await })
        };
        q.send(
            Message::new("late one")
                .correlation_id("late")
                .recoverable(recoverable),
        )
        .await
        .unwrap();
        let got = waiter.await.unwrap().unwrap().unwrap();
        assert_eq!(body(&got), "late one");
        assert_eq!(q.info().await.unwrap().messages, 3);
    }
    broker.stop().await.unwrap();
}

/// A transactional queue: receive by id inside a transaction hides the message; abort puts it
/// back in its place; a lookup that finds nothing does not end the transaction; commit removes
/// it. Outside a transaction, by id is a single-message transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_id_in_a_transaction_and_abort_puts_it_back() {
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    let name = r".\private$\tx-lookup";
    client
        .create_queue(
            name,
            QueueOptions {
                transactional: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let q = client.queue(name).unwrap();
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            q.send_tx(Message::new(format!("t{i}")).correlation_id(format!("k{i}")))
                .await
                .unwrap(),
        );
    }
    let mut tx = client.begin().await.unwrap();
    let m = tx
        .receive_by_id(name, ids[1], Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(body(&m), "t1");
    // Hidden from everyone else while the transaction is open.
    assert!(q.peek_by_id(ids[1], Duration::ZERO).await.is_err());
    tx.abort().await.unwrap();
    let all = q.peek_many(10, Duration::ZERO).await.unwrap();
    assert_eq!(all.iter().map(body).collect::<Vec<_>>(), ["t0", "t1", "t2"]);
    assert_eq!(all[1].abort_count, 1);
    // Not found inside a transaction: an error, and the transaction goes on.
    let mut tx = client.begin().await.unwrap();
    match tx
        .receive_by_correlation_id(name, "no-such", Duration::ZERO)
        .await
    {
        Err(Error::NotFound(m)) => assert!(m.contains("MQ_ERROR_MESSAGE_NOT_FOUND"), "{m}"),
        other => panic!("expected NotFound, got {other:?}"),
    }
    let m = tx
        .receive_by_correlation_id(name, "k2", Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(body(&m), "t2");
    tx.commit().await.unwrap();
    // Outside a transaction.
    let m = q
        .receive_by_id(ids[0], Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(body(&m), "t0");
    let left = q.peek_many(10, Duration::ZERO).await.unwrap();
    assert_eq!(left.iter().map(body).collect::<Vec<_>>(), ["t1"]);
    broker.stop().await.unwrap();
}

/// Recoverable messages after `kill -9`: the index is rebuilt from what recovery loaded, and
/// `mq receive --id` / `--correlation-id` and `mq peek --id` find them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_after_kill9_and_from_mq() {
    let dir = temp_data_dir("mq-lookup-");
    let mut mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    let name = r".\private$\durable-lookup";
    client
        .create_queue(name, QueueOptions::default())
        .await
        .unwrap();
    let q = client.queue(name).unwrap();
    let mut ids = Vec::new();
    for i in 0..20 {
        let m = Message::new(format!("d{i}"))
            .correlation_id(format!("corr-{i}"))
            .recoverable(true);
        ids.push(q.send(m).await.unwrap());
    }
    // Build the index before the crash, so the test shows it is rebuilt, not kept.
    assert!(q
        .peek_by_id(ids[0], Duration::ZERO)
        .await
        .unwrap()
        .is_some());
    drop(client);
    mqd.kill9_checked();
    let mqd = MqdProcess::launch(dir.path(), &[]);
    let url = mqd.url().to_string();
    let out = mq(
        &url,
        &["peek", name, "--id", &ids[13].to_string(), "--json"],
        None,
    );
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["correlation_id"], "corr-13");
    let out = mq(&url, &["receive", name, "--correlation-id", "corr-7"], None);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "d7");
    let out = mq(&url, &["receive", name, "--id", &ids[13].to_string()], None);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "d13");
    // Gone: with --timeout 0s, MSMQ's not-found error at once; with a timeout, exit 3.
    let out = mq(
        &url,
        &[
            "receive",
            name,
            "--id",
            &ids[13].to_string(),
            "--timeout",
            "0s",
        ],
        None,
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("MQ_ERROR_MESSAGE_NOT_FOUND"),
        "{out:?}"
    );
    let out = mq(
        &url,
        &[
            "receive",
            name,
            "--correlation-id",
            "corr-7",
            "--timeout",
            "100ms",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let client = mqd.connect().await;
    assert_eq!(client.queue_info(name).await.unwrap().messages, 18);
}
