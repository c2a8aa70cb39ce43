//! Transactions against real `mqd` processes killed with SIGKILL: a transaction whose client or
//! broker dies before the commit leaves nothing; one whose commit returned survives whole, in
//! order; the receives and sends of one transaction go together; committed transactional
//! receives are not redelivered after a restart (exactly once).
//!
//! Every wait is bounded and polls a condition; nothing sleeps a fixed time.

use std::process::{Command, Stdio};
use std::time::Duration;

use mq_client::{Client, Error, Message, QueueOptions, SenderOptions};
use mq_tests::{drain_queue, eventually, mq, mq_path, temp_data_dir, wait_timeout, MqdProcess};

const WAIT: Duration = Duration::from_secs(20);
const SHORT: Duration = Duration::from_millis(50);

async fn create(client: &Client, name: &str, transactional: bool, quota: Option<u64>) {
    client
        .create_queue(
            name,
            QueueOptions {
                transactional,
                quota_bytes: quota,
                ..QueueOptions::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Receives everything `queue` holds (its count right now) and returns the bodies; asserts it
/// is empty afterwards.
async fn drain(client: &Client, queue: &str) -> Vec<String> {
    drain_queue(client, queue, WAIT)
        .await
        .iter()
        .map(|b| text(b))
        .collect()
}

/// Bodies at the head of `queue`, not removed.
async fn peek_all(client: &Client, queue: &str) -> Vec<String> {
    client
        .queue(queue)
        .unwrap()
        .peek_many(10_000, Duration::ZERO)
        .await
        .unwrap()
        .iter()
        .map(|m| text(&m.body))
        .collect()
}

fn seq(prefix: &str, r: std::ops::RangeInclusive<u64>) -> Vec<String> {
    r.map(|i| format!("{prefix}{i}")).collect()
}

fn tx_sender() -> SenderOptions {
    SenderOptions {
        transactional: true,
        ..SenderOptions::default()
    }
}

async fn fill(client: &Client, queue: &str, bodies: &[String]) {
    let sender = client.sender(queue, tx_sender()).await.unwrap();
    for b in bodies {
        sender.send(Message::new(b.clone())).await.unwrap();
    }
    assert_eq!(
        sender.close().await.unwrap().acknowledged,
        bodies.len() as u64
    );
}

// ---------------------------------------------------------------------------------------------

/// (a) `mq send --tx --count 50000` SIGKILLed while the broker is staging its sends: nothing is
/// stored, and the broker notices (the staged messages' storage reservation is given back).
///
/// Knowing "mid-transaction" without timing: the staged sends are charged to the broker-wide
/// storage quota. A probe, one 4 MB recoverable message to 15 probe queues of 1 byte quota
/// each, needs 60 MB of it: with `--storage-quota-bytes 65000000` it passes the broker-wide
/// check (and is then refused by the queue quotas, so nothing is stored) until more than ~5 MB
/// are staged; the broker-wide refusal says the staging is under way. The bodies are 1 KB, so
/// the transaction (~57 MB) is far bigger than the broker's 8 MB stream window: when the probe
/// flips, the client cannot have sent its commit yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mq_send_tx_leaves_nothing() {
    const Q: &str = r".\private$\big";
    const COUNT: u64 = 50_000;
    const PROBES: usize = 15;
    let dir = temp_data_dir("mq-tx-crash-");
    let args = ["--storage-quota-bytes", "65000000"];
    let mut mqd = MqdProcess::launch(dir.path(), &args);
    let client = mqd.connect().await;
    create(&client, Q, true, None).await;
    let mut probe_names = Vec::new();
    for i in 0..PROBES {
        let name = format!(r".\private$\probe{i}");
        create(&client, &name, false, Some(1)).await;
        probe_names.push(format!("DIRECT=OS:{name}"));
    }
    let probe_dest = format!("FORMATNAME:{}", probe_names.join(","));
    let probe_body = bytes::Bytes::from(vec![b'p'; 4_000_000]);
    // Err(true): refused by the broker-wide quota (staging under way); Err(false): by the queue
    // quotas (nothing staged to speak of).
    let probe = || async {
        let e = client
            .queue(&probe_dest)
            .unwrap()
            .send(Message::new(probe_body.clone()).recoverable(true))
            .await
            .expect_err("the probe queues have a 1-byte quota");
        assert!(matches!(e, Error::QuotaExceeded(_)), "probe: {e:?}");
        let s = e.to_string();
        assert!(
            s.contains("storage quota") || s.contains("over its quota"),
            "probe: {s}"
        );
        s.contains("broker's storage quota")
    };
    assert!(
        !probe().await,
        "the probe hits the broker-wide quota at rest"
    );

    let mut body = "BODY{n}-".to_string();
    body.push_str(&"x".repeat(1000));
    let mut child = Command::new(mq_path())
        .args(["send", "--tx", "--count", &COUNT.to_string(), Q, &body])
        .env("MQ_BROKER", mqd.url())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run mq send --tx");
    let staging = eventually(WAIT, || async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        probe().await
    })
    .await;
    let early_exit = child.try_wait().unwrap();
    let _ = child.kill();
    let status = tokio::task::block_in_place(|| wait_timeout(&mut child, WAIT))
        .unwrap()
        .expect("mq send dies on SIGKILL");
    assert!(staging, "the broker never held the transaction's sends");
    assert!(
        early_exit.is_none() && !status.success(),
        "mq send --tx finished ({status}) before it could be killed"
    );

    // The broker notices the client is gone and gives the reservation back.
    let noticed = eventually(WAIT, || async { !probe().await }).await;
    assert!(noticed, "the killed client's staged sends still hold quota");
    let info = client.queue_info(Q).await.unwrap();
    assert_eq!((info.messages, info.in_flight), (0, 0), "{info:?}");
    assert!(peek_all(&client, Q).await.is_empty());

    // Nothing of it in the journal either.
    mqd.kill9_checked();
    let mqd = MqdProcess::launch(dir.path(), &args);
    let client = mqd.connect().await;
    assert_eq!(client.queue_info(Q).await.unwrap().messages, 0);
}

/// (b) and (c): mqd killed before the commit: nothing of the transaction after a restart;
/// killed right after the commit returned: all of it, in order, across two queues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqd_killed_before_commit_keeps_nothing_after_commit_everything() {
    const A: &str = r".\private$\a";
    const B: &str = r".\private$\b";
    const EMPTY: &str = r".\private$\empty";
    let dir = temp_data_dir("mq-tx-crash-");
    let mut mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    for q in [A, B, EMPTY] {
        create(&client, q, true, None).await;
    }

    // Before the commit.
    let mut tx = client.begin().await.unwrap();
    for i in 1..=100u64 {
        tx.send(A, Message::new(format!("u{i}"))).unwrap();
        if i % 2 == 0 {
            tx.send(B, Message::new(format!("u{i}"))).unwrap();
        }
    }
    // A round trip: every staged send above has reached the broker.
    assert!(tx.receive(EMPTY, Duration::ZERO).await.unwrap().is_none());
    mqd.kill9_checked();
    let id = tx.id();
    let e = tx.commit().await.unwrap_err();
    // The connection is gone: either the commit never left (not committed) or nobody can
    // tell whether it reached the broker (in doubt). Never a success.
    assert!(
        matches!(e, Error::Unavailable(_) | Error::InDoubt { .. }),
        "{e:?}"
    );

    let mut mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    for q in [A, B] {
        assert_eq!(client.queue_info(q).await.unwrap().messages, 0, "{q}");
    }
    // After the restart the broker tells the truth: it did not commit.
    let s = client.transaction_outcome(id).await.unwrap();
    assert_eq!(s.outcome, mq_client::TxOutcome::Aborted, "{s:?}");

    // Right after the commit.
    let mut tx = client.begin().await.unwrap();
    for i in 1..=100u64 {
        tx.send(A, Message::new(format!("c{i}"))).unwrap();
        if i % 2 == 0 {
            tx.send(B, Message::new(format!("c{i}"))).unwrap();
        }
    }
    let ids = tx.commit().await.unwrap();
    mqd.kill9_checked();
    assert_eq!(ids.len(), 150);

    let mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    let b_ids: Vec<_> = client
        .queue(B)
        .unwrap()
        .peek_many(1000, Duration::ZERO)
        .await
        .unwrap()
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(drain(&client, A).await, seq("c", 1..=100));
    assert_eq!(
        drain(&client, B).await,
        (1..=50).map(|i| format!("c{}", 2 * i)).collect::<Vec<_>>()
    );
    // Ids in send order: c1 (A), c2 (A), c2 (B), c3 (A), ...: B's are every third.
    let want_b: Vec<_> = (0..50).map(|i| ids[3 * i + 2]).collect();
    assert_eq!(b_ids, want_b, "ids survive the restart");
}

/// (d) One transaction receives two messages and sends two to another queue: after a kill -9
/// following the commit, the received are gone and the sent are there; following the stage
/// but before the commit, the received are back and the sent absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receives_and_sends_of_a_transaction_survive_or_vanish_together() {
    const SRC: &str = r".\private$\src";
    const DST: &str = r".\private$\dst";
    let dir = temp_data_dir("mq-tx-crash-");
    let mut mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    create(&client, SRC, true, None).await;
    create(&client, DST, true, None).await;
    fill(&client, SRC, &seq("s", 1..=4)).await;

    let mut tx = client.begin().await.unwrap();
    for want in ["s1", "s2"] {
        let m = tx.receive(SRC, WAIT).await.unwrap().unwrap();
        assert_eq!(text(&m.body), want);
    }
    tx.send(DST, Message::new("o1")).unwrap();
    tx.send(DST, Message::new("o2")).unwrap();
    tx.commit().await.unwrap();
    mqd.kill9_checked();

    let mut mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    assert_eq!(peek_all(&client, SRC).await, seq("s", 3..=4));
    assert_eq!(peek_all(&client, DST).await, seq("o", 1..=2));

    let mut tx = client.begin().await.unwrap();
    for want in ["s3", "s4"] {
        let m = tx.receive(SRC, WAIT).await.unwrap().unwrap();
        assert_eq!(text(&m.body), want);
    }
    tx.send(DST, Message::new("p1")).unwrap();
    tx.send(DST, Message::new("p2")).unwrap();
    // A round trip so the staged sends have reached the broker.
    assert!(tx.receive(SRC, Duration::ZERO).await.unwrap().is_none());
    mqd.kill9_checked();
    assert!(tx.commit().await.is_err());

    let mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    assert_eq!(drain(&client, SRC).await, seq("s", 3..=4));
    assert_eq!(drain(&client, DST).await, seq("o", 1..=2));
}

/// (e) Exactly once across restarts: 500 single-message transactions; 200 received by
/// `mq receive --tx`, kill -9, restart, the rest: together 1..500, each once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_receives_are_exactly_once_across_kill9() {
    const Q: &str = r".\private$\once";
    let dir = temp_data_dir("mq-tx-crash-");
    let mut mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    create(&client, Q, true, None).await;
    fill(&client, Q, &seq("", 1..=500)).await;

    let url = mqd.url().to_string();
    let out = tokio::task::spawn_blocking(move || {
        mq(&url, &["receive", "--tx", "--count", "200", Q], None)
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "mq receive --tx: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
    mqd.kill9_checked();

    let mqd = MqdProcess::launch(dir.path(), &[]);
    let client = mqd.connect().await;
    let rest = drain(&client, Q).await;
    let mut all = first.clone();
    all.extend(rest.iter().cloned());
    assert_eq!(first, seq("", 1..=200), "mq receive --tx got");
    assert_eq!(all, seq("", 1..=500), "before and after the kill together");
    assert!(client
        .queue(Q)
        .unwrap()
        .receive(SHORT)
        .await
        .unwrap()
        .is_none());
}
