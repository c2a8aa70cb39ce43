//! Recoverable messages when the journal's disk fails, on in-process brokers whose journal runs
//! on `FaultyIo` (in-memory storage that fails or "crashes" on request):
//! - a failed `fdatasync` fails the sends of its batch with `Error::Unavailable`, poisons the
//!   journal (every later recoverable send fails, with no further sync: no silent retry),
//!   leaves express sends working, and a restart recovers every acknowledged send, in order,
//!   exactly once;
//! - ENOSPC while preallocating a new segment refuses sends with RESOURCE_EXHAUSTED without
//!   poisoning: receives keep working, sends work again by themselves once space is back, and
//!   nothing acknowledged is lost;
//! - a crash at the Nth sync, for several N: every acknowledged receipt's message survives the
//!   restart, in order, without duplicates, and so does the queue definition.
//!
//! Every wait is bounded; nothing sleeps a fixed time.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use mq_broker::journal::FaultyIo;
use mq_client::{Client, Delivery, Error, Message, QueueOptions, SenderOptions};
use mq_tests::{create_default_queue, InProcessBroker};

const Q: &str = r".\private$\faults";
const WAIT: Duration = Duration::from_secs(10);

fn data_dir() -> tempfile::TempDir {
    mq_tests::temp_data_dir("mq-faults-")
}

/// A broker on `dir` whose journal lives on `io` (FaultyIo ignores the path; the directory
/// still holds the LOCK file, and is the same across restarts as with a real disk).
async fn start(dir: &Path, io: &FaultyIo, segment_bytes: Option<u64>) -> InProcessBroker {
    let io = io.clone();
    InProcessBroker::start_with(move |c| {
        c.data_dir = dir.to_path_buf();
        c.journal_io = Some(Arc::new(io));
        if let Some(s) = segment_bytes {
            c.journal_segment_bytes = s;
        }
    })
    .await
}

/// A body of `len` bytes that starts with the number `n` and a dash.
fn body(n: u64, len: usize) -> Vec<u8> {
    let mut b = format!("{n}-").into_bytes();
    b.resize(len.max(b.len()), b'x');
    b
}

fn number(b: &[u8]) -> u64 {
    let s = String::from_utf8_lossy(b);
    s.split_once('-')
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected body {s:?}"))
}

/// Receives everything the queue holds and returns the numbers of the bodies.
async fn receive_all(client: &Client) -> Vec<u64> {
    mq_tests::drain_queue(client, Q, WAIT)
        .await
        .iter()
        .map(|b| number(b))
        .collect()
}

/// Asserts `got` starts with exactly `1..=acked` (in order), and that what follows is a set of
/// distinct unacknowledged numbers from `extra` (a send that failed may or may not have
/// reached the disk; the client was not told it did).
fn assert_acked_prefix(got: &[u64], acked: u64, extra: std::ops::RangeInclusive<u64>, what: &str) {
    assert!(
        got.len() as u64 >= acked,
        "{what}: lost acknowledged messages: {acked} acknowledged, {} recovered: {got:?}",
        got.len()
    );
    let want: Vec<u64> = (1..=acked).collect();
    assert_eq!(
        &got[..acked as usize],
        &want[..],
        "{what}: acknowledged messages not all there in order"
    );
    let rest = &got[acked as usize..];
    let unique: HashSet<_> = got.iter().collect();
    assert_eq!(unique.len(), got.len(), "{what}: duplicates in {got:?}");
    assert!(
        rest.iter().all(|n| extra.contains(n)),
        "{what}: unexpected messages after the acknowledged ones: {rest:?}"
    );
}

fn assert_unavailable_restart(e: &Error, what: &str) -> String {
    let Error::Unavailable(msg) = e else {
        panic!("{what}: expected Error::Unavailable, got {e:?}");
    };
    assert!(
        msg.contains("journal") && msg.contains("restart"),
        "{what}: the error should name the journal and say to restart: {msg}"
    );
    msg.clone()
}

// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fdatasync_poisons_the_journal_until_restart() {
    let dir = data_dir();
    let faulty = FaultyIo::new(7);
    let broker = start(dir.path(), &faulty, None).await;
    let client = broker.client().await;
    create_default_queue(&client, Q).await;
    let q = client.queue(Q).unwrap();
    const ACKED: u64 = 20;
    for i in 1..=ACKED {
        q.send(Message::new(body(i, 100)).recoverable(true))
            .await
            .unwrap();
    }

    // The next sync fails with EIO. Several sends in flight at once: those in the failed batch
    // get the I/O error, any later one the "poisoned" refusal; all of them fail.
    faulty.fail_sync_at(1);
    let sends = (ACKED + 1..=ACKED + 10).map(|i| {
        let q = q.clone();
        async move { q.send(Message::new(body(i, 100)).recoverable(true)).await }
    });
    let results = futures::future::join_all(sends).await;
    let mut texts = Vec::new();
    for (i, r) in results.iter().enumerate() {
        let e = r
            .as_ref()
            .expect_err("a send in or after the batch whose fdatasync failed");
        texts.push(assert_unavailable_restart(
            e,
            &format!("concurrent send {i}"),
        ));
    }
    assert!(
        texts
            .iter()
            .any(|t| t.contains("fdatasync") && t.contains("could not store")),
        "at least the batch that hit the failed sync reports the fdatasync failure: {texts:#?}"
    );
    let syncs_after_failure = faulty.syncs();

    // Poisoned: every later recoverable send fails at once, without touching the disk.
    for i in 0..5 {
        let e = q
            .send(Message::new(body(1000 + i, 100)).recoverable(true))
            .await
            .expect_err("a recoverable send after a failed fdatasync");
        let t = assert_unavailable_restart(&e, "send after the failure");
        assert!(
            t.contains("refuses writes") && t.contains("poisoned") && t.contains("fdatasync"),
            "the later refusal says the journal refuses writes and why: {t}"
        );
    }
    assert_eq!(
        faulty.syncs(),
        syncs_after_failure,
        "no sync was retried or issued after the failure"
    );
    // Creating a queue needs the journal too.
    let e = client
        .create_queue(r".\private$\later", QueueOptions::default())
        .await
        .expect_err("a queue definition cannot be stored either");
    assert!(e.to_string().contains("journal"), "{e}");
    // Express sends do not touch the journal and still work; the broker still serves.
    q.send(Message::new(body(5000, 10)).delivery(Delivery::Express))
        .await
        .unwrap();
    assert_eq!(q.info().await.unwrap().messages, ACKED + 1);
    let first = q.peek(WAIT).await.unwrap().expect("a message to peek");
    assert_eq!(number(&first.body), 1, "bodies still readable");
    assert!(!broker.has_stopped());
    broker.stop().await.unwrap();

    // Power loss now, then a new broker on what the disk kept.
    let faulty = faulty.restart();
    let broker = start(dir.path(), &faulty, None).await;
    let client = broker.client().await;
    let got = receive_all(&client).await;
    assert_acked_prefix(&got, ACKED, ACKED + 1..=ACKED + 10, "after restart");
    // The restarted journal takes writes again.
    client
        .queue(Q)
        .unwrap()
        .send(Message::new(body(1, 10)).recoverable(true))
        .await
        .unwrap();
    broker.stop().await.unwrap();
}

// ---------------------------------------------------------------------------------------------

/// Asserts a send was refused for a full disk: RESOURCE_EXHAUSTED, saying so, no restart.
fn assert_disk_full(e: &Error, what: &str) -> String {
    let Error::QuotaExceeded(msg) = e else {
        panic!("{what}: expected Error::QuotaExceeded (RESOURCE_EXHAUSTED), got {e:?}");
    };
    assert!(
        msg.contains("disk is full") && !msg.contains("poisoned"),
        "{what}: the error should say the disk is full: {msg}"
    );
    msg.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enospc_preallocating_a_segment_refuses_sends_keeps_receives_and_recovers_by_itself() {
    const SEGMENT: u64 = 65536;
    let dir = data_dir();
    let faulty = FaultyIo::new(11);
    let broker = start(dir.path(), &faulty, Some(SEGMENT)).await;
    let client = broker.client().await;
    create_default_queue(&client, Q).await;
    let q = client.queue(Q).unwrap();
    // The first segment exists; the next one cannot be preallocated.
    faulty.fail_preallocate_with_enospc(true);
    let segments_before = faulty.segments().len();
    let mut acked = 0u64;
    let err = loop {
        let n = acked + 1;
        assert!(
            n <= 200,
            "200 KB of sends never needed a new 64 KiB segment"
        );
        match q.send(Message::new(body(n, 1000)).recoverable(true)).await {
            Ok(_) => acked += 1,
            Err(e) => break e,
        }
    };
    assert!(acked > 30, "only {acked} sends fitted in a 64 KiB segment");
    let t = assert_disk_full(&err, "the send that needed a new segment");
    assert!(t.contains("preallocate"), "names the cause: {t}");
    assert_eq!(
        faulty.segments().len(),
        segments_before,
        "the segment that could not be preallocated was removed"
    );
    // Still refused (not poisoned), and said so.
    let e = q
        .send(Message::new(body(9999, 10)).recoverable(true))
        .await
        .expect_err("a send while the disk is full");
    assert_disk_full(&e, "send while the disk is full");
    // Receives keep working: take the first 3.
    for want in 1..=3 {
        let m = q.receive(WAIT).await.unwrap().expect("a message");
        assert_eq!(number(&m.body), want);
    }
    assert_eq!(q.info().await.unwrap().messages, acked - 3);
    // Space comes back: sends work again by themselves, no restart.
    faulty.fail_preallocate_with_enospc(false);
    let deadline = std::time::Instant::now() + WAIT;
    let mut n = acked + 1;
    loop {
        match q.send(Message::new(body(n, 1000)).recoverable(true)).await {
            Ok(_) => break,
            Err(e) => {
                assert_disk_full(&e, "send before the journal noticed the space");
                assert!(
                    std::time::Instant::now() < deadline,
                    "space came back, sends still refused"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    for i in acked + 2..=acked + 100 {
        q.send(Message::new(body(i, 1000)).recoverable(true))
            .await
            .unwrap();
    }
    n += 99;
    broker.stop().await.unwrap();

    // Everything acknowledged and not received is there, and nothing refused.
    let faulty = faulty.restart();
    let broker = start(dir.path(), &faulty, Some(SEGMENT)).await;
    let client = broker.client().await;
    let got = receive_all(&client).await;
    assert_eq!(
        got,
        (4..=n).collect::<Vec<_>>(),
        "exactly the acknowledged sends minus the received ones (the refused ones never reached the disk)"
    );
    broker.stop().await.unwrap();
}

/// A pipelined sender whose batches are group-committed together when the new segment cannot
/// be preallocated: the records of a batch that were synced into the old segment are
/// acknowledged, the rest are refused, and after a restart the queue holds exactly the
/// acknowledged ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enospc_under_pipelined_sends_keeps_nothing_unacknowledged() {
    const SEGMENT: u64 = 65536;
    const N: u64 = 200;
    let dir = data_dir();
    let faulty = FaultyIo::new(13);
    let broker = start(dir.path(), &faulty, Some(SEGMENT)).await;
    let client = broker.client().await;
    create_default_queue(&client, Q).await;
    faulty.fail_preallocate_with_enospc(true);
    let (acked, failed, first_err) = pipelined_send(&client, N, 1000).await;
    assert!(failed > 0, "all {N} KB fitted in one 64 KiB segment");
    assert_disk_full(
        first_err.as_ref().unwrap(),
        "the first refused pipelined send",
    );
    broker.stop().await.unwrap();

    let faulty = faulty.restart();
    let broker = start(dir.path(), &faulty, Some(SEGMENT)).await;
    let client = broker.client().await;
    let got = receive_all(&client).await;
    assert_acked_prefix(&got, acked, acked + 1..=N, "after ENOSPC");
    assert_eq!(
        got.len() as u64,
        acked,
        "{} refused sends were recovered: {:?}",
        got.len() as u64 - acked,
        &got[acked as usize..]
    );
    broker.stop().await.unwrap();
}

// ---------------------------------------------------------------------------------------------

/// Sends `1..=n` through one pipelined sender with receipts (small batches, so there are many
/// syncs). Returns (acknowledged, failed, first error); asserts that the acknowledged ones are
/// exactly a prefix.
async fn pipelined_send(client: &Client, n: u64, len: usize) -> (u64, u64, Option<Error>) {
    let sender = client
        .sender(
            Q,
            SenderOptions {
                transactional: false,
                window_messages: 32,
                window_bytes: 0,
                max_batch_messages: 4,
                max_batch_bytes: 64 * 1024,
            },
        )
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let producer = tokio::spawn(async move {
        for i in 1..=n {
            match sender
                .send_with_receipt(Message::new(body(i, len)).recoverable(true))
                .await
            {
                Ok(r) => {
                    if tx.send(r).is_err() {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        let _ = sender.close().await;
    });
    let (mut acked, mut failed, mut first_err) = (0u64, 0u64, None);
    while let Some(receipt) = rx.recv().await {
        let r = tokio::time::timeout(WAIT, receipt)
            .await
            .unwrap_or_else(|_| panic!("receipt {} did not resolve", acked + failed + 1));
        match r {
            Ok(_) => {
                assert_eq!(
                    failed,
                    0,
                    "receipt {} resolved Ok after an earlier one failed",
                    acked + failed + 1
                );
                acked += 1;
            }
            Err(e) => {
                failed += 1;
                first_err.get_or_insert(e);
            }
        }
    }
    tokio::time::timeout(WAIT, producer)
        .await
        .expect("the producer finishes")
        .unwrap();
    assert_eq!(acked + failed, n, "every send got an answer");
    (acked, failed, first_err)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_the_nth_sync_keeps_every_acknowledged_send() {
    const N: u64 = 300;
    for (round, crash_at) in [1u64, 2, 3, 4, 6, 8, 10, 12].into_iter().enumerate() {
        let what = format!("crash at sync {crash_at}");
        let dir = data_dir();
        let faulty = FaultyIo::new(1000 + round as u64);
        // Small segments: the 300 × ~600 B cross several, so some crashes hit a roll.
        let broker = start(dir.path(), &faulty, Some(65536)).await;
        let client = broker.client().await;
        client
            .create_queue(
                Q,
                QueueOptions {
                    quota_bytes: Some(10_000_000),
                    label: "survives".into(),
                    ..QueueOptions::default()
                },
            )
            .await
            .unwrap();
        let before = client.queue_info(Q).await.unwrap();
        faulty.crash_at_sync(crash_at);
        let (acked, failed, first_err) = pipelined_send(&client, N, 600).await;
        assert!(faulty.crashed(), "{what}: the crash did not happen");
        assert!(failed > 0, "{what}: nothing failed after the crash");
        assert_unavailable_restart(first_err.as_ref().unwrap(), &what);
        broker.stop().await.unwrap();

        let faulty = faulty.restart();
        let broker = start(dir.path(), &faulty, Some(65536)).await;
        let client = broker.client().await;
        let after = client
            .queue_info(Q)
            .await
            .unwrap_or_else(|e| panic!("{what}: the queue definition is gone: {e}"));
        assert_eq!(
            (
                &after.name,
                after.quota_bytes,
                &after.label,
                after.created_ms
            ),
            (
                &before.name,
                before.quota_bytes,
                &before.label,
                before.created_ms
            ),
            "{what}: the queue definition changed"
        );
        let got = receive_all(&client).await;
        assert_acked_prefix(&got, acked, acked + 1..=N, &what);
        eprintln!(
            "{what}: {acked} acknowledged, {failed} failed, {} recovered",
            got.len()
        );
        broker.stop().await.unwrap();
    }
}
