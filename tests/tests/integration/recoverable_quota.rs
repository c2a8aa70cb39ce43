//! Quotas with recoverable messages: a queue's own quota and the broker-wide storage quota
//! (`mqd --storage-quota-bytes`) refuse a send that does not fit with `Error::QuotaExceeded`
//! (gRPC RESOURCE_EXHAUSTED), touch nothing already stored, accept sends again once messages
//! are received, and count the recovered messages after a restart. `mq send --recoverable`
//! over quota exits 1 with one stderr line.

use std::path::Path;
use std::time::Duration;

use mq_client::{Client, Delivery, Error, Message, QueueOptions};
use mq_tests::{mq, InProcessBroker, MqdProcess, STOP_TIMEOUT};

const T: Duration = Duration::from_secs(5);
/// Bytes a 1000-byte body without a label is charged (body + label + per-message overhead).
const CHARGE: u64 = 1000 + 128;

fn data_dir() -> tempfile::TempDir {
    mq_tests::temp_data_dir("mq-rquota-")
}

fn body(n: u64) -> Vec<u8> {
    let mut b = format!("{n:04}-").into_bytes();
    b.resize(1000, b'r');
    b
}

fn recoverable(n: u64) -> Message {
    Message::new(body(n)).recoverable(true)
}

/// The bodies of every message in `queue`, in order, without removing them.
async fn peek_all(client: &Client, queue: &str) -> Vec<Vec<u8>> {
    client
        .queue(queue)
        .unwrap()
        .peek_many(1000, Duration::from_millis(200))
        .await
        .unwrap()
        .iter()
        .map(|m| m.body.to_vec())
        .collect()
}

fn assert_quota(e: &Error, needle: &str) {
    let Error::QuotaExceeded(msg) = e else {
        panic!("expected Error::QuotaExceeded, got {e:?}");
    };
    assert!(
        msg.contains(needle),
        "the refusal should mention {needle:?}: {msg}"
    );
}

async fn in_process(dir: &Path, storage_quota: Option<u64>) -> InProcessBroker {
    InProcessBroker::start_with(|c| {
        c.data_dir = dir.to_path_buf();
        if let Some(q) = storage_quota {
            c.storage_quota_bytes = q;
        }
    })
    .await
}

// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_quota_refuses_recoverable_sends_and_holds_after_restart() {
    const SMALL: &str = r".\private$\small";
    let dir = data_dir();
    let broker = in_process(dir.path(), None).await;
    let client = broker.client().await;
    client
        .create_queue(
            SMALL,
            QueueOptions {
                quota_bytes: Some(3 * CHARGE),
                ..QueueOptions::default()
            },
        )
        .await
        .unwrap();
    let q = client.queue(SMALL).unwrap();
    for n in 1..=3 {
        q.send(recoverable(n)).await.unwrap();
    }
    let before = peek_all(&client, SMALL).await;
    assert_eq!(before, (1..=3).map(body).collect::<Vec<_>>());
    let e = q.send(recoverable(4)).await.unwrap_err();
    assert_quota(&e, SMALL);
    // A smaller express message does not fit either: the queue quota counts both.
    let e = q
        .send(Message::new("e").delivery(Delivery::Express))
        .await
        .unwrap_err();
    assert_quota(&e, "over its quota");
    assert_eq!(
        peek_all(&client, SMALL).await,
        before,
        "nothing stored touched"
    );
    assert_eq!(q.info().await.unwrap().messages, 3);

    // Receiving one frees exactly one message's room.
    let m = q.receive(T).await.unwrap().expect("a message");
    assert_eq!(m.body.as_ref(), &body(1)[..]);
    q.send(recoverable(4)).await.unwrap();
    assert_quota(&q.send(recoverable(5)).await.unwrap_err(), SMALL);
    broker.stop().await.unwrap();

    // After a restart the recovered messages still count against the queue's quota.
    let broker = in_process(dir.path(), None).await;
    let client = broker.client().await;
    let q = client.queue(SMALL).unwrap();
    assert_eq!(q.info().await.unwrap().quota_bytes, Some(3 * CHARGE));
    assert_eq!(
        peek_all(&client, SMALL).await,
        [2, 3, 4].map(body).to_vec(),
        "recovered as stored"
    );
    assert_quota(&q.send(recoverable(5)).await.unwrap_err(), SMALL);
    assert!(q.receive(T).await.unwrap().is_some());
    q.send(recoverable(5)).await.unwrap();
    assert_eq!(peek_all(&client, SMALL).await, [3, 4, 5].map(body).to_vec());
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_storage_quota_is_broker_wide_and_separate_from_express() {
    const A: &str = r".\private$\a";
    const B: &str = r".\private$\b";
    let dir = data_dir();
    let broker = in_process(dir.path(), Some(5 * CHARGE)).await;
    let client = broker.client().await;
    for name in [A, B] {
        client
            .create_queue(name, QueueOptions::default())
            .await
            .unwrap();
    }
    let (a, b) = (client.queue(A).unwrap(), client.queue(B).unwrap());
    for n in 1..=3 {
        a.send(recoverable(n)).await.unwrap();
    }
    for n in 4..=5 {
        b.send(recoverable(n)).await.unwrap();
    }
    let (before_a, before_b) = (peek_all(&client, A).await, peek_all(&client, B).await);
    for q in [&a, &b] {
        let e = q.send(recoverable(6)).await.unwrap_err();
        assert_quota(&e, "storage quota for recoverable messages");
        assert_quota(&e, &(5 * CHARGE).to_string());
    }
    // Express messages are held in memory under their own quota.
    b.send(Message::new(body(100)).delivery(Delivery::Express))
        .await
        .unwrap();
    assert_eq!(
        peek_all(&client, A).await,
        before_a,
        "nothing stored touched"
    );
    assert_eq!(b.info().await.unwrap().messages, 3);
    assert_eq!(peek_all(&client, B).await[..2], before_b[..]);

    // Receiving from one queue makes room for a recoverable send to the other.
    assert_eq!(
        a.receive(T).await.unwrap().unwrap().body.as_ref(),
        &body(1)[..]
    );
    b.send(recoverable(6)).await.unwrap();
    assert_quota(&a.send(recoverable(7)).await.unwrap_err(), "storage quota");
    // Purge frees too.
    assert_eq!(a.purge().await.unwrap(), 2);
    a.send(recoverable(7)).await.unwrap();
    a.send(recoverable(8)).await.unwrap();
    assert_quota(&a.send(recoverable(9)).await.unwrap_err(), "storage quota");
    broker.stop().await.unwrap();
}

// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_storage_quota_counts_recovered_messages_after_kill9() {
    const Q: &str = r".\private$\stored";
    let quota = (5 * CHARGE).to_string();
    let args = ["--storage-quota-bytes", quota.as_str()];
    let dir = data_dir();
    let (mut mqd, client) = MqdProcess::launch_with_queue(dir.path(), &args, Q).await;
    let q = client.queue(Q).unwrap();
    for n in 1..=5 {
        q.send(recoverable(n)).await.unwrap();
    }
    assert_quota(&q.send(recoverable(6)).await.unwrap_err(), "storage quota");
    mqd.kill9().unwrap();

    let mut mqd = MqdProcess::start_with_args(dir.path(), &args).unwrap();
    let client = Client::connect(mqd.url()).await.unwrap();
    let q = client.queue(Q).unwrap();
    let before = peek_all(&client, Q).await;
    assert_eq!(before, (1..=5).map(body).collect::<Vec<_>>());
    // The five recovered messages fill the quota: one more byte-sized send is refused.
    let e = q.send(recoverable(6)).await.unwrap_err();
    assert_quota(&e, &format!("{} of {quota} bytes used", 5 * CHARGE));

    // The CLI: exit 1, one stderr line naming the quota, nothing stored.
    let url = mqd.url().to_string();
    let out = tokio::task::block_in_place(|| {
        mq(&url, &["send", Q, "over the quota", "--recoverable"], None)
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "mq send over quota: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one stderr line: {stderr:?}");
    assert!(
        stderr.starts_with("mq: error: ") && stderr.contains("storage quota"),
        "{stderr}"
    );
    assert_eq!(peek_all(&client, Q).await, before, "nothing stored touched");

    // Receiving makes room again, for the library and the CLI.
    assert_eq!(
        q.receive(T).await.unwrap().unwrap().body.as_ref(),
        &body(1)[..]
    );
    let out =
        tokio::task::block_in_place(|| mq(&url, &["send", Q, "fits now", "--recoverable"], None));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_quota(&q.send(recoverable(7)).await.unwrap_err(), "storage quota");
    let status = mqd.terminate(STOP_TIMEOUT).unwrap();
    assert!(status.success(), "mqd after SIGTERM: {status}");

    // And after a graceful restart: the removal and the CLI's send were both kept.
    let mqd = MqdProcess::start_with_args(dir.path(), &args).unwrap();
    let client = Client::connect(mqd.url()).await.unwrap();
    let after = peek_all(&client, Q).await;
    assert_eq!(after.len(), 5);
    assert_eq!(after[..4], before[1..]);
    assert_eq!(after[4], b"fits now");
    assert_quota(
        &client
            .queue(Q)
            .unwrap()
            .send(recoverable(7))
            .await
            .unwrap_err(),
        "storage quota",
    );
}
