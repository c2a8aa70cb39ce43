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
