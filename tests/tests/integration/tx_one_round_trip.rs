//! Synchronous transactions at one round trip each (issue 14 point 3): a transaction of sends
//! and a commit, and a transaction of a receive that commits with it (`TxReceive.commit`,
//! `Transaction::receive_and_commit`), each leave the client as one batch of requests and cost
//! the broker one fdatasync; the folded receive keeps every guarantee of receive + commit (on
//! disk when answered, in order, exactly once; an empty receive or a failed commit changes
//! nothing and puts the message back).

use std::time::Duration;

use mq_client::{Client, Error, Message, QueueOptions};
use mq_proto::v1::{transact_request::Op, transact_response::Result as Res};
use mq_tests::{temp_data_dir, MqdProcess};

const Q: &str = r".\private$\txone";
const WAIT: Duration = Duration::from_secs(20);
/// One-at-a-time transactions per check.
const N: u64 = 100;

async fn create_tx_queue(client: &Client, name: &str) {
    let opts = QueueOptions {
        transactional: true,
        ..QueueOptions::default()
    };
    client.create_queue(name, opts).await.unwrap();
}

/// mqd (with `extra` arguments) with its metrics endpoint, a client, and the transactional
/// queue `Q`.
async fn mqd_with_queue_and(
    dir: &std::path::Path,
    extra: &[&str],
) -> (MqdProcess, mq_tests::http::Http, Client) {
    let (mqd, http) = mq_tests::http::mqd_with_http(dir, extra);
    let http = mq_tests::http::Http::new(&format!("http://{http}"));
    let client = mqd.connect().await;
    create_tx_queue(&client, Q).await;
    (mqd, http, client)
}

/// mqd with its defaults: [`mqd_with_queue_and`] without arguments.
async fn mqd_with_queue(dir: &std::path::Path) -> (MqdProcess, mq_tests::http::Http, Client) {
    mqd_with_queue_and(dir, &[]).await
}

/// The value of the unlabelled sample `name` in mqd's `/metrics`.
async fn metric(http: &mq_tests::http::Http, name: &str) -> u64 {
    let http = http.clone();
    let prefix = format!("{name} ");
    tokio::task::spawn_blocking(move || {
        let (status, body) = http.page("/metrics");
        assert_eq!(status, 200, "{body}");
        body.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {prefix}in {body}")) as u64
    })
    .await
    .unwrap()
}

/// The journal's `mq_journal_fdatasync_total`.
async fn fdatasyncs(http: &mq_tests::http::Http) -> u64 {
    metric(http, "mq_journal_fdatasync_total").await
}

/// `mqd --journal-idle-spin` reaches the journal's writer: with it, one-at-a-time transactions
/// make the writer watch its queues after lone commits (`mq_journal_idle_spins_total`), and no
/// commit is written inline (the spinning writer takes them, although inline commits are on by
/// default); without it (the default) the writer never spins. Every transaction commits either
/// way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idle_spin_option_reaches_the_journal_writer() {
    for (args, spins) in [
        (&["--journal-idle-spin", "200us"][..], true),
        (&[][..], false),
    ] {
        let dir = temp_data_dir("mq-txspin-");
        let (mqd, http, client) = mqd_with_queue_and(dir.path(), args).await;
        for i in 0..20 {
            let mut tx = client.begin().await.unwrap();
            tx.send(Q, Message::new(format!("m{i}"))).unwrap();
            tx.commit().await.unwrap();
        }
        let n = metric(&http, "mq_journal_idle_spins_total").await;
        assert_eq!(n > 0, spins, "{args:?}: {n} idle spins");
        assert!(metric(&http, "mq_journal_idle_spin_catches_total").await <= n);
        if spins {
            assert_eq!(metric(&http, "mq_journal_inline_commits_total").await, 0);
        }
        assert_eq!(bodies(&client, Q).await.len(), 20, "{args:?}");
        drop(mqd);
    }
}

/// `mqd --journal-inline-commits` reaches the journal: by default the commits of one-at-a-time
/// transactions are written by the task that commits them (`mq_journal_inline_commits_total`
/// counts nearly all of them: the writer is idle between them), with `false` none is; each
/// costs one fdatasync either way, and every one survives kill -9.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inline_commits_option_reaches_the_journal() {
    for (args, inline) in [
        (&[][..], true),
        (&["--journal-inline-commits", "false"][..], false),
    ] {
        let dir = temp_data_dir("mq-txinline-");
        let (mut mqd, http, client) = mqd_with_queue_and(dir.path(), args).await;
        let syncs = fdatasyncs(&http).await;
        for i in 0..N {
            let mut tx = client.begin().await.unwrap();
            tx.send(Q, Message::new(format!("m{i}"))).unwrap();
            tx.commit().await.unwrap();
        }
        let n = metric(&http, "mq_journal_inline_commits_total").await;
        if inline {
            // A commit finds the writer at work only after one that left it zeros to lay, or
            // while it writes a snapshot of the counters (every 100 ms while commits come).
            assert!(n >= N / 4, "{args:?}: {n} of {N} commits inline");
        } else {
            assert_eq!(n, 0, "{args:?}");
        }
        // One each, and the counters' snapshots (one per 100 ms while anything is written: more
        // on a slow machine).
        let spent = fdatasyncs(&http).await - syncs;
        assert!(
            (N..=N + N / 4).contains(&spent),
            "{args:?}: {spent} fdatasyncs for {N} transactions"
        );
        mqd.kill9_checked();
        drop(client);
        let mqd = MqdProcess::start(dir.path()).expect("mqd restarts");
        let client = mqd.connect().await;
        let got = bodies(&client, Q).await;
        let want: Vec<(String, u32)> = (0..N).map(|i| (format!("m{i}"), 0)).collect();
        assert_eq!(got, want, "{args:?}: what survived kill -9");
        drop(mqd);
    }
}

async fn bodies(client: &Client, queue: &str) -> Vec<(String, u32)> {
    mq_tests::peek_bodies_and_aborts(client, queue).await
}

/// N transactions of begin, send, commit, each awaited, then N of begin, receive_and_commit:
/// each is one batch of requests from the client (its begin, sends and commit, or its begin and
/// folded receive, leave together) and at most one fdatasync of the broker's journal; the
/// messages arrive in order, once each, and their removal is on disk (kill -9 and restart: the
/// queue is empty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_batch_and_one_fdatasync_per_transaction() {
    let dir = temp_data_dir("mq-txone-");
    let (mut mqd, http, client) = mqd_with_queue(dir.path()).await;
    // The first transaction opens the stream (its own batch); the others reuse it.
    let mut tx = client.begin().await.unwrap();
    tx.send(Q, Message::new("warm-up")).unwrap();
    tx.commit().await.unwrap();

    let batches = client.transaction_batches();
    let syncs = fdatasyncs(&http).await;
    for i in 0..N {
        let mut tx = client.begin().await.unwrap();
        tx.send(Q, Message::new(format!("m{i}"))).unwrap();
        assert_eq!(tx.commit().await.unwrap().len(), 1);
    }
    let sent_batches = client.transaction_batches() - batches;
    let sent_syncs = fdatasyncs(&http).await - syncs;
    assert_eq!(
        sent_batches, N,
        "one batch of requests per transaction of begin, send, commit"
    );
    // Slack for syncs the broker makes on its own meanwhile (a new segment, the counters'
    // record); two per transaction would be far above it.
    assert!(
        sent_syncs <= N + N / 4,
        "{sent_syncs} fdatasyncs for {N} send transactions"
    );

    let tx = client.begin().await.unwrap();
    let (m, ids) = tx
        .receive_and_commit(Q, WAIT)
        .await
        .unwrap()
        .expect("a message");
    assert_eq!(m.body, "warm-up".as_bytes());
    assert!(ids.is_empty());
    let batches = client.transaction_batches();
    let syncs = fdatasyncs(&http).await;
    for i in 0..N {
        let tx = client.begin().await.unwrap();
        let (m, _) = tx
            .receive_and_commit(Q, WAIT)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("message m{i}"));
        assert_eq!(m.body, format!("m{i}").as_bytes(), "in order, once each");
        assert_eq!(m.abort_count, 0);
    }
    let received_batches = client.transaction_batches() - batches;
    let received_syncs = fdatasyncs(&http).await - syncs;
    assert_eq!(
        received_batches, N,
        "one batch of requests per begin, receive_and_commit (no separate commit)"
    );
    assert!(
        received_syncs <= N + N / 4,
        "{received_syncs} fdatasyncs for {N} receive transactions"
    );
    assert!(bodies(&client, Q).await.is_empty());

    // Every answered commit is on disk: after kill -9 nothing comes back.
    mqd.kill9_checked();
    let mqd = MqdProcess::launch_on(dir.path(), mqd.addr(), &[]);
    let client = mqd.connect().await;
    assert!(bodies(&client, Q).await.is_empty());
    drop(mqd);
}

use mq_tests::RawTransact as Raw;

/// On the wire: a receive with `commit` gets exactly one answer, `committed` with the message
/// and the transaction's sends; a receive with `commit` that finds nothing gets `aborted` and
/// the whole transaction (its send too) is undone; either way the stream carries the next
/// transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_with_commit_is_answered_once_committed_or_aborted() {
    let dir = temp_data_dir("mq-txone-wire-");
    let (mqd, _http, client) = mqd_with_queue(dir.path()).await;
    let other = r".\private$\txone-other";
    create_tx_queue(&client, other).await;
    let mut raw = Raw::open(mqd.url()).await;
    raw.send(Q, "first");
    raw.op(Op::Commit(()));
    assert!(matches!(raw.answer().await.unwrap(), Res::Committed(_)));

    // A send and a receive that commits with it.
    raw.send(other, "sent with the receive");
    raw.receive(Q, WAIT, true);
    match raw.answer().await.unwrap() {
        Res::Committed(c) => {
            assert_eq!(c.received, 1);
            assert_eq!(c.ids.len(), 1);
            let m = c.message.expect("the received message in the answer");
            assert_eq!(m.body, "first".as_bytes());
        }
        other => panic!("one answer, committed: {other:?}"),
    }
    raw.nothing_more().await;
    assert!(bodies(&client, Q).await.is_empty());
    assert_eq!(
        bodies(&client, other).await,
        [("sent with the receive".to_string(), 0)]
    );

    // Nothing to receive: the transaction, with its send, is aborted.
    raw.send(other, "never stored");
    raw.receive(Q, Duration::from_millis(50), true);
    assert!(matches!(raw.answer().await.unwrap(), Res::Aborted(_)));
    raw.nothing_more().await;
    assert_eq!(bodies(&client, other).await.len(), 1);

    // The stream goes on.
    raw.send(Q, "next");
    raw.op(Op::Commit(()));
    assert!(matches!(raw.answer().await.unwrap(), Res::Committed(_)));
    assert_eq!(bodies(&client, Q).await, [("next".to_string(), 0)]);
    drop(mqd);
}

/// A receive that commits, in a transaction whose commit fails (it staged a send to a queue
/// that is not transactional): the commit's error, nothing of the transaction happens, and the
/// message is back at the head of its queue with its abort count incremented. An empty receive
/// through the client is `None`, and the transaction's send is not stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_or_empty_receive_and_commit_changes_nothing() {
    let dir = temp_data_dir("mq-txone-fail-");
    let (mqd, _http, client) = mqd_with_queue(dir.path()).await;
    let plain = r".\private$\txone-plain";
    client
        .create_queue(plain, QueueOptions::default())
        .await
        .unwrap();
    let mut tx = client.begin().await.unwrap();
    tx.send(Q, Message::new("a")).unwrap();
    tx.send(Q, Message::new("b")).unwrap();
    tx.commit().await.unwrap();

    let mut tx = client.begin().await.unwrap();
    tx.send(plain, Message::new("refused")).unwrap();
    let r = tx.receive_and_commit(Q, WAIT).await;
    assert!(r.is_err(), "the commit fails: {r:?}");
    assert!(
        !matches!(r, Err(Error::InDoubt { .. })),
        "the broker said it did not commit: {r:?}"
    );
    assert_eq!(
        bodies(&client, Q).await,
        [("a".to_string(), 1), ("b".to_string(), 0)],
        "the message is back at the head, its abort counted"
    );
    assert!(bodies(&client, plain).await.is_empty());

    // The client goes on; both messages once, in order.
    for want in ["a", "b"] {
        let tx = client.begin().await.unwrap();
        let (m, _) = tx.receive_and_commit(Q, WAIT).await.unwrap().unwrap();
        assert_eq!(m.body, want.as_bytes());
    }
    // Empty queue: None, and the transaction's send did not happen.
    let mut tx = client.begin().await.unwrap();
    tx.send(Q, Message::new("not stored")).unwrap();
    let none = tx
        .receive_and_commit(Q, Duration::from_millis(50))
        .await
        .unwrap();
    assert!(none.is_none());
    assert!(bodies(&client, Q).await.is_empty());
    drop(mqd);
}

/// A receive that commits, whose client goes away while it waits, takes nothing: the broker
/// stops waiting once the stream is gone. It used to wait on, take the next message for
/// nobody and commit it (stop 49: mqperf's two `--receive-one` consumers of a transactional
/// queue lost one message whenever one of them dropped a waiting receive), and it held its
/// transaction open meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_and_commit_whose_client_went_away_takes_nothing() {
    let dir = temp_data_dir("mq-txone-gone-");
    let (mqd, http, client) = mqd_with_queue(dir.path()).await;
    let open = || metric(&http, "mq_transactions_open");
    // A long poll on the empty queue, given up by its client once the broker has it.
    let waiting = {
        let tx = client.begin().await.unwrap();
        tokio::spawn(async move { tx.receive_and_commit(Q, Duration::from_secs(60)).await })
    };
    assert!(
        mq_tests::eventually(WAIT, || async { open().await == 1 }).await,
        "the broker never began the waiting transaction"
    );
    waiting.abort();
    let _ = waiting.await;
    // The client's reset of the stream reaches the broker in its own time: once it has, the
    // transaction is over (the old broker kept it open for the receive's whole minute).
    assert!(
        mq_tests::eventually(WAIT, || async { open().await == 0 }).await,
        "the abandoned transaction stayed open"
    );
    client
        .queue(Q)
        .unwrap()
        .send_tx(Message::new("m"))
        .await
        .unwrap();
    let tx = client.begin().await.unwrap();
    let got = tx
        .receive_and_commit(Q, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        got.map(|(m, _)| m.body),
        Some(bytes::Bytes::from_static(b"m")),
        "the message went to the receive whose client had gone"
    );
    drop(mqd);
}

/// `Queue::send_tx` of a body up to 64 KiB is a transaction of one send on the client's kept
/// `Transact` stream (one batch of requests, one fdatasync), and `Queue::receive` from a
/// transactional queue one removal on disk before the answer (inline when the journal's writer
/// is idle); a larger body goes on a send stream of its own. Everything arrives in order, once,
/// and survives kill -9; what was received stays received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_tx_of_a_small_body_is_one_kept_stream_transaction() {
    let dir = temp_data_dir("mq-sendtx-");
    let (mut mqd, http, client) = mqd_with_queue(dir.path()).await;
    let q = client.queue(Q).unwrap();
    q.send_tx(Message::new("warm-up")).await.unwrap();
    let batches = client.transaction_batches();
    let syncs = fdatasyncs(&http).await;
    let inline = metric(&http, "mq_journal_inline_commits_total").await;
    for i in 0..N {
        q.send_tx(Message::new(format!("m{i}"))).await.unwrap();
    }
    assert_eq!(
        client.transaction_batches() - batches,
        N,
        "one batch per send_tx"
    );
    let spent = fdatasyncs(&http).await - syncs;
    assert!(spent <= N + N / 4, "{spent} fdatasyncs for {N} send_tx");
    // A body over 64 KiB: its own send stream, not a transaction's requests.
    let big = vec![7u8; (64 << 10) + 1];
    let batches = client.transaction_batches();
    q.send_tx(Message::new(big.clone())).await.unwrap();
    assert_eq!(client.transaction_batches(), batches);

    // Unary receives: each removal on disk before the answer, most written inline.
    let syncs = fdatasyncs(&http).await;
    let inline_before = metric(&http, "mq_journal_inline_commits_total").await;
    assert!(
        inline_before > inline,
        "send_tx commits are written inline too"
    );
    let first = q.receive(WAIT).await.unwrap().expect("warm-up");
    assert_eq!(first.body, "warm-up".as_bytes());
    for i in 0..N / 2 {
        let m = q.receive(WAIT).await.unwrap().expect("a message");
        assert_eq!(m.body, format!("m{i}").as_bytes(), "in order, once each");
    }
    let spent = fdatasyncs(&http).await - syncs;
    assert!(
        spent <= N / 2 + 1 + N / 4,
        "{spent} fdatasyncs for {} receives",
        N / 2 + 1
    );
    let inline_receives = metric(&http, "mq_journal_inline_commits_total").await - inline_before;
    assert!(
        inline_receives >= N / 4,
        "{inline_receives} of {} receives written inline",
        N / 2 + 1
    );

    // kill -9: the received ones stay gone, the rest (and the big one, last) are there.
    mqd.kill9_checked();
    let mqd = MqdProcess::launch_on(dir.path(), mqd.addr(), &[]);
    let client = mqd.connect().await;
    let got = bodies(&client, Q).await;
    assert_eq!(got.len() as u64, N / 2 + 1);
    let want: Vec<(String, u32)> = (N / 2..N).map(|i| (format!("m{i}"), 0)).collect();
    assert_eq!(&got[..got.len() - 1], &want[..]);
    assert_eq!(got.last().unwrap().0.len(), big.len());
    drop(mqd);
}

/// `Queue::receive` from a queue it has seen a transactional message come from goes as a
/// `receive_and_commit` on the kept `Transact` stream (one batch of requests each), in order
/// and once each; a queue of that name created again without transactions is refused that way
/// once, received from plainly, and remembered as not transactional.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receives_from_a_known_transactional_queue_go_on_the_kept_stream() {
    let broker = mq_tests::InProcessBroker::start().await;
    let client = broker.client().await;
    create_tx_queue(&client, Q).await;
    let q = client.queue(Q).unwrap();
    for i in 0..5 {
        q.send_tx(Message::new(format!("m{i}"))).await.unwrap();
    }
    let batches = client.transaction_batches();
    let first = q.receive(WAIT).await.unwrap().expect("m0");
    assert_eq!(
        (first.body.as_ref(), first.transactional),
        (&b"m0"[..], true)
    );
    assert_eq!(
        client.transaction_batches(),
        batches,
        "the first receive is a unary call"
    );
    for i in 1..5 {
        let m = q.receive(WAIT).await.unwrap().expect("a message");
        assert_eq!(m.body, format!("m{i}").as_bytes(), "in order, once each");
    }
    assert!(q.receive(Duration::ZERO).await.unwrap().is_none());
    assert_eq!(
        client.transaction_batches() - batches,
        5,
        "one transaction per later receive"
    );
    assert_eq!(client.queue_info(Q).await.unwrap().messages, 0);

    // The same name, not transactional now.
    client.delete_queue(Q).await.unwrap();
    client
        .create_queue(Q, QueueOptions::default())
        .await
        .unwrap();
    q.send(Message::new("plain")).await.unwrap();
    let batches = client.transaction_batches();
    let m = q.receive(WAIT).await.unwrap().expect("plain");
    assert_eq!((m.body.as_ref(), m.transactional), (&b"plain"[..], false));
    assert_eq!(client.transaction_batches() - batches, 1, "refused once");
    q.send(Message::new("plain2")).await.unwrap();
    let m = q.receive(WAIT).await.unwrap().expect("plain2");
    assert_eq!(m.body, "plain2".as_bytes());
    assert_eq!(
        client.transaction_batches() - batches,
        1,
        "then plain receives only"
    );
    broker.stop().await.unwrap();
}

/// A `Queue::receive` from a known transactional queue that waits longer than the broker's
/// transaction timeout is not aborted by it: it ends with `None` after its own timeout, and a
/// message sent while it waits is received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_waiting_past_the_transaction_timeout_is_not_aborted() {
    let broker = mq_tests::InProcessBroker::start_with(|c| {
        // Room for a commit's fdatasync on a loaded machine.
        c.tx_timeout = Duration::from_secs(1);
    })
    .await;
    let client = broker.client().await;
    create_tx_queue(&client, Q).await;
    let q = client.queue(Q).unwrap();
    q.send_tx(Message::new("m0")).await.unwrap();
    assert!(
        q.receive(WAIT).await.unwrap().is_some(),
        "m0: now known transactional"
    );
    let started = std::time::Instant::now();
    let got = q.receive(Duration::from_secs(3)).await.unwrap();
    assert!(got.is_none());
    // (Waits are sent in whole milliseconds, so the sum may fall short of 3 s by a little.)
    assert!(
        started.elapsed() >= Duration::from_millis(2_900),
        "it waited its timeout, not the 1 s transaction timeout: {:?}",
        started.elapsed()
    );
    let waiting = {
        let q = q.clone();
        tokio::spawn(async move { q.receive(Duration::from_secs(10)).await })
    };
    q.send_tx(Message::new("m1")).await.unwrap();
    let got = waiting.await.unwrap().unwrap().expect("m1");
    assert_eq!(got.body, "m1".as_bytes());
    assert_eq!(client.queue_info(Q).await.unwrap().messages, 0);
    broker.stop().await.unwrap();
}
