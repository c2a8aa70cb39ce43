//! Where a recoverable body comes from when it is delivered (`mqd --journal-body-cache-bytes`):
//! a body received soon after its send is served from memory (no read of the journal, counted
//! by `/metrics`); bodies beyond the budget are dropped from memory, stay within it, and are
//! read back intact (adjacent ones with one read); after `kill -9` every body is read back from
//! the journal intact.
//!
//! Every wait is bounded and polls a condition; nothing sleeps a fixed time.

use std::time::Duration;

use mq_client::{Client, Message, SenderOptions};
use mq_tests::{drain_queue, free_port, temp_data_dir, wait_until, MqdProcess};

const Q: &str = r".\private$\reads";
const WAIT: Duration = Duration::from_secs(30);

/// The value of the unlabelled sample `name` in mqd's `/metrics`.
fn metric(http: &str, name: &str) -> f64 {
    let body = mq_tests::http::metrics_text(http);
    let parsed = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("parse /metrics");
    for s in parsed.samples {
        if s.metric == name {
            use prometheus_parse::Value::*;
            return match s.value {
                Counter(x) | Gauge(x) | Untyped(x) => x,
                other => panic!("{name} is not a scalar: {other:?}"),
            };
        }
    }
    panic!("no sample {name} in /metrics");
}

/// Body `i` of `len` bytes: its number, then filler that depends on it.
fn body(i: u64, len: usize) -> Vec<u8> {
    let mut b = format!("{i:08}:").into_bytes();
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while b.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.push(b'a' + (x % 26) as u8);
    }
    b.truncate(len);
    b
}

/// Sends bodies `from..to` as recoverable messages and waits until every one is acknowledged
/// (on disk).
async fn send_all(client: &Client, from: u64, to: u64, len: usize) {
    let sender = client
        .sender(Q, SenderOptions::default())
        .await
        .expect("a sender");
    let mut receipts = Vec::new();
    for i in from..to {
        receipts.push(
            sender
                .send_with_receipt(Message::new(body(i, len)).recoverable(true))
                .await
                .expect("send"),
        );
    }
    for (k, r) in receipts.into_iter().enumerate() {
        tokio::time::timeout(WAIT, r)
            .await
            .unwrap_or_else(|_| panic!("receipt {k} not answered within {WAIT:?}"))
            .unwrap_or_else(|e| panic!("send {k} failed: {e}"));
    }
    sender.close().await.expect("close the sender");
}

/// Receives everything in the queue and checks it is exactly bodies `from..to`.
async fn receive_exactly(client: &Client, from: u64, to: u64, len: usize, what: &str) {
    let got = drain_queue(client, Q, WAIT).await;
    assert_eq!(got.len() as u64, to - from, "{what}: message count");
    for (k, b) in got.iter().enumerate() {
        let i = from + k as u64;
        assert!(
            b[..] == body(i, len)[..],
            "{what}: message {k} is not body {i} intact (starts {:?})",
            String::from_utf8_lossy(&b[..b.len().min(12)])
        );
    }
}

fn launch(dir: &std::path::Path, http: &str, extra: &[&str]) -> MqdProcess {
    let mut args = vec!["--metrics-listen", http];
    args.extend_from_slice(extra);
    MqdProcess::launch(dir, &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_received_soon_after_its_send_is_not_read_from_disk() {
    const N: u64 = 300;
    // The same workload without a budget reads every body from the journal: the counter the
    // test relies on counts what it claims to.
    for (budget, from_disk) in [("67108864", false), ("0", true)] {
        let dir = temp_data_dir("mq-recreads-");
        let http = format!("127.0.0.1:{}", free_port());
        let mqd = launch(dir.path(), &http, &["--journal-body-cache-bytes", budget]);
        let client = mqd.connect().await;
        mq_tests::create_default_queue(&client, Q).await;
        send_all(&client, 0, N, 1000).await;
        receive_exactly(&client, 0, N, 1000, "right after the sends").await;
        let read = metric(&http, "mq_journal_bodies_read_total");
        let hits = metric(&http, "mq_journal_body_cache_hits_total");
        if from_disk {
            assert_eq!((read, hits), (N as f64, 0.0), "budget {budget}: read, hits");
        } else {
            assert_eq!(read, 0.0, "budget {budget}: bodies read from the journal");
            assert!(hits >= N as f64, "budget {budget}: {hits} from memory");
            // Every body goes with its message, once the removals are written (bounded wait:
            // an acknowledgement's removal rides a later group commit).
            let gone = wait_until(WAIT, || metric(&http, "mq_journal_body_cache_bytes") == 0.0);
            assert!(gone, "bodies of removed messages still kept in memory");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_beyond_the_budget_are_read_back_intact_and_after_kill9() {
    const N: u64 = 200;
    const LEN: usize = 4096;
    const BUDGET: u64 = 64 * 1024;
    let dir = temp_data_dir("mq-recreads-");
    let http = format!("127.0.0.1:{}", free_port());
    let budget = BUDGET.to_string();
    let extra = ["--journal-body-cache-bytes", budget.as_str()];
    let mut mqd = launch(dir.path(), &http, &extra);
    let client = mqd.connect().await;
    mq_tests::create_default_queue(&client, Q).await;

    send_all(&client, 0, N, LEN).await;
    let kept = metric(&http, "mq_journal_body_cache_bytes");
    assert!(
        kept > 0.0 && kept <= BUDGET as f64,
        "{kept} bytes kept in memory for a budget of {BUDGET}"
    );
    receive_exactly(&client, 0, N, LEN, "over the budget").await;
    let read = metric(&http, "mq_journal_bodies_read_total");
    let reads = metric(&http, "mq_journal_body_reads_total");
    let hits = metric(&http, "mq_journal_body_cache_hits_total");
    // At most BUDGET / (LEN + 128) bodies fit; the older ones come from the journal.
    let fit = (BUDGET / (LEN as u64 + 128)) as f64;
    assert!(read >= N as f64 - fit, "only {read} of {N} bodies read");
    assert_eq!(read + hits, N as f64, "read {read} + from memory {hits}");
    assert!(
        reads < read / 4.0,
        "{reads} reads for {read} adjacent bodies: not batched"
    );

    // Acknowledged, in memory, then kill -9: every body comes back from the journal.
    send_all(&client, N, 2 * N, LEN).await;
    drop(client);
    mqd.kill9_checked();
    let http = format!("127.0.0.1:{}", free_port());
    let mqd = launch(dir.path(), &http, &extra);
    let client = mqd.connect().await;
    receive_exactly(&client, N, 2 * N, LEN, "after kill -9").await;
    assert_eq!(metric(&http, "mq_journal_bodies_read_total"), N as f64);
    assert_eq!(metric(&http, "mq_journal_body_cache_hits_total"), 0.0);
}

/// A browse stream builds an answer (reading its body) only once the one before has been taken
/// to be written: a client that sent 8 peeks of a 4 MiB recoverable message and read no
/// answer had 7 bodies read and held (28 MiB a cursor, 64 cursors a connection). Counted by
/// the journal's body reads: at most 3 while nothing is read (the answer HTTP/2 holds, the one
/// waiting, and one), then all 8 answers once read, each with the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_whose_answers_are_not_read_reads_no_further_body() {
    use mq_proto::v1;
    const PEEKS: usize = 8;
    const LEN: usize = 4 << 20;
    let dir = temp_data_dir("mq-unread-browse-");
    let http = format!("127.0.0.1:{}", free_port());
    let mqd = launch(dir.path(), &http, &["--journal-body-cache-bytes", "0"]);
    let client = mqd.connect().await;
    mq_tests::create_default_queue(&client, Q).await;
    send_all(&client, 0, 1, LEN).await;
    let reads = || metric(&http, "mq_journal_bodies_read_total");
    let before = reads();
    let (feed, requests) = tokio::sync::mpsc::channel(PEEKS);
    for _ in 0..PEEKS {
        feed.send(v1::BrowseRequest {
            queue: Q.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let mut rpc =
        v1::message_queue_service_client::MessageQueueServiceClient::connect(mqd.url().to_string())
            .await
            .unwrap()
            .max_decoding_message_size(64 << 20);
    let mut answers = rpc
        .browse(tokio_stream::wrappers::ReceiverStream::new(requests))
        .await
        .unwrap()
        .into_inner();
    assert!(
        wait_until(WAIT, || reads() > before),
        "the first peek reads the body"
    );
    let more = wait_until(Duration::from_secs(3), || reads() > before + 3.0);
    assert!(
        !more,
        "{} bodies read with no answer taken",
        reads() - before
    );
    for k in 0..PEEKS {
        let a = tokio::time::timeout(WAIT, answers.message())
            .await
            .expect("answers come once read")
            .unwrap()
            .expect("an answer");
        let status = a.status;
        let m = a
            .message
            .unwrap_or_else(|| panic!("peek {k}: status {status}"));
        assert!(m.body[..] == body(0, LEN)[..], "peek {k}: the body intact");
    }
    drop(feed);
    assert_eq!(reads() - before, PEEKS as f64);
}
