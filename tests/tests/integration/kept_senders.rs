//! `Queue::send` keeps the send stream it opened for a queue (the 8 queues sent to most
//! recently), so one message at a time is one round trip on an open stream: every message is
//! acknowledged and stored as before, concurrent calls share the stream, a refused message
//! leaves it usable, and a stream the broker ended (a restart) is replaced without losing the
//! next send.

use std::collections::HashSet;
use std::time::Duration;

use mq_client::{Message, QueueOptions};
use mq_tests::{create_default_queue, temp_data_dir, InProcessBroker, MqdProcess};

const WAIT: Duration = Duration::from_secs(10);

async fn drain(client: &mq_client::Client, q: &str) -> Vec<String> {
    let q = client.queue(q).unwrap();
    let mut got = Vec::new();
    while let Some(m) = q.receive(Duration::ZERO).await.unwrap() {
        got.push(String::from_utf8_lossy(&m.body).into_owned());
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_message_sends_keep_one_stream_per_queue() {
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    let names: Vec<String> = (0..10).map(|i| format!(r".\private$\kept{i}")).collect();
    for n in &names {
        create_default_queue(&client, n).await;
    }
    let q = client.queue(&names[0]).unwrap();
    let mut ids = HashSet::new();
    for i in 0..50 {
        let m = Message::new(format!("m{i}")).recoverable(i % 2 == 0);
        ids.insert(q.send(m).await.unwrap());
    }
    assert_eq!(ids.len(), 50, "every send has its own id");
    assert_eq!(
        client.one_shot_senders_opened(),
        1,
        "one stream for 50 sends"
    );
    // A clone shares the connection and its kept streams.
    let clone = client.clone();
    clone
        .queue(&names[0])
        .unwrap()
        .send(Message::new("m50"))
        .await
        .unwrap();
    assert_eq!(client.one_shot_senders_opened(), 1);
    let want: Vec<String> = (0..=50).map(|i| format!("m{i}")).collect();
    assert_eq!(drain(&client, &names[0]).await, want);

    // Eight queues are kept; a ninth and tenth replace the least recently used.
    for round in 0..3 {
        for n in &names[..8] {
            let q = client.queue(n).unwrap();
            q.send(Message::new(format!("r{round}"))).await.unwrap();
        }
    }
    assert_eq!(
        client.one_shot_senders_opened(),
        8,
        "queues 1..8 kept, 0 reopened"
    );
    for n in &names[8..] {
        client
            .queue(n)
            .unwrap()
            .send(Message::new("late"))
            .await
            .unwrap();
    }
    assert_eq!(client.one_shot_senders_opened(), 10);
    client
        .queue(&names[0])
        .unwrap()
        .send(Message::new("back"))
        .await
        .unwrap();
    assert_eq!(
        client.one_shot_senders_opened(),
        11,
        "queue 0 was the least recently used"
    );
    assert_eq!(drain(&client, &names[0]).await, ["r0", "r1", "r2", "back"]);
    assert_eq!(drain(&client, &names[9]).await, ["late"]);
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sends_share_the_kept_stream_and_a_refusal_leaves_it_usable() {
    const Q: &str = r".\private$\kept-shared";
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    // Room for the 322 small express messages (~390 B charged each), not for 200 KiB more.
    let opts = QueueOptions {
        quota_bytes: Some(256 << 10),
        ..QueueOptions::default()
    };
    client.create_queue(Q, opts).await.unwrap();
    let q = client.queue(Q).unwrap();
    q.send(Message::new("first")).await.unwrap();
    let mut tasks = Vec::new();
    for t in 0..8 {
        let q = q.clone();
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..40 {
                ids.push(q.send(Message::new(format!("t{t}-{i}"))).await.unwrap());
            }
            ids
        }));
    }
    let mut ids = HashSet::new();
    for t in tasks {
        ids.extend(t.await.unwrap());
    }
    assert_eq!(ids.len(), 320);
    assert_eq!(
        client.one_shot_senders_opened(),
        1,
        "the tasks shared one stream"
    );
    // Refused (over the queue quota): an error for this message only; the stream stays.
    let e = q
        .send(Message::new(vec![0u8; 200 << 10]))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("quota"), "{e}");
    q.send(Message::new("after")).await.unwrap();
    assert_eq!(client.one_shot_senders_opened(), 1);
    let got = drain(&client, Q).await;
    assert_eq!(got.len(), 322);
    assert_eq!((got[0].as_str(), got[321].as_str()), ("first", "after"));
    for t in 0..8 {
        let mine: Vec<&String> = got
            .iter()
            .filter(|b| b.starts_with(&format!("t{t}-")))
            .collect();
        let want: Vec<String> = (0..40).map(|i| format!("t{t}-{i}")).collect();
        assert_eq!(mine, want.iter().collect::<Vec<_>>(), "task {t}'s order");
    }
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_stream_the_broker_ended_is_replaced_and_the_next_send_is_stored() {
    const Q: &str = r".\private$\kept-restart";
    let dir = temp_data_dir("mq-kept-");
    let mut mqd = MqdProcess::launch(dir.path(), &[]);
    let addr = mqd.addr();
    let client = mqd.connect().await;
    create_default_queue(&client, Q).await;
    let q = client.queue(Q).unwrap();
    q.send(Message::new("before").recoverable(true))
        .await
        .unwrap();
    assert_eq!(client.one_shot_senders_opened(), 1);
    mqd.kill9().unwrap();
    let mqd = MqdProcess::launch_on(dir.path(), addr, &[]);
    // The same client reaches the new broker (its connection was re-established)...
    let back = mq_tests::eventually(WAIT, || async { client.queue_info(Q).await.is_ok() }).await;
    assert!(back, "the client did not reach the restarted broker");
    // ...and its next send goes on a new stream, not on the dead one.
    q.send(Message::new("after").recoverable(true))
        .await
        .unwrap();
    assert_eq!(client.one_shot_senders_opened(), 2);
    assert_eq!(drain(&client, Q).await, ["before", "after"]);
    drop(mqd);
}
