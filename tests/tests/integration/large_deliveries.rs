//! Receive streams deliver bodies of every size intact, in order, from a real mqd: small ones
//! (encoded with the rest of a delivery) and large ones (16 KiB and more: mqd sends the stored
//! body as its own chunk, `broker/src/large_bodies.rs`), express and recoverable (from the
//! journal's memory and, after a restart, read back from disk), through mq-client's consumer
//! and through the generated gRPC client alone.
//!
//! Every wait is bounded and polls a condition; nothing sleeps a fixed time.

use std::time::Duration;

use bytes::Bytes;
use mq_client::{Client, Message, SenderOptions};
use mq_proto::v1;
use mq_tests::{drain_queue, temp_data_dir, MqdProcess};

const Q: &str = r".\private$\large";
const WAIT: Duration = Duration::from_secs(30);

/// Around the 16 KiB split, a few large ones, and 4 MiB (the largest body mqd takes by default
/// is 4 MiB; its own fields take a few bytes more).
const SIZES: &[usize] = &[
    0,
    1,
    1000,
    16 * 1024 - 1,
    16 * 1024,
    16 * 1024 + 1,
    100_000,
    1_000_000,
    2,
    3 << 20,
    50_000,
];

/// Body `i` of `len` bytes: filler that depends on `i` and on the position.
fn body(i: usize, len: usize) -> Bytes {
    let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

async fn send_all(client: &Client, recoverable: bool) {
    let sender = client
        .sender(Q, SenderOptions::default())
        .await
        .expect("a sender");
    for (i, &len) in SIZES.iter().enumerate() {
        let m = Message::new(body(i, len))
            .label(format!("m{i}"))
            .recoverable(recoverable);
        sender.send(m).await.expect("send");
    }
    let sent = sender.close().await.expect("close the sender");
    assert_eq!(sent.acknowledged, SIZES.len() as u64);
}

fn check(got: &[Bytes], what: &str) {
    assert_eq!(got.len(), SIZES.len(), "{what}: message count");
    for (i, b) in got.iter().enumerate() {
        assert_eq!(b.len(), SIZES[i], "{what}: length of message {i}");
        assert!(*b == body(i, SIZES[i]), "{what}: message {i} is not intact");
    }
}

/// Receives everything with the generated client (no mq-client), acknowledging at the end, and
/// checks tags, labels and bodies.
async fn receive_with_the_generated_client(url: &str) {
    let (tx, mut items) = mq_tests::open_receive(url, Q, SIZES.len() as u32).await;
    let mut got = Vec::new();
    while got.len() < SIZES.len() {
        let item = tokio::time::timeout(WAIT, items.message())
            .await
            .expect("the rest of the deliveries")
            .unwrap()
            .expect("the stream stays open");
        for d in item.messages {
            let m = d.message.expect("a message");
            assert_eq!(d.tag, got.len() as u64 + 1, "tags 1, 2, 3, ...");
            assert_eq!(m.label, format!("m{}", got.len()));
            assert_eq!(m.id.len(), 16, "the message id");
            got.push(m.body);
        }
    }
    check(&got, "generated client");
    tx.send(v1::ReceiveRequest {
        queue: String::new(),
        credit: 0,
        ack_through: SIZES.len() as u64,
    })
    .await
    .unwrap();
    drop(tx);
    // The end of the requests ends the stream with OK, after the acknowledgement.
    let end = tokio::time::timeout(WAIT, async {
        loop {
            match items.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("the stream ends");
    assert!(matches!(end, Ok(None)), "{end:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_of_every_size_arrive_intact_express_and_recoverable_and_after_a_restart() {
    let dir = temp_data_dir("mq-large-");
    let (mut mqd, client) = MqdProcess::launch_with_queue(dir.path(), &[], Q).await;
    for recoverable in [false, true] {
        send_all(&client, recoverable).await;
        check(&drain_queue(&client, Q, WAIT).await, "mq-client");
        send_all(&client, recoverable).await;
        receive_with_the_generated_client(mqd.url()).await;
        let left = client.queue_info(Q).await.unwrap();
        assert_eq!((left.messages, left.in_flight), (0, 0), "{left:?}");
    }
    // Recoverable bodies read back from the journal after a restart.
    send_all(&client, true).await;
    drop(client);
    mqd.kill9_checked();
    let mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    check(&drain_queue(&client, Q, WAIT).await, "after kill -9");
}

/// A call whose requests are bytes as they are (a client written from the `.proto` alone may
/// add fields mqd does not know) and whose responses are `R`.
struct Raw<R>(std::marker::PhantomData<fn() -> R>);

impl<R> Clone for Raw<R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R> Copy for Raw<R> {}

impl<R> Default for Raw<R> {
    fn default() -> Self {
        Raw(std::marker::PhantomData)
    }
}

impl<R: prost::Message + Default + 'static> tonic::codec::Codec for Raw<R> {
    type Encode = Vec<u8>;
    type Decode = R;
    type Encoder = Raw<R>;
    type Decoder = Raw<R>;
    fn encoder(&mut self) -> Raw<R> {
        *self
    }
    fn decoder(&mut self) -> Raw<R> {
        *self
    }
}

impl<R: 'static> tonic::codec::Encoder for Raw<R> {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl<R: prost::Message + Default> tonic::codec::Decoder for Raw<R> {
    type Item = R;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<R>, tonic::Status> {
        prost::Message::decode(src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

/// Opens `path` (`/mq.v1.Service/Method`) on mqd with `requests` as they are.
async fn raw_call<R: prost::Message + Default + 'static>(
    mqd: &MqdProcess,
    path: &'static str,
    requests: impl tokio_stream::Stream<Item = Vec<u8>> + Send + 'static,
) -> tonic::Streaming<R> {
    let channel = tonic::transport::Channel::from_shared(mqd.url().to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX);
    grpc.ready().await.unwrap();
    grpc.streaming(
        tonic::Request::new(requests),
        http::uri::PathAndQuery::from_static(path),
        Raw::<R>::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("the call {path}: {e}"))
    .into_inner()
}

/// `encoded` followed by field 1000 (length-delimited): a MiB of sevens mqd does not know.
fn padded(encoded: Vec<u8>) -> Vec<u8> {
    padded_by(encoded, 1 << 20)
}

/// `encoded` followed by `n` bytes of field 1000, which mqd does not know.
fn padded_by(mut encoded: Vec<u8>, n: usize) -> Vec<u8> {
    prost::encoding::bytes::encode(1000, &vec![7u8; n], &mut encoded);
    encoded
}

/// Waits (up to [`WAIT`]) for mqd's RSS to fall under `before` + `above_kib` while `what`
/// waits in its queue, and fails if it does not.
fn assert_rss_falls_under(mqd: &MqdProcess, before: u64, above_kib: u64, what: &str) {
    let limit = before + above_kib;
    let mut now = mq_tests::rss_kib(mqd.pid());
    let back = mq_tests::wait_until(WAIT, || {
        now = mq_tests::rss_kib(mqd.pid());
        now < limit
    });
    println!("mqd RSS {before} KiB before, {now} KiB with {what} waiting");
    assert!(
        back,
        "mqd's RSS is {now} KiB with {what} waiting, {before} KiB before"
    );
}

/// Drains the queue and checks that it held `n` messages, body `i` being `expected(i)`.
async fn assert_drained(client: &Client, n: u64, expected: impl Fn(usize) -> Vec<u8>) {
    let got = drain_queue(client, Q, WAIT).await;
    assert_eq!(got.len() as u64, n);
    for (i, b) in got.iter().enumerate() {
        assert_eq!(&b[..], &expected(i)[..], "body {i}");
    }
}

/// Sends `requests` (encoded `SendRequest`s, first_seq 0, 1, ...) on one Send call through
/// tonic's `Grpc` and waits for every acknowledgement.
async fn send_raw(mqd: &MqdProcess, requests: Vec<Vec<u8>>) {
    let n = requests.len() as u64;
    let mut acks: tonic::Streaming<v1::SendResponse> = raw_call(
        mqd,
        "/mq.v1.MessageQueueService/Send",
        tokio_stream::iter(requests),
    )
    .await;
    let mut acked = 0;
    while acked < n {
        let ack = tokio::time::timeout(WAIT, acks.message())
            .await
            .expect("acknowledgements")
            .expect("no refusal")
            .expect("the stream stays open until every batch is acknowledged");
        assert_eq!(ack.first_seq, acked, "{ack:?}");
        acked += 1;
    }
}

/// Waits for the answers to `n` forwarded batches (numbered from 1) of `count` messages each,
/// none rejected.
async fn assert_forwarded(acks: &mut tonic::Streaming<v1::ForwardResponse>, n: u64, count: u32) {
    for i in 0..n {
        let ack = tokio::time::timeout(WAIT, acks.message())
            .await
            .expect("acknowledgements")
            .expect("no refusal")
            .expect("the stream stays open until every batch is answered");
        assert_eq!((ack.batch, ack.count), (i + 1, count), "{ack:?}");
        assert!(ack.rejected.is_empty(), "{ack:?}");
    }
}

/// A batch of 256 small bodies, one of them at priority 0 and left behind once the others
/// are received: it must not keep its 1 MiB request (`own_small_bodies` copies small bodies
/// out in chunks of at most 16 times a body's charge and 8 KiB). 128 such leftovers kept 140
/// MiB before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_left_behind_by_its_batch_keeps_little() {
    const N: u64 = 128;
    const BATCH: usize = 256;
    const LEN: usize = 4000;
    let dir = temp_data_dir("mq-leftover-");
    let (mqd, client) = MqdProcess::launch_with_queue(dir.path(), &[], Q).await;
    let before = mq_tests::rss_kib(mqd.pid());
    let requests: Vec<Vec<u8>> = (0..N)
        .map(|i| {
            prost::Message::encode_to_vec(&v1::SendRequest {
                destination: Q.into(),
                first_seq: i,
                messages: (0..BATCH)
                    .map(|k| v1::OutMessage {
                        body: Bytes::from(vec![if k == 0 { i as u8 } else { 0xee }; LEN]),
                        priority: Some(if k == 0 { 0 } else { 7 }),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
        })
        .collect();
    send_raw(&mqd, requests).await;
    // Every priority-7 body goes first; what is left is one body of each batch.
    let mut c = client
        .queue(Q)
        .unwrap()
        .consumer(mq_client::ConsumerOptions {
            prefetch: 256,
            limit: Some(N * (BATCH as u64 - 1)),
        })
        .await
        .unwrap();
    for i in 0..N * (BATCH as u64 - 1) {
        let m = c.next(WAIT).await.unwrap().expect("a priority-7 message");
        assert_eq!(m.priority, 7, "message {i}");
    }
    c.close().await.unwrap();
    assert_eq!(client.queue_info(Q).await.unwrap().messages, N);
    // Measured with a debug mqd, once the RSS had settled: +21 MiB with chunks of at most 8 KiB
    // (each leftover's chunk keeps a 64 KiB allocator page), +75-80 MiB with chunks of 64 KiB
    // (512 KiB pages), +140 MiB without the copies.
    assert_rss_falls_under(&mqd, before, 48 * 1024, "128 left-behind 4000 B bodies");
    assert_drained(&client, N, |i| vec![i as u8; LEN]).await;
}

/// One byte of body sent with a MiB of a field mqd does not know: the quota counts the byte, so
/// mqd must not keep the MiB while the message waits (`own_small_bodies`). 128 such messages
/// kept 128 MiB before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_byte_sent_with_a_mib_of_padding_keeps_a_byte() {
    const N: u64 = 128;
    let dir = temp_data_dir("mq-padded-");
    let (mqd, client) = MqdProcess::launch_with_queue(dir.path(), &[], Q).await;
    let before = mq_tests::rss_kib(mqd.pid());
    let requests: Vec<Vec<u8>> = (0..N)
        .map(|i| {
            padded(prost::Message::encode_to_vec(&v1::SendRequest {
                destination: Q.into(),
                first_seq: i,
                messages: vec![v1::OutMessage {
                    body: Bytes::from(vec![i as u8]),
                    label: format!("m{i}"),
                    ..Default::default()
                }],
                ..Default::default()
            }))
        })
        .collect();
    send_raw(&mqd, requests).await;
    assert_eq!(client.queue_info(Q).await.unwrap().messages, N);
    // The padding is freed (the allocator may take a moment to give it back).
    assert_rss_falls_under(&mqd, before, 48 * 1024, "128 padded one-byte messages");
    // And the bytes are the messages'.
    assert_drained(&client, N, |i| vec![i as u8]).await;
}

/// A forwarded batch (another broker's Forward stream, decoded by tonic) of a 3 B body beside
/// a 1 MB one: once the 1 MB messages are received (by id, from the middle of the queue), the
/// 3 B ones must not keep their batches (`own_small_forwarded_bodies` at the Forward call
/// site), and the 1 MB ones must not stay in memory as tombstones (`Queue::take_by`). Before
/// the tombstones let go of their messages, mqd's RSS stayed +152 MiB here (+174 MiB without
/// the call as well).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_forwarded_body_does_not_keep_its_batch() {
    const N: u64 = 128;
    let dir = temp_data_dir("mq-fwd-leftover-");
    let (mqd, client) = MqdProcess::launch_with_queue(dir.path(), &[], Q).await;
    let dest = format!(r"DIRECT=TCP:{}\private$\large", mqd.addr());
    let before = mq_tests::rss_kib(mqd.pid());
    let stream = uuid::Uuid::now_v7();
    let message = |id: uuid::Uuid, body: Vec<u8>| v1::ForwardedMessage {
        // 0: express, not deduplicated.
        seq: 0,
        destination: dest.clone(),
        transactional: false,
        message: Some(v1::Message {
            id: Bytes::copy_from_slice(id.as_bytes()),
            body: body.into(),
            priority: 3,
            delivery: v1::Delivery::Express as i32,
            ..Default::default()
        }),
    };
    let mut large = Vec::new();
    let requests: Vec<v1::ForwardRequest> = (0..N)
        .map(|i| {
            let id = uuid::Uuid::now_v7();
            large.push(id);
            v1::ForwardRequest {
                stream_id: Bytes::copy_from_slice(stream.as_bytes()),
                source: "peer".into(),
                batch: i + 1,
                settled_below: 0,
                messages: vec![
                    message(id, vec![0xee; 1_000_000]),
                    message(uuid::Uuid::now_v7(), vec![i as u8; 3]),
                ],
            }
        })
        .collect();
    let mut rpc = v1::forward_service_client::ForwardServiceClient::connect(mqd.url().to_string())
        .await
        .unwrap()
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX);
    let mut acks = rpc
        .forward(tokio_stream::iter(requests))
        .await
        .expect("the Forward call")
        .into_inner();
    assert_forwarded(&mut acks, N, 2).await;
    let q = client.queue(Q).unwrap();
    for id in large {
        let m = q
            .receive_by_id(id, WAIT)
            .await
            .unwrap()
            .expect("the 1 MB message");
        assert_eq!(m.body.len(), 1_000_000);
    }
    assert_eq!(client.queue_info(Q).await.unwrap().messages, N);
    assert_rss_falls_under(&mqd, before, 64 * 1024, "128 forwarded 3 B bodies");
    assert_drained(&client, N, |i| vec![i as u8; 3]).await;
    drop(acks);
}

/// A forwarded batch (decoded by tonic, not by mqd's own Send decoder) of one 3 B body and a
/// MiB of a field mqd does not know: the 3 B message must not keep the MiB while it waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_byte_with_a_mib_of_padding_keeps_a_byte() {
    const N: u64 = 128;
    let dir = temp_data_dir("mq-fwd-padded-");
    let (mqd, client) = MqdProcess::launch_with_queue(dir.path(), &[], Q).await;
    let dest = format!(r"DIRECT=TCP:{}\private$\large", mqd.addr());
    let before = mq_tests::rss_kib(mqd.pid());
    let stream = uuid::Uuid::now_v7();
    let requests: Vec<Vec<u8>> = (0..N)
        .map(|i| {
            padded(prost::Message::encode_to_vec(&v1::ForwardRequest {
                stream_id: Bytes::copy_from_slice(stream.as_bytes()),
                source: "peer".into(),
                batch: i + 1,
                settled_below: 0,
                messages: vec![v1::ForwardedMessage {
                    // 0: express, not deduplicated.
                    seq: 0,
                    destination: dest.clone(),
                    transactional: false,
                    message: Some(v1::Message {
                        id: Bytes::copy_from_slice(uuid::Uuid::now_v7().as_bytes()),
                        body: vec![i as u8; 3].into(),
                        delivery: v1::Delivery::Express as i32,
                        ..Default::default()
                    }),
                }],
            }))
        })
        .collect();
    let mut acks: tonic::Streaming<v1::ForwardResponse> = raw_call(
        &mqd,
        "/mq.v1.ForwardService/Forward",
        tokio_stream::iter(requests),
    )
    .await;
    assert_forwarded(&mut acks, N, 1).await;
    assert_eq!(client.queue_info(Q).await.unwrap().messages, N);
    assert_rss_falls_under(&mqd, before, 48 * 1024, "128 padded forwarded 3 B bodies");
    assert_drained(&client, N, |i| vec![i as u8; 3]).await;
    drop(acks);
}

/// An open transaction's sends (decoded by tonic) of one byte each with a MiB of a field mqd
/// does not know: the transaction is charged the bytes, so it must not keep the MiBs until it
/// commits (`mq_proto::codec::compacted`). +187 MiB before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_of_padded_bytes_keeps_bytes() {
    padded_transaction(
        128,
        1 << 20,
        48 * 1024,
        "an open transaction of 128 padded bytes",
    )
    .await;
}

/// The same with frames under 8 KiB, which the codec leaves as decoded: each lands in a tonic
/// buffer of its own (8 KiB at least), so a one-byte body kept that buffer unless it is copied
/// out (`large_bodies::TONIC_BUFFER_BYTES`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_of_small_padded_frames_keeps_bytes() {
    padded_transaction(
        8192,
        6 * 1024,
        48 * 1024,
        "an open transaction of 8192 padded bytes",
    )
    .await;
}

/// Stages `n` transactional sends of one byte, each framed with `pad` unknown bytes, and checks
/// that mqd's RSS stays under `limit_kib` more than before while the transaction is open; then
/// commits and checks the bodies.
async fn padded_transaction(n: u64, pad: usize, limit_kib: u64, what: &str) {
    const TQ: &str = r".\private$\tx-padded";
    const EMPTY: &str = r".\private$\tx-empty";
    let dir = temp_data_dir("mq-tx-padded-");
    let (mqd, client) = MqdProcess::launch_with_queue(dir.path(), &[], Q).await;
    for q in [TQ, EMPTY] {
        client
            .create_queue(
                q,
                mq_client::QueueOptions {
                    transactional: true,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
    }
    let before = mq_tests::rss_kib(mqd.pid());
    let op = |op: v1::transact_request::Op| {
        prost::Message::encode_to_vec(&v1::TransactRequest { op: Some(op) })
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    let mut answers: tonic::Streaming<v1::TransactResponse> = raw_call(
        &mqd,
        "/mq.v1.MessageQueueService/Transact",
        tokio_stream::wrappers::ReceiverStream::new(rx),
    )
    .await;
    for i in 0..n {
        let send = op(v1::transact_request::Op::Send(v1::TxSend {
            destination: TQ.into(),
            messages: vec![v1::OutMessage {
                body: Bytes::from(vec![i as u8]),
                ..Default::default()
            }],
        }));
        tx.send(padded_by(send, pad)).await.unwrap();
    }
    // Sends are not answered; a receive from an empty queue is, after every op before it.
    tx.send(op(v1::transact_request::Op::Receive(v1::TxReceive {
        queue: EMPTY.into(),
        timeout_ms: 0,
        ..Default::default()
    })))
    .await
    .unwrap();
    let answer = |a: Option<Result<Option<v1::TransactResponse>, tonic::Status>>| {
        a.expect("an answer")
            .expect("no refusal")
            .expect("the stream stays open")
            .result
    };
    let mut next = async || tokio::time::timeout(WAIT, answers.message()).await.ok();
    assert!(
        matches!(
            answer(next().await),
            Some(v1::transact_response::Result::ReceiveTimeout(_))
        ),
        "the receive from the empty queue times out"
    );
    assert_rss_falls_under(&mqd, before, limit_kib, what);
    tx.send(op(v1::transact_request::Op::Commit(())))
        .await
        .unwrap();
    assert!(
        matches!(
            answer(next().await),
            Some(v1::transact_response::Result::Committed(_))
        ),
        "the transaction commits"
    );
    let got = drain_queue(&client, TQ, WAIT).await;
    assert_eq!(got.len() as u64, n);
    for (i, b) in got.iter().enumerate() {
        assert_eq!(&b[..], &[i as u8][..], "body {i}");
    }
}
