//! Administrative changes answer only once they are durable, and are in force only once they
//! are (issue 19, review m10 and M3), on in-process brokers whose journal runs on `FaultyIo`:
//! - a purge answers only after the removal of what it purged is on disk (a power loss after
//!   the answer does not bring the messages back);
//! - with a journal that refuses writes, a refused ACL grant, queue property change, pause or
//!   resume of an outgoing queue, or queue deletion leaves things as they were.

use std::sync::Arc;
use std::time::Duration;

use mq_broker::journal::FaultyIo;
use mq_client::{Message, OutgoingState, QueueProperties};
use mq_tests::{create_default_queue, eventually, InProcessBroker};

const Q: &str = r".\private$\durable-admin";
const WAIT: Duration = Duration::from_secs(20);

async fn start(dir: &std::path::Path, io: &FaultyIo) -> InProcessBroker {
    let (dir, io) = (dir.to_path_buf(), io.clone());
    InProcessBroker::start_with(move |c| {
        c.data_dir = dir;
        c.journal_io = Some(Arc::new(io));
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_answers_only_once_its_removals_are_on_disk() {
    let dir = mq_tests::temp_data_dir("mq-durable-purge-");
    let io = FaultyIo::new(31);
    let broker = start(dir.path(), &io).await;
    let client = broker.client().await;
    create_default_queue(&client, Q).await;
    let q = client.queue(Q).unwrap();
    for i in 0..5 {
        q.send(Message::new(format!("m{i}")).recoverable(true))
            .await
            .unwrap();
    }
    // Hold the journal inside its fdatasync: the purge's removal is written, not yet durable.
    io.pause_syncs(true);
    let c = client.clone();
    let mut purge = tokio::spawn(async move { c.purge(Q).await });
    assert!(
        eventually(WAIT, || async { io.sync_held() }).await,
        "the purge's removal reaches the journal"
    );
    // A power loss now would bring the messages back: the purge must not have answered.
    let early = tokio::time::timeout(Duration::from_secs(1), &mut purge).await;
    // Let the journal go on before checking (a failed check must not leave it held).
    io.pause_syncs(false);
    assert!(
        early.is_err(),
        "purge answered before its removal was on disk: {early:?}"
    );
    let purged = tokio::time::timeout(WAIT, purge)
        .await
        .expect("the purge answers once the sync is done")
        .unwrap()
        .unwrap();
    assert_eq!(purged, 5);
    broker.stop().await.unwrap();
    // A power loss right after the answer: what the purge removed stays removed.
    let broker = start(dir.path(), &io.restart()).await;
    let client = broker.client().await;
    assert_eq!(client.queue_info(Q).await.unwrap().messages, 0);
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definition_changes_the_journal_refuses_are_not_in_force() {
    let dir = mq_tests::temp_data_dir("mq-durable-acl-");
    let io = FaultyIo::new(37);
    let broker = start(dir.path(), &io).await;
    let client = broker.client().await;
    create_default_queue(&client, Q).await;
    client.grant(Q, "bob", &["peek"]).await.unwrap();
    // An outgoing queue (its destination is down: the messages wait).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let remote = format!(r"DIRECT=TCP:127.0.0.1:{port}\private$\r");
    let dest = format!("127.0.0.1:{port}");
    client
        .queue(&remote)
        .unwrap()
        .send(Message::new("away").recoverable(true))
        .await
        .unwrap();
    let before_acl = client.acl(Q).await.unwrap();
    let before_label = client.queue_info(Q).await.unwrap().label;

    // Poison the journal: a failed fdatasync under a recoverable send.
    io.fail_sync_at(1);
    let q = client.queue(Q).unwrap();
    q.send(Message::new("lost").recoverable(true))
        .await
        .unwrap_err();

    client
        .grant(Q, "alice", &["send", "receive"])
        .await
        .expect_err("a grant the journal refuses fails");
    client
        .revoke(Q, "bob", &["peek"])
        .await
        .expect_err("a revoke the journal refuses fails");
    assert_eq!(
        client.acl(Q).await.unwrap(),
        before_acl,
        "a refused ACL change is not in force"
    );
    let mut props = QueueProperties::default();
    props.label = Some("changed".into());
    client
        .set_queue_properties(Q, props)
        .await
        .expect_err("a property change the journal refuses fails");
    assert_eq!(
        client.queue_info(Q).await.unwrap().label,
        before_label,
        "a refused label change is not in force"
    );
    client
        .pause_outgoing(&dest)
        .await
        .expect_err("a pause the journal refuses fails");
    let o = client.outgoing().await.unwrap();
    let o = o.iter().find(|o| o.destination == dest).expect("listed");
    assert_ne!(
        o.state,
        OutgoingState::OnHold,
        "a refused pause is not in force"
    );
    client
        .delete_queue(Q)
        .await
        .expect_err("a deletion the journal refuses fails");
    client
        .queue_info(Q)
        .await
        .expect("a refused deletion leaves the queue");
    broker.stop().await.unwrap();
}
