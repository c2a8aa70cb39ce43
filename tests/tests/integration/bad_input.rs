//! Bad input never hurts the broker. Through the `mq` command line against an `mqd` process:
//! malformed names, unknown queues, limits, priority 8, an existing queue, no broker at all;
//! each is one line on stderr that quotes the value and names the rule, with a non-zero exit,
//! and afterwards the broker still serves and has lost nothing. Through the raw gRPC protocol:
//! out-of-range fields and broken streams are refused per message or per stream.

use std::net::TcpListener;
use std::time::Duration;

use mq_client::Message;
use mq_proto::v1;
use mq_tests::{mq, InProcessBroker, MqdProcess};
use serde_json::Value;

use crate::cli::fails;

const KEEP: &str = r".\private$\keep";

fn count(url: &str) -> u64 {
    let out = mq(url, &["queue", "info", KEEP, "--json"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["messages"].as_u64().unwrap()
}

/// A port on 127.0.0.1 that nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn cli_errors_are_one_line_name_the_value_and_the_rule_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mqd = MqdProcess::start_with_args(dir.path(), &["--max-body-bytes", "100000"]).unwrap();
    let url = mqd.url();
    assert!(mq(url, &["queue", "create", KEEP], None).status.success());
    let out = mq(url, &["send", KEEP, "keep {n}", "--count", "25"], None);
    assert!(out.status.success());
    assert_eq!(count(url), 25);

    let big = dir.path().join("big.bin");
    std::fs::write(&big, vec![7u8; 100_001]).unwrap();
    let big = big.to_str().unwrap().to_string();
    let long_label = "l".repeat(251);
    let long_name = format!(r".\private$\{}", "n".repeat(125));
    let port = mqd.addr().port();
    let remote = r"DIRECT=TCP:10.1.2.3\private$\keep".to_string();
    let other_port = format!(r"DIRECT=TCP:127.0.0.1:{}\private$\keep", closed_port());
    let dead_broker = format!("http://127.0.0.1:{}", closed_port());
    let journal = format!(r"{KEEP};JOURNAL");

    // (arguments, exit code, what the line must contain: the value, then words of the rule)
    let cases: Vec<(Vec<&str>, i32, Vec<&str>)> = vec![
        // Malformed names, in every command.
        (
            vec!["send", r"DIRECT=XYZ:.\private$\q", "x"],
            1,
            vec!["DIRECT=XYZ", "DIRECT=OS: or DIRECT=TCP:"],
        ),
        (
            vec!["send", r".\private$\", "x"],
            1,
            vec![r".\private$\", "queue name is missing"],
        ),
        (
            vec!["receive", r".\a\b\c"],
            1,
            vec![r".\a\b\c", "too many path segments"],
        ),
        (
            vec!["peek", "orders"],
            1,
            vec!["\"orders\"", "no '\\' after the host"],
        ),
        (
            vec!["queue", "create", &long_name],
            1,
            vec![&long_name[..30], "124"],
        ),
        (
            // `;JOURNALX` is a subqueue name since subqueues exist (MSMQ 4.0): its main queue
            // is what is missing.
            vec!["queue", "info", r".\private$\q;JOURNALX"],
            1,
            vec![r".\private$\q", "does not exist"],
        ),
        (
            // A subqueue name breaks the rules (more than 32 characters).
            vec![
                "queue",
                "info",
                r".\private$\q;abcdefghijabcdefghijabcdefghijabc",
            ],
            1,
            vec!["abcdefghijabcdefghijabcdefghijabc"],
        ),
        (
            vec!["queue", "purge", r"FORMATNAME:.\private$\a,,.\private$\b"],
            1,
            vec!["empty element"],
        ),
        (vec!["queue", "delete", ""], 1, vec!["\"\"", "empty"]),
        (
            vec!["send", r"DIRECT=TCP:host\private$\q", "x"],
            1,
            vec!["DIRECT=TCP:host", "IP address"],
        ),
        // Unknown queues.
        (
            vec!["send", r".\private$\nope", "x"],
            1,
            vec![r".\private$\nope", "does not exist"],
        ),
        (
            vec!["receive", r".\private$\nope"],
            1,
            vec![r".\private$\nope", "does not exist"],
        ),
        (
            vec!["queue", "delete", r".\private$\nope"],
            1,
            vec![r".\private$\nope", "does not exist"],
        ),
        (
            vec!["queue", "purge", r".\private$\nope"],
            1,
            vec![r".\private$\nope", "does not exist"],
        ),
        // Limits.
        (
            vec!["send", KEEP, "x", "--label", &long_label],
            1,
            vec!["251", "250", "label"],
        ),
        (
            vec!["send", KEEP, "--file", &big],
            1,
            vec!["100001", "100000", "body"],
        ),
        (
            vec!["send", KEEP, "x", "--priority", "8"],
            1,
            vec!["priority 8", "0", "7"],
        ),
        (
            vec!["send", KEEP, "x{n}", "--count", "3", "--priority", "8"],
            1,
            vec!["priority 8", "acknowledged 0 of 3"],
        ),
        // Existing queue, read-only and remote queues, a multiple-element receive.
        (
            vec!["queue", "create", r"./PRIVATE$/Keep"],
            1,
            vec!["keep", "already exists"],
        ),
        (vec!["send", &journal, "x"], 1, vec![";JOURNAL", "journal"]),
        // Remote queues can be sent to (store-and-forward), not received from or peeked at.
        (vec!["receive", &remote], 1, vec![&remote, "another broker"]),
        (
            vec!["peek", &other_port],
            1,
            vec![&other_port, "another broker"],
        ),
        (
            vec!["send", r"DIRECT=OS:.\SYSTEM$;DEADLETTER", "x"],
            1,
            vec!["read-only"],
        ),
        (
            vec!["receive", r"FORMATNAME:.\private$\keep,.\private$\b"],
            1,
            vec!["multiple-element"],
        ),
        // Outgoing queues: none exists for a broker nothing was sent to; not for this broker.
        (
            vec!["outgoing", "pause", "nosuch:1"],
            1,
            vec!["no outgoing queue", "nosuch:1"],
        ),
        (
            vec!["outgoing", "resume", r".\private$\keep"],
            1,
            vec!["this broker"],
        ),
        // A missing --file.
        (
            vec!["send", KEEP, "--file", "/nonexistent/body"],
            1,
            vec!["/nonexistent/body"],
        ),
        // Usage errors: clap's own message (several lines), exit 2.
        (vec!["send", KEEP, "x", "--priority", "300"], 2, vec!["300"]),
        (vec!["send", KEEP, "x", "--colour"], 2, vec!["--colour"]),
    ];
    for (args, code, needles) in &cases {
        let out = mq(url, args, None);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let shown = if *code == 2 {
            assert_eq!(out.status.code(), Some(2), "mq {args:?}: {err}");
            err
        } else {
            let line = fails(out, *code);
            assert!(line.starts_with("mq: error: "), "mq {args:?}: {line}");
            line
        };
        for n in needles {
            assert!(
                shown.to_lowercase().contains(&n.to_lowercase()),
                "mq {args:?}: expected {n:?} in: {shown}"
            );
        }
        assert_eq!(count(url), 25, "after mq {args:?}");
    }

    // No broker: names are checked first, then the connection fails in one line.
    let line = fails(mq(&dead_broker, &["queue", "list"], None), 1);
    assert!(
        line.contains(&dead_broker) && line.contains("is mqd running"),
        "{line}"
    );
    let line = fails(mq(&dead_broker, &["send", KEEP, "x"], None), 1);
    assert!(line.contains(&dead_broker), "{line}");
    let line = fails(mq(&dead_broker, &["send", "bad", "x"], None), 1);
    assert!(line.contains("invalid queue name \"bad\""), "{line}");
    let line = fails(mq("not a url", &["queue", "list"], None), 1);
    assert!(line.contains("not a url"), "{line}");

    // Still serving, nothing lost, in order.
    let out = mq(url, &["receive", KEEP, "--count", "25"], None);
    assert!(out.status.success());
    let want: String = (1..=25).map(|n| format!("keep {n}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&out.stdout), want);
    assert_eq!(port, mqd.addr().port());
}

fn out(body: &str) -> v1::OutMessage {
    v1::OutMessage {
        body: body.as_bytes().to_vec().into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_protocol_abuse_is_refused_and_harmless() {
    let (broker, client) = InProcessBroker::start_with_queue(KEEP).await;
    let keep = client.queue(KEEP).unwrap();
    keep.send(Message::new("precious")).await.unwrap();
    let mut rpc = v1::message_queue_service_client::MessageQueueServiceClient::connect(
        broker.url().to_string(),
    )
    .await
    .unwrap();

    // Out-of-range fields fail their own message only.
    let batch = v1::SendRequest {
        transactional: false,
        tx_stream: Default::default(),
        first_seq: 1,
        destination: KEEP.into(),
        messages: vec![
            v1::OutMessage {
                priority: Some(u32::MAX),
                ..out("a")
            },
            v1::OutMessage {
                delivery: 99,
                ..out("b")
            },
            out("good"),
        ],
    };
    let mut acks = rpc
        .send(futures::stream::iter(vec![
            batch,
            v1::SendRequest {
                transactional: false,
                tx_stream: Default::default(),
                first_seq: 4,
                destination: "no such name".into(),
                messages: vec![out("c")],
            },
        ]))
        .await
        .unwrap()
        .into_inner();
    let ack = acks.message().await.unwrap().expect("an ack");
    assert_eq!((ack.first_seq, ack.count), (1, 3));
    let f: Vec<(u64, String)> = ack
        .failures
        .iter()
        .map(|f| (f.seq, f.message.clone()))
        .collect();
    assert_eq!(f.len(), 2, "{f:?}");
    assert!(
        f[0].0 == 1 && f[0].1.contains(&u32::MAX.to_string()),
        "{f:?}"
    );
    assert!(f[1].0 == 2 && f[1].1.contains("delivery 99"), "{f:?}");
    assert_eq!(ack.ids.len(), 3, "one id entry per message");
    assert!(
        ack.ids[0].is_empty() && ack.ids[1].is_empty(),
        "no ids for refused messages"
    );
    assert_eq!(ack.ids[2].len(), 16, "an id for the good one");
    let ack = acks.message().await.unwrap().expect("an ack");
    assert_eq!(ack.failures.len(), 1);
    assert!(ack.failures[0].message.contains("no such name"), "{ack:?}");
    assert_eq!(ack.failures[0].code, tonic::Code::InvalidArgument as i32);
    assert_eq!(ack.failures[0].reason, "INVALID_ARGUMENT");
    assert!(
        acks.message().await.unwrap().is_none(),
        "the stream ends cleanly"
    );

    // A receive stream that names no queue, or ends before its first request.
    let err = rpc
        .receive(futures::stream::iter(vec![v1::ReceiveRequest {
            queue: String::new(),
            credit: 10,
            ack_through: 0,
        }]))
        .await
        .unwrap_err();
    assert!(err.message().contains("empty"), "{err:?}");
    let err = rpc
        .receive(futures::stream::iter(Vec::<v1::ReceiveRequest>::new()))
        .await
        .unwrap_err();
    assert!(err.message().contains("must start with"), "{err:?}");

    // Acknowledging tags never delivered, and absurd credit: nothing breaks, nothing is lost.
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tx.send(v1::ReceiveRequest {
        queue: KEEP.into(),
        credit: 0,
        ack_through: 1_000_000,
    })
    .await
    .unwrap();
    let mut stream = rpc
        .receive(tokio_stream_from(rx))
        .await
        .unwrap()
        .into_inner();
    tx.send(v1::ReceiveRequest {
        queue: String::new(),
        credit: u32::MAX,
        ack_through: u64::MAX,
    })
    .await
    .unwrap();
    let batch = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("a delivery")
        .unwrap()
        .expect("a batch");
    assert_eq!(batch.messages.len(), 2, "{batch:?}");
    drop(tx);
    drop(stream);
    // Both messages come back: the acknowledgement before delivery did not count for them.
    let settled = mq_tests::eventually(Duration::from_secs(10), || async {
        keep.info()
            .await
            .map(|i| i.in_flight == 0 && i.messages == 2)
            .unwrap_or(false)
    })
    .await;
    assert!(settled, "{:?}", keep.info().await);

    // Peek and receive with extreme values.
    let p = rpc
        .peek(v1::PeekRequest {
            queue: KEEP.into(),
            timeout_ms: u64::MAX,
            max: u32::MAX,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(p.messages.len(), 2);
    let bodies: Vec<_> = p.messages.iter().map(|m| m.body.clone()).collect();
    assert_eq!(bodies, [&b"precious"[..], &b"good"[..]]);
    assert!(!broker.has_stopped());
    broker.stop().await.unwrap();
}

/// Seqs past 2^64 - 1: a batch whose messages cannot all be numbered ends the stream with one
/// OUT_OF_RANGE status and stores nothing of it; the batches before it are answered and kept.
/// (It used to panic the stream's answering task on an overflow, leaving a stored message
/// unanswered and the quota of the batches after it charged.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_seqs_past_the_largest_end_the_stream_and_store_nothing() {
    let (broker, client) = InProcessBroker::start_with_queue(KEEP).await;
    let keep = client.queue(KEEP).unwrap();
    let mut rpc = v1::message_queue_service_client::MessageQueueServiceClient::connect(
        broker.url().to_string(),
    )
    .await
    .unwrap();
    let batch = |first_seq: u64, messages: Vec<v1::OutMessage>| v1::SendRequest {
        transactional: false,
        tx_stream: Default::default(),
        first_seq,
        destination: KEEP.into(),
        messages,
    };
    let mut acks = rpc
        .send(futures::stream::iter(vec![
            batch(1, vec![out("kept")]),
            // The last seq there is: one message fits, and its failure names it.
            batch(
                u64::MAX,
                vec![v1::OutMessage {
                    priority: Some(9),
                    ..out("bad priority")
                }],
            ),
            batch(u64::MAX, vec![out("good0"), out("good1")]),
            batch(2, vec![out("after")]),
        ]))
        .await
        .unwrap()
        .into_inner();
    let ack = acks
        .message()
        .await
        .unwrap()
        .expect("the first batch's ack");
    assert_eq!((ack.first_seq, ack.count, ack.failures.len()), (1, 1, 0));
    let ack = acks
        .message()
        .await
        .unwrap()
        .expect("the second batch's ack");
    assert_eq!((ack.first_seq, ack.count), (u64::MAX, 1));
    assert_eq!(ack.failures.len(), 1, "{ack:?}");
    assert_eq!(ack.failures[0].seq, u64::MAX);
    let err = acks
        .message()
        .await
        .expect_err("the third batch ends the stream");
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err:?}");
    assert!(
        err.message().contains("first_seq 18446744073709551615")
            && err.message().contains("2 messages"),
        "{err:?}"
    );
    let info = keep.info().await.unwrap();
    assert_eq!(info.messages, 1, "only the first batch is stored: {info:?}");
    let got = keep
        .receive(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the kept message");
    assert_eq!(&got.body[..], b"kept");
    let info = keep.info().await.unwrap();
    assert_eq!((info.messages, info.bytes), (0, 0), "{info:?}");
    broker.stop().await.unwrap();
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Every bounded field of the unary calls, out of range, through the raw protocol: each is
/// refused with its own status code and a line naming the rule, and the broker keeps serving.
/// (Each bound existed; none had a test that sends the bad value as a client written from the
/// `.proto` would.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bounded_unary_field_is_refused_with_its_rule() {
    use tonic::Code;
    let (broker, client, url, mut mq) = broker_with_txq().await;
    let mut admin = v1::admin_service_client::AdminServiceClient::connect(url)
        .await
        .unwrap();
    let acl = |principal: &str, rights: &[&str]| v1::ChangeAclRequest {
        queue: KEEP.into(),
        principal: principal.into(),
        rights: rights.iter().map(|r| r.to_string()).collect(),
        grant: true,
    };
    let long_principal = "p".repeat(129);
    let mut results: Vec<(&str, Result<(), tonic::Status>, Code, &str)> = Vec::new();
    for (what, req, words) in [
        (
            "principal of 129 characters",
            acl(&long_principal, &["peek"]),
            "1 to 128 characters",
        ),
        ("empty principal", acl("", &["peek"]), "1 to 128 characters"),
        ("unknown right", acl("carol", &["fly"]), "fly"),
        (
            "broker-wide right on a queue",
            acl("carol", &["forward"]),
            "forward",
        ),
    ] {
        let r = admin.change_acl(req).await.map(drop);
        results.push((what, r, Code::InvalidArgument, words));
    }
    let props = |f: &dyn Fn(&mut v1::SetQueuePropertiesRequest)| {
        let name = TXQ.into();
        with(
            v1::SetQueuePropertiesRequest {
                name,
                ..Default::default()
            },
            f,
        )
    };
    for (what, req, words) in [
        (
            "a quota and remove_quota",
            props(&|r| {
                r.quota_bytes = Some(1000);
                r.remove_quota = true;
            }),
            "set a quota or remove it, not both",
        ),
        (
            "max_aborts above 10,000",
            props(&|r| r.max_aborts = Some(10_001)),
            "max_aborts is 10001; the limit is 10000",
        ),
    ] {
        let r = admin.set_queue_properties(req).await.map(drop);
        results.push((what, r, Code::InvalidArgument, words));
    }
    let r = admin
        .create_queue(v1::CreateQueueRequest {
            name: r".\private$\poisonous".into(),
            transactional: true,
            max_aborts: 10_001,
            ..Default::default()
        })
        .await
        .map(drop);
    results.push((
        "create with max_aborts above 10,000",
        r,
        Code::InvalidArgument,
        "10001",
    ));
    let peek = |f: &dyn Fn(&mut v1::PeekRequest)| {
        with(
            v1::PeekRequest {
                queue: KEEP.into(),
                ..Default::default()
            },
            f,
        )
    };
    for (what, req, words) in [
        (
            "peek from an id of 3 bytes",
            peek(&|r| r.from_id = vec![1, 2, 3].into()),
            "a message id is 16 bytes; got 3",
        ),
        (
            "peek with a cursor and from_id",
            peek(&|r| {
                r.from_id = vec![7; 16].into();
                r.cursor = vec![0; 9].into();
            }),
            "give a cursor or from_id, not both",
        ),
        (
            "peek from a cursor of priority level 9",
            peek(&|r| r.cursor = vec![9; 9].into()),
            "names priority level 9 (there are 8)",
        ),
    ] {
        let r = mq.peek(req).await.map(drop);
        results.push((what, r, Code::InvalidArgument, words));
    }
    let one = |f: &dyn Fn(&mut v1::ReceiveOneRequest)| {
        with(
            v1::ReceiveOneRequest {
                queue: KEEP.into(),
                ..Default::default()
            },
            f,
        )
    };
    let long_correlation = "c".repeat(256);
    for (what, req, words) in [
        (
            "receive an id of 15 bytes",
            one(&|r| r.id = vec![0; 15].into()),
            "a message id is 16 bytes; got 15",
        ),
        (
            "receive by id and correlation id",
            one(&|r| {
                r.id = vec![0; 16].into();
                r.correlation_id = "x".into();
            }),
            "not both",
        ),
        (
            "receive a correlation id of 256 characters",
            one(&|r| r.correlation_id = long_correlation.clone()),
            "correlation id is 256 characters",
        ),
    ] {
        let r = mq.receive_one(req).await.map(drop);
        results.push((what, r, Code::InvalidArgument, words));
    }
    let r = admin
        .pause_outgoing(v1::PauseOutgoingRequest {
            destination: "10.9.9.9:99999".into(),
        })
        .await
        .map(drop);
    results.push((
        "pause an outgoing queue with port 99999",
        r,
        Code::InvalidArgument,
        "is not 1 to 65535",
    ));
    let r = mq
        .transaction_outcome(v1::TransactionOutcomeRequest {
            id: vec![0; 17].into(),
        })
        .await
        .map(drop);
    results.push((
        "outcome of a 17-byte transaction id",
        r,
        Code::InvalidArgument,
        "a transaction id is 16 bytes; got 17",
    ));
    let r = mq
        .move_message(v1::MoveMessageRequest {
            queue: KEEP.into(),
            id: vec![0; 4].into(),
            destination: format!("{KEEP};sub"),
        })
        .await
        .map(drop);
    results.push((
        "move a 4-byte id",
        r,
        Code::InvalidArgument,
        "a message id is 16 bytes; got 4",
    ));
    for (what, r, code, words) in results {
        let status = r.expect_err(what);
        assert_eq!(status.code(), code, "{what}: {status:?}");
        assert!(status.message().contains(words), "{what}: {status:?}");
    }
    // Nothing of it changed the queue, and the broker still serves.
    let keep = client.queue(KEEP).unwrap();
    keep.send(Message::new("after")).await.unwrap();
    assert_eq!(keep.info().await.unwrap().messages, 1);
    broker.stop().await.unwrap();
}

const TXQ: &str = r".\private$\txq";

/// A broker with [`KEEP`] and the transactional queue [`TXQ`]: the broker, a client, its URL
/// and a raw gRPC client.
async fn broker_with_txq() -> (
    InProcessBroker,
    mq_client::Client,
    String,
    v1::message_queue_service_client::MessageQueueServiceClient<tonic::transport::Channel>,
) {
    let (broker, client) = InProcessBroker::start_with_queue(KEEP).await;
    let transactional = mq_client::QueueOptions {
        transactional: true,
        ..Default::default()
    };
    client.create_queue(TXQ, transactional).await.unwrap();
    let url = broker.url().to_string();
    let mq = v1::message_queue_service_client::MessageQueueServiceClient::connect(url.clone())
        .await
        .unwrap();
    (broker, client, url, mq)
}

/// `base` as `f` changes it.
fn with<T>(mut base: T, f: &dyn Fn(&mut T)) -> T {
    f(&mut base);
    base
}

/// The first error of a stream call (the stream's status, or its first answer's error).
async fn stream_error<T: std::fmt::Debug>(
    r: Result<tonic::Response<tonic::Streaming<T>>, tonic::Status>,
) -> tonic::Status {
    let mut s = match r {
        Err(status) => return status,
        Ok(s) => s.into_inner(),
    };
    loop {
        match tokio::time::timeout(Duration::from_secs(10), s.message()).await {
            Ok(Err(status)) => return status,
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None)) => panic!("the stream ended without an error"),
            Err(_) => panic!("no error within 10 s"),
        }
    }
}

/// Every bounded field of the stream calls, out of range, through the raw protocol: a
/// transaction request without an operation, a TxBegin that is not first or not 16 bytes, an
/// unknown cursor action, a forwarding stream id that is not 16 bytes, and a transactional send
/// stream's `tx_stream` of the wrong length, changed between batches or with a gap in its seqs.
/// Each is refused with a line naming the rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bounded_stream_field_is_refused_with_its_rule() {
    let (broker, client, url, mut mq) = broker_with_txq().await;
    use v1::transact_request::Op;
    let tx = |ops: Vec<Option<Op>>| {
        futures::stream::iter(
            ops.into_iter()
                .map(|op| v1::TransactRequest { op })
                .collect::<Vec<_>>(),
        )
    };
    let begin = |n: usize| {
        Op::Begin(v1::TxBegin {
            id: vec![7u8; n].into(),
        })
    };
    let send = Op::Send(v1::TxSend {
        destination: TXQ.into(),
        messages: vec![out("t")],
    });
    for (what, ops, words) in [
        ("no operation", vec![None], "must carry an operation"),
        (
            "a TxBegin of 3 bytes",
            vec![Some(begin(3))],
            "a transaction id is 16 bytes; got 3",
        ),
        (
            "a TxBegin after a send",
            vec![Some(send), Some(begin(16))],
            "TxBegin must be the first request of a transaction",
        ),
    ] {
        let status = stream_error(mq.transact(tx(ops)).await).await;
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{what}: {status:?}"
        );
        assert!(status.message().contains(words), "{what}: {status:?}");
    }
    let status = stream_error(
        mq.browse(futures::stream::iter(vec![v1::BrowseRequest {
            queue: KEEP.into(),
            action: 99,
            timeout_ms: 0,
        }]))
        .await,
    )
    .await;
    assert!(
        status.code() == tonic::Code::InvalidArgument
            && status.message().contains("unknown cursor action 99"),
        "{status:?}"
    );
    let mut fwd = v1::forward_service_client::ForwardServiceClient::connect(url)
        .await
        .unwrap();
    let status = stream_error(
        fwd.forward(futures::stream::iter(vec![v1::ForwardRequest {
            stream_id: vec![1, 2, 3].into(),
            source: "peer".into(),
            batch: 1,
            settled_below: 0,
            messages: Vec::new(),
        }]))
        .await,
    )
    .await;
    assert!(
        status.code() == tonic::Code::InvalidArgument
            && status
                .message()
                .contains("a forwarding stream id must be 16 bytes"),
        "{status:?}"
    );
    // A transactional send stream: the refusal is each message's failure.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let id = |r: u128| mq_proto::txid::new_stream(now_ms, r).to_be_bytes().to_vec();
    let batch = |stream: Vec<u8>, first_seq: u64| v1::SendRequest {
        transactional: true,
        tx_stream: stream.into(),
        first_seq,
        destination: TXQ.into(),
        messages: vec![out("s")],
    };
    for (what, batches, words) in [
        (
            "a tx_stream of 5 bytes",
            vec![batch(vec![1; 5], 1)],
            "tx_stream is 16 bytes; got 5",
        ),
        (
            "a changed tx_stream",
            vec![batch(id(2), 1), batch(id(3), 2)],
            "every batch of a send stream carries the same tx_stream",
        ),
        (
            "a gap in the seqs",
            vec![batch(id(4), 1), batch(id(4), 5)],
            "without gaps (the next is 2)",
        ),
    ] {
        let n = batches.len();
        let mut acks = mq
            .send(futures::stream::iter(batches))
            .await
            .unwrap()
            .into_inner();
        let mut last = None;
        for _ in 0..n {
            last = acks.message().await.unwrap();
        }
        let ack = last.expect("an answer for the last batch");
        assert_eq!(ack.failures.len(), 1, "{what}: {ack:?}");
        assert!(ack.failures[0].message.contains(words), "{what}: {ack:?}");
        assert_eq!(ack.failures[0].code, tonic::Code::InvalidArgument as i32);
    }
    // The good first batches of the last two streams were stored; nothing else.
    let info = client.queue(TXQ).unwrap().info().await.unwrap();
    assert_eq!(info.messages, 2, "{info:?}");
    broker.stop().await.unwrap();
}
