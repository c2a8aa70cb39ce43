//! Queues that page their headers (`mqd --queue-header-window 4`): recoverable messages past
//! each priority level's window keep only their position in memory and are read back from the
//! journal. Priority and FIFO order across the window's edge, lookups by id and correlation id
//! and cursors over paged messages, expiry of a paged message, and all of it after `kill -9`
//! with a paged backlog.
//!
//! Every wait is bounded and polls a condition; nothing sleeps a fixed time.

use std::time::Duration;

use mq_client::{Client, Message, SenderOptions};
use mq_tests::{drain_queue, eventually, send_with_receipts, temp_data_dir, MqdProcess};

const WAIT: Duration = Duration::from_secs(20);
const WINDOW: &[&str] = &["--queue-header-window", "4"];

fn bodies(ms: &[mq_client::ReceivedMessage]) -> Vec<String> {
    ms.iter()
        .map(|m| String::from_utf8(m.body.to_vec()).unwrap())
        .collect()
}

/// 48 recoverable messages at scrambled priorities ((i * 5) % 8 visits each priority six
/// times), so every level has 4 in its window and 2 paged; each with a correlation id.
async fn fill(client: &Client, q: &str) -> (Vec<String>, Vec<uuid::Uuid>) {
    let sent: Vec<(u8, String)> = (0..48u32)
        .map(|i| (((i * 5) % 8) as u8, format!("p{}-{i}", (i * 5) % 8)))
        .collect();
    let sender = client.sender(q, SenderOptions::default()).await.unwrap();
    let ids = send_with_receipts(
        &sender,
        sent.iter().map(|(p, body)| {
            Message::new(body.clone())
                .priority(*p)
                .correlation_id(format!("c-{body}"))
                .recoverable(true)
        }),
    )
    .await;
    sender.close().await.unwrap();
    let mut want = sent.clone();
    // Highest priority first, FIFO within a priority (a stable sort keeps send order).
    want.sort_by_key(|(p, _)| std::cmp::Reverse(*p));
    (want.into_iter().map(|(_, b)| b).collect(), ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paged_backlog_keeps_order_lookups_and_expiry_across_kill9() {
    const Q: &str = r".\private$\paged";
    let dir = temp_data_dir("mq-paged-");
    let (mut mqd, client) = MqdProcess::launch_with_queue(dir.path(), WINDOW, Q).await;
    let (want, ids) = fill(&client, Q).await;
    let q = client.queue(Q).unwrap();
    let peeked = q.peek_many(100, Duration::from_secs(2)).await.unwrap();
    assert_eq!(bodies(&peeked), want, "order with paged tails");
    // Message 40 has priority 0 and is the last of its level: paged.
    let m = q.peek_by_id(ids[40], Duration::ZERO).await.unwrap();
    assert_eq!(m.map(|m| m.body.to_vec()), Some(b"p0-40".to_vec()));

    // A paged message that expires: the sweep reads its header and takes it out on time.
    let short = q
        .send(
            Message::new("short-lived")
                .priority(0)
                .time_to_be_received(Duration::from_millis(300))
                .recoverable(true),
        )
        .await
        .unwrap();
    assert!(
        eventually(WAIT, || async {
            matches!(
                q.peek_by_id(short, Duration::ZERO).await,
                Err(mq_client::Error::NotFound(_))
            ) && client.queue_info(Q).await.unwrap().messages == 48
        })
        .await,
        "the paged message expired and left the queue"
    );

    drop(q);
    drop(client);
    mqd.kill9_checked();
    let mqd = MqdProcess::launch(dir.path(), WINDOW);
    let client = mqd.connect().await;
    let q = client.queue(Q).unwrap();
    let peeked = q.peek_many(100, Duration::from_secs(2)).await.unwrap();
    assert_eq!(
        bodies(&peeked),
        want,
        "order after kill -9, recovered into paged tails"
    );
    // By id and by correlation id, paged after recovery (priority 0: 40 and 32 are its last).
    let m = q.receive_by_id(ids[40], Duration::ZERO).await.unwrap();
    assert_eq!(m.map(|m| m.body.to_vec()), Some(b"p0-40".to_vec()));
    let m = q
        .receive_by_correlation_id("c-p0-32", Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(m.map(|m| m.body.to_vec()), Some(b"p0-32".to_vec()));
    // The rest, in order, each once.
    let rest: Vec<String> = drain_queue(&client, Q, WAIT)
        .await
        .into_iter()
        .map(|b| String::from_utf8(b.to_vec()).unwrap())
        .collect();
    let left: Vec<String> = want
        .iter()
        .filter(|b| *b != "p0-40" && *b != "p0-32")
        .cloned()
        .collect();
    assert_eq!(rest, left, "received in order");
}
