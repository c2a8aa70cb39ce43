//! A journal that refuses writes (poisoned by a failed `fdatasync`, injected with `FaultyIo`):
//! every operation that must write fails with a clear error and changes nothing (receive of
//! recoverable messages, a consumer's delivery and acknowledgement, purge, delete, a
//! transaction's commit, a transactional receive), and `mq` exits 1; reads (peek, info, list)
//! keep working, and a restart finds everything as it was.

use std::sync::Arc;
use std::time::Duration;

use mq_broker::journal::FaultyIo;
use mq_client::{Client, CommitOnce, ConsumerOptions, Error, Message, QueueOptions, TxOutcome};
use mq_tests::{create_default_queue, mq, InProcessBroker};

const Q: &str = r".\private$\poisoned";
const OTHER: &str = r".\private$\other";
const TXQ: &str = r".\private$\poisoned-tx";
const WAIT: Duration = Duration::from_secs(10);

async fn start(dir: &std::path::Path, io: &FaultyIo) -> InProcessBroker {
    let (dir, io) = (dir.to_path_buf(), io.clone());
    InProcessBroker::start_with(move |c| {
        c.data_dir = dir;
        c.journal_io = Some(Arc::new(io));
    })
    .await
}

#[track_caller]
fn assert_refused(what: &str, r: Result<impl std::fmt::Debug, Error>) {
    match r {
        Err(Error::Unavailable(m)) => assert!(
            m.contains("journal") && m.contains("restart"),
            "{what}: the error should name the journal and say to restart: {m}"
        ),
        other => {
            panic!("{what}: expected Error::Unavailable from the poisoned journal, got {other:?}")
        }
    }
}

async fn messages(client: &Client, q: &str) -> u64 {
    client.queue_info(q).await.unwrap().messages
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_journal_refuses_every_write_and_keeps_serving_reads() {
    let dir = mq_tests::temp_data_dir("mq-poison-");
    let io = FaultyIo::new(19);
    let broker = start(dir.path(), &io).await;
    let client = broker.client().await;
    create_default_queue(&client, Q).await;
    create_default_queue(&client, OTHER).await;
    let tx_opts = QueueOptions {
        transactional: true,
        ..QueueOptions::default()
    };
    client.create_queue(TXQ, tx_opts).await.unwrap();
    let q = client.queue(Q).unwrap();
    for i in 0..10 {
        q.send(Message::new(format!("m{i}")).recoverable(true))
            .await
            .unwrap();
    }
    let txq = client.queue(TXQ).unwrap();
    txq.send_tx(Message::new("t0")).await.unwrap();
    txq.send_tx(Message::new("t1")).await.unwrap();
    // A consumer: m0 acknowledged (by the second `next`), m1 delivered and unacknowledged.
    let mut held = q
        .consumer(ConsumerOptions {
            prefetch: 2,
            limit: Some(2),
        })
        .await
        .unwrap();
    held.next(WAIT).await.unwrap().expect("m0");
    held.next(WAIT).await.unwrap().expect("m1");
    // The acknowledgement of m0 travels on its own (m1 came from the prefetch buffer): wait
    // until the broker has applied it, or it may arrive after the poison and be refused too.
    assert!(
        mq_tests::eventually(WAIT, || async { messages(&client, Q).await == 9 }).await,
        "the broker never applied the acknowledgement of m0"
    );

    // Poison: the next sync fails, under a recoverable send.
    io.fail_sync_at(1);
    assert_refused(
        "the send whose sync failed",
        q.send(Message::new("lost").recoverable(true)).await,
    );
    assert!(broker.config().journal_io.is_some());

    // Every operation that must write fails, and takes nothing away.
    assert_refused("receive", q.receive(Duration::ZERO).await);
    let mut c = q.consumer(ConsumerOptions::default()).await.unwrap();
    assert_refused("a consumer's delivery", c.next(WAIT).await);
    held.ack().await.unwrap();
    assert_refused("a consumer's acknowledgement", held.next(WAIT).await);
    assert_refused("purge", client.purge(Q).await);
    assert_refused("delete", client.delete_queue(OTHER).await);
    client
        .queue_info(OTHER)
        .await
        .expect("a refused delete leaves the queue");
    assert_refused("transactional receive", txq.receive(Duration::ZERO).await);
    let mut tx = client.begin().await.unwrap();
    let got = tx.receive(TXQ, WAIT).await.unwrap();
    assert!(got.is_some(), "a transaction may still take a message");
    let e = tx.commit().await;
    assert!(
        !matches!(e, Err(Error::InDoubt { .. })),
        "the broker knows the commit failed: not in doubt: {e:?}"
    );
    assert_refused("commit", e);

    // Reads keep working, and show nothing was removed.
    let peeked = q.peek_many(100, Duration::ZERO).await.unwrap();
    let bodies: Vec<String> = peeked
        .iter()
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect();
    let want: Vec<String> = (1..10).map(|i| format!("m{i}")).collect();
    assert_eq!(bodies, want, "peek after the refusals");
    assert_eq!(messages(&client, Q).await, 9);
    assert_eq!(messages(&client, TXQ).await, 2);
    assert_eq!(client.list_queues().await.unwrap().len(), 3);

    // The command line: exit 1 with the reason, for receive and purge; peek works.
    for args in [vec!["receive", Q], vec!["queue", "purge", Q]] {
        let out = mq(broker.url(), &args, None);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "mq {args:?}: {err}");
        assert!(err.contains("journal refuses writes"), "mq {args:?}: {err}");
    }
    let out = mq(broker.url(), &["peek", Q, "--count", "3"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 3);

    drop((c, held));
    broker.stop().await.unwrap();
    // A restart (the disk works again) finds every message: nothing was acknowledged away.
    // (The send whose sync failed may or may not have reached the disk; it was not
    // acknowledged.)
    let broker = start(dir.path(), &io.restart()).await;
    let client = broker.client().await;
    let n = messages(&client, Q).await;
    assert!(n == 9 || n == 10, "{n} messages after the restart");
    assert_eq!(messages(&client, TXQ).await, 2);
    client.queue_info(OTHER).await.unwrap();
    broker.stop().await.unwrap();
}

/// A commit whose `fdatasync` fails with EIO: its record was written and may be on disk, so the
/// client gets `Error::InDoubt` (not a definite abort), `TransactionOutcome` answers unknown
/// (not aborted) until a restart, and after the restart it tells the truth: committed if the
/// record survived (a `kill -9` keeps the page cache), aborted if it did not (a power loss),
/// and a retry through `commit_once` commits exactly once either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_sync_fails_is_in_doubt_until_a_restart_tells() {
    for survives in [true, false] {
        let dir = mq_tests::temp_data_dir("mq-poison-commit-");
        let io = FaultyIo::new(23);
        let broker = start(dir.path(), &io).await;
        let client = broker.client().await;
        let tx_opts = QueueOptions {
            transactional: true,
            ..QueueOptions::default()
        };
        client.create_queue(TXQ, tx_opts).await.unwrap();
        let mut tx = client.begin().await.unwrap();
        let id = tx.id();
        tx.send(TXQ, Message::new("once")).unwrap();
        io.fail_sync_at(1);
        match tx.commit().await {
            Err(Error::InDoubt { id: got, reason }) => {
                assert_eq!(got, id);
                assert!(reason.contains("journal"), "{reason}");
            }
            other => panic!("a commit whose fdatasync failed is in doubt, got {other:?}"),
        }
        let o = client.transaction_outcome(id).await.unwrap();
        assert_eq!(
            o.outcome,
            TxOutcome::Unknown,
            "before the restart nobody knows: {}",
            o.detail
        );
        // A retry on this broker cannot commit it a second time.
        assert!(
            client.begin_with_id(id).await.is_err() || {
                let mut t = client.begin_with_id(id).await.unwrap();
                t.send(TXQ, Message::new("once")).unwrap();
                t.commit().await.is_err()
            }
        );
        broker.stop().await.unwrap();

        let disk = if survives {
            io.restart_after_kill()
        } else {
            io.restart()
        };
        let broker = start(dir.path(), &disk).await;
        let client = broker.client().await;
        let o = client.transaction_outcome(id).await.unwrap();
        let stored = messages(&client, TXQ).await;
        let want = if survives {
            TxOutcome::Committed
        } else {
            TxOutcome::Aborted
        };
        assert_eq!(o.outcome, want, "after the restart: {}", o.detail);
        assert_eq!(stored, u64::from(survives), "messages after the restart");
        let r = client
            .commit_once(id, 3, |mut t| async move {
                t.send(TXQ, Message::new("once"))?;
                Ok(t)
            })
            .await
            .unwrap();
        assert_eq!(
            matches!(r, CommitOnce::AlreadyCommitted),
            survives,
            "commit_once after the restart: {r:?}"
        );
        assert_eq!(messages(&client, TXQ).await, 1, "exactly once");
        broker.stop().await.unwrap();
    }
}
