//! Hardening (issue 11): client-supplied strings are bounded and charged to the quotas, forward
//! streams are bounded per peer and pruned, multiple-element names are limited and create
//! outgoing queues only when a message is stored, empty outgoing queues can be deleted or
//! expire, and errors and logs quote client values cut to a bounded length.

use std::time::Duration;

use mq_client::{Error, Message};
use mq_proto::v1;
use mq_tests::{eventually, free_port, mq, temp_data_dir, InProcessBroker, MqdProcess};

const T: Duration = Duration::from_secs(10);

/// A remote queue name on a broker that is not running (messages wait in the outgoing queue).
fn unreachable_queue(port: u16, name: &str) -> String {
    format!(r"DIRECT=TCP:127.0.0.1:{port}\private$\{name}")
}

// ---------------------------------------------------------------------------------------------
// 1. Strings on the wire are bounded; what is kept per message is charged.

#[tokio::test]
async fn a_huge_response_queue_is_refused() {
    let (broker, client) = InProcessBroker::start_with_queue(r".\private$\q").await;
    let q = client.queue(r".\private$\q").unwrap();
    let huge = "r".repeat(2 * 1024 * 1024);
    let err = q
        .send(Message::new("").response_queue(huge))
        .await
        .expect_err("a 2 MiB response queue must be refused");
    let msg = err.to_string();
    assert!(
        matches!(err, Error::InvalidArgument(_)) && msg.contains("response queue"),
        "{err:?}"
    );
    assert!(msg.len() < 300, "the refusal is one short line: {msg}");
    assert_eq!(
        client.queue_info(r".\private$\q").await.unwrap().messages,
        0
    );
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn response_queue_and_correlation_id_count_against_the_express_quota() {
    let quota = 20_000u64;
    let broker = InProcessBroker::start_with(|c| c.express_quota_bytes = quota).await;
    let client = broker.client().await;
    mq_tests::create_default_queue(&client, r".\private$\q").await;
    let q = client.queue(r".\private$\q").unwrap();
    let rq = format!(r"DIRECT=OS:.\private$\{}", "r".repeat(100));
    let rq = rq.repeat(8); // about 1 KB: the length is what counts, not whether it parses
    let corr = "c".repeat(200);
    let mut sent = 0u64;
    let err = loop {
        match q
            .send(
                Message::new("")
                    .response_queue(rq.clone())
                    .correlation_id(corr.clone()),
            )
            .await
        {
            Ok(_) => sent += 1,
            Err(e) => break e,
        }
        assert!(
            sent < 1000,
            "an empty body with 1.2 KB of strings is never refused"
        );
    };
    assert!(matches!(err, Error::QuotaExceeded(_)), "{err:?}");
    // The strings and an express message's overhead (mq_broker's EXPRESS_OVERHEAD_BYTES).
    let per_message = (rq.len() + corr.len()) as u64 + 384;
    assert_eq!(
        sent,
        quota / per_message,
        "each message is charged its response queue and correlation id ({per_message} bytes)"
    );
    broker.stop().await.unwrap();
}

/// Recovery charges what sending charged: a storage quota full of messages with long response
/// queues is still full after `kill -9` and a restart, and frees exactly one message's worth.
#[tokio::test]
async fn recovery_charges_strings_like_the_send_did() {
    let dir = temp_data_dir("mq-hardening-");
    let quota = 30_000u64;
    let args = ["--storage-quota-bytes", "30000"];
    let (mut mqd, client) = MqdProcess::launch_with_queue(dir.path(), &args, r".\private$\q").await;
    let q = client.queue(r".\private$\q").unwrap();
    let rq = "R".repeat(1000);
    let mut sent = 0u64;
    while q
        .send(
            Message::new("x")
                .recoverable(true)
                .response_queue(rq.clone()),
        )
        .await
        .is_ok()
    {
        sent += 1;
        assert!(sent < 1000, "never refused");
    }
    let per_message = 1 + 1000 + 128;
    assert_eq!(sent, quota / per_message);
    mqd.kill9_checked();
    let addr = mqd.addr();
    drop(mqd);
    let _mqd = MqdProcess::launch_on(dir.path(), addr, &args);
    let client = mq_client::Client::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let q = client.queue(r".\private$\q").unwrap();
    let again = q
        .send(
            Message::new("x")
                .recoverable(true)
                .response_queue(rq.clone()),
        )
        .await;
    assert!(
        matches!(again, Err(Error::QuotaExceeded(_))),
        "after the restart the quota is as full as before: {again:?}"
    );
    assert!(q.receive(T).await.unwrap().is_some());
    q.send(Message::new("x").recoverable(true).response_queue(rq))
        .await
        .expect("one message's worth was given back");
}

// ---------------------------------------------------------------------------------------------
// 2. Forward streams: bounded per peer, pruned when idle.

fn forwarded(destination: &str, seq: u64) -> v1::ForwardedMessage {
    v1::ForwardedMessage {
        seq,
        destination: destination.to_string(),
        transactional: false,
        message: Some(v1::Message {
            id: bytes::Bytes::copy_from_slice(uuid::Uuid::now_v7().as_bytes()),
            body: format!("m{seq}").into(),
            priority: 3,
            delivery: v1::Delivery::Recoverable as i32,
            ..Default::default()
        }),
    }
}

fn batch(stream: uuid::Uuid, source: &str, msgs: Vec<v1::ForwardedMessage>) -> v1::ForwardRequest {
    v1::ForwardRequest {
        stream_id: bytes::Bytes::copy_from_slice(stream.as_bytes()),
        source: source.to_string(),
        batch: 1,
        settled_below: 0,
        messages: msgs,
    }
}

type Acks = tonic::Streaming<v1::ForwardResponse>;

/// Opens a forwarding stream, sends `first`, and returns the sender (kept open) and the first
/// answer.
async fn open_forward(
    url: &str,
    first: v1::ForwardRequest,
) -> (
    tokio::sync::mpsc::Sender<v1::ForwardRequest>,
    Result<v1::ForwardResponse, tonic::Status>,
    Option<Acks>,
) {
    let mut rpc = v1::forward_service_client::ForwardServiceClient::connect(url.to_string())
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(first).await.unwrap();
    let mut acks = match rpc
        .forward(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) => return (tx, Err(s), None),
    };
    let first = match tokio::time::timeout(T, acks.message()).await {
        Ok(Ok(Some(a))) => Ok(a),
        Ok(Ok(None)) => Err(tonic::Status::unknown("the stream ended without an answer")),
        Ok(Err(s)) => Err(s),
        Err(_) => Err(tonic::Status::deadline_exceeded("no answer")),
    };
    (tx, first, Some(acks))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_streams_are_limited_per_peer() {
    let broker = InProcessBroker::start_with(|c| c.max_forward_streams_per_peer = 4).await;
    let client = broker.client().await;
    mq_tests::create_default_queue(&client, r".\private$\q").await;
    let dest = format!(r"DIRECT=TCP:127.0.0.1:{}\private$\q", broker.addr().port());
    // Four streams in use at once: each is served.
    let mut open = Vec::new();
    for _ in 0..4 {
        let id = uuid::Uuid::now_v7();
        let (tx, ack, acks) =
            open_forward(broker.url(), batch(id, "peer", vec![forwarded(&dest, 1)])).await;
        assert!(ack.is_ok(), "{ack:?}");
        open.push((tx, acks));
    }
    // A fifth from the same peer while all four are busy: refused, saying which limit.
    let (_tx, ack, _acks) = open_forward(
        broker.url(),
        batch(uuid::Uuid::now_v7(), "peer", vec![forwarded(&dest, 1)]),
    )
    .await;
    let status = ack.expect_err("a fifth busy stream from one peer must be refused");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("--max-forward-streams-per-peer"),
        "{status:?}"
    );
    // Once they are idle, a loop of new stream ids goes on: the least recently used idle one
    // gives way each time (they never pile up).
    drop(open);
    for i in 0..40u64 {
        let id = uuid::Uuid::now_v7();
        let ok = eventually(T, || async {
            let (_tx, ack, _acks) =
                open_forward(broker.url(), batch(id, "peer", vec![forwarded(&dest, 1)])).await;
            ack.is_ok()
        })
        .await;
        assert!(ok, "stream {i} was refused although the others are idle");
    }
    assert_eq!(
        client.queue_info(r".\private$\q").await.unwrap().messages,
        44
    );
    broker.stop().await.unwrap();
}

/// A stream unused for `--forward-stream-idle` is forgotten with its mark: a message resent on
/// it afterwards is stored again (there is nothing left to recognise it by).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_forward_streams_are_pruned() {
    let broker =
        InProcessBroker::start_with(|c| c.forward_stream_idle = Duration::from_millis(300)).await;
    let client = broker.client().await;
    mq_tests::create_default_queue(&client, r".\private$\q").await;
    let dest = format!(r"DIRECT=TCP:127.0.0.1:{}\private$\q", broker.addr().port());
    let id = uuid::Uuid::now_v7();
    let (_tx, ack, _acks) =
        open_forward(broker.url(), batch(id, "peer", vec![forwarded(&dest, 1)])).await;
    ack.unwrap();
    drop((_tx, _acks));
    let pruned = eventually(Duration::from_secs(20), || async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let (_tx, ack, _acks) =
            open_forward(broker.url(), batch(id, "peer", vec![forwarded(&dest, 1)])).await;
        ack.unwrap();
        client.queue_info(r".\private$\q").await.unwrap().messages == 2
    })
    .await;
    assert!(pruned, "the idle stream was never forgotten");
    broker.stop().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// 3. Multiple-element names: limited, checked before anything is created; outgoing queues are
//    created only when a message is stored, and empty ones can be deleted or expire.

fn multi(n: usize, port: u16) -> String {
    let elements: Vec<String> = (0..n)
        .map(|i| unreachable_queue(port, &format!("q{i}")))
        .collect();
    format!("FORMATNAME:{}", elements.join(","))
}

#[tokio::test]
async fn multiple_element_names_have_a_configurable_limit() {
    let broker = InProcessBroker::start_with(|c| c.max_format_name_elements = 10).await;
    let client = broker.client().await;
    let port = free_port();
    // At the limit: fine (ten outgoing copies, all for one broker).
    client
        .queue(&multi(10, port))
        .unwrap()
        .send(Message::new("ten"))
        .await
        .unwrap();
    let err = client
        .queue(&multi(11, port))
        .unwrap()
        .send(Message::new("eleven"))
        .await
        .expect_err("11 elements with a limit of 10");
    let msg = err.to_string();
    assert!(
        msg.contains("11 elements") && msg.contains("limit is 10"),
        "{msg}"
    );
    assert!(
        msg.len() < 1000,
        "the quoted name is cut: {} bytes",
        msg.len()
    );
    // A huge one is refused just as plainly (a raw client: the mq-client parses names too).
    let mut rpc = v1::message_queue_service_client::MessageQueueServiceClient::connect(
        broker.url().to_string(),
    )
    .await
    .unwrap();
    let huge = format!("{},", unreachable_queue(port, "x")).repeat(200_000);
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(v1::SendRequest {
        first_seq: 1,
        destination: huge,
        messages: vec![v1::OutMessage::default()],
        transactional: false,
        tx_stream: Default::default(),
    })
    .await
    .unwrap();
    drop(tx);
    let mut acks = rpc
        .send(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let ack = acks.message().await.unwrap().unwrap();
    assert_eq!(ack.failures.len(), 1);
    assert!(
        ack.failures[0].message.contains("limit is 10"),
        "{:?}",
        ack.failures[0]
    );
    assert!(ack.failures[0].message.len() < 1000);
    let outgoing = client.outgoing().await.unwrap();
    assert_eq!(
        outgoing.len(),
        1,
        "only the ten-element send made one: {outgoing:?}"
    );
    assert_eq!(outgoing[0].messages, 10);
    broker.stop().await.unwrap();
}

/// Without any configuration: the default limit (100) applies.
#[tokio::test]
async fn more_elements_than_the_default_limit_are_refused() {
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    let err = client
        .queue(&multi(101, free_port()))
        .unwrap()
        .send(Message::new("x"))
        .await
        .expect_err("101 elements with the default limit of 100");
    assert!(err.to_string().contains("limit is 100"), "{err}");
    assert_eq!(client.outgoing().await.unwrap(), vec![]);
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn a_refused_send_creates_no_outgoing_queue() {
    let (broker, client) = InProcessBroker::start_with_queue(r".\private$\local").await;
    let (p1, p2) = (free_port(), free_port());
    let two_remote = format!(
        "FORMATNAME:{},{}",
        unreachable_queue(p1, "a"),
        unreachable_queue(p2, "b")
    );
    // Every message refused (label too long): nothing is created.
    let err = client
        .queue(&two_remote)
        .unwrap()
        .send(Message::new("x").label("l".repeat(300)))
        .await
        .expect_err("label over 250 characters");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    // A later element is a missing local queue: the whole send is refused before anything.
    let with_missing = format!(
        r"FORMATNAME:{},{},DIRECT=OS:.\private$\missing",
        unreachable_queue(p1, "a"),
        unreachable_queue(p2, "b")
    );
    let err = client
        .queue(&with_missing)
        .unwrap()
        .send(Message::new("x"))
        .await
        .expect_err("a missing local queue");
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
    assert_eq!(
        client.outgoing().await.unwrap(),
        vec![],
        "no outgoing queue for sends that stored nothing"
    );
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_outgoing_queues_can_be_deleted() {
    let b = InProcessBroker::start().await;
    let bc = b.client().await;
    mq_tests::create_default_queue(&bc, r".\private$\q").await;
    let a = InProcessBroker::start().await;
    let ac = a.client().await;
    let at_b = format!(r"DIRECT=TCP:127.0.0.1:{}\private$\q", b.addr().port());
    let b_dest = format!("127.0.0.1:{}", b.addr().port());
    let down = free_port();
    let down_dest = format!("127.0.0.1:{down}");
    ac.queue(&unreachable_queue(down, "q"))
        .unwrap()
        .send(Message::new("waits"))
        .await
        .unwrap();
    ac.queue(&at_b)
        .unwrap()
        .send(Message::new("1"))
        .await
        .unwrap();
    let qb = bc.queue(r".\private$\q").unwrap();
    assert!(qb.receive(T).await.unwrap().is_some());
    let forwarded = eventually(T, || async {
        ac.outgoing()
            .await
            .unwrap()
            .iter()
            .any(|o| o.destination == b_dest && o.messages == 0 && o.forwarded == 1)
    })
    .await;
    assert!(forwarded);
    // Non-empty: refused, saying why.
    let err = ac
        .delete_outgoing(&down_dest)
        .await
        .expect_err("it holds a message");
    assert!(
        matches!(&err, Error::FailedPrecondition(m) if m.contains("holds 1 messages")),
        "{err:?}"
    );
    // Empty: deleted (by the CLI), gone from the list.
    let out = mq(a.url(), &["outgoing", "delete", &b_dest], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("deleted"));
    let left: Vec<String> = ac
        .outgoing()
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.destination)
        .collect();
    assert_eq!(left, std::slice::from_ref(&down_dest));
    // Unknown: not found. Then a new send makes a new one and is delivered.
    let err = ac.delete_outgoing(&b_dest).await.expect_err("gone");
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
    ac.queue(&at_b)
        .unwrap()
        .send(Message::new("2"))
        .await
        .unwrap();
    let got = qb
        .receive(T)
        .await
        .unwrap()
        .expect("delivered through a new outgoing queue");
    assert_eq!(got.body.as_ref(), b"2");
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

#[tokio::test]
async fn outgoing_queues_are_limited_in_number() {
    let broker = InProcessBroker::start_with(|c| c.max_outgoing_queues = 3).await;
    let client = broker.client().await;
    // Ports nothing listens on, distinct by construction.
    for port in 1..=3 {
        client
            .queue(&unreachable_queue(port, "q"))
            .unwrap()
            .send(Message::new("x"))
            .await
            .unwrap();
    }
    let err = client
        .queue(&unreachable_queue(4, "q"))
        .unwrap()
        .send(Message::new("x"))
        .await
        .expect_err("a fourth destination broker");
    assert!(
        matches!(&err, Error::QuotaExceeded(m) if m.contains("--max-outgoing-queues")),
        "{err:?}"
    );
    assert_eq!(client.outgoing().await.unwrap().len(), 3);
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_empty_outgoing_queues_expire() {
    let b = InProcessBroker::start().await;
    let bc = b.client().await;
    mq_tests::create_default_queue(&bc, r".\private$\q").await;
    let a =
        InProcessBroker::start_with(|c| c.outgoing_idle_expiry = Duration::from_millis(500)).await;
    let ac = a.client().await;
    let down = free_port();
    ac.queue(&unreachable_queue(down, "q"))
        .unwrap()
        .send(Message::new("waits"))
        .await
        .unwrap();
    let at_b = format!(r"DIRECT=TCP:127.0.0.1:{}\private$\q", b.addr().port());
    ac.queue(&at_b)
        .unwrap()
        .send(Message::new("1"))
        .await
        .unwrap();
    assert!(bc
        .queue(r".\private$\q")
        .unwrap()
        .receive(T)
        .await
        .unwrap()
        .is_some());
    let expired = eventually(Duration::from_secs(20), || async {
        let list = ac.outgoing().await.unwrap();
        list.len() == 1 && list[0].destination == format!("127.0.0.1:{down}")
    })
    .await;
    assert!(
        expired,
        "the empty one expires, the one holding a message stays: {:?}",
        ac.outgoing().await
    );
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// 16. No information or log floods.

#[tokio::test]
async fn pausing_an_unknown_destination_does_not_list_the_others() {
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    let secret = free_port();
    client
        .queue(&unreachable_queue(secret, "q"))
        .unwrap()
        .send(Message::new("x"))
        .await
        .unwrap();
    for r in [
        client.pause_outgoing("127.0.0.1:1").await.map(|_| ()),
        client.resume_outgoing("127.0.0.1:1").await.map(|_| ()),
    ] {
        let err = r.expect_err("unknown destination");
        assert!(matches!(err, Error::NotFound(_)), "{err:?}");
        assert!(!err.to_string().contains(&secret.to_string()), "{err}");
    }
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn errors_quote_huge_client_values_cut_short() {
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    let mut rpc = v1::admin_service_client::AdminServiceClient::connect(broker.url().to_string())
        .await
        .unwrap();
    let huge = format!(r".\private$\{}", "n".repeat(1 << 20));
    let checks = [
        rpc.get_queue_info(v1::GetQueueInfoRequest { name: huge.clone() })
            .await
            .map(|_| ())
            .unwrap_err(),
        rpc.delete_queue(v1::DeleteQueueRequest { name: huge.clone() })
            .await
            .map(|_| ())
            .unwrap_err(),
        rpc.pause_outgoing(v1::PauseOutgoingRequest {
            destination: format!("{}:1801", "h".repeat(1 << 20)),
        })
        .await
        .map(|_| ())
        .unwrap_err(),
        rpc.delete_outgoing(v1::DeleteOutgoingRequest {
            destination: huge.clone(),
        })
        .await
        .map(|_| ())
        .unwrap_err(),
        rpc.purge_outgoing(v1::PurgeOutgoingRequest {
            destination: huge.clone(),
        })
        .await
        .map(|_| ())
        .unwrap_err(),
    ];
    for s in checks {
        assert!(
            s.message().len() < 1000,
            "{:?}: {} bytes",
            s.code(),
            s.message().len()
        );
    }
    // Errors carried in answers (not in gRPC headers, which the transport limits anyway).
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    for destination in [huge.clone(), format!("FORMATNAME:{huge},{huge}")] {
        tx.send(v1::SendRequest {
            first_seq: 1,
            destination,
            messages: vec![v1::OutMessage::default()],
            transactional: false,
            tx_stream: Default::default(),
        })
        .await
        .unwrap();
    }
    drop(tx);
    let mut rpc = v1::message_queue_service_client::MessageQueueServiceClient::connect(
        broker.url().to_string(),
    )
    .await
    .unwrap();
    let mut acks = rpc
        .send(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    for _ in 0..2 {
        let ack = acks.message().await.unwrap().unwrap();
        let m = &ack.failures[0].message;
        assert!(m.len() < 1000, "a send failure of {} bytes", m.len());
    }
    let (_tx, ack, _acks) = open_forward(
        broker.url(),
        batch(uuid::Uuid::now_v7(), "peer", vec![forwarded(&huge, 1)]),
    )
    .await;
    let r = &ack.unwrap().rejected[0];
    assert!(
        r.reason.len() <= 512,
        "a refusal of {} bytes",
        r.reason.len()
    );
    drop(client);
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_forward_source_is_refused_and_not_logged() {
    let dir = temp_data_dir("mq-hardening-");
    let mqd = MqdProcess::launch(dir.path(), &[]);
    let source = "s".repeat(1 << 20);
    let (_tx, ack, _acks) = open_forward(
        mqd.url(),
        batch(uuid::Uuid::now_v7(), &source, vec![forwarded("x", 1)]),
    )
    .await;
    let status = ack.expect_err("a 1 MiB source");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("limit is 255"), "{status:?}");
    assert!(
        mqd.stderr().len() < 20_000,
        "{} bytes of log",
        mqd.stderr().len()
    );
}

/// A forwarded message's `sender` is not charged against a quota, so it is bounded: one of
/// 8 MiB is refused (rejected, not stored), one of 512 bytes is stored and keeps its sender.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_forwarded_sender_is_refused_and_not_stored() {
    let dir = temp_data_dir("mq-hardening-");
    let mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    client
        .create_queue(r".\private$\fwd", Default::default())
        .await
        .unwrap();
    let with_sender = |seq: u64, sender: String| {
        let mut m = forwarded(r".\private$\fwd", seq);
        m.message.as_mut().unwrap().sender = sender;
        m
    };
    let longest = "s".repeat(mq_proto::limits::MAX_SENDER_BYTES);
    let (_tx, ack, _acks) = open_forward(
        mqd.url(),
        batch(
            uuid::Uuid::now_v7(),
            "peer",
            vec![
                with_sender(1, "h".repeat(8 << 20)),
                with_sender(2, longest.clone()),
            ],
        ),
    )
    .await;
    let ack = ack.expect("an answer");
    assert_eq!((ack.count, ack.rejected.len()), (2, 1), "{ack:?}");
    let r = &ack.rejected[0];
    assert_eq!(r.index, 0, "{r:?}");
    assert!(
        r.reason
            .contains("sender is 8388608 bytes; the limit is 512"),
        "{r:?}"
    );
    let info = client.queue_info(r".\private$\fwd").await.unwrap();
    assert_eq!(info.messages, 1, "{info:?}");
    let q = client.queue(r".\private$\fwd").unwrap();
    let got = q
        .receive(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the message with the longest sender");
    assert_eq!(got.sender, longest);
}

/// A destination that refuses many messages does not make the sender log a line per message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_logged_rate_limited() {
    let (db, da) = (
        temp_data_dir("mq-hardening-b-"),
        temp_data_dir("mq-hardening-a-"),
    );
    let b = MqdProcess::launch(db.path(), &[]);
    let a = MqdProcess::launch(da.path(), &[]);
    let ac = a.connect().await;
    let missing = format!(r"DIRECT=TCP:127.0.0.1:{}\private$\missing", b.addr().port());
    let sender = ac.sender(&missing, Default::default()).await.unwrap();
    for i in 0..300 {
        sender.send(Message::new(format!("{i}"))).await.unwrap();
    }
    sender.close().await.unwrap();
    let dead = eventually(Duration::from_secs(30), || async {
        ac.queue_info(r".\SYSTEM$;DEADLETTER")
            .await
            .map(|i| i.messages == 300)
            .unwrap_or(false)
    })
    .await;
    assert!(dead, "all 300 refused and dead-lettered");
    // The harness reads the processes' stderr on threads of its own: wait for the line.
    let logged = eventually(Duration::from_secs(30), || async {
        b.stderr().contains("refused forwarded messages")
    })
    .await;
    assert!(
        logged,
        "the destination logged no refusal line for 300 refusals"
    );
    let a_lines = a.stderr().matches("dead-lettered").count();
    let b_lines = b.stderr().matches("refused forwarded messages").count();
    // At most one a second (sender) or one per peer every 10 s (destination): a loaded machine
    // may take a while, but never one line per message.
    assert!(
        a_lines <= 50,
        "the sender logged {a_lines} dead-letter lines for 300 refusals"
    );
    assert!(
        (1..=20).contains(&b_lines),
        "the destination logged {b_lines} refusal lines for 300 refusals"
    );
}

// ---------------------------------------------------------------------------------------------
// Batches are counted before they are decoded.

/// One gRPC message (prefix and bytes) of `fields` and then `n` empty entries of field
/// `entry_tag` (a key byte), optionally inside one occurrence of the message field whose key
/// byte is `outer`.
fn empties_frame(fields: &[u8], outer: Option<u8>, entry_tag: u8, n: usize) -> bytes::Bytes {
    let mut entries = Vec::with_capacity(2 * n);
    for _ in 0..n {
        entries.extend_from_slice(&[entry_tag, 0]);
    }
    let mut msg = fields.to_vec();
    match outer {
        Some(key) => {
            msg.push(key);
            prost::encoding::encode_varint(entries.len() as u64, &mut msg);
            msg.extend_from_slice(&entries);
        }
        None => msg.extend_from_slice(&entries),
    }
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    frame.extend_from_slice(&msg);
    bytes::Bytes::from(frame)
}

/// A batch of millions of empty messages fits in one gRPC message (two bytes each), and prost
/// made each a struct of hundreds of bytes before the service counted them: one 11 MiB Send
/// took mqd from 12 MiB to 2.9 GB of RAM (three at once, and a small machine is out of
/// memory). Now the entries are counted on the wire first (`mq_proto::entries`): Send,
/// Transact and Forward are refused with the limit named, and mqd's peak memory stays near
/// what the requests' bytes take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_of_millions_of_empty_messages_are_refused_before_they_are_decoded() {
    let dir = temp_data_dir("mq-empties");
    let (mqd, client) = MqdProcess::launch_with_queue(dir.path(), &[], r".\private$\q").await;
    let channel = tonic::transport::Channel::from_shared(mqd.url().to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    // 1.5 million entries in 3 MiB (decoded first, each such request took ~0.8 GB).
    let n = 3 * 1024 * 1024 / 2;
    let dest = br".\private$\q";
    let mut send_fields = vec![0x08, 0x01, 0x12, dest.len() as u8];
    send_fields.extend_from_slice(dest);
    let mut forward_fields = vec![0x0a, 16];
    forward_fields.extend_from_slice(&[7u8; 16]);
    forward_fields.extend_from_slice(&[0x12, 1, b's', 0x18, 1]);
    // Counted as they are decoded (a field at the top, refused at the first one past the
    // limit) or walked first (nested in TransactRequest.send).
    let limit = "(mqd --max-batch-messages)";
    let cases = [
        (
            "/mq.v1.MessageQueueService/Send",
            empties_frame(&send_fields, None, 0x1a, n),
            format!("a send batch holds more than 10000 messages, its limit {limit}"),
        ),
        (
            "/mq.v1.MessageQueueService/Transact",
            empties_frame(&[], Some(0x0a), 0x12, n),
            format!("a transactional send holds {n} messages; the limit is 10000 {limit}"),
        ),
        (
            "/mq.v1.ForwardService/Forward",
            empties_frame(&forward_fields, None, 0x22, n),
            format!("a forwarded batch holds more than 10000 messages, its limit {limit}"),
        ),
    ];
    for (path, frame, want) in cases {
        let (_feed, status) =
            crate::flow_limits::unfinished_call(&channel, mqd.url(), path, vec![frame]).await;
        let status = tokio::time::timeout(T, status)
            .await
            .unwrap_or_else(|_| panic!("{path}: no answer within {T:?}"))
            .unwrap();
        assert_eq!(status.code(), tonic::Code::OutOfRange, "{path}: {status:?}");
        assert_eq!(status.message(), want, "{path}");
    }
    // Each 3 MiB request is held while it arrives and is refused: far below the ~0.8 GB one
    // of them cost when it was decoded first.
    let peak = mq_tests::peak_rss_kib(mqd.pid());
    assert!(peak < 256 * 1024, "mqd's peak RSS was {peak} KiB");
    // And the broker still serves.
    let q = client.queue(r".\private$\q").unwrap();
    q.send(Message::new("after")).await.unwrap();
}

/// A send stream's answers are held in memory until its client takes them, and a client that
/// never read them made the stream go on reading batches: 129 answers of 10,000 failures each
/// held ~290 MB per stream, 256 streams a connection. Now what unread answers hold is bounded
/// (8 MiB a stream, reserved before a batch is taken): past it the stream reads no further
/// batch, and goes on once the client reads. 129 batches of 10,000 messages that each fail
/// (priority 9), answers unread: mqd's memory grows by far less than the ~290 MB; once read,
/// every batch is answered, in order, each message's failure named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_stream_whose_answers_are_not_read_stops_reading() {
    use prost::Message as _;
    const BATCHES: usize = 129;
    const PER_BATCH: usize = 10_000;
    const Q: &str = r".\private$\unread";
    let dir = temp_data_dir("mq-unread-answers");
    let (mqd, _client) = MqdProcess::launch_with_queue(dir.path(), &[], Q).await;
    let channel = tonic::transport::Channel::from_shared(mqd.url().to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let before = mq_tests::rss_kib(mqd.pid());
    let (feed, resp) = unread_send_stream(&channel, mqd.url(), Q, BATCHES, PER_BATCH).await;
    // Not read: the stream answers a few batches, then waits for its client. (Before, its
    // memory passed 128 MiB more within a second or two; now ~20 MiB: the budget, the
    // frames in HTTP/2's window, one decoded batch.)
    let grown = || mq_tests::rss_kib(mqd.pid()).saturating_sub(before);
    let over = eventually(Duration::from_secs(4), || async { grown() > 64 * 1024 }).await;
    assert!(!over, "mqd grew by {} KiB with no answer read", grown());
    println!("mqd grew by {} KiB with no answer read", grown());
    // Read: every batch is answered, in order.
    drop(feed);
    let mut body = resp.into_body();
    let mut buf = bytes::BytesMut::new();
    let mut answered = Vec::new();
    loop {
        let frame = tokio::time::timeout(
            T,
            futures::future::poll_fn(|cx| {
                http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx)
            }),
        )
        .await
        .expect("the answers come once read");
        let Some(frame) = frame else { break };
        let frame = frame.unwrap();
        if let Some(data) = frame.data_ref() {
            buf.extend_from_slice(data);
            while buf.len() >= 5 {
                let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
                if buf.len() < 5 + len {
                    break;
                }
                let msg = buf.split_to(5 + len);
                let ack = v1::SendResponse::decode(&msg[5..]).unwrap();
                assert_eq!(ack.failures.len(), PER_BATCH);
                assert!(
                    ack.failures[0].message.contains("priority"),
                    "{:?}",
                    ack.failures[0]
                );
                answered.push(ack.first_seq);
            }
        } else if let Ok(trailers) = frame.into_trailers() {
            let status = tonic::Status::from_header_map(&trailers).unwrap();
            assert_eq!(status.code(), tonic::Code::Ok, "{status:?}");
        }
    }
    let want: Vec<u64> = (0..BATCHES).map(|b| (b * PER_BATCH + 1) as u64).collect();
    assert_eq!(answered, want);
    let peak = mq_tests::peak_rss_kib(mqd.pid()).saturating_sub(before);
    // The peak includes the reading, when batches are decoded and answered as fast as the
    // client takes them (~50 MiB here): before, ~290 MiB.
    assert!(peak < 100 * 1024, "mqd's peak grew by {peak} KiB");
    println!("mqd grew by {peak} KiB at its peak");
}

/// A send stream on `channel` fed `batches` batches of `per_batch` messages that each fail
/// (priority 9) to `queue`, whose answers nobody reads yet: the feed (drop it to end the
/// requests) and the response.
async fn unread_send_stream(
    channel: &tonic::transport::Channel,
    url: &str,
    queue: &str,
    batches: usize,
    per_batch: usize,
) -> (
    tokio::sync::mpsc::Sender<bytes::Bytes>,
    http::Response<tonic::body::Body>,
) {
    use prost::Message as _;
    use tonic::client::GrpcService;
    let (feed, rx) = tokio::sync::mpsc::channel(batches + 1);
    for b in 0..batches {
        let bad = v1::OutMessage {
            priority: Some(9),
            ..Default::default()
        };
        let req = v1::SendRequest {
            first_seq: (b * per_batch + 1) as u64,
            destination: queue.into(),
            messages: vec![bad; per_batch],
            ..Default::default()
        };
        let mut frame = vec![0u8];
        frame.extend_from_slice(&(req.encoded_len() as u32).to_be_bytes());
        req.encode(&mut frame).unwrap();
        feed.send(bytes::Bytes::from(frame)).await.unwrap();
    }
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("{url}/mq.v1.MessageQueueService/Send"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(crate::flow_limits::FedBody(rx)))
        .unwrap();
    let mut ch = channel.clone();
    futures::future::poll_fn(|cx| GrpcService::poll_ready(&mut ch, cx))
        .await
        .unwrap();
    let resp = tokio::time::timeout(T, GrpcService::call(&mut ch, req))
        .await
        .expect("response headers")
        .unwrap();
    (feed, resp)
}

/// The answer budget was a stream's alone (8 MiB), and a connection may open 256 streams: 32
/// send streams of one connection whose answers were not read (batches of 10,000 messages
/// that each fail: ~40 KB on the wire, ~600 KB of answer and megabytes decoded) grew mqd by
/// ~410 MiB, 128 of them by ~1.4 GiB. Now unread answers also count against their
/// connection's budget (`--max-unsent-bytes-per-connection`, here 16 MiB), and a batch is
/// decoded only once the budgets hold its answer's share: ~54 MiB for the 32. A stream of the
/// same connection whose client reads still gets every answer once the others are read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_streams_whose_answers_are_not_read_hold_at_most_their_connections_budget() {
    const STREAMS: usize = 32;
    const BATCHES: usize = 10;
    const PER_BATCH: usize = 10_000;
    const Q: &str = r".\private$\unread";
    let dir = temp_data_dir("mq-unread-answers-conn");
    let (mqd, _client) = MqdProcess::launch_with_queue(
        dir.path(),
        &["--max-unsent-bytes-per-connection", "16777216"],
        Q,
    )
    .await;
    let channel = tonic::transport::Channel::from_shared(mqd.url().to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let before = mq_tests::rss_kib(mqd.pid());
    let mut streams = Vec::new();
    for _ in 0..STREAMS {
        streams.push(unread_send_stream(&channel, mqd.url(), Q, BATCHES, PER_BATCH).await);
    }
    let grown = || mq_tests::rss_kib(mqd.pid()).saturating_sub(before);
    // Before, past 160 MiB within seconds (~410 MiB in all).
    let over = eventually(Duration::from_secs(6), || async { grown() > 160 * 1024 }).await;
    assert!(!over, "mqd grew by {} KiB with no answer read", grown());
    println!(
        "mqd grew by {} KiB with {STREAMS} streams' answers unread",
        grown()
    );
    // Read them all: every batch of every stream is answered.
    let readers: Vec<_> = streams
        .into_iter()
        .map(|(feed, resp)| {
            tokio::spawn(async move {
                drop(feed);
                let mut body = resp.into_body();
                let mut answered = 0u64;
                let mut buf = bytes::BytesMut::new();
                while let Some(frame) = futures::future::poll_fn(|cx| {
                    http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx)
                })
                .await
                {
                    if let Some(data) = frame.unwrap().data_ref() {
                        buf.extend_from_slice(data);
                        while buf.len() >= 5 {
                            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
                            if buf.len() < 5 + len {
                                break;
                            }
                            let msg = buf.split_to(5 + len);
                            let ack =
                                <v1::SendResponse as prost::Message>::decode(&msg[5..]).unwrap();
                            assert_eq!(ack.failures.len(), PER_BATCH);
                            answered += 1;
                        }
                    }
                }
                answered
            })
        })
        .collect();
    for r in readers {
        let answered = tokio::time::timeout(T * 4, r)
            .await
            .expect("answers")
            .unwrap();
        assert_eq!(answered, BATCHES as u64);
    }
}

// ---------------------------------------------------------------------------------------------
// Receive streams whose client does not read.

/// Body `i` of `len` bytes: filler that depends on `i`.
fn filler(i: usize, len: usize) -> bytes::Bytes {
    let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect::<Vec<u8>>()
        .into()
}

/// Reads `streams` (receive streams opened by `mq_tests::open_receive_on`) until `n` messages
/// have come across them, and checks that each is message `i` of `len` bytes, intact.
async fn read_every_message(
    streams: Vec<(
        tokio::sync::mpsc::Sender<v1::ReceiveRequest>,
        tonic::Streaming<v1::ReceiveResponse>,
    )>,
    n: usize,
    len: usize,
) {
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut readers = Vec::new();
    for (tx, mut items) in streams {
        let got = got.clone();
        readers.push(tokio::spawn(async move {
            let _tx = tx;
            while let Ok(Some(item)) = items.message().await {
                for d in item.messages {
                    let m = d.message.unwrap();
                    got.lock().unwrap().push((m.label, m.body));
                }
            }
        }));
    }
    let all = eventually(Duration::from_secs(60), || async {
        got.lock().unwrap().len() >= n
    })
    .await;
    for r in &readers {
        r.abort();
    }
    assert!(all, "only {} messages came", got.lock().unwrap().len());
    let mut got = std::mem::take(&mut *got.lock().unwrap());
    assert_eq!(got.len(), n);
    got.sort_by_key(|(label, _)| label.parse::<usize>().unwrap());
    for (i, (label, body)) in got.into_iter().enumerate() {
        assert_eq!(label, i.to_string());
        assert!(body == filler(i, len), "message {i} is not intact");
    }
}

/// `n` recoverable messages of `len` bytes on `queue`, labelled with their index.
async fn send_numbered(client: &mq_client::Client, queue: &str, n: usize, len: usize) {
    let sender = client
        .sender(queue, mq_client::SenderOptions::default())
        .await
        .unwrap();
    for i in 0..n {
        let m = Message::new(filler(i, len))
            .label(i.to_string())
            .recoverable(true);
        sender.send(m).await.unwrap();
    }
    assert_eq!(sender.close().await.unwrap().acknowledged, n as u64);
}

/// One HTTP/2 connection to `mqd` whose windows are small (64 KiB a stream, 1 MiB in all), so
/// that a stream nobody reads soon stops taking bytes.
async fn small_window_client(
    mqd: &MqdProcess,
) -> v1::message_queue_service_client::MessageQueueServiceClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(mqd.url().to_string())
        .unwrap()
        .initial_stream_window_size(Some(64 * 1024))
        .initial_connection_window_size(Some(1 << 20))
        .connect()
        .await
        .unwrap();
    v1::message_queue_service_client::MessageQueueServiceClient::new(channel)
        .max_decoding_message_size(mq_proto::MAX_GRPC_MESSAGE)
}

/// Receive streams whose client does not read hold at most their connection's budget of
/// deliveries not yet written (`--max-unsent-bytes-per-connection`, here 32 MiB), not what
/// their credit allows: 8 unread streams of 3 MiB recoverable messages took all 48 (six a
/// stream: its channel, the item being encoded and HTTP/2's buffer; 144 MiB of bodies read
/// from the journal and held) before the budget; now about ten. Streams ended by the client
/// and opened again take no more. Once read, every message arrives intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_streams_nobody_reads_hold_at_most_their_connections_budget() {
    const STREAMS: usize = 8;
    const MESSAGES: usize = 48;
    const BODY: usize = 3 << 20;
    const Q: &str = r".\private$\unread-deliveries";
    let dir = temp_data_dir("mq-unread-deliveries");
    let (mqd, client) = MqdProcess::launch_with_queue(
        dir.path(),
        &["--max-unsent-bytes-per-connection", "33554432"],
        Q,
    )
    .await;
    send_numbered(&client, Q, MESSAGES, BODY).await;
    let before = mq_tests::rss_kib(mqd.pid());
    let mut rpc = small_window_client(&mqd).await;
    let mut streams = Vec::new();
    for _ in 0..STREAMS {
        streams.push(mq_tests::open_receive_on(&mut rpc, Q, 100).await);
    }
    let in_flight = || async { client.queue_info(Q).await.unwrap().in_flight };
    // Some are taken at once; then no more than the budget allows: 32 MiB of 3 MiB messages
    // (and 256 B each), and what the client's windows let through (1 MiB).
    assert!(eventually(T, || async { in_flight().await > 0 }).await);
    let over = eventually(Duration::from_secs(4), || async { in_flight().await > 12 }).await;
    let taken = in_flight().await;
    let grown = mq_tests::rss_kib(mqd.pid()).saturating_sub(before);
    println!("unread streams took {taken} messages; mqd grew by {grown} KiB");
    assert!(!over, "the unread streams took {taken} messages of 3 MiB");
    assert!(grown < 56 * 1024, "mqd grew by {grown} KiB");
    // The client ends its streams (a half-close: their messages go back) without reading
    // what HTTP/2 holds of them, and opens as many again: what the ended ones hold stays
    // counted, so the new ones take no more than the budget leaves (helper-57: an ended
    // stream that gave its count back at once let 48 such streams take +578 MiB).
    // Three times over: what ended streams held would pile up if it were not counted.
    let mut ended = Vec::new();
    let mut streams = streams;
    for round in 0..3 {
        for (tx, items) in streams.drain(..) {
            drop(tx);
            ended.push(items);
        }
        assert!(eventually(T, || async { in_flight().await == 0 }).await);
        for _ in 0..STREAMS {
            streams.push(mq_tests::open_receive_on(&mut rpc, Q, 100).await);
        }
        let over = eventually(Duration::from_secs(2), || async { in_flight().await > 12 }).await;
        let taken = in_flight().await;
        println!("round {round}: new unread streams took {taken} messages");
        assert!(
            !over,
            "the new unread streams took {taken} messages of 3 MiB"
        );
    }
    let grown = mq_tests::rss_kib(mqd.pid()).saturating_sub(before);
    println!("after ending and opening streams again, mqd grew by {grown} KiB");
    assert!(grown < 56 * 1024, "mqd grew by {grown} KiB");
    // The ended streams are reset (what they held goes); the new ones are read: every
    // message arrives, intact, across them.
    drop(ended);
    read_every_message(streams, MESSAGES, BODY).await;
}

/// Each connection's budget of deliveries not yet written (`--max-unsent-bytes-per-connection`)
/// was the only bound: clients that never read held it on every connection (helper-60: three
/// connections of 50 unread streams of 1 MiB messages, +720 MiB; 1,024 connections allowed).
/// Now all connections share `--max-unsent-bytes` beyond one batch each (here 32 MiB, as
/// each connection's): four connections of eight unread streams of 3 MiB messages take about
/// 32 MiB and one batch a connection, not 32 MiB each, and a reader on another connection still
/// gets its messages (its own batch). Once read, every message arrives intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_streams_of_many_connections_nobody_reads_hold_at_most_the_brokers_budget() {
    const CONNECTIONS: usize = 4;
    const STREAMS: usize = 8;
    const MESSAGES: usize = 64;
    const BODY: usize = 3 << 20;
    const Q: &str = r".\private$\unread-everywhere";
    const OTHER: &str = r".\private$\read";
    let dir = temp_data_dir("mq-unread-broker");
    let (mqd, client) = MqdProcess::launch_with_queue(
        dir.path(),
        &[
            "--max-unsent-bytes-per-connection",
            "33554432",
            "--max-unsent-bytes",
            "33554432",
        ],
        Q,
    )
    .await;
    mq_tests::create_default_queue(&client, OTHER).await;
    send_numbered(&client, Q, MESSAGES, BODY).await;
    let before = mq_tests::rss_kib(mqd.pid());
    let mut streams = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut rpc = small_window_client(&mqd).await;
        for _ in 0..STREAMS {
            streams.push(mq_tests::open_receive_on(&mut rpc, Q, 100).await);
        }
    }
    let in_flight = || async { client.queue_info(Q).await.unwrap().in_flight };
    assert!(eventually(T, || async { in_flight().await > 0 }).await);
    // Before: ~10 a connection (32 MiB of 3 MiB messages), 40 in all.
    let over = eventually(Duration::from_secs(4), || async { in_flight().await > 20 }).await;
    let taken = in_flight().await;
    let grown = mq_tests::rss_kib(mqd.pid()).saturating_sub(before);
    println!("{CONNECTIONS} connections of unread streams took {taken} messages; mqd grew by {grown} KiB");
    assert!(!over, "the unread streams took {taken} messages of 3 MiB");
    // A reader on another connection gets its messages meanwhile.
    let other = client.queue(OTHER).unwrap();
    for i in 0..5 {
        other.send(Message::new(format!("m{i}"))).await.unwrap();
    }
    for _ in 0..5 {
        let m = other.receive(T).await.unwrap();
        assert!(m.is_some(), "a reader on its own connection got nothing");
    }
    // Read: every message arrives, intact.
    read_every_message(streams, MESSAGES, BODY).await;
}

/// Streams nobody reads hold at most their own budget (16 MiB each), and when they end (the
/// ack timeout, here 3 s) drop the deliveries still queued (their messages went back), keeping
/// counted only what HTTP/2 holds of them: six of them fill the connection's 64 MiB (here), then a
/// stream on the same connection, read and acknowledged, gets every message of its queue once
/// they have ended. (The first version of the budget kept the queued deliveries of an ended
/// stream and their count: the reader waited for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_nobody_reads_give_their_connections_budget_back_when_they_end() {
    const STUCK: usize = 30;
    const READ: usize = 12;
    const BODY: usize = 3 << 20;
    let (stuck, read) = (r".\private$\stuck", r".\private$\read");
    let dir = temp_data_dir("mq-unread-beside");
    let (mqd, client) = MqdProcess::launch_with_queue(
        dir.path(),
        &[
            "--ack-timeout",
            "3s",
            "--max-unsent-bytes-per-connection",
            "67108864",
        ],
        stuck,
    )
    .await;
    mq_tests::create_default_queue(&client, read).await;
    send_numbered(&client, stuck, STUCK, BODY).await;
    send_numbered(&client, read, READ, 1000).await;
    let mut rpc = small_window_client(&mqd).await;
    let mut unread = Vec::new();
    for _ in 0..6 {
        unread.push(mq_tests::open_receive_on(&mut rpc, stuck, 1000).await);
    }
    let stuck_in_flight = || async { client.queue_info(stuck).await.unwrap().in_flight };
    assert!(eventually(T, || async { stuck_in_flight().await > 0 }).await);
    let (acks, mut items) = mq_tests::open_receive_on(&mut rpc, read, 4).await;
    let mut n = 0usize;
    while n < READ {
        let item = tokio::time::timeout(T, items.message())
            .await
            .unwrap_or_else(|_| panic!("only {n} messages came"))
            .unwrap()
            .unwrap();
        for d in item.messages {
            let m = d.message.unwrap();
            assert_eq!(m.label, n.to_string());
            assert!(m.body == filler(n, 1000), "message {n} is not intact");
            n += 1;
            acks.send(v1::ReceiveRequest {
                ack_through: d.tag,
                credit: 1,
                ..Default::default()
            })
            .await
            .unwrap();
        }
    }
    // The unread streams ended with the ack timeout; their messages went back.
    assert!(eventually(T, || async { stuck_in_flight().await == 0 }).await);
    drop(unread);
}

/// A client that resets a receive stream it did not read gets its messages back at once, not
/// at the ack timeout (30 min): the stream's task, waiting to queue a delivery, sees the
/// response gone (helper-58: with the queue shared between the response and the task, the
/// task's sends waited for the ack timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_receive_stream_gives_its_messages_back_at_once() {
    const Q: &str = r".\private$\reset-unread";
    let dir = temp_data_dir("mq-reset-unread");
    let (mqd, client) = MqdProcess::launch_with_queue(dir.path(), &[], Q).await;
    send_numbered(&client, Q, 600, 1000).await;
    let mut rpc = small_window_client(&mqd).await;
    let (tx, items) = mq_tests::open_receive_on(&mut rpc, Q, 600).await;
    let in_flight = || async { client.queue_info(Q).await.unwrap().in_flight };
    // More are delivered than the client's windows hold: the stream's queue is full.
    assert!(eventually(T, || async { in_flight().await >= 200 }).await);
    drop((tx, items));
    assert!(
        eventually(T, || async { in_flight().await == 0 }).await,
        "{} messages still in flight",
        in_flight().await
    );
    assert_eq!(client.queue_info(Q).await.unwrap().messages, 600);
}
