//! The wire contract for other languages (issue 18): errors carry a `google.rpc.ErrorInfo`
//! (domain `mq`, a reason of mq.proto's table) on failed calls, failed streams and refusals
//! made by the transport layer alike; per-message send failures carry the gRPC code and the
//! same reason; the Rust client maps reasons to its error type; a client connects only to a
//! broker whose protocol revision it can use.

use std::time::Duration;

use futures::StreamExt;
use mq_client::{Client, Error, Message, QueueOptions};
use mq_proto::v1;
use mq_tests::InProcessBroker;
use tonic::Code;
use tonic_types::StatusExt;

const Q: &str = r".\private$\contract";
const MISSING: &str = r".\private$\no-such-queue";

/// The reason of an mq error status; fails the test if there is none.
#[track_caller]
fn reason(s: &tonic::Status) -> String {
    let info = s
        .get_details_error_info()
        .unwrap_or_else(|| panic!("no google.rpc.ErrorInfo in {s:?}"));
    assert_eq!(info.domain, "mq", "{s:?}");
    info.reason
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_carries_an_error_info_reason() {
    let broker = InProcessBroker::start_with(|c| c.flow.max_batch_messages = 512).await;
    let client = broker.client().await;
    client
        .create_queue(Q, QueueOptions::default())
        .await
        .unwrap();
    let url = broker.url().to_string();
    let mut admin = v1::admin_service_client::AdminServiceClient::connect(url.clone())
        .await
        .unwrap();
    let mut mq = v1::message_queue_service_client::MessageQueueServiceClient::connect(url)
        .await
        .unwrap();

    // A unary call on a missing queue.
    let s = admin
        .get_queue_info(v1::GetQueueInfoRequest {
            name: MISSING.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::NotFound);
    assert_eq!(reason(&s), "QUEUE_NOT_FOUND");
    // Creating it twice.
    let s = admin
        .create_queue(v1::CreateQueueRequest {
            name: Q.into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        (s.code(), reason(&s).as_str()),
        (Code::AlreadyExists, "QUEUE_EXISTS")
    );

    // A streaming call on a missing queue: reported on the first read.
    let first = v1::ReceiveRequest {
        queue: MISSING.into(),
        credit: 10,
        ack_through: 0,
    };
    let s = match mq
        .receive(futures::stream::iter([first]).chain(futures::stream::pending()))
        .await
    {
        Err(s) => s,
        Ok(r) => r.into_inner().message().await.unwrap_err(),
    };
    assert_eq!(
        (s.code(), reason(&s).as_str()),
        (Code::NotFound, "QUEUE_NOT_FOUND")
    );

    // A refusal made without a reason by the code that refuses it (a batch over the limit):
    // the reason comes from its code.
    let batch = v1::SendRequest {
        first_seq: 1,
        destination: Q.into(),
        messages: vec![v1::OutMessage::default(); 600],
        ..Default::default()
    };
    let s = match mq.send(futures::stream::iter([batch])).await {
        Err(s) => s,
        Ok(r) => r.into_inner().message().await.unwrap_err(),
    };
    assert_eq!(
        (s.code(), reason(&s).as_str()),
        (Code::OutOfRange, "LIMIT_EXCEEDED")
    );
    assert!(s.message().contains("--max-batch-messages"), "{s:?}");

    // Per-message failures: the gRPC code and the same reasons; the stream goes on.
    let batch = |seq, destination: &str, messages| v1::SendRequest {
        first_seq: seq,
        destination: destination.into(),
        messages,
        ..Default::default()
    };
    let good = v1::OutMessage {
        body: bytes::Bytes::from_static(b"ok"),
        ..Default::default()
    };
    let bad_priority = v1::OutMessage {
        priority: Some(8),
        ..Default::default()
    };
    let mut acks = mq
        .send(futures::stream::iter([
            batch(1, MISSING, vec![good.clone()]),
            batch(2, Q, vec![bad_priority, good.clone()]),
        ]))
        .await
        .unwrap()
        .into_inner();
    let a = acks.message().await.unwrap().unwrap();
    assert_eq!(a.ids.len(), 1);
    assert!(a.ids[0].is_empty(), "no id for a failed message");
    assert_eq!(a.failures.len(), 1);
    assert_eq!(a.failures[0].code, Code::NotFound as i32);
    assert_eq!(a.failures[0].reason, "QUEUE_NOT_FOUND");
    let a = acks.message().await.unwrap().unwrap();
    assert_eq!((a.first_seq, a.ids.len()), (2, 2));
    assert!(a.ids[0].is_empty() && a.ids[1].len() == 16, "{a:?}");
    assert_eq!(a.failures[0].seq, 2);
    assert_eq!(a.failures[0].code, Code::InvalidArgument as i32);
    assert_eq!(a.failures[0].reason, "INVALID_ARGUMENT");

    // The client crate maps the reasons to its error type.
    let e = client.queue_info(MISSING).await.unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e:?}");
    let e = client
        .queue(MISSING)
        .unwrap()
        .send(Message::new("x"))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e:?}");
    broker.stop().await.unwrap();
}

/// The transaction timeout (ABORTED, reason TX_TIMEOUT) is `Error::Aborted` in the client, not
/// a lost connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_timeout_is_aborted_not_a_lost_connection() {
    let broker = InProcessBroker::start_with(|c| c.tx_timeout = Duration::from_millis(300)).await;
    let client = broker.client().await;
    client
        .create_queue(
            Q,
            QueueOptions {
                transactional: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut tx = client.begin().await.unwrap();
    tx.send(Q, Message::new("late")).unwrap();
    // Wait until the broker has ended it (bounded).
    let mut e = None;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if let Err(err) = tx.receive(Q, Duration::ZERO).await {
            e = Some(err);
            break;
        }
    }
    let e = e.expect("the broker ends the transaction after its timeout");
    assert!(matches!(e, Error::Aborted(_)), "{e:?}");
    assert!(e.to_string().contains("--tx-timeout-secs"), "{e}");
    broker.stop().await.unwrap();
}

/// Point 4: the client checks the broker's protocol revision at connect; this broker's is the
/// client's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_reports_the_protocol_revision_the_client_needs() {
    let broker = InProcessBroker::start().await;
    let client = Client::connect(broker.url()).await.unwrap();
    let info = client.broker_info().await.unwrap();
    assert_eq!(info.protocol_version, mq_proto::PROTOCOL_VERSION);
    assert!(info.protocol_version >= mq_proto::MIN_PROTOCOL_VERSION);
    broker.stop().await.unwrap();
}
