//! Transactional queues against in-process brokers: atomicity and isolation (staged sends are
//! invisible until commit, received messages hidden until commit or abort, abort puts them back
//! at the head in order with their abort count incremented, dropping a transaction aborts it);
//! the rules (transactional queues take only transactional sends and the others only
//! non-transactional ones, client and CLI; priority ignored; a bad staged send fails the whole
//! commit; the broker's transaction timeout; a vanished client aborts); exactly once under
//! concurrent, randomly aborting receivers.
//!
//! Every wait is bounded and polls a condition; nothing sleeps a fixed time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use mq_client::{
    Client, ConsumerOptions, Error, Message, QueueOptions, ReceivedMessage, SenderOptions,
    Transaction,
};
use mq_tests::{eventually, mq, InProcessBroker};

const WAIT: Duration = Duration::from_secs(10);
/// How long a receive waits when nothing is expected.
const SHORT: Duration = Duration::from_millis(50);

async fn create(client: &Client, name: &str, transactional: bool) {
    client
        .create_queue(
            name,
            QueueOptions {
                transactional,
                ..QueueOptions::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
}

fn text(m: &ReceivedMessage) -> String {
    String::from_utf8_lossy(&m.body).into_owned()
}

/// Sends `bodies` to a transactional queue, each its own committed single-message transaction.
async fn fill(client: &Client, queue: &str, bodies: &[&str]) {
    let sender = client
        .sender(
            queue,
            SenderOptions {
                transactional: true,
                ..SenderOptions::default()
            },
        )
        .await
        .unwrap();
    for b in bodies {
        sender.send(Message::new(b.to_string())).await.unwrap();
    }
    let s = sender.close().await.unwrap();
    assert_eq!(s.acknowledged, bodies.len() as u64);
}

/// The bodies and abort counts at the head of `queue`, not removed.
async fn peek_all(client: &Client, queue: &str) -> Vec<(String, u32)> {
    mq_tests::peek_bodies_and_aborts(client, queue).await
}

fn pairs(v: &[(&str, u32)]) -> Vec<(String, u32)> {
    v.iter().map(|(b, n)| (b.to_string(), *n)).collect()
}

/// Waits (at most [`WAIT`]) until [`peek_all`] of `queue` gives `want`; panics with `what` and
/// what the queue holds if it does not.
async fn wait_for_peek(client: &Client, queue: &str, want: &[(&str, u32)], what: &str) {
    let want = pairs(want);
    let ok = eventually(WAIT, || async { peek_all(client, queue).await == want }).await;
    assert!(ok, "{what}: {:?}", peek_all(client, queue).await);
}

/// A round trip on the transaction's stream: every staged send before it has been processed by
/// the broker once this returns (the stream is handled in order). `empty` is an empty
/// transactional queue.
async fn sync(tx: &mut Transaction, empty: &str) {
    let r = tx.receive(empty, Duration::ZERO).await.unwrap();
    assert!(r.is_none(), "{empty} should be empty");
}

/// Runs the `mq` command line off the runtime's worker threads.
async fn mq_cli(url: &str, args: &[&str]) -> std::process::Output {
    let url = url.to_string();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        mq(&url, &a, None)
    })
    .await
    .unwrap()
}

fn assert_refused(what: &str, e: &Error, needles: &[&str]) {
    assert!(
        matches!(e, Error::FailedPrecondition(_)),
        "{what}: expected FailedPrecondition, got {e:?}"
    );
    let s = e.to_string();
    for n in needles {
        assert!(s.contains(n), "{what}: error {s:?} does not say {n:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Atomicity and isolation

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_sends_are_invisible_until_commit_then_all_appear_in_order() {
    const A: &str = r".\private$\a";
    const B: &str = r".\private$\b";
    const EMPTY: &str = r".\private$\empty";
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    for q in [A, B, EMPTY] {
        create(&client, q, true).await;
    }
    let other = broker.client().await;

    let mut tx = client.begin().await.unwrap();
    for (q, b) in [(A, "a1"), (B, "b1"), (A, "a2"), (A, "a3"), (B, "b2")] {
        tx.send(q, Message::new(b).label(b)).unwrap();
    }
    sync(&mut tx, EMPTY).await;
    for q in [A, B] {
        let info = other.queue_info(q).await.unwrap();
        assert_eq!((info.messages, info.in_flight), (0, 0), "{q} before commit");
        let got = other.queue(q).unwrap().receive(SHORT).await.unwrap();
        assert!(got.is_none(), "{q} delivered {got:?} before the commit");
        assert!(other.queue(q).unwrap().peek(SHORT).await.unwrap().is_none());
    }
    let ids = tx.commit().await.unwrap();
    assert_eq!(ids.len(), 5, "one id per message sent");

    assert_eq!(other.queue_info(A).await.unwrap().messages, 3);
    assert_eq!(other.queue_info(B).await.unwrap().messages, 2);
    let mut got_ids = Vec::new();
    for (q, want) in [(A, ["a1", "a2", "a3"].as_slice()), (B, &["b1", "b2"])] {
        for w in want {
            let m = other
                .queue(q)
                .unwrap()
                .receive(WAIT)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(text(&m), *w, "{q} order");
            assert_eq!(m.label, *w);
            assert_eq!(m.abort_count, 0);
            got_ids.push((text(&m), m.id));
        }
    }
    // The ids come back in send order: a1 b1 a2 a3 b2.
    let by_body: BTreeMap<_, _> = got_ids.into_iter().collect();
    let want: Vec<_> = ["a1", "b1", "a2", "a3", "b2"]
        .iter()
        .map(|b| by_body[*b])
        .collect();
    assert_eq!(ids, want, "commit ids are in send order");
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn received_messages_are_hidden_until_commit_or_abort() {
    const Q: &str = r".\private$\q";
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    create(&client, Q, true).await;
    let other = broker.client().await;
    let oq = other.queue(Q).unwrap();

    // Commit: hidden, then gone.
    fill(&client, Q, &["only"]).await;
    let mut tx = client.begin().await.unwrap();
    let m = tx.receive(Q, WAIT).await.unwrap().unwrap();
    assert_eq!((text(&m).as_str(), m.abort_count), ("only", 0));
    assert!(oq.receive(SHORT).await.unwrap().is_none(), "not hidden");
    assert!(
        oq.peek(SHORT).await.unwrap().is_none(),
        "not hidden from peek"
    );
    let info = other.queue_info(Q).await.unwrap();
    assert_eq!((info.messages, info.in_flight), (1, 1), "{info:?}");
    assert!(tx.commit().await.unwrap().is_empty());
    assert!(
        oq.receive(SHORT).await.unwrap().is_none(),
        "back after commit"
    );
    let info = other.queue_info(Q).await.unwrap();
    assert_eq!((info.messages, info.in_flight), (0, 0), "{info:?}");

    // Abort: three received in one transaction go back ahead of the fourth, in order.
    fill(&client, Q, &["1", "2", "3", "4"]).await;
    let mut tx = client.begin().await.unwrap();
    for want in ["1", "2", "3"] {
        let m = tx.receive(Q, WAIT).await.unwrap().unwrap();
        assert_eq!(text(&m), want);
    }
    assert_eq!(peek_all(&other, Q).await, pairs(&[("4", 0)]));
    tx.abort().await.unwrap();
    assert_eq!(
        peek_all(&other, Q).await,
        pairs(&[("1", 1), ("2", 1), ("3", 1), ("4", 0)]),
        "abort puts them back at the head, in order, abort count incremented"
    );

    // Abort again (two of them): the count goes on.
    let mut tx = client.begin().await.unwrap();
    let m = tx.receive(Q, WAIT).await.unwrap().unwrap();
    assert_eq!((text(&m).as_str(), m.abort_count), ("1", 1));
    let m = tx.receive(Q, WAIT).await.unwrap().unwrap();
    assert_eq!((text(&m).as_str(), m.abort_count), ("2", 1));
    tx.abort().await.unwrap();
    assert_eq!(
        peek_all(&other, Q).await,
        pairs(&[("1", 2), ("2", 2), ("3", 1), ("4", 0)])
    );

    // Dropping an uncommitted transaction aborts it.
    let mut tx = client.begin().await.unwrap();
    let m = tx.receive(Q, WAIT).await.unwrap().unwrap();
    assert_eq!(text(&m), "1");
    tx.send(Q, Message::new("staged, then dropped")).unwrap();
    drop(tx);
    wait_for_peek(
        &other,
        Q,
        &[("1", 3), ("2", 2), ("3", 1), ("4", 0)],
        "a dropped transaction did not give its message back",
    )
    .await;
    assert_eq!(other.queue_info(Q).await.unwrap().messages, 4);
    broker.stop().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// 2. Rules

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_mismatches_are_refused_with_reasons() {
    const TXQ: &str = r".\private$\txq";
    const PLAIN: &str = r".\private$\plain";
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    create(&client, TXQ, true).await;
    create(&client, PLAIN, false).await;

    // A non-transactional send to a transactional queue.
    let e = client
        .queue(TXQ)
        .unwrap()
        .send(Message::new("x"))
        .await
        .unwrap_err();
    assert_refused(
        "plain send to a tx queue",
        &e,
        &[
            "txq",
            "is transactional",
            "only transactional sends",
            "not transactional",
        ],
    );
    let e = client
        .queue(TXQ)
        .unwrap()
        .send(Message::new("x").recoverable(true))
        .await
        .unwrap_err();
    assert_refused("recoverable send to a tx queue", &e, &["is transactional"]);

    // A transactional send to a non-transactional queue: single-message and in a transaction.
    let e = client
        .queue(PLAIN)
        .unwrap()
        .send_tx(Message::new("x"))
        .await
        .unwrap_err();
    let why = [
        "plain",
        "is not transactional",
        "only non-transactional sends",
        "this send is transactional",
    ];
    assert_refused("send_tx to a plain queue", &e, &why);
    let mut tx = client.begin().await.unwrap();
    tx.send(PLAIN, Message::new("x")).unwrap();
    let e = tx.commit().await.unwrap_err();
    assert_refused("tx send to a plain queue", &e, &why);

    // A transactional receive from a non-transactional queue.
    client
        .queue(PLAIN)
        .unwrap()
        .send(Message::new("keep"))
        .await
        .unwrap();
    let mut tx = client.begin().await.unwrap();
    let e = tx.receive(PLAIN, SHORT).await.unwrap_err();
    assert_refused(
        "tx receive from a plain queue",
        &e,
        &["plain", "is not transactional", "transactional receive"],
    );
    drop(tx);
    for (q, n) in [(TXQ, 0), (PLAIN, 1)] {
        let info = client.queue_info(q).await.unwrap();
        assert_eq!((info.messages, info.in_flight), (n, 0), "{q}: {info:?}");
    }

    // The command line: exit 1, one line saying which queue and why.
    let url = broker.url().to_string();
    for (args, needles) in [
        (
            vec!["send", TXQ, "x"],
            vec!["txq", "is transactional", "--tx"],
        ),
        (
            vec!["send", "--count", "3", TXQ, "x{n}"],
            vec!["txq", "is transactional"],
        ),
        (
            vec!["send", "--tx", PLAIN, "x"],
            vec!["plain", "is not transactional", "--transactional"],
        ),
        (
            vec!["send", "--tx", "--count", "3", PLAIN, "x{n}"],
            vec!["plain", "is not transactional", "acknowledged 0 of 3"],
        ),
        (
            vec!["receive", "--tx", PLAIN],
            vec!["plain", "is not transactional", "transactional receive"],
        ),
    ] {
        let out = mq_cli(&url, &args).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "mq {args:?}: stderr {stderr}");
        assert!(stderr.starts_with("mq: error: "), "mq {args:?}: {stderr}");
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "mq {args:?}: {stderr}"
        );
        for n in needles {
            assert!(stderr.contains(n), "mq {args:?}: {stderr:?} lacks {n:?}");
        }
    }
    for (q, n) in [(TXQ, 0), (PLAIN, 1)] {
        let info = client.queue_info(q).await.unwrap();
        assert_eq!((info.messages, info.in_flight), (n, 0), "{q}: {info:?}");
    }
    // And the right forms work.
    let out = mq_cli(&url, &["send", "--tx", "--count", "3", TXQ, "c{n}"]).await;
    assert!(out.status.success(), "{out:?}");
    let out = mq_cli(&url, &["receive", "--tx", "--count", "3", TXQ]).await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "c1\nc2\nc3\n");
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_messages_ignore_priority() {
    const Q: &str = r".\private$\prio";
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    create(&client, Q, true).await;
    let sender = client
        .sender(
            Q,
            SenderOptions {
                transactional: true,
                ..SenderOptions::default()
            },
        )
        .await
        .unwrap();
    for (b, p) in [("s1", 0), ("s2", 7), ("s3", 3), ("s4", 7)] {
        sender.send(Message::new(b).priority(p)).await.unwrap();
    }
    sender.close().await.unwrap();
    let mut tx = client.begin().await.unwrap();
    for (b, p) in [("t1", 7), ("t2", 1), ("t3", 6)] {
        tx.send(Q, Message::new(b).priority(p)).unwrap();
    }
    tx.commit().await.unwrap();
    let out = mq_cli(broker.url(), &["send", "--tx", "--priority", "7", Q, "c1"]).await;
    assert!(out.status.success(), "{out:?}");

    let mut got = Vec::new();
    let q = client.queue(Q).unwrap();
    while let Some(m) = q.receive(SHORT).await.unwrap() {
        got.push((text(&m), m.priority));
    }
    let want: Vec<_> = ["s1", "s2", "s3", "s4", "t1", "t2", "t3", "c1"]
        .iter()
        .map(|b| (b.to_string(), 0u8))
        .collect();
    assert_eq!(got, want, "FIFO at priority 0 whatever priority was set");
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_to_a_missing_queue_fails_the_whole_commit() {
    const SRC: &str = r".\private$\src";
    const DST: &str = r".\private$\dst";
    const MISSING: &str = r".\private$\missing";
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    create(&client, SRC, true).await;
    create(&client, DST, true).await;
    fill(&client, SRC, &["in1", "in2", "in3"]).await;

    let mut tx = client.begin().await.unwrap();
    assert_eq!(text(&tx.receive(SRC, WAIT).await.unwrap().unwrap()), "in1");
    tx.send(DST, Message::new("out1")).unwrap();
    assert_eq!(text(&tx.receive(SRC, WAIT).await.unwrap().unwrap()), "in2");
    tx.send(MISSING, Message::new("lost")).unwrap();
    tx.send(DST, Message::new("out2")).unwrap();
    let e = tx.commit().await.unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e:?}");
    assert!(e.to_string().contains("missing"), "{e}");

    let info = client.queue_info(DST).await.unwrap();
    assert_eq!((info.messages, info.in_flight), (0, 0), "{info:?}");
    assert!(client
        .queue(DST)
        .unwrap()
        .receive(SHORT)
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        peek_all(&client, SRC).await,
        pairs(&[("in1", 1), ("in2", 1), ("in3", 0)]),
        "the receives of the failed transaction came back"
    );
    // The broker is fine afterwards: the same transaction without the bad send commits.
    let mut tx = client.begin().await.unwrap();
    tx.receive(SRC, WAIT).await.unwrap().unwrap();
    tx.send(DST, Message::new("out1")).unwrap();
    assert_eq!(tx.commit().await.unwrap().len(), 1);
    assert_eq!(client.queue_info(DST).await.unwrap().messages, 1);
    assert_eq!(client.queue_info(SRC).await.unwrap().messages, 2);
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_transaction_times_out_and_aborts() {
    const Q: &str = r".\private$\slow";
    const OUT: &str = r".\private$\out";
    let broker = InProcessBroker::start_with(|c| c.tx_timeout = Duration::from_secs(1)).await;
    let client = broker.client().await;
    create(&client, Q, true).await;
    create(&client, OUT, true).await;
    fill(&client, Q, &["m"]).await;

    let mut tx = client.begin().await.unwrap();
    assert_eq!(text(&tx.receive(Q, WAIT).await.unwrap().unwrap()), "m");
    tx.send(OUT, Message::new("never")).unwrap();
    wait_for_peek(
        &client,
        Q,
        &[("m", 1)],
        "the timed-out transaction's message did not come back",
    )
    .await;
    let e = tx.commit().await.unwrap_err();
    assert!(
        e.to_string().contains("timeout"),
        "commit after the timeout: {e:?} does not mention the timeout"
    );
    assert_eq!(client.queue_info(OUT).await.unwrap().messages, 0);
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_client_aborts_its_transaction() {
    const Q: &str = r".\private$\gone";
    const OUT: &str = r".\private$\out";
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    create(&client, Q, true).await;
    create(&client, OUT, true).await;
    fill(&client, Q, &["m1", "m2"]).await;

    // A task with its own connection receives and stages, then is cancelled: its Client and
    // Transaction are dropped mid-transaction.
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let url = broker.url().to_string();
    let task = tokio::spawn(async move {
        let c = Client::connect(url).await.unwrap();
        let mut tx = c.begin().await.unwrap();
        let m = tx.receive(Q, WAIT).await.unwrap().unwrap();
        tx.send(OUT, Message::new("never")).unwrap();
        sync(&mut tx, OUT).await;
        ready_tx.send(text(&m)).unwrap();
        std::future::pending::<()>().await;
    });
    assert_eq!(ready_rx.await.unwrap(), "m1");
    assert_eq!(peek_all(&client, Q).await, pairs(&[("m2", 0)]));
    task.abort();
    let _ = task.await;
    wait_for_peek(
        &client,
        Q,
        &[("m1", 1), ("m2", 0)],
        "the vanished client's message did not come back",
    )
    .await;
    assert_eq!(client.queue_info(OUT).await.unwrap().messages, 0);
    broker.stop().await.unwrap();
}

/// The `Consumer` promises that prefetched messages not handed out go back when it is closed or
/// dropped ("a crash can cause a redelivery, never a loss"). On a transactional queue the broker
/// commits each receive before pushing it down the stream, so prefetched messages must not be
/// lost when the consumer goes away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_on_a_transactional_queue_does_not_lose_prefetched_messages() {
    const Q: &str = r".\private$\prefetch";
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    create(&client, Q, true).await;
    let bodies: Vec<String> = (1..=10).map(|i| i.to_string()).collect();
    let refs: Vec<&str> = bodies.iter().map(String::as_str).collect();
    fill(&client, Q, &refs).await;

    let mut c = client
        .queue(Q)
        .unwrap()
        .consumer(ConsumerOptions {
            prefetch: 10,
            limit: None,
        })
        .await
        .unwrap();
    let m = c.next(WAIT).await.unwrap().unwrap();
    assert_eq!(text(&m), "1");
    c.close().await.unwrap();

    let left: Vec<String> = peek_all(&client, Q)
        .await
        .into_iter()
        .map(|p| p.0)
        .collect();
    assert_eq!(
        left,
        bodies[1..].to_vec(),
        "a closed consumer lost the messages it had prefetched but not handed out"
    );
    broker.stop().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// 3. Exactly once, concurrently

/// splitmix64: a seeded generator, so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Debug, Default)]
struct WorkerLog {
    /// Bodies of each committed transaction, in receive order.
    committed: Vec<Vec<u64>>,
    /// Every message received, in order, with its abort count at receive time.
    received: Vec<(u64, u32)>,
    aborts: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_random_transactions_receive_each_message_exactly_once() {
    const Q: &str = r".\private$\work";
    const N: u64 = 2_000;
    const WORKERS: u64 = 4;
    let seed: u64 = std::env::var("MQ_TX_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_2024);
    eprintln!("seed {seed} (replay with MQ_TX_SEED={seed})");
    let io = mq_broker::journal::FaultyIo::new(seed);
    let broker = {
        let io = io.clone();
        InProcessBroker::start_with(move |c| c.journal_io = Some(Arc::new(io))).await
    };
    let client = broker.client().await;
    create(&client, Q, true).await;
    let sender = client
        .sender(
            Q,
            SenderOptions {
                transactional: true,
                ..SenderOptions::default()
            },
        )
        .await
        .unwrap();
    for i in 1..=N {
        sender.send(Message::new(i.to_string())).await.unwrap();
    }
    assert_eq!(sender.close().await.unwrap().acknowledged, N);
    let syncs_before = io.syncs();

    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let c = broker.client().await;
        let done = done.clone();
        let mut rng = Rng(seed ^ (w + 1).wrapping_mul(0x1234_5678_9abc_def1));
        workers.push(tokio::spawn(async move {
            use std::sync::atomic::Ordering::AcqRel;
            let mut log = WorkerLog::default();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while done.load(std::sync::atomic::Ordering::Acquire) < N {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "worker {w} still looping after 60 s: {} of {N} committed",
                    done.load(std::sync::atomic::Ordering::Acquire)
                );
                let mut tx = c.begin().await.unwrap();
                let want = 1 + rng.below(3);
                let mut got = Vec::new();
                for _ in 0..want {
                    match tx.receive(Q, Duration::from_millis(20)).await.unwrap() {
                        Some(m) => {
                            let n: u64 = text(&m).parse().unwrap();
                            log.received.push((n, m.abort_count));
                            got.push(n);
                        }
                        None => break,
                    }
                }
                if got.is_empty() || rng.below(10) < 3 {
                    tx.abort().await.unwrap();
                    log.aborts += !got.is_empty() as u64;
                } else {
                    let ids = tx.commit().await.unwrap();
                    assert!(ids.is_empty());
                    done.fetch_add(got.len() as u64, AcqRel);
                    log.committed.push(got);
                }
            }
            log
        }));
    }
    let mut logs = Vec::new();
    for w in workers {
        logs.push(w.await.unwrap());
    }

    let mut count = vec![0u32; N as usize + 1];
    let mut txs = 0;
    for (w, log) in logs.iter().enumerate() {
        for t in &log.committed {
            txs += 1;
            for n in t {
                count[*n as usize] += 1;
            }
        }
        // Messages never received before leave the queue in queue order, so each worker sees
        // the first-time ones in increasing order. (A committed transaction's bodies need not
        // be increasing: another worker's abort can put a lower message back at the head
        // between two receives of one transaction.)
        let fresh: Vec<u64> = log
            .received
            .iter()
            .filter(|(_, a)| *a == 0)
            .map(|(n, _)| *n)
            .collect();
        assert!(
            fresh.windows(2).all(|p| p[0] < p[1]),
            "worker {w} got first-time messages out of order: {fresh:?}"
        );
    }
    let lost: Vec<usize> = (1..=N as usize).filter(|n| count[*n] == 0).collect();
    let dup: Vec<usize> = (1..=N as usize).filter(|n| count[*n] > 1).collect();
    assert!(lost.is_empty(), "never committed: {lost:?}");
    assert!(dup.is_empty(), "committed more than once: {dup:?}");
    let info = client.queue_info(Q).await.unwrap();
    assert_eq!((info.messages, info.in_flight), (0, 0), "{info:?}");
    let aborts: u64 = logs.iter().map(|l| l.aborts).sum();
    eprintln!(
        "{txs} committed and {aborts} aborted transactions, {} journal syncs",
        io.syncs() - syncs_before
    );
    assert!(aborts > 0, "the random workers never aborted");
    broker.stop().await.unwrap();
}

/// Many small transactions from several clients at once all commit, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_small_transactions_from_several_clients_all_commit() {
    const CLIENTS: u64 = 8;
    const TXS: u64 = 25;
    const EMPTY: &str = r".\private$\none";
    let broker = InProcessBroker::start().await;
    let client = broker.client().await;
    create(&client, EMPTY, true).await;
    for c in 0..CLIENTS {
        create(&client, &format!(r".\private$\c{c}"), true).await;
    }
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let cl = broker.client().await;
        tasks.push(tokio::spawn(async move {
            let q = format!(r".\private$\c{c}");
            for i in 1..=TXS {
                let mut tx = cl.begin().await.unwrap();
                tx.send(&q, Message::new(format!("{i}a"))).unwrap();
                tx.send(&q, Message::new(format!("{i}b"))).unwrap();
                assert_eq!(tx.commit().await.unwrap().len(), 2);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for c in 0..CLIENTS {
        let q = format!(r".\private$\c{c}");
        let got: Vec<String> = peek_all(&client, &q)
            .await
            .into_iter()
            .map(|p| p.0)
            .collect();
        let want: Vec<String> = (1..=TXS)
            .flat_map(|i| [format!("{i}a"), format!("{i}b")])
            .collect();
        assert_eq!(got, want, "{q}");
    }
    broker.stop().await.unwrap();
}

/// A Transact client that stops reading its replies: the transaction is still aborted at the
/// broker's transaction timeout, and its received messages go back to the queue. Its replies
/// waited for room outside the deadline's reach, so the transaction, its 2,296 received messages
/// in helper-65's probe, stayed open for as long as the connection lived. Once the client reads
/// again it gets what was sent before, then the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_whose_client_stops_reading_still_times_out() {
    use mq_proto::v1;
    const N: u64 = 100;
    const QT: &str = r".\private$\tx-unread";
    let broker = InProcessBroker::start_with(|c| c.tx_timeout = Duration::from_secs(2)).await;
    let client = broker.client().await;
    client
        .create_queue(
            QT,
            QueueOptions {
                transactional: true,
                ..QueueOptions::default()
            },
        )
        .await
        .unwrap();
    let mut tx = client.begin().await.unwrap();
    for i in 0..N {
        tx.send(QT, Message::new(vec![b'x'; 10_000]).label(format!("m{i}")))
            .unwrap();
    }
    tx.commit().await.unwrap();
    let channel = tonic::transport::Endpoint::from_shared(broker.url().to_string())
        .unwrap()
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .unwrap();
    let mut raw = v1::message_queue_service_client::MessageQueueServiceClient::new(channel);
    let (req_tx, req_rx) = tokio::sync::mpsc::channel(N as usize);
    for _ in 0..N {
        req_tx
            .send(v1::TransactRequest {
                op: Some(v1::transact_request::Op::Receive(v1::TxReceive {
                    queue: QT.into(),
                    timeout_ms: 0,
                    ..Default::default()
                })),
            })
            .await
            .unwrap();
    }
    // Replies of 1 MB in all against the client's 64 KiB HTTP/2 window: most wait, unread.
    let mut replies = raw
        .transact(tokio_stream::wrappers::ReceiverStream::new(req_rx))
        .await
        .unwrap()
        .into_inner();
    let taken = eventually(Duration::from_secs(30), || async {
        client.queue_info(QT).await.unwrap().in_flight > 0
    })
    .await;
    assert!(taken, "the transaction received nothing");
    let back = eventually(Duration::from_secs(30), || async {
        let i = client.queue_info(QT).await.unwrap();
        i.messages == N && i.in_flight == 0
    })
    .await;
    assert!(
        back,
        "the messages stayed with the unread transaction: {:?}",
        client.queue_info(QT).await.unwrap()
    );
    // Another receiver gets the first message.
    let first = client
        .queue(QT)
        .unwrap()
        .peek(Duration::from_secs(1))
        .await
        .unwrap()
        .expect("a message");
    assert_eq!(first.label, "m0");
    // Reading again: the replies sent before, then the timeout.
    let mut received = 0;
    let end = loop {
        match tokio::time::timeout(WAIT, replies.message()).await {
            Ok(Ok(Some(_))) => received += 1,
            Ok(Ok(None)) => panic!("the stream ended without the timeout after {received}"),
            Ok(Err(status)) => break status,
            Err(_) => panic!("no end after {received} replies"),
        }
    };
    assert!(received < N, "{received}");
    assert_eq!(end.code(), tonic::Code::Aborted, "{end:?}");
    assert!(end.message().contains("transaction timeout"), "{end:?}");
    drop(req_tx);
    broker.stop().await.unwrap();
}
